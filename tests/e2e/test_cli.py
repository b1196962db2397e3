"""The `conduit` command as a person uses it, against a real daemon process."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.daemon.auth import hash_token
from tests.conftest import link_wasm_cache
from tests.daemon.test_terminal import raw_controls
from tests.e2e.helpers import (
    CONDUIT,
    NO_EXECUTORS,
    base_env,
    call,
    conduit_serve,
    wait_available,
)


async def conduit(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(timeout_s):
        return await trio.run_process(
            [CONDUIT, *args],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )


# The executors a daemon on its defaults starts (pyodide is off by default).
DEFAULT_EXECUTORS = {"deno", "wasm-python", "wasm-js"}
# An instruction budget for the doctor's wasm-python: its size is no part of the code
# compiled for it.
DOCTOR_FUEL = 50_000_000
# Compiling the wasm-python component takes ~10 s of CPU, spread over the cores, and
# several times that in wall time while the other test process keeps them busy.
COMPILE_WAIT_S = 240


@dataclass
class Served:
    socket_path: str


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory, wasm_cache: Path) -> Iterator[Served]:
    """One `conduit serve` on its defaults, shared by the tests that only talk to it.

    A start is Python's imports, two components loaded and Deno workers, none of which
    a test here needs to itself. No test changes the daemon: each runs its own
    executions and reads back only those.
    """
    state = tmp_path_factory.mktemp("cli-daemon") / "state"
    link_wasm_cache(state, wasm_cache)
    where = Path(tempfile.mkdtemp(prefix="cd-", dir="/tmp"))  # a short socket path
    sock = str(where / "c.sock")
    with (state.parent / "daemon.log").open("wb") as log:
        process = subprocess.Popen(
            [CONDUIT, "serve", "--socket", sock],
            env=base_env(state),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        trio.run(_wait_loaded, sock, process)
        yield Served(sock)
    finally:
        process.kill()
        process.wait(timeout=10)
        shutil.rmtree(where, ignore_errors=True)


async def _wait_loaded(sock: str, process: subprocess.Popen[bytes]) -> None:
    """Return once the daemon accepts and every default executor can run (the Wasmtime
    ones load their components after the daemon accepts)."""
    with trio.fail_after(120):
        while process.poll() is None:
            with contextlib.suppress(OSError):
                executors = (await call(sock, "executors/list"))["result"]["executors"]
                if {e["name"] for e in executors if e["available"]} >= DEFAULT_EXECUTORS:
                    return
            await trio.sleep(0.05)  # nothing announces readiness to a client
    raise RuntimeError(f"conduit serve exited with {process.returncode}")


async def test_version() -> None:
    done = await conduit("--version")
    assert done.returncode == 0
    assert done.stdout.decode().startswith("conduit ")


async def test_exec_prints_output_and_result_and_exits_with_the_status(running: Served) -> None:
    sock = running.socket_path
    ok = await conduit(
        "exec", "--socket", sock, "--lang", "ts", "-", stdin=b"console.log('hi'); 40 + 2"
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.decode() == "hi\n42\n"

    failed = await conduit("exec", "--socket", sock, "-", stdin=b"throw new RangeError('nope')")
    assert failed.returncode == 1
    assert "[error]" in failed.stderr.decode()
    assert "nope" in failed.stderr.decode()

    slow = await conduit("exec", "--socket", sock, "--timeout-ms", "100", "-", stdin=b"for(;;){}")
    assert slow.returncode == 124
    assert "[timeout]" in slow.stderr.decode()


async def test_exec_in_a_named_session_keeps_what_the_last_run_defined(running: Served) -> None:
    sock = running.socket_path
    first = await conduit(
        "exec", "--socket", sock, "--lang", "py", "--session", "cli-nb", "-", stdin=b"x = 41"
    )
    assert first.returncode == 0, first.stderr
    second = await conduit(
        "exec", "--socket", sock, "--lang", "py", "--session", "cli-nb", "-", stdin=b"x + 1"
    )
    assert (second.returncode, second.stdout.decode()) == (0, "42\n"), second.stderr
    fresh = await conduit("exec", "--socket", sock, "--lang", "py", "-", stdin=b"'x' in globals()")
    assert fresh.stdout.decode() == "false\n"
    listed = await conduit("call", "--socket", sock, "sessions/list")
    [session] = json.loads(listed.stdout)["sessions"]
    assert (session["name"], session["steps"]) == ("cli-nb", 2)
    closed = await conduit(
        "call",
        "--socket",
        sock,
        "sessions/close",
        json.dumps({"session_id": session["session_id"]}),
    )
    assert closed.returncode == 0, closed.stderr


async def test_exec_shows_the_output_while_the_program_runs(running: Served) -> None:
    # "second" comes 1 s after "first": seeing "first" without it, while the command is
    # still running, shows the output is written as it comes, not with the result.
    code = (
        b"console.log('first'); console.error('note');\n"
        b"await new Promise((r) => setTimeout(r, 1000));\n"
        b"console.log('second'); Deno.exit(3);"
    )
    command = [CONDUIT, "exec", "--socket", running.socket_path, "--lang", "ts", "-"]
    process = await trio.lowlevel.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdin and process.stdout and process.stderr
    try:
        await process.stdin.send_all(code)
        await process.stdin.aclose()
        seen = b""
        with trio.fail_after(60):
            while b"first\n" not in seen:
                chunk = await process.stdout.receive_some()
                assert chunk, f"stdout ended without 'first': {seen!r}"
                seen += chunk
            assert b"second" not in seen
            assert process.poll() is None
            while chunk := await process.stdout.receive_some():
                seen += chunk
            errors = b""
            while chunk := await process.stderr.receive_some():
                errors += chunk
            status = await process.wait()
    finally:
        process.kill()
    assert seen == b"first\nsecond\n"
    assert status == 3, errors
    # stderr is a pipe here: the program's own, and no progress line.
    assert errors.startswith(b"note\n")
    assert b"running" not in errors and b"\r" not in errors


async def test_exec_on_a_terminal_shows_progress_on_a_long_run(running: Served) -> None:
    primary, secondary = os.openpty()  # stderr is a terminal, stdout a pipe
    try:
        command = [CONDUIT, "exec", "--socket", running.socket_path, "--lang", "ts", "-"]
        # Twice the second after which the line is shown: it is drawn at least once.
        code = b"await new Promise((r) => setTimeout(r, 2000)); 'done'"
        with trio.fail_after(60):
            done = await trio.run_process(
                command, stdin=code, capture_stdout=True, stderr=secondary, check=False
            )
        os.close(secondary)
        secondary = -1
        shown = _read_all(primary).decode()
    finally:
        os.close(primary)
        if secondary >= 0:
            os.close(secondary)
    assert done.returncode == 0
    assert done.stdout == b'"done"\n'  # the result, never mixed with the progress line
    assert re.search(r"\r\x1b\[K. running [1-9]\.\d s", shown), repr(shown)
    assert shown.endswith("\r\x1b[K")  # erased at the end


def _read_all(fd: int) -> bytes:
    """What a pty's other side wrote, once that side is closed (EIO ends it)."""
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return data
        if not chunk:
            return data
        data += chunk


async def test_exec_of_a_file_with_json_and_inputs(running: Served, tmp_path: Path) -> None:
    program = tmp_path / "double.js"
    program.write_text("inputs.n * 2")
    await wait_available(running.socket_path, "wasm-js")
    done = await conduit(
        "exec", "--socket", running.socket_path, "--json", "--inputs", '{"n": 21}', str(program)
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "ok"
    assert result["result"] == 42
    assert result["executor"] == "wasm-js"  # the .js extension, on JavaScript's default


async def test_call_prints_results_and_errors(running: Served) -> None:
    sock = running.socket_path
    done = await conduit("call", "--socket", sock, "ping")
    assert done.returncode == 0
    assert json.loads(done.stdout) == {}
    wrong = await conduit("call", "--socket", sock, "pnig")
    assert wrong.returncode == 1
    assert "error -32601" in wrong.stderr.decode()
    assert "did you mean 'ping'" in wrong.stderr.decode()
    bad_json = await conduit("call", "--socket", sock, "execute", "{nope")
    assert bad_json.returncode == 2


async def test_another_daemons_token_file_is_left_to_peer_credentials(
    running: Served, tmp_path: Path
) -> None:
    # The state dir the command reads holds some other daemon's master token (one on the
    # defaults, beside this one): on the Unix socket, peer credentials let the command
    # in, and that token is never presented to be refused.
    state = tmp_path / "other-state"
    state.mkdir()
    (state / "master.token").write_text("cdt_another-daemons-token-000000000000\n")
    env = base_env(state)
    sock = running.socket_path
    ok = await conduit("exec", "--socket", sock, "-", stdin=b"40 + 2", env=env)
    assert (ok.returncode, ok.stdout) == (0, b"42\n"), ok.stderr
    who = await conduit("call", "--socket", sock, "auth/whoami", env=env)
    assert json.loads(who.stdout)["principal"]["name"] == f"uid:{os.getuid()}"
    # A token the user chose is always presented: it may name a narrower client.
    chosen = await conduit(
        "call", "--socket", sock, "ping", env={**env, "CONDUIT_TOKEN": "cdt_not-the-token"}
    )
    assert chosen.returncode == 1
    assert "the token is not valid" in chosen.stderr.decode()


async def test_config_is_taken_before_or_after_the_command(running: Served, tmp_path: Path) -> None:
    # The systemd unit writes `conduit serve --config FILE`: that must reach the
    # configuration, not stop at a usage error.
    unit = (Path(__file__).parents[2] / "deploy" / "conduit.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    missing = str(tmp_path / "missing.toml")
    argv = exec_start.removeprefix("ExecStart=").split()[1:]
    argv = [missing if arg == "/etc/conduit/conduit.toml" else arg for arg in argv]
    assert argv == ["serve", "--config", missing]
    env = base_env(tmp_path / "state")  # no CONDUIT_SOCKET to outrank the file
    for args in (argv, ["doctor", "--config", missing], ["--config", missing, "doctor"]):
        done = await conduit(*args, env=env)
        assert done.returncode == 2, (args, done.stderr)
        assert f"config file {missing} does not exist" in done.stderr.decode(), args
    # After the command it wins over the one before it; left out, the one before counts.
    config = tmp_path / "client.toml"
    config.write_text(f'[server]\nsocket = "{running.socket_path}"\n')
    for args in (
        ["call", "--config", str(config), "ping"],
        ["--config", missing, "call", "--config", str(config), "ping"],
        ["--config", str(config), "call", "ping"],
    ):
        done = await conduit(*args, env=env)
        assert (done.returncode, done.stdout.strip()) == (0, b"{}"), (args, done.stderr)


async def test_no_daemon_is_a_clear_error(short_dir: Path) -> None:
    done = await conduit("call", "--socket", str(short_dir / "none.sock"), "ping")
    assert done.returncode == 3
    assert "is `conduit serve` running?" in done.stderr.decode()


async def test_token_new_prints_a_token_and_its_config_entry(
    tmp_path: Path, short_dir: Path
) -> None:
    done = await conduit("token", "new", "--name", "bot", "--scopes", "execute,tools")
    assert done.returncode == 0
    token = done.stdout.decode().strip()
    entry = done.stderr.decode()
    assert f'sha256 = "{hash_token(token)}"' in entry
    assert token not in entry
    # The printed entry, pasted into a config, admits that token with those scopes.
    config = tmp_path / "conduit.toml"
    config.write_text(NO_EXECUTORS + "[auth]\npeer_credentials = false\n" + entry.split("\n", 2)[2])
    sock = str(short_dir / "c.sock")
    async with conduit_serve(tmp_path, sock, "--config", str(config)):
        env = {**base_env(tmp_path / "state"), "CONDUIT_TOKEN": token}
        whoami = await conduit("call", "--socket", sock, "auth/whoami", env=env)
    assert json.loads(whoami.stdout)["principal"] == {
        "name": "bot",
        "kind": "client",
        "scopes": ["execute", "tools"],
    }


async def test_doctor_reports_each_executor(tmp_path: Path, wasm: Any) -> None:
    env = base_env(tmp_path / "state")  # holds the session's component (conftest)
    done = await conduit("doctor", env=env)
    report = done.stdout.decode()
    assert "executor deno" in report
    deno_line = next(line for line in report.splitlines() if line.startswith("executor deno"))
    assert "ok (2." in deno_line
    python_line = next(
        line for line in report.splitlines() if line.startswith("executor wasm-python")
    )
    assert "ok (CPython 3.14" in python_line
    assert "daemon: not running" in report
    # Under the executor line: the component it loaded and what it was built from.
    details = _details(report, "wasm-python")
    pool = wasm.info().pool
    assert details["component hash"] == [pool["component_hash"][:16]]
    (component,) = details["component"]
    assert component.startswith(str(tmp_path / "state" / "wasm"))
    assert component.endswith(Path(pool["component"]).name)
    inputs = dict(line.split(" ", 1) for line in details["build input"])
    assert inputs["componentize-py"] == pool["build_inputs"]["componentize-py"] == "0.25.1"
    assert inputs["guest.py"] == pool["build_inputs"]["guest.py"][:16]
    assert inputs.keys() == pool["build_inputs"].keys()
    assert details["compiled cache"] == ["valid: loaded without compiling"]
    assert "deserialize" in details["timings"][0]
    # Deno's workers are inside the operating-system sandbox, and it says so.
    assert _details(report, "deno") == {"os sandbox": ["bubblewrap"]}
    # What it waited for, step by step, as the log says it.
    assert re.search(r"^wasm-python: load done in \d+\.\d s$", report, re.MULTILINE), report


async def test_doctor_reports_a_corrupt_compiled_cache_as_rebuilt(
    tmp_path: Path, wasm_cache: Path, fuel_components: Callable[[], AbstractContextManager[Path]]
) -> None:
    # With fuel counted, so that what the doctor compiles is what the fuel tests load:
    # kept for them if they have compiled none yet (see `fuel_components`).
    config = tmp_path / "fuel.toml"
    config.write_text(f"[executors.wasm_python]\nfuel = {DOCTOR_FUEL}\n")
    state = tmp_path / "own-state"  # a copy: the session's caches stay intact
    with fuel_components() as shared:
        await _doctor_rebuilds_corrupt_code(state, config, shared, wasm_cache)
        _share_compiled(state / "wasm", shared, "*-fuel.cwasm")


async def _doctor_rebuilds_corrupt_code(
    state: Path, config: Path, fuel_cache: Path, wasm_cache: Path
) -> None:
    for built in fuel_cache.glob("wasm-python-*"):
        shutil.copytree(built, state / "wasm" / built.name, ignore=shutil.ignore_patterns("*.lock"))
    for built in wasm_cache.glob("wasm-js-*"):  # loaded as it is
        (state / "wasm" / built.name).symlink_to(built, target_is_directory=True)
    for plain in (state / "wasm").glob("wasm-python-*/compiled-*.cwasm"):
        # None compiled for fuel yet: the plain engine's code, under the name fuel's
        # would have, corrupt as the rest.
        fueled = plain.with_name(f"{plain.stem}-fuel.cwasm")
        if not plain.stem.endswith("-fuel") and not fueled.exists():
            shutil.copyfile(plain, fueled)
            shutil.copyfile(plain.with_suffix(".sha256"), fueled.with_suffix(".sha256"))
    compiled = list((state / "wasm").glob("wasm-python-*/compiled-*.cwasm"))
    assert compiled, "the session's cache holds no compiled component"
    for path in compiled:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.chmod(0o644)  # as an operator who insists would
        path.write_bytes(bytes(data))
    env = base_env(state)
    first = await conduit("doctor", "--config", str(config), env=env, timeout_s=COMPILE_WAIT_S)
    assert first.returncode == 0, first.stdout.decode() + first.stderr.decode()
    details = _details(first.stdout.decode(), "wasm-python")
    assert details["compiled cache"][0].startswith("invalid, rebuilt:"), details
    assert "compile" in details["timings"][0]
    # The seconds it waited for the compiling are shown.
    shown = re.search(r"^wasm-python: load done in (\d+\.\d) s$", first.stdout.decode(), re.M)
    assert shown is not None and float(shown[1]) > 0, first.stdout.decode()
    again = await conduit("doctor", "--config", str(config), env=env)
    details = _details(again.stdout.decode(), "wasm-python")
    assert details["compiled cache"] == ["valid: loaded without compiling"]


def _share_compiled(wasm: Path, shared: Path, pattern: str) -> None:
    """Put the compiled files under `wasm` that match `pattern` beside `shared`'s
    components where these have none, whole or not at all, each under the lock its
    compilers take (see `_wasmtime.load_component`)."""
    for compiled in wasm.glob(f"wasm-*/{pattern}"):
        target = shared / compiled.parent.name / compiled.name
        if not target.parent.is_dir():
            continue
        with target.with_suffix(".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if target.exists():
                continue
            for suffix in (".sha256", ".cwasm"):  # the file last: then it is checked
                partial = target.with_name(f".{target.stem}{suffix}.tmp")
                shutil.copyfile(compiled.with_suffix(suffix), partial)
                partial.chmod(0o444)  # as compiled files are kept
                os.replace(partial, target.with_suffix(suffix))


async def test_executors_list_says_what_each_start_built(running: Served) -> None:
    done = await conduit("call", "--socket", running.socket_path, "executors/list")
    assert done.returncode == 0, done.stderr
    executors = {e["name"]: e for e in json.loads(done.stdout)["executors"]}
    progress = executors["wasm-python"]["progress"]
    assert (progress["step"], progress["elapsed_s"]) == (None, None)  # nothing under way
    assert [(s["step"], s["ok"]) for s in progress["done"]] == [("load", True)]
    assert executors["deno"]["progress"] is None  # it builds nothing


def _details(report: str, executor: str) -> dict[str, list[str]]:
    """The indented lines under `executor`'s line in a doctor report, by label."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"executor {executor} "))
    details: dict[str, list[str]] = {}
    for line in lines[start + 1 :]:
        if not line.startswith(" "):
            break
        label, value = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        details.setdefault(label, []).append(value)
    return details


# What a program or a client may write for a terminal to obey: clear the screen, set
# the window title, CSI as its one C1 character, a right-to-left override, and a
# carriage return that overwrites the line.
NASTY = "\x1b[2J\x1b]0;title\x07\x9b\u202e\r"
# How `terminal.escape` shows it: still readable, never obeyed.
SHOWN = "\\x1b[2J\\x1b]0;title\\x07\\x9b\\u202e\\r"


def _program(body: str) -> bytes:
    # The code itself carries NASTY raw, in a comment (the \r ends it: a second one
    # follows), and NASTY as a string literal (JSON's escapes are JavaScript's).
    return f"// code{NASTY}// more\nconst n = {json.dumps(NASTY)};\n{body}\n".encode()


_PRINTS = _program(
    'console.log("out" + n); console.error("err" + n);\n'
    'try { await tools.nope["x" + n]({}); } catch {}\n'
    'return "res" + n;'
)
_THROWS = _program('const e = new Error("msg" + n); e.name = "Type" + n; throw e;')


def _assert_safe(done: subprocess.CompletedProcess[bytes]) -> str:
    """Both streams of a finished command, checked free of anything a terminal obeys."""
    for stream in (done.stdout, done.stderr):
        assert raw_controls(stream.decode(), kept="\n\t") == [], stream
    return done.stdout.decode() + done.stderr.decode()


async def test_exec_shows_what_a_program_wrote_without_obeying_it(running: Served) -> None:
    at = ("--socket", running.socket_path)
    shown = await conduit("exec", *at, "--lang", "ts", "-", stdin=_PRINTS)
    assert shown.returncode == 0, shown.stderr
    text = _assert_safe(shown)
    for part in (f"out{SHOWN}\n", f"err{SHOWN}\n", "res\\u001b[2J"):
        assert part in text, text
    thrown = await conduit("exec", *at, "--lang", "ts", "-", stdin=_THROWS)
    assert thrown.returncode == 1
    assert f"[error] Type{SHOWN}: msg{SHOWN}" in _assert_safe(thrown)
    as_json = await conduit("exec", *at, "--json", "--lang", "ts", "-", stdin=_PRINTS)
    _assert_safe(as_json)
    assert json.loads(as_json.stdout)["result"] == f"res{NASTY}"  # still JSON, still it
    # A client's own text comes back in an error message: shown, not obeyed.
    unknown = await conduit("call", *at, f"ping{NASTY}")
    assert unknown.returncode == 1
    assert f"ping{SHOWN}" in _assert_safe(unknown)


async def test_executions_show_what_a_program_wrote_without_obeying_it(running: Served) -> None:
    at = ("--socket", running.socket_path)
    ids = []
    for program in (_PRINTS, _THROWS):
        params = {"language": "typescript", "code": program.decode()}
        ids.append((await call(running.socket_path, "execute", params))["result"]["execution_id"])
    listing = await conduit("executions", "list", *at)
    assert f"Type{SHOWN}" in _assert_safe(listing)
    printed, thrower = [await conduit("executions", "get", id_, *at) for id_ in ids]
    details = _assert_safe(printed)
    assert f"// code{SHOWN}// more" in details  # the snippet
    assert f"nope.x{SHOWN}" in details  # the tool the program asked for
    assert "out\\u001b[2J" in details  # the output's head, as JSON
    assert f"Type{SHOWN}: msg{SHOWN}" in _assert_safe(thrower)
    for command in (
        ("executions", "get", ids[1], *at, "--json"),
        ("call", *at, "executions/get", json.dumps({"execution_id": ids[1]})),
    ):
        got = await conduit(*command)
        _assert_safe(got)
        assert json.loads(got.stdout)["error_type"] == f"Type{NASTY}"


async def test_exec_raw_writes_the_programs_output_as_it_is(running: Served) -> None:
    program = f"console.log({json.dumps(NASTY)}); 1".encode()
    done = await conduit("exec", "--socket", running.socket_path, "--raw", "-", stdin=program)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == f"{NASTY}\n1\n"
