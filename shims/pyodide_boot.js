// Loading Pyodide for a Conduit worker, shared by the worker (pyodide_worker.js) and
// the builder of its memory snapshot (pyodide_snapshot.js).
//
// `boot` loads Pyodide, from a snapshot when one is given, and returns it with
// `conduit_run`, the Python coroutine function that runs one request through
// shims/python_program.py. A snapshot holds an interpreter that already ran `PREPARE`:
// python_program imported, conduit_run defined.

// The program's contract and a runner whose synchronous tool calls wait on the
// daemon's answer (JSPI's run_sync).
const PREPARE = `
import json, sys
sys.path.insert(0, "/conduit")
import python_program
from pyodide.ffi import run_sync

async def conduit_run(request_json, js_host_call):
    def host_call(method, params):
        return run_sync(js_host_call(method, params))
    return await python_program.execute_async(json.loads(request_json), host_call)
`;

export async function boot({ pyodideDir, programText, snapshot, makeSnapshot }) {
  const { loadPyodide } = await import(`file://${pyodideDir}/pyodide.mjs`);
  const options = { indexURL: `${pyodideDir}/`, stdout: () => {}, stderr: () => {} };
  if (snapshot) options._loadSnapshot = snapshot;
  if (makeSnapshot) options._makeSnapshot = true;
  const pyodide = await loadPyodide(options);
  // Pyodide keeps the snapshot's bytes referenced (~30 MB): let them go.
  delete options._loadSnapshot;
  if (pyodide._api?.config) delete pyodide._api.config._loadSnapshot;
  if (!snapshot) {
    pyodide.FS.mkdirTree("/conduit");
    pyodide.FS.writeFile("/conduit/python_program.py", programText);
    pyodide.runPython(PREPARE);
  }
  return { pyodide, run: pyodide.globals.get("conduit_run") };
}
