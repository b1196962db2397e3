"""Resource limits set on sandbox processes from the parent (`executors.process`)."""

from __future__ import annotations

import resource
from typing import Any

import pytest
import trio

from conduit.executors.process import lower_rlimit


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
