"""`protocol.unreadable_id`: which request a line the daemon cannot read is answered to;
`protocol.skipped_response_id`: which request a response too long to read answered."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit.core.protocol import skipped_response_id, unreadable_id

_IDS = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
# What JSON-RPC senders put before the id: short string or number members.
_LEADING = st.lists(
    st.tuples(
        st.text(max_size=8).filter(lambda key: key != "id"),
        st.one_of(st.text(max_size=20), st.integers(), st.floats(allow_nan=False)),
    ),
    max_size=5,
)
# What keeps the rest of a line from being read.
_UNREADABLE = st.sampled_from(
    [
        "[" * 3000 + "]" * 3000,  # deeper than the decoder goes
        '{"a":' * 3000 + "1" + "}" * 3000,
        "7" * 5000,  # past Python's digit limit
        "NaN",
        "1e999",
        '"\\x"',  # an escape JSON does not have
    ]
)


def _line(leading: list[tuple[str, Any]], ident: Any, rest: str) -> bytes:
    members = [f"{json.dumps(key)}:{json.dumps(value)}" for key, value in leading]
    members += [f'"id":{json.dumps(ident)}', '"method":"tools/call"', f'"params":{{"x":{rest}}}']
    return ("{" + ",".join(members) + "}").encode()


@given(_LEADING, _IDS, _UNREADABLE)
def test_the_id_before_what_cannot_be_read_is_found(
    leading: list[tuple[str, Any]], ident: Any, rest: str
) -> None:
    assert unreadable_id(_line(leading, ident, rest)) == ident


@pytest.mark.parametrize(
    "line",
    [
        b'{"params":[[[[1]]]],"id":3,"x":' + b"[" * 3000 + b"}",  # nested before the id
        b'{"jsonrpc":"2.0","id":true,"p":' + b"[" * 3000 + b"}",
        b'{"jsonrpc":"2.0","id":1_000,"p":' + b"[" * 3000 + b"}",
        b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"x":[1,',  # cut short
        b'{"jsonrpc":"2.0","id":"\\x","p":1}',
        b'{"jsonrpc":"2.0","id":' + b"7" * 5000 + b',"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}',  # not UTF-8 anywhere
        b'["id", 5]',
        b'{"a":1,' * 700 + b'"id":5}',  # past the first 4096 characters
    ],
    ids=[
        "nested-first",
        "true",
        "underscores",
        "cut-short",
        "bad-escape",
        "5000-digits",
        "not-utf8",
        "array",
        "late",
    ],
)
def test_an_id_that_cannot_be_read_whole_is_none(line: bytes) -> None:
    assert unreadable_id(line) is None


def test_an_id_cut_by_the_search_s_end_is_not_read_as_its_first_digits() -> None:
    head = b"{" + b'"a":1,' * 681 + b'"id":'
    assert len(head) == 4092  # the id's digits run past 4096
    assert unreadable_id(head + b'123456,"p":' + b"[" * 3000 + b"}") is None


def _skipped(line: bytes) -> Any:
    """The id of `line` known only by its opening 4 KiB and its last 256 bytes."""
    return skipped_response_id(line[:4096], line[-256:])


_BIG = json.dumps({"content": [{"type": "text", "text": "x" * 20_000}]})


@pytest.mark.parametrize(
    ("line", "ident"),
    [
        # As the Python SDK writes a response: its id first.
        ('{"jsonrpc":"2.0","id":"conduit-call-7","result":' + _BIG + "}", "conduit-call-7"),
        ('{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"' + "m" * 9000 + '"}}', 7),
        # As the TypeScript SDK writes one: its id last.
        ('{"result":' + _BIG + ',"jsonrpc":"2.0","id":"conduit-call-8"}\r', "conduit-call-8"),
        ('{"result":' + _BIG + ',"jsonrpc":"2.0","id":8}', 8),
        # Not responses: a request, a notification, whatever id they carry.
        ('{"jsonrpc":"2.0","id":5,"method":"sampling/createMessage","params":' + _BIG + "}", None),
        ('{"method":"x","params":' + _BIG + ',"jsonrpc":"2.0","id":5}', None),
        ('{"jsonrpc":"2.0","method":"notifications/message","params":' + _BIG + "}", None),
        # An id inside the result, not the response's own.
        ('{"result":{"x":' + _BIG + ',"id":3}}', None),
        ('{"jsonrpc":"2.0","result":{"id":3,"x":' + _BIG + "}}", None),
        # Cut short, or two ids that differ.
        ('{"jsonrpc":"2.0","id":7,"result":' + _BIG[:-10], None),
        ('{"jsonrpc":"2.0","id":7,"result":' + _BIG + ',"id":8}', None),
        ('{"result":' + _BIG + ',"id":"a\\"b",', None),
    ],
    ids=[
        "python-sdk",
        "python-sdk-error",
        "typescript-sdk",
        "typescript-sdk-number",
        "request",
        "request-id-last",
        "notification",
        "nested-last",
        "nested-first",
        "cut-short",
        "two-ids",
        "unfinished",
    ],
)
def test_a_skipped_response_s_id_is_read_from_its_ends(line: str, ident: Any) -> None:
    assert _skipped(line.encode()) == ident


def test_a_skipped_response_s_id_search_stays_fast_on_lines_built_to_backtrack() -> None:
    import time

    started = time.monotonic()
    for opening in (b'{"a":1,' * 700, b'{"' + b'\\"' * 2000, b"{" + b'"a":"b",' * 600):
        assert skipped_response_id(opening, b'"a":' * 64 + b"}") is None
    assert time.monotonic() - started < 1
