"""Every byte a program writes reaches the result and the live stream, on every
executor, whatever the size of each write; past the output budget, `truncated` and
the status say what was cut.

Each program writes one text to stdout and another to stderr, each in a single
write, at sizes around the places a write could be cut: a WASI host takes 8 KiB of a
write at a time, a pipe 64 KiB, and a reader reads 64 KiB at once. The texts mix
characters of one to four bytes in UTF-8, so those cuts fall inside characters.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors.base import Executor, Job, Limits, Outcome, Status
from conduit.executors.deno import DenoExecutor
from conduit.executors.output import StreamName
from conduit.shims import python_program
from tests.sandboxes import LOAD_WAIT_S, NoBridge, start_pyodide

MIB = 1024 * 1024
# Bytes per write: either side of the WASI host's 8 KiB, past a pipe's 64 KiB, and large.
SIZES = (1, 8191, 8192, 8193, 65537, MIB + 3, 4 * MIB)
# Per stream, ten bytes of characters of 1, 2, 3 and 4 bytes, and what pads a size to
# its last byte; stderr's differ, so neither stream can pass for the other.
UNITS: dict[StreamName, tuple[str, str]] = {"stdout": ("aé€😀", "a"), "stderr": ("😀€éb", "b")}
# Both streams at the largest size, with a newline each, fit.
ROOMY = Limits(output_bytes=9 * MIB, timeout_ms=60_000)
# A budget that a write of 1 MiB + 3 breaks inside a character: 10,000 units, an "a"
# and the first byte of an "é".
BUDGET = 100_002

# Each writes `text_of(n, stream)`, built from `inputs`, in a single write per stream.
PYTHON = """
import sys
def text(stream):
    unit, pad = inputs["units"][stream]
    return unit * (inputs["n"] // 10) + pad * (inputs["n"] % 10)
sys.stdout.write(text("stdout"))
if inputs["both"]:
    sys.stderr.write(text("stderr"))
"""
# console.log and console.error add a newline to their one write.
JAVASCRIPT = """
const text = (stream) => {
  const [unit, pad] = inputs.units[stream];
  return unit.repeat(Math.floor(inputs.n / 10)) + pad.repeat(inputs.n % 10);
};
console.log(text("stdout"));
if (inputs.both) console.error(text("stderr"));
"""


def text_of(size: int, stream: StreamName) -> str:
    """The text the programs write to `stream`: `size` bytes of UTF-8."""
    unit, pad = UNITS[stream]
    return unit * (size // 10) + pad * (size % 10)


def first_difference(actual: str, expected: str) -> str | None:
    """Where `actual` departs from `expected`, briefly; None if they are equal (a diff
    of megabytes would drown the failure)."""
    if actual == expected:
        return None
    at = next(
        (i for i, (a, e) in enumerate(zip(actual, expected, strict=False)) if a != e),
        min(len(actual), len(expected)),
    )
    return (
        f"{len(actual)} characters instead of {len(expected)}, first differing at {at}: "
        f"{actual[at : at + 20]!r} instead of {expected[at : at + 20]!r}"
    )


class ShortWrites(io.RawIOBase):
    """A raw stream that takes at most `most` bytes of each write, as a WASI host may."""

    def __init__(self, most: int) -> None:
        super().__init__()
        self.most = most
        self.taken = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        piece = bytes(data[: self.most])
        self.taken += piece
        return len(piece)


def stdio_over(monkeypatch: pytest.MonkeyPatch, *, most: int) -> dict[str, ShortWrites]:
    """Unbuffered stdio over `ShortWrites`, in place of the test's own: the raw streams."""
    raw = {name: ShortWrites(most) for name in ("stdout", "stderr")}
    for name, stream in raw.items():
        text = io.TextIOWrapper(stream, encoding="utf-8", write_through=True)
        monkeypatch.setattr(sys, name, text)
        monkeypatch.setattr(sys, f"__{name}__", text)
    return raw


class Streamed:
    """The `on_output` hook: what reached the live stream, per stream."""

    def __init__(self) -> None:
        self.pieces: dict[StreamName, list[str]] = {"stdout": [], "stderr": []}

    async def __call__(self, stream: StreamName, text: str) -> None:
        self.pieces[stream].append(text)

    def text(self, stream: StreamName) -> str:
        return "".join(self.pieces[stream])


async def run(
    executor: Executor, language: str, code: str, limits: Limits, **inputs: Any
) -> tuple[Outcome, Streamed]:
    streamed = Streamed()
    inputs = {**inputs, "units": UNITS}
    job = Job("ex_bytes", language, code, limits, inputs=inputs, on_output=streamed)
    with trio.fail_after(LOAD_WAIT_S):
        return await executor.run(job, NoBridge()), streamed


async def check_every_byte(executor: Executor, language: str, code: str) -> None:
    """Each size on both streams, in the result and in the stream, byte for byte."""
    newline = "\n" if language != "python" else ""
    failures = []
    for size in SIZES:
        outcome, streamed = await run(executor, language, code, ROOMY, n=size, both=True)
        assert outcome.status is Status.OK, (size, outcome.status, outcome.error)
        assert (outcome.truncated_stdout, outcome.truncated_stderr) == (False, False), size
        for stream in UNITS:
            expected = text_of(size, stream) + newline
            assert len(expected.encode()) == size + len(newline)
            for where, actual in (
                ("result", getattr(outcome, stream)),
                ("stream", streamed.text(stream)),
            ):
                if (difference := first_difference(actual, expected)) is not None:
                    failures.append(f"{size} bytes, {stream} in the {where}: {difference}")
    assert not failures, "\n".join(failures)


async def check_the_budget_cuts(executor: Executor, language: str, code: str) -> None:
    """A single write past the budget keeps what fits, and says it was cut."""
    limits = Limits(output_bytes=BUDGET, timeout_ms=60_000)
    outcome, streamed = await run(executor, language, code, limits, n=MIB + 3, both=False)
    assert outcome.status is Status.OUTPUT_LIMIT, (outcome.status, outcome.error)
    assert outcome.error is not None and outcome.error.type == "OutputLimit"
    assert (outcome.truncated_stdout, outcome.truncated_stderr) == (True, False)
    # The budget ends inside a two-byte character: its first byte is kept, as U+FFFD.
    kept = text_of(MIB + 3, "stdout").encode()[:BUDGET]
    expected = kept.decode("utf-8", errors="replace")
    assert expected.endswith("a\ufffd")
    assert first_difference(outcome.stdout, expected) is None
    assert first_difference(streamed.text("stdout"), expected) is None


def test_unbuffered_stdio_over_short_writes_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The guest's stdio is a text stream straight over a raw one, which drops the rest
    of each short write; the Python contract makes every write whole."""
    text = text_of(100, "stdout")
    dropping = ShortWrites(most=7)
    io.TextIOWrapper(dropping, encoding="utf-8", write_through=True).write(text)
    assert bytes(dropping.taken) == text.encode()[:7]

    raw = stdio_over(monkeypatch, most=7)
    python_program.write_whole()
    python_program.write_whole()  # idempotent: one layer, not two
    print(text, end="")
    sys.__stderr__.write(text)
    for name, stream in raw.items():
        assert bytes(stream.taken) == text.encode(), name
    assert sys.stdout is sys.__stdout__
    assert sys.stdout.buffer._raw is raw["stdout"]  # type: ignore[attr-defined]


def test_a_raw_stdio_that_takes_nothing_raises_rather_than_spins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stdio_over(monkeypatch, most=0)
    python_program.write_whole()
    with pytest.raises(BlockingIOError):
        sys.stdout.write("x")


async def test_wasm_python_keeps_every_byte_of_each_write(wasm: Executor) -> None:
    await check_every_byte(wasm, "python", PYTHON)
    await check_the_budget_cuts(wasm, "python", PYTHON)


async def test_wasm_js_keeps_every_byte_of_each_write(wasm_js: Executor) -> None:
    await check_every_byte(wasm_js, "javascript", JAVASCRIPT)
    await check_the_budget_cuts(wasm_js, "javascript", JAVASCRIPT)


async def test_deno_keeps_every_byte_of_each_write(nursery: trio.Nursery, tmp_path: Path) -> None:
    deno = DenoExecutor(cache_dir=tmp_path / "deno", pool_size=1)
    with trio.fail_after(LOAD_WAIT_S):
        await nursery.start(deno.serve)
    await check_every_byte(deno, "javascript", JAVASCRIPT)
    await check_the_budget_cuts(deno, "javascript", JAVASCRIPT)


@pytest.mark.slow
async def test_pyodide_keeps_every_byte_of_each_write(
    nursery: trio.Nursery, tmp_path: Path, pyodide_install: Path
) -> None:
    pyodide = await start_pyodide(nursery, tmp_path / "pyodide", pyodide_install)
    await check_every_byte(pyodide, "python", PYTHON)
    await check_the_budget_cuts(pyodide, "python", PYTHON)
