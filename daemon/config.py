"""The daemon's configuration: one TOML file, validated, with `${VAR:-default}` substitution.

Precedence is file < environment < command line. `load_config` is the only way in;
every failure is a `ConfigError` whose one-line message names the key and says what to
do. This module knows nothing about sockets or executors beyond their settings.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from conduit.core.addresses import (
    default_socket_path,
    default_state_dir,
    is_loopback,
    parse_tcp_address,
)
from conduit.core.errors import ConfigError
from conduit.core.requirements import parse_requirement
from conduit.gateway.fetch_config import FetchConfig
from conduit.gateway.settings import UpstreamList

__all__ = [
    "AuditConfig",
    "AuthConfig",
    "ClientToken",
    "Config",
    "DenoConfig",
    "EventsConfig",
    "ExecutorPolicies",
    "ExecutorsConfig",
    "GatewayConfig",
    "JavaScriptPolicy",
    "LimitValues",
    "LimitsConfig",
    "McpHttpConfig",
    "MetricsConfig",
    "PolicyConfig",
    "PyodideConfig",
    "PythonPolicy",
    "ServerConfig",
    "SessionsConfig",
    "WasmConfig",
    "WasmPythonConfig",
    "default_socket_path",
    "default_state_dir",
    "load_config",
    "parse_tcp_address",
]

SCOPES = ("execute", "executions", "tools", "admin")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Section):
    socket: str = Field(default_factory=default_socket_path)
    tcp: str = ""
    allow_remote_tcp: bool = False
    # Made absolute where it is read: the sandboxes' directories under it are named on
    # their runtimes' command lines, which take no relative path.
    state_dir: Annotated[str, AfterValidator(os.path.abspath)] = Field(
        default_factory=default_state_dir
    )
    # 8 MiB holds any sane program plus inputs; larger lines are refused, not buffered.
    max_message_bytes: Annotated[int, Field(ge=1024, le=256 * 1024 * 1024)] = 8 * 1024 * 1024
    # Enough for an agent pipelining tool discovery and a few executions at once.
    max_in_flight_per_connection: Annotated[int, Field(ge=1, le=10_000)] = 64
    # Per client listener (the Unix socket and TCP each have this many), so a flood on
    # one never locks the other out; the daemon's own uid has a few more on Unix.
    max_connections: Annotated[int, Field(ge=1, le=100_000)] = 1024
    # The sandboxes' callback socket: at most one per running Deno or Pyodide program.
    max_sandbox_connections: Annotated[int, Field(ge=1, le=100_000)] = 1024
    # Connections from one source IP (TCP) or uid (Unix) that have not authenticated
    # yet. An honest client authenticates within milliseconds of connecting, so even
    # a burst of agents starting at once stays well under this.
    max_unauthenticated_per_peer: Annotated[int, Field(ge=1, le=100_000)] = 64
    # Time from accept to a valid token. Unix peers let in by their uid are
    # authenticated at accept; a client needs one round trip, so 5 s spares a loaded host.
    auth_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 5.0
    # Close a connection with nothing in flight that has sent nothing for this long
    # (0 = never). Off by default: `conduit mcp --connect` holds one connection for as
    # long as its MCP client runs, idle for hours at a time.
    idle_timeout_s: Annotated[float, Field(ge=0, le=7 * 86_400)] = 0.0
    # systemd's default stop timeout is 90 s; 30 s leaves room for the kill that follows.
    grace_period_s: Annotated[float, Field(ge=0, le=3600)] = 30.0
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("tcp")
    @classmethod
    def _check_tcp(cls, value: str) -> str:
        if value:
            parse_tcp_address(value)
        return value


class ClientToken(_Section):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    scopes: tuple[Literal["execute", "executions", "tools", "admin"], ...] = (
        "execute",
        "executions",
        "tools",
    )
    # Tools this client (and the programs it runs) may call: *, ns.*, ns.tool.
    allowed_tools: tuple[str, ...] = ("*",)


class AuthConfig(_Section):
    token: str = ""
    token_file: str = ""
    peer_credentials: bool = True
    peer_uids: tuple[int, ...] = ()
    # Five wrong tokens in a row is a script guessing, not a person mistyping.
    max_failures_per_connection: Annotated[int, Field(ge=1, le=1000)] = 5
    clients: tuple[ClientToken, ...] = ()


class LimitValues(_Section):
    timeout_ms: Annotated[int, Field(ge=1)] = 10_000
    memory_mb: Annotated[int, Field(ge=16)] = 128
    output_bytes: Annotated[int, Field(ge=0)] = 1_048_576
    output_lines: Annotated[int, Field(ge=0)] = 10_000
    tool_calls: Annotated[int, Field(ge=0)] = 100
    result_bytes: Annotated[int, Field(ge=0)] = 1_048_576
    disk_mb: Annotated[int, Field(ge=1)] = 64


def _maxima() -> LimitValues:
    return LimitValues(
        timeout_ms=300_000,
        memory_mb=2048,
        output_bytes=16 * 1_048_576,
        output_lines=1_000_000,
        tool_calls=10_000,
        result_bytes=16 * 1_048_576,
        disk_mb=1024,
    )


class LimitsConfig(_Section):
    # Executions under way at once, waits on tools included: computing is bounded apart,
    # by the executors' CPU slots (one per core). Sixteen cover a tool-heavy agent's
    # bursts on a two-core machine; each holds a sandbox (~10 MB for wasm-python, ~37
    # for a Deno process), so sixteen waiting at once hold ~0.6 GB at most.
    max_concurrent_executions: Annotated[int, Field(ge=1, le=10_000)] = 16
    queue_size: Annotated[int, Field(ge=0, le=100_000)] = 64
    queue_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    # 0 turns the per-principal rate limit off; tool calls from sandboxes never count.
    executions_per_minute: Annotated[float, Field(ge=0)] = 0.0
    burst: Annotated[int, Field(ge=1)] = 10
    max_code_bytes: Annotated[int, Field(ge=1, le=64 * 1024 * 1024)] = 1_048_576
    defaults: LimitValues = LimitValues()
    maxima: LimitValues = Field(default_factory=_maxima)


class DenoConfig(_Section):
    enabled: bool = True
    binary: str = ""
    # Two idle workers cover a burst of two on a two-core machine; each costs ~34 MB.
    pool_size: Annotated[int, Field(ge=0, le=64)] = 2
    # While requests find no idle worker, the pool aims for one more each time, up to
    # this many (and only while over 1 GB of memory is available); a minute without
    # such a request takes one back, down to `pool_size`.
    max_pool_size: Annotated[int, Field(ge=0, le=64)] = 8
    # Sessions (sessions/create) on this executor at once: each holds a Deno process of
    # its own (~40 MB and up, as its program's state grows, to its memory limit).
    max_sessions: Annotated[int, Field(ge=0, le=1024)] = 16


class WasmConfig(_Section):
    enabled: bool = True
    # An instruction budget per execution on top of the wall timeout (0 = none);
    # deterministic, unlike time, at ~10% cost in speed.
    fuel: Annotated[int, Field(ge=0)] = 0


# A pure-Python package for the Python sandboxes (`sympy==1.14.0`): a name, extras and
# version specifiers only, since it ends up on pip's command line (see
# `executors.packages`); kept in its canonical form.
_Requirement = Annotated[str, AfterValidator(parse_requirement)]


class WasmPythonConfig(WasmConfig):
    # Resolved with pip and built into the component once per list (docs/packages.md).
    packages: tuple[_Requirement, ...] = ()


class WasmJsConfig(WasmConfig):
    # A program sent here with no executor named that computes this long (CPU time),
    # having had no tool call answered and streamed nothing, runs again from the start
    # on deno, whose compiled code is several times faster (0 = never).
    move_after_cpu_ms: Annotated[int, Field(ge=0, le=3_600_000)] = 50


class PyodideConfig(_Section):
    # Off by default: each worker process holds ~0.25 GB; wasm-python runs Python's
    # default. Turn it on for programs that need the whole standard library or
    # top-level `await`.
    enabled: bool = False
    binary: str = ""
    # Worker processes kept, each running programs one at a time, every one in a fresh
    # interpreter, and making the next interpreter (~0.15 s of CPU) after each: two keep
    # up with back-to-back requests on two cores. More are started (up to 8) while
    # programs wait on tools; 0 starts one per program.
    pool_size: Annotated[int, Field(ge=0, le=16)] = 2
    # Sessions on this executor at once: each holds a worker process of its own
    # (~0.25 GB), so few.
    max_sessions: Annotated[int, Field(ge=0, le=256)] = 4
    # As for wasm_python: resolved once, zipped into the interpreters' sys.path.
    packages: tuple[_Requirement, ...] = ()


class ExecutorsConfig(_Section):
    python: str = "wasm-python"
    # TypeScript whose types erase; the rest goes to deno (`wasm_js.typescript_lacks`).
    typescript: str = "wasm-js"
    javascript: str = "wasm-js"
    # Deno's and Pyodide's worker processes run inside bubblewrap (namespaces, an empty
    # read-only file system, seccomp: executors/os_sandbox.py). "required": where the
    # host cannot make that sandbox, those executors are unavailable and say why;
    # "optional": they then run under Deno's permissions alone, and say so at start.
    os_sandbox: Literal["required", "optional"] = "required"
    # The bubblewrap binary; "" = `bwrap` on PATH.
    bwrap: str = ""
    deno: DenoConfig = DenoConfig()
    wasm_python: WasmPythonConfig = WasmPythonConfig()
    wasm_js: WasmJsConfig = WasmJsConfig()
    pyodide: PyodideConfig = PyodideConfig()


class GatewayConfig(_Section):
    # Validate every tool call's arguments against the tool's schema, and refuse tools
    # without one; an upstream's own `strict` overrides this.
    strict: bool = False
    # The longest a tool call may take unless its upstream says otherwise.
    call_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 30.0
    fetch: FetchConfig = FetchConfig()


# The URL schemes that choose PostgreSQL for the audit store.
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class AuditConfig(_Section):
    enabled: bool = True
    # "" = <state_dir>/audit.sqlite3; a relative path is taken from the state directory.
    path: str = ""
    # A PostgreSQL URL (postgresql://user:password@host/db) instead of the SQLite file:
    # one store that several daemons share. Needs `pip install 'conduit[postgres]'`.
    url: str = ""
    # The name this daemon's executions carry in a shared store; "" = the host's name
    # and a digest of the state directory, stable across restarts.
    daemon_id: Annotated[str, Field(max_length=128)] = ""
    # A month answers "what ran last week, and how often did it fail" with room to spare.
    retention_days: Annotated[float, Field(gt=0, le=36_500)] = 30.0
    # 256 MiB holds about half a million executions (~500 bytes each with its heads).
    max_bytes: Annotated[int, Field(ge=64 * 1024)] = 256 * 1024 * 1024
    # Ten minutes: the store outgrows max_bytes by at most what ten minutes write.
    purge_interval_s: Annotated[float, Field(gt=0, le=86_400)] = 600.0
    # Whether an answer goes once its record is in the journal beside the state
    # (`audit.journal`) rather than once it is committed; None = with SQLite only. A
    # store other daemons read (PostgreSQL, a shared SQLite file) wants false: there an
    # answer's record is visible to every daemon's reads by the time it arrives.
    journal: bool | None = None

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if value and not value.startswith(POSTGRES_SCHEMES):
            raise ValueError("must be a postgresql:// URL (leave it out for SQLite at path)")
        return value

    @model_validator(mode="after")
    def _path_or_url(self) -> AuditConfig:
        if self.path and self.url:
            raise ValueError("give audit.path (SQLite) or audit.url (PostgreSQL), not both")
        return self

    def uses_journal(self) -> bool:
        """Whether answers wait for the journal rather than the commit (`journal`)."""
        return self.journal if self.journal is not None else not self.url

    def database_path(self, state_dir: str) -> str:
        """Where the SQLite store lives: `path`, resolved against `state_dir`."""
        return str(Path(state_dir) / (self.path or "audit.sqlite3"))

    def daemon_name(self, state_dir: str) -> str:
        """`daemon_id`, or the default: host name and a digest of the state directory."""
        if self.daemon_id:
            return self.daemon_id
        where = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()[:8]
        return f"{socket.gethostname()}-{where}"


class MetricsConfig(_Section):
    enabled: bool = True
    # Beside the RPC example port 7780, and clear of 9464, the OpenTelemetry Prometheus
    # exporter's default, which other services on a host commonly hold. Port 0 picks one.
    listen: str = "127.0.0.1:7781"
    # The endpoint has no authentication: off loopback only on explicit request.
    allow_remote: bool = False

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        parse_tcp_address(value)
        return value


class McpHttpConfig(_Section):
    """MCP over streamable HTTP (daemon/mcp_http.py), beside the NDJSON listeners."""

    # HOST:PORT on loopback; "" (the default) serves no HTTP. Port 0 picks one.
    listen: str = ""
    # The path the endpoint answers on; every other path is 404.
    path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9._~/-]*$", max_length=256)] = "/mcp"
    # Browser origins allowed besides loopback ones (`http://localhost:3000` and the
    # like always are): exact `scheme://host[:port]`. A request with any other Origin
    # is refused (403), against DNS rebinding.
    allowed_origins: tuple[Annotated[str, Field(pattern=r"^https?://[^/\s]+$")], ...] = ()
    # HTTP connections open at once; agents keep one or two each.
    max_connections: Annotated[int, Field(ge=1, le=100_000)] = 256
    # MCP sessions: an MCP client holds one for as long as it runs. Past the cap, a
    # principal's new session replaces its least recently used idle one.
    max_sessions_per_principal: Annotated[int, Field(ge=1, le=10_000)] = 16
    max_sessions: Annotated[int, Field(ge=1, le=100_000)] = 256
    # A client gone without DELETE leaves its session; an hour idle ends it (a client
    # that comes back gets 404 and initializes again, as the specification says).
    session_idle_timeout_s: Annotated[float, Field(gt=0, le=7 * 86_400)] = 3600.0

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        if value:
            parse_tcp_address(value)
        return value


# A dotted Python module path (`os`, `os.path`) and an identifier of either language.
_ModuleName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]
_Identifier = Annotated[str, Field(pattern=r"^[A-Za-z_$][A-Za-z0-9_$]*$")]
_ImportPattern = Annotated[str, Field(min_length=1, max_length=1024)]


class PythonPolicy(_Section):
    """Python rules, read from the program's syntax tree (see docs/security.md)."""

    # `import m`, `from m import x`, `__import__("m")`, `importlib.import_module("m")`;
    # forbidding `m` forbids its submodules too.
    forbidden_modules: tuple[_ModuleName, ...] = ()
    # Names and attributes, wherever they appear, and as `getattr(x, "name")`.
    forbidden_names: tuple[_Identifier, ...] = ()
    # Builtins by their bare name or as `builtins.name`; `re.compile` is not `compile`.
    forbidden_builtins: tuple[_Identifier, ...] = ()


class JavaScriptPolicy(_Section):
    """JavaScript and TypeScript rules, read from the program's tokens."""

    # Module specifiers, exact or glob (`node:*`): static and dynamic `import`,
    # `export … from`, `require`.
    forbidden_imports: tuple[_ImportPattern, ...] = ()
    # Global names (`Deno`, `eval`), also as `globalThis.name`; never a property or key.
    forbidden_globals: tuple[_Identifier, ...] = ()


class ExecutorPolicies(_Section):
    """Each executor's rules, added to its language's rules."""

    deno: JavaScriptPolicy = JavaScriptPolicy()
    wasm_js: JavaScriptPolicy = JavaScriptPolicy()
    wasm_python: PythonPolicy = PythonPolicy()
    # On Pyodide these reach the Deno host's JavaScript (`js.Deno`, `run_js`): Deno's
    # permissions still bound what that can do, and no tool needs them.
    pyodide: PythonPolicy = PythonPolicy(forbidden_modules=("js", "pyodide_js", "pyodide.code"))


class PolicyConfig(_Section):
    """Checks on the program's text before it runs: a filter in front of the sandbox."""

    enabled: bool = True
    # Shape limits for every language (0 = off). `limits.max_code_bytes` bounds size.
    max_lines: Annotated[int, Field(ge=0)] = 0
    max_line_chars: Annotated[int, Field(ge=0)] = 0
    max_nesting_depth: Annotated[int, Field(ge=0)] = 0
    # A program the rules cannot read (a syntax error) runs, and its sandbox reports the
    # error; true refuses it instead, whenever a rule would have read it.
    refuse_unparsable: bool = False
    python: PythonPolicy = PythonPolicy()
    javascript: JavaScriptPolicy = JavaScriptPolicy()
    executors: ExecutorPolicies = ExecutorPolicies()


class SessionsConfig(_Section):
    # A session holds a sandbox (~10 MB for wasm-python, ~40 MB for a Deno process)
    # while it lives: eight per client covers an agent's parallel notebooks; the
    # daemon's total bounds what all of them hold together.
    max_per_principal: Annotated[int, Field(ge=0, le=10_000)] = 8
    max_total: Annotated[int, Field(ge=0, le=100_000)] = 64
    # Ten minutes: an agent thinking between steps, not a session forgotten for hours.
    idle_timeout_s: Annotated[float, Field(gt=0, le=7 * 86_400)] = 600.0
    max_idle_timeout_s: Annotated[float, Field(gt=0, le=7 * 86_400)] = 3600.0


class EventsConfig(_Section):
    # Events one subscriber may have waiting before it is dropped as too slow: a
    # second or more of a busy daemon's events, a few hundred KiB at most per subscriber.
    subscriber_buffer: Annotated[int, Field(ge=1, le=1_000_000)] = 1024


class Config(_Section):
    server: ServerConfig = Field(default_factory=ServerConfig)
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    executors: ExecutorsConfig = ExecutorsConfig()
    gateway: GatewayConfig = GatewayConfig()
    events: EventsConfig = EventsConfig()
    sessions: SessionsConfig = SessionsConfig()
    metrics: MetricsConfig = MetricsConfig()
    mcp_http: McpHttpConfig = McpHttpConfig()
    policy: PolicyConfig = PolicyConfig()
    upstreams: UpstreamList = ()
    audit: AuditConfig = AuditConfig()
    source: str = ""  # the file this came from, for messages and reloads


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def substitute(value: Any, environ: dict[str, str], key: str = "") -> Any:
    """Replace `${VAR}` and `${VAR:-default}` in every string of a parsed TOML tree."""
    if isinstance(value, dict):
        return {k: substitute(v, environ, f"{key}.{k}" if key else k) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, environ, key) for v in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        found = environ.get(name)
        if found:
            return found
        if default is not None:
            return default
        raise ConfigError(
            f"config key {key} uses ${{{name}}}, which is not set: "
            f"set {name} or write ${{{name}:-default}}"
        )

    return _VAR.sub(replace, value)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:  # unreadable, a directory: on SIGHUP this must not stop the daemon
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = value


_ENV_KEYS = {
    "CONDUIT_SOCKET": "server.socket",
    "CONDUIT_STATE_DIR": "server.state_dir",
    "CONDUIT_TOKEN": "auth.token",
}


def _describe(error: ValidationError, source: str) -> str:
    first = error.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    where = f" in {source}" if source else ""
    if first["type"] == "extra_forbidden":
        return f"unknown config key {key}{where}: remove it or check its spelling"
    return f"bad value for config key {key}{where}: {first['msg']}"


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: dict[str, str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> Config:
    """Read, substitute, layer and validate the configuration.

    `path` (else `$CONDUIT_CONFIG`, else built-in defaults) < environment variables
    (`CONDUIT_SOCKET`, `CONDUIT_STATE_DIR`, `CONDUIT_TOKEN`) < `overrides` (dotted keys,
    from the command line). Raises `ConfigError` with one line naming the key.
    """
    env = dict(os.environ if environ is None else environ)
    source = str(path or env.get("CONDUIT_CONFIG") or "")
    tree: dict[str, Any] = substitute(_read_file(Path(source)), env) if source else {}
    for variable, dotted in _ENV_KEYS.items():
        if env.get(variable):
            _set(tree, dotted, env[variable])
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set(tree, dotted, value)
    tree["source"] = source
    try:
        config = Config.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None
    _check_consistency(config)
    return config


def _check_consistency(config: Config) -> None:
    if config.server.tcp:
        host, _ = parse_tcp_address(config.server.tcp)
        if not is_loopback(host) and not config.server.allow_remote_tcp:
            raise ConfigError(
                f"config key server.tcp = {config.server.tcp!r} is not a loopback address: "
                "use 127.0.0.1 or [::1], or set server.allow_remote_tcp = true"
            )
    if config.metrics.enabled:
        host, _ = parse_tcp_address(config.metrics.listen)
        if not is_loopback(host) and not config.metrics.allow_remote:
            raise ConfigError(
                f"config key metrics.listen = {config.metrics.listen!r} is not a loopback "
                "address: use 127.0.0.1 or [::1], or set metrics.allow_remote = true "
                "(the endpoint has no authentication)"
            )
    if config.mcp_http.listen:
        host, _ = parse_tcp_address(config.mcp_http.listen)
        if not is_loopback(host):
            raise ConfigError(
                f"config key mcp_http.listen = {config.mcp_http.listen!r} is not a loopback "
                "address: use 127.0.0.1 or [::1] (MCP over HTTP serves this host only; "
                "remote clients reach it through a tunnel or proxy of their own)"
            )
    for field in LimitValues.model_fields:
        default = getattr(config.limits.defaults, field)
        maximum = getattr(config.limits.maxima, field)
        if default > maximum:
            raise ConfigError(
                f"config key limits.defaults.{field} = {default} exceeds "
                f"limits.maxima.{field} = {maximum}: lower the default or raise the maximum"
            )
    names = [client.name for client in config.auth.clients]
    if len(names) != len(set(names)):
        raise ConfigError("config key auth.clients names a client twice: names must be unique")
