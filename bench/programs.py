"""The programs the figures run: one trivial program per language, the same everywhere,
and one realistic program per language (`realistic_request`).

The peer (llm-wasm-sandbox) runs a script and has no "value of the last expression",
so its versions print that value instead: a program that computed nothing would show.
"""

from __future__ import annotations

import datetime
import functools
import json
import random
from typing import Any

TYPESCRIPT = "const xs = [1, 2, 3];\nxs.reduce((a, b) => a + b, 0)"
# The same with types, as TypeScript: they are erased before it runs on wasm-js.
TYPESCRIPT_TYPED = "const xs: number[] = [1, 2, 3];\nxs.reduce((a: number, b: number) => a + b, 0)"
PYTHON = "xs=[1,2,3]\nsum(xs)"
JAVASCRIPT = "const xs=[1,2,3];\nxs.reduce((a,b)=>a+b,0)"
RESULT = 6

# No executor named: TypeScript whose types erase runs on wasm-js.
TYPESCRIPT_REQUEST: dict[str, Any] = {"language": "typescript", "code": TYPESCRIPT_TYPED}
DENO_REQUEST: dict[str, Any] = {**TYPESCRIPT_REQUEST, "executor": "deno"}
# No executor named: the default for python is wasm-python.
PYTHON_REQUEST: dict[str, Any] = {"language": "python", "code": PYTHON}
PYODIDE_REQUEST: dict[str, Any] = {"language": "python", "executor": "pyodide", "code": PYTHON}
WASM_JS_REQUEST: dict[str, Any] = {
    "language": "javascript",
    "executor": "wasm-js",
    "code": JAVASCRIPT,
}

PEER_PYTHON = "xs=[1,2,3]\nprint(sum(xs))"
PEER_JAVASCRIPT = "const xs=[1,2,3];\nconsole.log(xs.reduce((a,b)=>a+b,0))"


# The realistic program: what a model writes for "summarise this log and look up its
# busiest paths". It imports the standard library a model reaches for, parses ~100 KB
# of `inputs` (a log whose lines carry a timestamp, a level, a path, a duration and a
# JSON payload), makes REALISTIC_TOOL_CALLS calls to the echo upstream and returns a
# dict. The same work in Python and in JavaScript.
REALISTIC_PYTHON = """\
import collections
import dataclasses
import datetime
import json
import logging
import re

logging.basicConfig(level=logging.INFO)
log = logging.getLogger("report")
LINE = re.compile(r"^(\\S+) (\\w+) (\\S+) (\\d+) (.*)$")


@dataclasses.dataclass
class Entry:
    at: datetime.datetime
    level: str
    path: str
    ms: int
    user: str


entries = []
for line in inputs["log"].splitlines():
    match = LINE.match(line)
    if match:
        at, level, path, ms, payload = match.groups()
        when = datetime.datetime.fromisoformat(at)
        entries.append(Entry(when, level, path, int(ms), json.loads(payload)["user"]))
by_path = collections.Counter(entry.path for entry in entries)
top = [path for path, _ in sorted(by_path.items(), key=lambda kv: (-kv[1], kv[0]))[:5]]
slowest = max(entries, key=lambda entry: entry.ms)
log.info("parsed %d entries", len(entries))
times = [entry.at for entry in entries]
{
    "entries": len(entries),
    "errors": sum(entry.level == "ERROR" for entry in entries),
    "top_paths": [tools.echo.echo(text=path) for path in top],
    "slowest": {"path": slowest.path, "ms": slowest.ms, "at": slowest.at.isoformat()},
    "span_s": (max(times) - min(times)).total_seconds(),
}
"""
REALISTIC_JAVASCRIPT = """\
const LINE = /^(\\S+) (\\w+) (\\S+) (\\d+) (.*)$/;
class Entry {
  constructor(at, level, path, ms, user) {
    Object.assign(this, { at, level, path, ms, user });
  }
}
const entries = [];
for (const line of inputs.log.split("\\n")) {
  const match = LINE.exec(line);
  if (match) {
    const [, at, level, path, ms, payload] = match;
    entries.push(new Entry(new Date(at), level, path, Number(ms), JSON.parse(payload).user));
  }
}
const byPath = new Map();
for (const entry of entries) byPath.set(entry.path, (byPath.get(entry.path) ?? 0) + 1);
const top = [...byPath]
  .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))
  .slice(0, 5)
  .map(([path]) => path);
const slowest = entries.reduce((a, b) => (b.ms > a.ms ? b : a));
console.error(`parsed ${entries.length} entries`);
const echoed = [];
for (const path of top) echoed.push(await tools.echo.echo({ text: path }));
const times = entries.map((entry) => entry.at.getTime());
({
  entries: entries.length,
  errors: entries.filter((entry) => entry.level === "ERROR").length,
  top_paths: echoed,
  slowest: { path: slowest.path, ms: slowest.ms, at: slowest.at.toISOString() },
  span_s: (Math.max(...times) - Math.min(...times)) / 1000,
})
"""
REALISTIC_TOOL_CALLS = 5
REALISTIC_INPUT_BYTES = 100_000
# Per executor: its language and program.
REALISTIC_PROGRAMS = {
    "deno": ("javascript", REALISTIC_JAVASCRIPT),
    "wasm-js": ("javascript", REALISTIC_JAVASCRIPT),
    "wasm-python": ("python", REALISTIC_PYTHON),
    "pyodide": ("python", REALISTIC_PYTHON),
}
LOG_PATHS = ("/api/items", "/api/users", "/api/orders", "/health", "/api/search", "/login")
LOG_LEVELS = ("INFO", "INFO", "INFO", "WARNING", "ERROR")


@functools.cache
def _log() -> str:
    pick = random.Random(23)
    lines: list[str] = []
    size = 0
    start = datetime.datetime(2026, 11, 26, 9, 0, tzinfo=datetime.UTC)
    while size < REALISTIC_INPUT_BYTES:
        at = start + datetime.timedelta(milliseconds=pick.randrange(3_600_000))
        path = f"{pick.choice(LOG_PATHS)}/{pick.randrange(40)}"
        payload = json.dumps({"user": f"u{pick.randrange(500)}", "bytes": pick.randrange(1 << 16)})
        line = (
            f"{at.isoformat(timespec='milliseconds')} {pick.choice(LOG_LEVELS)} {path} "
            f"{pick.randrange(1, 900)} {payload}"
        )
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def realistic_inputs() -> dict[str, Any]:
    """~REALISTIC_INPUT_BYTES of log, the same every run."""
    return {"log": _log()}


def realistic_request(executor: str) -> dict[str, Any]:
    language, code = REALISTIC_PROGRAMS[executor]
    return {
        "language": language,
        "executor": executor,
        "code": code,
        "inputs": realistic_inputs(),
        "limits": {"tool_calls": REALISTIC_TOOL_CALLS},
    }


def realistic_expected(inputs: dict[str, Any]) -> dict[str, Any]:
    """What the realistic program returns for `inputs` (every field but the echoed
    paths' form, which is the upstream's)."""
    fields = [line.split(" ", 4) for line in inputs["log"].splitlines()]
    counts: dict[str, int] = {}
    for _, _, path, _, _ in fields:
        counts[path] = counts.get(path, 0) + 1
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    return {
        "entries": len(fields),
        "errors": sum(level == "ERROR" for _, level, _, _, _ in fields),
        "top": [path for path, _ in top],
    }
