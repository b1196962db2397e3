"""The standard-library modules a Python executor cannot offer, and why.

Every other module in the guest's `sys.stdlib_module_names` imports, on every Python
executor: `tests/executors/test_python_stdlib.py` imports each of them and fails on any
gap not listed here, and `docs/executors.md` shows these tables.
"""

from __future__ import annotations

__all__ = ["MISSING", "missing_modules"]

OTHER_SYSTEMS = "Windows, macOS or other platforms only"
TERMINAL = "need a terminal or a display"
SYSTEM = "need processes, users or the system's services"
SUBINTERPRETERS = "need threads or a debugger (subinterpreters, remote debugging)"
C_LIBRARIES = "C libraries the WebAssembly build of CPython lacks"
LEFT_OUT = "left out of Pyodide's build (decimal is its C version; no help texts, no browser)"

# By reason; the names are as `sys.stdlib_module_names` lists them, private ones too.
_WINDOWS = ("_overlapped", "_scproxy", "_winapi", "_wmi", "msvcrt", "nt", "winreg", "winsound")
_TERMINAL = ("_curses", "_curses_panel", "_tkinter", "curses", "idlelib", "readline", "tkinter")
_TERMINAL += ("turtle", "turtledemo")
_SUBINTERPRETERS = ("_interpchannels", "_interpqueues", "_interpreters")

_WASM_PYTHON: dict[str, tuple[str, ...]] = {
    OTHER_SYSTEMS: _WINDOWS,
    TERMINAL: (*_TERMINAL, "pty", "termios", "tty"),
    SYSTEM: (
        "_multiprocessing",
        "_posixshmem",
        "_posixsubprocess",
        "ensurepip",
        "fcntl",
        "grp",
        "mmap",
        "pwd",
        "resource",
        "syslog",
    ),
    SUBINTERPRETERS: (*_SUBINTERPRETERS, "_remote_debugging"),
    C_LIBRARIES: (
        "_bz2",
        "_ctypes",
        "_dbm",
        "_gdbm",
        "_hashlib",
        "_lzma",
        "_ssl",
        "_uuid",
        "_zstd",
        "bz2",
        "ctypes",
        "lzma",
        "ssl",
    ),
}

_PYODIDE: dict[str, tuple[str, ...]] = {
    OTHER_SYSTEMS: (
        *_WINDOWS,
        "_aix_support",
        "_android_support",
        "_apple_support",
        "_ios_support",
        "_osx_support",
    ),
    TERMINAL: _TERMINAL,
    SYSTEM: (
        "_multiprocessing",
        "_posixshmem",
        "ensurepip",
        "grp",
        "pwd",
        "resource",
        "syslog",
        "venv",
    ),
    SUBINTERPRETERS: _SUBINTERPRETERS,
    C_LIBRARIES: ("_dbm", "_gdbm", "_hashlib", "_uuid", "dbm"),
    LEFT_OUT: ("_pydecimal", "antigravity", "pydoc_data"),
}

MISSING: dict[str, dict[str, tuple[str, ...]]] = {
    "wasm-python": _WASM_PYTHON,
    "pyodide": _PYODIDE,
}


def missing_modules(executor: str) -> dict[str, str]:
    """The modules `executor` cannot import, each with its reason."""
    return {
        module: reason
        for reason, modules in MISSING.get(executor, {}).items()
        for module in modules
    }
