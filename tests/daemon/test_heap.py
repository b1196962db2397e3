"""A daemon that owns its process sets its start-up objects apart from the garbage
collector (`gc.freeze`), so that a full collection no longer walks them all; one that
shares its process (tests, an embedding program) leaves the collector alone. Each case
runs in a process of its own: freezing is for the whole process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conduit.daemon import cli, mcp_stdio

SERVE_THEN_COUNT = """
import gc, sys, tempfile
import trio
from conduit.daemon.config import load_config
from conduit.daemon.server import Daemon

state = tempfile.mkdtemp()
config = load_config(environ={}, overrides={
    "server.socket": state + "/s.sock", "server.state_dir": state,
    "executors.deno.enabled": False, "executors.wasm_js.enabled": False,
    "executors.wasm_python.enabled": False, "audit.enabled": False,
})

async def main():
    async with trio.open_nursery() as nursery:
        daemon = Daemon(config, owns_process=sys.argv[1] == "owns")
        await nursery.start(daemon.serve)
        with trio.fail_after(30):
            while not gc.get_freeze_count() and sys.argv[1] == "owns":
                await trio.sleep(0.01)
        await trio.sleep(0.2)
        print(gc.get_freeze_count())
        daemon.shutdown()

trio.run(main)
"""


@pytest.mark.parametrize(("owns", "frozen"), [("owns", True), ("shares", False)])
def test_only_a_daemon_that_owns_its_process_freezes_its_start_up(owns: str, frozen: bool) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SERVE_THEN_COUNT), owns],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    count = int(ran.stdout.split()[-1])
    assert (count > 10_000) is frozen, (count, ran.stderr[-2000:])


def test_conduit_serve_owns_its_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    served: list[dict[str, Any]] = []

    async def serve(config: Any, **options: Any) -> None:
        served.append(options)

    monkeypatch.setattr("conduit.daemon.server.serve", serve)
    monkeypatch.setattr("conduit.daemon.logs.configure_logging", lambda level: None)
    parser = cli._parser()
    args = parser.parse_args(["serve", "--state-dir", str(tmp_path)])
    assert cli._serve(args) == 0
    assert served and served[0]["owns_process"] is True


async def test_conduit_mcp_owns_its_process(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []

    class Made(Exception):
        pass

    def daemon(config: Any, **options: Any) -> Any:
        made.append(options)
        raise Made

    monkeypatch.setattr("conduit.daemon.server.Daemon", daemon)
    with pytest.raises(Made):
        await mcp_stdio.serve_embedded(object(), object())  # type: ignore[arg-type]
    assert made and made[0]["owns_process"] is True
