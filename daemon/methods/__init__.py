"""The API, one module per namespace. Importing this package fills the method table."""

from conduit.daemon.methods import (
    admin,
    compat,
    core,
    events,
    executions,
    executors,
    login,
    sdk,
    tools,
    upstreams,
)

# Aliases copy their targets' entries, so they are added once every target exists.
compat.register_aliases()

__all__ = [
    "admin",
    "compat",
    "core",
    "events",
    "executions",
    "executors",
    "login",
    "sdk",
    "tools",
    "upstreams",
]
