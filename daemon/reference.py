"""The protocol reference, generated from the method table so it cannot drift.

`python -m conduit.daemon.reference > docs/protocol.md` writes it; a test checks the
committed file matches.
"""

from __future__ import annotations

from typing import Any

from conduit.core.errors import RpcError
from conduit.daemon.dispatcher import MethodSpec
from conduit.daemon.methods import method_table
from conduit.daemon.methods.compat import ALIASES

__all__ = ["render_protocol"]

_INTRO = """\
# Conduit protocol reference

Generated from the daemon's method table by `python -m conduit.daemon.reference`; do not
edit by hand.

## Framing

JSON-RPC 2.0, one UTF-8 JSON message per line, the same on every listener (Unix socket,
TCP, systemd sockets). Blank lines are ignored and a trailing `\\r` is dropped.

- A line that is not JSON gets `-32700` with `"id": null`; the connection stays open.
  So does a line that is not valid UTF-8, one with `NaN` or `Infinity`, a number past
  a 64-bit float's range (`1e400`), an integer of more than 4,300 digits or values
  nested about 1,000 deep. Where such a line is a whole object and its `"id"` comes
  early (within its first 4 KiB, after nothing but string or number members, as
  after `"jsonrpc"`), the error carries that id.
- **Lone surrogates are replaced.** A `\\uD800`-`\\uDFFF` escape that is not half of a
  pair is legal JSON but no UTF-8 text can hold it: the daemon reads each one as U+FFFD
  (`\\uFFFD`), and writes U+FFFD for any a program prints, raises or returns. Everything
  the daemon sends is valid UTF-8 JSON: where a `NaN` or `Infinity` would go, it sends
  `null`, as `JSON.stringify` does.
- An `"id"` must be a string, a finite number or null; anything else is `-32600`.
- A line over `server.max_message_bytes` (8 MiB) gets `-32600` with `"id": null`; the
  rest of that line is skipped and the connection stays usable.
- An array is a batch: its replies come back as one array, in any order, without the
  notifications. An empty batch is `-32600`.
- A message without `"id"` is a notification and is never answered, not even on error.
- `"jsonrpc": "2.0"` may be left out (for people typing); any other value is `-32600`.
- Requests on one connection run concurrently and are answered by id, possibly out of
  order. Past `server.max_in_flight_per_connection` requests in flight, as many again
  are read and held for their turn, in order (once the client has authenticated);
  then the daemon stops reading that connection until one starts. A notification to
  the daemon (`notifications/...`) on a line of its own (not in a batch) runs as soon
  as it is read, slot or none, so `notifications/cancelled` stops a running program,
  or a request still held on its own line (answered `-32600`, "request cancelled",
  and never run). While the daemon waits for the client's answer to a question of
  its own (MCP sampling or elicitation), it never stops reading: requests past those
  held are refused with `-32000`, so the answer is never stuck behind them. For a
  client that reads nothing, the daemon holds at most 256 messages and 16 MiB of them
  (one larger message alone), and stops answering until the client reads.
- Authentication: Unix peer credentials (the daemon's uid: every scope), an
  `auth/login` call for the connection, or `"auth": {"bearerToken": "..."}` on any one
  request. TCP callers always need a token.

## Notifications from the daemon

The daemon sends two kinds of notification (no `id`, never answered), only on the
connection that asked for them; `docs/events.md` describes both in full.

- `execution/output`: `{"execution_id", "request_id", "stream": "stdout"|"stderr", "text",
  "seq"}`, the
  output of an `execute` call made with `"stream": true`, in order, while the program
  runs. All of them come before the call's result, which still holds the whole output.
- `event`: `{"subscription", "type", "ts", ...}`, after `events/subscribe`. The last one
  of a subscription the daemon dropped (its client read too slowly) has the type
  `subscription.dropped` and a `reason`.

## Errors

| code | name | meaning |
|---|---|---|
"""

_ERROR_MEANINGS = {
    -32700: "the line is not JSON",
    -32600: "not a valid request, or a line over max_message_bytes",
    -32601: "no such method; the message suggests close names",
    -32602: "bad params; `data.field` names the field, `data.reason` says why",
    -32603: "internal error; `data.error_id` matches the daemon's log",
    -32000: "overloaded: the execution queue is full, or the daemon is shutting down",
    -32001: "not found: an execution, a tool",
    -32002: "unauthenticated",
    -32003: "forbidden: a scope the caller lacks, or a session token",
    -32004: "the audit store is off or failing; the message says why (executions still run)",
    -32005: "rate limited; `data.retry_after_s`",
    -32006: "executor unavailable; the message says why",
    -32007: "an upstream failed",
    -32008: "seed aliases only: timeout (partial output in `data`)",
    -32009: "seed aliases only: memory limit",
    -32013: "seed aliases only: output limit",
    -32014: "seed aliases only: log lines limit",
}


def _type_of(schema: dict[str, Any]) -> str:
    if "anyOf" in schema:
        return " or ".join(_type_of(option) for option in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    if "$ref" in schema:
        return "object"
    return str(schema.get("type", "any"))


def _params_table(spec: MethodSpec) -> list[str]:
    schema = spec.params.model_json_schema()
    properties = schema.get("properties", {})
    if not properties:
        return ["No params."]
    required = set(schema.get("required", []))
    rows = ["| param | type | required | description |", "|---|---|---|---|"]
    for name, prop in properties.items():
        needed = "yes" if name in required else ""
        rows.append(f"| `{name}` | {_type_of(prop)} | {needed} | {prop.get('description', '')} |")
    return rows


def _method_section(spec: MethodSpec) -> list[str]:
    who = "anyone" if spec.scope is None else f"scope `{spec.scope}`"
    if spec.session:
        who += "; sandboxes' session tokens too"
    return [
        f"### `{spec.name}`",
        "",
        spec.description,
        "",
        f"Who: {who}.",
        "",
        *_params_table(spec),
        "",
    ]


def render_protocol() -> str:
    """The whole reference as Markdown."""
    lines = [_INTRO.rstrip("\n")]
    for code, meaning in sorted(_ERROR_MEANINGS.items(), reverse=True):
        name = RpcError.from_wire({"code": code, "message": ""}).__class__.__name__
        lines.append(f"| {code} | {name} | {meaning} |")
    lines += ["", "## Methods", ""]
    for spec in method_table().specs():
        if spec.name not in ALIASES:
            lines += _method_section(spec)
    lines += [
        "## Seed-compatible aliases",
        "",
        "Params `{code, limits?: {timeoutMs, memoryLimitMb, maxOutputBytes, maxLogEntries}, "
        "allowedTools?}`; result `{stdout, stderr, exitCode}`; limits hit answer -32008, "
        "-32009 or -32013 with the partial output in `data`.",
        "",
        "Other aliases are the same method under the seed's name.",
        "",
        "| alias | same as |",
        "|---|---|",
    ]
    for name, alias in sorted(ALIASES.items()):
        shape = f" ({alias.language}, seed shape)" if alias.language else ""
        lines.append(f"| `{name}` | `{alias.target}`{shape} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_protocol(), end="")
