// Compiles the operator's packages with Pyodide's own CPython: their bytecode must be
// its version's, which the host's Python may not be (executors/pyodide_packages.py).
//
// Run by the daemon, trusted, once per package list, as `deno run --allow-read=<Pyodide's
// files, these scripts, pyodide_compile.py, the sources' zip> --allow-write=<out>
// pyodide_compile.js <Pyodide's directory> <pyodide_compile.py> <sources' zip> <out>`.
// The interpreter is loaded in a Web Worker, as every other is, but with no snapshot:
// the zip of the packages' sources is where interpreters will import them from, and
// `out` gets the zip of their bytecode that pyodide_compile.py makes.

import { pyodideFiles, startInterpreter } from "./pyodide_boot.js";

const [pyodideDir, compiler, sourcesPath, out] = Deno.args;
const files = await pyodideFiles(pyodideDir, sourcesPath);
const interpreter = startInterpreter(files, { compilerText: Deno.readTextFileSync(compiler) });
Deno.writeFileSync(out, await interpreter.ready);
interpreter.worker.terminate();
Deno.exit(0);
