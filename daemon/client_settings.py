"""Where the command line's client commands find the daemon, and which token they present.

The client (`conduit.client.LoginToken`) knows how to present a token; only the daemon's
side knows where a user's are: `CONDUIT_TOKEN`, the config's `auth.token`, and the master
token file under the state dir.

A command that only talks to a running daemon (`exec`, `call`, `executions`) should
start fast, and loading the configuration imports pydantic and the gateway, which take
most of a second. With no config file in play, the configuration is the built-in
defaults and three environment variables, so `client_settings` reads those itself;
with a file, it loads the configuration as the daemon does. The two agree
(tests/test_cli_settings.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from conduit.client import LoginToken
from conduit.core.addresses import default_socket_path, default_state_dir

if TYPE_CHECKING:
    from conduit.daemon.config import Config

__all__ = ["ClientSettings", "client_settings", "login_token"]


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """The daemon's Unix socket, and the token to present there (None: peer credentials)."""

    socket: str
    login: LoginToken | None


def client_settings(
    config_path: str | None, *, socket: str | None = None, environ: Mapping[str, str] | None = None
) -> ClientSettings:
    """The settings `load_config(config_path, overrides={"server.socket": socket})` gives.

    Raises `ConfigError` as `load_config` does when a config file is in play.
    """
    env = os.environ if environ is None else environ
    if config_path or env.get("CONDUIT_CONFIG"):
        from conduit.daemon.config import load_config

        config = load_config(config_path, environ=dict(env), overrides={"server.socket": socket})
        return ClientSettings(config.server.socket, login_token(config, environ=env))
    socket = socket or env.get("CONDUIT_SOCKET") or default_socket_path()
    chosen = env.get("CONDUIT_TOKEN")
    if chosen:
        return ClientSettings(socket, LoginToken(chosen))
    state_dir = env.get("CONDUIT_STATE_DIR") or default_state_dir(env)
    return ClientSettings(socket, _token_file(Path(state_dir) / "master.token"))


def login_token(config: Config, *, environ: Mapping[str, str] | None = None) -> LoginToken | None:
    """`CONDUIT_TOKEN` (or `auth.token`), else the master token file's token if this
    user can read it, else None.

    A token the user chose is always presented: it may name a client with narrower
    scopes than the peer credentials would give. The file's is a fallback: the file found
    from this user's config may belong to another daemon than the one at the socket.
    """
    from conduit.daemon.auth import master_token_path

    env = os.environ if environ is None else environ
    chosen = env.get("CONDUIT_TOKEN") or config.auth.token
    if chosen:
        return LoginToken(chosen)
    return _token_file(master_token_path(config.auth, config.server.state_dir))


def _token_file(path: Path) -> LoginToken | None:
    try:
        found = path.read_text().strip()
    except OSError:
        return None
    return LoginToken(found, fallback=True) if found else None
