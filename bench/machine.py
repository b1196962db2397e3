"""What the figures were measured on, and how much else the machine did meanwhile.

On a 2-core machine any other busy process moves every figure, so the run keeps the
evidence: the CPU time the whole machine spent during the run minus what this process
and its children (the daemons, their sandboxes, the peer) spent, and the hypervisor's
steal time. Both are ~0 on a quiet machine.

A virtual machine can also compute slower for a while with nothing else running in it
(its host is busy): steal time does not always show that. So each phase also times a
fixed pure-Python loop as it starts and ends, a figure to compare between runs on one
machine; a run whose probe is well above the usual measured a slow moment.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import Any

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
# The probe's loop: ~28 ms of one core on the Intel VM of docs/performance.md's latest runs.
PROBE_ITERATIONS = 1_000_000
PROBE_REPEATS = 5


def describe() -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }


def _cpu_model() -> str:
    try:
        lscpu = subprocess.run(
            ["lscpu"], check=False, capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return platform.machine()
    for line in lscpu.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            return value.strip()
    return platform.machine()


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    busy_s: float  # the whole machine, all cores
    steal_s: float
    own_s: float  # this process and its waited-for children
    wall_s: float
    probe_ms: float  # `speed_probe_ms` just before


def speed_probe_ms() -> float:
    """The median time of a fixed pure-Python loop, in milliseconds: how fast this
    machine computes at the moment (lower is faster)."""
    times = []
    for _ in range(PROBE_REPEATS):
        started = time.perf_counter()
        total = 0
        for number in range(PROBE_ITERATIONS):
            total += number & 7
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1000, 1)


def snapshot() -> CpuSnapshot:
    """The machine's CPU counters now, after a speed probe."""
    probe_ms = speed_probe_ms()
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    times = os.times()
    return CpuSnapshot(
        busy_s=(user + nice + system + irq + softirq) * TICK_S,
        steal_s=steal * TICK_S,
        own_s=times.user + times.system + times.children_user + times.children_system,
        wall_s=time.monotonic(),
        probe_ms=probe_ms,
    )


def interference(start: CpuSnapshot, end: CpuSnapshot) -> dict[str, float]:
    """CPU seconds spent by other processes (and stolen by the hypervisor) in between."""
    other = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
    return {
        "wall_s": round(end.wall_s - start.wall_s, 1),
        "other_processes_cpu_s": round(max(0.0, other), 1),
        "steal_cpu_s": round(end.steal_s - start.steal_s, 1),
        "speed_probe_ms": [start.probe_ms, end.probe_ms],
    }
