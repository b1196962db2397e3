"""Tool calls to a trivial stdio upstream (the echo fixture): from inside a Deno sandbox,
from inside a wasm-python sandbox, over the daemon's socket with no sandbox, and, as the
reference, straight from the MCP SDK; and the SDK and both guests in alternating blocks,
which is what the overhead targets are judged on."""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from bench.client import Client
from bench.conduit_daemon import ECHO_SERVER
from bench.latency import SERIES_BUDGET_S, wait_pool_full
from bench.stats import Figures, percentiles

# A TypeScript program timing each of `inputs.n` sequential calls from inside the sandbox.
TS_TOOL_LOOP = """
const times = [];
for (let i = 0; i < inputs.n; i++) {
  const started = performance.now();
  await tools.echo.echo({ text: "x" });
  times.push(performance.now() - started);
}
return times;
"""
TS_HUNDRED_CALLS = "for (let i = 0; i < 100; i++) await tools.{}.echo({{ text: 'x' }});\n'done'"
# Ten calls of 50 ms each under Promise.all, as a program fanning out over a list does.
TS_FAN_OUT = (
    "await Promise.all(Array.from({ length: 10 }, () => tools.echo.slow({ seconds: 0.05 })));\n"
    "'done'"
)
# The same in Python, where a tool call is synchronous; the last expression is the result.
PY_TOOL_LOOP = """
import time
times = []
for _ in range(inputs["n"]):
    started = time.perf_counter()
    tools.echo.echo(text="x")
    times.append((time.perf_counter() - started) * 1000)
times
"""


async def ts_calls_in_sandbox(path: str, calls: int) -> Figures:
    """Per-call round trip timed inside one Deno program."""
    client = await Client.open(path)
    try:
        return percentiles(await _guest_call_seconds(client, "typescript", calls))
    finally:
        await client.aclose()


async def interleaved_calls(path: str, calls: int, rounds: int) -> dict[str, Figures]:
    """Per-call round trips from the MCP SDK client (straight to the upstream), from a
    wasm-python program and from a Deno program, in `rounds` of alternating blocks of
    `calls` each. The guests are compared with the SDK at the same moment: on a shared
    VM, figures taken minutes apart drift by tens of percent."""
    from mcp import Client as SdkClient
    from mcp.client.stdio import StdioServerParameters

    server = StdioServerParameters(command=sys.executable, args=[str(ECHO_SERVER)])
    samples: dict[str, list[float]] = {"sdk": [], "wasm-python": [], "deno": []}
    client = await Client.open(path)
    try:
        async with SdkClient(server, mode="auto", cache=None) as sdk:  # type: ignore[arg-type]
            await sdk.call_tool("echo", {"text": "x"})
            with trio.move_on_after(SERIES_BUDGET_S):
                for _ in range(rounds):
                    for _ in range(calls):
                        started = time.perf_counter()
                        await sdk.call_tool("echo", {"text": "x"})
                        samples["sdk"].append(time.perf_counter() - started)
                    samples["wasm-python"] += await _guest_call_seconds(client, "python", calls)
                    samples["deno"] += await _guest_call_seconds(client, "typescript", calls)
    finally:
        await client.aclose()
    return {name: percentiles(values) for name, values in samples.items()}


async def _guest_call_seconds(client: Client, language: str, calls: int) -> list[float]:
    """Each call's round trip, timed inside one program of `language` making `calls`
    calls after a first one that is not counted (under Deno it opens the link to the
    daemon)."""
    params = {
        "language": language,
        # TypeScript on Deno, where these figures are labelled, whatever the route.
        **({} if language == "python" else {"executor": "deno"}),
        "code": PY_TOOL_LOOP if language == "python" else TS_TOOL_LOOP,
        "inputs": {"n": calls + 1},
        "limits": {"tool_calls": calls + 1, "timeout_ms": 60_000},
    }
    result = await client.call("execute", params)
    assert result["status"] == "ok" and len(result["result"]) == calls + 1, result
    return [ms / 1000 for ms in result["result"][1:]]


async def ts_hundred_calls(
    path: str, runs: int, executor: str = "deno", upstream: str = "echo"
) -> Figures:
    """`execute` of a TypeScript program making 100 sequential calls to `upstream`'s
    echo on `executor` (each with Deno's pool full), whole request timed."""
    return await _ts_program(path, runs, TS_HUNDRED_CALLS.format(upstream), executor)


async def ts_fan_out(path: str, runs: int, executor: str) -> Figures:
    """`execute` of a TypeScript program making TS_FAN_OUT calls of 50 ms at once, on
    `executor`: 50 ms and the overhead where they run at once, 10 times that where they
    run one after another."""
    return await _ts_program(path, runs, TS_FAN_OUT, executor)


async def _ts_program(path: str, runs: int, code: str, executor: str) -> Figures:
    client = await Client.open(path)
    samples = []
    params = {"language": "typescript", "executor": executor, "code": code}
    with trio.move_on_after(SERIES_BUDGET_S):
        for _ in range(runs):
            if executor == "deno":
                await wait_pool_full(client, 2)
            started = time.perf_counter()
            result = await client.call("execute", params)
            samples.append(time.perf_counter() - started)
            assert result["result"] == "done", result
    await client.aclose()
    return percentiles(samples)


async def python_calls(
    path: str,
    calls: int,
    runs: int,
    *,
    executor: str | None = None,
    before_each: Callable[[Client], Awaitable[None]] | None = None,
    first_opens_link: bool = False,
) -> dict[str, Any]:
    """`runs` executions of one Python program making `calls` sequential calls: the whole
    request timed from the client ("total"), and every call timed inside the guest.
    `executor` names one (default: Python's default, wasm-python); `before_each` runs,
    untimed, before every execution (to wait for a warm worker). With
    `first_opens_link` (a guest that connects to the daemon's socket on its first call,
    as under Deno), each program makes one call more, reported apart as "first_call"."""
    client = await Client.open(path)
    extra = 1 if first_opens_link else 0
    params: dict[str, Any] = {
        "language": "python",
        "code": PY_TOOL_LOOP,
        "inputs": {"n": calls + extra},
        "limits": {"tool_calls": calls + extra, "timeout_ms": 60_000},
    }
    if executor is not None:
        params["executor"] = executor
    totals: list[float] = []
    per_call_ms: list[float] = []
    first_ms: list[float] = []
    with trio.move_on_after(SERIES_BUDGET_S):
        for _ in range(runs):
            if before_each is not None:
                await before_each(client)
            started = time.perf_counter()
            result = await client.call("execute", params)
            totals.append(time.perf_counter() - started)
            assert result["status"] == "ok" and len(result["result"]) == calls + extra, result
            first_ms.extend(result["result"][:extra])
            per_call_ms.extend(result["result"][extra:])
    await client.aclose()
    figures = {
        "calls": calls,
        "total": percentiles(totals),
        "per_call": percentiles([ms / 1000 for ms in per_call_ms]),
    }
    if first_ms:
        figures["first_call"] = percentiles([ms / 1000 for ms in first_ms])
    return figures


async def daemon_calls(path: str, calls: int) -> Figures:
    """`tools/call` sent straight to the daemon's socket, no sandbox: the daemon's and the
    gateway's share of a call, between the SDK floor and a call from a guest."""
    client = await Client.open(path)
    params = {"name": "echo.echo", "arguments": {"text": "x"}, "shape": "value"}
    await client.call("tools/call", params)
    samples = []
    with trio.move_on_after(SERIES_BUDGET_S):
        for _ in range(calls):
            started = time.perf_counter()
            await client.call("tools/call", params)
            samples.append(time.perf_counter() - started)
    await client.aclose()
    return percentiles(samples)


async def direct_mcp_calls(calls: int, mode: str = "auto") -> Figures:
    """The same call made straight to the upstream with the official MCP SDK client.

    `mode` is the SDK's handshake: "auto" negotiates as the daemon's own client of the
    upstream does (the newest protocol the server speaks), so the two are compared on
    the same protocol; "legacy" is the `initialize` handshake, for older figures.
    """
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    server = StdioServerParameters(command=sys.executable, args=[str(ECHO_SERVER)])
    samples = []
    async with Client(server, mode=mode, cache=None) as client:  # type: ignore[arg-type]
        await client.call_tool("echo", {"text": "x"})
        for _ in range(calls):
            started = time.perf_counter()
            await client.call_tool("echo", {"text": "x"})
            samples.append(time.perf_counter() - started)
    return percentiles(samples)
