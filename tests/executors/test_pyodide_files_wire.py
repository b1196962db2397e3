"""The files line a Pyodide worker sends after a program's answer, read as the program
wrote it: bytes exact, paths checked (a path the program chose that may not cross the
boundary is dropped), and a hit disk limit reported as `disk_limit`."""

from __future__ import annotations

import base64
import fcntl
import json
import subprocess
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from conduit.core.files import FileData
from conduit.executors import pyodide_host
from conduit.executors.base import Limits, Outcome, Status
from conduit.executors.outcomes import disk_limit
from conduit.executors.pyodide_files import (
    files_line_bytes,
    on_the_wire,
    out_files,
    stored_files,
)
from conduit.executors.pyodide_host import PIPE_BYTES, WidePipes, _Pipe
from tests.sandboxes import WAIT_S


def line(files: Sequence[Mapping[str, object]], disk_full: bool = False) -> bytes:
    return json.dumps({"files": files, "disk_full": disk_full}).encode()


def test_files_round_trip_byte_exact() -> None:
    files = [FileData("a/b.bin", bytes(range(256))), FileData("c.txt", b"")]
    decoded = out_files(line(on_the_wire(files)))
    assert decoded is not None
    assert (decoded.files, decoded.disk_full) == (files, False)


def test_paths_that_may_not_cross_are_dropped() -> None:
    data = base64.b64encode(b"x").decode()
    bad = ["../up", "/abs", "a//b", "a\\b", "ctl\x01", "", 7]
    entries: list[dict[str, object]] = [{"path": path, "base64": data} for path in bad]
    entries += [{"path": "ok", "base64": "not base64!"}, {"path": "fine", "base64": data}]
    decoded = out_files(line(entries, disk_full=True))
    assert decoded is not None
    assert decoded.files == [FileData("fine", b"x")]
    assert decoded.disk_full


def test_a_line_that_is_not_a_files_line_is_none() -> None:
    assert out_files(b"not json") is None
    assert out_files(b'{"result": 1}') is None


def test_the_line_bound_holds_what_disk_mb_allows() -> None:
    limits = Limits(disk_mb=1)
    whole = [FileData("f", b"x" * (1024 * 1024))]
    assert len(line(on_the_wire(whole))) <= files_line_bytes(limits)


def test_a_listing_keeps_only_files_in_path_order() -> None:
    listed = [{"path": "b", "size": 2}, {"path": "a", "size": 1}, {"path": 3}, "x"]
    assert [(f.path, f.size) for f in stored_files(listed)] == [("a", 1), ("b", 2)]
    assert stored_files(None) == []


def test_disk_limit_names_the_limit() -> None:
    outcome = disk_limit(Outcome(Status.OK), Limits(disk_mb=3))
    assert outcome.status is Status.DISK_LIMIT
    assert outcome.error is not None and "limits.disk_mb (3 MB)" in outcome.error.message


async def test_a_host_pipe_is_widened_at_its_first_long_line_only() -> None:
    # Linux charges a pipe's size to the user: a host whose lines stay short keeps
    # the default, one that moved a megabyte's line crosses the next in few reads.
    sizes = []
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            partial(trio.run_process, ["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        )
        pipe = _Pipe(process.stdout, widen_for=process)
        size = partial(fcntl.fcntl, process.stdout.fileno(), fcntl.F_GETPIPE_SZ)
        long_line = b"x" * (3 * 65536) + b"\n"
        with trio.fail_after(WAIT_S):
            await process.stdin.send_all(b"short\n")
            assert await pipe.read_line(1 << 20) == b"short"
            sizes.append(size())
            nursery.start_soon(process.stdin.send_all, long_line + b"after\n")
            assert await pipe.read_line(1 << 20) == long_line[:-1]
            assert await pipe.read_line(1 << 20) == b"after"
            sizes.append(size())
            await process.stdin.aclose()
    assert sizes[0] == 65536
    assert sizes[1] == min(PIPE_BYTES, int(Path("/proc/sys/fs/pipe-max-size").read_text()))


def test_wide_pipes_are_bounded_and_freed_when_their_process_ends() -> None:
    wide = WidePipes(2)
    first, second, third = (SimpleNamespace(returncode=None) for _ in range(3))
    assert wide.take_nowait(first) and wide.take_nowait(second)  # type: ignore[arg-type]
    assert not wide.take_nowait(third)  # type: ignore[arg-type]
    first.returncode = 0  # reaped: its pipes are gone
    assert wide.take_nowait(third)  # type: ignore[arg-type]
    wide.give_back(third)  # type: ignore[arg-type]
    assert wide.take_nowait(third) and not wide.take_nowait(first)  # type: ignore[arg-type]


async def test_no_pipe_is_widened_past_the_process_wide_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each worker's stdout may widen at its first long line: a pool or many sessions
    # would otherwise take 1 MiB each of the user's pipe budget.
    monkeypatch.setattr(pyodide_host, "WIDE_PIPES", WidePipes(1))
    long_line = b"x" * (3 * 65536) + b"\n"
    sizes, processes = [], []
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            process = await nursery.start(
                partial(trio.run_process, ["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            )
            processes.append(process)  # the first still running when the second widens
            pipe = _Pipe(process.stdout, widen_for=process)
            with trio.fail_after(WAIT_S):
                nursery.start_soon(process.stdin.send_all, long_line)
                assert await pipe.read_line(1 << 20) == long_line[:-1]
            sizes.append(fcntl.fcntl(process.stdout.fileno(), fcntl.F_GETPIPE_SZ))
        for process in processes:
            await process.stdin.aclose()
    assert sizes == [min(PIPE_BYTES, int(Path("/proc/sys/fs/pipe-max-size").read_text())), 65536]
