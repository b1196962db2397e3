"""Batches on a real local Ray cluster: a Conduit daemon per node, started by its actor."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from conduit.client import Client, ConduitError, ExecutionResult
from conduit.integrations.ray import (
    BatchError,
    ConduitNodes,
    Program,
    _sweep_leftovers,
    run_batch,
)
from tests.conftest import link_wasm_cache

# Ray's own start, and a node's daemon's, on a loaded two-core machine.
WAIT_S = 120


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def node_settings(tmp_path: Path, wasm_cache: Path) -> dict[str, str]:
    """A state dir holding the session's built components, and a config running only
    wasm-python with the metrics endpoint on a free port."""
    state = tmp_path / "node-state"
    link_wasm_cache(state, wasm_cache)
    config = tmp_path / "node.toml"
    config.write_text(
        '[metrics]\nlisten = "127.0.0.1:0"\n'
        "[executors.deno]\nenabled = false\n[executors.wasm_js]\nenabled = false\n"
    )
    return {"config": str(config), "state_dir": str(state)}


def test_a_batch_comes_back_in_order_with_each_programs_outcome(
    cluster: None, node_settings: dict[str, str]
) -> None:
    programs: list[Program | str] = [f"{i} * {i}" for i in range(40)]
    programs[7] = "1 / 0"
    programs[13] = Program("while True:\n    pass", limits={"timeout_ms": 200})
    programs[21] = Program("1", language="cobol")
    programs[30] = Program("inputs['x'] + 1", inputs={"x": 41})
    programs[33] = Program("1", limits={"timeout_ms": "soon"})  # type: ignore[dict-item]
    programs[35] = 5  # type: ignore[call-overload]
    outcomes = run_batch(programs, **node_settings)
    assert len(outcomes) == 40
    # A bad item, or one the client cannot even send, is its own error only.
    assert isinstance(outcomes[33], BatchError), outcomes[33]
    assert isinstance(outcomes[35], BatchError) and outcomes[35].type == "TypeError"
    for index, outcome in enumerate(outcomes):
        if index in (7, 13, 21, 30, 33, 35):
            continue
        assert isinstance(outcome, ExecutionResult) and outcome.result == index * index, outcome
    assert isinstance(outcomes[7], ExecutionResult) and outcomes[7].status == "error"
    assert outcomes[7].error is not None and outcomes[7].error.type == "ZeroDivisionError"
    assert isinstance(outcomes[13], ExecutionResult) and outcomes[13].status == "timeout"
    assert isinstance(outcomes[21], BatchError) and outcomes[21].type == "InvalidParams"
    assert "language" in outcomes[21].message
    assert isinstance(outcomes[30], ExecutionResult) and outcomes[30].result == 42


def test_a_node_that_dies_fails_its_programs_not_the_batch(
    cluster: None, node_settings: dict[str, str]
) -> None:
    """Its programs in flight come back as errors, never resent; its daemon goes with it."""
    with ConduitNodes(**node_settings, chunk_size=4) as nodes:
        [actor] = nodes.actors
        socket = ray.get(actor.node_id.remote()) and _socket_of(actor)
        outcomes: list[object] = []
        busy = "sum(range(3_000_000))"
        runner = threading.Thread(target=lambda: outcomes.extend(nodes.run([busy] * 200)))
        runner.start()
        time.sleep(1.0)
        ray.kill(actor)
        runner.join(WAIT_S)
        assert not runner.is_alive()
    assert len(outcomes) == 200
    done = [o for o in outcomes if isinstance(o, ExecutionResult)]
    lost = [o for o in outcomes if isinstance(o, BatchError)]
    assert lost and len(done) + len(lost) == 200
    assert all(o.ok for o in done)
    assert {o.type for o in lost} <= {"ActorDiedError", "RayActorError", "NoNodeLeft"}, lost
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and _serving(socket):
        time.sleep(0.1)
    assert not _serving(socket), "the dead actor's daemon is still serving"
    # What it left behind goes when the next actor on the node starts.
    leftover = Path(socket).parent
    deadline = time.monotonic() + WAIT_S
    while leftover.exists() and time.monotonic() < deadline:
        _sweep_leftovers()  # the daemon's exit may not be reaped by the kernel yet
        time.sleep(0.1)
    assert not leftover.exists()


def _socket_of(actor: object) -> str:
    return str(ray.get(actor.__ray_call__.remote(lambda self: self.socket)))  # type: ignore[attr-defined]


def _serving(socket: str) -> bool:
    try:
        with Client(unix_path=socket, token="", timeout_s=2, connect_timeout_s=1) as client:
            client.ping()
    except ConduitError:
        return False
    return True
