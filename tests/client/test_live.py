"""The clients' live parts against a real daemon: streamed output and event subscriptions."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from conduit.client import AsyncClient, Client, OutputChunk
from tests.client.helpers import NO_DENO
from tests.conftest import WAIT_S

# Output spread over time, on both streams, so it arrives as several pieces.
PROGRAM = """
import sys, time
print("one")
print("two", file=sys.stderr)
time.sleep(0.05)
print("three")
inputs["n"]
"""


@pytest.fixture
async def started(start_daemon: Any) -> Any:
    return await start_daemon(**NO_DENO)


def _joined(chunks: list[OutputChunk], stream: str) -> str:
    return "".join(chunk.text for chunk in chunks if chunk.stream == stream)


async def test_two_streams_at_once_on_one_connection_each_get_their_own_output(
    started: Any,
) -> None:
    _, info = started
    results: dict[int, tuple[list[OutputChunk], Any]] = {}

    async def run(client: AsyncClient, n: int) -> None:
        chunks: list[OutputChunk] = []
        async with client.stream(PROGRAM, inputs={"n": n}) as live:
            async for chunk in live:
                chunks.append(chunk)
        results[n] = (chunks, live.result)

    with trio.fail_after(WAIT_S):
        async with AsyncClient(unix_path=info.unix_path) as client, trio.open_nursery() as runs:
            for n in (1, 2):
                runs.start_soon(run, client, n)

    for n, (chunks, result) in results.items():
        assert (result.status, result.result) == ("ok", n)
        assert {chunk.execution_id for chunk in chunks} == {result.execution_id}
        assert [chunk.seq for chunk in chunks] == list(range(len(chunks)))
        assert _joined(chunks, "stdout") == result.stdout == "one\nthree\n"
        assert _joined(chunks, "stderr") == result.stderr == "two\n"
    assert results[1][1].execution_id != results[2][1].execution_id


async def test_an_async_subscription_sees_another_clients_execution(started: Any) -> None:
    _, info = started
    with trio.fail_after(WAIT_S):
        async with (
            AsyncClient(unix_path=info.unix_path) as watcher,
            watcher.subscribe(["execution.started", "execution.finished"]) as events,
        ):
            async with AsyncClient(unix_path=info.unix_path) as runner:
                result = await runner.execute("6 * 7")
            seen = []
            async for event in events:
                seen.append(event)
                if len(seen) == 2:
                    break
    assert [event.type for event in seen] == ["execution.started", "execution.finished"]
    assert {event.data["execution_id"] for event in seen} == {result.execution_id}


async def test_the_blocking_client_streams_and_subscribes_too(started: Any) -> None:
    _, info = started

    def use_blocking_clients() -> tuple[list[OutputChunk], Any, list[Any]]:
        with (
            Client(unix_path=info.unix_path) as watcher,
            Client(unix_path=info.unix_path) as client,
            watcher.subscribe(["execution.finished"], event_timeout_s=WAIT_S) as events,
        ):
            run = client.stream(PROGRAM, inputs={"n": 3})
            chunks = list(run)
            finished = next(iter(events))
        return chunks, run.result, [finished]

    with trio.fail_after(WAIT_S):
        chunks, result, (finished,) = await trio.to_thread.run_sync(use_blocking_clients)
    assert result.result == 3
    assert _joined(chunks, "stdout") == "one\nthree\n"
    assert finished.data["execution_id"] == result.execution_id
