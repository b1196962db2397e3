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
the package takes no option for it): there is no `Intl` and no `String.prototype.normalize`,
the locale-taking methods ignore their locale, and regular expressions have no Unicode
property escapes. Nor has the guest a module loader, or what Deno adds to the global
object and to some built-ins. `javascript_lacks` tells from a program's syntax whether
it relies on any of that, so that the registry can give it to an executor that has it.
"""

from __future__ import annotations

import os
import re

from conduit.core import jsontext
from conduit.core.errors import InvalidParams
from conduit.executors.base import ErrorInfo, Job, SessionSpec
from conduit.executors.js_session import rewrite_step
from conduit.executors.js_syntax import (
    MentionKind,
    PreparedModule,
    Syntax,
    may_await,
    prepare_module,
    prepare_parsed,
)
from conduit.executors.syntax_memo import SyntaxMemo
from conduit.executors.ts_erase import NotErasable
from conduit.executors.wasm import ProgramRejected, WasmExecutor
from conduit.executors.wasm_guests import JS_GUEST
from conduit.executors.wasm_sessions import WasmSession

__all__ = [
    "DENO_ONLY_GLOBALS",
    "DENO_ONLY_MEMBERS",
    "GUEST_ONLY_GLOBALS",
    "WasmJsExecutor",
    "javascript_lacks",
    "typescript_lacks",
]

# SpiderMonkey's report when the guest's linear memory cannot grow (a catchable error).
OUT_OF_MEMORY = "out of memory"
# (SpiderMonkey's InternalError is named RangeError in the guest, as V8's is)
OUT_OF_MEMORY_TYPES = ("Error", "InternalError", "RangeError")
# componentize-js exits the instance when the event loop runs dry before `run`'s
# promise settles: the program awaited something nothing could ever settle.
EVENT_LOOP_EMPTY = "proc_exit"
NEVER_SETTLED = (
    "the program awaited a promise that never settled (nothing was left that could settle it)"
)
# What StarlingMonkey writes to stderr as it gives up on such a program: its words for
# what NEVER_SETTLED says, dropped from the program's stderr.
EVENT_LOOP_EMPTY_NOTE = (
    "Error while (call) event loop error, but no exception is pending. Aborting, since that "
    "doesn't seem recoverable at all.\n"
)
# What SpiderMonkey writes to stderr as it aborts, out of memory where no error could
# be thrown (a garbage collection that needs a new chunk): the trap is a memory limit,
# and the line, which names where the engine was built, is not the program's.
UNHANDLABLE_OOM = re.compile(r"Hit MOZ_CRASH\(\[unhandlable oom\][^\n]*\n?\Z")
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
# A regular expression's Unicode property escapes (`/\p{L}/u`, `new RegExp("\\p{L}",
# "u")`) need ICU's tables: without them SpiderMonkey refuses the pattern. Found in the
# text, wherever it is: a program that merely mentions one runs on deno.
UNICODE_PROPERTY_ESCAPES = ("\\p{", "\\P{")


# The globals Deno's runtime has and this guest's has not (a test compares both
# runtimes' global objects): a program that uses one runs on deno.
DENO_ONLY_GLOBALS = frozenset(
    """
    Atomics BroadcastChannel Buffer Cache CacheStorage CloseEvent DOMMatrix
    DOMMatrixReadOnly DOMPoint DOMPointReadOnly DOMQuad DOMRect DOMRectReadOnly Deno
    ErrorEvent EventSource FileReader GPU GPUAdapter GPUAdapterInfo GPUBindGroup
    GPUBindGroupLayout GPUBuffer GPUBufferUsage GPUCanvasContext GPUColorWrite
    GPUCommandBuffer GPUCommandEncoder GPUCompilationInfo GPUCompilationMessage
    GPUComputePassEncoder GPUComputePipeline GPUDevice GPUDeviceLostInfo GPUError
    GPUInternalError GPUMapMode GPUOutOfMemoryError GPUPipelineError GPUPipelineLayout
    GPUQuerySet GPUQueue GPURenderBundle GPURenderBundleEncoder GPURenderPassEncoder
    GPURenderPipeline GPUSampler GPUShaderModule GPUShaderStage GPUSupportedFeatures
    GPUSupportedLimits GPUTexture GPUTextureUsage GPUTextureView GPUUncapturedErrorEvent
    GPUValidationError ImageBitmap ImageBitmapRenderingContext ImageData Intl Location
    Lock LockManager MessageChannel MessageEvent MessagePort Navigator NavigatorUAData
    OffscreenCanvas PerformanceEntry PerformanceMark PerformanceMeasure
    PerformanceObserver PerformanceObserverEntryList ProgressEvent PromiseRejectionEvent
    QuotaExceededError SharedArrayBuffer Storage Temporal TextDecoderStream
    TextEncoderStream TransformStreamDefaultController URLPattern WebAssembly WebSocket
    Window Worker WritableStreamDefaultController WritableStreamDefaultWriter alert
    clearImmediate close closed confirm createImageBitmap getParent global localStorage
    name navigator onbeforeunload onerror onload onunhandledrejection onunload process
    prompt reportError sessionStorage setImmediate
    """.split()  # noqa: SIM905 (a list of words, kept as words)
)

# The members of the built-ins Deno has and this guest's have not (a test compares
# both runtimes' built-ins, but fetch's: there is no fetch on either), "Owner.name" for
# the constructor's or namespace's own, "Owner.prototype.name" for its instances'. A
# program runs on deno when it reads an own member from its owner's name
# (`URL.canParse`, `const { mark } = performance`), or calls an instance member on
# anything at all (`s.normalize()`: the program's own `x.normalize()` too, which then
# only runs slower). String's `normalize` needs ICU.
DENO_ONLY_MEMBERS = frozenset(
    """
    AbortSignal.prototype.getParent CryptoKey.exportNodeMaterial CryptoKey.fromCloneData
    CryptoKey.importSync Date.prototype.toTemporalInstant Error.prepareStackTrace
    Error.stackTraceLimit EventTarget.prototype.getParent String.prototype.normalize
    SubtleCrypto.create SubtleCrypto.prototype.decapsulateBits
    SubtleCrypto.prototype.decapsulateKey SubtleCrypto.prototype.decrypt
    SubtleCrypto.prototype.deriveBits SubtleCrypto.prototype.deriveKey
    SubtleCrypto.prototype.encapsulateBits SubtleCrypto.prototype.encapsulateKey
    SubtleCrypto.prototype.encrypt SubtleCrypto.prototype.exportKey
    SubtleCrypto.prototype.generateKey SubtleCrypto.prototype.getPublicKey
    SubtleCrypto.prototype.unwrapKey SubtleCrypto.prototype.wrapKey SubtleCrypto.supports
    Symbol.metadata URL.canParse URL.parse console.context console.createTask
    console.indentLevel console.profile console.profileEnd console.timeStamp
    performance.addEventListener performance.clearMarks performance.clearMeasures
    performance.clearResourceTimings performance.dispatchEvent performance.getEntries
    performance.getEntriesByName performance.getEntriesByType performance.getParent
    performance.mark performance.measure performance.removeEventListener
    performance.setResourceTimingBufferSize performance.toJSON
    """.split()  # noqa: SIM905 (a list of words, kept as words)
)
# Members the guest has, but not for all they are given: SpiderMonkey's `importKey`
# takes HMAC and raw keys, and traps (the sandbox crashes) on an EC or RSA JWK. A
# program that calls one runs on deno as a program calling a Deno-only member does.
PARTLY_MEMBERS = frozenset({"SubtleCrypto.prototype.importKey"})
_ROUTED_MEMBERS = DENO_ONLY_MEMBERS | PARTLY_MEMBERS
_OWN_MEMBERS = frozenset(
    tuple(member.split(".")) for member in _ROUTED_MEMBERS if ".prototype." not in member
)
_INSTANCE_MEMBERS = frozenset(
    member.rpartition(".")[2] for member in _ROUTED_MEMBERS if ".prototype." in member
)
_MEMBER_NAMES = frozenset(member.rpartition(".")[2] for member in _ROUTED_MEMBERS)

# Text without any of these uses nothing wasm-js lacks, and is not parsed for it: the
# words the rule looks for, and `\u`, which may spell any of them.
_SIGNS = re.compile(
    "|".join(
        re.escape(word)
        for word in sorted(
            {
                "\\u",
                "Deno",
                "import",
                "require",
                "export",
                "Intl",
                "toLocale",
                "localeCompare",
                *UNICODE_PROPERTY_ESCAPES,
                *DENO_ONLY_GLOBALS,
                *_MEMBER_NAMES,
            },
            key=len,
            reverse=True,
        )
    )
)

# The globals this guest has and Deno's runtime has not (a test compares both runtimes'
# global objects): its own `fs`, and SpiderMonkey's. A program that may name one stays
# here rather than move to deno (`moves`), where it would fail: the word itself, or
# `\u`, which may spell it.
GUEST_ONLY_GLOBALS = frozenset({"InternalError", "MultipartFormData", "WorkerLocation", "fs"})
# Each name first, then what comes before it: the engine then looks for the names'
# letters, not at every place for what may come before one (a 1 MiB program: 12 against
# 44 ms, on the event loop).
_NAMES_GUEST_ONLY = re.compile(
    "|".join(rf"{name}(?<![\w$]{name})(?![\w$])" for name in sorted(GUEST_ONLY_GLOBALS)) + r"|\\u"
)
# How much CPU time a program the daemon routed here may take before it is moved to
# deno (`wasm_moves`): past it, deno's compiled code more than makes up for its start.
MOVE_AFTER_CPU_S = 0.05

# What `SyntaxMemo.decided` keeps of a program for this executor.
_LACKS_IN_TYPESCRIPT = "wasm-js lacks, in typescript"
_LACKS_IN_JAVASCRIPT = "wasm-js lacks, in javascript"
_NAMES_A_GUEST_GLOBAL = "wasm-js names a global of its own"
_MODULE = "wasm-js guest module"


def typescript_lacks(code: str, syntax: SyntaxMemo) -> str | None:
    """What the TypeScript program `code` needs that wasm-js does not give it, or None:
    it runs there, its types erased, meaning what it means on deno. The rule: its types
    erase (`ts_erase`: no enum, namespace, decorator, parameter property or anything
    else that needs a compiler, and nothing whose reading erasure would change), and
    the erased program lacks nothing (`javascript_lacks`).

    The erasure is kept in `syntax` for the executor.
    """
    erasure = syntax.erase(code)
    if isinstance(erasure, NotErasable):
        return f"TypeScript that needs a compiler: {erasure.reason}"
    return _lacks_in(erasure.code, erasure.syntax)


def javascript_lacks(code: str, syntax: SyntaxMemo | None = None) -> str | None:
    """What the JavaScript program `code` uses that wasm-js does not have, or None:

    1. a module (`import`, `import()`, `require`: wasm-js has no loader);
    2. one of Deno's globals the guest lacks (`DENO_ONLY_GLOBALS`: `Deno`, `process`,
       `Buffer`...; `Deno` wherever the word is), or a member of a built-in
       (`DENO_ONLY_MEMBERS`: `String.prototype.normalize`, `URL.canParse`...);
    3. what needs ICU: `Intl`, a method whose answer is the locale's, a locale named
       for a case mapping, a Unicode property escape in a regular expression.

    Read from the program's syntax (strings and comments do not count, but for `Deno`
    and property escapes): a name the program declares anywhere is its own, and what a
    program reaches by a name built at run time (`globalThis["De" + "no"]`) is not
    seen. A program that does not parse lacks nothing (the executor reports its error).
    A parse is taken from `syntax` or kept there.
    """
    if not _SIGNS.search(code):
        return None
    memo = syntax if syntax is not None else SyntaxMemo()
    return _lacks_in(code, memo.parse(code, "javascript"))


def _lacks_in(code: str, parsed: Syntax | None) -> str | None:
    """`javascript_lacks`, read from a parse of `code` made already."""
    if parsed is None or not parsed.complete:
        return None
    if parsed.loads_modules():
        return "modules to import"
    used = parsed.globals_used(DENO_ONLY_GLOBALS)
    if "Deno" in code:  # however it is reached, even in a comment or a string
        used.add("Deno")
    if used:
        return f"Deno's globals: {', '.join(sorted(used))}"
    for member in parsed.members(_MEMBER_NAMES):
        if (member.receiver, member.name) in _OWN_MEMBERS:
            return f"{member.receiver}.{member.name}"
        if member.called and member.name in _INSTANCE_MEMBERS:
            return f"the method {member.name}"
    if any(escape in code for escape in UNICODE_PROPERTY_ESCAPES):
        return "Unicode property escapes"
    return "a locale (Intl)" if _uses_a_locale(parsed) else None


def _uses_a_locale(parsed: Syntax) -> bool:
    """Whether the program calls a method whose answer is the locale's, or names a
    locale for a case mapping."""
    for mention in parsed.mentions(("toLocale", "localeCompare")):
        if mention.kind is MentionKind.METHOD_CALL:
            if mention.value in LOCALE_METHODS:
                return True
            if mention.value in LOCALE_CASE_METHODS and mention.has_arguments:
                return True
    return False


class WasmJsExecutor(WasmExecutor):
    """Runs JavaScript programs in fresh SpiderMonkey-on-Wasmtime instances."""

    name = "wasm-js"
    languages = frozenset({"javascript", "typescript"})
    # TypeScript only as far as `typescript_lacks` allows, and never in a session.
    partly = frozenset({"typescript"})
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
    # An error thrown by a callback the program handed over (a timer's, a listener's)
    # ends the run, as it ends a program on Deno (guest.js).
    ends_early = True
    # Where a program that computes for long moves (`moves`).
    moves_to = "deno"

    def __init__(
        self,
        *,
        cache_dir: str | os.PathLike[str],
        fuel: int | None = None,
        move_after_cpu_s: float | None = MOVE_AFTER_CPU_S,
    ) -> None:
        super().__init__(cache_dir=cache_dir, fuel=fuel)
        self.move_after_cpu_s = move_after_cpu_s

    def moves(self, code: str, syntax: SyntaxMemo | None = None) -> float | None:
        """After how much CPU time `code`, routed here (no executor named, no session),
        may be stopped and run again on `moves_to` (`wasm_moves`); None: never, as for a
        program that may use the guest's `fs` or another of `GUEST_ONLY_GLOBALS`. What
        the text says is kept in `syntax` (its reading is O(size): see `registry`)."""
        if self.move_after_cpu_s is None:
            return None
        memo = SyntaxMemo() if syntax is None else syntax
        guest_only = memo.decided(
            _NAMES_A_GUEST_GLOBAL,
            code,
            lambda: bool(_NAMES_GUEST_ONLY.search(code)),
            shared=False,  # a flag: a short program's text is read again in microseconds
        )
        return None if guest_only else self.move_after_cpu_s

    @staticmethod
    def lacks(
        code: str, syntax: SyntaxMemo | None = None, language: str = "javascript"
    ) -> str | None:
        """What `code` uses that this executor does not have, or None
        (`javascript_lacks`, `typescript_lacks`)."""
        memo = SyntaxMemo() if syntax is None else syntax
        if language == "typescript":
            return memo.decided(_LACKS_IN_TYPESCRIPT, code, lambda: typescript_lacks(code, memo))
        if not _SIGNS.search(code):
            return None  # the text alone says so: nothing worth keeping
        return memo.decided(_LACKS_IN_JAVASCRIPT, code, lambda: javascript_lacks(code, memo))

    def request_for(self, job: Job, *, session: bool = False) -> str:
        if session:  # a step's source is rewritten: the request's parse is not of it
            code = self.session_source(job.code)
            module = prepare_module(code, "javascript")
        else:
            code, module = job.syntax.decided(
                (_MODULE, job.language), job.code, lambda: _guest_module(job)
            )
            job.syntax.forget()
        if module.imports:
            raise ProgramRejected(ErrorInfo("SyntaxError", NO_IMPORTS))
        asynchronous = may_await(code)
        # Strict, as a module's code is on deno, where either language may run: a
        # program means the same whichever executor the rule gives it.
        request = {
            "function": module.function_expression(asynchronous=asynchronous, strict=True),
            "asynchronous": asynchronous,
            "line_offset": module.line_offset,
            "column_shift": module.column_shift,
            "inputs": job.inputs,
            "timeout_ms": job.limits.timeout_ms,
        }
        return jsontext.dumps(request)

    async def open_session(self, spec: SessionSpec) -> WasmSession:
        if spec.language == "typescript":
            raise InvalidParams(
                "invalid params: wasm-js runs TypeScript programs one at a time, not in "
                "sessions; open the session with executor 'deno', or in javascript",
                {"field": "language", "reason": "no TypeScript sessions on wasm-js"},
            )
        return await super().open_session(spec)

    def session_source(self, code: str) -> str:
        """A session step's program as the guest runs it. Every step runs in the same
        global object; its top-level declarations are made the global object's
        (`js_session`), so what one step declares is there for the next."""
        return rewrite_step(code, "javascript")

    def is_out_of_memory(self, error: ErrorInfo) -> bool:
        return error.type in OUT_OF_MEMORY_TYPES and error.message == OUT_OF_MEMORY

    def out_of_memory_stderr(self, stderr: str) -> str | None:
        found = UNHANDLABLE_OOM.search(stderr)
        return None if found is None else stderr[: found.start()]

    def explain_trap(self, trap: str) -> ErrorInfo | None:
        if EVENT_LOOP_EMPTY in trap:
            return ErrorInfo("Error", NEVER_SETTLED)
        if any(sign in trap for sign in MODULE_LOAD_SIGNS):
            return ErrorInfo("Error", NO_MODULE_LOADER)
        return None

    def program_stderr(self, stderr: str, explained: ErrorInfo) -> str:
        if explained.message == NEVER_SETTLED:
            return stderr.removesuffix(EVENT_LOOP_EMPTY_NOTE)
        return stderr


def _guest_module(job: Job) -> tuple[str, PreparedModule]:
    """The job's program as the guest runs it (TypeScript erased), and its wrapping."""
    if job.language == "typescript":
        code, parsed = _erased(job)
        return code, prepare_parsed(code, parsed)
    return job.code, prepare_parsed(job.code, job.syntax.take(job.code, "javascript"))


def _erased(job: Job) -> tuple[str, Syntax]:
    """A TypeScript job's program as JavaScript, and its parse; `ProgramRejected`
    when its types do not erase (only a request naming wasm-js gets here then)."""
    erasure = job.syntax.take_erased(job.code)
    if isinstance(erasure, NotErasable):
        raise ProgramRejected(
            ErrorInfo(
                "SyntaxError",
                f"wasm-js runs TypeScript whose types erase, and this has {erasure.reason}; "
                "run it with executor 'deno'",
            )
        )
    return erasure.code, erasure.syntax
