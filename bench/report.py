"""The side-by-side table printed at the end of a run, targets beside the figures."""

from __future__ import annotations

import statistics
from typing import Any

from bench.stats import Figures

# Targets, in one place so the report and its verdicts agree.
TS_P50_MS = 8.0
TS_VS_DENO = 3.0
PYTHON_P50_MS = 3.0
WASM_JS_P50_MS = 2.0
PYTHON_EXEC_PER_S = 150.0
TS_TOOL_OVERHEAD_MS = 1.0
PY_TOOL_OVERHEAD_MS = 0.3
TS_HUNDRED_CALLS_MS = 150.0
# TypeScript on its route (wasm-js, types erased).
TS_ROUTE_P50_MS = 1.5
TS_ROUTE_PER_S = 500.0
TS_ROUTE_HUNDRED_CALLS_MS = 50.0
PEER_RATIO = 500.0
PING_PER_S = 15_000
PYODIDE_WARM_P50_MS = 20.0
# "No growth" of the daemon over the memory run, allowing for page-granular noise.
PYODIDE_RSS_GROWTH_MIB = 1.0
KIB_PER_MIB = 1024


def row(name: str, figures: Figures) -> str:
    p50, p99 = figures["p50_ms"], figures["p99_ms"]
    return f"  {name:44} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms   (n={figures['n']})"


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def report(results: dict[str, Any]) -> None:
    machine = results["machine"]
    print(
        f"conduit bench — {machine['cpu']}, {machine['cores']} cores, {machine['date']}"
        f"{' (quick)' if results['quick'] else ''}"
    )
    print(f"load average at start {machine['loadavg_1m_at_start']} (quiet: ~0)")
    for phase, seen in machine["interference"].items():
        print(
            f"  {phase} phase: {seen['wall_s']} s; other processes used "
            f"{seen['other_processes_cpu_s']} CPU-s, steal {seen['steal_cpu_s']} s (quiet: ~0); "
            f"speed probe {seen['speed_probe_ms'][0]} ms at its start, "
            f"{seen['speed_probe_ms'][1]} ms at its end (lower is faster)"
        )
    _ping(results)
    _typescript(results)
    _python(results)
    _javascript(results)
    _tool_calls(results)
    _pyodide(results)
    _agent(results)
    if "mcp" in results:
        _mcp(results["mcp"])


def _ping(results: dict[str, Any]) -> None:
    print(
        "ping (one connection, pipelined)      "
        f"{results['ping_pipelined_rps']:10.0f} req/s   (target >= {PING_PER_S})"
    )
    print(f"ping (8 connections)                  {results['ping_8conn_rps']:10.0f} req/s")


def _typescript(results: dict[str, Any]) -> None:
    print("execute, trivial TypeScript (deno), end to end:")
    print(row("conduit, warm pool", results["execute_warm"]))
    print(row("conduit, cold (no pool)", results["execute_cold"]))
    print(row("reference: plain `deno run`", results["plain_deno_run"]))
    speedup = results["plain_deno_run"]["p50_ms"] / results["execute_warm"]["p50_ms"]
    print(
        f"  warm conduit vs plain deno run: {speedup:.1f}x faster at p50 "
        f"(target >= {TS_VS_DENO:.0f}x, p50 <= {TS_P50_MS:.0f} ms)"
    )
    print(f"execute throughput, 8 clients         {results['execute_8clients_per_s']:10.1f} exec/s")
    if "typescript" in results:
        _typescript_route(results["typescript"])


def _typescript_route(figures: dict[str, Any]) -> None:
    print("execute, trivial TypeScript with no executor named (wasm-js, types erased):")
    for name, label in (
        ("paced", "paced (20 ms apart)"),
        ("back_to_back", "back to back"),
        ("paced_new_program", "a new program each time, paced"),
        ("back_to_back_new_program", "a new program each time, b2b"),
    ):
        if name not in figures:  # a run from before it was measured
            continue
        print(row(f"conduit, {label}", figures[name]))
        p50 = figures[name]["p50_ms"]
        print(f"  (target <= {TS_ROUTE_P50_MS} ms: {verdict(p50 <= TS_ROUTE_P50_MS)})")
    for name, label in (
        ("ping_paced", "a ping alone, paced (the round trip)"),
        ("ping_back_to_back", "a ping alone, back to back"),
    ):
        if name in figures:
            print(row(label, figures[name]))
    print(row("the same on deno, back to back (pool of 2)", figures["deno_back_to_back"]))
    per_s = figures["clients_per_s"]
    print(
        f"execute throughput, 8 clients, TypeScript {per_s:7.1f} exec/s "
        f"(target >= {TS_ROUTE_PER_S:.0f}: {verdict(per_s >= TS_ROUTE_PER_S)})"
    )
    for name, label in (
        ("hundred_tool_calls", "100 sequential tool calls, SDK echo server"),
        ("hundred_instant_calls", "the same, a server answering at once"),
    ):
        hundred = figures.get(name)
        if hundred is None:  # a run from before it was measured
            continue
        print(row(label, hundred))
        print(
            f"  (target <= {TS_ROUTE_HUNDRED_CALLS_MS:.0f} ms: "
            f"{verdict(hundred['p50_ms'] <= TS_ROUTE_HUNDRED_CALLS_MS)})"
        )
    for name, label in (
        ("fan_out", "10 tool calls of 50 ms at once (Promise.all)"),
        ("deno_fan_out", "the same on deno"),
    ):
        if name in figures:  # a run from before it was measured
            print(row(label, figures[name]))
    for name, label in (
        ("compute_route", "fib(27), no executor named (moved to deno)"),
        ("compute_deno", "fib(27) on deno"),
        ("compute_wasm_js", "fib(27) on wasm-js"),
    ):
        if name in figures:  # a run from before it was measured
            print(row(label, figures[name]))
    print(row("erasing the types of 180 lines, on the host", figures["erase_report"]))


def _python(results: dict[str, Any]) -> None:
    ours = results["execute_python"]
    print("execute, trivial Python (wasm-python), end to end:")
    print(row("conduit, wasm-python", ours))
    print(
        f"  p50 {ours['p50_ms']:.2f} ms (target <= {PYTHON_P50_MS:.0f} ms: "
        f"{verdict(ours['p50_ms'] <= PYTHON_P50_MS)})"
    )
    _peer_rows(results["peer"], "python", ours)
    per_s = results["execute_python_8clients_per_s"]
    print(
        f"execute throughput, 8 clients, Python {per_s:9.1f} exec/s "
        f"(target >= {PYTHON_EXEC_PER_S:.0f}: {verdict(per_s >= PYTHON_EXEC_PER_S)})"
    )


def _javascript(results: dict[str, Any]) -> None:
    wasm_js = results["execute_wasm_js"]
    ours = wasm_js.get("figures")
    print("execute, trivial JavaScript (wasm-js), end to end:")
    if ours is None:
        print(f"  conduit, wasm-js: not measured: {wasm_js['skipped']}")
    else:
        print(row("conduit, wasm-js", ours))
        print(
            f"  p50 {ours['p50_ms']:.2f} ms (target <= {WASM_JS_P50_MS:.0f} ms: "
            f"{verdict(ours['p50_ms'] <= WASM_JS_P50_MS)})"
        )
    _peer_rows(results["peer"], "javascript", ours)


def _peer_rows(peer: dict[str, Any], language: str, ours: Figures | None) -> None:
    label = f"peer: {peer['name']} {peer['version']}"
    if "skipped" in peer:
        print(f"  {label}: not measured: {peer['skipped']}")
        return
    theirs = peer[language]
    print(row(f"{label}, runs alternating with conduit's", theirs))
    if ours is None:
        return
    ratio = theirs["p50_ms"] / ours["p50_ms"]
    print(
        f"  conduit vs peer: {ratio:,.0f}x faster at p50 "
        f"(target >= {PEER_RATIO:.0f}x: {verdict(ratio >= PEER_RATIO)})"
    )
    blocks = theirs.get("conduit_blocks_p50_ms")
    if blocks:
        pairs = sorted(run / block for run, block in zip(theirs["runs_ms"], blocks, strict=True))
        print(
            f"    each peer run against conduit's block before it: {pairs[0]:,.0f}x to "
            f"{pairs[-1]:,.0f}x, median {statistics.median(pairs):,.0f}x (n={len(pairs)})"
        )


def _tool_calls(results: dict[str, Any]) -> None:
    direct = results["direct_mcp_call"]
    print("tool calls to a trivial stdio upstream:")
    print(row("reference: MCP SDK client, directly (same protocol)", direct))
    if "direct_mcp_call_legacy" in results:
        legacy = results["direct_mcp_call_legacy"]
        print(row("  the same, `initialize` handshake (older)", legacy))
    print(row("tools/call over the socket, no sandbox", results["tool_call_via_socket"]))
    print(row("from inside a Deno sandbox, per call", results["tool_call_in_sandbox"]))
    hundred = results["hundred_tool_calls"]
    print(row("TypeScript execute with 100 sequential calls", hundred))
    print(
        f"  (target: 100 calls <= {TS_HUNDRED_CALLS_MS:.0f} ms end to end: "
        f"{verdict(hundred['p50_ms'] <= TS_HUNDRED_CALLS_MS)})"
    )
    python = results["python_tool_calls"]
    print(row("from inside a wasm-python sandbox, per call", python["per_call"]))
    print(row(f"Python execute with {python['calls']} sequential calls", python["total"]))
    _overheads(results["interleaved_tool_calls"])


def _overheads(interleaved: dict[str, Figures]) -> None:
    """The overhead targets, judged on blocks that alternated with the SDK client's."""
    sdk = interleaved["sdk"]
    print("  the SDK client and the guests in alternating blocks (the overhead targets):")
    print(row("  MCP SDK client, per call", sdk))
    for name, label, target in (
        ("deno", "Deno", TS_TOOL_OVERHEAD_MS),
        ("wasm-python", "wasm-python", PY_TOOL_OVERHEAD_MS),
    ):
        print(row(f"  from inside {label}, per call", interleaved[name]))
        overhead = interleaved[name]["p50_ms"] - sdk["p50_ms"]
        print(
            f"    {label} overhead per call at p50: {overhead:.3f} ms "
            f"(target <= {target:g} ms: {verdict(overhead <= target)})"
        )


def _pyodide(results: dict[str, Any]) -> None:
    pyodide = results["pyodide"]
    if "skipped" in pyodide:
        print(f"pyodide: not measured: {pyodide['skipped']}")
        return
    print(f"execute, trivial Python on pyodide ({pyodide['version']}), end to end:")
    warm = pyodide["warm"]["figures"]
    print(row("conduit, pyodide, warm (pool 2, paced)", warm))
    print(f"    requests that found no warm worker: {pyodide['warm']['cold_starts']}")
    print(
        f"  warm p50 {warm['p50_ms']:.2f} ms (target <= {PYODIDE_WARM_P50_MS:.0f} ms: "
        f"{verdict(warm['p50_ms'] <= PYODIDE_WARM_P50_MS)})"
    )
    back_to_back = pyodide["back_to_back"]
    print(row("conduit, pyodide, back to back (pool 2)", back_to_back["figures"]))
    print(f"    requests that found no interpreter ready: {back_to_back['cold_starts']}")
    cold = pyodide["cold"].get("figures")
    if cold is None:
        print(f"  conduit, pyodide, cold: not measured: {pyodide['cold']['skipped']}")
    else:
        print(row("conduit, pyodide, cold (pool 0: a process per execution)", cold))
    plain = pyodide["plain_pyodide_load"].get("figures")
    if plain is None:
        print(f"  reference: plain Pyodide load: not measured: {pyodide['plain_pyodide_load']}")
    else:
        print(row("reference: `deno run` loadPyodide() + 1+1", plain))
        versus = f"warm {plain['p50_ms'] / warm['p50_ms']:.0f}x"
        if cold is not None:
            versus += f", cold {plain['p50_ms'] / cold['p50_ms']:.1f}x"
        print(f"  conduit vs a plain Pyodide load at p50: {versus} faster")
    per_s = pyodide["throughput_8clients_per_s"]
    print(f"execute throughput, 8 clients, pyodide {per_s:8.1f} exec/s (bound by new interpreters)")
    _pyodide_tool_calls(results)
    _pyodide_memory(pyodide["memory"])


def _pyodide_tool_calls(results: dict[str, Any]) -> None:
    calls = results["pyodide"]["tool_calls"]
    direct = results["direct_mcp_call"]
    socket = results["pyodide"]["tool_call_via_socket"]
    print("tool calls from a pyodide program (same upstream and program as wasm-python):")
    print(row("per call, timed inside the guest", calls["per_call"]))
    print(row("tools/call over this daemon's socket", socket))
    overhead = calls["per_call"]["p50_ms"] - direct["p50_ms"]
    guest = calls["per_call"]["p50_ms"] - socket["p50_ms"]
    print(
        f"  per call at p50: {overhead:.3f} ms over the MCP SDK client, "
        f"{guest:.3f} ms over the socket call"
    )
    if "first_call" in calls:
        print(row("its first call (connects to the daemon)", calls["first_call"]))
    print(row(f"execute with {calls['calls']} sequential calls", calls["total"]))


def _pyodide_memory(memory: dict[str, Any]) -> None:
    before, after = memory["daemon_before_kib"], memory["daemon_after_kib"]
    growth = (after["VmRSS"] - before["VmRSS"]) / KIB_PER_MIB
    print(
        f"memory over {memory['executions']} pyodide executions "
        f"(8 clients, {memory['seconds']} s, {memory['per_s']:.1f} exec/s):"
    )
    print(
        f"  daemon VmRSS before {before['VmRSS'] / KIB_PER_MIB:.1f} MiB, after "
        f"{after['VmRSS'] / KIB_PER_MIB:.1f} MiB: {growth:+.1f} MiB "
        f"(target: no growth, <= {PYODIDE_RSS_GROWTH_MIB:.0f} MiB of noise: "
        f"{verdict(growth <= PYODIDE_RSS_GROWTH_MIB)}); peak {after['VmHWM'] / KIB_PER_MIB:.1f} MiB"
    )
    if memory["executions"] < memory["asked"]:
        print(f"  (only {memory['executions']} of {memory['asked']} finished in the time allowed)")
    samples = " ".join(f"{rss / KIB_PER_MIB:.1f}" for _, rss in memory["daemon_rss_samples_kib"])
    print(f"  daemon VmRSS along the run, MiB: {samples}")
    for when in ("before", "after"):
        workers = memory[f"idle_workers_{when}_kib"]
        sizes = ", ".join(
            f"{worker['VmRSS'] / KIB_PER_MIB:.1f} (anonymous "
            f"{worker.get('RssAnon', 0) / KIB_PER_MIB:.1f})"
            for worker in workers
        )
        print(f"  idle worker processes {when} the run, VmRSS MiB: {sizes}")


def _agent(results: dict[str, Any]) -> None:
    agent = results["agent"]
    print(
        "what agents do (one daemon, every executor, "
        f"max_concurrent_executions {agent['max_concurrent_executions']}):"
    )
    for name, why in agent["skipped"].items():
        print(f"  {name}: not measured: {why}")
    _idle(agent["idle"])
    _tool_waits(agent["tool_waits"])
    _realistic(agent["realistic"], _trivial(results))
    if "bulk" in agent:
        _bulk(agent["bulk"])
    _sessions(agent["sessions"])


def _idle(idle: dict[str, Any]) -> None:
    gaps = [str(gap) for gap in idle["gaps_s"]]
    targets = idle["targets"]
    echo = targets["echo server"]
    print(
        f"  a request after the daemon sat idle, p50 (min-max) ms; hot: at once again; "
        f"target: echo server + hot + {idle['margin_ms']:g} ms"
    )
    header = "".join(f"{f'after {float(gap):g} s idle':>24}" for gap in gaps)
    print(f"    {'':14}{header}{'hot p50':>10}")
    for name, figures in targets.items():
        cells = "".join(f"{_range(figures['after_idle'][gap]):>24}" for gap in gaps)
        verdicts = []
        if name != "echo server" and figures["hot"].get("n"):
            for gap in gaps:
                after, base = figures["after_idle"][gap], echo["after_idle"][gap]
                if after.get("n") and base.get("n"):
                    bound = base["p50_ms"] + figures["hot"]["p50_ms"] + idle["margin_ms"]
                    verdicts.append(f"{float(gap):g} s: {verdict(after['p50_ms'] <= bound)}")
        hot = f"{figures['hot']['p50_ms']:10.2f}" if figures["hot"].get("n") else f"{'-':>10}"
        print(f"    {name:14}{cells}{hot}  {', '.join(verdicts)}")


def _range(figures: dict[str, Any]) -> str:
    if not figures.get("n"):
        return "-"
    return (
        f"{figures['p50_ms']:.1f} ({figures['min_ms']:.1f}-{figures['max_ms']:.1f}, "
        f"n={figures['n']})"
    )


def _tool_waits(waits: dict[str, Any]) -> None:
    print("  16 programs at once, each waiting 1 s on a tool (timeout_ms 2000):")
    for name, run in waits.items():
        others = f"; others: {', '.join(run['not_ok'])}" if run["not_ok"] else ""
        unfinished = f"; {run['unfinished']} unfinished" if run["unfinished"] else ""
        print(
            f"    {name:14}{run['ok']:3}/{run['programs']} ok, all back in "
            f"{run['wall_s']:.2f} s{others}{unfinished}"
        )


def _trivial(results: dict[str, Any]) -> dict[str, tuple[float | None, float | None]]:
    """Each executor's trivial p50 (ms) and executions/s with 8 clients, where measured."""
    wasm_js = results["execute_wasm_js"].get("figures") or {}
    trivial: dict[str, tuple[float | None, float | None]] = {
        "deno": (results["execute_warm"]["p50_ms"], results["execute_8clients_per_s"]),
        "wasm-python": (
            results["execute_python"]["p50_ms"],
            results["execute_python_8clients_per_s"],
        ),
        "wasm-js": (wasm_js.get("p50_ms"), None),
    }
    pyodide = results["pyodide"]
    if "skipped" not in pyodide:
        trivial["pyodide"] = (
            pyodide["warm"]["figures"]["p50_ms"],
            pyodide["throughput_8clients_per_s"],
        )
    return trivial


def _realistic(
    realistic: dict[str, Any], trivial: dict[str, tuple[float | None, float | None]]
) -> None:
    print(
        "  the realistic program (stdlib imports, 100 KB of inputs, 5 tool calls) beside "
        "the trivial one; p50 ms, exec/s with 8 clients:"
    )
    print(f"    {'':14}{'realistic p50':>14}{'exec/s':>9}{'trivial p50':>14}{'exec/s':>9}")
    for name, figures in realistic.items():
        p50, per_s = trivial.get(name, (None, None))
        print(
            f"    {name:14}{figures['latency']['p50_ms']:14.2f}{figures['per_s']:9.1f}"
            f"{_number(p50, 14, 2)}{_number(per_s, 9, 1)}"
        )


def _bulk(bulk: dict[str, Any]) -> None:
    print("  bulk: 10,000 printed lines, and a 500 KB string as the result; p50 (p99) ms:")
    print(f"    {'':14}{'printed lines':>20}{'500 KB result':>20}")
    for name, figures in bulk.items():
        cells = "".join(
            f"{figures[kind]['p50_ms']:>11.1f} ({figures[kind]['p99_ms']:.1f})".rjust(20)
            for kind in ("print", "result")
        )
        print(f"    {name:14}{cells}")


def _sessions(sessions: dict[str, Any]) -> None:
    targets, file_target = sessions["targets_ms"], sessions["file_target_ms"]
    print(
        "  sessions: a step (x += 1) p50/p99 ms against its target; a 1 MB file in and "
        f"out p50 ms (target {file_target:g}); resident MB per idle session:"
    )
    for name, figures in sessions.items():
        if name in ("targets_ms", "file_target_ms", "wire_reference"):
            continue
        step, file, idle = figures["step"], figures["file"], figures["idle_mb"]
        step_text = (
            f"{step['p50_ms']:.2f}/{step['p99_ms']:.2f} (target {targets[name]:g}: "
            f"{verdict(step['p50_ms'] <= targets[name])})"
            if "p50_ms" in step
            else f"- ({step['not_measured']})"
        )
        file_text = (
            f"{file['p50_ms']:.2f} ({verdict(file['p50_ms'] <= file_target)})"
            if "p50_ms" in file
            else f"- ({file['not_measured'][:60]})"
        )
        idle_text = f"{idle['per_session_mb']:.1f}" if "per_session_mb" in idle else "-"
        print(f"    {name:14}step {step_text}; file {file_text}; idle {idle_text} MB")
    wire = sessions["wire_reference"]
    print(f"    reference: a file's wire form alone (bench/wire_echo.py), p50 {wire['p50_ms']:.2f}")


def _number(value: float | None, width: int, decimals: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}.{decimals}f}"


def _mcp(mcp: dict[str, Any]) -> None:
    print("MCP: a trivial execute_python as tools/call, p50/p99 ms and executions/s, 8 clients:")
    for name in ("socket", "http_bare", "http_sdk", "stdio_sdk"):
        if name in mcp:
            latency = mcp[name]["latency"]
            print(
                f"    {name:10} p50 {latency['p50_ms']:7.2f}  p99 {latency['p99_ms']:7.2f}"
                f"  {mcp[name]['per_s_8_clients']:7.1f}/s"
            )
    if "http_bare" in mcp:
        added = mcp["http_bare"]["latency"]["p50_ms"] - mcp["socket"]["latency"]["p50_ms"]
        print(
            f"  HTTP adds {added:.2f} ms at p50 over the socket "
            f"(target <= {mcp['target_ms']:g}: {verdict(added <= mcp['target_ms'])})"
        )
    memory = ", ".join(f"{name} {mb:.0f}" for name, mb in mcp["rss_mb"].items())
    print(f"  resident MB of the daemon (and stdio relays) with 8 MCP clients: {memory}")
