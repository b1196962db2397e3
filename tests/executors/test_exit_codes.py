"""How a program that ends itself ends: `sys.exit` on every Python executor as in
CPython, and the JavaScript exits on the executors that have them (or a plain error on
those that do not)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors.base import Executor, Job, Limits, Outcome, Status
from conduit.executors.deno import DenoExecutor
from conduit.shims import python_program
from tests.sandboxes import LOAD_WAIT_S, NoBridge, start_pyodide

# (program, status, exit code, stderr): output written before the exit is kept.
PYTHON_EXITS = [
    ("import sys\nprint('done')\nsys.exit(0)\n1", Status.OK, 0, ""),
    ("import sys\nsys.exit()", Status.OK, 0, ""),
    ("raise SystemExit(False)", Status.OK, 0, ""),
    ("import sys\nprint('failing')\nsys.exit(3)", Status.ERROR, 3, ""),
    ("import sys\nsys.exit(True)", Status.ERROR, 1, ""),
    ("import sys\nsys.exit(-2)", Status.ERROR, -2, ""),
    ("import sys\nsys.exit('cannot go on')", Status.ERROR, 1, "cannot go on\n"),
    ("raise SystemExit(2, 'two')", Status.ERROR, 1, "(2, 'two')\n"),
    # Beyond what a process can exit with.
    ("raise SystemExit(2**40)", Status.ERROR, -1, ""),
]


async def run(executor: Executor, language: str, code: str) -> Outcome:
    with trio.fail_after(LOAD_WAIT_S):
        return await executor.run(Job("ex_exit", language, code, Limits()), NoBridge())


async def check_python_exits(executor: Executor) -> None:
    outcomes = []
    for code, status, exit_code, stderr in PYTHON_EXITS:
        outcome = await run(executor, "python", code)
        outcomes.append(outcome)
        assert (outcome.status, outcome.exit_code, outcome.stderr) == (status, exit_code, stderr), (
            code,
            outcome,
        )
        assert outcome.result is None, code
        if status is Status.OK:
            assert outcome.error is None, code
        else:
            assert outcome.error is not None, code
            assert outcome.error.type == "SystemExit"
            assert outcome.error.message == f"the program exited with code {exit_code}"
            assert 'File "<program>"' in outcome.error.traceback
    assert outcomes[0].stdout == "done\n"  # the first printed before it exited


@pytest.mark.parametrize(("code", "status", "exit_code", "stderr"), PYTHON_EXITS)
def test_the_contract_answers_an_exit_with_its_code(
    code: str, status: Status, exit_code: int, stderr: str, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = json.loads(python_program.execute({"code": code}, lambda *_: "{}"))
    if status is Status.OK:
        assert answer == {"result": None}
    else:
        assert answer["exit_code"] == exit_code
        assert answer["error"]["type"] == "SystemExit"
    assert capsys.readouterr().err == stderr


def test_an_exit_whose_message_cannot_be_printed_still_ends_with_code_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = "class Mute:\n    def __str__(self):\n        raise ValueError\nraise SystemExit(Mute())"
    answer = json.loads(python_program.execute({"code": code}, lambda *_: "{}"))
    assert answer["exit_code"] == 1
    assert capsys.readouterr().err == ""


async def test_wasm_python_exits_as_cpython_does(wasm: Executor) -> None:
    await check_python_exits(wasm)


@pytest.mark.slow
async def test_pyodide_exits_as_cpython_does(
    nursery: trio.Nursery, tmp_path: Path, pyodide_install: Path
) -> None:
    await check_python_exits(await start_pyodide(nursery, tmp_path / "pyodide", pyodide_install))


async def test_deno_exits_with_the_program_s_code(nursery: trio.Nursery, tmp_path: Path) -> None:
    deno = DenoExecutor(cache_dir=tmp_path / "deno", pool_size=1)
    with trio.fail_after(LOAD_WAIT_S):
        await nursery.start(deno.serve)
    expected: dict[str, Any] = {
        "Deno.exit(0)": (Status.OK, 0, None),
        "process.exit(0)": (Status.OK, 0, None),
        "process.exit(2)": (Status.ERROR, 2, "Exit"),
    }
    for code, (status, exit_code, error_type) in expected.items():
        outcome = await run(deno, "javascript", code)
        assert (outcome.status, outcome.exit_code) == (status, exit_code), (code, outcome)
        assert (outcome.error and outcome.error.type) == error_type, (code, outcome)


async def test_wasm_js_has_no_exit_and_says_so(wasm_js: Executor) -> None:
    for code, missing in (("Deno.exit(0)", "Deno"), ("process.exit(0)", "process")):
        outcome = await run(wasm_js, "javascript", code)
        assert (outcome.status, outcome.exit_code) == (Status.ERROR, 1), outcome
        assert outcome.error is not None
        assert (outcome.error.type, outcome.error.message) == (
            "ReferenceError",
            f"{missing} is not defined",
        )
