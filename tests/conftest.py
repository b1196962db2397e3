"""Shared fixtures: a config factory, a real daemon in the test's nursery, raw clients."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import settings

from conduit.daemon.config import Config, load_config
from conduit.daemon.server import Daemon, ServingInfo

# pytest keeps each test module's assertion-rewritten bytecode in `__pycache__` (which
# git ignores) unless Python is told to write none: then every test process rewrites
# and compiles all ~160 of them again, ~10 s of CPU each. The test modules' bytecode
# is kept even where PYTHONDONTWRITEBYTECODE is set.
sys.dont_write_bytecode = False

MASTER_TOKEN = "cdt_test-master-token-0123456789abcdef"
# Generous: real Deno under a loaded 2-core CI machine.
WAIT_S = 30

# No per-example deadline: a loaded CI machine makes any deadline flaky, and speed is
# the benchmark's business, not the properties'.
settings.register_profile("conduit", deadline=None)
settings.load_profile("conduit")


# Whole directories that drive real daemons and runtimes end to end, or attack them:
# `pytest -m "not slow"` is the quick loop of everything else.
SLOW_DIRECTORIES = ("e2e", "security", "integrations")


# The files that take longest on a fresh clone of a loaded two-core machine, longest
# first (measured with `--durations=0`). Test processes (`--dist loadfile`) are handed
# these first and every other file after them, so that a run ends on short files, not
# on one process finishing a long one while the others wait. Without
# `--no-loadscope-reorder` xdist would put files with few tests last, and most of these
# have few. The second, Pyodide's (`no_wasm`), keeps one process busy while the first
# waits for a fresh clone's wasm components to be built. executors/test_wasm_fuel.py
# is short once e2e/test_cli.py's doctor has compiled its code (see `fuel_components`),
# so it comes late, to find that done.
LONGEST_FIRST = (
    "e2e/test_mcp_stdio.py",
    "security/test_pyodide_sandbox.py",
    "e2e/test_cli.py",
    "e2e/test_mcp_clients.py",
    "e2e/test_packages.py",
    "security/test_wasm_python_sandbox.py",
    "security/test_wasm_js_sandbox.py",
    "e2e/test_tools.py",
    "executors/test_pyodide.py",
    "executors/test_pyodide_sessions.py",
    "executors/test_pyodide_packages.py",
    "executors/test_packages.py",
    "e2e/test_sessions.py",
    "executors/test_deno_sessions.py",
    "gateway/test_http_upstream.py",
    "executors/test_wasm_js.py",
    "gateway/test_stdio_upstream.py",
    "e2e/test_serve_process.py",
    "e2e/test_systemd_activation.py",
    "e2e/test_wasm_js_tools.py",
    "security/test_hostile_text.py",
)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one test process more than the cores. A third of the suite's time is
    spent waiting on the daemons, runtimes and servers it starts, and with one process
    per core that time is idle cores; `--maxprocesses` still caps it."""
    return len(os.sched_getaffinity(0)) + 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(tests).parts
        if len(parts) > 1 and parts[0] in SLOW_DIRECTORIES:
            item.add_marker(pytest.mark.slow)
    # The longest files first, in that order; then the rest, most tests first (as
    # xdist would order them), each file's tests in their own order.
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    counts = Counter(item.path for item in items)

    def place(item: pytest.Item) -> tuple[int, int]:
        return rank.get(item.path.relative_to(tests).as_posix(), len(rank)), -counts[item.path]

    items.sort(key=place)


@pytest.fixture(scope="session", autouse=True)
def _private_user_dirs() -> Iterator[None]:
    """The session's own runtime and state directories, and none of the caller's
    `CONDUIT_*` settings, for every daemon and command the tests start.

    The README runs the tests beside a daemon started on its defaults: its socket and
    its master token must neither answer the tests' commands nor get presented to the
    tests' daemons (which would refuse them).
    """
    root = Path(tempfile.mkdtemp(prefix="cd-user-", dir="/tmp"))
    with pytest.MonkeyPatch.context() as patch:
        for name in [name for name in os.environ if name.startswith(("CONDUIT_", "LISTEN_"))]:
            patch.delenv(name)
        for name in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME"):
            path = root / name.lower()
            path.mkdir(mode=0o700)
            patch.setenv(name, str(path))
        yield
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for Unix sockets (their paths are capped at 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def kept_dir(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], AbstractContextManager[Path]]:
    """Directories kept in pytest's cache between runs, by name (`--cache-clear` drops
    them); fresh temporary ones when the cache plugin is off (`-p no:cacheprovider`,
    where the config has no `cache` at all).

    `with kept_dir(name) as path:` holds the directory's lock, so test processes
    running side by side (`pytest -n`) fill it once, one after the other.
    """
    cache = getattr(pytestconfig, "cache", None)

    @contextlib.contextmanager
    def use(name: str) -> Iterator[Path]:
        path = cache.mkdir(name) if cache is not None else tmp_path_factory.mktemp(name)
        with open(path.parent / f".{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield path

    return use


# Where the session that built the wasm-js component from scratch says what the build did.
FRESH_JS_BUILD_KEY = "conduit/wasm-js-fresh-build"


def js_build_key() -> str:
    """What a wasm-js build's outcome depends on: its inputs and the code that builds."""
    from conduit.executors import wasm_build, wasm_guests
    from conduit.executors.wasm_guests import JS_GUEST

    inputs_hash, _ = wasm_build.build_inputs(JS_GUEST)
    code = b"".join(Path(module.__file__).read_bytes() for module in (wasm_build, wasm_guests))
    return f"{inputs_hash}-{hashlib.sha256(code).hexdigest()}"


def keep_fresh_js_build(pytestconfig: pytest.Config, record: dict[str, Any]) -> None:
    """Keep what a from-scratch build did in pytest's cache, if it has one."""
    cache = getattr(pytestconfig, "cache", None)
    if cache is not None:
        cache.set(FRESH_JS_BUILD_KEY, {"build": js_build_key(), **record})


def build_js_from_scratch(cache: Path) -> dict[str, Any]:
    """The real wasm-js build, npm install and all, into `cache` as an earlier version
    left it (an npm install and an npm cache of its own): what the build made, what it
    left in `cache` and in the component's directory, and the steps it took."""
    from conduit.executors.wasm_build import BuildProgress, ensure_component
    from conduit.executors.wasm_guests import JS_GUEST

    (cache / "wasm-js-npm-0123456789abcdef" / "node_modules").mkdir(parents=True)
    (cache / "npm-cache").mkdir()
    progress = BuildProgress("wasm-js")
    built = ensure_component(JS_GUEST, cache, progress)
    done = progress.snapshot()["done"]
    assert isinstance(done, list)
    return {
        "built": built.built,
        "size": built.path.stat().st_size,
        "component_dir": built.path.parent.name,
        "cache": [p.name for p in cache.iterdir()],
        "in_component_dir": [p.name for p in built.path.parent.iterdir()],
        "steps": [step["step"] for step in done],
    }


@pytest.fixture(scope="session")
def wasm_cache(
    pytestconfig: pytest.Config,
    kept_dir: Callable[[str], AbstractContextManager[Path]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The wasm-python and wasm-js components, built and compiled once.

    Kept in pytest's cache directory between runs (`--cache-clear` drops it): both
    caches are keyed by content, so a reused build is always the current one, and the
    ~30 s of building is paid once per clone rather than once per run.

    A wasm-js component that is not there yet is built as the build test wants one
    built (`build_js_from_scratch`), and what that build did is kept, with what it was
    built from (`FRESH_JS_BUILD_KEY`), for the build test of this run and of later
    ones, which then need not build it all over again.
    """
    from conduit.executors import _wasmtime
    from conduit.executors.wasm_build import (
        BUILD_PREFIX,
        COMPONENT_FILE,
        GuestRecipe,
        build_inputs,
        ensure_component,
        move_into_place,
        prune_superseded,
    )
    from conduit.executors.wasm_guests import JS_GUEST, PYTHON_GUEST

    def build_js_fresh() -> None:
        inputs_hash, _ = build_inputs(JS_GUEST)
        target = cache / f"{JS_GUEST.name}-{inputs_hash[:16]}"
        if (target / COMPONENT_FILE).is_file():
            return
        scratch = tmp_path_factory.mktemp("wasm-js-fresh") / "wasm"
        record = build_js_from_scratch(scratch)
        # Copied beside the cache, then renamed into it: never a half component there.
        staging = Path(tempfile.mkdtemp(prefix=BUILD_PREFIX, dir=cache)) / "out"
        shutil.copytree(scratch / record["component_dir"], staging)
        move_into_place(staging, target, COMPONENT_FILE)
        shutil.rmtree(staging.parent, ignore_errors=True)
        prune_superseded(cache, JS_GUEST.name, keep=target)
        keep_fresh_js_build(pytestconfig, record)
        shutil.rmtree(scratch.parent, ignore_errors=True)

    def build(recipe: GuestRecipe) -> None:
        if recipe is JS_GUEST:
            build_js_fresh()
        built = ensure_component(recipe, cache)
        _wasmtime.load_component(_wasmtime.new_engine(), built.path, built.component_hash)

    with kept_dir("wasm-components") as cache, ThreadPoolExecutor() as builders:
        # Side by side, as the daemon builds them: each build uses about one core.
        list(builders.map(build, (PYTHON_GUEST, JS_GUEST)))
    return cache


@pytest.fixture(scope="session")
def fuel_components(
    kept_dir: Callable[[str], AbstractContextManager[Path]], wasm_cache: Path
) -> Callable[[], AbstractContextManager[Path]]:
    """`with fuel_components() as cache:` the session's components in a directory of
    their own, locked for the block, for engines that count fuel to compile into
    (`compiled-*-fuel.cwasm`, tens of seconds): what they compile stays out of
    `wasm_cache`, whose compiled files other tests take to be a plain engine's. Kept
    between runs like `wasm_cache`, and so is what is compiled there.
    """

    @contextlib.contextmanager
    def use() -> Iterator[Path]:
        with kept_dir("wasm-fuel-components") as cache:
            for old in cache.glob("wasm-*"):
                if not (wasm_cache / old.name).is_dir():  # superseded
                    shutil.rmtree(old, ignore_errors=True)
            for built in wasm_cache.glob("wasm-*"):
                if built.is_dir() and not (cache / built.name).exists():
                    skip = shutil.ignore_patterns("*.tmp", "*.lock", "*-fuel.*")
                    shutil.copytree(built, cache / built.name, ignore=skip)
            yield cache

    return use


@pytest.fixture
def fresh_js_build(pytestconfig: pytest.Config, wasm_cache: Path, tmp_path: Path) -> dict[str, Any]:
    """What a from-scratch wasm-js build did (see `build_js_from_scratch`): the one
    `wasm_cache` made of these inputs with this build code, in this run or an earlier
    one, else one made here and now."""
    cache = getattr(pytestconfig, "cache", None)
    kept = cache.get(FRESH_JS_BUILD_KEY, None) if cache is not None else None
    if isinstance(kept, dict) and kept.pop("build", None) == js_build_key():
        return kept
    record = build_js_from_scratch(tmp_path / "wasm")
    keep_fresh_js_build(pytestconfig, record)
    return record


@pytest.fixture(scope="session")
def pyodide_install(kept_dir: Callable[[str], AbstractContextManager[Path]]) -> Path:
    """Pyodide from npm, installed once (kept in pytest's cache like the components)."""
    from conduit.executors.npm import install_locked
    from conduit.executors.pyodide import PACKAGE, SHIM_DIR

    with kept_dir("pyodide") as where:
        install_locked(SHIM_DIR, where, expect=f"node_modules/{PACKAGE}/pyodide.mjs")
    return where


def link_wasm_cache(state_dir: Path, cache: Path) -> None:
    """Give a daemon's state dir the session's built component (`<state>/wasm`)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    link = state_dir / "wasm"
    if not link.exists():
        link.symlink_to(cache, target_is_directory=True)


@pytest.fixture(autouse=True)
def _shared_wasm_cache(request: pytest.FixtureRequest) -> None:
    """Tests that use `tmp_path / "state"` as a state dir (daemons in-process or as
    `conduit` subprocesses) find the session's component there instead of building.

    Those marked `no_wasm` start no wasm executor: they need not wait for the build
    (a fresh clone's first minute), so a test process can run them meanwhile.
    """
    if "tmp_path" in request.fixturenames and not request.node.get_closest_marker("no_wasm"):
        tmp_path: Path = request.getfixturevalue("tmp_path")
        link_wasm_cache(tmp_path / "state", request.getfixturevalue("wasm_cache"))


@pytest.fixture
def make_config(tmp_path: Path, short_dir: Path) -> Callable[..., Config]:
    """Build a validated config for a test: own socket and state dir, known token."""

    def build(**sections: Any) -> Config:
        tree: dict[str, Any] = {
            "server": {
                "socket": str(short_dir / "conduit.sock"),
                "state_dir": str(tmp_path / "state"),
            },
            "auth": {"token": MASTER_TOKEN},
            "executors": {"deno": {"pool_size": 1}},
            # Several daemons share a machine (and a test process): a free port each.
            "metrics": {"listen": "127.0.0.1:0"},
        }
        for section, values in sections.items():
            if isinstance(values, dict):
                tree.setdefault(section, {}).update(values)
            else:
                tree[section] = values
        path = tmp_path / "conduit.toml"
        path.write_text(to_toml(tree))
        return load_config(path, environ={})

    return build


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def to_toml(tree: dict[str, Any], prefix: str = "") -> str:
    """`tree` as TOML text: scalars and arrays inline, dicts as tables."""
    scalars = {k: v for k, v in tree.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in tree.items() if isinstance(v, dict)}
    lines = [f"[{prefix}]"] if prefix and scalars else []
    lines += [f"{k} = {_toml_value(v)}" for k, v in scalars.items()]
    for key, value in tables.items():
        lines.append(to_toml(value, f"{prefix}.{key}" if prefix else key))
    return "\n".join(lines) + "\n"


@pytest.fixture
async def start_daemon(
    nursery: trio.Nursery, make_config: Callable[..., Config]
) -> Callable[..., Any]:
    """Start a real daemon in the test's nursery; returns (Daemon, ServingInfo)."""

    async def start(config: Config | None = None, **sections: Any) -> tuple[Daemon, ServingInfo]:
        config = config or make_config(**sections)
        daemon = Daemon(config, reload=lambda: load_config(config.source, environ={}))
        with trio.fail_after(WAIT_S):
            info = await nursery.start(daemon.serve)
            await daemon.registry.wait_ready()
        return daemon, info

    return start


@pytest.fixture
async def daemon(start_daemon: Callable[..., Any]) -> tuple[Daemon, ServingInfo]:
    return await start_daemon()


class RawClient:
    """Speaks NDJSON over a real socket, line by line, as `nc` would."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._buffer = b""
        self._ids = itertools.count(1)

    async def send_line(self, line: str | bytes) -> None:
        data = line.encode() if isinstance(line, str) else line
        await self.stream.send_all(data + b"\n")

    async def send(self, message: Any) -> None:
        await self.send_line(json.dumps(message))

    async def recv(self) -> Any:
        """The next JSON line from the daemon (fails the test after WAIT_S)."""
        with trio.fail_after(WAIT_S):
            while b"\n" not in self._buffer:
                chunk = await self.stream.receive_some(65536)
                if not chunk:
                    raise EOFError("daemon closed the connection")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    async def expect_closed(self) -> None:
        with trio.fail_after(WAIT_S):
            while True:
                chunk = await self.stream.receive_some(65536)
                if not chunk:
                    return

    async def request(self, method: str, params: Any = None, **extra: Any) -> Any:
        """Send a request and return the whole reply object."""
        ident = next(self._ids)
        message = {"jsonrpc": "2.0", "id": ident, "method": method, **extra}
        if params is not None:
            message["params"] = params
        await self.send(message)
        reply = await self.recv()
        assert reply["id"] == ident, reply
        return reply

    async def call(self, method: str, params: Any = None, **extra: Any) -> Any:
        """The result of a request; fails the test on an error reply."""
        reply = await self.request(method, params, **extra)
        assert "error" not in reply, reply
        return reply["result"]

    async def aclose(self) -> None:
        await self.stream.aclose()


@pytest.fixture
async def connect() -> AsyncIterator[Callable[..., Any]]:
    """Open raw clients to a daemon over `unix` (default) or `tcp`; closed after the test."""
    opened: list[RawClient] = []

    async def open_client(info: ServingInfo, transport: str = "unix") -> RawClient:
        if transport == "tcp":
            assert info.tcp_address
            stream: trio.abc.Stream = await trio.open_tcp_stream(*info.tcp_address)
        else:
            assert info.unix_path
            stream = await trio.open_unix_socket(info.unix_path)
        client = RawClient(stream)
        opened.append(client)
        return client

    yield open_client
    for client in opened:
        await client.aclose()


@pytest.fixture
async def client(daemon: tuple[Daemon, ServingInfo], connect: Callable[..., Any]) -> RawClient:
    """A raw client on the fixture daemon's Unix socket (same uid: master by peer creds)."""
    return await connect(daemon[1])


async def _ready(executor: Any, nursery: trio.Nursery) -> Any:
    await nursery.start(executor.serve)
    with trio.fail_after(WAIT_S):
        assert await executor.wait_ready(), executor.info().reason
    return executor


@pytest.fixture
async def wasm(nursery: trio.Nursery, wasm_cache: Path) -> Any:
    """A ready wasm-python executor on the session's one built component."""
    from conduit.executors.wasm_python import WasmPythonExecutor

    return await _ready(WasmPythonExecutor(cache_dir=wasm_cache), nursery)


@pytest.fixture
async def wasm_js(nursery: trio.Nursery, wasm_cache: Path) -> Any:
    """A ready wasm-js executor on the session's one built component."""
    from conduit.executors.wasm_js import WasmJsExecutor

    return await _ready(WasmJsExecutor(cache_dir=wasm_cache), nursery)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A PostgreSQL server of this test process's own (see tests/fixtures/postgres.py);
    skips when PostgreSQL or psycopg is not installed."""
    from tests.fixtures.postgres import PostgresServer, find_bindir

    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install '.[test]'")
    bindir = find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (no initdb/postgres): apt-get install postgresql")
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: Any) -> Iterator[str]:
    """The URL of an empty schema of the test's own (its search_path), dropped
    afterwards: the daemon's tables go there as in a database of their own."""
    url = postgres_server.new_schema()
    yield url
    postgres_server.drop_schema(url)
