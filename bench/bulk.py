"""Bulk output and a large result on every executor: what a program that prints its
progress line by line, or returns a whole report, costs.

- `print`: 10,000 lines of 20-odd characters on stdout, checked line for line;
- `result`: a string of 500,000 characters as the result, checked for its length.

p50 of sequential executions, each once its executor's pool is full.
"""

from __future__ import annotations

import functools
from typing import Any

from bench.latency import execute_latency

LINES = 10_000
RESULT_CHARS = 500_000
WARMUP = 2

PROGRAMS = {
    "print": {
        "python": f"for i in range({LINES}):\n    print(f'line {{i}} of the run')",
        "javascript": f"for (let i = 0; i < {LINES}; i++) console.log(`line ${{i}} of the run`);",
    },
    "result": {
        "python": f"'r' * {RESULT_CHARS}",
        "javascript": f"'r'.repeat({RESULT_CHARS})",
    },
}
LANGUAGES = {
    "deno": "javascript",
    "wasm-js": "javascript",
    "wasm-python": "python",
    "pyodide": "python",
}
EXPECTED_OUTPUT = "".join(f"line {i} of the run\n" for i in range(LINES))


def check(kind: str, result: dict[str, Any]) -> None:
    fine = result.get("status") == "ok" and (
        result.get("stdout") == EXPECTED_OUTPUT
        if kind == "print"
        else result.get("result") == "r" * RESULT_CHARS
    )
    if not fine:
        raise AssertionError(f"unexpected {kind} result: {str(result)[:300]}")


async def figures(path: str, executor: str, pool: int, runs: int) -> dict[str, Any]:
    """p50 (and p99) ms of each program on `executor` (`pool`: its warm pool size)."""
    language = LANGUAGES[executor]
    measured = {}
    for kind, programs in PROGRAMS.items():
        request = {
            "language": language,
            "executor": executor,
            "code": programs[language],
            "limits": {"output_bytes": 1 << 20, "output_lines": 2 * LINES},
        }
        measured[kind] = await execute_latency(
            path,
            request,
            runs,
            warm_pool=pool,
            pool_of=executor,
            warmup=WARMUP,
            check=functools.partial(check, kind),
        )
    return measured
