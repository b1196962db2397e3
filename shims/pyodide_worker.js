// Conduit's Pyodide worker process: compiles Pyodide's WebAssembly once, then runs
// programs one at a time, each in a fresh interpreter of its own.
//
// Run by the daemon (conduit/executors/pyodide.py) as `deno run <deny-all flags>
// --allow-read=<Pyodide's files, these scripts, the snapshot, the time-zone data>
// pyodide_worker.js <Pyodide's directory> <snapshot> <time-zone zip> <paths to give
// up>...`. An interpreter is a Web Worker (pyodide_interpreter.js) restored from the
// memory snapshot, with no permission once loaded; it runs one program and is
// terminated, and the next program gets the next one. Nothing of one program's
// Python or JavaScript world is left for the next: each has its own heap, its own
// WebAssembly memory and file system, its own timers and promises. The daemon still
// starts the next interpreter only once it has seen the last one's thread gone. A
// session's process is its own: it runs the session's steps in one interpreter, kept
// from step to step, and is killed with the session (it never makes another).
//
// The protocol, one JSON object a line on stdin:
//   {"callback": address or null}    first: the worker connects to the daemon's
//       callback address, gives up every permission but reading the interpreters'
//       modules, starts an interpreter and writes READY on stdout.
//   {"job": {nonce, program, session_token, tools, keep, files, disk_bytes}}    the
//       interpreter places `files` ([{path, base64}]) in its working directory and
//       runs `program` (python_program's request) there, its files bounded by
//       `disk_bytes`. Its output goes straight to stdout and stderr; then this process
//       writes "\x1e" + nonce + "\n" on stderr and "\x1e" + nonce + ANSWER + "\n" +
//       FILES + "\n" on stdout, where ANSWER is python_program's JSON answer and FILES
//       is {"files": [{path, base64}], "disk_full": bool}: what the program left under
//       out/, and whether its files hit the bound.
//       With `keep` (a session's step) the interpreter is not ended: it takes the next
//       job, with all the program left in it, and no READY is written.
//   {"prepare": true}    start the next interpreter; READY on stdout once it is.
//   {"files": {nonce, op, ...}}    between a session's steps, an operation on the
//       kept interpreter's working directory ("put" {files, disk_bytes}, "get"
//       {path}, "list"); answered "\x1e" + nonce + JSON + "\n" on stdout.
// Tool calls go through this process, under the job's session token, on its one
// connection: the program never holds the token, the connection or the nonce.
// A job that did not end with its answer ends with this process: the daemon kills it.

import { openChannel } from "./daemon_socket.js";
import { pyodideFiles, startInterpreter } from "./pyodide_boot.js";
import { writeAll } from "./worker_io.js";

const stringify = JSON.stringify;
const rawJSON = JSON.rawJSON;
// A number JSON.stringify might write otherwise than it was read: a fraction, an
// exponent, a negative zero, or 16 digits and more.
const RESHAPED_NUMBER = /\d[.eE]|-0|\d{16}/;
// JSON text read with every number JavaScript would write otherwise kept as written:
// Python's 2**53 + 1, 1.0, -0.0 and 2.0**60 reach the daemon and come back as they were
// (as JavaScript numbers they would come back 9007199254740992, 1, 0 and
// 1152921504606847000).
function parse(text) {
  return RESHAPED_NUMBER.test(text) ? JSON.parse(text, exactNumbers) : JSON.parse(text);
}
function exactNumbers(_key, value, context) {
  if (typeof value !== "number") return value;
  const source = context?.source;
  return typeof source === "string" && source !== stringify(value) ? rawJSON(source) : value;
}
const encode = TextEncoder.prototype.encode.bind(new TextEncoder());
const decode = TextDecoder.prototype.decode.bind(new TextDecoder());
const stdoutWrite = Deno.stdout.writeSync.bind(Deno.stdout);
const stderrWrite = Deno.stderr.writeSync.bind(Deno.stderr);
const stdinRead = Deno.stdin.read.bind(Deno.stdin);
const exit = Deno.exit;
const permissions = Deno.permissions;
const RESULT_MARK = "\x1e";
const READY = "\x1econduit-ready\n";
const NO_TOOLS = { code: -32006, message: "tools are not available in this execution" };

const [pyodideDir, snapshotPath, timeZonesPath, ...usedUp] = Deno.args;
const files = await pyodideFiles(pyodideDir, timeZonesPath, snapshotPath);
const lines = lineReader(stdinRead);
const { callback } = await lines();
const request = requester(await openChannel(callback, Deno.connect), callback?.max_message_bytes ?? null);
giveUp(callback);

let warm = await prepare();
writeAll(stdoutWrite, encode(READY));
for (;;) {
  const message = await lines();
  if (message === null) break;
  if (message.job && warm) {
    const worker = warm;
    warm = null;
    if (await runJob(worker, message.job)) warm = worker;
  } else if (message.files && warm) {
    await fileOp(warm, message.files);
  } else if (message.prepare && !warm) {
    if (request.broken) fail(request.broken);
    warm = await prepare();
    writeAll(stdoutWrite, encode(READY));
  } else {
    fail("the daemon sent a message out of turn");
  }
}
exit(0);

function fail(why) {
  writeAll(stderrWrite, encode(`conduit pyodide worker: ${why}\n`));
  exit(1);
}

async function prepare() {
  const interpreter = startInterpreter(files);
  try {
    await interpreter.ready;
  } catch (error) {
    fail(`an interpreter failed to start: ${error?.message ?? error}`);
  }
  return interpreter.worker;
}

// Every permission goes but reading what starts an interpreter (Pyodide's modules,
// these scripts): the connection is open, the files are in memory. The callback
// address must be out of reach, or the worker stops here, before READY.
function giveUp(callback) {
  for (const name of ["write", "net", "env", "sys", "run", "ffi"]) permissions.revokeSync({ name });
  const read = [...usedUp];
  if (callback?.unix_path) read.push(callback.unix_path);
  for (const path of read) permissions.revokeSync({ name: "read", path });
  const checks = ["write", "net", "env", "sys", "run", "ffi"].map((name) => ({ name }));
  checks.push(...read.map((path) => ({ name: "read", path })));
  if (callback?.unix_path) checks.push({ name: "net", host: `unix:${callback.unix_path}` });
  const kept = checks.filter((descriptor) => permissions.querySync(descriptor).state === "granted");
  if (kept.length > 0) fail(`could not give up its permissions: ${stringify(kept)}`);
}

// Runs one job; whether its interpreter is kept for the next (a session's).
async function runJob(worker, { nonce, program, session_token: token, tools, keep, files, disk_bytes }) {
  const pending = new Set();
  const answer = await new Promise((resolve) => {
    worker.onmessage = ({ data }) => {
      if (typeof data?.answer === "string") {
        resolve(data);
      } else if (data?.call !== undefined) {
        const call = relay(worker, data, tools ? token : null);
        pending.add(call);
        call.finally(() => pending.delete(call));
      }
    };
    // A program's stray error is its own business, never this process's end.
    worker.onerror = (event) => event.preventDefault();
    const placed = (files ?? []).map(({ path, base64 }) => ({ path, data: Uint8Array.fromBase64(base64) }));
    const message = { job: program, files: placed, diskBytes: disk_bytes };
    worker.postMessage(message, placed.map(({ data }) => data.buffer));
  });
  worker.onmessage = null;
  // A session's interpreter stays; its messages between steps are dropped.
  if (keep !== true) worker.terminate();
  // Calls the program started are its own: answered under its token, before its end.
  await Promise.allSettled([...pending]);
  const line = answer.answer.includes("\n")
    ? stringify({ error: { type: "InternalError", message: "the interpreter sent a broken answer", traceback: "" } })
    : answer.answer;
  const out = stringify({ files: encodeFiles(answer.files), disk_full: answer.diskFull === true });
  writeAll(stderrWrite, encode(RESULT_MARK + nonce + "\n"));
  writeAll(stdoutWrite, encode(RESULT_MARK + nonce + line + "\n" + out + "\n"));
  return keep === true;
}

function encodeFiles(files) {
  const ok = Array.isArray(files) ? files.filter((file) => file?.data instanceof Uint8Array) : [];
  return ok.map(({ path, data }) => ({ path: String(path), base64: data.toBase64() }));
}

// One operation on a session's working directory, between its steps: the kept
// interpreter answers {ok, data?, files?} or {refused}; bytes go out as base64.
async function fileOp(worker, { nonce, op, path, files, disk_bytes }) {
  const placed = (files ?? []).map((file) => ({ path: file.path, data: Uint8Array.fromBase64(file.base64) }));
  const filed = await new Promise((resolve) => {
    worker.onmessage = ({ data }) => {
      if (data?.filed) resolve(data.filed);
    };
    const fileOp = { op, path, files: placed, diskBytes: disk_bytes };
    worker.postMessage({ fileOp }, placed.map(({ data }) => data.buffer));
  });
  worker.onmessage = null;
  const answer = { ok: filed.ok === true, refused: filed.refused ?? null, files: filed.files ?? null };
  if (filed.data instanceof Uint8Array) answer.base64 = filed.data.toBase64();
  writeAll(stdoutWrite, encode(RESULT_MARK + nonce + stringify(answer) + "\n"));
}

// One tool call of the running program, answered to its interpreter as JSON text:
// {"result": ...} or {"error": {code, message, data}}.
async function relay(worker, { call, method, params }, token) {
  let answer;
  try {
    if (token === null) throw NO_TOOLS;
    answer = stringify({ result: await request(token, String(method), parse(String(params))) });
  } catch (error) {
    answer = stringify({
      error: { code: error?.code ?? -32603, message: String(error?.message ?? error), data: error?.data },
    });
  }
  try {
    worker.postMessage({ reply: call, answer });
  } catch {
    // The interpreter is gone; so is whoever waited for the answer.
  }
}

// JSON-RPC on the one connection to the daemon, every job's calls multiplexed by id,
// each under its own job's token. `request.broken` says why no call can succeed any
// more (the connection closed), or is null. A call longer than `maxBytes` (the daemon's
// `max_message_bytes`) fails here: the daemon's refusal would name no call.
function requester(channel, maxBytes) {
  if (!channel) return Object.assign(() => Promise.reject(NO_TOOLS), { broken: null });
  if (channel.failure) {
    const failure = { code: -32603, message: channel.failure };
    return Object.assign(() => Promise.reject(failure), { broken: null });
  }
  let nextId = 1;
  const pending = new Map();
  const request = async (token, method, params) => {
    if (request.broken) throw { code: -32603, message: request.broken };
    const id = nextId++;
    const message = { jsonrpc: "2.0", id, method, params, auth: { bearerToken: token } };
    const reply = new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
    const bytes = encode(stringify(message) + "\n");
    if (maxBytes !== null && bytes.length - 1 > maxBytes) {
      pending.delete(id);
      const size = `the call is ${bytes.length - 1} bytes`;
      throw { code: -32600, message: `${size}; the daemon reads at most ${maxBytes} (server.max_message_bytes)` };
    }
    for (let offset = 0; offset < bytes.length; ) offset += await channel.write(bytes.subarray(offset));
    return reply;
  };
  request.broken = null;
  readReplies(channel, pending).finally(() => {
    request.broken = "the connection to the daemon closed";
    for (const { reject } of pending.values()) reject({ code: -32603, message: request.broken });
    pending.clear();
  });
  return request;
}

async function readReplies(channel, pending) {
  const buffer = new Uint8Array(65536);
  const decoder = new TextDecoder();
  let text = "";
  try {
    for (;;) {
      const n = await channel.read(buffer);
      if (n === null) return;
      text += decoder.decode(buffer.subarray(0, n), { stream: true });
      let newline;
      while ((newline = text.indexOf("\n")) >= 0) {
        const reply = parse(text.slice(0, newline));
        text = text.slice(newline + 1);
        const waiter = pending.get(reply.id);
        pending.delete(reply.id);
        if (reply.error) waiter?.reject(reply.error);
        else waiter?.resolve(reply.result);
      }
    }
  } catch {
    // The connection is unusable: every call still waiting learns so.
  }
}

// The next line of stdin, parsed; null at the end of stdin. Jobs may be megabytes:
// chunks are joined once, when their line is complete, and read a megabyte at a time
// once a line is longer than a small read (the daemon's pipe holds that much). Called
// before this module's later constants exist.
function lineReader(read) {
  const SMALL_READ = 65536;
  const LONG_READ = 1 << 20;
  let chunks = [];
  let rest = new Uint8Array(0);
  return async function next() {
    for (;;) {
      const newline = rest.indexOf(10);
      if (newline >= 0) {
        const line = join([...chunks, rest.subarray(0, newline)]);
        chunks = [];
        rest = rest.subarray(newline + 1);
        return parse(decode(line));
      }
      if (rest.length) chunks.push(rest);
      const buffer = new Uint8Array(chunks.length ? LONG_READ : SMALL_READ);
      const n = await read(buffer);
      if (n === null) return null;
      rest = buffer.subarray(0, n);
    }
  };
}

function join(parts) {
  const whole = new Uint8Array(parts.reduce((total, part) => total + part.length, 0));
  let offset = 0;
  for (const part of parts) {
    whole.set(part, offset);
    offset += part.length;
  }
  return whole;
}
