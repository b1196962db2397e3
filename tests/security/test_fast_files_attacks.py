"""Attacks on the fast file paths: wasm-js writes piped on the guest's stdout, the
base64 and JSON fast codecs, and long lines on the daemon's connection.

Tests marked `xfail(strict=True)` reproduce a fault found here: they pass once it is
fixed (and then fail as XPASS, to be unmarked). The others are attacks refused.
"""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conduit.core import b64, jsontext
from conduit.core.errors import InvalidParams
from conduit.core.files import FileData
from conduit.daemon.methods.executions import ExecuteParams, checked_files
from conduit.executors.base import Job, Limits, Outcome, Status
from conduit.executors.scratch import Scratch
from conduit.executors.wasm_fs import FsError, GuestFiles
from conduit.executors.wasm_js import WasmJsExecutor
from tests.sandboxes import WAIT_S, NoBridge

MIB = 1024 * 1024


# -- wasm-js: the pipe, host side ------------------------------------------------------


def _guest_files(root: Path, disk_bytes: int = MIB) -> tuple[GuestFiles, list[bool]]:
    stopped: list[bool] = []
    return GuestFiles(Scratch(root), disk_bytes, lambda: stopped.append(True)), stopped


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.mark.parametrize("length", [-4, -1, 1.0, 4.0, float("nan"), True, 2, "4", [4], None])
def test_pipe_refuses_lengths_that_are_not_base64s(root: Path, length: Any) -> None:
    files, stopped = _guest_files(root)
    with pytest.raises(FsError) as refused:
        files.call("fs/pipe", {"path": "x", "length": length})
    assert refused.value.code == "ERR_INVALID_ARG_TYPE" and not stopped
    assert not files.piped_output(b"AAAA\n")  # no pipe was opened


@pytest.mark.parametrize("length", [4 * (MIB // 3 + 4), 4 * 10**30, 2**64])
def test_pipe_past_the_cap_stops_the_program(root: Path, length: int) -> None:
    files, stopped = _guest_files(root)
    with pytest.raises(FsError) as full:
        files.call("fs/pipe", {"path": "x", "length": length})
    assert full.value.code == "ENOSPC" and stopped == [True]
    assert not files.piped_output(b"AAAA\n")


def test_pipe_takes_the_announced_line_and_no_more(root: Path) -> None:
    files, _ = _guest_files(root)
    files.call("fs/pipe", {"path": "x", "length": 4})
    assert files.piped_output(b"QUFB\nafter\n") == 5  # the rest is output
    for _ in range(100):
        assert files.piped_output(b"B" * 8192) == 0
    files.call("fs/write", {"path": "x", "piped": True})
    assert (root / "x").read_bytes() == b"AAA"


@pytest.mark.parametrize(
    ("pieces", "taken"), [([b"QUFBQUFB\n"], 5), ([b"QU", b"FBQUFB"], 5), ([b"Q\nQUFB\n"], 2)]
)
def test_pipe_that_overflowed_or_ended_early_takes_no_more(
    root: Path, pieces: list[bytes], taken: int
) -> None:
    files, _ = _guest_files(root)
    files.call("fs/pipe", {"path": "x", "length": 4})
    assert sum(files.piped_output(piece) for piece in pieces) == taken
    assert files.piped_output(b"B" * 8192) == 0  # never swallowed for ever
    with pytest.raises(FsError) as broken:
        files.call("fs/write", {"path": "x", "piped": True})
    assert broken.value.code == "EIO" and not (root / "x").exists()


def test_any_host_call_shuts_the_pipe(root: Path) -> None:
    from conduit.executors import wasm

    files, _ = _guest_files(root)
    files.call("fs/pipe", {"path": "x", "length": 4})
    stopping = SimpleNamespace(interrupt=SimpleNamespace(reason="stop"), guest_files=files)
    wasm._RUNNING.execution = stopping
    try:
        assert "error" in json.loads(wasm._host_call("tools/call", "{}"))
    finally:
        wasm._RUNNING.execution = None
    assert files.piped_output(b"QUFB\n") == 0
    with pytest.raises(FsError):
        files.call("fs/write", {"path": "x", "piped": True})


@pytest.mark.parametrize(
    "pieces",
    [
        [b"QUFB"],  # no newline: not whole
        [b"QUF\nB"],  # the newline inside
        [b"QU\nFB\n"[:5]],
        [b"QUFBQQ==\n"],  # longer than announced
    ],
)
def test_pipe_not_whole_writes_nothing(root: Path, pieces: list[bytes]) -> None:
    files, _ = _guest_files(root)
    files.call("fs/pipe", {"path": "x", "length": 4})
    for piece in pieces:
        files.piped_output(piece)
    with pytest.raises(FsError) as broken:
        files.call("fs/write", {"path": "x", "piped": True})
    assert broken.value.code == "EIO" and not (root / "x").exists()


def test_piped_write_that_is_not_base64_is_refused(root: Path) -> None:
    files, _ = _guest_files(root)
    # (A newline inside ends the pipe early: see test_pipe_not_whole_writes_nothing.)
    for text in (b"QU-_", b"QU\r ", b"QQ=="[:3] + b"\xff"):
        files.call("fs/pipe", {"path": "x", "length": 4})
        assert files.piped_output(text + b"\n")
        with pytest.raises(FsError) as refused:
            files.call("fs/write", {"path": "x", "piped": True})
        assert refused.value.code == "ERR_INVALID_ARG_TYPE"
    assert not (root / "x").exists()


def test_stdout_is_never_taken_without_an_announced_pipe(root: Path) -> None:
    files, _ = _guest_files(root)
    assert not files.piped_output(b"QUFB\n")
    with pytest.raises(FsError) as broken:
        files.call("fs/write", {"path": "x", "piped": True})
    assert broken.value.code == "EIO"


def test_non_ascii_base64_in_a_write_is_an_fs_error(root: Path) -> None:
    # Reachable by a wasm-js program: `Object.prototype.toJSON` decides what fs.js's
    # `stringify(params)` sends, so `fs/write` can carry any `base64` string. The
    # ValueError escapes `_data_of` (it catches binascii.Error only), `_file_call` and
    # `_host_call`, into Wasmtime: the program traps instead of catching an Error.
    files, _ = _guest_files(root)
    with pytest.raises(FsError):
        files.call("fs/write", {"path": "x", "base64": "\u00e9AAA"})


# -- wasm-js: the pipe, from a hostile program ------------------------------------------


async def run_js(executor: WasmJsExecutor, code: str, **limits: Any) -> Outcome:
    with trio.fail_after(WAIT_S):
        job = Job("ex_attack", "javascript", code, Limits(**limits))
        outcome = await executor.run(job, NoBridge())
        after = await executor.run(Job("ex_next", "javascript", "1", Limits()), NoBridge())
        assert after.result == 1 and after.stdout == ""
    return outcome


# Left the pipe open while `params.piped = true` in fs.js ran a setter the program put
# on Object.prototype, after the base64 went out and before the `fs/write` that shuts it.
# fs.js sets no inherited field now; the host would shut the pipe at the newline anyway.
LEAVE_PIPE_OPEN = """
const log = console.log;
Object.defineProperty(Object.prototype, 'piped', {
  set(v) { throw new Error('stop here'); }, configurable: true,
});
try { fs.writeFileSync('a.bin', 'hello'); } catch (e) { log('caught ' + e.message); }
delete Object.prototype.piped;
"""


async def test_js_output_after_a_pipe_left_open_is_its_own(wasm_js: WasmJsExecutor) -> None:
    outcome = await run_js(wasm_js, LEAVE_PIPE_OPEN + "log('after');\n'done'")
    assert outcome.status is Status.OK, outcome.error
    assert outcome.stdout == "after\n"


async def test_js_output_in_an_open_pipe_counts_against_the_limit(
    wasm_js: WasmJsExecutor,
) -> None:
    code = (
        LEAVE_PIPE_OPEN
        + "const line = 'x'.repeat(8000);\nfor (let i = 0; i < 2000; i++) log(line);"
    )
    outcome = await run_js(wasm_js, code, output_bytes=100_000)
    assert outcome.status is Status.OUTPUT_LIMIT, outcome


async def test_js_write_after_a_setter_on_piped_is_its_own(wasm_js: WasmJsExecutor) -> None:
    code = LEAVE_PIPE_OPEN + (
        "fs.writeFileSync('b.bin', 'second');\n"
        "log('after');\n"
        "[fs.existsSync('a.bin'), fs.readFileSync('b.bin', 'utf8')]"
    )
    outcome = await run_js(wasm_js, code)
    assert outcome.status is Status.OK, outcome.error
    assert outcome.result == [True, "second"]
    assert outcome.stdout == "after\n"


async def test_js_forged_to_json_changes_no_write(wasm_js: WasmJsExecutor) -> None:
    # `toJSON` on Object.prototype would rewrite what fs.js announces and asks for, if
    # fs.js let `stringify` consult it.
    code = """
const log = console.log;
const results = [];
for (const forged of [0, 4, 8, 12, 4 * 1000, -4, 3, 1e300, 'x']) {
  Object.prototype.toJSON = function () {
    if ('length' in this) return Object.assign({}, this, { length: forged });
    return { path: 'x.bin', base64: '\\u00e9AAA' };
  };
  try { fs.writeFileSync('f.bin', 'secret-bytes'); results.push('written'); }
  catch (e) { results.push(e.code); }
  delete Object.prototype.toJSON;
  log('tick');
}
results.push(fs.readFileSync('f.bin', 'utf8'), fs.existsSync('x.bin'));
results
"""
    outcome = await run_js(wasm_js, code)
    assert outcome.status is Status.OK, outcome.error
    assert outcome.stdout == "tick\n" * 9
    assert outcome.result == ["written"] * 9 + ["secret-bytes", False]


_ACCESSED = "['error', 'result', 'piped', 'message', 'data', 'code', 'path']"


async def test_js_accessors_on_prototypes_never_run_while_the_pipe_is_open(
    wasm_js: WasmJsExecutor,
) -> None:
    # Getters and setters fs.js would run if it read or set inherited fields.
    code = f"""
const log = console.log;
const ran = [];
for (const name of {_ACCESSED}) {{
  Object.defineProperty(Object.prototype, name, {{
    get() {{ ran.push('get ' + name); log('QUFB'); return undefined; }},
    set(v) {{ ran.push('set ' + name); throw new Error('stop here'); }},
    configurable: true,
  }});
}}
let code = 'written';
try {{ fs.writeFileSync('f.bin', 'AAA'); }} catch (e) {{ code = 'threw'; }}
let missing;
try {{ fs.readFileSync('nothing.bin'); }}
catch (e) {{ missing = Object.getOwnPropertyDescriptor(e, 'code').value; }}
for (const name of {_ACCESSED}) delete Object.prototype[name];
log('after');
[code, missing, fs.readFileSync('f.bin', 'utf8'), ran]
"""
    outcome = await run_js(wasm_js, code)
    assert outcome.status is Status.OK, outcome.error
    assert outcome.result == ["written", "ENOENT", "AAA", []]
    assert outcome.stdout == "after\n"


async def test_js_replaced_codecs_and_console_do_not_change_writes(
    wasm_js: WasmJsExecutor,
) -> None:
    code = """
const log = console.log;
Uint8Array.prototype.toBase64 = function () { return 'QUFB'; };
Uint8Array.fromBase64 = () => new Uint8Array([1]);
console.log = () => { throw new Error('replaced'); };
globalThis.JSON = { stringify: () => '{}', parse: () => ({}) };
String.prototype.slice = () => '';
fs.writeFileSync('f.bin', new Uint8Array([0, 1, 2, 250]));
log('after');
Array.from(fs.readFileSync('f.bin'))
"""
    outcome = await run_js(wasm_js, code)
    assert outcome.status is Status.OK, outcome.error
    assert outcome.result == [0, 1, 2, 250]
    assert outcome.stdout == "after\n"


async def test_js_writes_from_timers_and_promises_keep_output_apart(
    wasm_js: WasmJsExecutor,
) -> None:
    code = """
console.log('a');
await Promise.resolve().then(() => { fs.writeFileSync('p.txt', 'P'); console.log('b'); });
await new Promise((done) => setTimeout(() => {
  console.log('c'); fs.writeFileSync('t.txt', 'T'); console.log('d'); done();
}, 1));
for (let i = 0; i < 300; i++) { fs.appendFileSync('many.txt', 'x'); console.log(''); }
console.log('e');
[fs.readFileSync('p.txt', 'utf8'), fs.readFileSync('t.txt', 'utf8'),
 fs.readFileSync('many.txt', 'utf8').length]
"""
    outcome = await run_js(wasm_js, code)
    assert outcome.status is Status.OK, outcome.error
    assert outcome.result == ["P", "T", 300]
    assert outcome.stdout == "a\nb\nc\nd\n" + "\n" * 300 + "e\n"


async def test_js_huge_write_is_stopped_at_the_disk_limit(wasm_js: WasmJsExecutor) -> None:
    code = "fs.writeFileSync('big.bin', new Uint8Array(3 * 1024 * 1024)); 'written'"
    outcome = await run_js(wasm_js, code, disk_mb=2)
    assert outcome.status is Status.DISK_LIMIT, outcome


# -- base64 -----------------------------------------------------------------------------


def _outcome(decode: Any, text: Any) -> tuple[str, Any]:
    try:
        return "ok", decode(text)
    except Exception as exc:  # the class is the contract: binascii.Error vs ValueError
        return type(exc).__name__, None


def _stdlib(text: Any) -> bytes:
    return base64.b64decode(text, validate=True)


_B64_CHARS = st.sampled_from([*"AQgw+/=-_ \n\r\t", "\u00e9", "\x00", "\uff21"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(_B64_CHARS, max_size=24), st.binary(max_size=24)))
def test_b64_accepts_and_refuses_as_the_standard_library(text: Any) -> None:
    assert _outcome(b64.decode, text) == _outcome(_stdlib, text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_b64_round_trips_and_matches_the_standard_library(data: bytes) -> None:
    text = b64.encode(data)
    assert text == base64.b64encode(data).decode("ascii")
    assert b64.decode(text) == data
    assert b64.decode(text.encode()) == data


def test_non_ascii_base64_input_file_is_invalid_params() -> None:
    # A client's `execute` with such a file: `FileParam.to_file` catches binascii.Error
    # only, so the ValueError reaches the dispatcher as an internal error.
    files = [{"path": "a.bin", "base64": "\u00e9AAA"}]
    params = ExecuteParams.model_validate({"language": "python", "code": "1", "files": files})
    with pytest.raises(InvalidParams):
        checked_files(params.files or [])


def test_input_file_base64_with_urlsafe_or_whitespace_is_refused() -> None:
    for text in ("QU-_", "QUFB\n", " QUFB", "QUF", "QUFBQQ"):
        files = [{"path": "a.bin", "base64": text}]
        params = ExecuteParams.model_validate({"language": "python", "code": "1", "files": files})
        with pytest.raises(InvalidParams):
            checked_files(params.files or [])
    params = ExecuteParams.model_validate(
        {"language": "python", "code": "1", "files": [{"path": "a", "base64": "QUFB"}]}
    )
    assert checked_files(params.files or []) == (FileData("a", b"AAA"),)


# -- JSON ---------------------------------------------------------------------------------


def _stdlib_dumps(value: Any) -> str:
    """What 2000f34's `jsontext.dumps` wrote: the standard encoder, then cleaning."""
    saved = jsontext.orjson
    jsontext.orjson = None
    try:
        return jsontext.dumps(value)
    finally:
        jsontext.orjson = saved


_EDGE_FLOATS = st.sampled_from(
    [
        1e16,
        -0.0,
        0.0,
        5e-324,
        2.2250738585072014e-308,
        1e-7,
        1.7976931348623157e308,
        float("nan"),
        float("inf"),
        -float("inf"),
        0.1,
        1e22,
        123456789012345680.0,
    ]
)
_EDGE_INTS = st.sampled_from(
    [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, -(2**64), 10**400, 0, -1]
)
_TEXT = st.text(st.one_of(st.characters(), st.sampled_from(["\ud800", "\udfff", "\x00", "\u2028"])))
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), _EDGE_FLOATS, _EDGE_INTS, _TEXT
)
_KEYS = st.one_of(_TEXT, st.integers(-3, 3), st.none(), st.booleans(), st.floats(0, 2))
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(_KEYS, inner, max_size=4),
    ),
    max_leaves=12,
)


def _checked_text(text: str) -> Any:
    text.encode("utf-8")  # no lone surrogate
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"wrote {name}"))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_VALUES)
def test_json_fast_reads_back_as_the_standard_encoders(value: Any) -> None:
    fast, slow = jsontext.dumps(value), _stdlib_dumps(value)
    assert _same(_checked_text(fast), _checked_text(slow)), (fast, slow)
    assert jsontext.encode(value) == fast.encode("utf-8")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


class _Str(str):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    def items(self):  # type: ignore[no-untyped-def]
        return [("forged", 1)]


class _Odd:
    def __str__(self) -> str:
        return "odd\ud800"


@pytest.mark.parametrize(
    "value",
    [
        {_Str("k\ud800"): _Str("v\udfff"), "k\udc00": 1},
        {"a\ud800": 1, "a\udbff": 2},  # noqa: F601 (two keys; one after cleaning)
        [float("nan"), [float("inf"), {"x": -float("inf")}]],
        {"n": 2**64, "m": -(2**63) - 1, "ok": 2**63 - 1},
        {1: "int key", None: "none", False: "bool", 1.5: "float"},
    ],
)
def test_json_edge_values_are_written_as_before(value: Any) -> None:
    fast, slow = jsontext.dumps(value), _stdlib_dumps(value)
    assert _same(_checked_text(fast), _checked_text(slow)), (fast, slow)


def test_json_dict_subclass_is_written_as_before() -> None:
    value = _Dict(real=1)
    assert jsontext.dumps(value) == _stdlib_dumps(value)


class _List(list):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(["forged"])


class _Pair(NamedTuple):
    a: int
    b: str


@pytest.mark.parametrize("value", [_List([1, 2]), _Pair(1, "x"), {"k": [_Dict(real=1)]}])
def test_json_builtin_subclasses_are_written_as_before(value: Any) -> None:
    assert jsontext.dumps(value) == _stdlib_dumps(value)
    assert jsontext.encode(value) == _stdlib_dumps(value).encode("utf-8")


def test_json_never_writes_a_surrogate_from_a_default() -> None:
    # Cleaning the value does not reach what `str()` makes of an object in it.
    assert jsontext.encode({"x": _Odd()}) == '{"x":"odd\ufffd"}'.encode()
    assert jsontext.dumps([_Odd()], indent=2) == '[\n  "odd\ufffd"\n]'
    assert _stdlib_dumps({"x": _Odd()}) == '{"x":"odd\ufffd"}'


# -- the daemon's reads -------------------------------------------------------------------


class _Chunks(trio.abc.ReceiveStream):
    """Hands out the given chunks one `receive_some` at a time, as a slow client would."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks
        self.asked: list[int] = []

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        self.asked.append(max_bytes or 0)
        await trio.lowlevel.checkpoint()
        if not self._chunks:
            return b""
        chunk = self._chunks.pop(0)
        assert max_bytes is None or len(chunk) <= max_bytes
        return chunk

    async def aclose(self) -> None:
        pass


class _CountingBuffer(bytearray):
    scanned = 0

    def find(self, sub: Any, start: Any = None, *args: Any) -> int:
        found = super().find(sub, start or 0, *args)
        _CountingBuffer.scanned += (len(self) if found < 0 else found) - (start or 0)
        return found


async def _lines(chunks: list[bytes], max_bytes: int) -> list[Any]:
    from conduit.core.framing import LineReader

    reader = LineReader(_Chunks(chunks), max_bytes)
    return [line async for line in reader]


@pytest.mark.parametrize("size", [1000, 999, 1001])
async def test_reader_takes_a_line_up_to_the_max_and_no_more(size: int) -> None:
    from conduit.core.framing import Oversize

    line = b"x" * size
    got = await _lines([line[:300], line[300:] + b"\n" + b"next\n"], 1000)
    told = [Oversize(size, line[:4096], line[-256:])]
    assert got == ([line, b"next"] if size <= 1000 else [*told, b"next"])


async def test_reader_a_line_without_newline_at_eof_is_taken_within_the_max() -> None:
    from conduit.core.framing import Oversize

    assert await _lines([b"a" * 500], 1000) == [b"a" * 500]
    assert await _lines([b"a" * 1500], 1000) == [Oversize(1500, b"a" * 1500, b"a" * 256)]


async def test_reader_holds_at_most_the_max_and_one_long_read() -> None:
    from conduit.core.framing import LineReader

    stream = _Chunks([b"x" * 65_536] * 40)
    reader = LineReader(stream, 2 * MIB)
    held = 0
    async for _ in reader:
        held = max(held, len(reader._buffer))
    assert held <= 2 * MIB + 65_536
    assert max(stream.asked) <= 1 << 20


async def test_reader_scans_a_slow_long_line_once() -> None:
    from conduit.core.framing import LineReader

    size, piece = 4 * MIB, 4096
    stream = _Chunks([b"x" * piece] * (size // piece) + [b"\n"])
    reader = LineReader(stream, 8 * MIB)
    reader._buffer = _CountingBuffer()
    _CountingBuffer.scanned = 0
    got = [len(line) async for line in reader]
    assert got == [size]
    assert _CountingBuffer.scanned <= 4 * size, _CountingBuffer.scanned


@pytest.mark.parametrize("forged", ["\u00e9AAA", "QU-_", "QUF"])
async def test_pyodide_file_read_forged_by_its_worker_resets_the_session(forged: str) -> None:
    # The worker's interpreter runs the program, which may answer a file read itself.
    from conduit.core.errors import SandboxCrashed
    from conduit.executors.base import SessionSpec
    from conduit.executors.pyodide_sessions import PyodideSession

    session = PyodideSession(SessionSpec("ses_forged", "python", 64), None, lambda _: None)  # type: ignore[arg-type]
    killed: list[bool] = []
    session._host = SimpleNamespace(kill=lambda: killed.append(True))  # type: ignore[assignment]

    async def forged_answer(_operation: dict[str, Any]) -> dict[str, Any]:
        return {"base64": forged}

    session._file_op = forged_answer  # type: ignore[method-assign]
    with pytest.raises(SandboxCrashed):
        await session.get_file("a.bin")
    assert killed == [True] and session._host is None
