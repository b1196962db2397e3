"""The wasm-js executor: JavaScript programs in SpiderMonkey compiled to WebAssembly.

The guest (`shims/wasm_js/guest.js`) is built into a component by componentize-js and
pre-initialised (`wasm_guests.JS_GUEST`). The host wraps each program as an async
function with `js_syntax.prepare_parsed`, the same rewrite the Deno executor uses, so
top-level `await` and `return` and the completion value of a final expression mean the
same on both; the guest evaluates it and awaits it. Everything about running it is
shared with the other Wasmtime executors (`wasm.WasmExecutor`).

A session's steps run one after the other in one instance (`wasm_sessions`): what a
step puts on the global object is there for the next. Each step's source goes through
`session_source` first, the one place that may rewrite it for that.

A program that cannot `await` (`js_syntax.may_await`) is wrapped as a plain function
instead, and the guest settles its value or error exactly as an async function's would
be: the same result, output and error, microtask for microtask. (Only the wrapper
itself differs, for a program that inspects it through `arguments.callee` or a
function's `caller`.) What that buys: a primitive result is answered without entering
componentize-js's event loop.

The guest has no module loader: a program with `import` declarations is refused with
a message that names the executor that has one.

SpiderMonkey comes without ICU in componentize-js's engine (built `--without-intl-api`;
the package takes no option for it): there is no `Intl`, and the locale-taking methods
ignore their locale. `uses_intl` tells from a program's syntax whether it relies on
either, so that the registry can give it to an executor that has them.
"""

from __future__ import annotations

from conduit.core import jsontext
from conduit.executors.base import ErrorInfo, Job
from conduit.executors.js_session import rewrite_step
from conduit.executors.js_syntax import MentionKind, may_await, prepare_module, prepare_parsed
from conduit.executors.syntax_memo import SyntaxMemo
from conduit.executors.wasm import ProgramRejected, WasmExecutor
from conduit.executors.wasm_guests import JS_GUEST

__all__ = ["WasmJsExecutor", "uses_intl"]

# SpiderMonkey's report when the guest's linear memory cannot grow (a catchable error).
OUT_OF_MEMORY = "out of memory"
# componentize-js exits the instance when the event loop runs dry before `run`'s
# promise settles: the program awaited something nothing could ever settle.
EVENT_LOOP_EMPTY = "proc_exit"
NEVER_SETTLED = (
    "the program awaited a promise that never settled (nothing was left that could settle it)"
)
# The WASI file calls a module load traps in: there is no file system to load from.
MODULE_LOAD_SIGNS = ("path_filestat_get", "path_open")
NO_MODULE_LOADER = (
    "import() is not available on the wasm-js executor: it has no module loader (no "
    "files, no network); use plain JavaScript, or run the program with executor 'deno'"
)
NO_IMPORTS = (
    "import declarations are not available on the wasm-js executor (it has no module "
    "loader); use plain JavaScript, or run the program with executor 'deno'"
)

# Methods whose answer is the locale's (the default one's, called with no arguments):
# without ICU, numbers and dates come back unformatted ("1234567.891" for
# "1,234,567.891") and strings compare by code unit ("a" after "B").
LOCALE_METHODS = frozenset(
    {"toLocaleString", "toLocaleDateString", "toLocaleTimeString", "localeCompare"}
)
# Case mappings differ from the plain ones only for a locale that is named ("tr").
LOCALE_CASE_METHODS = frozenset({"toLocaleUpperCase", "toLocaleLowerCase"})
# Text without any of these cannot use Intl: most programs are never parsed.
_INTL_WORDS = ("Intl", "toLocale", "localeCompare")


def uses_intl(code: str, syntax: SyntaxMemo | None = None) -> bool:
    """Whether `code` names `Intl`, calls a method whose answer is the locale's, or
    names a locale for a case mapping.

    Read from the program's syntax, so a word in a string or a comment does not count;
    a name the program builds at run time (`globalThis["In" + "tl"]`) is not seen. A
    program that does not parse counts as not using it (the executor reports its error).
    A parse is taken from `syntax` or kept there (`SyntaxMemo.parse`).
    """
    if not any(word in code for word in _INTL_WORDS):
        return False
    memo = syntax if syntax is not None else SyntaxMemo()
    parsed = memo.parse(code, "javascript")
    if parsed is None or not parsed.complete:
        return False
    for mention in parsed.mentions(_INTL_WORDS):
        if mention.kind in (MentionKind.NAME, MentionKind.GLOBAL_PROPERTY):
            if mention.value == "Intl":
                return True
        elif mention.kind is MentionKind.METHOD_CALL:
            if mention.value in LOCALE_METHODS:
                return True
            if mention.value in LOCALE_CASE_METHODS and mention.has_arguments:
                return True
    return False


class WasmJsExecutor(WasmExecutor):
    """Runs JavaScript programs in fresh SpiderMonkey-on-Wasmtime instances."""

    name = "wasm-js"
    languages = frozenset({"javascript"})
    recipe = JS_GUEST
    runtime = "SpiderMonkey"
    # Kept resident, the pages a trivial program touches need no faults: its run halves,
    # and the cost moves to the reset after the answer is sent (more would not help:
    # a trivial program touches less than this).
    keep_resident_bytes = 16 * 1024 * 1024
    # A JavaScript program reaches no WASI call: every wait it can make is a timer,
    # which the guest bounds by the execution's deadline on a clock it captured before
    # any program ran (guest.js), and a runner a cancelled run leaves waiting is within
    # `wasm_lingering`'s caps. SpiderMonkey reads the clock ~9 times a run, and each
    # read through the host's bounded clock is a Python call: 20% of a trivial run.
    host_bounds_waits = False
    # Its programs' `fs` (shims/wasm_js/fs.js) reaches the working directory through
    # host calls (`wasm_fs`): SpiderMonkey's guest has no file API over WASI.
    files = True
    preopen_files = False

    @staticmethod
    def lacks(code: str, syntax: SyntaxMemo | None = None) -> str | None:
        """What `code` uses that this executor does not have ("Intl"), or None."""
        return "Intl" if uses_intl(code, syntax) else None

    def request_for(self, job: Job, *, session: bool = False) -> str:
        if session:  # a step's source is rewritten: the request's parse is not of it
            code = self.session_source(job.code)
            module = prepare_module(code, "javascript")
        else:
            code = job.code
            module = prepare_parsed(code, job.syntax.take(code, "javascript"))
        if module.imports:
            raise ProgramRejected(ErrorInfo("SyntaxError", NO_IMPORTS))
        asynchronous = may_await(code)
        request = {
            "function": module.function_expression(asynchronous=asynchronous),
            "asynchronous": asynchronous,
            "line_offset": module.line_offset,
            "inputs": job.inputs,
            "timeout_ms": job.limits.timeout_ms,
        }
        return jsontext.dumps(request)

    def session_source(self, code: str) -> str:
        """A session step's program as the guest runs it. Every step runs in the same
        global object; its top-level declarations are made the global object's
        (`js_session`), so what one step declares is there for the next."""
        return rewrite_step(code, "javascript")

    def is_out_of_memory(self, error: ErrorInfo) -> bool:
        return error.type in ("Error", "InternalError") and error.message == OUT_OF_MEMORY

    def explain_trap(self, trap: str) -> ErrorInfo | None:
        if EVENT_LOOP_EMPTY in trap:
            return ErrorInfo("Error", NEVER_SETTLED)
        if any(sign in trap for sign in MODULE_LOAD_SIGNS):
            return ErrorInfo("Error", NO_MODULE_LOADER)
        return None
