"""What a program cannot use on each executor, one line each, for the model writing it.

The execute tools' descriptions and `sdk/get` show the line of the executor that runs
a language's programs by default (the descriptions also name the packages the operator
installed on it, `installed_packages`), so that a model learns it before it writes a
program rather than by failing. This is the one place each line lives: change it with
its executor (docs/executors.md says the same at length).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["CANNOT_USE", "cannot_use", "installed_packages"]

# Packages named in a description at most; a long list would crowd the model's context
# (a package's dependencies are installed and listed too).
MAX_LISTED_PACKAGES = 30

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
        "readdirSync, rmSync), the network (no fetch; call tools instead), or Intl, "
        "normalize(), \\p{...} in regular expressions, Buffer or process (a program "
        "using imports, Intl, toLocaleString, localeCompare or one of these runs on deno "
        "instead when deno is enabled, unless it names executor 'wasm-js')"
    ),
    # TypeScript with no deno to take what its types do not erase into.
    "wasm-js/typescript": (
        "what needs a TypeScript compiler (enum, namespace, decorators, parameter "
        "properties), imports or require (for files use the global `fs`), the network "
        "(no fetch; call tools instead), or Intl, normalize(), \\p{...} in regular "
        "expressions, Buffer or process"
    ),
}


def cannot_use(executor: str | None, language: str | None = None) -> str:
    """One sentence saying what programs (in `language`) cannot use on `executor`; ""
    if unknown."""
    line = CANNOT_USE.get(f"{executor}/{language}") or CANNOT_USE.get(executor or "")
    return f"Programs on {executor} cannot use {line}." if line else ""


def installed_packages(packages: Mapping[str, str]) -> str:
    """One sentence naming the packages installed beyond the standard library, with
    their versions (`packages`, by name); "" if none."""
    if not packages:
        return ""
    listed = [f"{name} {version}" for name, version in list(packages.items())[:MAX_LISTED_PACKAGES]]
    if len(packages) > MAX_LISTED_PACKAGES:
        listed.append(f"and {len(packages) - MAX_LISTED_PACKAGES} more")
    return f"Besides the standard library, these packages are installed: {', '.join(listed)}."
