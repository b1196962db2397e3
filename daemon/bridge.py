"""The daemon's side of `ToolBridge`: a sandbox's calls, dispatched under its session token.

Every sandbox is a client with the least privilege there is. In-process executors
(Wasmtime) call `request`, which goes through the same dispatcher as a socket client,
under the session principal; subprocess sandboxes connect to `callback` and present
`session_token`. Either way the session ends with the execution.

The token is minted the first time it is asked for: an in-process sandbox never
presents one, so for it there is nothing to mint, hash, look up per call or revoke,
only the principal this bridge holds until it closes.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from conduit.executors.base import CallbackAddress

if TYPE_CHECKING:
    from conduit.daemon.auth import Principal

__all__ = ["SessionBridge", "SessionDispatch", "SessionTokens"]

ToolPatterns = tuple[tuple[str, ...], ...]


class SessionTokens(Protocol):
    """Where session tokens are minted and revoked (the daemon's `Authenticator`)."""

    def session_principal(
        self, execution_id: str, tool_patterns: ToolPatterns, owner: str | None = None
    ) -> Principal: ...

    def mint_session(
        self, execution_id: str, tool_patterns: ToolPatterns, owner: str | None = None
    ) -> str: ...

    def revoke_session(self, token: str) -> None: ...


class SessionDispatch(Protocol):
    """Runs one method as `principal` (the daemon's `Dispatcher.dispatch`)."""

    def __call__(
        self, name: str, params: dict[str, Any], *, principal: Principal | None
    ) -> Awaitable[Any]: ...


class SessionBridge:
    """One execution's way back in. Use as a context manager: it ends the session on exit."""

    def __init__(
        self,
        sessions: SessionTokens,
        dispatch: SessionDispatch,
        execution_id: str,
        tool_patterns: ToolPatterns,
        *,
        owner: str | None = None,
        callback: CallbackAddress | None = None,
    ) -> None:
        self._sessions = sessions
        self._dispatch = dispatch
        self._execution_id = execution_id
        self._tool_patterns = tool_patterns
        self._owner = owner
        # None once the execution has ended: requests are then unauthenticated.
        self._principal: Principal | None = sessions.session_principal(
            execution_id, tool_patterns, owner
        )
        self._token: str | None = None
        self.callback = callback

    @property
    def session_token(self) -> str:
        """The token a subprocess sandbox presents; minted on first use, dead on exit."""
        if self._token is None:
            if self._principal is None:
                raise RuntimeError("this execution has ended; its session cannot be used")
            self._token = self._sessions.mint_session(
                self._execution_id, self._tool_patterns, self._owner
            )
        return self._token

    def __enter__(self) -> SessionBridge:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._principal = None
        if self._token is not None:
            self._sessions.revoke_session(self._token)

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """Dispatch `method` as the sandbox; raises `RpcError` exactly as a client sees."""
        return await self._dispatch(method, params, principal=self._principal)
