"""Standard base64 for file bytes on the wire, as fast as the machine allows.

Files cross the wire as base64 in JSON, and a megabyte of it takes the standard
library about 3 ms to decode on one core (1 ms to encode), paid by the daemon for each
file in and out, and again for each sandbox that takes its files as base64. `pybase64`
does the same work with SIMD in a small fraction of that; it comes with the daemon and
is used when it is installed. Without it (a client installed alone) this is the
standard library, byte for byte the same.

Decoding is strict either way: only the standard alphabet, correctly padded. Text
`pybase64` refuses is decoded again by the standard library, so what is accepted, and
the bytes it decodes to, are the standard library's (`base64.b64decode(validate=True)`).

Imports nothing of the project's: every layer may use it.
"""

from __future__ import annotations

import base64
import binascii

try:
    import pybase64
except ImportError:  # the client alone
    pybase64 = None

__all__ = ["FAST", "decode", "encode"]

# Whether the SIMD codec is in use.
FAST = pybase64 is not None


def encode(data: bytes | bytearray | memoryview) -> str:
    """`data` as standard base64 text, padded, on one line."""
    if pybase64 is not None:
        return pybase64.b64encode_as_string(data)
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def decode(text: str | bytes) -> bytes:
    """The bytes standard base64 `text` holds.

    Raises ValueError: `binascii.Error` (a subclass) for a character outside the
    alphabet or wrong padding, a plain ValueError for a `str` holding a character
    outside ASCII. Callers catch ValueError, never `binascii.Error` alone."""
    if pybase64 is not None:
        try:
            return pybase64.b64decode(text, validate=True)
        except ValueError:
            pass  # refused; the standard library has the last word
    return base64.b64decode(text, validate=True)
