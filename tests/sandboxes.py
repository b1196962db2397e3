"""Shared by executor tests: a bridge that must not be called, and how long to wait."""

from __future__ import annotations

from typing import Any

__all__ = ["WAIT_S", "NoBridge"]

# Generous: real Deno on a loaded two-core machine.
WAIT_S = 30


class NoBridge:
    """Programs here make no tool calls; the executor must not need the bridge."""

    session_token = "unused"
    callback = None

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        raise AssertionError("the Deno executor does not call the bridge yet")
