"""The API, one module per namespace. Importing this package fills the method table."""

from conduit.daemon.methods import admin, compat, core, executions, executors, login, tools

__all__ = ["admin", "compat", "core", "executions", "executors", "login", "tools"]
