// Builds the memory snapshot Pyodide interpreters start from (~0.15 s instead of ~2 s).
//
// Run by the daemon, trusted, once per Pyodide, contract, time-zone data and Deno
// version, as `deno run --allow-read=<Pyodide's files, these scripts,
// python_program.py, the time-zone zip> --allow-write=<out> pyodide_snapshot.js
// <Pyodide's directory> <python_program.py> <time-zone zip> <out>`. The interpreter is
// loaded in a Web Worker, the way every interpreter restored from the snapshot is.

import { pyodideFiles, startInterpreter } from "./pyodide_boot.js";

const [pyodideDir, programModule, timeZonesPath, out] = Deno.args;
const files = await pyodideFiles(pyodideDir, timeZonesPath);
const interpreter = startInterpreter(files, { programText: Deno.readTextFileSync(programModule) });
Deno.writeFileSync(out, await interpreter.ready);
interpreter.worker.terminate();
Deno.exit(0);
