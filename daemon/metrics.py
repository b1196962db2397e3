"""Prometheus metrics: what the daemon did, counted as it happens, and what it holds now,
read when scraped.

```
EventBus ──sink──▶ Metrics.observe          executions, tool calls (counters, histograms)
dispatch, Connection ──▶ count_request      RPC requests by method and error code
scrape ──▶ Metrics.exposition ──▶ _State    gauges from snapshots: admission, pools, ...
```

Each daemon owns its `CollectorRegistry`; nothing here touches prometheus_client's
global one, so several daemons can share a process. Every label value comes from a
bounded set: methods from the method table (else `unknown`), error codes from the error
hierarchy (else `other`), executors, languages and upstreams from what the daemon runs.
A client cannot mint a label value. This module knows nothing of HTTP
(`metrics_endpoint` serves the text); docs/metrics.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Container, Iterator, Sized
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from conduit.core.errors import RpcError
from conduit.core.version import VERSION
from conduit.daemon.events import BusEvent, EventType
from conduit.daemon.records import ExecutionRecord
from conduit.gateway.model import UpstreamState

if TYPE_CHECKING:
    from conduit.daemon.auth import Authenticator
    from conduit.daemon.events import EventBus
    from conduit.daemon.executions import Executions
    from conduit.daemon.limits import Admission
    from conduit.gateway.catalogue import Catalogue

__all__ = ["CONTENT_TYPE", "Metrics"]

# The classic text format every Prometheus version reads.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# 1 ms (a warm Wasmtime run) to 60 s (past the default 30 s call and 10 s execution
# timeouts, short of the 300 s maximum, which lands in +Inf).
DURATION_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
# Queue waits are zero until the daemon is saturated, then up to queue_timeout_s (30 s).
QUEUE_BUCKETS_S = (0.0001, 0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0)

# Label values for requests that never named a method, and for names not in the table.
NO_METHOD = "invalid"
UNKNOWN_METHOD = "unknown"
# The `code` label of an error code Conduit does not define (a relayed one, say).
OTHER_CODE = "other"


def _known_codes() -> dict[int, str]:
    codes: dict[int, str] = {RpcError.code: str(RpcError.code)}
    pending = list(RpcError.__subclasses__())
    while pending:
        klass = pending.pop()
        codes[klass.code] = str(klass.code)
        pending += klass.__subclasses__()
    return codes


_CODE_LABELS = _known_codes()

M = TypeVar("M")


class _Children(Generic[M]):
    """A labelled metric's children, cached by label values: `labels()` takes a lock and
    validates every call, which the per-execution path should not pay for."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class Transported(Protocol):
    """An open connection, as the metrics count it."""

    transport: str


class Audited(Protocol):
    """The audit store, as the metrics read it."""

    def statistics(self) -> Any: ...


@dataclass(frozen=True)
class GaugeSources:
    """What a scrape reads the daemon's gauges from: its own live state, not copies."""

    connections: Collection[Transported]
    auth: Authenticator
    events: EventBus
    admission: Admission
    executions: Executions
    catalogue: Catalogue
    # The live sessions (`Sessions`): only their number is read.
    sessions: Sized = ()
    # The audit store (`AuditStore`), if there is one.
    audit: Audited | None = None


class Metrics:
    """One daemon's metrics. `observe` is its event sink; `exposition()` is a scrape.

    `methods` are the method names it counts by name (any other is `unknown`); the
    rest is what a scrape reads its gauges from.
    """

    def __init__(self, methods: Container[str], sources: GaugeSources) -> None:
        self._methods = methods
        self.registry = CollectorRegistry()
        registry = self.registry
        self._executions: _Children[Counter] = _Children(
            Counter(
                "conduit_executions",
                "Executions that ended, by executor, language and status "
                "(ok, error, timeout, memory_limit, output_limit, tool_limit, cancelled, "
                "crashed).",
                ["executor", "language", "status"],
                registry=registry,
            )
        )
        self._durations: _Children[Histogram] = _Children(
            Histogram(
                "conduit_execution_duration_seconds",
                "Wall time of ended executions, from the sandbox's start to its end, "
                "queue wait excluded.",
                ["executor", "language"],
                buckets=DURATION_BUCKETS_S,
                registry=registry,
            )
        )
        self._queue_wait = Histogram(
            "conduit_execution_queue_wait_seconds",
            "Time executions waited for an execution slot before they started.",
            buckets=QUEUE_BUCKETS_S,
            registry=registry,
        )
        self._tool_calls: _Children[Counter] = _Children(
            Counter(
                "conduit_tool_calls",
                "Tool calls, by upstream and outcome: ok, error (the tool answered with "
                "an error), or why the daemon refused or failed it (forbidden, not_found, "
                "invalid_params, upstream_error, ...).",
                ["upstream", "outcome"],
                registry=registry,
            )
        )
        self._tool_durations: _Children[Histogram] = _Children(
            Histogram(
                "conduit_tool_call_duration_seconds",
                "Time tool calls took, by upstream, refused calls included.",
                ["upstream"],
                buckets=DURATION_BUCKETS_S,
                registry=registry,
            )
        )
        self._requests: _Children[Counter] = _Children(
            Counter(
                "conduit_rpc_requests",
                "JSON-RPC requests, by method and outcome: code is ok, the JSON-RPC "
                "error code, or cancelled. Unknown methods count as method=unknown, "
                "messages naming no method as method=invalid.",
                ["method", "code"],
                registry=registry,
            )
        )
        registry.register(_State(sources))
        # CPU, memory, file descriptors and start time of the daemon's process.
        ProcessCollector(registry=registry)

    def observe(self, event: BusEvent) -> None:
        """The event sink: count an ended execution or a tool call (microseconds)."""
        if event.record is not None:
            self._observe_execution(event.record)
        elif event.type is EventType.TOOL_CALLED:
            data = event.data
            upstream = data["upstream"]
            self._tool_calls(upstream, data["outcome"]).inc()
            self._tool_durations(upstream).observe(data["duration_ms"] / 1000)

    def _observe_execution(self, record: ExecutionRecord) -> None:
        self._executions(record.executor, record.language, record.status).inc()
        self._durations(record.executor, record.language).observe(record.duration_ms / 1000)
        self._queue_wait.observe(record.queue_ms / 1000)

    def count_request(self, method: str | None, outcome: int | str) -> None:
        """Count one request: `method` as named (None: the message named none), and its
        `outcome`, an `RpcError` code or the dispatcher's `ANSWERED` or `CANCELLED`."""
        if method is None:
            method = NO_METHOD
        elif method not in self._methods:
            method = UNKNOWN_METHOD
        code = outcome if isinstance(outcome, str) else _CODE_LABELS.get(outcome, OTHER_CODE)
        self._requests(method, code).inc()

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format (`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class _State:
    """Gauges and totals the daemon already keeps, read from its snapshots when scraped."""

    def __init__(self, sources: GaugeSources) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        yield _gauge(
            "conduit_build_info", "Always 1; the version is in its label.", 1, version=VERSION
        )
        yield from self._execution_gauges()
        yield from self._client_gauges()
        yield from self._upstream_gauges()
        yield from self._executor_gauges()
        yield from self._audit_gauges()

    def _audit_gauges(self) -> Iterator[Metric]:
        if self._sources.audit is None:
            return
        stats = self._sources.audit.statistics()
        yield _gauge(
            "conduit_audit_records_waiting",
            "Audit records in the buffer, not yet written.",
            stats.waiting,
        )
        for name, value, help_text in (
            ("dropped", stats.dropped, "Audit records dropped: the buffer was full."),
            ("lost", stats.lost, "Audit records no row could hold."),
            (
                "unconfirmed",
                stats.unconfirmed,
                "Answers sent before their audit record committed: the store was too slow.",
            ),
        ):
            yield CounterMetricFamily(f"conduit_audit_records_{name}", help_text, value=value)

    def _client_gauges(self) -> Iterator[Metric]:
        connections = _family(
            GaugeMetricFamily,
            "conduit_connections",
            "Open connections, by transport (sandbox: warm and running workers' own).",
            "transport",
        )
        by_transport = dict.fromkeys(("unix", "tcp", "sandbox"), 0)
        for connection in self._sources.connections:
            by_transport[connection.transport] = by_transport.get(connection.transport, 0) + 1
        for transport, count in sorted(by_transport.items()):
            connections.add_metric([transport], count)
        yield connections
        yield _gauge(
            "conduit_session_tokens",
            "Session tokens valid now: one per running execution.",
            self._sources.auth.live_sessions(),
        )
        yield _gauge(
            "conduit_event_subscribers",
            "Event subscriptions open now.",
            self._sources.events.subscribers,
        )
        yield CounterMetricFamily(
            "conduit_auth_failures",
            "Tokens presented that were not valid.",
            value=self._sources.auth.failures,
        )

    def _execution_gauges(self) -> Iterator[Metric]:
        admission = self._sources.admission.statistics()
        yield _gauge("conduit_executions_active", "Executions running now.", admission.running)
        yield _gauge(
            "conduit_executions_queued",
            "Executions waiting for a slot now.",
            admission.waiting,
        )
        yield _gauge(
            "conduit_execution_slots",
            "Executions that may run at once (limits.max_concurrent_executions).",
            admission.capacity,
        )
        yield _gauge(
            "conduit_execution_queue_size",
            "Executions that may wait for a slot (limits.queue_size).",
            admission.queue_size,
        )
        yield _gauge(
            "conduit_sessions",
            "Sessions live now (sessions/create), each holding a sandbox.",
            len(self._sources.sessions),
        )
        yield _gauge(
            "conduit_draining",
            "1 while the daemon is shutting down and refusing new executions.",
            int(self._sources.executions.draining),
        )

    def _upstream_gauges(self) -> Iterator[Metric]:
        up = _family(
            GaugeMetricFamily,
            "conduit_upstream_up",
            "1 if the upstream is ready, else 0.",
            "upstream",
        )
        tools = _family(
            GaugeMetricFamily, "conduit_upstream_tools", "Tools the upstream offers.", "upstream"
        )
        restarts = _family(
            CounterMetricFamily,
            "conduit_upstream_restarts",
            "Times the upstream was restarted or reconnected.",
            "upstream",
        )
        for status in self._sources.catalogue.statuses():
            up.add_metric([status.name], int(status.state is UpstreamState.READY))
            tools.add_metric([status.name], status.tools)
            restarts.add_metric([status.name], status.restarts)
        yield from (up, tools, restarts)

    def _executor_gauges(self) -> Iterator[Metric]:
        available = _family(
            GaugeMetricFamily,
            "conduit_executor_available",
            "1 if the executor can run programs now, else 0 (executors/list says why).",
            "executor",
        )
        workers = GaugeMetricFamily(
            "conduit_pool_workers",
            "Warm-pool workers, by state: idle (ready for a program), starting, in_use.",
            labels=["executor", "state"],
        )
        target = _family(
            GaugeMetricFamily,
            "conduit_pool_target_workers",
            "Idle workers the pool aims to keep.",
            "executor",
        )
        refill = _family(
            SummaryMetricFamily,
            "conduit_pool_refill_seconds",
            "Time warm-pool workers took to start, from spawn to ready.",
            "executor",
        )
        last_refill = _family(
            GaugeMetricFamily,
            "conduit_pool_last_refill_seconds",
            "Time the latest warm-pool worker took to start.",
            "executor",
        )
        counters: dict[str, CounterMetricFamily] = {
            key: _family(CounterMetricFamily, name, help_text, "executor")
            for key, (name, help_text) in _POOL_COUNTERS.items()
        }
        for info in self._sources.executions.registry.infos(configured_only=True):
            available.add_metric([info.name], int(info.available))
            pool = info.pool or {}
            if "idle" not in pool:
                continue  # no warm pool (Wasmtime instantiates per execution)
            for state in ("idle", "starting", "in_use"):
                workers.add_metric([info.name, state], pool[state])
            target.add_metric([info.name], pool["size"])
            refill.add_metric([info.name], pool["refills"], pool["refill_seconds_total"])
            if pool["last_refill_s"] is not None:
                last_refill.add_metric([info.name], pool["last_refill_s"])
            for key, family in counters.items():
                family.add_metric([info.name], pool[key])
        yield from (available, workers, target, refill, last_refill, *counters.values())


# `PoolStatistics` counters exported per executor: field -> (metric name, help).
_POOL_COUNTERS = {
    "cold_starts": (
        "conduit_pool_cold_starts",
        "Executions that found no idle worker.",
    ),
    "waited_for_start": (
        "conduit_pool_waited_for_start",
        "Executions that found no idle worker and took one whose start was under way.",
    ),
    "deaths": ("conduit_pool_worker_deaths", "Idle workers that exited on their own."),
    "start_failures": ("conduit_pool_start_failures", "Worker starts that failed."),
}


def _gauge(name: str, help_text: str, value: float, **labels: str) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


F = TypeVar("F", bound=Metric)


def _family(kind: Callable[..., F], name: str, help_text: str, label: str) -> F:
    return kind(name, help_text, labels=[label])
