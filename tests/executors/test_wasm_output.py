"""How an instance's output reaches the host (`wasm_output`), on the real JS component."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import pytest
import trio

from conduit.executors import _wasmtime, wasm_output
from conduit.executors.base import Job, Limits, Status
from conduit.executors.output import StreamName
from conduit.executors.wasm_instances import Instance, Instances
from conduit.executors.wasm_js import WasmJsExecutor
from tests.executors.conftest import JsComponent
from tests.sandboxes import WAIT_S, NoBridge

LINES = 10_000


def printing(lines: int) -> str:
    """A run request for a program printing `lines` numbered lines on stdout, then one
    on stderr."""
    body = f"for (let i = 0; i < {lines}; i++) console.log(`line ${{i}}`); console.error('end');"
    return json.dumps({"function": f"(async function () {{ {body} return 1 }})", "line_offset": 0})


def run(instance: Instance, request: str) -> list[tuple[StreamName, bytes]]:
    """The pieces of output the sink got from running `request` in `instance`."""
    pieces: list[tuple[StreamName, bytes]] = []
    try:
        instance.install(_wasmtime.Interrupt(WAIT_S))
        instance.output.attach(lambda stream, data: pieces.append((stream, data)))
        with instance.running():
            assert json.loads(instance.run(instance.store, request)) == {"result": 1}
    finally:
        instance.close()
    return pieces


def joined(pieces: list[tuple[StreamName, bytes]], stream: StreamName) -> str:
    return b"".join(data for name, data in pieces if name == stream).decode()


def stdout_files() -> list[int]:
    """This process's descriptors of guests' standard output files."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:conduit-stdout"):
                fds.append(int(name))
    return fds


EXPECTED = "".join(f"line {i}\n" for i in range(LINES))


def test_thousands_of_lines_reach_the_sink_in_a_few_reads(js_instances: Instances) -> None:
    pieces = run(js_instances.new(), printing(LINES))
    assert joined(pieces, "stdout") == EXPECTED
    # Read from the memory file in bulk, not handed over write by write.
    assert len(pieces) < 20
    # Standard error comes after everything written before it.
    assert pieces[-1] == ("stderr", b"end\n")


def test_without_memory_files_every_write_is_handed_over(
    js_instances: Instances, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wasm_output, "FILES_AVAILABLE", False)
    pieces = run(js_instances.new(), printing(100))
    assert joined(pieces, "stdout") == "".join(f"line {i}\n" for i in range(100))
    assert len(pieces) >= 100
    assert pieces[-1] == ("stderr", b"end\n")


def test_what_a_run_wrote_is_handed_over_once(js_instances: Instances) -> None:
    """What a call into the guest wrote is read and freed after it: a second call's
    output is its own (a session's steps share their instance). Wasmtime writes on at
    its own offset, so a drain in between (a tick, or a host call, before the next step
    prints) must not read the hole before it, a NUL for every byte printed so far."""
    instance = js_instances.new()
    pieces: list[tuple[StreamName, bytes]] = []
    try:
        instance.install(_wasmtime.Interrupt(WAIT_S))
        instance.output.attach(lambda stream, data: pieces.append((stream, data)))
        with instance.running():
            instance.run(instance.store, printing(3))
        assert joined(pieces, "stdout") == "line 0\nline 1\nline 2\n"
        pieces.clear()
        instance.output.drain()  # as a tick does, before the guest writes
        with instance.running():
            instance.run(instance.store, printing(2))
    finally:
        instance.close()
    assert joined(pieces, "stdout") == "line 0\nline 1\n"


def test_a_host_call_frees_what_was_read(js_component: JsComponent) -> None:
    """As each host call begins the guest waits: what it wrote is read and freed then,
    not only when the run ends (a file's bytes piped on stdout are not output, and
    nothing else bounds how much of them a run writes)."""
    held: list[int] = []

    def host_call(_method: str, _params: str) -> str:
        wasm_output.drain_current()
        held.append(sum(os.fstat(fd).st_blocks * 512 for fd in stdout_files()))
        return '{"result": null}'

    instances = js_component.instances(host_call)
    body = (
        'const line = "x".repeat(1024 * 1024);'
        "for (let i = 0; i < 50; i++) { console.log(line); fs.existsSync('a') }"
    )
    request = json.dumps(
        {"function": f"(async function () {{ {body} return 1 }})", "line_offset": 0}
    )
    pieces = run(instances.new(), request)
    assert len(joined(pieces, "stdout")) == 50 * (1024 * 1024 + 1)
    assert len(held) == 50 and max(held) < 1024 * 1024, held


def test_what_a_full_sink_would_be_given_is_not_read(js_instances: Instances) -> None:
    """Once the sink takes no more (the output limit), the rest is skipped, not read:
    a guest printing flat out until its stop writes far faster than the ticker's
    thread reads, and reading it all held up every guest's ticks for seconds."""
    instance = js_instances.new()
    pieces: list[tuple[StreamName, bytes]] = []

    def sink(stream: StreamName, data: bytes) -> bool:
        pieces.append((stream, data))
        return False

    body = 'const line = "x".repeat(1023); for (let i = 0; i < 8192; i++) console.log(line);'
    request = json.dumps(
        {"function": f"(async function () {{ {body} return 1 }})", "line_offset": 0}
    )
    try:
        instance.install(_wasmtime.Interrupt(WAIT_S))
        instance.output.attach(sink)
        with instance.running():
            instance.run(instance.store, request)
    finally:
        instance.close()
    assert len(pieces) == 1
    assert len(pieces[0][1]) <= wasm_output.READ_BYTES


def test_a_system_refusing_memory_files_is_told_once_and_served_by_callbacks(
    js_instances: Instances, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(wasm_output, "_FD_DIR", Path("/nonexistent/fd"))
    monkeypatch.setattr(wasm_output, "_FILES_REFUSED", threading.Event())
    for _ in range(2):
        pieces = run(js_instances.new(), printing(3))
        assert joined(pieces, "stdout") == "line 0\nline 1\nline 2\n"
    refusals = [r for r in caplog.records if "through callbacks" in r.getMessage()]
    assert len(refusals) == 1


def test_a_long_answer_is_written_on_stdout_after_announcing_it(
    js_component: JsComponent,
) -> None:
    """The bindings measure the string `run` returns a character at a time: a long
    answer comes as a line on stdout, announced by `calls/pipe`, and `run` returns ""."""
    methods: list[str] = []

    def host_call(method: str, _params: str) -> str:
        methods.append(method)
        return '{"result": null}'

    body = "return 'w'.repeat(2000)"
    request = json.dumps({"function": f"(async function () {{ {body} }})", "line_offset": 0})
    instance = js_component.instances(host_call).new()
    pieces: list[tuple[StreamName, bytes]] = []
    try:
        instance.install(_wasmtime.Interrupt(WAIT_S))
        instance.output.attach(lambda stream, data: pieces.append((stream, data)))
        with instance.running():
            assert instance.run(instance.store, request) == ""
    finally:
        instance.close()
    assert methods == ["calls/pipe"]
    assert json.loads(joined(pieces, "stdout")) == {"result": "w" * 2000}


@pytest.mark.skipif(not _wasmtime.stops_by_callback(), reason="needs the epoch callback")
async def test_a_running_guest_s_output_is_freed_as_it_goes(wasm_js: WasmJsExecutor) -> None:
    """The epoch callback, on the guest's own thread, reads and frees what it wrote:
    a guest that printed and computes on holds none of it (read from the ticker's
    thread, it would be held until the run ends)."""
    code = "console.log('x'.repeat(3_000_000)); while (true) {}"
    job = Job("ex_out", "javascript", code, Limits(timeout_ms=3000, output_bytes=8_000_000))
    held: list[int] = []

    async def sample() -> None:
        await trio.sleep(1.0)  # the line is out, and many ticks have passed
        held.append(sum(os.fstat(fd).st_blocks * 512 for fd in stdout_files()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        with trio.fail_after(WAIT_S):
            outcome = await wasm_js.run(job, NoBridge())
    assert outcome.status is Status.TIMEOUT
    assert outcome.stdout == "x" * 3_000_000 + "\n"
    assert held[0] < 1_000_000, held
