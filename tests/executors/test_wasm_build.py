"""The component cache, a build's progress, and what a build leaves behind.

Most recipes here are stand-ins whose "build" writes a file or runs Python: they test
the code around the build tools. The real wasm-js build, npm install and all, is
tested once, as a slow test, for what it leaves in the cache.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conduit.executors.npm import install_lock_dir
from conduit.executors.wasm_build import (
    ABANDONED_AFTER_S,
    BuildError,
    BuildProgress,
    GuestRecipe,
    ensure_component,
    run_tool,
)

BUILD_LOG = "conduit.executors.wasm_build"
# Generous: a stand-in tool is one Python start, but the machine may be busy.
TOOL_TIMEOUT_S = 120


def recipe(version: str, builds: list[Path], **fields: Any) -> GuestRecipe:
    def build(work: Path, _cache_dir: Path) -> None:
        builds.append(work)
        (work / "guest.wasm").write_bytes(f"component {version}".encode())

    return GuestRecipe("wasm-test", ("world.wit",), lambda: {"tool": version}, build, **fields)


def python_tool(what: str, work: Path, code: str) -> None:
    run_tool(what, [sys.executable, "-c", code], cwd=work, timeout_s=TOOL_TIMEOUT_S)


def test_a_build_is_reused_and_a_new_one_supersedes_the_old(tmp_path: Path) -> None:
    tmp_path = tmp_path / "cache"
    builds: list[Path] = []
    first = ensure_component(recipe("1", builds), tmp_path)
    again = ensure_component(recipe("1", builds), tmp_path)
    assert (first.built, again.built, len(builds)) == (True, False, 1)
    assert again.path == first.path and again.component_hash == first.component_hash
    unrelated = tmp_path / "wasm-test-npm-0123456789abcdef"  # another kind of entry
    unrelated.mkdir()
    upgraded = ensure_component(recipe("2", builds), tmp_path)
    assert upgraded.built and upgraded.path != first.path
    assert not first.path.parent.exists()  # the superseded build is gone
    assert unrelated.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [upgraded.path.parent.name, unrelated.name]
    )


def test_each_build_step_is_logged_and_recorded_with_its_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    progress = BuildProgress("wasm-test")
    between: list[Any] = []

    def build(work: Path, _cache_dir: Path) -> None:
        python_tool("fetch the tools", work, "pass")
        between.append(progress.snapshot())
        python_tool("componentize", work, "open('guest.wasm', 'wb').write(b'c')")

    steps = GuestRecipe("wasm-test", ("world.wit",), lambda: {"tool": "1"}, build)
    with caplog.at_level(logging.INFO, logger=BUILD_LOG):
        ensure_component(steps, tmp_path / "cache", progress)

    assert between[0]["step"] is None  # nothing under way between two steps
    assert [s["step"] for s in between[0]["done"]] == ["fetch the tools"]
    done = progress.snapshot()
    assert done is not None and done["step"] is None and done["elapsed_s"] is None
    assert [(s["step"], s["ok"]) for s in done["done"]] == [
        ("fetch the tools", True),
        ("componentize", True),
    ]
    assert all(s["elapsed_s"] >= 0 for s in done["done"])
    records = [r for r in caplog.records if r.name == BUILD_LOG]
    messages = [r.getMessage() for r in records]
    assert messages[0] == "wasm-test: fetch the tools started"
    assert re.fullmatch(r"wasm-test: fetch the tools done in \d+\.\d s", messages[1])
    assert messages[2] == "wasm-test: componentize started"
    assert re.fullmatch(r"wasm-test: componentize done in \d+\.\d s", messages[3])
    assert all(r.levelno == logging.INFO for r in records)
    ended = records[3].__dict__
    assert (ended["executor"], ended["step"], ended["ok"]) == ("wasm-test", "componentize", True)
    assert ended["elapsed_s"] == done["done"][1]["elapsed_s"]


def test_the_step_under_way_is_shown_with_when_it_started() -> None:
    progress = BuildProgress("wasm-test")
    assert progress.snapshot() is None  # nothing built: nothing to show
    before = time.time()
    with progress.step("compile"):
        during = progress.snapshot()
    assert during is not None
    assert (during["step"], during["done"]) == ("compile", [])
    # Unix time, to the millisecond.
    assert before - 1 <= during["started_at"] <= time.time() + 1 and during["elapsed_s"] >= 0
    assert progress.snapshot()["done"][0]["step"] == "compile"  # type: ignore[index]


def test_a_failed_step_is_recorded_and_logged_as_failed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    progress = BuildProgress("wasm-test")

    def build(work: Path, _cache_dir: Path) -> None:
        python_tool("componentize", work, "import sys; sys.exit('no good')")

    failing = GuestRecipe("wasm-test", ("world.wit",), lambda: {"tool": "1"}, build)
    refused = pytest.raises(BuildError, match="no good")
    with caplog.at_level(logging.INFO, logger=BUILD_LOG), refused:
        ensure_component(failing, tmp_path / "cache", progress)
    assert progress.snapshot()["done"] == [  # type: ignore[index]
        {"step": "componentize", "elapsed_s": pytest.approx(0, abs=TOOL_TIMEOUT_S), "ok": False}
    ]
    assert re.search(r"wasm-test: componentize failed in \d+\.\d s", caplog.text)
    assert list((tmp_path / "cache").iterdir()) == []  # its build directory is gone too


def test_what_earlier_versions_and_crashed_builds_left_is_deleted(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    builds: list[Path] = []
    cached = ensure_component(recipe("1", builds), cache)
    old_tools = cache / "wasm-test-npm-0123456789abcdef" / "node_modules"
    old_tools.mkdir(parents=True)
    (cache / "npm-cache").mkdir()
    crashed, running = cache / ".build-crashed", cache / ".build-running"
    crashed.mkdir()
    running.mkdir()
    long_ago = time.time() - ABANDONED_AFTER_S - 60
    os.utime(crashed, (long_ago, long_ago))

    leftovers = ("wasm-test-npm-*", "npm-cache")
    again = ensure_component(recipe("1", builds, leftovers=leftovers), cache)
    assert not again.built  # even with the component cached, the leftovers go
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [cached.path.parent.name, crashed.name, running.name]
    )
    ensure_component(recipe("2", builds, leftovers=leftovers), cache)  # a build
    assert crashed.name not in {p.name for p in cache.iterdir()}
    assert running.is_dir()  # another process's build, perhaps: left alone


def _tarball_set(tmp_path: Path) -> Path:
    """A package set like those in shims/, of one package from a local tarball: npm
    installs it (through its cache) without the network."""
    package = tmp_path / "tiny"
    package.mkdir()
    (package / "package.json").write_text('{"name": "tiny", "version": "1.0.0"}')
    packed = subprocess.run(
        ["npm", "pack", "--silent"], cwd=package, capture_output=True, text=True, check=True
    )
    tarball = package / packed.stdout.strip()
    digest = base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    source = tmp_path / "tiny_set"
    source.mkdir()
    wanted = {"tiny": f"file:{tarball}"}
    (source / "package.json").write_text(json.dumps({"name": "s", "dependencies": wanted}))
    lock = {
        "name": "s",
        "lockfileVersion": 3,
        "requires": True,
        "packages": {
            "": {"name": "s", "dependencies": wanted},
            "node_modules/tiny": {
                "version": "1.0.0",
                "resolved": f"file:{tarball}",
                "integrity": f"sha512-{digest}",
            },
        },
    }
    (source / "package-lock.json").write_text(json.dumps(lock))
    return source


@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm")
def test_an_npm_install_keeps_its_packages_and_not_npms_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    (cache / "npm-cache" / "_cacache").mkdir(parents=True)  # where it used to be kept
    progress = BuildProgress("pyodide")
    expect = "node_modules/tiny/package.json"
    source = _tarball_set(tmp_path)
    with caplog.at_level(logging.INFO, logger=BUILD_LOG):
        installed = install_lock_dir(source, cache, expect=expect, progress=progress)
    assert (installed / expect).is_file()
    assert [p.name for p in cache.iterdir()] == [installed.name]
    assert sorted(p.name for p in installed.iterdir()) == [
        "node_modules",
        "package-lock.json",
        "package.json",
    ]
    assert [s["step"] for s in progress.snapshot()["done"]] == ["npm install (tiny-set)"]  # type: ignore[index]
    assert "pyodide: npm install (tiny-set) started" in caplog.text


@pytest.mark.slow
def test_the_wasm_js_build_leaves_only_its_component(fresh_js_build: dict[str, Any]) -> None:
    """The real build, from npm install to componentize-js: ~400 MB of tooling, gone.

    Built where an earlier version left its npm install and npm cache (see
    `build_js_from_scratch`): by `wasm_cache` when a clone has no component yet, else here.
    """
    assert fresh_js_build["built"] and fresh_js_build["size"] > 0
    assert fresh_js_build["cache"] == [fresh_js_build["component_dir"]]
    assert fresh_js_build["in_component_dir"] == ["guest.wasm"]
    assert fresh_js_build["steps"] == ["npm install (wasm-js)", "componentize-js"]
