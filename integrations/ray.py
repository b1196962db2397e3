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
`state_dir`: the node's built components are kept there between runs) and waits until
it is ready with nothing left preparing. A node whose daemon cannot run programs (an
executor failed, the daemon exited) is left out and named in `failed`; only when every
node fails does the constructor raise.

`run` deals the programs out in chunks, enough held at each node to keep it busy and
the next to whichever node finishes first, and returns one entry per program, in order:
its `ExecutionResult` (a failing program is a result with its status, as always), or a
`BatchError` when it could not be run or its answer was lost (its node or daemon died,
the daemon refused it, no answer within its time limit, the daemon's queues and
`ANSWER_MARGIN_S`). One program, or one node, never fails the batch. No program is sent
twice once it may have run; one that surely did not (refused as overloaded or rate
limited, or its daemon was gone) is dealt again, to whichever node is free, at most
`MAX_DEALS` times. A node runs `concurrency` programs at once: by default its CPUs, as
many as its WebAssembly executors compute at once, so CPU-bound programs never queue
inside the daemon (where waiting counts against them), and never more than its daemon
admits (`limits.max_concurrent_executions`); raise it for programs that mostly wait on
tools.

Resource handling: `close` (or leaving the `with`) stops every daemon and actor, all at
once. A node whose actor or daemon died is stopped, named in `failed` and given no more
programs. A daemon stops when its actor's process ends, however it ends: it reads a
pipe from the actor (`conduit serve --until-stdin-closes`) that the kernel closes then.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
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

from conduit.client import (
    AsyncClient,
    Backoff,
    Client,
    ConduitError,
    ConnectionFailed,
    ConnectionLost,
    ExecutionResult,
    Overloaded,
    RateLimited,
    Timeout,
)

__all__ = ["BatchError", "ConduitNode", "ConduitNodes", "Program", "run_batch"]

# A node's first start builds the WebAssembly components (a minute or two).
START_TIMEOUT_S = 600.0
# Programs per task sent to a node: large enough that Ray's own cost per task is small
# beside the programs', small enough that nodes finish together.
CHUNK_SIZE = 32
# Chunks waiting at each node, so that it never idles between two.
CHUNKS_PER_NODE = 2
# How often a program that surely did not run is dealt out before its refusal stands.
MAX_DEALS = 3
# A program refused as overloaded is tried again on its node after these pauses.
OVERLOADED_PAUSES_S = (0.5, 2.0)
# Beyond a program's own time limit and the daemon's two queues (admission, CPU: each
# bounded by its `limits.queue_timeout_s`), how long its answer is waited for.
ANSWER_MARGIN_S = 30.0
STOP_TIMEOUT_S = 60.0
# Each actor's directory (socket, config, log), and the daemon's pid in it.
_DIR_PREFIX = "conduit-ray-"
_PID_FILE = "daemon.pid"


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


@dataclass(frozen=True, slots=True)
class _Unrun:
    """A program that surely did not run (refused before it started, or never sent)."""

    error: BatchError


@dataclass(frozen=True, slots=True)
class _ChunkDone:
    """What a node hands back for a chunk: an entry per program, and whether its daemon
    is still there to take more."""

    outcomes: list[Outcome | _Unrun]
    serving: bool


class ConduitNode:
    """A Ray actor serving one Conduit daemon on its node (see the module docstring)."""

    def __init__(self, config: str | None, state_dir: str | None, concurrency: int) -> None:
        _sweep_leftovers()
        self._dir = Path(tempfile.mkdtemp(prefix=_DIR_PREFIX))
        self.socket = str(self._dir / "conduit.sock")
        self._wanted = max(concurrency, 1)
        # It stops when this process does, however that happens: the kernel closes the
        # pipe it reads (a parent-death signal would follow the starting thread instead).
        argv = [sys.executable, "-m", "conduit.daemon", "serve", "--until-stdin-closes"]
        argv += ["--socket", self.socket]
        argv += ["--config", config or self._default_config()]
        if state_dir is not None:
            argv += ["--state-dir", state_dir]
        self._log = (self._dir / "daemon.log").open("wb")
        self._daemon = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT
        )
        (self._dir / _PID_FILE).write_text(str(self._daemon.pid))
        try:
            self._settle(self._wait_until_ready())
        except RuntimeError as exc:  # told by `unready`, with the daemon stopped
            self._unready: str | None = str(exc)
            self.close()
        else:
            self._unready = None

    def unready(self) -> str | None:
        """Why this node's daemon could not serve, or None: it serves."""
        return self._unready

    def concurrency(self) -> int:
        """Programs this node runs at once."""
        return self._concurrency

    def _settle(self, executions: Mapping[str, Any]) -> None:
        """Take the ready daemon's limits (`daemon/status` → `executions`): no more at
        once than it admits, and answers awaited as long as its queues may hold them."""
        self._concurrency = min(self._wanted, int(executions["capacity"]))
        # One for the node, across every chunk it has been given at once.
        self._limit = asyncio.Semaphore(self._concurrency)
        self._default_timeout_s = float(executions["default_timeout_ms"]) / 1000
        self._queues_s = 2 * float(executions["queue_timeout_s"])

    def status(self) -> dict[str, Any]:
        """The daemon's `daemon/status`."""
        with Client(unix_path=self.socket, token="", timeout_s=10) as client:
            return dict(client.call("daemon/status"))

    async def run(self, programs: list[Program]) -> _ChunkDone:
        """Run `programs` on this node's daemon, `concurrency` at a time across all
        its chunks, in order. Whatever one program raises is its own `BatchError`."""
        try:
            # Its own daemon's private socket: nobody restarts a daemon there, so a
            # failed connection is not retried.
            once = Backoff(attempts=1)
            async with AsyncClient(unix_path=self.socket, token="", backoff=once) as client:
                outcomes = await asyncio.gather(*(self._one(client, p) for p in programs))
        except ConnectionFailed as exc:  # nothing was sent, and its private socket is dead
            unrun = _Unrun(BatchError(type(exc).__name__, str(exc)[:2000]))
            return _ChunkDone([unrun] * len(programs), serving=False)
        return _ChunkDone(list(outcomes), serving=self._daemon.poll() is None)

    async def _one(self, client: AsyncClient, program: Program) -> Outcome | _Unrun:
        """`program`'s outcome; `_Unrun` if the daemon surely did not run it."""
        async with self._limit:
            for pause_s in (*OVERLOADED_PAUSES_S, None):
                if self._daemon.poll() is not None:
                    return _Unrun(BatchError("DaemonExited", "the node's daemon exited"))
                try:
                    return await client.execute(
                        program.code,
                        language=program.language,
                        limits=program.limits,
                        inputs=program.inputs,
                        executor=program.executor,
                        timeout_s=self._answer_within_s(program),
                    )
                except (Overloaded, RateLimited) as exc:
                    if pause_s is None:
                        return _Unrun(_batch_error(exc))
                    await asyncio.sleep(pause_s)
                except ConnectionFailed as exc:
                    return _Unrun(_batch_error(exc))
                except Exception as exc:  # its own outcome, whatever it is
                    return _batch_error(exc)
        raise AssertionError("unreachable")  # the last pause is None

    def _answer_within_s(self, program: Program) -> float:
        """How long `program`'s answer may take: its time limit (as the daemon reads
        it; a limit it will refuse is refused at once), its queues, and a margin."""
        try:
            own_s = float((program.limits or {})["timeout_ms"]) / 1000
        except (KeyError, TypeError, ValueError):
            own_s = self._default_timeout_s
        return max(own_s, 0.0) + self._queues_s + ANSWER_MARGIN_S

    def close(self) -> None:
        """Stop the daemon (it drains) and remove what this actor made."""
        if self._daemon.poll() is None:
            self._daemon.send_signal(signal.SIGTERM)
            try:
                self._daemon.wait(timeout=STOP_TIMEOUT_S / 2)
            except subprocess.TimeoutExpired:
                self._daemon.kill()
                self._daemon.wait()
        if self._daemon.stdin is not None:
            self._daemon.stdin.close()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _default_config(self) -> str:
        """No fixed ports: another daemon (a systemd one) may hold the defaults."""
        path = self._dir / "conduit.toml"
        path.write_text('[metrics]\nlisten = "127.0.0.1:0"\n')
        return str(path)

    def _wait_until_ready(self) -> Mapping[str, Any]:
        """Until the daemon says it is ready (what its `GET /ready` says) with nothing
        left preparing (no build beside the programs, no stand-in for an executor still
        starting); its `daemon/status` → `executions` then. Raises `RuntimeError` at
        once when it exits, refuses the actor, or is unready with nothing preparing (an
        executor failed, a runtime is missing)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._daemon.poll() is not None:
                raise RuntimeError(f"the node's daemon exited: {self._tail()}")
            try:
                with Client(unix_path=self.socket, token="", timeout_s=5) as client:
                    status = client.call("daemon/status")
            except (ConnectionFailed, ConnectionLost, Timeout):
                status = None  # not listening yet, or too busy starting to answer
            except ConduitError as exc:
                raise RuntimeError(f"the node's daemon refused its actor: {exc}") from None
            ready = status["ready"] if status is not None else None
            if ready is not None and ready["ok"] and not ready["preparing"]:
                return status["executions"]  # type: ignore[index]
            if ready is not None and not ready["preparing"]:
                raise RuntimeError(f"the node's daemon cannot run programs: {ready['reason']}")
            time.sleep(0.1)
        raise RuntimeError(f"the node's daemon was not ready in {START_TIMEOUT_S:g} s")

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
        concurrency: int | None = None,
        chunk_size: int = CHUNK_SIZE,
    ) -> None:
        """`config` and `state_dir` are paths on every node (None: the defaults, with
        the metrics endpoint on a free port); `concurrency` is programs at once per
        node (None: the node's CPUs; never more than its daemon admits at once).

        Raises `RuntimeError` when no node's daemon became ready, naming each reason.
        """
        if not ray.is_initialized():
            ray.init()
        self._chunk_size = max(chunk_size, 1)
        # Node id -> why it takes no programs: its daemon could not serve, or died.
        self.failed: dict[str, str] = {}
        self.actors: list[Any] = []
        self._nodes: dict[Any, _Node] = {}  # actor -> its node
        remote = ray.remote(num_cpus=0, max_restarts=0)(ConduitNode)
        starting: dict[str, Any] = {}
        try:
            for node in ray.nodes():
                if node["Alive"]:
                    affinity = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                    starting[node["NodeID"]] = remote.options(scheduling_strategy=affinity).remote(
                        config, state_dir, concurrency or _cpus(node)
                    )
            self._start(starting)
        except BaseException:
            for actor in starting.values():
                ray.kill(actor)
            raise

    def _start(self, starting: dict[str, Any]) -> None:
        """Keep the actors whose daemon became ready; kill the rest, noting why."""
        ready = {actor.unready.remote(): (node, actor) for node, actor in starting.items()}
        done, late = ray.wait(list(ready), num_returns=len(ready), timeout=START_TIMEOUT_S + 60)
        for ref in late:
            node, actor = ready[ref]
            self.failed[node] = f"not ready in {START_TIMEOUT_S:g} s"
            ray.kill(actor)
        for ref in done:
            node, actor = ready[ref]
            try:
                why = ray.get(ref)
            except RayError as exc:
                why = _first_line(exc)
            if why is None:
                self._nodes[actor] = _Node(node, ray.get(actor.concurrency.remote()))
                self.actors.append(actor)
            else:
                self.failed[node] = why
                ray.kill(actor)
        if not self.actors:
            reasons = "; ".join(f"{node[:12]}: {why}" for node, why in self.failed.items())
            raise RuntimeError(f"no node's Conduit daemon became ready: {reasons or 'no node'}")

    def __enter__(self) -> ConduitNodes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def run(self, programs: Iterable[Program | str]) -> list[Outcome]:
        """One outcome per program, in order (see the module docstring)."""
        given = [Program(p) if isinstance(p, str) else p for p in programs]
        deal = _Deal(given, self._chunk_size)
        waiting: dict[Any, tuple[Any, list[int]]] = {}  # ref: (actor, indices)
        dropped: list[Any] = []

        def top_up() -> None:
            held = Counter(actor for actor, _ in waiting.values())
            for actor in self.actors:
                for _ in range(self._chunks_for(actor) - held[actor]):
                    chunk = deal.next_chunk()
                    if chunk:
                        waiting[actor.run.remote([given[i] for i in chunk])] = (actor, chunk)

        try:
            top_up()
            while waiting:
                [done], _ = ray.wait(list(waiting), num_returns=1)
                actor, chunk = waiting.pop(done)
                gone = self._take_answer(deal, actor, chunk, done)
                if gone is not None:
                    self.failed[self._nodes[actor].node_id] = gone
                    dropped.append(actor)  # its other chunks still come back
                self.actors = [a for a in self.actors if a not in dropped]
                top_up()  # programs dealt again go to whichever node is free first
        finally:
            _stop(dropped)
        return deal.finish()

    def close(self) -> None:
        """Stop every node's daemon, then its actor: all at once."""
        _stop(self.actors)
        self.actors = []

    def _chunks_for(self, actor: Any) -> int:
        """Chunks held at `actor`'s node: enough to keep all it runs at once busy, and
        one more, so that it never idles between two."""
        return -(-self._nodes[actor].concurrency // self._chunk_size) + 1

    def _take_answer(self, deal: _Deal, actor: Any, chunk: list[int], ref: Any) -> str | None:
        """Put `actor`'s answer for `chunk` into `deal`; why the node must take no more
        programs, or None."""
        try:
            answer: _ChunkDone = ray.get(ref)
        except RayError as exc:  # the node is gone, and what it held may have run
            deal.lost(chunk, BatchError(type(exc).__name__, _first_line(exc)))
            return f"its actor died: {_first_line(exc)}"
        deal.answered(chunk, answer.outcomes)
        return None if answer.serving else "its daemon stopped serving"


@dataclass(frozen=True, slots=True)
class _Node:
    node_id: str
    concurrency: int


class _Deal:
    """Which programs of a batch are still to go out, and each one's outcome."""

    def __init__(self, given: list[Any], chunk_size: int) -> None:
        self._outcomes: list[Outcome | None] = [_malformed(p) for p in given]
        self._chunk_size = chunk_size
        self._deals = [0] * len(given)
        # Only programs go out, each as often as it is dealt.
        runnable = [index for index, outcome in enumerate(self._outcomes) if outcome is None]
        self._pending: deque[int] = deque(runnable)

    def next_chunk(self) -> list[int]:
        chunk = []
        while self._pending and len(chunk) < self._chunk_size:
            index = self._pending.popleft()
            self._deals[index] += 1
            chunk.append(index)
        return chunk

    def answered(self, chunk: list[int], outcomes: list[Outcome | _Unrun]) -> None:
        for index, outcome in zip(chunk, outcomes, strict=True):
            if isinstance(outcome, _Unrun) and self._deals[index] < MAX_DEALS:
                self._pending.append(index)  # it did not run: anyone may take it
            else:
                self._outcomes[index] = outcome.error if isinstance(outcome, _Unrun) else outcome

    def lost(self, chunk: list[int], error: BatchError) -> None:
        for index in chunk:
            self._outcomes[index] = error

    def finish(self) -> list[Outcome]:
        """Every outcome; what never went out (every node failed) is an error, not a gap."""
        unsent = BatchError("NoNodeLeft", "every node failed before this program was run")
        return [unsent if outcome is None else outcome for outcome in self._outcomes]


def run_batch(programs: Iterable[Program | str], **options: Any) -> list[Outcome]:
    """Start the nodes, run one batch, stop them (`ConduitNodes` takes `options`)."""
    with ConduitNodes(**options) as nodes:
        return nodes.run(programs)


def _stop(actors: list[Any]) -> None:
    """Stop the actors' daemons, all at once, then the actors."""
    stopping = [actor.close.remote() for actor in actors]
    if stopping:
        ray.wait(stopping, num_returns=len(stopping), timeout=STOP_TIMEOUT_S)
    for actor in actors:
        ray.kill(actor)


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


def _cpus(node: Mapping[str, Any]) -> int:
    """The CPUs Ray counts on `node` (at least one)."""
    return max(int((node.get("Resources") or {}).get("CPU", 1)), 1)


def _batch_error(exc: BaseException) -> BatchError:
    return BatchError(type(exc).__name__, str(exc)[:2000])


def _malformed(item: object) -> BatchError | None:
    """Why `item` cannot go out as a program (it would fail the whole chunk on the way
    to its node), or None."""
    if not isinstance(item, Program):
        return BatchError(
            "TypeError", f"a batch holds Program or str items, not {type(item).__name__}"
        )
    try:
        json.dumps([item.code, item.language, item.limits, item.inputs, item.executor])
    except (TypeError, ValueError) as exc:  # as the wire would refuse it
        return BatchError("TypeError", f"the program does not fit in JSON: {exc}"[:2000])
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else type(exc).__name__
