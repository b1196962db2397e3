// Conduit's one-shot Pyodide worker: loads Python, runs exactly one program, exits.
//
// Run by the daemon as `deno run <deny-all flags> --allow-read=<Pyodide's files and
// python_program.py> pyodide_worker.js <pyodide dir> <python_program.py> <those paths>`
// (conduit/executors/pyodide.py). The protocol is the Deno worker's (deno_worker.js):
// the prelude line on stdin, READY on stdout once loaded and connected, one JSON job on
// stdin, then "\x1e" + nonce + PAYLOAD as the last thing on stdout, where PAYLOAD is
// python_program's JSON answer.
//
// Before any program runs, the worker gives up what it no longer needs and what Python
// could reach through `import js`: read permission on Pyodide's files is revoked once
// they are loaded, every other permission (the daemon's callback address) once its
// connection is open, before READY, and the ways a program could end or write past the
// daemon's reading of this process are deleted. Whatever
// is left, the daemon treats this process's stdout and exit as the program's own,
// untrusted: only the nonce-marked line counts.

import { openChannel, requester } from "./daemon_socket.js";
import { dropPermissions } from "./permissions.js";
import { boot } from "./pyodide_boot.js";
import { stdinReader, writeAll } from "./worker_io.js";

// Captured first: nothing below may be reached or replaced by the program.
const stringify = JSON.stringify;
const parse = JSON.parse;
const encode = TextEncoder.prototype.encode.bind(new TextEncoder());
const stdoutWrite = Deno.stdout.writeSync.bind(Deno.stdout);
const stderrWrite = Deno.stderr.writeSync.bind(Deno.stderr);
const stdinRead = Deno.stdin.read.bind(Deno.stdin);
const exit = Deno.exit;
const connect = Deno.connect;
const permissions = Deno.permissions;
const readTextFile = Deno.readTextFileSync;
const RESULT_MARK = "\x1e";
const READY = "\x1econduit-ready\n";

// Pyodide's directory, the program contract, the snapshot to start from ("" for none),
// then every path this worker may read.
const [pyodideDir, programModule, snapshotPath, ...readable] = Deno.args;

const { pyodide, run } = await boot({
  pyodideDir,
  programText: readTextFile(programModule),
  snapshot: snapshotPath ? Deno.readFileSync(snapshotPath) : undefined,
});
// Raw writes as Python makes them: the daemon counts output against the budget as it
// streams, and nothing is lost or reordered by line buffering.
pyodide.setStdout({ write: (bytes) => (writeAll(stdoutWrite, bytes), bytes.length) });
pyodide.setStderr({ write: (bytes) => (writeAll(stderrWrite, bytes), bytes.length) });

// Nothing more to read: Pyodide holds its files in memory now. (Only these paths until
// the job's connection is open; then every permission goes, see below.)
for (const path of readable) permissions.revokeSync({ name: "read", path });
for (const name of ["exit", "kill", "stdin", "stdout", "stderr", "addSignalListener", "removeSignalListener"]) {
  delete Deno[name];
}
if (globalThis.process) {
  for (const name of ["exit", "reallyExit", "abort", "kill", "stdin", "stdout", "stderr", "_rawDebug"]) {
    delete globalThis.process[name];
  }
}
delete globalThis.close;
delete globalThis.Worker;
// An error outside the awaited program (a timer, an unawaited promise) must not end the
// process before it reports.
globalThis.addEventListener("error", (event) => event.preventDefault());
globalThis.addEventListener("unhandledrejection", (event) => event.preventDefault());

// One program through python_program, in a fresh namespace: its JSON answer.
// runPythonAsync, so the program may await at top level and run_sync may suspend it.
async function runProgram(program, hostCall) {
  const scope = pyodide.globals.get("dict")();
  try {
    scope.set("conduit_run", run);
    scope.set("request_json", stringify(program));
    scope.set("js_host_call", hostCall);
    return await pyodide.runPythonAsync("await conduit_run(request_json, js_host_call)", { globals: scope });
  } finally {
    scope.destroy();
  }
}

async function noDaemon() {
  return stringify({ error: { code: -32603, message: "no daemon before the job" } });
}

// A restored interpreter compiles its WebAssembly lazily: the first Python it runs
// costs ~10 ms more than the next. Pay that here, off the request path, on a
// throwaway program, in the program's own fresh namespace (each run makes its own).
await runProgram({ code: "sum([1, 2])", inputs: null, timeout_ms: 1000 }, noDaemon);
// The snapshot holds `random` as it was seeded when the snapshot was made: without a
// fresh seed (from crypto.getRandomValues, new in every process) every execution would
// draw the same numbers.
pyodide.runPython("__import__('random').seed()");

// The daemon's address is used once, here, and every permission given up before any
// job exists (see permissions.js): Python, even through `import js`, gets this
// connection's calls under its own token, and no way to reach the address itself.
// A permission that will not go ends the worker here, before READY.
const stdin = stdinReader(stdinRead);
const { callback } = await stdin.prelude();
const channel = await openChannel(callback, connect);
dropPermissions(permissions, callback);

writeAll(stdoutWrite, encode(READY));
const job = await stdin.job();
const request = requester(job.session_token, job.callback ? channel : null);

// One JSON-RPC call to the daemon, for python_program's `host_call`: the answer as JSON
// text, {"result": ...} or {"error": {...}}, never a rejection.
async function hostCall(method, params) {
  try {
    return stringify({ result: await request(method, parse(params), null) });
  } catch (error) {
    return stringify({ error: { code: error.code ?? -32603, message: String(error.message ?? error), data: error.data } });
  }
}

let answer;
try {
  answer = await runProgram(job.program, hostCall);
} catch (error) {
  answer = stringify({ error: { type: "InternalError", message: String(error?.message ?? error), traceback: "" } });
}
try {
  pyodide.runPython("import sys; sys.stdout.flush(); sys.stderr.flush()");
} catch {
  // Output already written stays written; the answer still goes out.
}
writeAll(stdoutWrite, encode(RESULT_MARK + job.nonce + answer + "\n"));
exit(answer.startsWith('{"error"') ? 1 : 0);
