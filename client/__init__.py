"""A client library for the daemon, for async code and for plain synchronous code.

```python
from conduit.client import Client

with Client() as client:                     # CONDUIT_SOCKET / the default socket
    result = client.execute("print('hi'); 6 * 7")
    result.raise_for_status().result         # 42
```

`AsyncClient` is the same API for async code, under asyncio or Trio (through anyio),
with many calls at once on one connection.
Both connect by Unix path or TCP, log in with a token, stream output, discover tools,
reconnect after the daemon restarts, and raise the daemon's errors by class. This
package imports neither the daemon nor its runtimes: it is light to import.
"""

from conduit.client.aio import AsyncClient, AsyncRun, AsyncSession, AsyncSubscription, open_client
from conduit.client.endpoint import Backoff, LoginToken
from conduit.client.errors import (
    ClientError,
    ConduitError,
    ConnectionFailed,
    ConnectionLost,
    ExecutorUnavailable,
    Forbidden,
    InternalError,
    InvalidParams,
    InvalidRequest,
    MethodNotFound,
    NotFound,
    Overloaded,
    ParseError,
    ProgramFailed,
    RateLimited,
    RpcError,
    SubscriptionDropped,
    Timeout,
    TransportError,
    Unauthenticated,
    UpstreamError,
)
from conduit.client.results import (
    Event,
    ExecutionResult,
    OutputChunk,
    ProgramError,
    SessionInfo,
    Tool,
    ToolResult,
    ToolSchema,
)
from conduit.client.sync import Client, Run, Session, Subscription

__all__ = [
    "AsyncClient",
    "AsyncRun",
    "AsyncSession",
    "AsyncSubscription",
    "Backoff",
    "Client",
    "ClientError",
    "ConduitError",
    "ConnectionFailed",
    "ConnectionLost",
    "Event",
    "ExecutionResult",
    "ExecutorUnavailable",
    "Forbidden",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "LoginToken",
    "MethodNotFound",
    "NotFound",
    "OutputChunk",
    "Overloaded",
    "ParseError",
    "ProgramError",
    "ProgramFailed",
    "RateLimited",
    "RpcError",
    "Run",
    "Session",
    "SessionInfo",
    "Subscription",
    "SubscriptionDropped",
    "Timeout",
    "Tool",
    "ToolResult",
    "ToolSchema",
    "TransportError",
    "Unauthenticated",
    "UpstreamError",
    "open_client",
]
