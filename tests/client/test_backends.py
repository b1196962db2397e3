"""`AsyncClient` under both of anyio's backends, asyncio and Trio.

Each test is a plain function that runs its scenario with `anyio.run(..., backend=...)`,
so pytest-trio's `trio_mode` leaves it alone and the asyncio run is a real asyncio
program. Against the scripted fake, the whole scenario runs in that loop; against a
real daemon (started in the test's Trio loop), the client runs in a thread of its own,
as an asyncio program beside a daemon would.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
import pytest
import trio

from conduit.client import (
    AsyncClient,
    ExecutionResult,
    InvalidParams,
    LoginToken,
    MethodNotFound,
    NotFound,
    OutputChunk,
    RateLimited,
    Timeout,
    Unauthenticated,
)
from conduit.client.endpoint import Backoff
from tests.client.fake_daemon import FakeConnection, FakeDaemon, wire_result
from tests.client.helpers import NO_DENO, client_options
from tests.conftest import MASTER_TOKEN, WAIT_S

BACKENDS = ["asyncio", "trio"]
backends = pytest.mark.parametrize("backend", BACKENDS)

ClientSide = Callable[[AsyncClient], Awaitable[Any]]
DaemonSide = Callable[[FakeDaemon], Awaitable[Any]]


def scripted(
    backend: str, client_side: ClientSide, daemon_side: DaemonSide, **options: Any
) -> tuple[Any, Any, int]:
    """Run `client_side` on a client of the fake and `daemon_side` on the fake, at once,
    under `backend`; their results and how many connections the client opened."""

    async def main() -> tuple[Any, Any, int]:
        results: dict[str, Any] = {}
        with anyio.fail_after(WAIT_S):
            async with anyio.create_task_group() as tasks:
                fake = FakeDaemon(tasks)

                async def serve() -> None:
                    results["daemon"] = await daemon_side(fake)

                tasks.start_soon(serve)
                options.setdefault("token", "")
                async with AsyncClient(connector=fake.connect, **options) as client:
                    results["client"] = await client_side(client)
        return results["client"], results["daemon"], fake.connects

    return anyio.run(main, backend=backend)


async def _answer(connection: FakeConnection, method: str, result: Any) -> dict[str, Any]:
    request = await connection.recv()
    assert request["method"] == method
    await connection.reply(request["id"], result)
    return request


# ---- against the fake ----------------------------------------------------------------


@backends
def test_logs_in_with_the_token_then_calls(backend: str) -> None:
    async def client_side(client: AsyncClient) -> Any:
        return await client.whoami()

    async def daemon_side(fake: FakeDaemon) -> Any:
        connection = await fake.accept()
        login = await _answer(connection, "auth/login", {"principal": {"name": "agent"}})
        await _answer(connection, "auth/whoami", {"principal": {"name": "agent"}})
        return login["params"]

    whoami, login, connects = scripted(backend, client_side, daemon_side, token="cdt_agent")
    assert (whoami, login, connects) == ({"name": "agent"}, {"token": "cdt_agent"}, 1)


@backends
def test_a_fallback_token_is_presented_only_when_not_let_in(backend: str) -> None:
    async def client_side(client: AsyncClient) -> Any:
        await client.ping()

    async def daemon_side(fake: FakeDaemon) -> Any:
        connection = await fake.accept()
        await _answer(connection, "auth/whoami", {"authenticated": True})
        return (await _answer(connection, "ping", {}))["method"]

    fallback = LoginToken("cdt_another-daemons", fallback=True)
    _, method, _ = scripted(backend, client_side, daemon_side, token=fallback)
    assert method == "ping"  # no auth/login went out


@backends
def test_execute_returns_the_typed_result(backend: str) -> None:
    async def client_side(client: AsyncClient) -> ExecutionResult:
        return await client.execute("6 * 7")

    async def daemon_side(fake: FakeDaemon) -> Any:
        connection = await fake.accept()
        return await _answer(connection, "execute", wire_result("ex_1", result=42))

    result, request, _ = scripted(backend, client_side, daemon_side)
    assert (result.execution_id, result.status, result.result) == ("ex_1", "ok", 42)
    assert request["params"] == {"language": "python", "code": "6 * 7"}


@backends
def test_streamed_output_arrives_in_order_before_the_result(backend: str) -> None:
    async def client_side(client: AsyncClient) -> Any:
        async with client.stream("print('a'); print('b')") as run:
            chunks = [chunk async for chunk in run]
        return chunks, run.result

    async def daemon_side(fake: FakeDaemon) -> None:
        connection = await fake.accept()
        request = await connection.recv()
        assert request["params"]["stream"] is True
        for seq, text in enumerate(["a\n", "b\n"]):
            await connection.output("ex_1", text, seq, request_id=request["id"])
        await connection.reply(request["id"], wire_result("ex_1", stdout="a\nb\n"))

    (chunks, result), _, _ = scripted(backend, client_side, daemon_side)
    assert chunks == [
        OutputChunk("ex_1", "stdout", "a\n", 0),
        OutputChunk("ex_1", "stdout", "b\n", 1),
    ]
    assert result.stdout == "a\nb\n"


@backends
def test_concurrent_calls_share_one_connection_and_get_their_own_answers(backend: str) -> None:
    async def client_side(client: AsyncClient) -> dict[int, Any]:
        results: dict[int, Any] = {}

        async def run(n: int) -> None:
            results[n] = (await client.execute(f"{n}")).result

        async with anyio.create_task_group() as tasks:
            for n in range(3):
                tasks.start_soon(run, n)
        return results

    async def daemon_side(fake: FakeDaemon) -> None:
        connection = await fake.accept()
        requests = [await connection.recv() for _ in range(3)]
        for request in reversed(requests):  # answered last first
            n = int(request["params"]["code"])
            await connection.reply(request["id"], wire_result(f"ex_{n}", result=n))

    results, _, connects = scripted(backend, client_side, daemon_side)
    assert (results, connects) == ({0: 0, 1: 1, 2: 2}, 1)


@backends
def test_a_subscription_receives_its_events(backend: str) -> None:
    async def client_side(client: AsyncClient) -> list[Any]:
        async with client.subscribe(["execution.finished"]) as events:
            return [(await anext(events)).data, (await anext(events)).data]

    async def daemon_side(fake: FakeDaemon) -> None:
        connection = await fake.accept()
        request = await _answer(connection, "events/subscribe", {"subscription": "sub_1"})
        assert request["params"] == {"types": ["execution.finished"]}
        for n in (1, 2):
            event = {"type": "execution.finished", "subscription": "sub_1", "n": n}
            await connection.notify("event", event)

    seen, _, _ = scripted(backend, client_side, daemon_side)
    assert seen == [{"n": 1}, {"n": 2}]


@backends
def test_a_timeout_leaves_the_connection_usable(backend: str) -> None:
    async def client_side(client: AsyncClient) -> Any:
        with pytest.raises(Timeout, match=r"slow/method: no answer within 0\.2 s"):
            await client.call("slow/method", timeout_s=0.2)
        return await client.call("ping")

    async def daemon_side(fake: FakeDaemon) -> None:
        connection = await fake.accept()
        unanswered = await connection.recv()
        assert unanswered["method"] == "slow/method"
        await _answer(connection, "ping", {"pong": True})

    pong, _, connects = scripted(backend, client_side, daemon_side)
    assert (pong, connects) == ({"pong": True}, 1)


@backends
def test_reconnects_and_logs_in_again_after_the_connection_drops(backend: str) -> None:
    async def client_side(client: AsyncClient) -> Any:
        await client.ping()
        with anyio.fail_after(WAIT_S):
            while client.is_connected:
                await anyio.sleep(0.01)
        return await client.whoami()

    async def daemon_side(fake: FakeDaemon) -> list[str]:
        logins = []
        first = await fake.accept()
        logins.append((await _answer(first, "auth/login", {"principal": {}}))["params"]["token"])
        await _answer(first, "ping", {})
        await first.close()  # the daemon restarts
        second = await fake.accept()
        logins.append((await _answer(second, "auth/login", {"principal": {}}))["params"]["token"])
        await _answer(second, "auth/whoami", {"principal": {"name": "again"}})
        return logins

    whoami, logins, connects = scripted(
        backend, client_side, daemon_side, token="cdt_t", backoff=Backoff(first_delay_s=0.01)
    )
    assert (whoami, logins, connects) == ({"name": "again"}, ["cdt_t", "cdt_t"], 2)


@backends
def test_error_replies_raise_their_classes(backend: str) -> None:
    errors = {-32601: MethodNotFound, -32602: InvalidParams, -32002: Unauthenticated}
    errors |= {-32005: RateLimited}

    async def client_side(client: AsyncClient) -> list[tuple[type, int]]:
        raised = []
        for _ in errors:
            with pytest.raises(tuple(errors.values())) as caught:
                await client.call("some/method")
            raised.append((type(caught.value), caught.value.code))
        return raised

    async def daemon_side(fake: FakeDaemon) -> None:
        connection = await fake.accept()
        for code in errors:
            request = await connection.recv()
            await connection.error(request["id"], code, "no")

    raised, _, _ = scripted(backend, client_side, daemon_side)
    assert raised == [(cls, code) for code, cls in errors.items()]


# ---- against a real daemon -------------------------------------------------------------


async def in_thread(backend: str, scenario: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """`scenario(*args)` under `backend`, in a thread with its own event loop."""
    run = partial(anyio.run, partial(scenario, *args), backend=backend)
    return await trio.to_thread.run_sync(run)


@pytest.fixture
async def started(start_daemon: Any) -> Any:
    return await start_daemon(server={"tcp": "127.0.0.1:0"}, **NO_DENO)


async def _the_api(info: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with anyio.fail_after(WAIT_S * 2):
        async with AsyncClient(**client_options(info, "tcp"), token=MASTER_TOKEN) as client:
            seen["whoami"] = await client.whoami()
        async with (
            AsyncClient(unix_path=info.unix_path) as client,
            client.subscribe(["execution.finished"]) as events,
        ):
            seen["result"] = await client.execute("6 * 7", language="javascript")
            seen["finished"] = await anext(events)
            code = "console.log('one'); console.log('two'); 3"
            async with client.stream(code, language="javascript") as run:
                seen["chunks"] = [chunk async for chunk in run]
            seen["streamed"] = run.result
            squares: dict[int, Any] = {}

            async def square(n: int) -> None:
                squares[n] = (
                    await client.execute("inputs.n ** 2", language="javascript", inputs={"n": n})
                ).result

            async with anyio.create_task_group() as tasks:
                for n in range(5):
                    tasks.start_soon(square, n)
            seen["squares"] = squares
            with pytest.raises(Timeout):
                await client.execute(
                    "while (true) {}",
                    language="javascript",
                    limits={"timeout_ms": 120_000},
                    timeout_s=0.5,
                )
            seen["after_timeout"] = await client.execute("1 + 1", language="javascript")
            with pytest.raises(MethodNotFound):
                await client.call("no/such/method")
            with pytest.raises(InvalidParams):
                await client.execute("1", language="cobol")
            with pytest.raises(NotFound):
                await client.cancel("ex_nope")
            seen["connected"] = client.is_connected
    return seen


@pytest.mark.slow
@backends
async def test_the_api_against_a_real_daemon(started: Any, backend: str) -> None:
    _, info = started
    seen = await in_thread(backend, _the_api, info)
    assert seen["whoami"]["kind"] == "master"
    result = seen["result"]
    assert (result.status, result.result) == ("ok", 42)
    assert seen["finished"].data["execution_id"] == result.execution_id
    assert "".join(chunk.text for chunk in seen["chunks"]) == "one\ntwo\n"
    assert (seen["streamed"].result, seen["streamed"].stdout) == (3, "one\ntwo\n")
    assert seen["squares"] == {n: n * n for n in range(5)}
    assert seen["after_timeout"].result == 2
    assert seen["connected"] is True


async def _a_session(info: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with anyio.fail_after(WAIT_S * 2):
        async with AsyncClient(unix_path=info.unix_path) as client:
            async with client.session("javascript") as session:
                await session.execute("let total = 40;")
                seen["step"] = await session.execute("total += inputs.n; total", inputs={"n": 2})
                async with session.stream("console.log(total); total") as run:
                    seen["chunks"] = [chunk.text async for chunk in run]
                seen["listed"] = [s.session_id for s in await client.sessions()]
                seen["id"] = session.session_id
            seen["after"] = await client.sessions()
            named = await client.open_session("javascript", name="kept")
            again = await client.open_session("javascript", name="kept")
            seen["named"] = (
                named.info.created,
                again.info.created,
                again.session_id == named.session_id,
            )
            await named.aclose()
            await named.aclose()  # idempotent
    return seen


@pytest.mark.slow
@backends
async def test_a_session_against_a_real_daemon(started: Any, backend: str) -> None:
    _, info = started
    seen = await in_thread(backend, _a_session, info)
    assert (seen["step"].result, seen["step"].session_id) == (42, seen["id"])
    assert "".join(seen["chunks"]) == "42\n"
    assert seen["listed"] == [seen["id"]]
    assert seen["after"] == []  # the block closed it
    assert seen["named"] == (True, False, True)


async def _across_a_restart(info: Any, restart: Callable[[], Awaitable[Any]]) -> tuple[Any, Any]:
    with anyio.fail_after(WAIT_S * 2):
        async with AsyncClient(unix_path=info.unix_path) as client:
            before = await client.execute("'first'", language="javascript")
            await restart()
            while client.is_connected:
                await anyio.sleep(0.02)
            after = await client.execute("'second'", language="javascript")
    return before.result, after.result


@pytest.mark.slow
@backends
async def test_reconnects_after_a_real_daemon_restarts(
    start_daemon: Any, make_config: Any, backend: str
) -> None:
    config = make_config(**NO_DENO)
    first, info = await start_daemon(config)
    token = trio.lowlevel.current_trio_token()

    async def restart_in_the_daemons_loop() -> None:
        first.shutdown()
        while first.connections:
            await trio.sleep(0.02)
        await start_daemon(config)

    async def restart() -> None:
        # From the client's loop, through a worker thread, into the test's Trio loop.
        call = partial(trio.from_thread.run, restart_in_the_daemons_loop, trio_token=token)
        await anyio.to_thread.run_sync(call)

    assert await in_thread(backend, _across_a_restart, info, restart) == ("first", "second")
