"""Which token the command line and the MCP relay present to a running daemon.

The client (`conduit.client.LoginToken`) knows how to present a token; only the daemon's
side knows where a user's tokens are: `CONDUIT_TOKEN`, the config's `auth.token`, and the
master token file under the state dir.
"""

from __future__ import annotations

import os

from conduit.client import LoginToken
from conduit.daemon.auth import master_token_path
from conduit.daemon.config import Config

__all__ = ["login_token"]


def login_token(config: Config) -> LoginToken | None:
    """`CONDUIT_TOKEN` (or `auth.token`), else the master token file's token if this
    user can read it, else None.

    A token the user chose is always presented: it may name a client with narrower
    scopes than the peer credentials would give. The file's is a fallback: the file found
    from this user's config may belong to another daemon than the one at the socket.
    """
    chosen = os.environ.get("CONDUIT_TOKEN") or config.auth.token
    if chosen:
        return LoginToken(chosen, fallback=False)
    try:
        found = master_token_path(config.auth, config.server.state_dir).read_text().strip()
    except OSError:
        return None
    return LoginToken(found, fallback=True) if found else None
