// Loading Pyodide inside a Conduit interpreter: a Web Worker of the Pyodide host
// (pyodide_worker.js) that holds one fresh Python interpreter. Shared by the
// interpreter (pyodide_interpreter.js) and, through it, by the builder of the memory
// snapshot (pyodide_snapshot.js), so the snapshot is made exactly as it is restored.
//
// The worker reads no file: its host hands it every one as bytes (the compiled
// WebAssembly module, the standard library, the lock file, the time-zone data, the
// snapshot). Pyodide fetches its files and instantiates its WebAssembly itself, so
// while it loads, `fetch` and `WebAssembly.instantiateStreaming` answer from those
// bytes, and Deno and Node's `process` are out of its sight: it then takes its
// browser-worker path, which reads nothing from disk. All is put back once it is
// loaded, except `process`, which a sandbox does not need.

// A snapshot holds an interpreter that already ran PREPARE: python_program imported,
// conduit_run defined, the time-zone data on sys.path. A session's interpreter runs
// every step in the one scope PREPARE keeps; any other runs its one program in a new one.
const PREPARE = `
import json, sys
sys.path.insert(0, "/conduit")
sys.path.append(TIME_ZONES)
import python_program
from pyodide.ffi import run_sync

# A session's globals, kept here from one step to the next (a request with "session").
conduit_session_scope = {}

async def conduit_run(request_json, js_host_call):
    def host_call(method, params):
        return run_sync(js_host_call(method, params))
    request = json.loads(request_json)
    scope = conduit_session_scope if request.get("session") else None
    return await python_program.execute_async(request, host_call, scope=scope)
`;

// The tzdata package, zipped, which zoneinfo falls back on (there is no /usr/share
// here), with the operator's packages if any (executors/pyodide_packages.py).
const TIME_ZONES = "/lib/site-packages.zip";

// Pyodide's directory (a file: URL, with its trailing slash) and what is in it.
function fileResponses({ dir, stdlib }) {
  const byName = new Map([
    ["python_stdlib.zip", stdlib],
    ["pyodide.asm.wasm", new Uint8Array(0)], // never read: see instantiateStreaming
  ]);
  return (url) => {
    const href = String(url?.url ?? url);
    const name = href.startsWith(dir) ? href.slice(dir.length) : null;
    if (!byName.has(name)) throw new TypeError(`the sandbox loads no ${href}`);
    return new Response(byName.get(name));
  };
}

// Runs `load` with Deno and `process` hidden and Pyodide's files served from memory;
// puts everything back afterwards, whatever happens.
async function withBrowserView({ dir, stdlib, module }, load) {
  const saved = { Deno: globalThis.Deno, fetch: globalThis.fetch };
  const instantiateStreaming = WebAssembly.instantiateStreaming;
  const respond = fileResponses({ dir, stdlib });
  delete globalThis.Deno;
  // Deleted unread: reading it would set up Node's compatibility layer (~20 ms).
  delete globalThis.process;
  globalThis.fetch = (url) => new Promise((resolve) => resolve(respond(url)));
  // Pyodide's one WebAssembly module, compiled once by the host for all interpreters.
  WebAssembly.instantiateStreaming = async (_response, imports) => {
    const instance = await WebAssembly.instantiate(module, imports);
    return { instance, module };
  };
  try {
    return await load();
  } finally {
    globalThis.Deno = saved.Deno;
    globalThis.fetch = saved.fetch;
    WebAssembly.instantiateStreaming = instantiateStreaming;
  }
}

// Pyodide loaded from `snapshot` (or from scratch and prepared, when `programText`
// is given instead; or from scratch alone, given neither), with the time-zone data in
// its file system; returns it with `conduit_run`, the Python coroutine function that
// runs one request through shims/python_program.py (none when loaded alone). `dir` is
// Pyodide's directory as a file: URL ending in "/".
export async function boot({ dir, module, lock, stdlib, timeZones, snapshot, programText }) {
  return await withBrowserView({ dir, stdlib, module }, async () => {
    const { loadPyodide } = await import(`${dir}pyodide.mjs`);
    const { default: createPyodideModule } = await import(`${dir}pyodide.asm.mjs`);
    const options = {
      indexURL: dir,
      lockFileContents: lock,
      createPyodideModule,
      stdout: () => {},
      stderr: () => {},
      fsInit: (fs) => fs.writeFile(TIME_ZONES, timeZones),
    };
    if (snapshot) options._loadSnapshot = snapshot;
    else if (programText !== undefined) options._makeSnapshot = true;
    const pyodide = await loadPyodide(options);
    // Pyodide would keep the snapshot's bytes (lent by the host, and given back).
    delete options._loadSnapshot;
    if (pyodide._api?.config) delete pyodide._api.config._loadSnapshot;
    if (!snapshot && programText !== undefined) {
      pyodide.FS.mkdirTree("/conduit");
      pyodide.FS.writeFile("/conduit/python_program.py", programText);
      pyodide.globals.set("TIME_ZONES", TIME_ZONES);
      pyodide.runPython(PREPARE);
      pyodide.globals.delete("TIME_ZONES");
    }
    return { pyodide, run: pyodide.globals.get("conduit_run") };
  });
}

// ---- the host's side (pyodide_worker.js, pyodide_snapshot.js) -------------------------

const INTERPRETER = new URL("./pyodide_interpreter.js", import.meta.url);
// The interpreter imports these at run time, so it may read them until it is loaded.
const MODULES = ["pyodide.mjs", "pyodide.asm.mjs"];
// The bytes an interpreter borrows while it loads, and gives back.
const LENT = ["stdlib", "timeZones", "snapshot"];

// What every interpreter of a host is made from, read once: Pyodide's WebAssembly
// compiled (its code is shared by every interpreter), its other files as bytes, and
// the snapshot (none for the snapshot's builder).
export async function pyodideFiles(pyodideDir, timeZonesPath, snapshotPath) {
  const read = (name) => Deno.readFileSync(`${pyodideDir}/${name}`);
  return {
    dir: `file://${pyodideDir}/`,
    modules: MODULES.map((name) => `${pyodideDir}/${name}`),
    module: await WebAssembly.compile(read("pyodide.asm.wasm")),
    stdlib: read("python_stdlib.zip"),
    lock: Deno.readTextFileSync(`${pyodideDir}/pyodide-lock.json`),
    timeZones: Deno.readFileSync(timeZonesPath),
    snapshot: snapshotPath ? Deno.readFileSync(snapshotPath) : null,
  };
}

// A new interpreter worker, loading `files`: `ready` resolves once it is (to the
// snapshot's bytes, when it builds the snapshot; to the bytecode's zip, when it
// compiles packages). One interpreter loads at a time: it
// borrows the bytes it needs, transferred, not copied, and transfers them back before
// any program exists, so no program can hold or change what the next interpreter is
// made from. Only the compiled module, which cannot change, is shared.
export function startInterpreter(files, { programText, compilerText } = {}) {
  const worker = new Worker(INTERPRETER, {
    type: "module",
    deno: {
      permissions: {
        read: files.modules,
        write: false,
        net: false,
        env: false,
        sys: false,
        run: false,
        ffi: false,
        import: false,
      },
    },
  });
  const lent = LENT.filter((name) => files[name]);
  const { dir, module, lock } = files;
  const load = { dir, module, lock, programText, compilerText };
  for (const name of lent) load[name] = files[name];
  const ready = new Promise((resolve, reject) => {
    worker.onmessage = ({ data }) => {
      if (data?.ready) {
        for (const name of lent) files[name] = data.returned[name];
        resolve(undefined);
      } else if (data?.snapshot || data?.compiled) {
        resolve(data.snapshot ?? data.compiled);
      } else {
        reject(new Error(data?.failed ?? "it sent an unexpected message"));
      }
    };
    worker.onerror = (event) => {
      event.preventDefault();
      reject(new Error(event.message));
    };
  });
  worker.postMessage({ load }, lent.map((name) => files[name].buffer));
  return { worker, ready };
}
