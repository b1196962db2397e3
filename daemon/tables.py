"""Plain text for people at a terminal: aligned tables, durations, times, sizes.

Used by the command line; it knows nothing about the daemon or the wire.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

__all__ = [
    "format_bytes",
    "format_ms",
    "format_percent",
    "format_time",
    "parse_duration_s",
    "parse_since",
    "render_table",
]

# Two spaces between columns: wide enough to tell them apart, narrow enough for 80 columns.
_GAP = "  "
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def render_table(
    headers: Sequence[str] | None,
    rows: Iterable[Sequence[Any]],
    *,
    right: Collection[int] = (),
) -> str:
    """`rows` in aligned columns, under `headers` unless None; columns in `right` (by
    index) are right-aligned, as numbers read best. None shows as `-`. No trailing
    spaces."""
    cells = [] if headers is None else [[str(h) for h in headers]]
    cells += [["-" if value is None else str(value) for value in row] for row in rows]
    if not cells:
        return ""
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for row in cells:
        padded = [
            value.rjust(width) if i in right else value.ljust(width)
            for i, (value, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append(_GAP.join(padded).rstrip())
    return "\n".join(lines)


def format_ms(ms: float | None) -> str | None:
    """`12.3 ms` below a second, `1.23 s` below a minute, `2m05s` beyond."""
    if ms is None:
        return None
    if ms < 1000:
        return f"{ms:.1f} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def format_bytes(size: int | None) -> str | None:
    """`512 B`, `1.5 KiB`, `3.0 MiB`, `1.2 GiB`."""
    if size is None:
        return None
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def format_percent(rate: float | None) -> str | None:
    return None if rate is None else f"{rate * 100:.1f}%"


def format_time(unix_s: float) -> str:
    """Local time, to the second: `2026-11-23 18:52:21`."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix_s))


def parse_duration_s(text: str) -> float:
    """`90s`, `15m`, `1h`, `2d`, `1w` in seconds; raises `ValueError` for anything else."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a duration such as 90s, 15m, 1h, 2d or 1w")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def parse_since(text: str, now_s: float | None = None) -> float:
    """A moment as Unix time from a duration ago (`1h`), an ISO 8601 time (local unless
    it names a zone) or Unix seconds; raises `ValueError` for anything else."""
    now_s = time.time() if now_s is None else now_s
    try:
        return now_s - parse_duration_s(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: give a duration ago (1h, 2d), an ISO 8601 time "
            "(2026-11-23T10:00) or Unix seconds"
        ) from None
