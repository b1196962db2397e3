"""An MCP server over stdio that answers at once: one `echo(text)` tool, and nothing
else but the handshake (`initialize`), `tools/list` and `ping`.

Plain blocking reads and writes of one JSON line each, no SDK: a call costs it a few
microseconds, so a tool call's time through the daemon to it is the daemon's own share
plus the two hops of the pipe. The benchmark runs it beside the SDK's echo server,
which spends a few tenths of a millisecond on each call itself.

    python bench/instant_upstream.py
"""

from __future__ import annotations

import json
import sys
from typing import Any

PROTOCOL_VERSION = "2025-06-18"
ECHO_TOOL = {
    "name": "echo",
    "description": "Return the text it is given.",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
}
METHOD_NOT_FOUND = -32601


def answer(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The result of `method`; raises LookupError for one it does not serve."""
    if method == "initialize":
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "instant", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": [ECHO_TOOL]}
    if method == "tools/call" and params.get("name") == "echo":
        arguments = params.get("arguments")
        text = str(arguments.get("text", "")) if isinstance(arguments, dict) else ""
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if method == "ping":
        return {}
    raise LookupError(method)


def main() -> None:
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue  # a blank line, or not JSON: nothing to answer
        if not isinstance(message, dict) or "id" not in message:
            continue  # a notification, or a batch (never sent to it)
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        try:
            params = message.get("params")
            reply["result"] = answer(
                str(message.get("method", "")), params if isinstance(params, dict) else {}
            )
        except LookupError as missing:
            reply["error"] = {"code": METHOD_NOT_FOUND, "message": f"no method {missing}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
