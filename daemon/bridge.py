"""The daemon's side of `ToolBridge`: a sandbox's calls, dispatched under its session token.

Every sandbox is a client with the least privilege there is. In-process executors
(Wasmtime) call `request`, which goes through the same dispatcher as a socket client,
under the session principal; subprocess sandboxes connect to `callback` and present
`session_token`. Either way the token is revoked when the execution ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conduit.daemon.dispatcher import CallContext, dispatch
from conduit.executors.base import CallbackAddress

if TYPE_CHECKING:
    from conduit.daemon.server import Daemon

__all__ = ["SessionBridge"]


class SessionBridge:
    """One execution's way back in. Use as a context manager: it revokes on exit."""

    def __init__(
        self, daemon: Daemon, execution_id: str, tool_patterns: tuple[tuple[str, ...], ...]
    ) -> None:
        self._daemon = daemon
        self.session_token = daemon.auth.mint_session(execution_id, tool_patterns)
        self.callback: CallbackAddress | None = daemon.callback_address

    def __enter__(self) -> SessionBridge:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._daemon.auth.revoke_session(self.session_token)

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Dispatch `method` as the sandbox; raises `RpcError` exactly as a client sees."""
        principal = self._daemon.auth.authenticate_token(self.session_token)
        return await dispatch(method, params, CallContext(self._daemon, principal))
