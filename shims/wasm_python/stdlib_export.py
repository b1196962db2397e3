"""Build time only: the guest's standard library, copied out of the build and compiled.

componentize-py lends the interpreter its standard library only while it builds the
component; a module not imported then would be missing at run time. `export` copies
the library beside the guest's sources, where the host keeps it with the component and
mounts it read-only at the same path in every instance, so a program imports any
module lazily. Each module is compiled here, by the guest's own CPython (the bytecode's
version must be the guest's), with hash-based pycs that are never checked against their
sources: the files cannot change, and an import then reads one file.
"""

import sys

_BEFORE = frozenset(sys.modules)

import compileall  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import py_compile  # noqa: E402
import shutil  # noqa: E402

# Directories of the library no program can use: third-party packages (the build's),
# CPython's own tests, the GUI and the installer of pip.
LEFT_OUT = frozenset(
    {"site-packages", "__pycache__", "test", "idlelib", "tkinter", "turtledemo", "ensurepip"}
)


def _left_out(_directory, names):
    return [name for name in names if name in LEFT_OUT]


def export(target):
    """Copy the standard library (`sys.prefix`) to `target`, compiled."""
    shutil.copytree(sys.prefix, target, ignore=_left_out)
    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
    if not compileall.compile_dir(target, quiet=2, invalidation_mode=mode, workers=1):
        raise RuntimeError("the standard library did not compile")


def export_beside(source_file, name):
    """`export` into `name` in the directory of `source_file` (the build's), then
    forget every module imported since this one was (itself included): they would only
    take room in every instance. Import this module before any other, or those are
    forgotten too."""
    export(os.path.join(os.path.dirname(os.path.abspath(source_file)), name))
    for module in set(sys.modules) - _BEFORE:
        del sys.modules[module]
    gc.collect()
