"""Runs inside the peer's own venv (llm-wasm-sandbox): times its public API on request.

    <peer venv>/bin/python peer_worker.py SPEC_JSON

SPEC_JSON: {"workspace", "programs": {"python": code, "javascript": code}, "expect": "6"}.
Then, for each language named on a line of stdin, one run, answered on stdout with one
JSON line: {"seconds": s}, or {"error": why} if the run did not print `expect`. It
serves until stdin closes, so the benchmark can alternate the peer's runs with
Conduit's. The peer logs to stdout on its own; that goes to stderr here, leaving stdout
to the answers.

Each run is what a caller of the library does for a fresh sandbox:
`create_sandbox(runtime=...)` then `.execute(code)`. Only the standard library and the
peer are importable here: this file never runs in Conduit's venv.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

# Before the peer is imported: its logger binds whatever stdout is then.
ANSWERS: TextIO = sys.stdout
sys.stdout = sys.stderr

from sandbox import RuntimeType, create_sandbox  # noqa: E402

RUNTIMES = {"python": RuntimeType.PYTHON, "javascript": RuntimeType.JAVASCRIPT}


def run_once(language: str, code: str, workspace: Path, expect: str) -> dict[str, Any]:
    """{"seconds": s} for one fresh sandbox running `code`, or {"error": why}."""
    started = time.perf_counter()
    # workspace_root is explicit: by default the peer creates ./workspace in the cwd.
    result = create_sandbox(runtime=RUNTIMES[language], workspace_root=workspace).execute(code)
    elapsed = time.perf_counter() - started
    if not result.success or result.stdout.strip() != expect:
        return {
            "error": f"peer {language} run failed: success={result.success} "
            f"stdout={result.stdout!r} stderr={result.stderr[-500:]!r}"
        }
    return {"seconds": elapsed}


def main(spec: dict[str, Any]) -> None:
    workspace = Path(spec["workspace"])
    for line in sys.stdin:
        language = line.strip()
        answer = run_once(language, spec["programs"][language], workspace, spec["expect"])
        ANSWERS.write(json.dumps(answer) + "\n")
        ANSWERS.flush()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
