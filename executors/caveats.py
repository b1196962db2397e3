"""What a program cannot use on each executor, one line each, for the model writing it.

The execute tools' descriptions and `sdk/get` show the line of the executor that runs
a language's programs by default, so that a model learns it before it writes a
program rather than by failing. This is the one place each line lives: change it with
its executor (docs/executors.md says the same at length).
"""

from __future__ import annotations

__all__ = ["CANNOT_USE", "cannot_use"]

# By executor name: what follows "Programs on <executor> cannot use".
CANNOT_USE = {
    "wasm-python": (
        "threads (use asyncio), subprocesses, sockets or the network (call tools "
        "instead), or packages outside the standard library"
    ),
    "pyodide": (
        "threads (use asyncio), subprocesses, sockets or the network (call tools "
        "instead), packages outside the standard library (no numpy, no micropip), or "
        "`import js`"
    ),
    "deno": (
        "imports (npm:, jsr:, URLs or files), files, environment variables, subprocesses "
        "or the network (fetch is denied; call tools instead)"
    ),
    "wasm-js": (
        "TypeScript syntax, imports or require (there is no module loader; for files "
        "use the global `fs`: readFileSync, writeFileSync, existsSync, mkdirSync, "
        "readdirSync, rmSync), the network (no fetch; call tools instead), or Intl (a "
        "program using Intl, toLocaleString or localeCompare runs on deno instead when "
        "deno is enabled, unless it names executor 'wasm-js')"
    ),
}


def cannot_use(executor: str | None) -> str:
    """One sentence saying what programs cannot use on `executor`; "" if unknown."""
    line = CANNOT_USE.get(executor or "")
    return f"Programs on {executor} cannot use {line}." if line else ""
