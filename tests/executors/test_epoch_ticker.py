"""The epoch ticker (`_wasmtime.EpochTicker`) with real Wasmtime engines: what it ticks,
when (only while a guest call is under way), for how long it holds an engine, and who
ticks once its first server stops."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterator

import pytest
import trio
import wasmtime

from conduit.executors import _wasmtime
from conduit.executors._wasmtime import EpochTicker, new_engine
from tests.sandboxes import WAIT_S

SPIN = '(module (func (export "spin") (loop (br 0))))'
TICK_S = 0.002


class Spinner:
    """A guest looping forever on `engine` in a thread of its own, inside `ticker`'s
    `running()` block, until an epoch tick past its deadline traps it."""

    def __init__(self, engine: wasmtime.Engine, ticker: EpochTicker) -> None:
        self._ticker = ticker
        self.store = wasmtime.Store(engine)
        self.store.set_epoch_deadline(1)
        instance = wasmtime.Instance(self.store, wasmtime.Module(engine, SPIN), [])
        self._spin = instance.exports(self.store)["spin"]
        self.trapped = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._ticker.running():
                self._spin(self.store)  # type: ignore[operator]
        except wasmtime.Trap:
            self.trapped.set()
        finally:
            self.store.close()

    async def wait_trapped(self) -> bool:
        with trio.move_on_after(WAIT_S):
            while not self.trapped.is_set():
                await trio.sleep(0.005)
        return self.trapped.is_set()


@pytest.fixture
def engine() -> Iterator[wasmtime.Engine]:
    """An engine whose epoch moves at teardown, so a failing test leaves no guest
    spinning on it."""
    engine = new_engine()
    yield engine
    engine.increment_epoch()


async def test_a_registered_engine_is_ticked(engine: wasmtime.Engine) -> None:
    ticker = EpochTicker(TICK_S)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker.serve_shared)
        with ticker.registered(engine):
            assert await Spinner(engine, ticker).wait_trapped()
        nursery.cancel_scope.cancel()


async def test_an_engine_is_held_while_registered_and_forgotten_after() -> None:
    ticker = EpochTicker(TICK_S)
    engine = new_engine()
    alive = weakref.ref(engine)
    with ticker.registered(engine):
        del engine
        gc.collect()
        # Held strongly: its last reference cannot drop in some other thread while
        # the ticker may be about to tick it.
        assert alive() is not None
    gc.collect()
    assert alive() is None


async def test_leaving_the_block_moves_the_epoch_once_more(engine: wasmtime.Engine) -> None:
    # No task serves this ticker: only the tick on the way out can stop the guest.
    ticker = EpochTicker(TICK_S)
    with ticker.registered(engine):
        spinner = Spinner(engine, ticker)
        await trio.sleep(0.05)
        assert not spinner.trapped.is_set()
    assert await spinner.wait_trapped()


async def test_another_server_takes_over_when_the_first_one_stops(
    engine: wasmtime.Engine,
) -> None:
    ticker = EpochTicker(TICK_S)
    first = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve_in, first, ticker)
        await trio.sleep(0.01)
        nursery.start_soon(ticker.serve_shared)  # waits: the first one serves
        await trio.sleep(0.01)
        first.cancel()
        with ticker.registered(engine):
            assert await Spinner(engine, ticker).wait_trapped()
        nursery.cancel_scope.cancel()


async def _serve_in(scope: trio.CancelScope, ticker: EpochTicker) -> None:
    with scope:
        await ticker.serve_shared()


async def test_engines_freed_in_other_threads_while_it_ticks_do_not_crash_it() -> None:
    # The last reference to each engine drops in a worker thread, where freeing it
    # releases the GIL for milliseconds, while the ticker keeps ticking: it must never
    # touch an engine it no longer holds. (With weakly held engines this crashed.)
    ticker = EpochTicker(0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker.serve_shared)
        # A guest call under way throughout keeps the ticker busy.
        with ticker.registered(new_engine()), ticker.running():
            for _ in range(40):
                engines = [new_engine(instances=4)]
                with ticker.registered(engines[0]):
                    await trio.lowlevel.checkpoint()
                await trio.to_thread.run_sync(engines.clear)
        nursery.cancel_scope.cancel()


class CountingEngine:
    """Stands for an engine: counts the ticks it is given."""

    def __init__(self) -> None:
        self.ticks = 0

    def increment_epoch(self) -> None:
        self.ticks += 1


async def test_it_ticks_only_while_a_guest_call_is_under_way() -> None:
    ticker = EpochTicker(TICK_S)
    engine = CountingEngine()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker.serve_shared)
        with ticker.registered(engine):  # type: ignore[arg-type]
            await trio.sleep(20 * TICK_S)
            assert engine.ticks == 0  # registered, but no guest runs: no thread wakes
            with ticker.running():
                await _until(lambda: engine.ticks >= 3)
            # It stops once IDLE_AFTER_TICKS ticks have passed with no call.
            await _until_steady(engine)
            with ticker.running():  # and starts again with the next call
                ticks = engine.ticks
                await _until(lambda: engine.ticks >= ticks + 3)
        nursery.cancel_scope.cancel()


async def _until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(WAIT_S):
        while not condition():
            await trio.sleep(TICK_S)


async def _until_steady(engine: CountingEngine) -> None:
    """Until `engine` got no tick for a while: the ticker waits for a guest call."""
    quiet = (_wasmtime.IDLE_AFTER_TICKS + 5) * TICK_S
    with trio.fail_after(WAIT_S):
        while True:
            ticks = engine.ticks
            await trio.sleep(quiet)
            if engine.ticks == ticks:
                return


def test_the_daemon_has_one_shared_ticker() -> None:
    assert isinstance(_wasmtime.TICKER, EpochTicker)


def test_a_stop_made_while_a_watch_runs_is_kept() -> None:
    """A watch may release the GIL (reading a guest's output does): a stop another
    thread makes meanwhile must not be overwritten by the watch's None."""
    interrupt = _wasmtime.Interrupt(60.0)

    def stopped_meanwhile() -> None:
        interrupt.stop(_wasmtime.StopReason.CANCELLED)

    interrupt.watch(stopped_meanwhile, every_s=0.0)
    interrupt.check()
    assert interrupt.reason is _wasmtime.StopReason.CANCELLED
