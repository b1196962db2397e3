"""Conduit against MCP clients from the npm registry: the MCP Inspector's CLI and the MCP
conformance suite's server checks, over stdio (`conduit mcp`) and over the daemon's
streamable HTTP endpoint (`[mcp_http]`).

Both come pinned by `tests/fixtures/mcp_clients/package-lock.json`, installed once with
the machine's npm into pytest's cache (as the executors install their own npm sets) and
run from there, offline. No Node.js or npm is a failure that says so, not a skip.

The Inspector runs on the machine's Node.js. The conformance suite needs Node.js 22's
`fs.globSync`, so it runs under the Deno that Conduit already depends on (Node-compatible).
Its server checks connect over streamable HTTP only. They run against the daemon's own
endpoint, each request carrying the master token (`tests/fixtures/mcp_bearer.mjs` adds
the header, as a configured client would: the suite has no option for one); and, for
`conduit mcp`, through `mcp_http_bridge`, which puts an HTTP front on the stdio server
and relays each message unchanged. Which checks apply to Conduit, and why the others
cannot, is `APPLICABLE` and `NOT_APPLICABLE` below (and docs/mcp.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from conduit.daemon.config import Config
from conduit.executors.deno import find_deno
from conduit.executors.npm import install_lock_dir
from tests.conftest import MASTER_TOKEN
from tests.e2e.helpers import CONDUIT, wait_upstreams
from tests.e2e.mcp_helpers import CONFORMANCE_TOOLS, DENO_ONLY, ECHO, NO_SANDBOXES
from tests.fixtures.mcp_http_bridge import running_bridge

CLIENTS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "mcp_clients"
INSPECTOR = "node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js"
CONFORMANCE = "node_modules/@modelcontextprotocol/conformance/dist/index.js"
BEARER = Path(__file__).resolve().parents[1] / "fixtures" / "mcp_bearer.mjs"
# A Node.js client starting and spawning `conduit mcp`, on a loaded two-core machine.
CLIENT_TIMEOUT_S = 120
# The Inspector's exit status when the called tool answered `isError: true`.
INSPECTOR_TOOL_IS_ERROR = 5
# For the Inspector's Python call: no Deno process to start.
WASM_PYTHON_ONLY = {"deno": {"enabled": False}, "wasm_js": {"enabled": False}}

# The conformance suite's server scenarios that check what Conduit implements. The
# transport's own, and the fixed test tools' (which `mcp_conformance_server` provides as
# an upstream with bare names), run against the daemon's endpoint; the rest also
# through the stdio bridge.
APPLICABLE_ANYWHERE = ("server-initialize", "ping", "tools-list", "logging-set-level")
APPLICABLE_HTTP = (
    "dns-rebinding-protection",
    "server-sse-polling",
    "server-sse-multiple-streams",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "json-schema-2020-12",
    "tools-call-sampling",
    "tools-call-elicitation",
    "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums",
)
APPLICABLE = APPLICABLE_ANYWHERE + APPLICABLE_HTTP
# The rest, and why each cannot pass against Conduit (docs/mcp.md says the same).
_NO_CAPABILITY = "a capability Conduit does not declare"
NOT_APPLICABLE = {
    "completion-complete": _NO_CAPABILITY + " (completions)",
    "resources-list": _NO_CAPABILITY + " (resources)",
    "resources-read-text": _NO_CAPABILITY + " (resources)",
    "resources-read-binary": _NO_CAPABILITY + " (resources)",
    "resources-templates-read": _NO_CAPABILITY + " (resources)",
    "resources-subscribe": _NO_CAPABILITY + " (resources)",
    "resources-unsubscribe": _NO_CAPABILITY + " (resources)",
    "prompts-list": _NO_CAPABILITY + " (prompts)",
    "prompts-get-simple": _NO_CAPABILITY + " (prompts)",
    "prompts-get-with-args": _NO_CAPABILITY + " (prompts)",
    "prompts-get-embedded-resource": _NO_CAPABILITY + " (prompts)",
    "prompts-get-with-image": _NO_CAPABILITY + " (prompts)",
}


@pytest.fixture(scope="session")
def mcp_clients(kept_dir: Callable[[str], AbstractContextManager[Path]]) -> Path:
    """The pinned npm clients, installed once (kept in pytest's cache like the wasm builds)."""
    expect = "node_modules/@modelcontextprotocol/inspector/package.json"
    with kept_dir("mcp-clients") as cache:
        return install_lock_dir(CLIENTS_DIR, cache, expect=expect)


async def _run(command: list[str], *, cwd: Path, env: dict[str, str]) -> Any:
    with trio.fail_after(CLIENT_TIMEOUT_S):
        return await trio.run_process(
            command, cwd=cwd, env=env, capture_stdout=True, capture_stderr=True, check=False
        )


def _client_env(home: Path) -> dict[str, str]:
    """The machine's environment with a private HOME (the clients keep files there)."""
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    return {**env, "HOME": str(home), "DENO_NO_UPDATE_CHECK": "1"}


# ---- the MCP Inspector CLI ------------------------------------------------------------


def _mcp_server(make_config: Callable[..., Config], name: str, **sections: Any) -> list[str]:
    """`conduit mcp` on a configuration of its own: `make_config` writes each to the
    same file, so it moves to `<name>.toml`."""
    source = Path(make_config(**sections).source)
    config = source.rename(source.with_name(f"{name}.toml"))
    # After `--`: the Inspector would take `--config` for its own option.
    return ["--", CONDUIT, "mcp", "--config", str(config)]


@pytest.mark.slow
async def test_inspector_cli_lists_and_calls_the_tools(
    mcp_clients: Path, make_config: Callable[..., Config], tmp_path: Path
) -> None:
    # Each Inspector call starts its own `conduit mcp`: only the executors, and the
    # upstream, that it uses.
    lister = _mcp_server(
        make_config, "list", upstreams=[ECHO], executors={"wasm_js": {"enabled": False}}
    )
    python = _mcp_server(make_config, "python", upstreams=[ECHO], executors=WASM_PYTHON_ONLY)
    typescript = _mcp_server(make_config, "typescript", executors=DENO_ONLY)
    inspector = ["node", str(mcp_clients / INSPECTOR), "--cli"]
    env = _client_env(tmp_path / "home")

    # --strict reports every tool-schema portability problem; there must be none.
    listed = await _run(
        [*inspector, "--method", "tools/list", "--strict", *lister], cwd=tmp_path, env=env
    )
    assert listed.returncode == 0, listed.stderr.decode()[-3000:]
    assert b"Issue:" not in listed.stderr and b"warning" not in listed.stderr.lower()
    tools = {tool["name"]: tool for tool in json.loads(listed.stdout)["tools"]}
    assert {"execute_python", "execute_typescript", "execute_javascript", "echo__echo"} <= set(
        tools
    )
    assert "def echo(" in tools["execute_python"]["description"]

    call = [*inspector, "--method", "tools/call", "--format", "json"]
    program = "said = tools.echo.echo(text='via the inspector')\nsaid.upper()"
    ran = await _run(
        [
            *call,
            "--tool-name",
            "execute_python",
            "--tool-args-json",
            json.dumps({"code": program}),
            *python,
        ],
        cwd=tmp_path,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr.decode()[-3000:]
    result = json.loads(ran.stdout)["result"]
    assert result["isError"] is False
    assert result["structuredContent"]["result"] == "VIA THE INSPECTOR"

    failing = json.dumps({"code": "throw new RangeError('out of range')"})
    failed = await _run(
        [*call, "--tool-name", "execute_typescript", "--tool-args-json", failing, *typescript],
        cwd=tmp_path,
        env=env,
    )
    assert failed.returncode == INSPECTOR_TOOL_IS_ERROR, failed.stderr.decode()[-3000:]
    result = json.loads(failed.stdout)["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["error"] == {
        "type": "RangeError",
        "message": "out of range",
        "traceback": result["structuredContent"]["error"]["traceback"],
    }


# ---- the MCP conformance suite --------------------------------------------------------


def _conformance(mcp_clients: Path, *args: str, bearer: bool = False) -> list[str]:
    """The suite's command line; with `bearer`, its requests carry $MCP_BEARER_TOKEN."""
    deno = find_deno()
    assert deno, "Deno is missing: it comes with conduit's dependencies (pip install .)"
    preload = ["--preload", str(BEARER)] if bearer else []
    return [deno, "run", "--allow-all", *preload, str(mcp_clients / CONFORMANCE), *args]


def _checks(results: Path) -> dict[str, list[dict[str, Any]]]:
    """Each scenario's checks, from the suite's results directory."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(results.glob("server-*/checks.json")):
        scenario = path.parent.name.removeprefix("server-").rsplit("-", 6)[0]
        found[scenario] = json.loads(path.read_text())
    return found


def _not_passed(checks: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Checks that failed or warned (INFO only reports, e.g. an optional feature absent)."""
    return [
        check
        for scenario in checks.values()
        for check in scenario
        if check["status"] not in ("SUCCESS", "INFO")
    ]


async def test_conformance_suite_lists_the_server_scenarios_we_classified(
    mcp_clients: Path, tmp_path: Path
) -> None:
    """A new suite version with new server scenarios must be looked at, not ignored."""
    env = _client_env(tmp_path / "home")
    done = await _run(_conformance(mcp_clients, "list"), cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    text = done.stdout.decode()
    server_part = text.split("Server scenarios", 1)[1].split("Client scenarios", 1)[0]
    listed = {line.split()[1] for line in server_part.splitlines() if line.strip().startswith("- ")}
    assert listed == set(APPLICABLE) | set(NOT_APPLICABLE)


@pytest.mark.slow
async def test_conformance_server_checks_that_apply_pass(
    mcp_clients: Path, make_config: Callable[..., Config], tmp_path: Path
) -> None:
    """Over stdio, at an embedded daemon (`--connect`'s relay passes the same lines on:
    tests/e2e/test_mcp_stdio.py runs the SDK's client through it)."""
    # The checks run no program: sandboxes would only slow every session's start.
    config = make_config(upstreams=[ECHO], executors=NO_SANDBOXES)
    server = [CONDUIT, "mcp", "--config", config.source]
    env = _client_env(tmp_path / "home")
    bridge_env = {**env, "CONDUIT_TOKEN": MASTER_TOKEN}
    results = tmp_path / "results"
    with (tmp_path / "bridge.log").open("wb") as log:
        async with running_bridge(server, stderr=log, env=bridge_env) as url:
            for scenario in APPLICABLE_ANYWHERE:
                command = _conformance(
                    mcp_clients, "server", "--url", url, "--scenario", scenario, "-o", str(results)
                )
                done = await _run(command, cwd=tmp_path, env=env)
                assert done.returncode == 0, (scenario, done.stdout.decode()[-3000:])
    checks = _checks(results)
    assert set(checks) == set(APPLICABLE_ANYWHERE)
    assert not _not_passed(checks), checks


@pytest.mark.slow
async def test_conformance_server_checks_pass_against_the_http_endpoint(
    mcp_clients: Path, start_daemon: Any, tmp_path: Path
) -> None:
    """Every applicable scenario, straight at the daemon's streamable HTTP endpoint."""
    daemon, info = await start_daemon(
        upstreams=[ECHO, CONFORMANCE_TOOLS],
        executors=NO_SANDBOXES,
        mcp_http={"listen": "127.0.0.1:0"},
    )
    await wait_upstreams(daemon, "echo", "conformance")
    url = daemon.mcp_http_url()
    assert url is not None
    env = {
        **_client_env(tmp_path / "home"),
        "MCP_BEARER_TOKEN": MASTER_TOKEN,
        "MCP_NODE_MODULES": str(mcp_clients / "node_modules"),
    }
    results = tmp_path / "results"
    # One run of the whole suite (a process per scenario costs a Node start each): the
    # suite's exit status says that exactly the scenarios listed as not applicable fail.
    baseline = tmp_path / "not-applicable.yaml"
    baseline.write_text(yaml.safe_dump({"server": sorted(NOT_APPLICABLE)}))
    command = _conformance(
        mcp_clients,
        *("server", "--url", url, "--suite", "all", "--expected-failures", str(baseline)),
        *("-o", str(results)),
        bearer=True,
    )
    done = await _run(command, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout.decode()[-3000:]
    checks = _checks(results)
    assert set(checks) == set(APPLICABLE) | set(NOT_APPLICABLE)
    checks = {scenario: checks[scenario] for scenario in APPLICABLE}
    assert not _not_passed(checks), checks
    # The ones that say something beyond INFO did succeed.
    for scenario in set(APPLICABLE) - {"server-sse-polling"}:
        assert any(check["status"] == "SUCCESS" for check in checks[scenario]), scenario


@pytest.mark.slow
async def test_inspector_cli_over_http(
    mcp_clients: Path, start_daemon: Any, tmp_path: Path
) -> None:
    """The Inspector reaches the daemon's endpoint with a bearer header, lists, calls."""
    daemon, _ = await start_daemon(
        upstreams=[ECHO], executors=WASM_PYTHON_ONLY, mcp_http={"listen": "127.0.0.1:0"}
    )
    await wait_upstreams(daemon, "echo")
    url = daemon.mcp_http_url()
    assert url is not None
    inspector = ["node", str(mcp_clients / INSPECTOR), "--cli", url, "--transport", "http"]
    inspector += ["--header", f"Authorization: Bearer {MASTER_TOKEN}"]
    env = _client_env(tmp_path / "home")
    listed = await _run([*inspector, "--method", "tools/list"], cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr.decode()[-3000:]
    names = {tool["name"] for tool in json.loads(listed.stdout)["tools"]}
    assert {"execute_python", "echo__echo"} <= names
    program = "said = tools.echo.echo(text='over http')\nsaid.upper()"
    ran = await _run(
        [
            *inspector,
            *("--method", "tools/call", "--format", "json", "--tool-name", "execute_python"),
            *("--tool-args-json", json.dumps({"code": program})),
        ],
        cwd=tmp_path,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr.decode()[-3000:]
    result = json.loads(ran.stdout)["result"]
    assert result["structuredContent"]["result"] == "OVER HTTP"
    refused = await _run(
        [
            "node",
            str(mcp_clients / INSPECTOR),
            "--cli",
            url,
            "--transport",
            "http",
            "--method",
            "tools/list",
        ],
        cwd=tmp_path,
        env=env,
    )
    assert refused.returncode != 0
