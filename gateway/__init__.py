"""The tool gateway: upstream MCP servers as one catalogue of tools programs may call.

Upstreams (stdio processes, streamable-HTTP servers behind an SSRF guard) feed the
`Catalogue`; tools get ids (`<upstream>__<tool>`) and SDK names (`tools.ns.tool`);
`Allowlist`s decide who may call what; `sdk` renders the typed declarations. The
gateway knows nothing of the daemon's sockets, tokens or JSON-RPC: the daemon
translates its `GatewayError`s at one boundary.
"""

# Nothing is imported here: the daemon's configuration reads the gateway's settings
# modules alone, and `conduit` commands must not pay for the MCP SDK and httpx.
__all__: list[str] = []
