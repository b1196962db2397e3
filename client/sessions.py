"""What a session's handle is on both clients: its id and how a step is asked for.

`AsyncSession` (client/aio.py) and `Session` (client/sync.py) add the waiting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from conduit.client import calls
from conduit.client.calls import Call
from conduit.client.results import ExecutionResult, SessionInfo

__all__ = ["SessionHandle"]


class SessionHandle:
    """A live session (`info`, as the daemon described it) and its client."""

    def __init__(self, client: Any, info: SessionInfo) -> None:
        self.client = client
        self.info = info
        self.closed = False

    @property
    def session_id(self) -> str:
        return self.info.session_id

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.session_id} {self.info.language}>"

    def _step(
        self,
        code: str,
        limits: Mapping[str, int] | None,
        allowed_tools: Iterable[str] | None,
        inputs: Any,
        files: Mapping[str, bytes | str] | None,
        *,
        stream: bool,
    ) -> Call[ExecutionResult]:
        """The call running `code` as this session's next step (its language)."""
        return calls.execute(
            code,
            language=None,
            limits=limits,
            allowed_tools=allowed_tools,
            inputs=inputs,
            stream=stream,
            session_id=self.session_id,
            files=files,
        )
