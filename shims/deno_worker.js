// Conduit's one-shot Deno worker: runs exactly one program, then exits.
//
// Protocol (the daemon side lives in conduit/executors/deno.py):
//   1. On start the daemon writes a one-line prelude, {"callback": <address or null>}.
//      The worker connects to that address (if any), revokes every permission it was
//      started with (see permissions.js), writes READY to stdout and blocks reading
//      stdin: the connection is made, and given up, before any job exists.
//   2. The daemon writes one JSON object and closes stdin:
//        {nonce, module, line_offset, inputs, lang, session_token, callback}
//   3. The worker sets the global `inputs`, imports `module` from a data: URL, awaits
//      its `default()` and writes, as the last thing on stdout, "\x1e" + nonce +
//      PAYLOAD + "\n", where PAYLOAD is
//      {"result": <json>} or {"error": {"type", "message", "traceback"}}.
//      A result JSON.stringify cannot encode (BigInt, cycles, functions, symbols) is
//      sent as String(value); undefined becomes null.
//   4. It exits: 0 after a result, 1 after an error.
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
const encode = TextEncoder.prototype.encode.bind(new TextEncoder());
const stdoutWrite = Deno.stdout.writeSync.bind(Deno.stdout);
const stdinRead = Deno.stdin.read.bind(Deno.stdin);
const exit = Deno.exit;
const connect = Deno.connect;
const permissions = Deno.permissions;
const toBase64 = Uint8Array.prototype.toBase64;
const RESULT_MARK = "\x1e";
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

function writeText(text) {
  writeAll(stdoutWrite, encode(text));
}

// ---- tools: the program's way back to the daemon (see daemon_socket.js) ----------

function installTools(request) {
  const tools = makeTools(request);
  Object.defineProperty(globalThis, "tools", { value: tools, enumerable: true });
  Object.defineProperty(globalThis, "ToolError", { value: ToolError, enumerable: true });
}

let finished = false;

// Writes the marker and exits; only the first report counts.
function finish(payload, code) {
  if (finished) return;
  finished = true;
  writeText(RESULT_MARK + job.nonce + payload + "\n");
  exit(code);
}

function toUserLocations(text, lineOffset) {
  return text.replace(PROGRAM_URL, (_, line, column) => {
    const userLine = Math.max(1, Number(line) - lineOffset);
    return `<program>:${userLine}:${column}`;
  });
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
  }
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

function fail(error) {
  let payload;
  try {
    payload = stringify({ error: describeError(error, job.line_offset) });
  } catch {
    payload = '{"error":{"type":"Error","message":"the error could not be described","traceback":""}}';
  }
  finish(payload, 1);
}

// Errors outside the awaited call (timers, unawaited promises) would otherwise make Deno
// print a report with module line numbers and exit without a result.
globalThis.addEventListener("error", (event) => {
  event.preventDefault();
  fail(event.error);
});
globalThis.addEventListener("unhandledrejection", (event) => {
  event.preventDefault();
  fail(event.reason);
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
const { callback } = await stdin.prelude();
const channel = await openChannel(callback, connect);
dropPermissions(permissions, callback);

writeText(READY);
const job = await stdin.job();

try {
  installTools(requester(job.session_token, job.callback ? channel : null));
  // A plain global, so a program may also declare its own `inputs`.
  globalThis.inputs = job.inputs ?? null;
  const media = job.lang === "javascript" ? "javascript" : "typescript";
  const source = toBase64.call(encode(job.module));
  const program = await import(`data:application/${media};base64,${source}`);
  const value = await program.default();
  finish(`{"result":${encodeResult(value)}}`, 0);
} catch (error) {
  fail(error);
}
