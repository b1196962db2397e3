"""A real daemon for the agent frameworks' tests: the echo fixture as its one upstream,
served in a thread of its own, so the frameworks' blocking and asyncio code can use it
from the test's thread as an agent would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conduit.daemon.server import ServingInfo
from tests.conftest import link_wasm_cache
from tests.e2e.helpers import daemon_in_a_thread
from tests.e2e.test_tools import ECHO
from tests.served import Served

# What the tests let programs call: every echo tool.
ALLOWED_TOOLS = ["echo.*"]


@pytest.fixture(scope="module")
def conduit_daemon(
    tmp_path_factory: pytest.TempPathFactory, wasm_cache: Path
) -> Iterator[Served[ServingInfo]]:
    """One daemon for a module's tests (each framework's tests only run programs):
    strict validation, so a wrong argument comes back naming the field."""
    state = tmp_path_factory.mktemp("integrations") / "state"
    link_wasm_cache(state, wasm_cache)
    settings = {"executors.deno.pool_size": 1, "gateway.strict": True, "upstreams": [ECHO]}
    with daemon_in_a_thread(state, settings, upstreams=("echo",)) as served:
        yield served


@pytest.fixture
def socket_path(conduit_daemon: Served[ServingInfo]) -> str:
    """The daemon's Unix socket: what `Client(unix_path=...)` and CONDUIT_SOCKET take."""
    return str(conduit_daemon.value.unix_path)
