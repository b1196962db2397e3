"""The daemon: listeners, protocol, dispatcher, auth, limits, configuration and CLI.

The public surface is small: start a daemon with `serve(config)` (or `Daemon`), read
configuration with `load_config`, and catch errors from `conduit.core.errors`.

The names below are imported on first use (PEP 562), not with the package: the
command line starts in `conduit.daemon.cli`, and a command that only talks to a
running daemon must not pull in the server, the gateway and pydantic, which take over
a second.
"""

from __future__ import annotations

import importlib
import typing
from typing import Any

if typing.TYPE_CHECKING:
    from conduit.core.errors import ConduitError, ConfigError, RpcError
    from conduit.core.version import VERSION
    from conduit.daemon.config import Config, load_config
    from conduit.daemon.server import Daemon, ServingInfo, serve

__all__ = [
    "VERSION",
    "ConduitError",
    "Config",
    "ConfigError",
    "Daemon",
    "RpcError",
    "ServingInfo",
    "load_config",
    "serve",
]

# Where each public name lives.
_HOMES = {
    "VERSION": "conduit.core.version",
    "ConduitError": "conduit.core.errors",
    "Config": "conduit.daemon.config",
    "ConfigError": "conduit.core.errors",
    "Daemon": "conduit.daemon.server",
    "RpcError": "conduit.core.errors",
    "ServingInfo": "conduit.daemon.server",
    "load_config": "conduit.daemon.config",
    "serve": "conduit.daemon.server",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'conduit.daemon' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
