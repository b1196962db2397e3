"""Authentication over real sockets: tokens, login, peer credentials, scopes, lockout."""

from __future__ import annotations

import functools
import multiprocessing
import os
import stat
from pathlib import Path
from typing import Any

from conduit.core.errors import Forbidden, Unauthenticated
from conduit.daemon import auth
from conduit.daemon.auth import hash_token, new_token
from conduit.daemon.config import AuthConfig
from tests.conftest import MASTER_TOKEN
from tests.e2e.mcp_helpers import NO_SANDBOXES as SANDBOXES_OFF

# Authentication is settled before any sandbox is involved: none is started.
NO_SANDBOXES = {"executors": SANDBOXES_OFF}
NO_PEER = {"peer_credentials": False, "token": MASTER_TOKEN}


async def test_unix_peer_with_same_uid_is_the_master(client: Any) -> None:
    whoami = await client.call("auth/whoami")
    assert whoami == {
        "authenticated": True,
        "principal": {
            "name": f"uid:{os.getuid()}",
            "kind": "peer",
            "scopes": ["admin", "execute", "executions", "tools"],
        },
    }


async def test_without_peer_credentials_a_token_is_needed(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(auth=NO_PEER, **NO_SANDBOXES)
    client = await connect(info)
    refused = await client.request("executors/list")
    assert refused["error"]["code"] == Unauthenticated.code
    assert "auth/login" in refused["error"]["message"]
    # ping and discovery stay open, for health checks and people exploring.
    assert (await client.request("ping"))["result"] == {}
    with_bearer = await client.request("executors/list", auth={"bearerToken": MASTER_TOKEN})
    assert "executors" in with_bearer["result"]
    # The bearer token covered that request only.
    assert (await client.request("executors/list"))["error"]["code"] == Unauthenticated.code
    login = await client.call("auth/login", {"token": MASTER_TOKEN})
    assert login["principal"]["kind"] == "master"
    assert "executors" in await client.call("executors/list")


async def test_tcp_always_needs_a_token(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(server={"tcp": "127.0.0.1:0"}, **NO_SANDBOXES)
    client = await connect(info, "tcp")
    assert (await client.request("executors/list"))["error"]["code"] == Unauthenticated.code
    assert (await client.call("auth/whoami"))["authenticated"] is False


async def test_repeated_failures_close_the_connection(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(auth={**NO_PEER, "max_failures_per_connection": 3}, **NO_SANDBOXES)
    client = await connect(info)
    for attempt in range(3):
        reply = await client.request("auth/login", {"token": f"guess-{attempt}"})
        assert reply["error"]["code"] == Unauthenticated.code
    assert "closing the connection" in reply["error"]["message"]
    await client.expect_closed()
    # Others are not affected.
    other = await connect(info)
    assert (await other.call("auth/login", {"token": MASTER_TOKEN}))["principal"][
        "kind"
    ] == "master"


async def test_client_tokens_are_stored_as_hashes_and_scoped(
    start_daemon: Any, connect: Any
) -> None:
    token = new_token()
    clients = [{"name": "agent", "sha256": hash_token(token), "scopes": ["execute", "tools"]}]
    daemon, info = await start_daemon(auth={**NO_PEER, "clients": clients}, **NO_SANDBOXES)
    client = await connect(info)
    login = await client.call("auth/login", {"token": token})
    assert login["principal"] == {"name": "agent", "kind": "client", "scopes": ["execute", "tools"]}
    refused = await client.request("config/reload")
    assert refused["error"]["code"] == Forbidden.code
    assert "'admin' scope" in refused["error"]["message"]
    assert token not in Path(daemon.config.source).read_text()


async def test_master_token_file_is_created_private_and_never_logged(
    start_daemon: Any, make_config: Any, connect: Any, caplog: Any
) -> None:
    config = make_config(auth={"token": "", "peer_credentials": False}, **NO_SANDBOXES)
    daemon, info = await start_daemon(config)
    path = Path(config.server.state_dir) / "master.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert info.token_source == str(path)
    token = path.read_text().strip()
    assert len(token) >= 40
    client = await connect(info)
    assert (await client.call("auth/login", {"token": token}))["principal"]["kind"] == "master"
    assert token not in caplog.text


async def test_session_tokens_cannot_execute_or_administer(daemon: Any, connect: Any) -> None:
    server, info = daemon
    session_token = server.auth.mint_session("ex_test", (("*",),))
    client = await connect(info)
    for method, params in [
        ("execute", {"language": "typescript", "code": "1"}),
        ("config/reload", {}),
        ("executors/list", {}),
        ("mcp.executeTypeScript", {"code": "1"}),
    ]:
        reply = await client.request(method, params, auth={"bearerToken": session_token})
        assert reply["error"]["code"] == Forbidden.code, (method, reply)
    assert (await client.request("ping", auth={"bearerToken": session_token}))["result"] == {}
    server.auth.revoke_session(session_token)
    revoked = await client.request("ping", auth={"bearerToken": session_token})
    assert revoked["error"]["code"] == Unauthenticated.code


def test_daemons_starting_together_agree_on_one_master_token(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # Another daemon on the same state directory puts its token in place between this
    # one's look and its write: this one takes that token, and says nothing of errors.
    state = tmp_path / "shared"
    path = state / "master.token"
    theirs = new_token()

    def made_while_another_wins() -> str:
        state.mkdir()
        path.write_text(theirs + "\n")
        return new_token()

    monkeypatch.setattr(auth, "new_token", made_while_another_wins)
    assert auth.resolve_master_token(AuthConfig(token=""), str(state)) == (theirs, str(path))
    assert [p.name for p in state.iterdir()] == ["master.token"]


def test_many_daemons_starting_at_once_all_read_one_whole_token(tmp_path: Path) -> None:
    # Processes, not threads: each reads the file the instant it sees it, as daemons do.
    context = multiprocessing.get_context("fork")
    for round_ in range(10):
        state = tmp_path / str(round_)
        with context.Pool(6) as pool:
            tokens = pool.map(_resolve_in(state), range(6))
        assert len({token for token, _ in tokens}) == 1, tokens
        assert stat.S_IMODE((state / "master.token").stat().st_mode) == 0o600


def _resolve_in(state: Path) -> Any:
    return functools.partial(_resolve, state)


def _resolve(state: Path, _: int) -> tuple[str, str]:
    return auth.resolve_master_token(AuthConfig(token=""), str(state))
