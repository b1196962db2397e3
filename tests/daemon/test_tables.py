"""What the command line prints: aligned tables, durations, and the times it parses."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from conduit.daemon.tables import (
    format_bytes,
    format_ms,
    format_percent,
    parse_duration_s,
    parse_since,
    render_table,
)


def test_tables_align_columns_and_show_none_as_a_dash() -> None:
    table = render_table(("NAME", "COUNT"), [("deno", 3), ("wasm-python", None)], right={1})
    assert table.splitlines() == [
        "NAME         COUNT",
        "deno             3",
        "wasm-python      -",
    ]
    assert render_table(None, [("a", "x"), ("bcd", "y")]) == "a    x\nbcd  y"
    assert render_table(None, []) == ""


def test_durations_sizes_and_rates_read_as_people_write_them() -> None:
    assert [format_ms(v) for v in (None, 0.25, 12.34, 1234.0, 125_000.0)] == [
        None, "0.2 ms", "12.3 ms", "1.23 s", "2m05s",
    ]  # fmt: skip
    assert [format_bytes(v) for v in (None, 3, 1536, 5 * 1024**2, 3 * 1024**3)] == [
        None, "3 B", "1.5 KiB", "5.0 MiB", "3.0 GiB",
    ]  # fmt: skip
    assert format_percent(0.8751) == "87.5%"
    assert format_percent(None) is None


def test_since_takes_a_duration_ago_an_iso_time_or_unix_seconds() -> None:
    now = 1_800_000_000.0
    assert parse_duration_s("90s") == 90
    assert parse_duration_s("1.5h") == 5400
    assert parse_since("2d", now) == now - 2 * 86_400
    assert parse_since("1700000000", now) == 1_700_000_000
    iso = "2026-11-23T10:00:00+00:00"
    assert parse_since(iso, now) == datetime(2026, 11, 23, 10, tzinfo=UTC).timestamp()
    with pytest.raises(ValueError, match="is not a time"):
        parse_since("yesterday", now)
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration_s("10 years")
