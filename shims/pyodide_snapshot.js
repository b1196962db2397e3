// Builds the memory snapshot Pyodide workers start from (~0.2 s instead of ~2 s).
//
// Run by the daemon, trusted, once per Pyodide, contract and Deno version, as
// `deno run --allow-read=<Pyodide's files, python_program.py> --allow-write=<out>
// pyodide_snapshot.js <pyodide dir> <python_program.py> <out>`.

import { boot } from "./pyodide_boot.js";

const [pyodideDir, programModule, out] = Deno.args;
const { pyodide } = await boot({
  pyodideDir,
  programText: Deno.readTextFileSync(programModule),
  makeSnapshot: true,
});
Deno.writeFileSync(out, pyodide.makeMemorySnapshot());
