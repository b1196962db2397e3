"""Batches on a real local Ray cluster of two nodes: a Conduit daemon per node, started
by its actor, each program run once."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray.cluster_utils import Cluster

from conduit.client import Client, ConduitError, ExecutionResult, Overloaded
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
# Enough CPU per program that the batch is still going when a node is stopped.
BUSY = "sum(range(2_000_000))"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head node and a second node, one CPU each, as processes on this machine."""
    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    nodes.add_node(num_cpus=1)
    ray.init(address=nodes.address, log_to_driver=False)
    try:
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()


@pytest.fixture
def node_settings(tmp_path: Path, wasm_cache: Path) -> dict[str, str]:
    """A state dir holding the session's built components (and an audit store both
    nodes share, as they run on one machine), and a config running only wasm-python
    with the metrics endpoint on a free port."""
    state = tmp_path / "node-state"
    link_wasm_cache(state, wasm_cache)
    config = tmp_path / "node.toml"
    config.write_text(_PYTHON_ONLY)
    return {"config": str(config), "state_dir": str(state)}


_PYTHON_ONLY = (
    '[metrics]\nlisten = "127.0.0.1:0"\n'
    "[executors.deno]\nenabled = false\n[executors.wasm_js]\nenabled = false\n"
)


def test_a_batch_comes_back_in_order_with_each_programs_outcome(
    cluster: Cluster, node_settings: dict[str, str]
) -> None:
    programs: list[Program | str] = [f"{i} * {i}" for i in range(40)]
    programs[7] = "1 / 0"
    programs[13] = Program("while True:\n    pass", limits={"timeout_ms": 200})
    programs[21] = Program("1", language="cobol")
    programs[30] = Program("inputs['x'] + 1", inputs={"x": 41})
    programs[33] = Program("1", limits={"timeout_ms": "soon"})  # type: ignore[dict-item]
    programs[35] = 5  # type: ignore[call-overload]
    programs[36] = Program("1", inputs={"x": object()})  # would fail its chunk on the way
    programs[38] = Program("1", executor="pyodide")  # not enabled: on no node
    with two_nodes(**node_settings, chunk_size=4) as nodes:
        assert nodes.failed == {}
        outcomes = nodes.run(programs)
        ran = [_recorded(actor) for actor in nodes.actors]
        assert nodes.run([]) == []
    assert all(ran), f"a node ran nothing: {ran}"
    assert len(outcomes) == 40
    # A bad item, or one the client cannot even send, is its own error only.
    assert isinstance(outcomes[33], BatchError), outcomes[33]
    assert isinstance(outcomes[35], BatchError) and outcomes[35].type == "TypeError"
    assert isinstance(outcomes[36], BatchError) and "JSON" in outcomes[36].message
    assert isinstance(outcomes[38], BatchError) and outcomes[38].type == "ExecutorUnavailable"
    for index, outcome in enumerate(outcomes):
        if index in (7, 13, 21, 30, 33, 35, 36, 38):
            continue
        assert isinstance(outcome, ExecutionResult) and outcome.result == index * index, outcome
    assert isinstance(outcomes[7], ExecutionResult) and outcomes[7].status == "error"
    assert outcomes[7].error is not None and outcomes[7].error.type == "ZeroDivisionError"
    assert isinstance(outcomes[13], ExecutionResult) and outcomes[13].status == "timeout"
    assert isinstance(outcomes[21], BatchError) and outcomes[21].type == "InvalidParams"
    assert "language" in outcomes[21].message
    assert isinstance(outcomes[30], ExecutionResult) and outcomes[30].result == 42


def test_cpu_bound_programs_never_queue_inside_a_node(
    cluster: Cluster, tmp_path: Path, wasm_cache: Path
) -> None:
    """By default a node takes as many programs at once as it has CPUs, so none waits
    for a CPU inside the daemon, where waiting counts against it (here 0.1 s)."""
    state = tmp_path / "node-state"
    link_wasm_cache(state, wasm_cache)
    config = tmp_path / "node.toml"
    config.write_text(_PYTHON_ONLY + "[limits]\nqueue_timeout_s = 0.1\n")
    with two_nodes(config=str(config), state_dir=str(state), chunk_size=2) as nodes:
        outcomes = nodes.run([BUSY] * 8)
        refused = [_refused_as_overloaded(actor) for actor in nodes.actors]
    assert [getattr(o, "status", o) for o in outcomes] == ["ok"] * 8
    # Taken on their first try, not after a refusal dealt them out again.
    assert refused == [0, 0]


def test_a_node_whose_actor_dies_fails_what_it_held_and_is_dropped(
    cluster: Cluster, node_settings: dict[str, str]
) -> None:
    """What it held comes back as errors, never resent; the other node runs the rest,
    and the next batch; its daemon goes with it, and what it left is swept."""
    with two_nodes(**node_settings, chunk_size=4) as nodes:
        doomed, survivor = nodes.actors
        socket = _socket_of(doomed)
        outcomes = _run_while(nodes, [BUSY] * 16, lambda: ray.kill(doomed))
        assert nodes.actors == [survivor]
        assert "actor died" in "".join(nodes.failed.values()), nodes.failed
        again = nodes.run(["6 * 7"] * 4)
    assert [getattr(o, "result", o) for o in again] == [42] * 4
    done = [o for o in outcomes if isinstance(o, ExecutionResult)]
    lost = [o for o in outcomes if isinstance(o, BatchError)]
    assert lost and len(done) + len(lost) == 16 and all(o.ok for o in done)
    assert {o.type for o in lost} <= {"ActorDiedError", "RayActorError"}, lost
    assert _eventually(lambda: not _serving(socket)), "the dead actor's daemon still serves"
    # What it left behind goes when the next actor on the node starts.
    leftover = Path(socket).parent
    # (The daemon's exit may not be reaped by the kernel at once.)
    assert _eventually(lambda: (_sweep_leftovers(), not leftover.exists())[1])


def test_a_node_whose_daemon_dies_hands_back_what_it_never_ran(
    cluster: Cluster, node_settings: dict[str, str]
) -> None:
    """Programs its daemon never took go to the other node; those it may have run are
    errors; none runs twice (the audit store both share says so)."""
    programs = [f"{BUSY}\n{i}" for i in range(16)]
    with two_nodes(**node_settings, chunk_size=4) as nodes:
        doomed, survivor = nodes.actors
        pid = int((Path(_socket_of(doomed)).parent / "daemon.pid").read_text())
        outcomes = _run_while(nodes, programs, lambda: os.kill(pid, signal.SIGKILL))
        assert nodes.actors == [survivor]
        assert list(nodes.failed.values()) == ["its daemon stopped serving"]
        listed = _recorded_codes(_socket_of(survivor))
    lost = [i for i, o in enumerate(outcomes) if isinstance(o, BatchError)]
    assert all(outcomes[i].type in {"ConnectionLost"} for i in lost), outcomes  # type: ignore[union-attr]
    assert all(o.result == i for i, o in enumerate(outcomes) if i not in lost)  # type: ignore[union-attr]
    assert len(lost) <= 8, f"more lost than the dead node held: {len(lost)}"
    # Each program is on record at most once; each answered one exactly once.
    hashes = Counter(listed)
    codes = [hashlib.sha256(code.encode()).hexdigest() for code in programs]
    assert all(hashes[h] <= 1 for h in codes), hashes.most_common(3)
    assert all(hashes[codes[i]] == 1 for i in range(16) if i not in lost)


def test_nodes_that_cannot_run_programs_fail_at_once_saying_why(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = tmp_path / "none.toml"
    config.write_text(_PYTHON_ONLY + "[executors.wasm_python]\nenabled = false\n")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="cannot run programs: no executor is enabled") as caught:
        run_batch(["1"], config=str(config), state_dir=str(tmp_path / "state"))
    assert time.monotonic() - started < WAIT_S
    assert caught.value.args[0].count("cannot run programs") == 2  # each node's reason


@contextlib.contextmanager
def two_nodes(**options: Any) -> Iterator[ConduitNodes]:
    """`ConduitNodes` with both nodes serving. A start that left one out is tried once
    more, saying why it did (seen once in CI under load, reason then unknown): these
    tests are about what happens after both serve."""
    for attempt in (1, 2):
        nodes = ConduitNodes(**options)
        if len(nodes.actors) == 2 or attempt == 2:
            break
        warnings.warn(f"a node did not start, trying again: {nodes.failed}", stacklevel=2)
        nodes.close()
    with nodes:
        assert len(nodes.actors) == 2, nodes.failed
        yield nodes


def _run_while(nodes: ConduitNodes, programs: list[Any], stop: Callable[[], None]) -> list[Any]:
    """`nodes.run(programs)`, calling `stop` once the batch is under way."""
    outcomes: list[Any] = []
    runner = threading.Thread(target=lambda: outcomes.extend(nodes.run(programs)))
    runner.start()
    time.sleep(0.5)
    stop()
    runner.join(WAIT_S)
    assert not runner.is_alive()
    assert len(outcomes) == len(programs)
    return outcomes


def _recorded(actor: Any) -> int:
    return int(ray.get(actor.status.remote())["audit"]["recorded"])


def _refused_as_overloaded(actor: Any) -> float:
    """How many `execute` requests the node's daemon refused as overloaded (its metrics)."""
    url = ray.get(actor.status.remote())["metrics"]["url"]
    families = text_string_to_metric_families(httpx.get(url, timeout=30).text)
    return sum(
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == "conduit_rpc_requests_total"
        and sample.labels == {"method": "execute", "code": str(Overloaded.code)}
    )


def _recorded_codes(socket: str) -> list[str]:
    """The code hash of every execution on record in the store `socket`'s daemon uses."""
    hashes: list[str] = []
    cursor = None
    with Client(unix_path=socket, token="", timeout_s=30) as client:
        while True:
            page = client.call("executions/list", {"limit": 1000, "cursor": cursor})
            hashes += [row["code_sha256"] for row in page["executions"]]
            cursor = page.get("next_cursor")
            if not cursor:
                return hashes


def _socket_of(actor: object) -> str:
    return str(ray.get(actor.__ray_call__.remote(lambda self: self.socket)))  # type: ignore[attr-defined]


def _eventually(check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _serving(socket: str) -> bool:
    try:
        with Client(unix_path=socket, token="", timeout_s=2, connect_timeout_s=1) as client:
            client.ping()
    except ConduitError:
        return False
    return True
