"""Operator-chosen packages end to end on wasm-python: a daemon configured with a
package from PyPI runs programs that import it, with no network in the sandbox, and
says which packages it installed (executors/list, the tool's description, doctor); a
package with compiled code leaves the executor unavailable, saying why.

The component with the packages is a second build (~30 s), kept in the session's
component cache like the plain one, so later runs only load it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from conduit.core.errors import ExecutorUnavailable
from tests.e2e.helpers import base_env
from tests.e2e.test_cli import conduit

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
# What the guest's entry module for packages adds to the component (~150 KB).
MAX_GROWTH_BYTES = 384 * 1024
INITIALIZE = {"protocolVersion": "2025-11-25", "capabilities": {}}


@pytest.fixture(scope="session")
def packaged_cache(
    wasm_cache: Path, kept_dir: Callable[[str], AbstractContextManager[Path]]
) -> Path:
    """The session's component cache, with the wasm-python component for DATEUTIL built
    and compiled in it (once per clone: kept between runs)."""
    from conduit.executors import _wasmtime
    from conduit.executors.wasm_build import ensure_component
    from conduit.executors.wasm_guests import python_guest

    with kept_dir("wasm-components") as cache:
        built = ensure_component(python_guest((DATEUTIL,)), cache)
        _wasmtime.load_component(_wasmtime.new_engine(), built.path, built.component_hash)
    return wasm_cache


def test_instances_start_with_no_more_memory_for_the_packages(packaged_cache: Path) -> None:
    """The packages are compiled in a throwaway build: compiled within the component's
    own, what the compiler freed would stay in the memory image every instance starts
    from (~45 MB for sympy; ~0.5 MB for these). The guest with packages differs from
    the plain one by its entry module alone."""
    from conduit.executors.wasm_guests import PYTHON_GUEST, python_guest

    def size(name: str) -> int:
        (component,) = packaged_cache.glob(f"{name}-" + "[0-9a-f]" * 16 + "/guest.wasm")
        return component.stat().st_size

    grown = size(python_guest((DATEUTIL,)).name) - size(PYTHON_GUEST.name)
    assert grown < MAX_GROWTH_BYTES, grown


def _with_packages(*packages: str) -> dict[str, Any]:
    return {**ONLY_WASM_PYTHON, "wasm_python": {"packages": list(packages)}}


async def test_programs_import_the_packages_and_the_daemon_lists_them(
    packaged_cache: Path, start_daemon: Any, connect: Any
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
    packaged_cache: Path, make_config: Any, tmp_path: Path
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
