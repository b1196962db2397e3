"""The wasm-python guest: runs one program inside a fresh CPython 3.14 component.

Built by componentize-py and pre-initialised at build time: everything imported at the
top of this module (the interpreter, this shim, `python_program` and the standard-library
modules in PRELOADED) is already in memory when an instance starts. The rest of the
standard library is exported at build time (`stdlib_export`) and mounted read-only at
/python in every instance, so a program imports any other module from there, lazily.

The operator's packages, if any, are mounted read-only at /packages, which an instance
puts on `sys.path` at its first call. The host calls `run("")` as it makes an instance
(see `WitWorld.run`), then `run(request)`
once, for its execution, or once per step of a session (`"session": true`, whose steps
share one namespace); the program's contract and the JSON answer are `python_program`'s,
shared with every Python executor.
"""

# First, so that what exporting imports is forgotten before anything else is imported.
import stdlib_export

stdlib_export.export_beside(__file__, "stdlib")

import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

import guest_asyncio  # noqa: E402
import python_program  # noqa: E402
import wit_world  # noqa: E402

guest_asyncio.install()

# The standard-library modules imported at build time, so already in memory when an
# instance starts: those most programs use, the ones models write with (asyncio for
# concurrent tool calls, logging, pathlib, shutil) among them: each of those took
# tens of milliseconds to import in every execution. Any other module is imported
# from /python when a program asks for it.
PRELOADED = (
    "abc",
    "argparse",
    "array",
    "asyncio",
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
    "glob",
    "graphlib",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "inspect",
    "io",
    "itertools",
    "json",
    "keyword",
    "logging",
    "math",
    "numbers",
    "operator",
    "pathlib",
    "pprint",
    "random",
    "re",
    "secrets",
    "shlex",
    "shutil",
    "statistics",
    "string",
    "struct",
    "tempfile",
    "textwrap",
    "time",
    "traceback",
    "types",
    "typing",
    "unicodedata",
    "urllib.parse",
    "uuid",
    "warnings",
    "weakref",
    "zipfile",
    "zlib",
)

for _name in PRELOADED:
    __import__(_name)


def _no_daemon(method, params):
    return '{"error": {"code": -32601, "message": "there is no daemon at build time"}}'


def _warm_up():
    """Run a result, a raised error and a syntax error through `python_program` once.

    Pre-initialisation keeps the interpreter as this leaves it: the program path's code
    already specialised and its caches filled, rather than in every fresh instance (a
    trivial program's run took ~7% less in-process, alternated with a build without).
    """
    for code in ("xs = [1, 2]\nlen(xs)", "raise ValueError('warm-up')", "return ("):
        python_program.execute({"code": code, "inputs": None, "timeout_ms": 1000}, _no_daemon)


_warm_up()

# What crosses to the host must be valid UTF-8: a lone surrogate (from `json.dumps` of
# a str holding one, or from a program that replaced `json.dumps`) would trap the
# instance on the way out. Replaced as the host's JSON reader replaces them.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
# The answer when the program left none that is text (it replaced the shim's helpers).
_NO_TEXT = '{"error": {"type": "InternalError", "message": "the guest answered no text"}}'


def _valid_text(answer):
    if type(answer) is not str:
        return _NO_TEXT
    return answer if answer.isascii() else _LONE_SURROGATE.sub("\ufffd", answer)


# The execution's own directory for files (see executors/scratch.py): relative paths
# and `tempfile` land there.
SCRATCH = "/tmp"


def _enter_scratch():
    # A host that gives no directory: files fail as they would have.
    with contextlib.suppress(OSError):
        os.chdir(SCRATCH)


# Where the host mounts the operator's packages, read-only, when it has any (see
# executors/wasm_packages.py). Put on `sys.path` by an instance, never at build time:
# searched then, where it does not exist, it would be remembered as empty.
PACKAGES = "/packages"


def _add_packages():
    if PACKAGES not in sys.path and os.path.isdir(PACKAGES):
        sys.path.append(PACKAGES)


class WitWorld(wit_world.WitWorld):
    def run(self, request: str) -> str:
        # The host's first call, as it makes the instance ahead of its execution: the
        # C library's first look at the file system (its preopened directories) and
        # the change of directory are host calls, paid here rather than by the program.
        if not request:
            _add_packages()
            _enter_scratch()
            return ""
        try:
            answer = python_program.execute(json.loads(request), wit_world.host_call)
        except BaseException as exc:  # MemoryError, RecursionError while reporting...
            answer = python_program.error_answer(exc)
        return _valid_text(answer)
