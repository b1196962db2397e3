// One Python interpreter for one program: a Web Worker of the Pyodide host
// (pyodide_worker.js), which starts it with no permission but reading Pyodide's two
// JavaScript modules, and ends it after its one program (a session's, after its last
// step: each step's timers still end with the step).
//
// Messages from the host, in this order:
//   {load: {dir, module, lock, stdlib, timeZones, snapshot}} restore Pyodide from the
//       snapshot, warm it up and give up reading; answers {ready: true, returned}
//       (the bytes it was lent), or {failed: why}.
//   {load: {..., programText}} (the snapshot's builder) start Pyodide from scratch,
//       prepare it and answer {snapshot: bytes}.
//   {load: {..., compilerText}} (the packages' compiler) start Pyodide from scratch,
//       run compilerText (shims/pyodide_compile.py) and answer {compiled: bytes}, the
//       zip it leaves at COMPILED.
//   {job: request, files, diskBytes} place `files` ([{path, data}]) in the working
//       directory, run python_program's request there with its files' bytes bounded
//       by `diskBytes`, and answer {answer: json, files, diskFull}: what it left under
//       out/, and whether it hit the bound. Meanwhile each tool call is {call: id,
//       method, params} out and {reply: id, answer} back.
//   {fileOp: {op, ...}} between a session's steps (see pyodide_files.js): "put"
//       {files, diskBytes}, "get" {path} or "list"; answers {filed: {...}}.
//
// The program's output goes straight to the process's stdout and stderr, as it is
// written; the host marks where each program's output ends. Whatever the program does
// to this worker's JavaScript world (globals, timers, promises) ends with the worker:
// every program gets a new one.

import { boot } from "./pyodide_boot.js";
import { collectOut, enterWorkDir, FileQuota, listFiles, placeFiles, readFile, Refused } from "./pyodide_files.js";
import { writeAll } from "./worker_io.js";

// Captured first: nothing below may be reached or replaced by the program.
const stringify = JSON.stringify;
const post = globalThis.postMessage.bind(globalThis);
const stdoutWrite = Deno.stdout.writeSync.bind(Deno.stdout);
const stderrWrite = Deno.stderr.writeSync.bind(Deno.stderr);
const permissions = Deno.permissions;

// What a program most often does first: print to both streams, return a value.
const WARM_UP = "import sys\nprint('warm')\nprint('warm', file=sys.stderr)\nsum([1, 2])";
// Where shims/pyodide_compile.py leaves the packages' bytecode.
const COMPILED = "/tmp/compiled.zip";

let interpreter = null;
let quota = null;
let nextCall = 1;
const calls = new Map();

globalThis.onmessage = async ({ data }) => {
  if (data?.reply !== undefined) {
    calls.get(data.reply)?.(data.answer);
    calls.delete(data.reply);
  } else if (data?.job && interpreter) {
    const { FS } = interpreter.pyodide;
    const placed = prepareFiles(FS, data.files ?? [], data.diskBytes);
    const json = placed ?? (await answer(data.job));
    postAnswer(json, FS);
  } else if (data?.fileOp && interpreter) {
    const filed = fileOp(interpreter.pyodide.FS, data.fileOp);
    post({ filed }, filed.data ? [filed.data.buffer] : []);
  } else if (data?.load && !interpreter) {
    await load(data.load);
  }
};

async function load(what) {
  try {
    interpreter = await boot(what);
    if (what.programText !== undefined) {
      const snapshot = interpreter.pyodide.makeMemorySnapshot();
      post({ snapshot }, [snapshot.buffer]);
      return;
    }
    if (what.compilerText !== undefined) {
      interpreter.pyodide.runPython(what.compilerText);
      const compiled = interpreter.pyodide.FS.readFile(COMPILED);
      post({ compiled }, [compiled.buffer]);
      return;
    }
    // The working directory is there before the quota: it is not the program's.
    enterWorkDir(interpreter.pyodide.FS);
    quota = new FileQuota(interpreter.pyodide.FS);
    await warmUp();
    // The borrowed bytes go back before any program exists (see startInterpreter).
    const returned = { stdlib: what.stdlib, timeZones: what.timeZones, snapshot: what.snapshot };
    post({ ready: true, returned }, Object.values(returned).map((bytes) => bytes.buffer));
  } catch (error) {
    post({ failed: String(error?.stack ?? error) });
  }
}

// Off the request path, before any program exists: the first program a restored
// interpreter runs costs more (paths through Pyodide and python_program run for the
// first time), and the snapshot holds `random` as it was seeded when the snapshot was
// made; without a fresh seed (from crypto.getRandomValues) every interpreter would draw
// the same numbers. Then the worker gives up what Python could reach through
// `import js` and does not need (`process` is gone already, see pyodide_boot.js).
async function warmUp() {
  const { pyodide } = interpreter;
  const discard = { write: (bytes) => bytes.length };
  pyodide.setStdout(discard);
  pyodide.setStderr(discard);
  await answer({ code: WARM_UP, inputs: null, timeout_ms: 1000 });
  // Raw writes as Python makes them: the daemon counts output against the budget as
  // it streams, and nothing is lost or reordered by line buffering.
  pyodide.setStdout({ write: (bytes) => (writeAll(stdoutWrite, bytes), bytes.length) });
  pyodide.setStderr({ write: (bytes) => (writeAll(stderrWrite, bytes), bytes.length) });
  pyodide.runPython("__import__('random').seed()");
  giveUp();
}

function giveUp() {
  permissions.revokeSync({ name: "read" });
  for (const name of ["read", "write", "net", "env", "sys", "run", "ffi"]) {
    if (permissions.querySync({ name }).state === "granted") {
      throw new Error(`the interpreter could not give up its ${name} permission`);
    }
  }
  for (const name of ["exit", "kill", "stdin", "stdout", "stderr", "addSignalListener", "removeSignalListener"]) {
    delete Deno[name];
  }
  delete globalThis.close;
  delete globalThis.Worker;
  trackTimers();
  // An error outside the awaited program (a timer, an unawaited promise) must not end
  // the worker before it answers.
  globalThis.addEventListener("error", (event) => event.preventDefault());
  globalThis.addEventListener("unhandledrejection", (event) => event.preventDefault());
}

// Every timer a program sets is cleared when it ends, before its answer goes out: a
// timer left behind would otherwise fire between the answer and the worker's end,
// writing into the next program's output, and cost the host its worker process.
const timers = new Set();
const clearTimer = globalThis.clearTimeout;

function trackTimers() {
  for (const [set, clear] of [["setTimeout", "clearTimeout"], ["setInterval", "clearInterval"]]) {
    const realSet = globalThis[set];
    const realClear = globalThis[clear];
    globalThis[set] = {
      [set](...args) {
        const id = realSet(...args);
        timers.add(id);
        return id;
      },
    }[set];
    globalThis[clear] = {
      [clear](id) {
        timers.delete(id);
        realClear(id);
      },
    }[clear];
  }
}

function clearTimers() {
  for (const id of timers) clearTimer(id);
  timers.clear();
}

// The program's answer, with what it left under out/; the answer alone if the files
// cannot be read (the program broke what reading them needs).
function postAnswer(json, FS) {
  const diskFull = quota.hit;
  try {
    const files = collectOut(FS);
    const buffers = [];
    for (let i = 0; i < files.length; i++) buffers[i] = files[i].data.buffer;
    post({ answer: json, files, diskFull }, buffers);
  } catch {
    post({ answer: json, files: [], diskFull });
  }
}

// A job's working directory entered, its input files placed (the daemon saw that they
// fit) and its quota set: null, or the answer that the files could not be placed.
function prepareFiles(FS, files, diskBytes) {
  quota.begin(Infinity);
  try {
    enterWorkDir(FS);
    placeFiles(FS, quota, files);
    quota.begin(typeof diskBytes === "number" ? diskBytes : Infinity);
    return null;
  } catch (error) {
    const message = `the input files could not be placed: ${error?.message ?? error}`;
    return stringify({ error: { type: "OSError", message, traceback: "" } });
  }
}

// One operation on a session's working directory between its steps: {ok: true}
// (with `data` for "get", `files` for "list"), or {refused: why}.
function fileOp(FS, { op, path, files, diskBytes }) {
  try {
    enterWorkDir(FS);
    if (op === "put") {
      quota.begin(diskBytes); // the writes are bounded as the check before them says
      placeFiles(FS, quota, files, diskBytes);
      return { ok: true };
    }
    if (op === "get") return { ok: true, data: readFile(FS, path) };
    if (op === "list") return { ok: true, files: listFiles(FS) };
    return { refused: `no file operation ${op}` };
  } catch (error) {
    if (error instanceof Refused) return { refused: error.message };
    return { refused: `the files could not be placed: ${error?.message ?? error}` };
  }
}

// One JSON-RPC call to the daemon through the host, for python_program's `host_call`:
// the answer as JSON text, {"result": ...} or {"error": {...}}, never a rejection.
function hostCall(method, params) {
  const id = nextCall++;
  return new Promise((resolve) => {
    calls.set(id, resolve);
    post({ call: id, method: String(method), params: String(params) });
  });
}

// The program, through python_program, in a fresh namespace: its JSON answer.
// runPythonAsync, so the program may await at top level and run_sync may suspend it.
async function answer(request) {
  const { pyodide, run } = interpreter;
  const scope = pyodide.globals.get("dict")();
  let json;
  try {
    scope.set("conduit_run", run);
    scope.set("request_json", stringify(request));
    scope.set("js_host_call", hostCall);
    json = await pyodide.runPythonAsync("await conduit_run(request_json, js_host_call)", { globals: scope });
  } catch (error) {
    json = stringify({ error: { type: "InternalError", message: String(error?.message ?? error), traceback: "" } });
  } finally {
    scope.destroy();
  }
  try {
    pyodide.runPython("import sys; sys.stdout.flush(); sys.stderr.flush()");
  } catch {
    // Output already written stays written; the answer still goes out.
  }
  clearTimers();
  return String(json);
}
