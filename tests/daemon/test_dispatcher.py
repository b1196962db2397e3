"""`Dispatcher` on its own: errors become JSON-RPC errors, nothing else escapes, scopes
hold, and every call is counted. Its services are fakes; no daemon is started."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from conduit.core.errors import (
    Forbidden,
    InternalError,
    InvalidParams,
    MethodNotFound,
    NotFound,
    ToolLimitReached,
    Unauthenticated,
)
from conduit.core.files import FileData
from conduit.daemon.auth import Principal
from conduit.daemon.connection import Connection
from conduit.daemon.dispatcher import (
    ANSWERED,
    CANCELLED,
    Dispatcher,
    MethodRouter,
    MethodTable,
    Params,
)
from conduit.daemon.events import BusEvent, EventBus, EventType
from conduit.daemon.methods import method_table
from conduit.daemon.methods.executions import ExecuteParams, checked_files
from tests.daemon.fakes import ALICE, LIMITS, OWNER, WAIT_S, Lines

SESSION = Principal("session:ex_1", "session", frozenset({"tools"}), (("*",),), execution_id="ex_1")


class EchoParams(Params):
    text: str
    times: int = 1


class Harness:
    """A dispatcher over `table`, with what it counts and publishes kept."""

    def __init__(self, table: MethodTable) -> None:
        self.counted: list[tuple[str | None, int | str]] = []
        self.events: list[BusEvent] = []
        bus = EventBus()
        bus.add_sink(self.events.append)
        self.executions = _Executions()
        self.dispatcher = Dispatcher(
            table,
            executions=self.executions,  # type: ignore[arg-type]
            tools=None,  # type: ignore[arg-type]
            events=bus,
            audit=None,  # type: ignore[arg-type]
            admission=None,  # type: ignore[arg-type]
            control=None,  # type: ignore[arg-type]
            sessions=None,  # type: ignore[arg-type]
            count_request=lambda name, outcome: self.counted.append((name, outcome)),
        )

    async def call(self, name: str, params: Any = None, principal: Principal | None = OWNER) -> Any:
        return await self.dispatcher.dispatch(name, params or {}, principal=principal)


class _Executions:
    """Who owns a running execution (all `_violation` asks), and the tool calls that
    reached the dispatcher from sandboxes."""

    def __init__(self) -> None:
        self.arrived: list[str | None] = []

    def owner(self, execution_id: str | None) -> str | None:
        return "alice" if execution_id == "ex_1" else None

    def call_arrived(self, execution_id: str | None) -> None:
        self.arrived.append(execution_id)


class _Peer:
    def __init__(self) -> None:
        self.mcp_session = False


def _routes() -> MethodRouter:
    routes = MethodRouter()

    @routes.method("test/echo", params=EchoParams, scope=None)
    async def echo(params: EchoParams, ctx: Any) -> Any:
        """Echo."""
        return params

    @routes.method("test/admin", scope="admin")
    async def admin(params: Any, ctx: Any) -> Any:
        """Admin only."""
        return {"admin": True}

    @routes.method("test/tools", scope="tools", session=True)
    async def tools(params: Any, ctx: Any) -> Any:
        """Sandboxes too."""
        return {"principal": ctx.principal.name}

    @routes.method("test/broken", scope=None)
    async def broken(params: Any, ctx: Any) -> Any:
        """Fails."""
        raise RuntimeError("secret detail of the failure")

    @routes.method("test/missing", scope=None)
    async def missing(params: Any, ctx: Any) -> Any:
        """Not found."""
        raise NotFound("not found: nothing here", {"what": "x"})

    @routes.method("test/missing-in-a-nursery", scope=None)
    async def missing_in_a_nursery(params: Any, ctx: Any) -> Any:
        """Not found, raised in the body of a nursery (which wraps it in a group)."""
        async with trio.open_nursery():
            raise NotFound("not found: nothing here", {"what": "x"})

    @routes.method("test/two-failures", scope=None)
    async def two_failures(params: Any, ctx: Any) -> Any:
        """A group of two errors: no one of them is the answer."""

        async def missing() -> None:
            raise NotFound("not found: nothing here", {"what": "x"})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(missing)
            raise RuntimeError("secret detail of the failure")

    @routes.method("test/spent", scope=None)
    async def spent(params: Any, ctx: Any) -> Any:
        """Tool limit."""
        raise ToolLimitReached("forbidden: limit spent", {"limit": 1})

    @routes.method("test/hang", scope=None)
    async def hang(params: Any, ctx: Any) -> Any:
        """Never answers."""
        await trio.sleep_forever()

    return routes


@pytest.fixture
def harness() -> Harness:
    return Harness(MethodTable(_routes()))


async def test_a_result_is_json_ready_and_counted(harness: Harness) -> None:
    assert await harness.call("test/echo", {"text": "hi"}) == {"text": "hi", "times": 1}
    assert harness.counted == [("test/echo", ANSWERED)]


async def test_an_unknown_method_is_named_with_close_matches(harness: Harness) -> None:
    with pytest.raises(MethodNotFound) as caught:
        await harness.call("test/ecko")
    assert "did you mean 'test/echo'" in caught.value.message
    assert caught.value.data == {"method": "test/ecko"}
    assert harness.counted == [("test/ecko", MethodNotFound.code)]


@pytest.mark.parametrize(
    ("params", "field", "reason"),
    [
        ({"text": "x", "tims": 2}, "tims", "is not a parameter of this method"),
        ({}, "text", "is required"),
        ({"text": "x", "times": "many"}, "times", None),
    ],
)
async def test_invalid_params_name_the_failing_field(
    harness: Harness, params: dict[str, Any], field: str, reason: str | None
) -> None:
    with pytest.raises(InvalidParams) as caught:
        await harness.call("test/echo", params)
    assert caught.value.data["field"] == field
    if reason is not None:
        assert caught.value.data["reason"] == reason
    assert "rpc/discover" in caught.value.message


async def test_an_unexpected_exception_becomes_an_internal_error_with_an_id(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(InternalError) as caught:
        await harness.call("test/broken")
    error_id = caught.value.data["error_id"]
    assert caught.value.message == (
        f"internal error (id {error_id}); the daemon's log has the details"
    )
    assert "secret detail" not in str(caught.value.to_wire())
    record = next(r for r in caplog.records if getattr(r, "error_id", None) == error_id)
    assert "secret detail" in caplog.text and record.exc_info is not None
    assert harness.counted == [("test/broken", InternalError.code)]


async def test_an_rpc_error_passes_through_unchanged(harness: Harness) -> None:
    with pytest.raises(NotFound) as caught:
        await harness.call("test/missing")
    assert caught.value.to_wire() == {
        "code": NotFound.code,
        "message": "not found: nothing here",
        "data": {"what": "x"},
    }


async def test_a_lone_rpc_error_a_nursery_wrapped_passes_through(harness: Harness) -> None:
    with pytest.raises(NotFound) as caught:
        await harness.call("test/missing-in-a-nursery")
    assert caught.value.message == "not found: nothing here"
    assert harness.counted == [("test/missing-in-a-nursery", NotFound.code)]


async def test_a_group_of_several_failures_is_an_internal_error(harness: Harness) -> None:
    with pytest.raises(InternalError):
        await harness.call("test/two-failures")


async def test_cancellation_is_not_an_error_and_is_counted(harness: Harness) -> None:
    with trio.move_on_after(0) as scope:
        await harness.call("test/hang")
    assert scope.cancelled_caught
    assert harness.counted == [("test/hang", CANCELLED)]


async def test_a_method_with_a_scope_needs_a_principal(harness: Harness) -> None:
    with pytest.raises(Unauthenticated, match="call auth/login"):
        await harness.call("test/admin", principal=None)
    assert await harness.call("test/echo", {"text": "anyone"}, principal=None)
    assert harness.events == []


async def test_a_missing_scope_is_forbidden_and_reported(harness: Harness) -> None:
    with pytest.raises(Forbidden) as caught:
        await harness.call("test/admin", principal=ALICE)
    assert caught.value.data == {"method": "test/admin", "scope": "admin"}
    [event] = harness.events
    assert (event.type, event.principal) == (EventType.POLICY_VIOLATION, "alice")
    assert event.data["rule"] == "access.scope"
    assert event.data["method"] == "test/admin"


async def test_a_session_calls_only_session_methods_and_its_owner_hears(
    harness: Harness,
) -> None:
    assert await harness.call("test/tools", principal=SESSION) == {"principal": "session:ex_1"}
    with pytest.raises(Forbidden, match="session token cannot call test/admin"):
        await harness.call("test/admin", principal=SESSION)
    [event] = harness.events
    assert event.data["rule"] == "access.method"
    assert (event.data["execution_id"], event.principal) == ("ex_1", "alice")


async def test_a_sandboxs_tool_call_is_counted_as_arrived_whatever_becomes_of_it(
    harness: Harness,
) -> None:
    """Its execution waits for the calls its worker wrote to arrive: one refused (its
    params invalid, here no such method) arrived all the same. A client's is not one."""
    for principal in (SESSION, ALICE):
        with pytest.raises(MethodNotFound):
            await harness.call("tools/call", {"name": 5}, principal=principal)
    assert harness.executions.arrived == ["ex_1"]


async def test_a_spent_tool_limit_is_not_reported_as_a_violation(harness: Harness) -> None:
    with pytest.raises(ToolLimitReached):
        await harness.call("test/spent")
    assert harness.events == []


async def test_no_exception_reaches_the_connection(harness: Harness, nursery: trio.Nursery) -> None:
    """Over a connection, a handler's failure is one error line; the connection goes on."""
    ours, theirs = trio.testing.memory_stream_pair()
    connection = Connection(
        theirs,
        harness.dispatcher,
        LIMITS,
        transport="unix",
        authenticate=lambda token: None,
        principal=OWNER,
    )
    nursery.start_soon(connection.run)
    peer = Lines(ours, theirs)
    await peer.send({"jsonrpc": "2.0", "id": 1, "method": "test/broken"})
    error = await peer.recv()
    assert error["id"] == 1
    assert error["error"]["code"] == InternalError.code
    assert set(error["error"]) == {"code", "message", "data"}
    with trio.fail_after(WAIT_S):
        assert await peer.request(2, "test/echo", {"text": "still here"}) == {
            "jsonrpc": "2.0",
            "id": 2,
            "result": {"text": "still here", "times": 1},
        }
    await peer.send_line(b"not json")
    assert (await peer.recv())["error"]["code"] == -32700
    assert harness.counted[-1] == (None, -32700)  # counted through `refused`


# ---- the daemon's own table ------------------------------------------------------------


async def test_rpc_discover_lists_every_method_with_its_schema() -> None:
    harness = Harness(method_table())
    result = await harness.call("rpc/discover")
    names = {m["name"] for m in result["methods"]}
    expected = {"initialize", "ping", "rpc/discover", "tools/list", "tools/call", "execute"}
    expected |= {"executions/cancel", "executors/list", "auth/login", "auth/whoami"}
    expected |= {"sessions/create", "sessions/list", "sessions/close"}
    assert expected <= names
    execute = next(m for m in result["methods"] if m["name"] == "execute")
    # The language may be left out of a session's step.
    assert set(execute["params"]["required"]) == {"code"}
    assert {"language", "session_id"} <= set(execute["params"]["properties"])
    assert result["aliases"]["mcp.executeTypeScript"]["language"] == "typescript"
    assert "mcp.executeTypeScript" not in names


async def test_initialize_negotiates_the_version_and_marks_an_mcp_peer() -> None:
    dispatcher = Harness(method_table()).dispatcher
    peer = _Peer()
    known = await dispatcher.dispatch(
        "initialize", {"protocolVersion": "2025-06-18"}, principal=None, peer=peer
    )
    assert known["protocolVersion"] == "2025-06-18"
    assert known["serverInfo"]["name"] == "conduit"
    assert peer.mcp_session
    unknown = await dispatcher.dispatch(
        "initialize", {"protocolVersion": "1999-01-01"}, principal=None
    )
    assert unknown["protocolVersion"] == "2025-11-25"


async def test_an_unknown_param_of_a_real_method_is_named() -> None:
    with pytest.raises(InvalidParams) as caught:
        await Harness(method_table()).call("auth/login", {"tokn": "x"})
    assert caught.value.data["field"] in {"tokn", "token"}


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ([{"path": "../escape.txt", "text": "x"}], "../escape.txt"),
        ([{"path": "/etc/passwd", "text": "x"}], "/etc/passwd"),
        ([{"path": "a.txt", "text": "x", "base64": "eA=="}], "a.txt"),
        ([{"path": "a.txt"}], "a.txt"),
    ],
)
async def test_an_input_file_with_a_bad_path_or_content_is_refused_naming_it(
    files: list[dict[str, Any]], named: str
) -> None:
    harness = Harness(method_table())
    with pytest.raises(InvalidParams) as refused:
        await harness.call("execute", {"language": "python", "code": "1", "files": files})
    assert named in refused.value.message and refused.value.code == -32602


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ([{"path": "a.txt", "text": "1"}, {"path": "a.txt", "text": "2"}], "twice"),
        ([{"path": "a", "text": "1"}, {"path": "a/b.txt", "text": "2"}], "a/b.txt"),
        ([{"path": "a.bin", "base64": "not base64!"}], "a.bin"),
    ],
)
def test_input_files_that_cannot_all_be_placed_are_refused(
    files: list[dict[str, Any]], named: str
) -> None:
    params = ExecuteParams.model_validate({"language": "python", "code": "1", "files": files})
    with pytest.raises(InvalidParams) as refused:
        checked_files(params.files or [])
    assert named in refused.value.message


def test_input_files_keep_their_bytes() -> None:
    files = [{"path": "t.txt", "text": "é"}, {"path": "b.bin", "base64": "AAEC"}]
    params = ExecuteParams.model_validate({"language": "python", "code": "1", "files": files})
    assert checked_files(params.files or []) == (
        FileData("t.txt", "é".encode()),
        FileData("b.bin", b"\x00\x01\x02"),
    )
