"""TypeScript on both of its executors: wasm-js (its types erased on the host) and deno.

- trivial TypeScript, paced (a pause before each, as an agent's requests come) and back
  to back, on the route a request with no executor takes (wasm-js): the same program
  each time (what the daemon read of it is kept: `executors/readings.py`), and a new
  one each time (a numbered comment added); a `ping` paced and back to back, the
  floor a request's round trip sets on this machine; back to back on deno with its
  pool of two;
- executions/s with 8 clients on the route;
- a TypeScript program making 100 tool calls, on the route: to the SDK's echo server,
  and to one that answers at once (`bench/instant_upstream.py`, the daemon's share);
- ten tool calls of 50 ms at once (`Promise.all`), on the route and on deno;
- a program that only computes (fib(27)): on the route (which moves it to deno after
  50 ms of CPU time on wasm-js, `executors/wasm_moves.py`), on deno, and on wasm-js;
- the host's time to erase the types of a 180-line program (`tests/fixtures/ts_report.ts`),
  its parse included, in this process.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.latency import check_result, execute_latency
from bench.programs import DENO_REQUEST, RESULT, TYPESCRIPT_REQUEST
from bench.stats import Figures, percentiles
from bench.throughput import execute_throughput
from bench.tool_calls import ts_fan_out, ts_hundred_calls
from conduit.executors import js_syntax, ts_erase

REPORT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "ts_report.ts"
# Between two paced executions: longer than an instance's reset after its answer.
PACE_S = 0.02
ERASE_RUNS = 50
COMPUTE = "function fib(n: number): number { return n < 2 ? n : fib(n - 1) + fib(n - 2); }\nfib(27)"
COMPUTE_REQUEST: dict[str, Any] = {"language": "typescript", "code": COMPUTE}
FIB_27 = 196418


def on(executor: str, expected: Any = RESULT) -> Any:
    """A check that the result is `expected`, and came from `executor`."""

    def check(result: dict[str, Any]) -> None:
        check_result(result, expected)
        if result.get("executor") != executor:
            raise AssertionError(f"ran on {result.get('executor')}, not {executor}: {result}")

    return check


def _answered(result: dict[str, Any]) -> None:
    if not isinstance(result, dict):
        raise AssertionError(f"not an answer: {result!r}")


async def figures(path: str, n: dict[str, int], clients: int) -> dict[str, Any]:
    runs = n["ts_route"]
    wasm = on("wasm-js")
    return {
        "paced": await execute_latency(
            path, TYPESCRIPT_REQUEST, runs, warmup=20, pause_s=PACE_S, check=wasm
        ),
        "back_to_back": await execute_latency(path, TYPESCRIPT_REQUEST, runs, check=wasm),
        "paced_new_program": await execute_latency(
            path, TYPESCRIPT_REQUEST, runs, pause_s=PACE_S, check=wasm, new_program=True
        ),
        "back_to_back_new_program": await execute_latency(
            path, TYPESCRIPT_REQUEST, runs, check=wasm, new_program=True
        ),
        # The round trip alone: what the machine's wake-ups cost a paced request.
        "ping_paced": await execute_latency(
            path, {}, runs, pause_s=PACE_S, method="ping", check=_answered
        ),
        "ping_back_to_back": await execute_latency(path, {}, runs, method="ping", check=_answered),
        "deno_back_to_back": await execute_latency(
            path, DENO_REQUEST, n["ts_deno_back_to_back"], check=on("deno")
        ),
        "clients_per_s": await execute_throughput(
            path, TYPESCRIPT_REQUEST, clients, n["throughput_s"]
        ),
        "hundred_tool_calls": await ts_hundred_calls(
            path, n["ts_hundred_calls"], executor="wasm-js"
        ),
        "hundred_instant_calls": await ts_hundred_calls(
            path, n["ts_hundred_calls"], executor="wasm-js", upstream="instant"
        ),
        "fan_out": await ts_fan_out(path, n["ts_hundred_calls"], "wasm-js"),
        "deno_fan_out": await ts_fan_out(path, n["ts_hundred_calls"], "deno"),
        **await compute(path, n["ts_compute"]),
        "erase_report": erase_time(),
    }


async def compute(path: str, runs: int) -> dict[str, Figures]:
    """fib(27) on the route, which moves it, and on each executor named."""
    return {
        f"compute_{name}": await execute_latency(
            path, {**COMPUTE_REQUEST, **named}, runs, check=on(executor, FIB_27)
        )
        for name, named, executor in (
            ("route", {}, "deno"),
            ("deno", {"executor": "deno"}, "deno"),
            ("wasm_js", {"executor": "wasm-js"}, "wasm-js"),
        )
    }


def erase_time() -> Figures:
    """Parsing and erasing the 180-line program, `ERASE_RUNS` times."""
    code = REPORT.read_text()
    samples = []
    for _ in range(ERASE_RUNS):
        started = time.perf_counter()
        erased = ts_erase.erase(js_syntax.parse(code, "typescript"))
        samples.append(time.perf_counter() - started)
        assert isinstance(erased, ts_erase.Erased), erased
    return percentiles(samples)
