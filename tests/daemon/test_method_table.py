"""Each daemon has its own method table, built from the API modules' routers."""

from __future__ import annotations

from typing import Any

import pytest

from conduit.daemon.dispatcher import MethodRouter, MethodTable
from conduit.daemon.methods import method_table
from conduit.daemon.methods.compat import ALIASES


async def _handler(params: Any, ctx: Any) -> Any:
    """A method for these tests."""
    return {}


def test_two_tables_do_not_share_what_is_added_to_one() -> None:
    first, second = method_table(), method_table()
    routes = MethodRouter()
    routes.method("test/only-here", scope=None)(_handler)
    first.add(*routes.specs)
    assert "test/only-here" in first
    assert "test/only-here" not in second
    assert first.names() == sorted([*second.names(), "test/only-here"])


def test_a_name_registered_twice_is_refused() -> None:
    routes = MethodRouter()
    routes.method("ping", scope=None)(_handler)
    with pytest.raises(RuntimeError, match="'ping' is registered twice"):
        method_table().add(*routes.specs)
    twice = MethodRouter()
    twice.method("test/x", scope=None)(_handler)
    twice.method("test/x", scope=None)(_handler)
    with pytest.raises(RuntimeError, match="registered twice"):
        MethodTable(twice)


def test_a_method_without_a_description_is_refused() -> None:
    async def undocumented(params: Any, ctx: Any) -> Any:
        return {}

    with pytest.raises(RuntimeError, match="needs a docstring"):
        MethodRouter().method("test/undocumented", scope=None)(undocumented)


def test_the_table_holds_the_api_and_its_aliases() -> None:
    table = method_table()
    assert {"ping", "execute", "rpc/discover", "tools/call"} <= set(table.names())
    assert set(ALIASES) <= set(table.names())
    assert table["ping"].description
