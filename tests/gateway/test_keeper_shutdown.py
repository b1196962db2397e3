"""An upstream that fails just as the daemon stops must not end the daemon with it.

Trio hands a task that is cancelled while its connection attempt fails both at once, in
one exception group; carried on whole, the failure reached the daemon's root nursery
and `serve` raised on a clean stop (seen as a flaky end to a test whose HTTP upstream
the SSRF guard refuses).
"""

from __future__ import annotations

import trio

from conduit.core.errors import GatewayError
from conduit.gateway.keeper import _cancellation_alone


async def a_cancelled() -> trio.Cancelled:
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.sleep_forever()
        except trio.Cancelled as exc:
            return exc
    raise AssertionError("not cancelled")


async def test_a_failure_during_cancellation_leaves_the_cancellation_alone() -> None:
    cancelled = await a_cancelled()
    group = BaseExceptionGroup("ended", [cancelled, GatewayError("refused to connect")])
    alone = _cancellation_alone(group, "sneaky")
    assert isinstance(alone, BaseExceptionGroup)
    assert alone.exceptions == (cancelled,)


async def test_it_goes_on_to_the_scope_that_cancelled_and_stops_there() -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            async with trio.open_nursery() as nursery:

                async def fails() -> None:
                    raise GatewayError("refused to connect")

                nursery.start_soon(fails)
                await trio.sleep_forever()
        except BaseExceptionGroup as group:
            raise _cancellation_alone(group, "sneaky") from None
    assert scope.cancelled_caught


def test_a_group_without_a_cancellation_goes_on_whole() -> None:
    group = ExceptionGroup("ended", [GatewayError("refused")])
    assert _cancellation_alone(group, "sneaky") is group
