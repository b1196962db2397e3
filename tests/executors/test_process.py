"""Resource limits set on sandbox processes from the parent (`executors.process`)."""

from __future__ import annotations

import resource
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors.deno import find_deno
from conduit.executors.process import lower_rlimit, minimal_env

TOKYO = "/usr/share/zoneinfo/Asia/Tokyo"


async def test_a_live_process_has_its_limit_lowered_and_never_raised() -> None:
    process = await trio.lowlevel.open_process(["sleep", "30"])
    try:
        lower_rlimit(process, resource.RLIMIT_NOFILE, 64, 128)
        assert resource.prlimit(process.pid, resource.RLIMIT_NOFILE) == (64, 128)
        lower_rlimit(process, resource.RLIMIT_NOFILE, 1000, 1000)
        assert resource.prlimit(process.pid, resource.RLIMIT_NOFILE) == (64, 128)
    finally:
        process.kill()
        await process.wait()


async def test_no_limit_goes_through_the_pid_of_a_reaped_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Once reaped, the pid is free for the kernel to give to any new process or
    # thread, the daemon's own included: a limit set through it could land anywhere.
    process = await trio.lowlevel.open_process(["true"])
    await process.wait()
    calls: list[Any] = []
    monkeypatch.setattr(resource, "prlimit", lambda *args: calls.append(args))
    with pytest.raises(ProcessLookupError):
        lower_rlimit(process, resource.RLIMIT_CPU, 1, 2)
    assert calls == []


@pytest.mark.skipif(
    shutil.which("bwrap") is None or not Path(TOKYO).exists() or find_deno() is None,
    reason="needs bubblewrap, the tz database and deno",
)
def test_a_sandbox_keeps_time_in_utc_whatever_the_hosts_zone(tmp_path: Path) -> None:
    # A host whose /etc/localtime is Tokyo, as bwrap shows it to Deno: the WebAssembly
    # guests know no zone but UTC, and a program must mean the same on every executor.
    host = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/etc"]
    host += ["--symlink", TOKYO, "/etc/localtime"]
    deno = [str(find_deno()), "eval", "console.log(new Date(0).toString())"]
    env = minimal_env({"DENO_DIR": str(tmp_path)})
    shown = subprocess.run([*host, *deno], env=env, capture_output=True, text=True, check=True)
    assert shown.stdout == "Thu Jan 01 1970 00:00:00 GMT+0000 (Coordinated Universal Time)\n"
    local = subprocess.run(
        [*host, *deno], env={"DENO_DIR": str(tmp_path)}, capture_output=True, text=True, check=False
    )
    assert "Japan Standard Time" in local.stdout  # the zone shown, had the sandbox none
