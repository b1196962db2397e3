"""How a Python program runs on every Python executor (wasm-python, pyodide).

A guest calls `execute(request, host_call)` (or `execute_async` where the program may
use top-level `await`) once, with the request `{"code", "inputs", "timeout_ms",
"live_output"?, "session"?}` (`live_output`: flush stdout at every line, for
streaming; `session`: run in the interpreter's one session namespace, see below), and
gets back JSON: `{"result": value}` or `{"error": {"type", "message", "traceback"}}`,
the latter with `"exit_code"` when the program ended by a failing `SystemExit`.
`host_call(method, params_json) -> answer_json` is the guest's one way to the daemon:
a JSON-RPC call under the execution's session token.

The program's contract (documented in docs/tools.md):
- its result is the value of a top-level `return`, else of its last expression;
  a value JSON cannot hold comes back as its `repr`;
- `print` writes to stdout, every byte of each write; `inputs` holds the request's
  inputs;
- `sys.exit()` ends it as it ends CPython: a code of None or 0 succeeds (the result
  is None); an int is the exit code; anything else is printed to stderr, code 1;
- `tools.<namespace>.<tool>(**arguments)` (or one dict argument) calls a tool and
  returns its value, raising `ToolError(code, tool, message)` if it fails;
  `tools._discover()` lists the tools this execution may call.

A session's steps (`"session": true`) run one after the other in the same interpreter
and the same module namespace, so what a step defines at top level (variables,
functions, classes, imports) is there for the next; `inputs` and `tools` are the
step's own. A program with a top-level `return` runs as a function's body, so what
it assigns is that function's, not the session's. A fresh execution never sees the
session namespace: it gets one of its own.
"""

import ast
import contextlib
import errno
import io
import itertools
import json
import linecache
import sys
import time
import traceback

# The file name the program's code is compiled under: its frames are the ones a
# traceback keeps. A session's steps are "<step N>" instead: a function an earlier
# step defined shows that step's lines, as a notebook shows its cells.
PROGRAM_FILE = "<program>"
STEP_FILE = "<step {}>"
# A session keeps the sources of its last STEPS_KEPT steps for its tracebacks; an
# older step's frames are shown without their lines.
STEPS_KEPT = 64
PROGRAM_FUNCTION = "__conduit_program__"
# Where the value of the last expression goes when the program has no `return`.
RESULT_NAME = "__conduit_result__"
# JSON-RPC's "internal error", for a failure with no code of its own.
INTERNAL_ERROR = -32603
# The daemon's UpstreamError: the code of a tool's own failure, as in the TypeScript SDK.
TOOL_FAILED = -32007
# How long past the execution's end a shortened sleep wakes: a few epoch ticks, so the
# host's deadline check has certainly passed when the program runs again.
SLEEP_SLACK_S = 0.05
# The interpreter's own sleep: every run bounds this one, never an earlier run's bound.
_SLEEP = time.sleep
# The module namespace every session step runs in (see the docstring).
_SESSION_SCOPE = {}
# The session's step numbers, and the file names of the steps whose sources are in
# linecache, oldest first.
_STEPS = itertools.count(1)
_STEP_FILES = []
# The exit codes a process can report (a C int); a code beyond them is reported as
# EXIT_CODE_UNFIT, as CPython reports one it cannot convert.
EXIT_CODE_MIN, EXIT_CODE_MAX = -(2**31), 2**31 - 1
EXIT_CODE_UNFIT = -1


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


class _Tools:
    """`tools.<namespace>.<tool>(...)`; `tools._discover()` lists the tools."""

    def __init__(self, host_call):
        self._host_call = host_call

    def __getattr__(self, namespace):
        if namespace.startswith("__"):
            raise AttributeError(namespace)
        return _Namespace(self, namespace)

    def _request(self, method, params, tool=None):
        """Call the daemon; its result, or ToolError with the daemon's code."""
        # NaN and Infinity are no JSON: refused here, as CPython's `json` refuses them,
        # rather than reaching the tool as null.
        answer = json.loads(self._host_call(method, json.dumps(params, allow_nan=False)))
        if "error" in answer:
            error = answer["error"]
            data = error.get("data") if isinstance(error.get("data"), dict) else {}
            raise ToolError(
                error.get("code", INTERNAL_ERROR),
                data.get("tool", tool),
                error.get("message", "the call failed"),
            )
        return answer.get("result")

    def _call(self, name, args, kwargs):
        if args:
            if len(args) != 1 or not isinstance(args[0], dict) or kwargs:
                raise TypeError(f"{name}() takes keyword arguments or a single dict")
            arguments = args[0]
        else:
            arguments = kwargs
        params = {"name": name, "arguments": arguments, "shape": "value"}
        result = self._request("tools/call", params, name)
        if result.get("error"):
            error = result["error"]
            raise ToolError(TOOL_FAILED, error.get("tool", name), error.get("message", "failed"))
        return result.get("value")

    def _discover(self):
        """The tools this execution may call, as the TypeScript `tools.$discover()`."""
        found = []
        for tool in self._request("tools/list", {})["tools"]:
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


class _Namespace:
    def __init__(self, tools, namespace):
        self._tools = tools
        self._namespace = namespace

    def __getattr__(self, tool):
        if tool.startswith("__"):
            raise AttributeError(tool)
        name = f"{self._namespace}.{tool}"
        tools = self._tools

        def call(*args, **kwargs):
            return tools._call(name, args, kwargs)

        call.__name__ = tool
        call.__qualname__ = name
        return call

    def __repr__(self):
        return f"<tools.{self._namespace}>"


def bound_sleep(timeout_s):
    """Make `time.sleep` wake by the execution's end.

    A host stops guest code at its deadline but may not reach into a sleep: a sleep
    that outlives the execution would only hold its sandbox. Waking just after the
    end changes nothing the program could observe, as it is stopped on waking.
    """
    sleep, monotonic = _SLEEP, time.monotonic
    end = monotonic() + timeout_s

    def bounded_sleep(seconds):
        if isinstance(seconds, (int, float)) and seconds > 0:
            seconds = min(seconds, max(0.0, end - monotonic()) + SLEEP_SLACK_S)
        sleep(seconds)

    bounded_sleep.__doc__ = sleep.__doc__
    time.sleep = bounded_sleep


class _WholeWrites(io.RawIOBase):
    """The raw stream under the text stream `text`, with every write made whole.

    A WASI host may take only part of a write (Wasmtime takes 8 KiB at a time), and
    an unbuffered text stream (a `TextIOWrapper` straight over a `FileIO`, as a
    guest's stdio may be) drops the rest of a short write without a word. This writes
    the rest.
    """

    def __init__(self, text):
        super().__init__()
        # Kept: `text` closes the raw stream when it is collected. Closing this one
        # leaves both open.
        self._text = text
        self._raw = text.buffer

    def writable(self):
        return True

    def fileno(self):
        return self._raw.fileno()

    def isatty(self):
        return self._raw.isatty()

    def write(self, data):
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            wrote = self._raw.write(view[done:])
            if not wrote:  # None (it would block) or 0: no progress to wait for
                raise BlockingIOError(errno.EAGAIN, "the output stream took nothing", done)
            done += wrote
        return done


def write_whole():
    """Make `sys.stdout` and `sys.stderr` write every byte of each write where their
    binary layer is raw (see `_WholeWrites`); a buffered one writes whole already.
    The streams stay unbuffered, and the ones replaced keep working. Idempotent."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        buffer = getattr(stream, "buffer", None)
        if not isinstance(buffer, io.RawIOBase) or isinstance(buffer, _WholeWrites):
            continue
        whole = io.TextIOWrapper(
            _WholeWrites(stream),
            encoding=stream.encoding,
            errors=stream.errors,
            newline="\n",
            line_buffering=stream.line_buffering,
            write_through=True,
        )
        setattr(sys, name, whole)
        if getattr(sys, f"__{name}__") is stream:
            setattr(sys, f"__{name}__", whole)


def _returns_at_top(code, body):
    """Whether a `return` appears outside every function and class of `body`, parsed
    from `code` (whose text names `return` if any of it does)."""
    if "return" not in code:
        return False
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def _prepare(code, allow_await, filename=PROGRAM_FILE):
    """The program compiled so its result can be read back.

    Without a top-level `return`, it runs as a module whose last expression is
    assigned to RESULT_NAME. With one, its body becomes a function's (an async one
    where `await` is allowed), the last expression becomes a `return`, and the module
    calls it. Nodes keep their locations, so tracebacks show the user's own lines.
    """
    tree = ast.parse(code, filename, "exec")
    body = tree.body
    last = body[-1] if body else None
    if _returns_at_top(code, body):
        if isinstance(last, ast.Expr):
            body[-1] = ast.copy_location(ast.Return(value=last.value), last)
        kind = ast.AsyncFunctionDef if allow_await else ast.FunctionDef
        function = kind(
            name=PROGRAM_FUNCTION,
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=body,
            decorator_list=[],
            returns=None,
            type_params=[],
        )
        called = ast.Call(ast.Name(PROGRAM_FUNCTION, ast.Load()), [], [])
        value = ast.Await(called) if allow_await else called
        call = ast.Assign(targets=[ast.Name(RESULT_NAME, ast.Store())], value=value)
        tree.body = [ast.copy_location(function, body[0]), ast.copy_location(call, body[-1])]
        ast.fix_missing_locations(tree)
    elif isinstance(last, ast.Expr):
        # Located here rather than by `fix_missing_locations`, which walks the whole tree.
        target = ast.copy_location(ast.Name(RESULT_NAME, ast.Store()), last)
        assign = ast.Assign(targets=[target], value=last.value)
        body[-1] = ast.copy_location(assign, last)
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if allow_await else 0
    return compile(tree, filename, "exec", flags=flags, dont_inherit=True)


def _user_traceback(exc):
    """The traceback of `exc` with only the program's own frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_program(f.filename)]
    if any(f.name == PROGRAM_FUNCTION for f in frames):
        # The call that wraps a program with a top-level `return` is not the user's.
        frames = [f for f in frames if f.name != "<module>"]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def _is_program(filename):
    return filename == PROGRAM_FILE or (filename.startswith("<step ") and filename.endswith(">"))


def _program_file(code, *, session):
    """The file name to compile `code` under, its source kept for tracebacks: a
    session's next step file (forgetting the oldest past STEPS_KEPT), else
    PROGRAM_FILE."""
    filename = PROGRAM_FILE
    if session:
        filename = STEP_FILE.format(next(_STEPS))
        _STEP_FILES.append(filename)
        if len(_STEP_FILES) > STEPS_KEPT:
            linecache.cache.pop(_STEP_FILES.pop(0), None)
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    return filename


def error_answer(exc, *, syntax=False):
    """The JSON answer reporting `exc`, never raising."""
    try:
        message = str(exc) if not syntax else f"{exc.msg} (line {exc.lineno})"
        error = {
            "type": type(exc).__name__,
            "message": message,
            "traceback": _user_traceback(exc),
            "line": getattr(exc, "lineno", None) if syntax else None,
        }
        return json.dumps({"error": error})
    except BaseException:  # MemoryError, RecursionError while reporting...
        return '{"error": {"type": "InternalError", "message": "the guest failed"}}'


def _exit_code(code):
    """The exit code of `SystemExit(code)`, as CPython exits with it: None is 0, an int
    is itself, anything else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        code = int(code)  # True is 1
        return code if EXIT_CODE_MIN <= code <= EXIT_CODE_MAX else EXIT_CODE_UNFIT
    # A stderr the program broke, or a __str__ that raises, costs only the message.
    with contextlib.suppress(BaseException):
        print(code, file=sys.stderr)
    return 1


def _exit_answer(exc):
    """The JSON answer for a program that raised `SystemExit`, never raising: a result
    of None when it exits with 0, else an error with the exit code."""
    try:
        code = _exit_code(exc.code)
        if code == 0:
            return _result_answer(None)
        error = {
            "type": type(exc).__name__,
            "message": f"the program exited with code {code}",
            "traceback": _user_traceback(exc),
            "line": None,
        }
        return json.dumps({"error": error, "exit_code": code})
    except BaseException:  # a traceback that cannot be formatted...
        return error_answer(exc)


def _result_answer(value):
    try:
        return json.dumps({"result": value}, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return json.dumps({"result": repr(value)}, ensure_ascii=False)


def _start(request, host_call, allow_await, scope):
    """The compiled program and its globals, or the answer reporting why it cannot run."""
    code = request["code"]
    filename = _program_file(code, session=bool(request.get("session")))
    write_whole()
    if request.get("live_output"):
        _flush_lines()
    bound_sleep(request.get("timeout_ms", 0) / 1000)
    try:
        program = _prepare(code, allow_await, filename)
    except SyntaxError as exc:
        return None, None, error_answer(exc, syntax=True)
    if scope is None:
        scope = _SESSION_SCOPE if request.get("session") else {}
    return program, _globals(request, host_call, scope), None


def _globals(request, host_call, scope):
    """`scope` made ready for this run: what an earlier run of a session defined stays,
    but its inputs, tools and result are this run's (a run without a last expression
    must not return the last run's value)."""
    scope.pop(RESULT_NAME, None)
    scope.update(
        {
            "__name__": "__main__",
            "__builtins__": __builtins__,
            "inputs": request.get("inputs"),
            "tools": _Tools(host_call),
            "ToolError": ToolError,
        }
    )
    return scope


def _flush_lines():
    """Someone watches the output as it comes: send each line out as it is printed
    rather than when the program ends (for the rest of the interpreter's life: one
    run's, or a session's later steps too, which then only flush more often)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            # A stream an earlier step closed or broke stays as it is: the program
            # finds out when it prints, and the step still runs.
            with contextlib.suppress(Exception):
                reconfigure(line_buffering=True)


def execute(request, host_call):
    """Run the request's program; the JSON answer."""
    # Without top-level await the program never suspends, so the coroutine below runs
    # to its end on the first step.
    run = execute_async(request, host_call, allow_await=False)
    try:
        run.send(None)
    except StopIteration as finished:
        return finished.value
    run.close()
    raise RuntimeError("a program without top-level await suspended")


async def execute_async(request, host_call, allow_await=True, scope=None):
    """`execute`, allowing top-level `await` in the program.

    `scope`, when given, is the globals the program runs in, which the caller keeps
    from one run to the next (a session's steps); each run otherwise gets new ones.
    """
    program, scope, refused = _start(request, host_call, allow_await, scope)
    if refused is not None:
        return refused
    try:
        pending = eval(program, scope)
        if pending is not None:  # a coroutine when the program awaits at top level
            await pending
    except SystemExit as exc:
        answer = _exit_answer(exc)
    except BaseException as exc:  # the program's own failure, reported as its result
        answer = error_answer(exc)
    else:
        answer = _result_answer(scope.get(RESULT_NAME))
    _flush_output()
    return answer


def _flush_output():
    """Write out what the program left buffered. A stream it closed, replaced or broke
    loses that output, as at CPython's exit, and never the program's own outcome: a
    failure here is not the program's, so it is ignored."""
    for name in ("stdout", "stderr"):
        with contextlib.suppress(BaseException):
            getattr(sys, name).flush()
