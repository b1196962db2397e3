# A trusted program the host runs in an instance of the plain wasm-python guest, with
# the operator's unpacked packages mounted writable (see executors/wasm_packages.py):
# compiled by the guest's own CPython, their bytecode is what it imports. Compiling
# runs none of their code. Hash-based pycs, never checked against their sources (which
# are read-only where programs see them), naming the sources where programs see them.
# A file that does not compile (a test written for Python 2) is left as it is: its
# import fails as it would anywhere.
import compileall
import importlib._bootstrap_external
import os
import py_compile

where = inputs  # noqa: F821 (the request's inputs, as every program's)


def _write_whole(path, data, mode=0o666):
    # Wasmtime's WASI writes a large pyc in pieces, which `_write_atomic`, writing it
    # once, takes for a failure: a buffered file writes every piece.
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as file:
        file.write(data)
    os.chmod(temporary, mode & 0o666)
    os.replace(temporary, path)


importlib._bootstrap_external._write_atomic = _write_whole
compileall.compile_dir(
    where["dir"],
    quiet=2,
    ddir=where["guest_dir"],
    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    workers=1,
)
