"""Normalise program text the way clients send it: markdown fences removed.

STUB: to be replaced by the real implementation.
"""

from __future__ import annotations

__all__ = ["unwrap_fence"]


def unwrap_fence(code: str) -> str:
    """Return the program inside a single markdown code fence, or `code` unchanged."""
    return code
