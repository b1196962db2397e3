"""Secrets kept out of every line the daemon writes: registered values and anything
shaped like a Conduit token, replaced by `[redacted]`.

Process-wide, like logging itself: every daemon in the process writes to one stderr,
and a secret registered by one part (auth, a gateway credential) is hidden by every
formatter (`conduit.daemon.logs`).
"""

from __future__ import annotations

import re

__all__ = ["REDACTED", "redact", "scrub"]

REDACTED = "[redacted]"
# What `auth.new_token` makes (master, client and session tokens): recognised by shape,
# so a token the daemon never registered (another daemon's, say) is still hidden.
_TOKEN_SHAPE = r"cdt_[A-Za-z0-9_-]{16,}"
# Shorter registered values would redact ordinary words along with the secret.
MIN_SECRET_CHARS = 8


class _Redactor:
    """The secrets to hide, as one pattern: the longest first, so a secret that
    contains another is hidden whole rather than leaving its remainder behind."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._pattern = re.compile(_TOKEN_SHAPE)

    def add(self, secret: str) -> None:
        if len(secret) < MIN_SECRET_CHARS or secret in self._secrets:
            return
        self._secrets.add(secret)
        ordered = sorted(self._secrets, key=len, reverse=True)
        self._pattern = re.compile("|".join([*map(re.escape, ordered), _TOKEN_SHAPE]))

    def scrub(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text)


_REDACTOR = _Redactor()


def redact(secret: str) -> None:
    """Never write `secret` to the log, whatever shape it has (if 8 characters or more)."""
    _REDACTOR.add(secret)


def scrub(text: str) -> str:
    """`text` with every token and registered secret replaced by `[redacted]`."""
    return _REDACTOR.scrub(text)
