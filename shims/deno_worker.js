// Conduit's Deno worker: runs exactly one program, then exits; or, for a session, runs
// its steps one after another in the same isolate, so what one leaves on globalThis
// the next finds (conduit/executors/js_session.py makes its declarations global).
//
// Protocol (the daemon side lives in conduit/executors/deno.py):
//   1. On start the daemon writes a one-line prelude,
//      {"callback": <address or null>, "session": <bool>, "workdir": <path or null>}.
//      The worker connects to that address (if any), revokes every permission it was
//      started with but reading and writing `workdir`, its working directory (see
//      permissions.js), writes READY to stdout and blocks reading stdin: the
//      connection is made, and given up, before any job exists.
//   2. The daemon writes one JSON object and closes stdin:
//        {nonce, module, line_offset, inputs, lang, session_token, callback}
//   3. The worker sets the global `inputs`, imports `module` from a data: URL, awaits
//      its `default()` and writes, as the last thing on stdout, "\x1e" + nonce +
//      PAYLOAD + "\n", where PAYLOAD is
//      {"result": <json>} or {"error": {"type", "message", "traceback"}}.
//      A result JSON.stringify cannot encode (BigInt, cycles, functions, symbols) is
//      sent as String(value); undefined becomes null.
//   4. It exits: 0 after a result, 1 after an error.
//   A session's worker instead reads one job per line (stdin stays open), answers each
//   as in 3 and waits for the next; it exits when stdin ends. An error thrown between
//   steps (a timer) goes to stderr, which the next step's output then carries.
//
// Plain JavaScript so that Deno starts it without transpiling. The nonce never leaves
// this module's scope: the program runs in its own module and cannot reach our locals.
// Dynamic import() from this module (a file: URL) is not subject to --allow-read, so
// the only dynamic import here is of the program's own data: URL; the static one is
// the SDK every JavaScript sandbox shares.

import { openChannel, requester } from "./daemon_socket.js";
import { dropPermissions } from "./permissions.js";
import { ToolError, encodeResult, makeTools } from "./sandbox_sdk.js";
import { stdinReader, writeAll } from "./worker_io.js";

// Captured before any program code runs: the program may replace globals and
// prototypes, and nothing it does may reach the nonce or forge the marker.
const stringify = JSON.stringify;
const sliceString = Function.prototype.call.bind(String.prototype.slice);
const encode = TextEncoder.prototype.encode.bind(new TextEncoder());
const stdoutWrite = Deno.stdout.writeSync.bind(Deno.stdout);
const stderrWrite = Deno.stderr.writeSync.bind(Deno.stderr);
const stdinRead = Deno.stdin.read.bind(Deno.stdin);
const exit = Deno.exit;
const connect = Deno.connect;
const permissions = Deno.permissions;
const toBase64 = Uint8Array.prototype.toBase64;
const RESULT_MARK = "\x1e";
// The exit code of a worker that could not write its answer (executors/deno.py).
const UNREPORTED = 121;
const READY = "\x1econduit-ready\n";
const WORKER_URL = import.meta.url;
// How V8 prints our data: URLs in stack frames (long ones shortened with "......").
const PROGRAM_URL = /data:application\/(?:typescript|javascript);base64,[A-Za-z0-9+/=.]*:(\d+):(\d+)/g;
const CODE_FRAME_LINE = /^(\s*)(\d+)( \|)/gm;

// localStorage and the Cache API persist under DENO_DIR without any permission: a
// program could leave state for the next one, or fill the disk. sessionStorage is in
// memory and dies with this process, so programs that use localStorage still work.
const sessionStore = globalThis.sessionStorage;
delete globalThis.localStorage;
delete globalThis.caches;
Object.defineProperty(globalThis, "localStorage", {
  value: sessionStore,
  configurable: true,
  enumerable: true,
  writable: false,
});

// A Web Worker is a second V8 isolate, which reserves ~512 MB of writable memory up
// front and so always trips the memory backstop (RLIMIT_DATA). Say so plainly.
globalThis.Worker = class Worker {
  constructor() {
    throw new Error("Web Workers are not available in this sandbox; do the work in the program");
  }
};

// A session's stdin stays open for its later steps: its programs get an ended one, as
// a one-shot program does once its job is read, rather than wait on it or take the
// next step's job. (The shim reads through its own captured `stdinRead`.)
function endStdin() {
  const ended = new ReadableStream({ start: (controller) => controller.close() });
  const stdin = {
    read: async () => null,
    readSync: () => null,
    readable: ended,
    isTerminal: () => false,
    setRaw() {},
    close() {},
  };
  Object.defineProperty(Deno, "stdin", { value: Object.freeze(stdin), enumerable: true });
}

function writeText(text) {
  writeAll(stdoutWrite, encode(text));
}

// ---- tools: the program's way back to the daemon (see daemon_socket.js) ----------

// The job or session step now running, as {job, finished, done}; null between steps.
let step = null;

// Each call goes out under the token of the step it is made in; installed once, so a
// session's steps share the one connection and the one `tools` global.
function installTools(channel, maxBytes) {
  const noTools = requester(null, null);
  let viaChannel = null;
  const request = (method, params, tool) => {
    const job = step?.job;
    if (!job?.callback || !channel) return noTools(method, params, tool);
    viaChannel ??= requester(() => step?.job.session_token, channel, maxBytes);
    return viaChannel(method, params, tool);
  };
  callsWriting = () => viaChannel?.written() ?? null;
  callsWritten = () => viaChannel?.toolCallsWritten() ?? 0;
  const tools = makeTools(request);
  Object.defineProperty(globalThis, "tools", { value: tools, enumerable: true });
  Object.defineProperty(globalThis, "ToolError", { value: ToolError, enumerable: true });
}

// The write of the last call the program made, or null, and how many tool calls were
// written (installTools).
let callsWriting = () => null;
let callsWritten = () => 0;

// Writes the marker: the step's only report counts. A one-shot worker then exits, once
// the calls its program made are written: a call it did not await is still made.
function finish(current, payload, code) {
  if (current === null || current.finished) return;
  current.finished = true;
  const writing = current.job.session ? null : callsWriting();
  if (writing === null) return report(current, payload, code);
  (async () => {
    try {
      await writing;
    } catch {
      // The connection is gone: the calls were not made, the program's answer stands.
    }
    report(current, payload, code);
  })();
}

// A one-shot worker's answer also says how many tool calls it wrote (`{"calls": n,
// ...}`): the daemon reads them all before the execution's session ends, so a call the
// program did not await is made however late it was started.
function report(current, payload, code) {
  const calls = current.job.session ? 0 : callsWritten();
  const answer = calls === 0 ? payload : `{"calls":${calls},${sliceString(payload, 1)}`;
  try {
    writeText(RESULT_MARK + current.job.nonce + answer + "\n");
  } catch {
    // The program closed stdout (`Deno.stdout.close()`): no answer can reach the
    // daemon, and an exit 0 would read as a program that called `Deno.exit(0)`.
    exit(UNREPORTED);
  }
  if (!current.job.session) exit(code);
  if (step === current) step = null;
  current.done();
}

// An error's frames as a program sees them (`error.stack`, and so `console.log(error)`):
// its own frames only, at its own lines, `    at name (<program>:line:column)`, as the
// wasm-js guest writes them, never this worker's file (which names where the daemon is
// installed) or Deno's internals. The lines are the step's, set as each step starts.
let frameOffset = 0;
// [line, column, width] where `return (` went in front of the final expression on a
// line of the program's own (executors/js_syntax.py `column_shift`), or null: columns
// from there on are moved back by its width, to the program's own text.
let frameShift = null;
// [line, column] of the `return` written on a line before the final expression (0 for
// the header's line), then [line, column] of the expression (executors/js_syntax.py
// `return_site`), or null: V8 places an error the expression throws at the `return`.
let frameReturn = null;
const PROGRAM_FILE = "data:application/";

function programColumn(line, column) {
  const shift = frameShift;
  if (shift === null || line !== shift[0] || column < shift[1] + shift[2]) return column;
  return column - shift[2];
}

// `<program>:line:column` for a place in the module, `line` counted in the program's
// lines (0 and less: the module's header).
function programPlace(line, column) {
  const site = frameReturn;
  if (site !== null && line === site[0] && column === site[1]) {
    return `<program>:${site[2]}:${site[3]}`;
  }
  const own = Math.max(1, line);
  return `<program>:${own}:${programColumn(own, column)}`;
}
const startsWith = Function.prototype.call.bind(String.prototype.startsWith);

function programStack(error, sites) {
  let text;
  try {
    const name = String(error?.name ?? "Error");
    const message = String(error?.message ?? "");
    text = message === "" ? name : `${name}: ${message}`;
  } catch {
    text = "Error";
  }
  for (const site of sites) {
    const file = site.getFileName();
    if (typeof file !== "string" || !startsWith(file, PROGRAM_FILE)) continue;
    const place = programPlace(site.getLineNumber() - frameOffset, site.getColumnNumber());
    const name = site.getFunctionName();
    // The program's own body is the module's default export: unnamed, as on wasm-js.
    text += name && name !== "default" ? `\n    at ${name} (${place})` : `\n    at ${place}`;
  }
  return text;
}
Error.prepareStackTrace = programStack;

function toUserLocations(text, lineOffset) {
  return text.replace(PROGRAM_URL, (_, line, column) =>
    programPlace(Number(line) - lineOffset, Number(column)),
  );
}

// Deno's advice when it refuses a permission names a flag nobody running a program here
// can pass: the report says what holds instead (as wasm-js's fetch does).
const RERUN_ADVICE = /, run again with the --allow-([a-z]+) flag$/;

function sandboxRefusal(_, permission) {
  return permission === "net"
    ? ": this sandbox has no network; tools are the way out"
    : ": not allowed in this sandbox";
}

function describeError(error, lineOffset) {
  let type = "Error";
  let message = "";
  let stack = "";
  if (error !== null && (typeof error === "object" || typeof error === "function")) {
    type = String(error.name ?? "Error");
    message = String(error.message ?? "");
    stack = String(error.stack ?? "");
  } else {
    message = String(error);
  }
  // Deno reports a module that does not parse as a TypeError whose message starts with
  // "SyntaxError: " and carries a code frame numbered in module lines.
  if (type === "TypeError" && message.startsWith("SyntaxError: ")) {
    const [first, ...frame] = message.slice("SyntaxError: ".length).split("\n");
    type = "SyntaxError";
    message = first;
    stack = frame.join("\n").replace(CODE_FRAME_LINE, (_, indent, line, bar) => {
      return `${indent}${Math.max(1, Number(line) - lineOffset)}${bar}`;
    });
  } else {
    // The frames alone, as on wasm-js: the line `programStack` heads them with repeats
    // the type and the message, which the report has already.
    const head = message === "" ? type : `${type}: ${message}`;
    if (stack === head) stack = "";
    else if (startsWith(stack, `${head}\n`)) stack = stack.slice(head.length + 1);
  }
  if (type === "NotCapable") message = message.replace(RERUN_ADVICE, sandboxRefusal);
  // Our own frames and Deno's internals (ext:) say nothing about the program.
  const frames = stack
    .split("\n")
    .filter((line) => !line.includes(WORKER_URL) && !line.includes("(ext:"));
  return {
    type,
    message: toUserLocations(message, lineOffset),
    traceback: toUserLocations(frames.join("\n"), lineOffset),
  };
}

function fail(current, error) {
  if (current === null || current.finished) return strayError(error);
  let payload;
  try {
    payload = stringify({ error: describeError(error, current.job.line_offset) });
  } catch {
    payload = '{"error":{"type":"Error","message":"the error could not be described","traceback":""}}';
  }
  finish(current, payload, 1);
}

// An error no step is waiting for (only a session's worker outlives its steps).
function strayError(error) {
  try {
    const { type, message } = describeError(error, 1);
    writeAll(stderrWrite, encode(`Uncaught ${type} between steps: ${message}\n`));
  } catch {
    // Nothing more to say.
  }
}

// Errors outside the awaited call (timers, unawaited promises) would otherwise make Deno
// print a report with module line numbers and exit without a result.
globalThis.addEventListener("error", (event) => {
  event.preventDefault();
  fail(step, event.error);
});
globalThis.addEventListener("unhandledrejection", (event) => {
  event.preventDefault();
  fail(step, event.reason);
});

// The first dynamic import of a data: URL sets up Deno's module loader and TypeScript
// transpiler (~3 ms). Paying that before READY takes it off the request path. The warm-up
// modules are constants of ours, so nothing of a program runs before its job arrives.
await import("data:application/typescript;base64," + toBase64.call(encode("export const n: number = 1;")));
await import("data:application/javascript;base64," + toBase64.call(encode("export const n = 1;")));

// The daemon's address is used once, here, and every permission given up before any
// job exists (see permissions.js): the program gets this connection's calls under its
// own token, and no way to reach the address itself. Done while the worker is warming,
// so no execution waits for it.
const stdin = stdinReader(stdinRead);
const { callback, session, workdir } = await stdin.prelude();
if (session) endStdin();
const channel = await openChannel(callback, connect);
dropPermissions(permissions, callback, workdir ?? null);
installTools(channel, callback?.max_message_bytes ?? null);

writeText(READY);
if (session) {
  for (let job; (job = await stdin.line()) !== null; ) await runStep({ ...job, session: true });
  exit(0);
} else {
  // Not awaited: a program awaiting what nothing can settle must not leave this
  // module's own top-level await pending, which Deno reports naming this file. Deno
  // says when its event loop has run dry instead ("beforeunload"), and the program is
  // answered as wasm-js answers it (executors/wasm_js.py's NEVER_SETTLED).
  runStep(await stdin.job());
  globalThis.addEventListener("beforeunload", () => {
    const never = new Error(
      "the program awaited a promise that never settled (nothing was left that could settle it)",
    );
    if (step !== null) fail(step, never);
  });
}

// Run one program; resolves once it is reported (its own promise may still be pending).
function runStep(job) {
  return new Promise((done) => {
    step = { job, finished: false, done };
    frameOffset = job.line_offset ?? 0;
    frameShift = job.column_shift ?? null;
    frameReturn = job.return_site ?? null;
    // A plain global, so a program may also declare its own `inputs`.
    globalThis.inputs = job.inputs ?? null;
    runProgram(step);
  });
}

async function runProgram(current) {
  try {
    const media = current.job.lang === "javascript" ? "javascript" : "typescript";
    const source = toBase64.call(encode(current.job.module));
    const program = await import(`data:application/${media};base64,${source}`);
    // Called alone, as a module's own code runs: its top-level `this` is undefined, as on
    // wasm-js, not the module namespace.
    const run = program.default;
    const value = await run();
    finish(current, `{"result":${encodeResult(value)}}`, 0);
  } catch (error) {
    fail(current, error);
  }
}
