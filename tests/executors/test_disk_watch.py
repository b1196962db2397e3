"""The disk watch: a running program's directory measured against its limit."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from conduit.core.files import FileData
from conduit.executors.disk_watch import DiskWatch
from conduit.executors.scratch import Scratch


async def test_the_disk_watch_stops_a_directory_past_its_limit(tmp_path: Path) -> None:
    stopped: list[bool] = []
    watch = DiskWatch(Scratch(tmp_path), 10_000, lambda: stopped.append(True))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        await trio.sleep(0.15)
        assert not watch.hit
        (tmp_path / "big").write_bytes(os.urandom(20_000))
        with trio.fail_after(5):
            while not watch.hit:
                await trio.sleep(0.01)
    assert stopped == [True]
    assert await watch.check()
    assert stopped == [True]  # once


def test_settling_collects_within_the_limit_and_stops_past_it(tmp_path: Path) -> None:
    stopped: list[bool] = []
    watch = DiskWatch(Scratch(tmp_path), 10_000, lambda: stopped.append(True))
    assert watch.settle(lambda: [FileData("a", b"1")]) == [FileData("a", b"1")]
    (tmp_path / "big").write_bytes(os.urandom(20_000))
    assert watch.settle(lambda: [FileData("a", b"1")]) is None
    # Past the limit: the caller stops the program, on its own thread.
    assert watch.hit and stopped == []
