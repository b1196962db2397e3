"""Shared by the client tests: how to point a client at a test daemon."""

from __future__ import annotations

from typing import Any

# The client tests run JavaScript on wasm-js (a fresh instance costs milliseconds);
# Deno's warm pool would only slow the daemon's start.
NO_DENO = {"executors": {"deno": {"enabled": False}}}


def client_options(info: Any, transport: str) -> dict[str, Any]:
    """`unix_path=` or `tcp=` for a daemon's `ServingInfo`."""
    if transport == "tcp":
        host, port = info.tcp_address
        return {"tcp": f"{host}:{port}"}
    return {"unix_path": info.unix_path}
