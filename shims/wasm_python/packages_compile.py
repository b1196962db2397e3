"""Build time only: the operator's packages compiled by the guest's CPython.

The app of a throwaway componentize-py build (`wasm_guests.compile_packages`): the
bytecode must be CPython 3.14's, which the host's Python may not be, and compiling
within the guest's own build would leave what the compiler allocated and freed in the
memory every instance starts with (~45 MB for sympy). It compiles `packages/` next to
this file into hash-based pycs, never checked against their sources, as OPTIONS (a
JSON file beside it) says: `guest_dir`, where the guest sees the directory (so
tracebacks name it), and `legacy`, a pyc beside each source (what `zipimport` reads)
rather than in `__pycache__`. A file that does not compile (a test written for
Python 2) is left as it is: its import fails as it would anywhere.
"""

import compileall
import json
import os
import py_compile

HERE = os.path.dirname(os.path.abspath(__file__))
OPTIONS = "packages_compile.json"

with open(os.path.join(HERE, OPTIONS), encoding="utf-8") as _file:
    _options = json.load(_file)

compileall.compile_dir(
    os.path.join(HERE, "packages"),
    quiet=2,
    ddir=_options["guest_dir"],
    legacy=_options["legacy"],
    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    workers=1,
)


class _Compiled:
    """The world's export, never called: the component is thrown away."""

    def run(self, request: str) -> str:
        return ""


# The name componentize-py looks the world's exports up by.
WitWorld = _Compiled
