"""The daemon: listeners, protocol, dispatcher, auth, limits, configuration and CLI.

The public surface is small: start a daemon with `serve(config)` (or `Daemon`), read
configuration with `load_config`, and catch errors from `conduit.daemon.errors`.
"""

from conduit.daemon.config import Config, load_config
from conduit.daemon.errors import ConduitError, ConfigError, RpcError
from conduit.daemon.server import Daemon, ServingInfo, serve
from conduit.daemon.version import VERSION

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
