"""The `conduit` command: serve, exec, call, executions, token, doctor, mcp.

`conduit exec` writes the program's output to its own stdout and stderr as the program
prints it, then the result; on a terminal, a run that takes more than a second shows a
progress line on stderr until it ends.

Exit codes: 0 success; 2 usage or configuration error; 3 daemon unreachable;
1 an RPC error. `conduit exec` exits with the program's own status: its exit code when
it ran, 124 on timeout (as timeout(1) does), 125 for any other limit, 126 when the
sandbox crashed, 130 when cancelled, 77 when the policy refused it (sysexits'
EX_NOPERM: it never ran).

Nothing a program or a client wrote reaches the terminal raw: output, results, error
types and messages, code, tool names, ids and JSON all go through `terminal` first,
so an escape sequence is shown, never obeyed (`conduit exec --raw` keeps the output's
own bytes, for a file or a pipe).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conduit.core.errors import ConduitError, ConfigError, RpcError
from conduit.core.terminal import dumps, escape, escape_lines

if TYPE_CHECKING:
    from conduit.client import Client, ExecutionResult, OutputChunk
    from conduit.daemon.config import Config
    from conduit.daemon.progress import ProgressLine

__all__ = ["main"]

_EXEC_EXIT = {"timeout": 124, "memory_limit": 125, "output_limit": 125, "tool_limit": 125}
_EXEC_EXIT |= {"crashed": 126, "cancelled": 130, "refused": 77}
_EXTENSIONS = {".py": "python", ".ts": "typescript", ".mts": "typescript", ".js": "javascript"}
_EXTENSIONS |= {".mjs": "javascript"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="conduit", description="Run untrusted programs in sandboxes, with tools."
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    parser.add_argument("--config", help="config file (default: $CONDUIT_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the daemon")
    _add_config_flag(serve)
    serve.add_argument("--socket", help="Unix socket path")
    serve.add_argument("--tcp", help="also listen on HOST:PORT (loopback unless allowed)")
    serve.add_argument("--state-dir", help="where tokens and caches live")
    serve.add_argument(
        "--until-stdin-closes",
        action="store_true",
        help="also stop (draining) when standard input ends: for a supervisor's pipe",
    )

    run = commands.add_parser("exec", help="run a program through the daemon")
    _add_connection_flags(run)
    run.add_argument("file", help="program file, or - for standard input")
    run.add_argument(
        "--lang", help="python, typescript or javascript (py, ts, js); default from the file name"
    )
    run.add_argument("--executor", help="override the language's default executor")
    run.add_argument("--timeout-ms", type=int, help="wall-clock limit")
    run.add_argument("--inputs", help="JSON value the program sees as `inputs`")
    run.add_argument(
        "--session",
        metavar="NAME",
        help="run in your session of this name, made on first use: what earlier runs in "
        "it defined is there (it ends when idle for 10 minutes or the daemon stops)",
    )
    run.add_argument(
        "--file",
        action="append",
        default=[],
        dest="input_files",
        metavar="LOCAL[:PATH]",
        help="place a local file in the program's working directory (as PATH, else by its "
        "name); repeat for more",
    )
    run.add_argument(
        "--out",
        metavar="DIR",
        help="save the files the program wrote under out/ in DIR",
    )
    run.add_argument("--json", action="store_true", help="print the whole result as JSON")
    run.add_argument(
        "--raw",
        action="store_true",
        help="write the program's output as it is, control characters and all (for a "
        "file or a pipe: a terminal obeys them)",
    )

    call = commands.add_parser("call", help="call one JSON-RPC method and print the result")
    _add_connection_flags(call)
    call.add_argument("method")
    call.add_argument("params", nargs="?", default="{}", help="params as a JSON object")

    _add_executions_parser(commands)

    token = commands.add_parser("token", help="manage client tokens")
    token_commands = token.add_subparsers(dest="token_command", required=True)
    new = token_commands.add_parser("new", help="make a client token and its config entry")
    new.add_argument("--name", default="client", help="the client's name")
    new.add_argument("--scopes", default="execute,executions,tools", help="comma-separated")

    doctor = commands.add_parser("doctor", help="check each executor and the daemon")
    _add_config_flag(doctor)
    _add_mcp_parser(commands)
    return parser


class _Version(argparse.Action):
    """`--version`, reading the installed version only when asked: `importlib.metadata`
    costs every other command tens of milliseconds."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from conduit.core.version import VERSION

        print(f"conduit {VERSION}")
        parser.exit()


def _add_executions_parser(commands: Any) -> None:
    executions = commands.add_parser("executions", help="read the audit store: list, get, stats")
    sub = executions.add_subparsers(dest="executions_command", required=True, metavar="COMMAND")

    listing = sub.add_parser("list", help="executions, newest first")
    _add_connection_flags(listing)
    listing.add_argument(
        "--status", help="ok, error, timeout, memory_limit, ... cancelled, running, interrupted"
    )
    listing.add_argument("--daemon", dest="daemon_id", help="one daemon's (a shared store)")
    listing.add_argument("--principal", help="a principal's executions (the master sees all)")
    listing.add_argument("--executor", help="one executor's")
    listing.add_argument("--language", help="python, typescript or javascript")
    listing.add_argument("--since", type=_since, help="a duration ago (1h), ISO time or Unix s")
    listing.add_argument("--code", dest="code_sha256", help="the code's sha256 or a prefix")
    listing.add_argument("--limit", type=int, default=50, help="rows per page (max 1000)")
    listing.add_argument("--cursor", help="the next page, as the previous one said")
    listing.add_argument("--json", action="store_true", help="print the reply as JSON")

    get = sub.add_parser("get", help="one execution in full")
    _add_connection_flags(get)
    get.add_argument("execution_id", metavar="ID")
    get.add_argument("--json", action="store_true", help="print the reply as JSON")

    stats = sub.add_parser("stats", help="counts, success rate, durations over a window")
    _add_connection_flags(stats)
    window = stats.add_mutually_exclusive_group()
    window.add_argument("--window", type=_duration, default=None, help="e.g. 1h, 7d (24h)")
    window.add_argument("--since", type=_since, help="a duration ago (1h), ISO time or Unix s")
    stats.add_argument("--principal", help="a principal's executions (the master sees all)")
    stats.add_argument("--json", action="store_true", help="print the reply as JSON")


def _since(text: str) -> float:
    from conduit.daemon.tables import parse_since

    try:
        return parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    from conduit.daemon.tables import parse_duration_s

    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_mcp_parser(commands: Any) -> None:
    mcp = commands.add_parser("mcp", help="serve MCP on standard input and output")
    _add_config_flag(mcp)
    mcp.add_argument("--state-dir", help="where tokens and caches live")
    mcp.add_argument("--socket", help="embedded: also listen on this Unix socket")
    mcp.add_argument("--client", metavar="NAME", help="embedded: act as the configured client NAME")
    mcp.add_argument(
        "--connect",
        nargs="?",
        const="",
        metavar="PATH",
        help="relay to a running daemon's Unix socket (default: the configured one)",
    )
    mcp.add_argument("--connect-tcp", metavar="HOST:PORT", help="relay to a daemon over TCP")


def _add_config_flag(parser: argparse.ArgumentParser) -> None:
    """`--config` after the command too (`conduit serve --config FILE`, as the systemd
    unit writes it). Left out there, it leaves the one before the command alone."""
    parser.add_argument(
        "--config", default=argparse.SUPPRESS, help="config file (default: $CONDUIT_CONFIG)"
    )


def _add_connection_flags(parser: argparse.ArgumentParser) -> None:
    _add_config_flag(parser)
    parser.add_argument("--socket", help="Unix socket path (default from config)")
    parser.add_argument("--tcp", help="connect over TCP to HOST:PORT instead")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `conduit` command; returns its exit status (the module docstring's)."""
    args = _parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"conduit: configuration error: {escape_lines(str(exc))}", file=sys.stderr)
        return 2
    except RpcError as exc:
        print(f"conduit: error {exc.code}: {escape(exc.message)}", file=sys.stderr)
        return 1
    except ConduitError as exc:
        print(f"conduit: {escape(exc)}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 130


def _config(args: argparse.Namespace, **overrides: Any) -> Config:
    from conduit.daemon.config import load_config

    return load_config(args.config, overrides=overrides)


# ---- serve ---------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    import trio

    from conduit.daemon.logs import configure_logging
    from conduit.daemon.server import serve

    overrides = {
        "server.socket": args.socket,
        "server.tcp": args.tcp,
        "server.state_dir": args.state_dir,
    }
    reload = partial(_config, args, **overrides)
    config = reload()
    configure_logging(config.server.log_level)
    until_closed = args.until_stdin_closes
    trio.run(
        partial(
            serve,
            config,
            reload=reload,
            handle_signals=True,
            until_stdin_closes=until_closed,
            owns_process=True,
        )
    )
    return 0


# ---- clients -------------------------------------------------------------------


def _connect(args: argparse.Namespace) -> Client:
    """A connected, logged-in client for the daemon the flags and config name.

    It fails at once, naming where it looked, if no daemon is there (one attempt: a
    person is waiting), and waits as long as a call takes (the daemon bounds executions).
    """
    from conduit.client import Backoff, Client
    from conduit.daemon.client_settings import client_settings

    settings = client_settings(args.config, socket=args.socket)
    try:
        client = Client(
            unix_path=settings.socket,
            tcp=args.tcp,
            # "" presents none: the daemon lets its own user in by peer credentials.
            token=settings.login or "",
            timeout_s=None,
            backoff=Backoff(attempts=1),
        )
    except ValueError as exc:
        raise ConfigError(f"--tcp: {exc}") from None
    return client.connect()


def _call(args: argparse.Namespace) -> int:
    try:
        params = json.loads(args.params)
    except json.JSONDecodeError as exc:
        print(f"conduit: params are not valid JSON: {escape(exc)}", file=sys.stderr)
        return 2
    with _connect(args) as client:
        result = client.call(args.method, params)
    print(dumps(result, indent=2))
    return 0


def _read_program(args: argparse.Namespace) -> tuple[str, str]:
    if args.file == "-":
        return sys.stdin.read(), args.lang or "typescript"
    path = Path(args.file)
    language = args.lang or _EXTENSIONS.get(path.suffix)
    if language is None:
        raise ConfigError(f"cannot tell the language of {path.name}: pass --lang")
    try:
        return path.read_text(), language
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def _exec(args: argparse.Namespace) -> int:
    from conduit.daemon.progress import ProgressLine

    code, language = _read_program(args)
    options: dict[str, Any] = {}
    if args.timeout_ms:
        options["limits"] = {"timeout_ms": args.timeout_ms}
    if args.inputs:
        options["inputs"] = json.loads(args.inputs)
    if args.input_files:
        options["files"] = _input_files(args.input_files)
    progress = ProgressLine(sys.stderr)
    shown = _LiveOutput(progress, raw=args.raw)
    with _connect(args) as client, progress.running():
        if args.session:
            runner: Any = client.open_session(language, executor=args.executor, name=args.session)
        else:
            runner, options["language"] = client, language
            if args.executor:
                options["executor"] = args.executor
        # With --json, the output is in the result; else it is shown as it comes.
        result = (
            runner.execute(code, **options) if args.json else _stream(runner, code, options, shown)
        )
    if args.json:
        print(dumps(dict(result.raw), indent=2))
    else:
        _print_result(dict(result.raw), shown.written, raw=args.raw)
    if args.out:
        _save_files(result, Path(args.out))
    return _exit_status(dict(result.raw))


def _input_files(specs: list[str]) -> dict[str, bytes]:
    """`--file LOCAL[:PATH]` values as the client's `files`."""
    files = {}
    for spec in specs:
        local, _, path = spec.partition(":")
        try:
            files[path or Path(local).name] = Path(local).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {local}: {exc.strerror}") from None
    return files


def _save_files(result: ExecutionResult, out: Path) -> None:
    """Write the result's files under `out`. Their paths come from the daemon and the
    program: each is checked again, each directory on the way is made or entered only
    if it is a real directory under `out` (never a link), and the file is never written
    through a link. A file not saved is named on stderr, with why."""
    from conduit.core.files import PathRefused, checked_path

    out.mkdir(parents=True, exist_ok=True)
    for file in result.files:
        try:
            parts = checked_path(file.path).split("/")
        except PathRefused as exc:
            print(f"not saved: {escape(str(exc))}", file=sys.stderr)
            continue
        if file.data is None:
            print(
                f"not saved: {escape(file.path)} ({file.size} bytes) did not fit in the "
                "result; raise limits.result_bytes",
                file=sys.stderr,
            )
            continue
        try:
            _write_under(out, parts, file.data)
        except OSError as exc:  # a link or a file in the way, say
            print(f"not saved: {escape(file.path)}: {exc.strerror or exc}", file=sys.stderr)


def _write_under(out: Path, parts: list[str], data: bytes) -> None:
    """Write `data` at `out/<parts>`, opening each directory from its parent with
    O_NOFOLLOW, so no link on the way is followed; raises `OSError`."""
    directory = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=directory)
            inner = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory
            )
            os.close(directory)
            directory = inner
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(parts[-1], flags, 0o644, dir_fd=directory), "wb") as written:
            written.write(data)
    finally:
        os.close(directory)


def _stream(runner: Any, code: str, options: dict[str, Any], shown: _LiveOutput) -> ExecutionResult:
    """Run the program (on a client or in a session), showing its output as it comes."""
    with runner.stream(code, **options) as run:
        for chunk in run:
            shown.take(chunk)
    return run.result


class _LiveOutput:
    """Writes a program's output chunks to our own stdout and stderr as they come,
    escaped unless `raw`, and counts what was written of each stream (as the program
    wrote it)."""

    def __init__(self, progress: ProgressLine, *, raw: bool = False) -> None:
        self._progress = progress
        self._shown = _as_is if raw else escape_lines
        self.written = {"stdout": 0, "stderr": 0}

    def take(self, chunk: OutputChunk) -> None:
        if chunk.stream not in self.written:
            return
        target = sys.stdout if chunk.stream == "stdout" else sys.stderr
        self._progress.write(target, self._shown(chunk.text))
        self.written[chunk.stream] += len(chunk.text)


def _as_is(text: str) -> str:
    return text


def _print_result(result: dict[str, Any], written: dict[str, int], *, raw: bool) -> None:
    shown = _as_is if raw else escape_lines
    # The daemon stops streaming to a client that falls far behind; the rest is here.
    sys.stdout.write(shown(result["stdout"][written["stdout"] :]))
    sys.stderr.write(shown(result["stderr"][written["stderr"] :]))
    if result["result"] is not None:
        print(dumps(result["result"]))
    if result["status"] != "ok":
        print(f"[{result['status']}] {_error_detail(result['error'] or {})}", file=sys.stderr)


def _error_detail(error: dict[str, Any]) -> str:
    """The program's error's type and message, and its traceback, safe to print (a
    traceback holding the message already, as Python's and V8's do, alone)."""
    header = f"{escape(error.get('type'))}: {escape(error.get('message'))}".rstrip()
    traceback = error.get("traceback")
    if not traceback:
        return header
    frames = escape_lines(traceback).rstrip()
    if str(error.get("message") or "") in traceback:
        return frames
    return f"{header}\n{frames}"


def _exit_status(result: dict[str, Any]) -> int:
    status = result["status"]
    if status in _EXEC_EXIT:
        return _EXEC_EXIT[status]
    exit_code = result["exit_code"] or 0
    return exit_code if exit_code else (0 if status == "ok" else 1)


# ---- executions ----------------------------------------------------------------


def _executions(args: argparse.Namespace) -> int:
    method, params, show = _EXECUTIONS[args.executions_command](args)
    with _connect(args) as client:
        result = client.call(method, {k: v for k, v in params.items() if v is not None})
    if args.json:
        print(dumps(result, indent=2))
    else:
        show(result)
    if result.get("warning"):
        print(f"conduit: warning: {escape(result['warning'])}", file=sys.stderr)
    return 0


def _list_request(args: argparse.Namespace) -> tuple[str, dict[str, Any], Any]:
    keys = (
        "status", "principal", "executor", "language", "since", "code_sha256", "limit",
        "daemon_id",
    )  # fmt: skip
    params = {key: getattr(args, key) for key in (*keys, "cursor")}
    return "executions/list", params, _print_list


def _print_list(result: dict[str, Any]) -> None:
    from conduit.daemon.tables import format_ms, format_time, render_table

    executions = result["executions"]
    # A store shared by several daemons: say which ran each (one daemon's needs no column).
    daemons = len({e.get("daemon_id") for e in executions}) > 1
    rows = [
        _cells(
            e["execution_id"],
            format_time(e["started_at"]),
            e["principal"],
            e["executor"],
            e["language"],
            e["status"],
            format_ms(e["duration_ms"]),
            e["tool_calls"],
            e["limit_hit"] or e["error_type"],
            *((e.get("daemon_id"),) if daemons else ()),
        )
        for e in executions
    ]
    headers = ("ID", "STARTED", "PRINCIPAL", "EXECUTOR", "LANGUAGE", "STATUS", "DURATION")
    headers += ("TOOLS", "ERROR", *(("DAEMON",) if daemons else ()))
    if rows:
        print(render_table(headers, rows, right={6, 7}))
    else:
        print("no executions match")
    if result["next_cursor"]:
        cursor = escape(result["next_cursor"])
        print(f"more: conduit executions list --cursor {cursor}", file=sys.stderr)


def _get_request(args: argparse.Namespace) -> tuple[str, dict[str, Any], Any]:
    return "executions/get", {"execution_id": args.execution_id}, _print_execution


def _cells(*values: Any) -> tuple[str | None, ...]:
    """A table row with every value escaped to one line; None stays None (shown `-`)."""
    return tuple(None if value is None else escape(value) for value in values)


def _print_execution(e: dict[str, Any]) -> None:
    from conduit.daemon.tables import format_bytes, format_ms, format_time, render_table

    if e["status"] == "running":
        who = f"{escape(e['principal'])} on {escape(e['executor'])}"
        if "running_ms" not in e:  # another daemon's, from its row in a shared store
            who += f" (daemon {escape(e.get('daemon_id') or '?')})"
            since = f"since {format_time(e['started_at'])}"
        else:
            since = f"{format_ms(e['running_ms'])} so far"
        print(f"{escape(e['execution_id'])} is running ({since}): {who}")
        return
    error = f"{e['error_type']}: {e['error_message']}" if e["error_type"] else None
    fields: list[tuple[str, Any]] = [
        ("execution", e["execution_id"]),
        ("principal", e["principal"]),
        ("executor", f"{e['executor']} ({e['language']})"),
        ("daemon", e.get("daemon_id") or None),
        ("status", f"{e['status']}, exit code {e['exit_code']}"),
        ("limit hit", e["limit_hit"]),
        ("error", error),
        ("started", format_time(e["started_at"])),
        ("queued", format_ms(e["queue_ms"])),
        ("duration", format_ms(e["duration_ms"])),
        ("memory peak", format_bytes(e["memory_peak_bytes"])),
        ("code", f"sha256 {e['code_sha256']}, {format_bytes(e['code_bytes'])}"),
        ("allowed tools", ", ".join(e["allowed_tools"])),
    ]
    for name in ("result", "stdout", "stderr"):
        excerpt = dumps(e[f"{name}_head"]) if e[f"{name}_head"] else ""
        fields.append((name, f"{format_bytes(e[f'{name}_bytes'])} {excerpt}".rstrip()))
    print(render_table(None, [_cells(*field) for field in fields]))
    print("\ncode (first lines):")
    # Escaped before it is split: a carriage return or form feed is shown, not a break.
    for line in escape_lines(e["code_snippet"].replace("\r\n", "\n")).splitlines():
        print(f"  {line}")
    if e["tool_calls"]:
        calls = [
            _cells(c["tool"], format_ms(c["duration_ms"]), c["outcome"]) for c in e["tool_calls"]
        ]
        print("\n" + render_table(("TOOL", "DURATION", "OUTCOME"), calls, right={1}))


def _stats_request(args: argparse.Namespace) -> tuple[str, dict[str, Any], Any]:
    params = {"window_s": args.window, "since": args.since, "principal": args.principal}
    return "executions/stats", params, _print_stats


def _print_stats(result: dict[str, Any]) -> None:
    from conduit.daemon.tables import format_ms, format_percent, format_time, render_table

    print(f"executions started {format_time(result['since'])} to {format_time(result['until'])}")
    groups = [("all", result["total"])]
    groups += [(f"executor {name}", g) for name, g in result["by_executor"].items()]
    groups += [(f"language {name}", g) for name, g in result["by_language"].items()]
    rows = [
        _cells(
            name,
            g["count"],
            format_percent(g["success_rate"]),
            format_ms(g["duration_ms"]["p50"]),
            format_ms(g["duration_ms"]["p95"]),
            format_ms(g["duration_ms"]["max"]),
            g["timeouts"],
            g["limits_hit"],
            g["tool_calls"],
        )
        for name, g in groups
    ]
    headers = ("GROUP", "COUNT", "OK", "P50", "P95", "MAX", "TIMEOUTS", "LIMITS", "TOOLS")
    print(render_table(headers, rows, right=set(range(1, 9))))


_EXECUTIONS = {"list": _list_request, "get": _get_request, "stats": _stats_request}


# ---- token, doctor -------------------------------------------------------------


def _token(args: argparse.Namespace) -> int:
    from conduit.daemon.auth import hash_token, new_token

    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    token = new_token()
    print(token)
    print(
        "\n# Add to conduit.toml (only the hash is stored), then reload the daemon:\n"
        "[[auth.clients]]\n"
        f'name = "{args.name}"\n'
        f'sha256 = "{hash_token(token)}"\n'
        f"scopes = {json.dumps(scopes)}",
        file=sys.stderr,
    )
    return 0


def _doctor(args: argparse.Namespace) -> int:
    import trio

    from conduit.client import Backoff, Client, TransportError
    from conduit.daemon.wiring import build_registry

    config = _config(args)
    print(f"config: {config.source or '(built-in defaults)'}")
    print(f"socket: {config.server.socket}")
    print(f"state:  {config.server.state_dir}")
    try:
        with Client(unix_path=config.server.socket, token="", backoff=Backoff(1)) as client:
            client.ping()
        print("daemon: running")
    except (TransportError, OSError):
        print("daemon: not running")
    registry = build_registry(config, callback=None)
    infos = trio.run(_probe_executors, registry)
    healthy = True
    for info in infos:
        # A runtime's version and failure come from its own output: shown, not obeyed.
        state = f"ok ({info.version})" if info.available else f"unavailable: {info.reason}"
        state = escape(state)
        print(f"executor {info.name:12} {','.join(info.languages):22} {state}")
        for label, value in _component_details(info.pool or {}):
            print(f"{'':9}{label:15} {value}")
        if info.packages:
            installed = ", ".join(f"{name} {version}" for name, version in info.packages.items())
            print(f"{'':9}{'packages':15} {escape(installed)}")
    for language, name in registry.defaults().items():
        usable = any(i.name == name and i.available for i in infos)
        healthy &= usable
        print(f"default  {language:12} -> {name}{'' if usable else '  (not available)'}")
    return 0 if healthy else 1


# A first start with every executor builds for about a minute on a small machine.
DOCTOR_PREPARE_TIMEOUT_S = 600
# How often doctor looks at the executors' progress while it waits for them.
DOCTOR_PROGRESS_POLL_S = 0.5
# Enough hex digits of a SHA-256 to tell two builds apart by eye.
HASH_PREFIX_CHARS = 16
# A Wasmtime executor's `compiled_cache`, worded as whether the cache was valid.
_COMPILED_CACHE = {
    "hit": "valid: loaded without compiling",
    "miss": "none yet: compiled, and cached for the next start",
    "rebuilt": "invalid, rebuilt: the cached file did not load, so it was compiled again",
}


def _short(value: Any) -> str:
    """A SHA-256 hex digest cut to its first HASH_PREFIX_CHARS; anything else as is."""
    text = str(value)
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return text[:HASH_PREFIX_CHARS]
    return text


def _component_details(pool: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines for the component keys an executor's info carries.

    Generic: any executor whose `info().pool` has `component`, `component_hash`,
    `build_inputs`, `compiled_cache` or `timings` (the Wasmtime ones) gets them shown,
    and `os_sandbox` (Deno's); the rest of a pool's statistics is not.
    """
    lines: list[tuple[str, str]] = []
    if pool.get("os_sandbox"):  # Deno's: bubblewrap, or why its workers run without
        lines.append(("os sandbox", escape(str(pool["os_sandbox"]))))
    if pool.get("component"):
        lines.append(("component", str(pool["component"])))
    if pool.get("component_hash"):
        lines.append(("component hash", _short(pool["component_hash"])))
    for name, value in (pool.get("build_inputs") or {}).items():
        lines.append(("build input", f"{name} {_short(value)}"))
    if pool.get("compiled_cache"):
        cache = str(pool["compiled_cache"])
        lines.append(("compiled cache", _COMPILED_CACHE.get(cache, cache)))
    if pool.get("timings"):
        timings = [
            f"{key.removesuffix('_s')} {value} s" if key.endswith("_s") else f"{key} {value}"
            for key, value in pool["timings"].items()
        ]
        lines.append(("timings", ", ".join(timings)))
    return lines


async def _probe_executors(registry: Any) -> list[Any]:
    import trio

    async with trio.open_nursery() as nursery:
        await nursery.start(registry.serve)
        # Doctor is the set-up step: it waits for components to be built and cached,
        # saying what is being built as it goes.
        with trio.move_on_after(DOCTOR_PREPARE_TIMEOUT_S):
            await _wait_showing_progress(registry)
        infos = registry.infos()
        nursery.cancel_scope.cancel()
    return infos


async def _wait_showing_progress(registry: Any) -> None:
    """`registry.wait_ready()`, printing each build step as it starts and ends."""
    import trio

    shown = _ProgressShown()

    async def wait_then_stop(cancel_scope: trio.CancelScope) -> None:
        await registry.wait_ready()
        cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_then_stop, nursery.cancel_scope)
        while True:
            shown.update(registry.infos(configured_only=True))
            await trio.sleep(DOCTOR_PROGRESS_POLL_S)
    shown.update(registry.infos(configured_only=True))


class _ProgressShown:
    """Prints the steps of each executor's `progress` not printed yet, as the log words
    them: a step's start when it is seen running, its end with its seconds."""

    def __init__(self) -> None:
        self._done: dict[str, int] = {}
        self._started: dict[str, int] = {}

    def update(self, infos: Sequence[Any]) -> None:
        for info in infos:
            progress = info.progress or {}
            done = progress.get("done") or []
            for step in done[self._done.get(info.name, 0) :]:
                outcome = "done" if step["ok"] else "failed"
                self._print(f"{info.name}: {step['step']} {outcome} in {step['elapsed_s']:.1f} s")
            self._done[info.name] = len(done)
            if progress.get("step") and self._started.get(info.name, -1) < len(done):
                self._started[info.name] = len(done)
                self._print(f"{info.name}: {progress['step']} started")

    @staticmethod
    def _print(line: str) -> None:
        print(escape(line), flush=True)


def _mcp(args: argparse.Namespace) -> int:
    from conduit.daemon.mcp_stdio import run_command

    return run_command(args, _config)


_COMMANDS = {
    "mcp": _mcp,
    "serve": _serve,
    "exec": _exec,
    "call": _call,
    "executions": _executions,
    "token": _token,
    "doctor": _doctor,
}
