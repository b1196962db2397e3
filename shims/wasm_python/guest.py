"""The wasm-python guest: runs one program inside a fresh CPython 3.14 component.

Built by componentize-py and pre-initialised at build time: everything imported at the
top of this module (the interpreter, this shim and the standard-library modules in
PRELOADED) is already in memory when an instance starts. Modules that were not imported
at build time cannot be imported at run time: the component carries no file system.

The host calls `run(request)` once per instance with JSON `{"code", "inputs"}` and gets
JSON back: `{"result": value}` or `{"error": {"type", "message", "traceback"}}`.

The program's contract (the same on every Python executor):
- its result is the value of a top-level `return`, else of its last expression;
  a value JSON cannot hold comes back as its `repr`;
- `print` writes to stdout; `inputs` holds the request's inputs;
- `tools.<namespace>.<tool>(**arguments)` (or one dict argument) calls a tool and
  returns its value, raising `ToolError(code, tool, message)` if it fails;
  `tools._discover()` lists the tools this execution may call.
"""

import ast
import json
import linecache
import sys
import time
import traceback

import wit_world

# The standard-library modules a program can import: pre-imported at build time.
# Listed in one place, as the host reads it for `executors/list`; keep in step with
# docs/executors.md. Left out on purpose: modules that reach the outside world
# (socket, subprocess, ssl, urllib.request, http.client, asyncio, threading,
# multiprocessing, ctypes) — WASI gives them nothing to reach, so they only mislead.
PRELOADED = (
    "abc",
    "array",
    "base64",
    "binascii",
    "bisect",
    "calendar",
    "cmath",
    "collections",
    "collections.abc",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "enum",
    "fnmatch",
    "fractions",
    "functools",
    "graphlib",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "io",
    "itertools",
    "json",
    "keyword",
    "math",
    "numbers",
    "operator",
    "pprint",
    "random",
    "re",
    "secrets",
    "shlex",
    "statistics",
    "string",
    "struct",
    "textwrap",
    "time",
    "types",
    "typing",
    "unicodedata",
    "urllib.parse",
    "uuid",
    "zlib",
)

for _name in PRELOADED:
    __import__(_name)

# The file name the program's code is compiled under: its frames are the ones a
# traceback keeps.
PROGRAM_FILE = "<program>"
# Where the value of the last expression goes when the program has no `return`.
RESULT_NAME = "__conduit_result__"
# JSON-RPC's "internal error", for a failure with no code of its own.
INTERNAL_ERROR = -32603
# The daemon's UpstreamError: the code of a tool's own failure, as in the TypeScript SDK.
TOOL_FAILED = -32007


class ToolError(Exception):
    """A tool call that failed: `code` is the JSON-RPC code (-32007 for the tool's own
    failure), `tool` the tool's name, `message` why."""

    def __init__(self, code, tool, message):
        super().__init__(message)
        self.code = code
        self.tool = tool
        self.message = message

    def __repr__(self):
        return f"ToolError(code={self.code!r}, tool={self.tool!r}, message={self.message!r})"


def _host_call(method, params, tool=None):
    """Call the daemon; its result, or ToolError with the daemon's code for a refusal."""
    answer = json.loads(wit_world.host_call(method, json.dumps(params)))
    if "error" in answer:
        error = answer["error"]
        data = error.get("data") if isinstance(error.get("data"), dict) else {}
        raise ToolError(
            error.get("code", INTERNAL_ERROR),
            data.get("tool", tool),
            error.get("message", "the call failed"),
        )
    return answer.get("result")


def _call_tool(name, args, kwargs):
    if args:
        if len(args) != 1 or not isinstance(args[0], dict) or kwargs:
            raise TypeError(f"{name}() takes keyword arguments or a single dict")
        arguments = args[0]
    else:
        arguments = kwargs
    params = {"name": name, "arguments": arguments, "shape": "value"}
    result = _host_call("tools/call", params, name)
    if result.get("error"):
        error = result["error"]
        raise ToolError(TOOL_FAILED, error.get("tool", name), error.get("message", "failed"))
    return result.get("value")


class _Namespace:
    def __init__(self, namespace):
        self._namespace = namespace

    def __getattr__(self, tool):
        if tool.startswith("__"):
            raise AttributeError(tool)
        name = f"{self._namespace}.{tool}"

        def call(*args, **kwargs):
            return _call_tool(name, args, kwargs)

        call.__name__ = tool
        call.__qualname__ = name
        return call

    def __repr__(self):
        return f"<tools.{self._namespace}>"


class _Tools:
    """`tools.<namespace>.<tool>(...)`; `tools._discover()` lists the tools."""

    def __getattr__(self, namespace):
        if namespace.startswith("__"):
            raise AttributeError(namespace)
        return _Namespace(namespace)

    def _discover(self):
        """The tools this execution may call, as the TypeScript `tools.$discover()`."""
        listed = _host_call("tools/list", {})["tools"]
        found = []
        for tool in listed:
            entry = {
                "id": tool["name"],
                "path": (tool.get("_meta") or {}).get("conduit/path"),
                "description": tool.get("description"),
                "inputSchema": tool.get("inputSchema"),
            }
            if tool.get("outputSchema"):
                entry["outputSchema"] = tool["outputSchema"]
            found.append(entry)
        return found

    def __repr__(self):
        return "<tools>"


def _returns_at_top(body):
    """Whether a `return` appears outside every function and class of `body`."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def _prepare(code):
    """The program compiled so its result can be read back.

    Without a top-level `return`, it runs as a module whose last expression is
    assigned to RESULT_NAME. With one, its body becomes a function's, the last
    expression becomes a `return`, and the module calls it. Nodes keep their
    locations, so tracebacks show the user's own line numbers.
    """
    tree = ast.parse(code, PROGRAM_FILE, "exec")
    body = tree.body
    last = body[-1] if body else None
    if _returns_at_top(body):
        if isinstance(last, ast.Expr):
            body[-1] = ast.copy_location(ast.Return(value=last.value), last)
        function = ast.FunctionDef(
            name="__conduit_program__",
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=body,
            decorator_list=[],
            returns=None,
            type_params=[],
        )
        call = ast.Assign(
            targets=[ast.Name(RESULT_NAME, ast.Store())],
            value=ast.Call(ast.Name("__conduit_program__", ast.Load()), [], []),
        )
        tree.body = [ast.copy_location(function, body[0]), ast.copy_location(call, body[-1])]
    elif isinstance(last, ast.Expr):
        assign = ast.Assign(targets=[ast.Name(RESULT_NAME, ast.Store())], value=last.value)
        body[-1] = ast.copy_location(assign, last)
    ast.fix_missing_locations(tree)
    return compile(tree, PROGRAM_FILE, "exec", dont_inherit=True)


def _user_traceback(exc):
    """The traceback of `exc` with only the program's own frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == PROGRAM_FILE]
    if any(f.name == "__conduit_program__" for f in frames):
        # The call that wraps a program with a top-level `return` is not the user's.
        frames = [f for f in frames if f.name != "<module>"]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def _error(exc, *, syntax=False):
    message = str(exc) if not syntax else f"{exc.msg} (line {exc.lineno})"
    return {
        "error": {
            "type": type(exc).__name__,
            "message": message,
            "traceback": _user_traceback(exc),
            "line": getattr(exc, "lineno", None) if syntax else None,
        }
    }


def _encode_result(value):
    try:
        return json.dumps({"result": value}, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return json.dumps({"result": repr(value)}, ensure_ascii=False)


# How long past the execution's end a shortened sleep wakes: a few epoch ticks, so the
# host's deadline check has certainly passed when the program runs again.
SLEEP_SLACK_S = 0.05


def _bound_sleep(timeout_s):
    """Make `time.sleep` wake by the execution's end.

    The host stops guest code at its deadline but cannot reach into a sleep: a sleep
    that outlives the execution would only hold its thread. Waking just after the end
    changes nothing the program could observe, as it is stopped on waking.
    """
    sleep, monotonic = time.sleep, time.monotonic
    end = monotonic() + timeout_s

    def bounded_sleep(seconds):
        if isinstance(seconds, (int, float)) and seconds > 0:
            seconds = min(seconds, max(0.0, end - monotonic()) + SLEEP_SLACK_S)
        sleep(seconds)

    bounded_sleep.__doc__ = sleep.__doc__
    time.sleep = bounded_sleep


def _execute(request):
    code = request["code"]
    _bound_sleep(request.get("timeout_ms", 0) / 1000)
    linecache.cache[PROGRAM_FILE] = (len(code), None, code.splitlines(True), PROGRAM_FILE)
    try:
        program = _prepare(code)
    except SyntaxError as exc:
        return json.dumps(_error(exc, syntax=True))
    scope = {
        "__name__": "__main__",
        "__builtins__": __builtins__,
        "inputs": request.get("inputs"),
        "tools": _Tools(),
        "ToolError": ToolError,
    }
    try:
        exec(program, scope)
    except BaseException as exc:  # the program's own failure, reported as its result
        return json.dumps(_error(exc))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return _encode_result(scope.get(RESULT_NAME))


class WitWorld(wit_world.WitWorld):
    def run(self, request: str) -> str:
        try:
            return _execute(json.loads(request))
        except BaseException as exc:  # MemoryError, RecursionError while reporting...
            try:
                return json.dumps(_error(exc))
            except BaseException:
                return '{"error": {"type": "InternalError", "message": "the guest failed"}}'
