"""Shared by the MCP tests: upstreams to call and configurations to run."""

from __future__ import annotations

from tests.fixtures.mcp_conformance_server import command as conformance_tools
from tests.fixtures.mcp_echo_server import command as echo_command

# The echo fixture as a stdio upstream: tools.echo.* in programs, echo__* on the wire.
ECHO = {
    "name": "echo",
    "transport": "stdio",
    "command": echo_command()[0],
    "args": echo_command()[1:],
}
# For tests about connections and listings alone: no sandbox to start or wait for.
NO_SANDBOXES = {
    "deno": {"enabled": False},
    "wasm_python": {"enabled": False},
    "wasm_js": {"enabled": False},
}
# Long enough that only a cancellation, never the program's own end, explains a stop.
ENDLESS_TIMEOUT_MS = 120_000
# For tests that run only TypeScript: no WebAssembly component to load.
DENO_ONLY = {"wasm_python": {"enabled": False}, "wasm_js": {"enabled": False}}

# The suite's fixed test tools, as the tools-call scenarios call them: by their own names.
CONFORMANCE_TOOLS = {
    "name": "conformance",
    "transport": "stdio",
    "command": conformance_tools()[0],
    "args": conformance_tools()[1:],
    "bare_names": True,
    # Its sampling and elicitation tools ask the client that called them.
    "ask_clients": True,
    # Handshake-era: log messages go to every client, and tools ask their client with
    # server-to-client requests (a 2026-07-28 server asks within its result instead).
    "handshake": "initialize",
}
