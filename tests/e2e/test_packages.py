"""Operator-chosen packages end to end on wasm-python: a daemon configured with a
package from PyPI runs programs that import it, with no network in the sandbox, and
says which packages it installed (executors/list, the tool's description, doctor); a
package with compiled code leaves the executor unavailable, saying why.

The packages are no component of their own: the one wasm-python component compiles
them, in seconds, into a directory beside it in the session's component cache.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.core.errors import ExecutorUnavailable
from tests.e2e.helpers import base_env
from tests.e2e.test_cli import conduit
from tests.sandboxes import NoBridge

# A pure-Python package with a pure-Python dependency (six).
DATEUTIL = "python-dateutil==2.9.0.post0"
ONLY_WASM_PYTHON = {"deno": {"enabled": False}, "wasm_js": {"enabled": False}}
PROGRAM = """
import datetime, importlib.metadata
import dateutil, six
from dateutil.relativedelta import relativedelta
day = datetime.date(2024, 1, 31) + relativedelta(months=1)
try:
    open(dateutil.__file__, "a").close()
    written = "written"
except OSError as exc:
    written = type(exc).__name__
[day.isoformat(), dateutil.__file__, importlib.metadata.version("six"), written]
"""
INITIALIZE = {"protocolVersion": "2025-11-25", "capabilities": {}}
# What a package list may take to build once its wheels are pinned (~1 s for these).
MAX_PACKAGES_BUILD_S = 30


async def test_a_list_shares_the_component_and_its_instances_memory(
    wasm_cache: Path, nursery: trio.Nursery
) -> None:
    """The packages are files compiled on disk, not a component of their own: an
    instance with them starts from the same memory image as one without, and building
    them runs no componentize-py."""
    from conduit.executors.base import Job, Limits
    from conduit.executors.wasm_guests import GUEST_PYTHON_VERSION
    from conduit.executors.wasm_packages import packages_dir_name
    from conduit.executors.wasm_python import WasmPythonExecutor

    plain = WasmPythonExecutor(cache_dir=wasm_cache)
    listed = WasmPythonExecutor(cache_dir=wasm_cache, packages=(DATEUTIL,))
    for executor in (plain, listed):
        await nursery.start(executor.serve)
        with trio.fail_after(120):
            assert await executor.wait_ready(), executor.info().reason
    without, with_packages = plain.info(), listed.info()
    job = Job("ex_path", "python", "import sys\n'/packages' in sys.path", Limits())
    assert (await plain.run(job, NoBridge())).result is False  # no directory: not put there
    assert with_packages.pool["component_hash"] == without.pool["component_hash"]
    assert with_packages.pool["base_memory_mib"] == without.pool["base_memory_mib"]
    steps = {step["step"]: step for step in with_packages.progress["done"]}
    assert "componentize-py" not in steps
    if "building the packages" in steps:
        assert steps["building the packages"]["elapsed_s"] < MAX_PACKAGES_BUILD_S
    prefix = packages_dir_name((DATEUTIL,), GUEST_PYTHON_VERSION)
    (packages,) = wasm_cache.glob(f"{prefix}-" + "[0-9a-f]" * 16 + "/packages")
    for source in packages.rglob("*.py"):  # every module compiled, the largest too
        assert (source.parent / "__pycache__" / f"{source.stem}.cpython-314.pyc").is_file()


def _with_packages(*packages: str) -> dict[str, Any]:
    return {**ONLY_WASM_PYTHON, "wasm_python": {"packages": list(packages)}}


async def test_programs_import_the_packages_and_the_daemon_lists_them(
    wasm_cache: Path, start_daemon: Any, connect: Any
) -> None:
    _, info = await start_daemon(executors=_with_packages(DATEUTIL))
    client = await connect(info)
    result = await client.call("execute", {"language": "python", "code": PROGRAM})
    assert result["status"] == "ok", result
    day, where, six_version, written = result["result"]
    assert day == "2024-02-29"
    assert where == "/packages/dateutil/__init__.py"
    assert written == "PermissionError"  # mounted read-only for every program
    listed = await client.call("executors/list")
    (wasm_python,) = [e for e in listed["executors"] if e["name"] == "wasm-python"]
    assert wasm_python["packages"] == {"python-dateutil": "2.9.0.post0", "six": six_version}
    assert wasm_python["pool"]["build_inputs"]["packages"] == DATEUTIL
    await client.call("initialize", INITIALIZE)
    tools = await client.call("tools/list")
    (description,) = [t["description"] for t in tools["tools"] if t["name"] == "execute_python"]
    installed = f"these packages are installed: python-dateutil 2.9.0.post0, six {six_version}."
    assert installed in description.split("\n\n")[0]


async def test_doctor_lists_the_packages_with_their_versions(
    wasm_cache: Path, make_config: Any, tmp_path: Path
) -> None:
    config = make_config(executors=_with_packages(DATEUTIL))
    done = await conduit("doctor", "--config", config.source, env=base_env(tmp_path / "state"))
    report = done.stdout.decode()
    assert "executor wasm-python" in report and "ok (CPython 3.14" in report, report
    (line,) = [line for line in report.splitlines() if line.strip().startswith("packages ")]
    assert line.split(None, 1)[1].startswith("python-dateutil 2.9.0.post0, six "), line


async def test_a_package_with_compiled_code_makes_the_executor_unavailable(
    start_daemon: Any, connect: Any, make_config: Any, tmp_path: Path
) -> None:
    why = "package msgpack==1.1.0 cannot be installed: it has no pure-Python wheel"
    _, info = await start_daemon(executors=_with_packages("tabulate==0.9.0", "msgpack==1.1.0"))
    client = await connect(info)
    listed = await client.call("executors/list")
    (wasm_python,) = [e for e in listed["executors"] if e["name"] == "wasm-python"]
    assert wasm_python["available"] is False
    assert why in wasm_python["reason"]
    reply = await client.request("execute", {"language": "python", "code": "1"})
    assert reply["error"]["code"] == ExecutorUnavailable.code
    assert why in json.dumps(reply["error"])
    config = make_config(executors=_with_packages("msgpack==1.1.0"))
    done = await conduit("doctor", "--config", config.source, env=base_env(tmp_path / "state"))
    assert why in done.stdout.decode()


async def test_a_reload_says_a_changed_list_needs_a_restart(
    start_daemon: Any, make_config: Any, caplog: pytest.LogCaptureFixture
) -> None:
    off = {**ONLY_WASM_PYTHON, "wasm_python": {"enabled": False}}
    daemon, _ = await start_daemon(executors=off)
    make_config(executors={**off, "pyodide": {"packages": ["tabulate==0.9.0"]}})
    with caplog.at_level(logging.WARNING, logger="conduit.daemon.server"):
        new = await daemon.reload()
    assert new.executors.pyodide.packages == ("tabulate==0.9.0",)
    assert "executor package changes take effect on restart" in caplog.text
