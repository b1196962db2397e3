"""Batches of programs across a Ray cluster: one Conduit daemon per node, each program once.

```python
import ray
from conduit.integrations.ray import ConduitNodes, Program

ray.init()
with ConduitNodes() as nodes:
    results = nodes.run([Program("sum(range(10))"), "1 / 0"])
results[0].result   # 45
results[1].status   # "error"
```

`ConduitNodes` starts a `ConduitNode` actor on every alive node, pinned there, and each
starts a daemon of its own (`conduit serve` on a private Unix socket, its state in
`state_dir`: the node's built components are kept there between runs). `run` deals the
programs out in chunks, a few in flight per node and the next to whichever node
finishes first, and returns one entry per program, in order: its `ExecutionResult`
(a failing program is a result with its status, as always), or a `BatchError` when it
could not be run or its answer was lost (its node died, the daemon refused it). One
program, or one node, never fails the batch, and no program is sent twice: one whose
answer was lost may have run. `run_batch` is the same for a single batch.

Resource handling: `close` (or leaving the `with`) stops every daemon and actor. A
daemon is started with the parent-death signal set, so one whose actor is killed stops
too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conduit.integrations._extras import missing_extra

try:
    import ray
    from ray.exceptions import RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ModuleNotFoundError as exc:
    raise missing_extra("ray", "ray", "ray") from exc

from conduit.client import AsyncClient, Client, ConduitError, ExecutionResult

__all__ = ["BatchError", "ConduitNode", "ConduitNodes", "Program", "run_batch"]

# A node's first start builds the WebAssembly components (a minute or two).
START_TIMEOUT_S = 600.0
# Programs a node runs at once; its daemon queues what its executors cannot take yet.
CONCURRENCY = 16
# Programs per task sent to a node: large enough that Ray's own cost per task is small
# beside the programs', small enough that nodes finish together.
CHUNK_SIZE = 32
# Chunks waiting at each node, so that it never idles between two.
CHUNKS_PER_NODE = 2
_PR_SET_PDEATHSIG = 1
# Each actor's directory (socket, config, log), and the daemon's pid in it.
_DIR_PREFIX = "conduit-ray-"
_PID_FILE = "daemon.pid"
# What `executors/list` shows of an executor that has yet to take its first program.
_STARTING = {"not started", "building", "starting"}


@dataclass(frozen=True, slots=True)
class Program:
    """One program of a batch, as `execute` takes it."""

    code: str
    language: str = "python"
    limits: Mapping[str, int] | None = None
    inputs: Any = None
    executor: str | None = None


@dataclass(frozen=True, slots=True)
class BatchError:
    """A program the batch could not run, or whose answer was lost."""

    type: str
    message: str

    @property
    def ok(self) -> bool:
        return False


Outcome = ExecutionResult | BatchError


class ConduitNode:
    """A Ray actor serving one Conduit daemon on its node (see the module docstring)."""

    def __init__(self, config: str | None, state_dir: str | None, concurrency: int) -> None:
        _sweep_leftovers()
        self._dir = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX))
        self.socket = str(self._dir / "conduit.sock")
        # One for the node, across every chunk it has been given at once.
        self._limit = asyncio.Semaphore(max(concurrency, 1))
        argv = [sys.executable, "-m", "conduit.daemon", "serve", "--socket", self.socket]
        argv += ["--config", config or self._default_config()]
        if state_dir is not None:
            argv += ["--state-dir", state_dir]
        self._log = (self._dir / "daemon.log").open("wb")
        self._daemon = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (one libc call, nothing else)
        )
        (self._dir / _PID_FILE).write_text(str(self._daemon.pid))
        self._wait_until_serving()

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    async def run(self, programs: list[Program]) -> list[Outcome]:
        """Run `programs` on this node's daemon, `concurrency` at a time across all
        its chunks, in order. Whatever one program raises is its own `BatchError`."""
        async with AsyncClient(unix_path=self.socket, token="", timeout_s=None) as client:

            async def one(program: Program) -> Outcome:
                async with self._limit:
                    try:
                        return await client.execute(
                            program.code,
                            language=program.language,
                            limits=program.limits,
                            inputs=program.inputs,
                            executor=program.executor,
                        )
                    except Exception as exc:  # its own outcome, whatever it is
                        return BatchError(type(exc).__name__, str(exc)[:2000])

            return list(await asyncio.gather(*(one(program) for program in programs)))

    def close(self) -> None:
        """Stop the daemon (it drains) and remove what this actor made."""
        if self._daemon.poll() is None:
            self._daemon.send_signal(signal.SIGTERM)
            try:
                self._daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._daemon.kill()
                self._daemon.wait()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _default_config(self) -> str:
        """No fixed ports: another daemon (a systemd one) may hold the defaults."""
        path = self._dir / "conduit.toml"
        path.write_text('[metrics]\nlisten = "127.0.0.1:0"\n')
        return str(path)

    def _wait_until_serving(self) -> None:
        """Until the daemon answers and none of its executors is still starting (a
        program sent sooner would wait for it, within its own timeout only)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._daemon.poll() is not None:
                raise RuntimeError(f"the node's daemon exited: {self._tail()}")
            try:
                with Client(unix_path=self.socket, token="", timeout_s=5) as client:
                    executors = client.call("executors/list")["executors"]
            except ConduitError:
                executors = None
            if executors is not None and not any(map(_starting, executors)):
                return
            time.sleep(0.1)
        raise RuntimeError(f"the node's daemon did not start in {START_TIMEOUT_S:g} s")

    def _tail(self) -> str:
        self._log.flush()
        return (self._dir / "daemon.log").read_text(errors="replace")[-2000:]


class ConduitNodes:
    """A daemon on every alive node of the Ray cluster, and batches run across them."""

    def __init__(
        self,
        *,
        config: str | None = None,
        state_dir: str | None = None,
        concurrency: int = CONCURRENCY,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        """`config` and `state_dir` are paths on every node (None: the defaults, with
        the metrics endpoint on a free port)."""
        if not ray.is_initialized():
            ray.init()
        self._chunk_size = chunk_size
        remote = ray.remote(num_cpus=0, max_restarts=0)(ConduitNode)
        self.actors = [
            remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(config, state_dir, concurrency)
            for node in ray.nodes()
            if node["Alive"]
        ]
        try:
            ray.get([actor.node_id.remote() for actor in self.actors])
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> ConduitNodes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def run(self, programs: Iterable[Program | str]) -> list[Outcome]:
        """One outcome per program, in order (see the module docstring)."""
        given = [Program(p) if isinstance(p, str) else p for p in programs]
        outcomes: list[Outcome | None] = [
            None if isinstance(p, Program) else BatchError("TypeError", _not_a_program(p))
            for p in given
        ]
        # Only programs go out; each chunk remembers where its outcomes go.
        runnable = [index for index, outcome in enumerate(outcomes) if outcome is None]
        chunks = [
            runnable[start : start + self._chunk_size]
            for start in range(0, len(runnable), max(self._chunk_size, 1))
        ]
        waiting: dict[Any, tuple[Any, list[int]]] = {}  # ref: (actor, indices)
        pending = iter(chunks)

        def send(actor: Any) -> None:
            chunk = next(pending, None)
            if chunk is not None:
                waiting[actor.run.remote([given[i] for i in chunk])] = (actor, chunk)

        for actor in self.actors:
            for _ in range(CHUNKS_PER_NODE):
                send(actor)
        while waiting:
            [done], _ = ray.wait(list(waiting), num_returns=1)
            actor, chunk = waiting.pop(done)
            try:
                results = ray.get(done)
            except RayError as exc:
                lost = BatchError(type(exc).__name__, _first_line(exc))
                results = [lost] * len(chunk)
                continue  # a node that failed a chunk is given no more
            finally:
                for index, outcome in zip(chunk, results, strict=True):
                    outcomes[index] = outcome
            send(actor)
        if any(outcome is None for outcome in outcomes):
            self._fail_unsent(outcomes)
        return [outcome for outcome in outcomes if outcome is not None]

    def close(self) -> None:
        """Stop every node's daemon, then its actor."""
        for actor in self.actors:
            with contextlib.suppress(RayError):  # already gone: its daemon went with it
                ray.get(actor.close.remote(), timeout=60)
            ray.kill(actor)
        self.actors = []

    @staticmethod
    def _fail_unsent(outcomes: list[Outcome | None]) -> None:
        """Every node failed: what was never sent is an error, not a gap."""
        unsent = BatchError("NoNodeLeft", "every node failed before this program was sent")
        for index, outcome in enumerate(outcomes):
            if outcome is None:
                outcomes[index] = unsent


def run_batch(programs: Iterable[Program | str], **options: Any) -> list[Outcome]:
    """Start the nodes, run one batch, stop them (`ConduitNodes` takes `options`)."""
    with ConduitNodes(**options) as nodes:
        return nodes.run(programs)


def _sweep_leftovers() -> None:
    """Remove what killed actors left on this node: the directories whose daemon (its
    pid file says which) is gone. A killed actor cannot clean up after itself."""
    for path in Path(tempfile.gettempdir()).glob(f"{_DIR_PREFIX}*"):
        try:
            pid = int((path / _PID_FILE).read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (OSError, ValueError):
            continue  # starting (no pid yet), or not ours to judge


def _starting(executor: Mapping[str, Any]) -> bool:
    return (executor.get("pool") or {}).get("state") in _STARTING


def _die_with_parent() -> None:
    """In the daemon's process, before it runs: SIGTERM when the actor's process ends."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _not_a_program(item: object) -> str:
    return f"a batch holds Program or str items, not {type(item).__name__}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else type(exc).__name__
