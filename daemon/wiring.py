"""Building the runtime parts the configuration describes: executors and the gateway.

Constructors here start nothing; the daemon runs what they build in its own nursery.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conduit.daemon.config import Config
from conduit.executors.base import CallbackAddress
from conduit.executors.registry import ExecutorRegistry
from conduit.gateway.catalogue import Catalogue, LocalTool, LocalUpstream
from conduit.gateway.credentials import CredentialsAuth, load_credentials
from conduit.gateway.fetch import FETCH_TOOL, Fetcher
from conduit.gateway.settings import HttpUpstreamSettings, StdioUpstreamSettings
from conduit.gateway.ssrf import SsrfGuard
from conduit.gateway.upstream import Upstream

if TYPE_CHECKING:
    from conduit.executors.deno import DenoExecutor
    from conduit.executors.pyodide import PyodideExecutor

__all__ = ["build_catalogue", "build_registry", "build_upstream", "language_defaults"]


def language_defaults(config: Config) -> dict[str, str]:
    """Which executor runs each language, as `[executors]` configures it."""
    executors = config.executors
    return {
        "python": executors.python,
        "typescript": executors.typescript,
        "javascript": executors.javascript,
    }


def build_registry(config: Config, callback: CallbackAddress | None) -> ExecutorRegistry:
    """The executors this configuration enables, with their language defaults.

    `callback` is where sandboxes reach the daemon for tool calls.
    """
    executors = []
    if config.executors.deno.enabled:
        from conduit.executors.deno import DenoExecutor

        # Its workers' file size cap until a job's own disk limit replaces it.
        max_disk_mb = config.limits.maxima.disk_mb
        executors.append(
            _deno_hosted(
                DenoExecutor,
                config,
                callback,
                max_disk_mb=max_disk_mb,
                max_pool_size=config.executors.deno.max_pool_size,
            )
        )
    wasm_cache = Path(config.server.state_dir) / "wasm"
    wasm_python = config.executors.wasm_python
    if wasm_python.enabled:
        from conduit.executors.wasm_python import WasmPythonExecutor

        executors.append(
            WasmPythonExecutor(
                cache_dir=wasm_cache, fuel=wasm_python.fuel or None, packages=wasm_python.packages
            )
        )
    wasm_js = config.executors.wasm_js
    if wasm_js.enabled:
        from conduit.executors.wasm_js import WasmJsExecutor

        move_after_s = wasm_js.move_after_cpu_ms / 1000 or None
        executors.append(
            WasmJsExecutor(
                cache_dir=wasm_cache, fuel=wasm_js.fuel or None, move_after_cpu_s=move_after_s
            )
        )
    if config.executors.pyodide.enabled:
        from conduit.executors.pyodide import PyodideExecutor

        packages = config.executors.pyodide.packages
        executors.append(_deno_hosted(PyodideExecutor, config, callback, packages=packages))
    return ExecutorRegistry(executors, language_defaults(config))


def _deno_hosted(
    kind: type[DenoExecutor] | type[PyodideExecutor],
    config: Config,
    callback: CallbackAddress | None,
    **options: Any,
) -> DenoExecutor | PyodideExecutor:
    """A Deno-process executor (deno, pyodide) from its `[executors.<name>]` section
    and the operating-system sandbox's settings, with `options` of its own kind."""
    section = getattr(config.executors, kind.name)
    return kind(
        binary=section.binary or None,
        pool_size=section.pool_size,
        max_sessions=section.max_sessions,
        memory_mb=config.limits.defaults.memory_mb,
        cache_dir=Path(config.server.state_dir) / kind.name,
        callback=callback,
        os_sandbox=config.executors.os_sandbox,
        bwrap=config.executors.bwrap or None,
        **options,
    )


def build_upstream(settings: StdioUpstreamSettings | HttpUpstreamSettings) -> Upstream:
    """The client for one `[[upstreams]]` entry (HTTP ones behind the SSRF guard)."""
    if isinstance(settings, StdioUpstreamSettings):
        from conduit.gateway.stdio_upstream import StdioUpstream

        return StdioUpstream(settings)
    from conduit.gateway.http_upstream import HttpUpstream

    guard = SsrfGuard(trusted=settings.trusted)
    factory = guard.open_mcp_client
    if settings.auth is not None:
        credentials = load_credentials(settings.auth, upstream=settings.name, guard=guard)
        factory = partial(guard.open_mcp_client, auth=CredentialsAuth(credentials))
    return HttpUpstream(settings, http_client_factory=factory)


def build_catalogue(config: Config) -> Catalogue:
    """The catalogue of every enabled upstream, plus `fetch` when it is enabled."""
    enabled = [settings for settings in config.upstreams if settings.enabled]
    upstreams: list[Upstream] = [build_upstream(settings) for settings in enabled]
    if config.gateway.fetch.enabled:
        # Its refusals are GatewayErrors, which LocalUpstream answers as tool errors.
        fetcher = Fetcher(config.gateway.fetch)
        upstreams.append(LocalUpstream("fetch", [LocalTool.from_raw(FETCH_TOOL, fetcher.fetch)]))
    return Catalogue(
        upstreams,
        strict=config.gateway.strict,
        strict_upstreams={s.name: s.strict for s in enabled if s.strict is not None},
    )
