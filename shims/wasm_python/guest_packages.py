"""The wasm-python guest with the operator's packages (see executors/packages.py).

Built instead of `guest` when the configuration lists packages. The build unpacks their
wheels into `packages/` beside this module; importing this compiles them with the
guest's own CPython, as `stdlib_export` compiles the standard library, and the host
keeps that directory with the component and mounts it read-only at PACKAGES in every
instance. The instance's first call puts PACKAGES on `sys.path`: searched at build
time, where the directory is not, it would be remembered as empty.
"""

import os
import sys

# It exports the standard library and forgets what exporting imported (`os` and `sys`
# are loaded with the interpreter: importing them first adds nothing).
import guest

PACKAGES = "/packages"


def _compile(source_dir):
    """Compile the packages' modules, then forget the modules compiling imported: they
    would only take room in every instance."""
    before = frozenset(sys.modules)
    import compileall
    import py_compile

    # A file that does not compile (a test written for Python 2) is left as it is: its
    # import fails as it would anywhere.
    mode = py_compile.PycInvalidationMode.UNCHECKED_HASH
    compileall.compile_dir(source_dir, quiet=2, ddir=PACKAGES, invalidation_mode=mode, workers=1)
    for module in set(sys.modules) - before:
        del sys.modules[module]


_compile(os.path.join(os.path.dirname(os.path.abspath(__file__)), "packages"))


class PackagesWorld(guest.WitWorld):
    def run(self, request: str) -> str:
        if not request and PACKAGES not in sys.path:
            sys.path.append(PACKAGES)
        return super().run(request)


# The name componentize-py looks the world's exports up by.
WitWorld = PackagesWorld
