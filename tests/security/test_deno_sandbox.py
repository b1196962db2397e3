"""Escape attempts against the Deno sandbox, with real Deno.

Each test asserts that the attempt is refused and reported, and that the next
execution still works (an attack must not break the executor for everyone else).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from conduit.executors.base import Status
from conduit.executors.deno import DenoExecutor
from tests.e2e.helpers import wait_upstreams
from tests.e2e.test_tools import ECHO
from tests.processes import deno_children
from tests.sandboxes import WAIT_S, Attacks, each_attack, error_text


@pytest.fixture
async def deno(nursery: trio.Nursery, tmp_path: Path) -> DenoExecutor:
    executor = DenoExecutor(cache_dir=tmp_path / "deno", pool_size=2)
    with trio.fail_after(WAIT_S):
        await nursery.start(executor.serve)
    return executor


_attacks = Attacks("typescript", "return 1 + 1")
run, refused = _attacks.run, _attacks.refused


def requesting(name: str, *, sync: bool = False) -> str:
    """A program asking Deno for permission `name`, throwing unless it is granted
    (--no-prompt answers "denied")."""
    call = "Deno.permissions.requestSync" if sync else "await Deno.permissions.request"
    return (
        f"const s = {call}({{name: '{name}'}});\n"
        "if (s.state !== 'granted') throw new Error(s.state)"
    )


# -- the host: files, environment, processes, native code ----------------------------


async def test_reading_a_file_is_refused(deno: DenoExecutor) -> None:
    outcome = await refused(deno, "return await Deno.readTextFile('/etc/passwd')")
    assert error_text(outcome).startswith("NotCapable: Requires read access")
    assert "root:" not in json.dumps(outcome.result) + outcome.stdout + outcome.stderr
    node = await refused(
        deno, "import fs from 'node:fs';\nreturn fs.readFileSync('/etc/passwd', 'utf8')"
    )
    assert "read access" in error_text(node)


async def test_importing_a_local_file_is_refused(deno: DenoExecutor, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "s3cret-token"}')
    for code in (
        f"return (await import('file://{secret}', {{with: {{type: 'json'}}}})).default",
        f"import s from 'file://{secret}' with {{type: 'json'}};\nreturn s",
        "return await import('file:///etc/passwd')",
        "return await (0, eval)(\"import('file:///etc/passwd')\")",
    ):
        outcome = await refused(deno, code)
        assert "read access" in error_text(outcome), code
        assert "s3cret-token" not in str(outcome)
        assert "root:" not in str(outcome)


async def test_importing_from_a_url_is_refused(deno: DenoExecutor) -> None:
    dynamic = await refused(deno, "return await import('https://deno.land/std/version.ts')")
    assert "--no-remote" in error_text(dynamic)
    static = await refused(deno, "import * as v from 'https://deno.land/std/version.ts';\nreturn v")
    assert "--no-remote" in error_text(static)
    for specifier in ("npm:left-pad", "jsr:@std/path"):
        outcome = await refused(deno, f"return await import('{specifier}')")
        assert outcome.status is Status.ERROR


async def test_reading_the_environment_is_refused(
    deno: DenoExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDUIT_TEST_SECRET", "env-s3cret")
    for code in (
        "return Deno.env.get('CONDUIT_TEST_SECRET')",
        "return Deno.env.toObject()",
        "import process from 'node:process';\nreturn process.env.CONDUIT_TEST_SECRET",
    ):
        outcome = await refused(deno, code)
        assert "env access" in error_text(outcome), code
        assert "env-s3cret" not in str(outcome)


async def test_starting_a_process_is_refused(deno: DenoExecutor, tmp_path: Path) -> None:
    marker = tmp_path / "spawned"
    command = f"new Deno.Command('/bin/sh', {{args: ['-c', 'touch {marker}']}})"
    outcome = await refused(deno, f"return await {command}.output()")
    assert "run access" in error_text(outcome)
    node = await refused(
        deno, f"import cp from 'node:child_process';\ncp.execSync('touch {marker}')"
    )
    assert node.status is Status.ERROR
    assert not marker.exists()


async def test_loading_native_code_is_refused(deno: DenoExecutor) -> None:
    symbols = "{getpid: {parameters: [], result: 'i32'}}"
    code = f"return Deno.dlopen('libc.so.6', {symbols}).symbols.getpid()"
    outcome = await refused(deno, code)
    assert "ffi access" in error_text(outcome)


async def test_writing_a_file_is_refused(deno: DenoExecutor, tmp_path: Path) -> None:
    target = tmp_path / "written"
    outcome = await refused(deno, f"await Deno.writeTextFile('{target}', 'x')")
    assert "write access" in error_text(outcome)
    for escape in ("../here.txt", "out/../../here.txt"):
        relative = await refused(deno, f"await Deno.writeTextFile('{escape}', 'x')")
        assert "write access" in error_text(relative)
    assert not target.exists()
    assert list((tmp_path / "deno" / "work").iterdir()) == []


# Paths around a program's working directory, each refused: what the program is told
# is its working directory (`cwd`), and the executor's state directory (`state`).
OUTSIDE_THE_WORKING_DIRECTORY = [
    "`${cwd}/..`",
    "`${cwd}/../..`",
    "'..'",
    "'/etc/passwd'",
    "state",
    "`${state}/scratch`",
]


@pytest.mark.parametrize("where", OUTSIDE_THE_WORKING_DIRECTORY)
async def test_only_the_working_directory_is_reachable(
    deno: DenoExecutor, tmp_path: Path, where: str
) -> None:
    state = tmp_path / "deno"
    code = (
        f"const cwd = Deno.cwd(); const state = {json.dumps(str(state))};\n"
        "Deno.writeTextFileSync('mine.txt', 'ok');\n"
        "const tried = {};\n"
        "for (const [name, act] of Object.entries({\n"
        f"  read: () => Deno.readDirSync({where}),\n"
        f"  stat: () => Deno.statSync({where}),\n"
        f"  write: () => Deno.writeTextFileSync({where} + '/planted', 'x'),\n"
        f"  node: () => process.getBuiltinModule('node:fs').readdirSync({where}),\n"
        "})) {\n"
        "  try { act(); tried[name] = 'allowed'; } catch (e) { tried[name] = e.name; }\n"
        "}\n"
        "return {tried, mine: Deno.readTextFileSync('mine.txt')}"
    )
    outcome = await run(deno, code)
    assert outcome.status is Status.OK, outcome
    assert outcome.result["mine"] == "ok"
    assert outcome.result["tried"] == dict.fromkeys(["read", "stat", "write", "node"], "NotCapable")
    # os.walk, not rglob: the pool's other workers delete their directories meanwhile.
    assert not [files for _, _, files in os.walk(state) if "planted" in files]


async def test_permissions_cannot_be_requested(deno: DenoExecutor) -> None:
    code = requesting("read") + ";\nreturn Deno.readTextFileSync('/etc/passwd')"
    outcome = await refused(deno, code)
    assert error_text(outcome) == "Error: denied"


# More of the host, one attempt a row: (name, program, what the refusal says). Each row is
# refused, and the next execution still runs.
HOST_ATTACKS = [
    # files
    ("read_dir", "return [...Deno.readDirSync('/')]", "read access"),
    ("stat", "return Deno.statSync('/etc/passwd')", "read access"),
    ("lstat", "return await Deno.lstat('/')", "read access"),
    ("real_path", "return Deno.realPathSync('/etc')", "read access"),
    ("open", "return await Deno.open('/etc/hostname')", "read access"),
    ("read_link", "return Deno.readLinkSync('/proc/self/exe')", "read access"),
    ("environ_file", "return Deno.readFileSync('/proc/self/environ')", "read access"),
    ("chdir", "Deno.chdir('/')", "read access"),
    ("watch_fs", "return Deno.watchFs('/')", "read access"),
    ("copy_file", "await Deno.copyFile('/etc/passwd', '/tmp/stolen')", "access"),
    ("fetch_file_url", "return await (await fetch('file:///etc/passwd')).text()", "read access"),
    ("import_environ", "return await import('file:///proc/self/environ')", "read access"),
    ("temp_dir", "return Deno.makeTempDirSync()", "write access"),
    ("mkdir", "Deno.mkdirSync('/tmp/conduit-attack-dir')", "write access"),
    ("symlink", "Deno.symlinkSync('/etc/passwd', '/tmp/conduit-attack-link')", "NotCapable"),
    ("hard_link", "Deno.linkSync('/etc/passwd', '/tmp/conduit-attack-link')", "access"),
    # into the working directory, where the daemon collects `out/`
    ("symlink_in", "Deno.symlinkSync('/etc/passwd', 'out/passwd')", "NotCapable"),
    ("relative_symlink_in", "Deno.symlinkSync('..', 'out/up')", "NotCapable"),
    ("hard_link_in", "Deno.linkSync('/etc/passwd', 'out/passwd')", "read access"),
    (
        "node_symlink_in",
        "import fs from 'node:fs';\nfs.symlinkSync('/etc', 'out/etc')",
        "NotCapable",
    ),
    ("truncate", "Deno.truncateSync('/etc/hostname', 0)", "write access"),
    ("utime", "Deno.utimeSync('/etc/hostname', 0, 0)", "write access"),
    ("chown", "Deno.chownSync('/tmp', 0, 0)", "write access"),
    ("node_readdir", "import fs from 'node:fs';\nreturn fs.readdirSync('/')", "read access"),
    (
        "node_write",
        "import fs from 'node:fs';\nfs.writeFileSync('/tmp/conduit-x', 'x')",
        "write access",
    ),
    # environment and system
    ("env_set", "Deno.env.set('PATH', '/tmp')", "env access"),
    ("hostname", "return Deno.hostname()", "sys access"),
    ("os_release", "return Deno.osRelease()", "sys access"),
    ("loadavg", "return Deno.loadavg()", "sys access"),
    ("network_interfaces", "return Deno.networkInterfaces()", "sys access"),
    ("memory_info", "return Deno.systemMemoryInfo()", "sys access"),
    ("uid", "return Deno.uid()", "sys access"),
    ("uptime", "return Deno.osUptime()", "sys access"),
    ("node_user_info", "import os from 'node:os';\nreturn os.userInfo()", "access"),
    ("node_cpus", "import os from 'node:os';\nreturn os.cpus()", "sys access"),
    # processes
    ("spawn_self", "return new Deno.Command(Deno.execPath()).outputSync()", "access"),
    ("spawn_sh", "return new Deno.Command('/usr/bin/id').outputSync()", "run access"),
    # Another process than its own: inside the sandbox it is PID 1 itself (signalling
    # itself needs no permission, and its namespace's init ignores the signal).
    ("kill_another", "Deno.kill(2, 'SIGKILL')", "run access"),
    (
        "kill_parent",
        "import process from 'node:process';\nprocess.kill(process.ppid, 'SIGKILL')",
        "access",
    ),
    (
        "node_spawn",
        "import cp from 'node:child_process';\nreturn cp.spawnSync('id').stdout",
        "env access",
    ),
    # network
    (
        "connect_tls",
        "return await Deno.connectTls({hostname: 'example.com', port: 443})",
        "net access",
    ),
    # Deno reads the resolver's configuration before its permission check: the sandbox
    # has no /etc/resolv.conf (nor any network to ask).
    ("resolve_dns", "return await Deno.resolveDns('example.com', 'A')", "No such file"),
    (
        "metadata_service",
        "return await fetch('http://169.254.169.254/latest/meta-data/')",
        "net access",
    ),
    ("local_ssh", "return await Deno.connect({hostname: '127.0.0.1', port: 22})", "net access"),
    (
        "abstract_unix",
        "return await Deno.connect({transport: 'unix', path: '\\0conduit'})",
        "access",
    ),
    ("serve", "Deno.serve({port: 0}, () => new Response('x'))", "net access"),
    ("node_listen", "import net from 'node:net';\nnet.createServer().listen(0)", "net access"),
    (
        "node_http",
        "import http from 'node:http';\n"
        "return await new Promise((ok, no) => http.get('http://127.0.0.1:1/', ok).on('error', no))",
        "net access",
    ),
    (
        "node_dns",
        "import dns from 'node:dns/promises';\nreturn await dns.lookup('example.com')",
        "EPERM",
    ),
    # native code and permissions
    (
        "node_dlopen",
        "import process from 'node:process';\n"
        "process.dlopen({exports: {}}, '/lib/x86_64-linux-gnu/libc.so.6')",
        "ffi access",
    ),
    ("request_net", requesting("net"), "denied"),
    ("request_run", requesting("run"), "denied"),
    ("request_write", requesting("write", sync=True), "denied"),
    ("remote_import_localhost", "return await import('http://127.0.0.1:1/x.js')", "--no-remote"),
]


@each_attack(HOST_ATTACKS)
async def test_host_attack_is_refused(deno: DenoExecutor, code: str, refusal: str) -> None:
    await _attacks.refused_with(deno, code, refusal)


# -- the network --------------------------------------------------------------------------


async def test_network_is_refused_and_nothing_connects(
    deno: DenoExecutor, nursery: trio.Nursery
) -> None:
    accepted: list[object] = []

    async def count(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, count, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    for code in (
        f"return (await fetch('http://127.0.0.1:{port}/')).status",
        f"return await Deno.connect({{hostname: '127.0.0.1', port: {port}}})",
        f"const ws = new WebSocket('ws://127.0.0.1:{port}/');\n"
        "return await new Promise((ok, no) => { ws.onopen = ok; ws.onerror = () => no(1); })",
        "import net from 'node:net';\n"
        f"return await new Promise((ok) => net.connect({port}, '127.0.0.1', ok))",
    ):
        outcome = await refused(deno, code)
        assert "Requires net access" in error_text(outcome), code
    assert accepted == []


async def test_listening_is_refused(deno: DenoExecutor) -> None:
    outcome = await refused(deno, "Deno.listen({port: 0})")
    assert "net access" in error_text(outcome)


# -- resources ----------------------------------------------------------------------------


async def test_infinite_loop_times_out_and_its_process_group_is_gone(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    cold = DenoExecutor(cache_dir=tmp_path / "cold", pool_size=0)
    with trio.fail_after(WAIT_S):
        await nursery.start(cold.serve)
    seen: set[int] = set()

    async def watch() -> None:
        while True:
            seen.update(deno_children())
            await trio.sleep(0.005)

    start = trio.current_time()
    async with trio.open_nursery() as watching:
        watching.start_soon(watch)
        outcome = await refused(cold, "console.log('spinning'); while (true) {}", timeout_ms=500)
        watching.cancel_scope.cancel()
    assert outcome.status is Status.TIMEOUT
    assert outcome.stdout == "spinning\n"
    assert trio.current_time() - start < 10
    assert seen, "the sandbox process was never seen"
    assert deno_children() == set()  # cold workers are reaped before run() returns
    for pgid in seen:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


async def test_heap_bomb_hits_the_memory_limit(deno: DenoExecutor) -> None:
    code = "const keep = [];\nfor (let i = 0; ; i++) keep.push('x'.repeat(1e6) + i);"
    outcome = await refused(deno, code, memory_mb=64)
    assert outcome.status is Status.MEMORY_LIMIT
    assert outcome.error is not None
    assert "64 MB" in outcome.error.message
    assert "Last few GCs" not in outcome.stderr  # V8's report is cut


async def test_buffer_bomb_hits_the_memory_limit(deno: DenoExecutor) -> None:
    # ArrayBuffers live outside the V8 heap; the RLIMIT_DATA backstop stops them.
    code = "const keep = [];\nfor (;;) keep.push(new Uint8Array(16 * 1024 * 1024).fill(1));"
    outcome = await refused(deno, code, memory_mb=64)
    assert outcome.status is Status.MEMORY_LIMIT
    wasm = (
        "const m = new WebAssembly.Memory({initial: 1, maximum: 65536});\n"
        "for (;;) { m.grow(256); new Uint8Array(m.buffer).fill(1); }"
    )
    assert (await refused(deno, wasm, memory_mb=64)).status is Status.MEMORY_LIMIT


async def test_web_workers_are_refused_plainly(deno: DenoExecutor) -> None:
    code = "new Worker('data:application/javascript,postMessage(1)', {type: 'module'})"
    outcome = await refused(deno, code)
    assert "Web Workers are not available" in error_text(outcome)


async def test_output_flood_is_stopped_while_streaming(deno: DenoExecutor) -> None:
    start = trio.current_time()
    outcome = await refused(
        deno,
        "const line = 'x'.repeat(1000);\nfor (;;) console.log(line);",
        output_bytes=100_000,
        timeout_ms=20_000,
    )
    assert outcome.status is Status.OUTPUT_LIMIT
    assert outcome.truncated_stdout
    assert len(outcome.stdout) == 100_000
    assert outcome.stdout.startswith("x" * 1000 + "\n")
    assert trio.current_time() - start < 5  # killed at the limit, not at the timeout


async def test_line_flood_is_stopped(deno: DenoExecutor) -> None:
    outcome = await refused(deno, "for (;;) console.error(1);", output_lines=100, timeout_ms=20_000)
    assert outcome.status is Status.OUTPUT_LIMIT
    assert outcome.stderr == "1\n" * 100
    assert outcome.truncated_stderr


async def test_disk_cannot_be_filled_through_web_storage(
    deno: DenoExecutor, tmp_path: Path
) -> None:
    code = (
        "for (let i = 0; i < 50; i++) localStorage.setItem('k' + i, 'x'.repeat(100000));\n"
        "return [typeof caches, localStorage === sessionStorage, localStorage.length]"
    )
    outcome = await run(deno, code)
    assert outcome.result == ["undefined", True, 50]
    # 5 MB went to localStorage; none of it reached a disk.
    assert _bytes_on_disk(tmp_path / "deno") < 1_000_000


def _bytes_on_disk(root: Path) -> int:
    """Sizes of regular files under `root` (workers come and go meanwhile)."""
    total = 0
    # os.walk passes over a directory that vanishes as it is read; Path.rglob raises.
    for directory, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                info = os.lstat(os.path.join(directory, name))  # Deno links its binary
                total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


# -- the result channel -------------------------------------------------------------------


async def test_the_program_cannot_see_its_job_or_nonce(deno: DenoExecutor) -> None:
    code = (
        "const names = Object.keys(globalThis).filter((k) => /nonce|job/i.test(k));\n"
        "return [Deno.args, await Deno.stdin.read(new Uint8Array(100)), names]"
    )
    outcome = await run(deno, code)
    assert outcome.result == [[], None, []]


async def test_patching_globals_cannot_forge_or_hide_the_result(deno: DenoExecutor) -> None:
    code = (
        "JSON.stringify = () => '\"forged\"';\n"
        "TextEncoder.prototype.encode = () => new Uint8Array();\n"
        "Deno.stdout.writeSync = () => 0;\n"
        "return {real: true}"
    )
    outcome = await run(deno, code)
    assert (outcome.status, outcome.result) == (Status.OK, {"real": True})


async def test_deno_exit_only_ends_the_program(deno: DenoExecutor) -> None:
    outcome = await run(
        deno, "addEventListener('unload', () => console.log('late'));\nDeno.exit(7)"
    )
    assert (outcome.status, outcome.exit_code) == (Status.ERROR, 7)
    assert (await run(deno, "return 'still here'")).result == "still here"


# -- the tool-callback channel ------------------------------------------------------------

# Everything a program with the old socket permissions did to the daemon's callback
# socket, then what it might try without them. Each entry records "ALLOWED" or the
# error's name; `open` lists what Deno's internals show of its open resources.
CALLBACK_ATTACK_TS = """
const path: string = inputs.path;
const dir = path.slice(0, path.lastIndexOf("/"));
const tried: Record<string, string> = {};
const attempts: Record<string, () => unknown> = {
  unlink: () => Deno.remove(path),
  unlinkSync: () => Deno.removeSync(path),
  chmod: () => Deno.chmod(path, 0o777),
  rename: () => Deno.rename(path, path + ".moved"),
  stat: () => Deno.stat(path),
  removeDir: () => Deno.remove(dir, { recursive: true }),
  listen: () => Deno.listen({ transport: "unix", path }),
  listenBeside: () => Deno.listen({ transport: "unix", path: dir + "/other" }),
  connect: () => Deno.connect({ transport: "unix", path }),
  listenTcp: () => Deno.listen({ port: 0 }),
  requestRead: async () => {
    const s = await Deno.permissions.request({ name: "read", path });
    if (s.state !== "granted") throw new Error(s.state);
  },
  nodeUnlink: async () => (await import("node:fs")).unlinkSync(path),
  nodeListen: async () => {
    const net = await import("node:net");
    await new Promise((ok, no) => net.createServer().on("error", no).listen(path, () => ok(1)));
  },
};
for (const [name, attempt] of Object.entries(attempts)) {
  try {
    await attempt();
    tried[name] = "ALLOWED";
  } catch (e) {
    tried[name] = e?.name ?? String(e);
  }
}
const granted = ["read", "write", "net"].filter(
  (name) => Deno.permissions.querySync({ name, path }).state === "granted",
);
const core = (Deno as any)[(Deno as any).internal]?.core;
const open = core ? Object.values(core.resources()) : [];
return { tried, granted, open };
"""

# A victim that calls a tool until the test says the attack is over: each `add`
# answers a + b, so a forged or lost answer shows in the total or fails the program.
VICTIM_TS = """
let total = 0;
let calls = 0;
for (let i = 0; ; i++) {
  total += (await tools.echo.add({ a: i, b: 1 })).sum - i;
  calls++;
  try {
    await tools.echo[inputs.sentinel]({ text: "" });
    break;
  } catch (e) {
    if (e.code !== -32003) throw e;  // forbidden: the sentinel does not exist yet
  }
  await new Promise((r) => setTimeout(r, 10));
}
return { total, calls };
"""

LATER_TS = "return await tools.echo.add({ a: 40, b: 2 })"


async def attack_the_callback_channel(
    server: Any,
    connect: Any,
    info: Any,
    *,
    executor: str,
    language: str,
    attack: str,
    victim: str,
    later: str,
) -> dict[str, Any]:
    """Run `attack` while `victim` calls tools in another execution; assert the victim
    got every real answer, the socket file is untouched, and `later` (a tool call
    adding 40 and 2) still works. Returns the attack's execute result."""
    path = server.callback_address.unix_path
    before = os.stat(path)
    sentinel = f"attack_over_{secrets.token_hex(4)}"
    victims, attacker = await connect(info), await connect(info)
    common = {
        "language": language,
        "executor": executor,
        "limits": {"timeout_ms": 120_000},
        "allowed_tools": ["echo.*"],  # tools added later are callable too
    }
    victim_result: dict[str, Any] = {}

    async def run_victim() -> None:
        params = {**common, "code": victim, "inputs": {"sentinel": sentinel}}
        victim_result.update(await victims.call("execute", params))

    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_victim)
            while len(server.executions) == 0:
                await trio.sleep(0.01)  # nothing announces that an execution started
            params = {**common, "code": attack, "inputs": {"path": path}}
            attacked = await attacker.call("execute", params)
            await attacker.call(
                "tools/call", {"name": "echo.add_tool", "arguments": {"name": sentinel}}
            )
    assert victim_result["status"] == "ok", victim_result["error"]
    calls = victim_result["result"]["calls"]
    assert victim_result["result"] == {"total": calls, "calls": calls}
    after = os.stat(path)
    assert stat.S_ISSOCK(after.st_mode)
    assert (after.st_ino, after.st_mode, after.st_uid) == (
        before.st_ino,
        before.st_mode,
        before.st_uid,
    )
    later_result = await attacker.call("execute", {**common, "code": later})
    assert (later_result["status"], later_result["result"]) == ("ok", {"sum": 42}), later_result
    return attacked


@pytest.fixture
async def tooled(start_daemon: Any, connect: Any) -> tuple[Any, Any]:
    server, info = await start_daemon(upstreams=[ECHO], executors={"deno": {"pool_size": 2}})
    await wait_upstreams(server, "echo")
    return server, info


async def test_the_callback_socket_is_out_of_reach(tooled: tuple[Any, Any], connect: Any) -> None:
    server, info = tooled
    attacked = await attack_the_callback_channel(
        server,
        connect,
        info,
        executor="deno",
        language="typescript",
        attack=CALLBACK_ATTACK_TS,
        victim=VICTIM_TS,
        later=LATER_TS,
    )
    assert attacked["status"] == "ok", attacked
    tried = attacked["result"]["tried"]
    assert "ALLOWED" not in tried.values(), tried
    assert set(tried.values()) <= {"NotCapable", "Error"}, tried
    assert attacked["result"]["granted"] == []
    # What the program can reach of its own process: the pipes and its own connection.
    assert sorted(attacked["result"]["open"]) == ["stderr", "stdin", "stdout", "unixStream"]
