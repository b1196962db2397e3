"""The tool gateway: upstream MCP servers as one catalogue of tools programs may call.

Upstreams (stdio processes, streamable-HTTP servers behind an SSRF guard) feed the
`Catalogue`; tools get ids (`<upstream>__<tool>`) and SDK names (`tools.ns.tool`);
`Allowlist`s decide who may call what; `sdk` renders the typed declarations. The
gateway knows nothing of the daemon's sockets, tokens or JSON-RPC: the daemon
translates its `GatewayError`s at one boundary.
"""

from conduit.gateway.allowlist import Allowlist
from conduit.gateway.catalogue import Catalogue, LocalTool, LocalUpstream, error_of, value_of
from conduit.gateway.model import UpstreamState, UpstreamStatus, UpstreamTool
from conduit.gateway.sdk import python_stubs, typescript_declarations
from conduit.gateway.settings import HttpUpstreamSettings, StdioUpstreamSettings
from conduit.gateway.ssrf import DestinationRefused, SsrfGuard
from conduit.gateway.upstream import Upstream

__all__ = [
    "Allowlist",
    "Catalogue",
    "DestinationRefused",
    "HttpUpstreamSettings",
    "LocalTool",
    "LocalUpstream",
    "SsrfGuard",
    "StdioUpstreamSettings",
    "Upstream",
    "UpstreamState",
    "UpstreamStatus",
    "UpstreamTool",
    "error_of",
    "python_stubs",
    "typescript_declarations",
    "value_of",
]
