# A trusted program shims/pyodide_compile.js runs in a fresh Pyodide interpreter: the
# operator's packages, whose sources it finds zipped where interpreters will import
# them from, compiled by Pyodide's own CPython into a zip of their bytecode alone (see
# executors/pyodide_packages.py). Compiling runs none of their code. Hash-based pycs,
# never checked against their sources, each beside its source (where `zipimport`
# looks), naming the sources as interpreters see them. A file that does not compile (a
# test written for Python 2) is left as it is: its import fails as it would anywhere.
import compileall
import os
import py_compile
import zipfile

SITE_ZIP = "/lib/site-packages.zip"
SOURCES = "/tmp/packages"
COMPILED = "/tmp/compiled.zip"

with zipfile.ZipFile(SITE_ZIP) as sources:
    sources.extractall(SOURCES)
compileall.compile_dir(
    SOURCES,
    quiet=2,
    ddir=SITE_ZIP,
    legacy=True,
    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    workers=1,
)
with zipfile.ZipFile(COMPILED, "w") as compiled:
    for root, _dirs, names in os.walk(SOURCES):
        for name in sorted(names):
            if name.endswith(".pyc"):
                path = os.path.join(root, name)
                compiled.write(path, os.path.relpath(path, SOURCES))
