"""Escape attempts against the Pyodide sandbox, with real Deno and real Pyodide.

Python runs in WebAssembly inside a Deno process that holds no permission once the
program exists; `import js` and `pyodide.code.run_js` reach that process's JavaScript,
so every row here is tried from Python, and the JavaScript ones through Deno's own
APIs. Each asserts that the attempt is refused; that the executor still works after it
(an attack must not break the executor for everyone else) shows in the next attempt's
refusal, and after the last in `test_the_executor_still_works_after_every_attack`.

Slow: each interpreter restores Pyodide from its snapshot. The attempts share one
executor, as a daemon's programs do: each still runs in a fresh interpreter.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors.base import Status
from tests.e2e.helpers import wait_upstreams
from tests.e2e.test_pyodide_tools import share_install
from tests.e2e.test_tools import ECHO
from tests.executors.test_pyodide import SharedPyodide, shared_pyodide
from tests.sandboxes import LOAD_WAIT_S, TIMES_OUT, Attacks, each_attack
from tests.security.test_deno_sandbox import attack_the_callback_channel

# Pyodide alone: no test here waits for the wasm components to be built.
pytestmark = [pytest.mark.slow, pytest.mark.no_wasm]

SECRET = "env-s3cret"


@pytest.fixture(scope="module", autouse=True)
def _secret_in_the_environment() -> Iterator[None]:
    """A secret in the daemon's environment, which no program may read, from before
    the module's executor starts."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CONDUIT_TEST_SECRET", SECRET)
        yield


@pytest.fixture(scope="module")
def pyodide(
    _secret_in_the_environment: None,
    tmp_path_factory: pytest.TempPathFactory,
    pyodide_install: Path,
) -> Iterator[SharedPyodide]:
    """One executor for every attack, as a daemon's: each runs in a fresh interpreter."""
    with shared_pyodide(tmp_path_factory.mktemp("pyodide"), pyodide_install) as executor:
        yield executor


_attacks = Attacks("python", "1 + 1", wait_s=LOAD_WAIT_S, check_after_each=False)
refused = _attacks.refused


# -- one attempt a row: (name, program, what the refusal says) --------------------------


def js_call(expr: str) -> str:
    """A program returning the JavaScript expression `expr` (`js` imported)."""
    return f"import js\nreturn {expr}"


def js_await(expr: str) -> str:
    """A program awaiting the JavaScript promise `expr` (`js` imported)."""
    return f"import js\nreturn await {expr}"


def run_js(source: str) -> str:
    """A program evaluating JavaScript `source` in the worker's global scope."""
    return f"from pyodide.code import run_js\nreturn await run_js({source!r})"


# Asks Deno for a permission, filled in by name (--no-prompt answers "denied").
REQUEST = (
    "import js\n"
    "s = js.Deno.permissions.requestSync(js.Object.fromEntries([['name', {!r}]]))\n"
    "if s.state != 'granted':\n"
    "    raise PermissionError(s.state)"
)

# This checkout, on the host: no path of it is in the sandbox's file system.
REPO = Path(__file__).resolve().parents[2]

ATTACKS = [
    # the virtual file system holds none of the host's files
    ("open_passwd", "return open('/etc/passwd').read()", "FileNotFoundError"),
    ("open_environ", "return open('/proc/self/environ').read()", "FileNotFoundError"),
    ("open_project", f"return open({str(REPO / 'pyproject.toml')!r}).read()", "FileNotFoundError"),
    # the program's own working directory is /work, in memory: the host's repo is not there
    ("listdir_host_repo", f"import os\nreturn os.listdir({str(REPO)!r})", "FileNotFoundError"),
    ("env_secret", "import os\nreturn os.environ['CONDUIT_TEST_SECRET']", "KeyError"),
    # files through Deno
    ("deno_read", js_call("js.Deno.readTextFileSync('/etc/passwd')"), "read access"),
    ("deno_read_async", js_await("js.Deno.readTextFile('/etc/passwd')"), "read access"),
    ("deno_read_dir", js_call("js.Deno.readDirSync('/')"), "read access"),
    ("deno_stat", js_call("js.Deno.statSync('/etc/passwd')"), "read access"),
    ("deno_real_path", js_call("js.Deno.realPathSync('/')"), "read access"),
    ("deno_read_link", js_call("js.Deno.readLinkSync('/proc/self/exe')"), "read access"),
    ("deno_watch", js_call("js.Deno.watchFs('/')"), "read access"),
    ("deno_chdir", js_call("js.Deno.chdir('/')"), "read access"),
    (
        "deno_write",
        js_call("js.Deno.writeTextFileSync('/tmp/conduit-attack', 'x')"),
        "write access",
    ),
    ("deno_remove", js_call("js.Deno.removeSync('/tmp/conduit-attack')"), "write access"),
    ("deno_mkdir", js_call("js.Deno.mkdirSync('/tmp/conduit-attack-dir')"), "write access"),
    ("deno_temp_dir", js_call("js.Deno.makeTempDirSync()"), "write access"),
    ("deno_chmod", js_call("js.Deno.chmodSync('/tmp', 511)"), "write access"),
    ("deno_truncate", js_call("js.Deno.truncateSync('/etc/hostname', 0)"), "write access"),
    (
        "deno_symlink",
        js_call("js.Deno.symlinkSync('/etc/passwd', '/tmp/conduit-link')"),
        "NotCapable",
    ),
    (
        "deno_copy",
        js_call("js.Deno.copyFileSync('/etc/passwd', '/tmp/conduit-copy')"),
        "read access",
    ),
    ("deno_open", js_await("js.Deno.open('/etc/hostname')"), "read access"),
    ("fetch_file", js_await("js.fetch('file:///etc/passwd')"), "read access"),
    # environment and system
    ("deno_env_get", js_call("js.Deno.env.get('PATH')"), "env access"),
    ("deno_env_object", js_call("js.Deno.env.toObject()"), "env access"),
    ("deno_hostname", js_call("js.Deno.hostname()"), "sys access"),
    ("deno_os_release", js_call("js.Deno.osRelease()"), "sys access"),
    ("deno_loadavg", js_call("js.Deno.loadavg()"), "sys access"),
    ("deno_interfaces", js_call("js.Deno.networkInterfaces()"), "sys access"),
    ("deno_uid", js_call("js.Deno.uid()"), "sys access"),
    ("deno_memory_info", js_call("js.Deno.systemMemoryInfo()"), "sys access"),
    # processes and native code
    ("deno_command", js_call("js.Deno.Command.new('/usr/bin/id').outputSync()"), "run access"),
    ("deno_dlopen", js_call("js.Deno.dlopen('libc.so.6', js.Object.new())"), "ffi access"),
    (
        "subprocess",
        "import subprocess\nreturn subprocess.run(['id'], capture_output=True).stdout",
        "does not support processes",
    ),
    (
        "os_system",
        "import os\nif os.system('id') != 0:\n    raise OSError('refused')",
        "OSError: refused",
    ),
    ("fork", "import os\nreturn os.fork()", "Function not implemented"),
    (
        "ctypes_libc",
        "import ctypes\nreturn ctypes.CDLL('libc.so.6').getpid()",
        "could not load dynamic lib",
    ),
    # the network
    ("fetch", js_await("js.fetch('http://127.0.0.1:8080/')"), "net access"),
    (
        "deno_connect",
        js_await(
            "js.Deno.connect(js.Object.fromEntries([['hostname', '127.0.0.1'], ['port', 22]]))"
        ),
        "net access",
    ),
    ("deno_listen", js_call("js.Deno.listen(js.Object.fromEntries([['port', 0]]))"), "net access"),
    # Deno reads the resolver's configuration before its permission check: the sandbox
    # has no /etc/resolv.conf (nor any network to ask).
    ("deno_dns", js_await("js.Deno.resolveDns('example.com', 'A')"), "No such file"),
    (
        "websocket",
        run_js(
            "new Promise((ok, no) => { const w = new WebSocket('ws://127.0.0.1:1/');"
            " w.onopen = ok; w.onerror = (e) => no(new Error(String(e.message))); })"
        ),
        "net access",
    ),
    (
        "socket",
        "import socket\nreturn socket.create_connection(('127.0.0.1', 22), timeout=1)",
        "Host is unreachable",
    ),
    (
        "urllib",
        "import urllib.request\nreturn urllib.request.urlopen('http://127.0.0.1:1/').read()",
        "Host is unreachable",
    ),
    ("deno_serve", run_js("Deno.serve({port: 0}, () => new Response('x'))"), "net access"),
    # permissions
    ("request_read", REQUEST.format("read"), "PermissionError: denied"),
    ("request_net", REQUEST.format("net"), "PermissionError: denied"),
    ("request_run", REQUEST.format("run"), "PermissionError: denied"),
    # what the worker took away from JavaScript
    ("deno_exit", js_call("js.Deno.exit(0)"), "AttributeError: exit"),
    ("deno_kill", js_call("js.Deno.kill(1, 'SIGKILL')"), "AttributeError: kill"),
    (
        "deno_stdout",
        js_call("js.Deno.stdout.writeSync(js.Uint8Array.new(1))"),
        "AttributeError: stdout",
    ),
    (
        "deno_stdin",
        js_call("js.Deno.stdin.readSync(js.Uint8Array.new(1))"),
        "AttributeError: stdin",
    ),
    ("close", js_call("js.close()"), "AttributeError: close"),
    ("worker", js_call("js.Worker.new('data:application/javascript,1')"), "AttributeError: Worker"),
    (
        "signal_listener",
        js_call("js.Deno.addSignalListener('SIGTERM', js.Object.new())"),
        "AttributeError: addSignalListener",
    ),
    # JavaScript's own ways out, reached from Python
    ("run_js_read", run_js("Deno.readTextFileSync('/etc/passwd')"), "read access"),
    ("run_js_exit", run_js("Deno.exit(0)"), "Deno.exit is not a function"),
    ("import_file", run_js("import('file:///etc/passwd')"), "read access"),
    ("import_remote", run_js("import('https://deno.land/std/version.ts')"), "import access"),
    ("import_npm", run_js("import('npm:left-pad')"), "--no-npm"),
    (
        "load_package",
        "import pyodide_js\nawait pyodide_js.loadPackage('numpy')\nimport numpy",
        "No module named 'numpy'",
    ),
    (
        "micropip",
        "import micropip\nreturn await micropip.install('requests')",
        "No module named 'micropip'",
    ),
]


@each_attack(ATTACKS)
async def test_attack_is_refused(pyodide: SharedPyodide, code: str, refusal: str) -> None:
    outcome = await _attacks.refused_with(pyodide, code, refusal)
    seen = f"{outcome.result} {outcome.stdout} {outcome.stderr} {outcome.error}"
    assert SECRET not in seen
    assert "root:" not in seen


async def test_the_executor_still_works_after_every_attack(pyodide: SharedPyodide) -> None:
    """Run after the rows above (pytest keeps a module's order): the last one left the
    executor working too."""
    await _attacks.still_works(pyodide)


# -- resources ----------------------------------------------------------------------------


async def test_an_infinite_loop_times_out(pyodide: SharedPyodide) -> None:
    limits, status = TIMES_OUT
    outcome = await refused(pyodide, "while True:\n    pass", **limits)
    assert outcome.status is status
    await _attacks.still_works(pyodide)  # its interpreter was stopped, not the executor


async def test_output_flood_is_stopped(pyodide: SharedPyodide) -> None:
    code = "while True:\n    print('x' * 1000)"
    outcome = await refused(pyodide, code, output_bytes=100_000, timeout_ms=60_000)
    assert outcome.status is Status.OUTPUT_LIMIT
    assert len(outcome.stdout) == 100_000
    await _attacks.still_works(pyodide)


# -- the tool-callback channel ------------------------------------------------------------

# What the hole allowed, tried from Python through `import js`: each entry records
# "ALLOWED" or the refusal's first word; `open` is what Deno's internals show of the
# process's open resources.
CALLBACK_ATTACK = """
import importlib

from pyodide.ffi import to_js

# Spelled so the policy's source filter, which is not the sandbox, lets it through.
js = importlib.import_module("".join(["j", "s"]))

path = inputs["path"]
folder = path.rsplit("/", 1)[0]


def options(**fields):
    return to_js(fields, dict_converter=js.Object.fromEntries)


attempts = {
    "unlink": lambda: js.Deno.remove(path),
    "unlink_sync": lambda: js.Deno.removeSync(path),
    "chmod": lambda: js.Deno.chmod(path, 0o777),
    "rename": lambda: js.Deno.rename(path, path + ".moved"),
    "stat": lambda: js.Deno.stat(path),
    "remove_dir": lambda: js.Deno.remove(folder, options(recursive=True)),
    "listen": lambda: js.Deno.listen(options(transport="unix", path=path)),
    "listen_beside": lambda: js.Deno.listen(options(transport="unix", path=folder + "/x")),
    "connect": lambda: js.Deno.connect(options(transport="unix", path=path)),
    "listen_tcp": lambda: js.Deno.listen(options(port=0)),
}
tried = {}
for name, attempt in attempts.items():
    try:
        value = attempt()
        if hasattr(value, "then"):
            await value
        tried[name] = "ALLOWED"
    except Exception as e:
        tried[name] = str(e).split(":")[0]
granted = [
    name
    for name in ("read", "write", "net")
    if js.Deno.permissions.querySync(options(name=name, path=path)).state == "granted"
]
core = js.Reflect.get(js.Deno, js.Deno.internal).core
return {"tried": tried, "granted": granted, "open": js.Object.values(core.resources()).to_py()}
"""

# Calls `add` until the test adds the sentinel tool (see attack_the_callback_channel).
VICTIM = """
import asyncio

total = calls = 0
i = 0
while True:
    total += tools.echo.add(a=i, b=1)["sum"] - i
    calls += 1
    i += 1
    try:
        getattr(tools.echo, inputs["sentinel"])(text="")
        break
    except ToolError as e:
        if e.code != -32003:  # forbidden: the sentinel does not exist yet
            raise
    await asyncio.sleep(0.01)
return {"total": total, "calls": calls}
"""

LATER = "return tools.echo.add(a=40, b=2)"


# The daemon's executors: Pyodide alone, as the others would only add to its start,
# with a process each for the victim and the attacker. Had the attacker to wait for a
# process of its own, the victim, calling tools all the while, would run past its
# tool-call limit on a loaded machine.
ONLY_PYODIDE = {
    "python": "pyodide",
    "pyodide": {"enabled": True, "pool_size": 2},
    **{name: {"enabled": False} for name in ("deno", "wasm_python", "wasm_js")},
}


async def wait_pyodide_ready(server: Any, processes: int) -> None:
    """Until the daemon's Pyodide pool has `processes` interpreters ready."""
    with trio.fail_after(LOAD_WAIT_S):
        while True:
            pool = next(i.pool for i in server.registry.infos() if i.name == "pyodide")
            if pool is not None and pool["idle"] >= processes:
                return
            await trio.sleep(0.02)  # nothing announces it to the daemon's owner


async def test_the_callback_socket_is_out_of_reach(
    start_daemon: Any, connect: Any, tmp_path: Path, pyodide_install: Path
) -> None:
    share_install(tmp_path / "state", pyodide_install)
    server, info = await start_daemon(upstreams=[ECHO], executors=ONLY_PYODIDE)
    await wait_upstreams(server, "echo")
    await wait_pyodide_ready(server, ONLY_PYODIDE["pyodide"]["pool_size"])
    attacked = await attack_the_callback_channel(
        server,
        connect,
        info,
        executor="pyodide",
        language="python",
        attack=CALLBACK_ATTACK,
        victim=VICTIM,
        later=LATER,
    )
    assert attacked["status"] == "ok", attacked["error"]
    tried = attacked["result"]["tried"]
    assert set(tried.values()) == {"NotCapable"}, tried
    assert attacked["result"]["granted"] == []
    # What the program can reach of its process: the pipes and message ports (its
    # interpreter's to the process, Pyodide's own), not the connection, which the
    # process keeps.
    assert set(attacked["result"]["open"]) == {"messagePort", "stderr", "stdin", "stdout"}
