"""`AsyncClient` against a scripted daemon: streamed output, event subscriptions,
dropped connections, resends and timeouts, where the wire itself is the subject."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from conduit.client import (
    AsyncClient,
    Backoff,
    ConnectionFailed,
    ConnectionLost,
    Event,
    ExecutorUnavailable,
    OutputChunk,
    SubscriptionDropped,
    Timeout,
)
from conduit.client.aio import SUBSCRIPTION_BUFFER
from tests.client.fake_daemon import FakeDaemon, wire_result
from tests.conftest import WAIT_S


@pytest.fixture
def fake(nursery: trio.Nursery) -> FakeDaemon:
    return FakeDaemon(nursery)


def scripted(fake: FakeDaemon, **options: Any) -> AsyncClient:
    return AsyncClient(connector=fake.connect, **{"token": "", **options})


async def test_stream_yields_output_in_order_then_the_result(fake: FakeDaemon) -> None:
    with trio.fail_after(WAIT_S):
        async with scripted(fake) as client:
            server = await fake.accept()
            async with client.stream("print('a')") as run:
                request = await server.recv()
                await server.output("ex_1", "a\n", 0)
                await server.notify(
                    "execution/output",
                    {"execution_id": "ex_1", "stream": "stderr", "text": "w\n", "seq": 1},
                )
                await server.output("ex_1", "b\n", 2)
                await server.reply(request["id"], wire_result("ex_1", stdout="a\nb\n", result=3))
                chunks = [chunk async for chunk in run]
    assert request["method"] == "execute"
    assert request["params"] == {"language": "python", "code": "print('a')", "stream": True}
    assert chunks == [
        OutputChunk("ex_1", "stdout", "a\n", 0),
        OutputChunk("ex_1", "stderr", "w\n", 1),
        OutputChunk("ex_1", "stdout", "b\n", 2),
    ]
    assert (run.execution_id, run.result.stdout, run.result.result) == ("ex_1", "a\nb\n", 3)


async def _collect(client: AsyncClient, code: str, into: dict[str, Any], **options: Any) -> None:
    """Run `code` streaming; its output texts go to `into[code]` as they arrive."""
    into[code] = texts = []
    async with client.stream(code, **options) as run:
        async for chunk in run:
            texts.append(chunk.text)


async def _read(items: Any, into: list[Any]) -> None:
    async for item in items:
        into.append(item)


async def test_concurrent_streams_are_told_apart_by_request_id(fake: FakeDaemon) -> None:
    got: dict[str, Any] = {}
    with trio.fail_after(WAIT_S):
        async with scripted(fake) as client, trio.open_nursery() as nursery:
            server = await fake.accept()
            nursery.start_soon(_collect, client, "A", got)
            first = await server.recv()
            nursery.start_soon(_collect, client, "B", got)
            await server.output("ex_a", "a0", 0, request_id=first["id"])
            second = await server.recv()
            requests = {r["params"]["code"]: r["id"] for r in (first, second)}
            await server.output("ex_b", "b0", 0, request_id=requests["B"])
            await server.output("ex_a", "a1", 1, request_id=requests["A"])
            await server.reply(requests["B"], wire_result("ex_b"))
            await server.output("ex_a", "a2", 2, request_id=requests["A"])
            await server.reply(requests["A"], wire_result("ex_a"))
    assert got == {"A": ["a0", "a1", "a2"], "B": ["b0"]}


async def test_without_request_id_a_second_stream_waits_until_the_first_is_known(
    fake: FakeDaemon,
) -> None:
    got: dict[str, Any] = {}
    with trio.fail_after(WAIT_S):
        async with scripted(fake) as client, trio.open_nursery() as nursery:
            server = await fake.accept()
            nursery.start_soon(_collect, client, "A", got)
            nursery.start_soon(_collect, client, "B", got)
            first = await server.recv()
            await trio.testing.wait_all_tasks_blocked()
            # Output naming only an execution id could not be told apart yet.
            assert server.recv_nowait() is None
            await server.output("ex_1", "one", 0)
            second = await server.recv()
            await server.output("ex_2", "two", 0)
            await server.output("ex_1", "one more", 1)
            await server.reply(second["id"], wire_result("ex_2"))
            await server.reply(first["id"], wire_result("ex_1"))
    codes = (first["params"]["code"], second["params"]["code"])
    assert got == {codes[0]: ["one", "one more"], codes[1]: ["two"]}


async def test_a_refused_stream_raises_its_error_and_lets_the_next_one_start(
    fake: FakeDaemon,
) -> None:
    async def daemon() -> None:
        request = await server.recv()
        await server.error(request["id"], -32006, "executor 'pyodide' is disabled")
        request = await server.recv()
        await server.reply(request["id"], wire_result("ex_2", result=2))

    got: dict[str, Any] = {}
    with trio.fail_after(WAIT_S):
        async with scripted(fake) as client, trio.open_nursery() as nursery:
            server = await fake.accept()
            nursery.start_soon(daemon)
            with pytest.raises(ExecutorUnavailable, match="pyodide"):
                await _collect(client, "1", got, executor="pyodide")
            async with client.stream("2") as run:
                result = await run.wait()
    assert got["1"] == []
    assert result.result == 2


async def test_leaving_a_stream_early_cancels_the_execution(fake: FakeDaemon) -> None:
    with trio.fail_after(WAIT_S):
        async with scripted(fake) as client:
            server = await fake.accept()
            async with client.stream("while True: print(1)") as run:
                request = await server.recv()
                await server.output("ex_1", "1\n", 0)
                async for _ in run:
                    break
            cancel = await server.recv()
            with pytest.raises(RuntimeError, match="not finished"):
                _ = run.result
    assert cancel["method"] == "executions/cancel"
    assert cancel["params"] == {"request_id": request["id"]}


async def test_a_stream_past_its_timeout_raises_and_is_cancelled(
    fake: FakeDaemon, autojump_clock: Any
) -> None:
    async with scripted(fake) as client:
        server = await fake.accept()
        with pytest.raises(Timeout, match="within 5 s"):
            await _collect(client, "while True: pass", {}, timeout_s=5)
        request = await server.recv()
        cancel = await server.recv()
    assert request["method"] == "execute"
    assert cancel["method"] == "executions/cancel"
    assert cancel["params"] == {"request_id": request["id"]}


async def _first(events: Any, count: int) -> list[Event]:
    received = []
    async for event in events:
        received.append(event)
        if len(received) == count:
            break
    return received


async def test_events_reach_their_subscription_only(fake: FakeDaemon) -> None:
    requests = []
    finished = {"type": "execution.finished", "ts": 1.5, "execution_id": "ex_1"}

    async def daemon() -> None:
        requests.append(request := await server.recv())
        await server.reply(request["id"], {"subscription": "sub_1"})
        await server.notify("event", {**finished, "subscription": "sub_2"})
        await server.notify("event", {**finished, "subscription": "sub_1"})

    with trio.fail_after(WAIT_S):
        async with scripted(fake) as client, trio.open_nursery() as nursery:
            server = await fake.accept()
            nursery.start_soon(daemon)
            async with client.subscribe(["execution.finished"]) as events:
                received = await _first(events, 1)
    assert requests[0]["method"] == "events/subscribe"
    assert requests[0]["params"] == {"types": ["execution.finished"]}
    assert events.id == "sub_1"
    assert received == [Event("execution.finished", 1.5, {"execution_id": "ex_1"}, "sub_1")]


async def test_events_naming_no_subscription_go_to_those_whose_types_match(
    fake: FakeDaemon,
) -> None:
    async def daemon() -> None:
        for subscription in ("sub_started", "sub_all"):
            request = await server.recv()
            await server.reply(request["id"], {"subscription": subscription})
        await server.notify("event", {"type": "tool.called", "tool": "echo.add"})
        await server.notify("event", {"type": "execution.started", "execution_id": "ex_1"})

    with trio.fail_after(WAIT_S):
        async with scripted(fake) as client, trio.open_nursery() as nursery:
            server = await fake.accept()
            nursery.start_soon(daemon)
            async with (
                client.subscribe(["execution.started"]) as started,
                client.subscribe() as everything,
            ):
                only_started = await _first(started, 1)
                both = await _first(everything, 2)
    assert [event.type for event in only_started] == ["execution.started"]
    assert [event.type for event in both] == ["tool.called", "execution.started"]


async def test_a_subscription_the_daemon_drops_raises_subscription_dropped(
    fake: FakeDaemon,
) -> None:
    reason = "dropped: more than 1024 events were waiting; read faster"

    async def daemon() -> None:
        request = await server.recv()
        await server.reply(request["id"], {"subscription": "sub_1"})
        await server.notify("event", {"type": "execution.started", "subscription": "sub_1"})
        dropped = {"type": "subscription.dropped", "subscription": "sub_1", "reason": reason}
        await server.notify("event", dropped)

    received = []
    with trio.fail_after(WAIT_S):
        async with scripted(fake) as client, trio.open_nursery() as nursery:
            server = await fake.accept()
            nursery.start_soon(daemon)
            async with client.subscribe(["execution.started"]) as events:
                with pytest.raises(SubscriptionDropped, match=reason):
                    await _read(events, received)
    assert [event.type for event in received] == ["execution.started"]


async def test_a_reader_that_falls_behind_is_dropped_by_the_client(fake: FakeDaemon) -> None:
    sent = SUBSCRIPTION_BUFFER + 5
    received: list[Event] = []
    with trio.fail_after(WAIT_S):
        async with scripted(fake) as client, trio.open_nursery() as nursery:
            server = await fake.accept()

            async def daemon() -> None:
                request = await server.recv()
                await server.reply(request["id"], {"subscription": "sub_1"})
                for n in range(sent):
                    await server.notify("event", {"type": "tool.called", "n": n})

            nursery.start_soon(daemon)
            async with client.subscribe() as events:
                await trio.testing.wait_all_tasks_blocked()  # every event has arrived
                with pytest.raises(SubscriptionDropped, match="dropped by the client"):
                    await _read(events, received)
    assert [event.data["n"] for event in received] == list(range(SUBSCRIPTION_BUFFER))


async def test_a_dropped_connection_fails_what_is_in_flight_and_resends_nothing_but_reads(
    fake: FakeDaemon,
) -> None:
    outcomes: dict[str, Any] = {}

    async def execute() -> None:
        with pytest.raises(ConnectionLost, match="closed the connection") as caught:
            await client.execute("1")
        outcomes["execute"] = caught.value

    async def tools() -> None:
        outcomes["tools"] = await client.tools()

    async def stream() -> None:
        with pytest.raises(ConnectionLost):
            await _collect(client, "2", {})
        outcomes["stream"] = "lost"

    seen: dict[str, Any] = {}

    async def daemon() -> None:
        first = await fake.accept()
        seen["login"] = login = await first.recv()
        await first.reply(login["id"], {"principal": {"name": "master"}})
        seen["in flight"] = {(await first.recv())["method"] for _ in range(3)}
        await first.close()
        second = seen["second"] = await fake.accept()
        seen["relogin"] = relogin = await second.recv()
        await second.reply(relogin["id"], {"principal": {"name": "master"}})
        seen["resent"] = resent = await second.recv()
        await second.reply(resent["id"], {"tools": [{"name": "echo__add"}]})

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(daemon)
            async with scripted(fake, token="cdt_secret") as client:
                async with trio.open_nursery() as calls:
                    for task in (execute, tools, stream):
                        calls.start_soon(task)
                await trio.testing.wait_all_tasks_blocked()
                # Neither the execute nor the stream was sent again.
                assert seen["second"].recv_nowait() is None
    login, relogin, resent = seen["login"], seen["relogin"], seen["resent"]
    assert seen["in flight"] == {"execute", "tools/list"}
    assert (login["method"], login["params"]) == ("auth/login", {"token": "cdt_secret"})
    assert relogin["params"] == {"token": "cdt_secret"}
    assert resent["method"] == "tools/list"
    assert [tool.name for tool in outcomes["tools"]] == ["echo__add"]
    assert outcomes["stream"] == "lost"
    assert fake.connects == 2


async def test_a_late_reply_is_dropped_and_the_connection_stays_usable(
    fake: FakeDaemon, autojump_clock: Any
) -> None:
    async with scripted(fake, timeout_s=2) as client:
        server = await fake.accept()
        with pytest.raises(Timeout, match=r"no/answer: no answer within 2 s"):
            await client.call("no/answer")
        late = await server.recv()

        async def daemon() -> None:
            await server.reply(late["id"], "late")
            request = await server.recv()
            await server.reply(request["id"], "on time")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(daemon)
            assert await client.call("next") == "on time"
    assert fake.connects == 1


async def test_connecting_gives_up_after_the_backoff_attempts(autojump_clock: Any) -> None:
    attempts = 0

    async def refuse() -> trio.abc.Stream:
        nonlocal attempts
        attempts += 1
        raise ConnectionRefusedError(111, "Connection refused")

    client = AsyncClient(connector=refuse, token="", backoff=Backoff(attempts=4))
    with pytest.raises(ConnectionFailed, match="after 4 attempts: Connection refused"):
        async with client:
            pass
    assert attempts == 4
