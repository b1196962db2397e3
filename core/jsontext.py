"""JSON text that cannot take the daemon down, whichever way it is going.

JSON can carry what Python's `json` module turns into trouble later:

- a lone UTF-16 surrogate (`"\\ud800"`, legal JSON text) decodes to a `str` that cannot
  be encoded as UTF-8, so the reply, the audit row or the log line that carries it
  raises `UnicodeEncodeError` far from where it came in;
- an integer of more than 4,300 digits raises `ValueError` on the way in and on the way
  out (Python's integer string limit);
- `NaN`, `Infinity` and `1e400` decode to floats that encode as `NaN`/`Infinity`,
  which is not JSON.

The rule, one for everything the daemon reads or writes: **a lone surrogate is
replaced by U+FFFD** (on decoding, so nothing inside ever holds one, and again on
encoding, for text made inside); **a number JSON cannot carry is refused** when a peer
sends it and **becomes `null`** when the daemon would send it (as `JSON.stringify`
does). Valid text pays nothing: the checks run only when a fast path fails or a cheap
scan of the raw bytes finds a surrogate.

Compact text is written by `orjson` where it is installed (it comes with the daemon):
the standard encoder escapes a string a character at a time, some 2 ms for each
megabyte of a file's base64. `orjson` refuses what needs the rules above (a surrogate,
an integer past 64 bits, a key that is not a string), and that value is then written
as without it. Its text is the same JSON: a float may be spelt differently (`1e-7`
for `1e-07`) but reads back the same, and an `enum.Enum` member that is not also a
`str` or an `int` is written as its value rather than its `str()`.

Imports nothing of the project's: every layer may use it.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any, Final

try:
    import orjson
except ImportError:  # the client alone
    orjson = None

__all__ = ["JsonTextError", "clean_text", "depth", "dumps", "encode", "loads"]

REPLACEMENT: Final = "\ufffd"

_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")
# A `\uD800`-`\uDFFF` escape: JSON text without one (and without a surrogate itself)
# cannot decode to a lone surrogate. A pattern with a literal head, so searching a
# megabyte costs well under a millisecond.
_SURROGATE_ESCAPE_ANY_CASE: Final = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE: Final = re.compile(r"\\ud[89a-f]")


class JsonTextError(ValueError):
    """Text that is not JSON the daemon accepts; the message says why."""


def clean_text(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (the same object if none)."""
    if not _holds_surrogate(text):
        return text
    return _LONE_SURROGATE.sub(REPLACEMENT, text)


def _holds_surrogate(text: str) -> bool:
    """Whether `text` holds a surrogate code point. Encoding is the fast test: a
    character-class search reads the text several times slower."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _may_decode_to_surrogate(text: str, *, from_utf8: bool) -> bool:
    """Whether JSON `text` may decode to a string holding a surrogate: through an
    escape, or (unless it was decoded from strict UTF-8, which has none) as itself."""
    if "\\" in text and _SURROGATE_ESCAPE_ANY_CASE.search(text) is not None:
        return True
    return not from_utf8 and _holds_surrogate(text)


def _refuse_constant(name: str) -> Any:
    raise JsonTextError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JsonTextError(f"the number {text[:40]} is too large for a 64-bit float")
    return value


def _null_constant(_name: str) -> None:
    return None


def _finite_or_null(text: str) -> float | None:
    value = float(text)
    return None if math.isinf(value) else value


# Made once: `json.loads` and `json.dumps` build a new decoder or encoder on every call
# that passes an option, a few microseconds each on every request.
_DECODERS: Final = {
    False: json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float),
    True: json.JSONDecoder(parse_constant=_null_constant, parse_float=_finite_or_null),
}


def loads(data: bytes | str, *, lenient_numbers: bool = False) -> Any:
    """Decode one JSON text; raise `JsonTextError` for anything that is not JSON.

    Lone surrogates come back replaced. `NaN`, `Infinity` and numbers beyond a float's
    range are refused, or read as `None` with `lenient_numbers` (for what a sandbox
    answers: its language may write them, and the daemon would send `null` anyway).
    """
    from_utf8 = isinstance(data, bytes | bytearray)
    try:
        # Strict UTF-8 first: `json.loads` would read bytes with "surrogatepass" (and
        # guess UTF-16 or -32), letting encoded surrogates in as text.
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
        value = _DECODERS[lenient_numbers].decode(text)
    except JsonTextError:
        raise
    except RecursionError:
        raise JsonTextError("JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the digit limit
        raise JsonTextError(_first_line(str(exc))) from None
    if _may_decode_to_surrogate(text, from_utf8=from_utf8):
        value = _cleaned(value)
    return value


def dumps(value: Any, *, indent: int | None = None, ascii_only: bool = False) -> str:
    """Encode `value` as JSON text that is valid UTF-8 and valid JSON, whatever it holds.

    Objects JSON has no form for are written as their `str()`.
    """
    if indent is None and not ascii_only:
        fast = _fast_encode(value)
        if fast is not None:
            return fast.decode("utf-8")
    encoder = _encoder(indent, ascii_only)
    try:
        text = encoder.encode(value)
    except ValueError:  # a non-finite float, or an integer past the digit limit
        return encoder.encode(_cleaned(value))
    if ascii_only:  # surrogates are escaped there, paired or not: clean when any is
        if _SURROGATE_ESCAPE.search(text) is None:
            return text
        return encoder.encode(_cleaned(value))
    if not _holds_surrogate(text):
        return text
    # Through the value, not the text: two keys that differ only in their surrogates
    # become one key, as they would when the value is decoded.
    return encoder.encode(_cleaned(value))


@functools.cache
def _encoder(indent: int | None, ascii_only: bool) -> json.JSONEncoder:
    return json.JSONEncoder(
        ensure_ascii=ascii_only,
        separators=(",", ":") if indent is None else (",", ": "),
        indent=indent,
        allow_nan=False,
        default=_text_of,
    )


def _text_of(value: Any) -> str:
    """What an object JSON has no form for is written as: its `str()`, which may hold
    a lone surrogate that no cleaning of the value would reach."""
    return clean_text(str(value))


def encode(value: Any) -> bytes:
    """`dumps(value)` as UTF-8 bytes, compact: one line of a JSON-lines stream."""
    fast = _fast_encode(value)
    return fast if fast is not None else dumps(value).encode("utf-8")


# Objects orjson would write in its own way are handed to `default`, as the standard
# encoder does with them. Subclasses of str, int, dict and list too: orjson writes
# them from their stored data, the standard encoder through some of their methods (a
# dict subclass's `items()`), so those values are left to the standard encoder.
_FAST_OPTIONS: Final = (
    0
    if orjson is None
    else orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


class _LeftToStdlib(TypeError):
    """Raised in orjson's `default` for a value the standard encoder must write."""


# What the standard encoder writes by its own rules, never through `default`.
_STDLIB_TYPES: Final = (str, int, float, dict, list, tuple)


def _fast_default(value: Any) -> str:
    if isinstance(value, _STDLIB_TYPES):
        raise _LeftToStdlib
    return _text_of(value)


def _fast_encode(value: Any) -> bytes | None:
    """`value` as compact UTF-8 JSON by `orjson`, cleaned first if it must be; None
    when it is not installed or refuses the value even so (see the module's
    docstring). Text it wrote reads back to a value it writes the same way: a value
    is never written by one encoder and read back into one written by the other."""
    if orjson is None:
        return None
    try:
        return orjson.dumps(value, default=_fast_default, option=_FAST_OPTIONS)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        if isinstance(exc.__cause__, _LeftToStdlib):
            return None  # not a matter of cleaning: the standard encoder writes it
    try:
        return orjson.dumps(_cleaned(value), default=_fast_default, option=_FAST_OPTIONS)
    except (TypeError, ValueError):
        return None


def _first_line(message: str) -> str:
    return message.splitlines()[0] if message else "not JSON"


def _has_digits(number: int) -> bool:
    """Whether `number` can be written out under Python's integer string limit."""
    try:
        str(number)
    except ValueError:
        return False
    return True


def _cleaned(value: Any) -> Any:
    """A copy of decoded JSON with surrogates replaced and unsendable numbers `None`.

    Iterative: decoded JSON may be nested as deep as the decoder allows, which is
    about as deep as Python's own recursion limit.
    """
    root: list[Any] = [value]
    stack: list[tuple[Any, Any]] = [(root, 0)]
    while stack:
        holder, key = stack.pop()
        item = holder[key]
        if isinstance(item, str):
            holder[key] = clean_text(item)
        elif isinstance(item, float):
            holder[key] = item if math.isfinite(item) else None
        elif isinstance(item, int) and not isinstance(item, bool):
            holder[key] = item if _has_digits(item) else None
        elif isinstance(item, dict):
            copy = {clean_text(k) if isinstance(k, str) else k: v for k, v in item.items()}
            holder[key] = copy
            stack.extend((copy, k) for k in copy)
        elif isinstance(item, list | tuple):
            copy_list = list(item)
            holder[key] = copy_list
            stack.extend((copy_list, i) for i in range(len(copy_list)))
    return root[0]


def depth(value: Any, limit: int) -> int:
    """How deeply decoded JSON `value` nests (a scalar 0, `[]` 1), counted without
    recursion and only up to just past `limit`: a deeper value stops the count."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if not isinstance(item, dict | list):
            continue
        if level > deepest:
            deepest = level
            if deepest > limit:
                return deepest
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return deepest
