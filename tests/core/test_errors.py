"""`RpcError.from_wire`: any error object a peer sends becomes an error, never a crash."""

from __future__ import annotations

from typing import Any

import pytest

from conduit.core.errors import InternalError, MethodNotFound, RpcError


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        ({"code": -32601, "message": "no such"}, MethodNotFound.code, "no such"),
        ({"code": 7, "message": "theirs"}, 7, "theirs"),
        ({"code": True, "message": "a bool"}, InternalError.code, "a bool"),
        ({"code": [1], "message": "a list"}, InternalError.code, "a list"),
        ({"code": "-32000"}, InternalError.code, ""),
        ({"code": 10**4000, "message": ["not", "text"]}, InternalError.code, "['not', 'text']"),
        ({}, InternalError.code, ""),
    ],
)
def test_any_error_object_becomes_an_error(error: dict[str, Any], code: int, message: str) -> None:
    exc = RpcError.from_wire(error)
    assert (exc.code, exc.message) == (code, message)
    if code == MethodNotFound.code:
        assert isinstance(exc, MethodNotFound)
