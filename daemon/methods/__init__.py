"""The API, one module per namespace, each declaring its handlers on a `MethodRouter`."""

from conduit.daemon.dispatcher import MethodTable
from conduit.daemon.methods import (
    admin,
    compat,
    core,
    events,
    executions,
    executors,
    files,
    login,
    sdk,
    sessions,
    tools,
    upstreams,
)

__all__ = ["method_table"]


def method_table() -> MethodTable:
    """A new table of every method, aliases included."""
    table = MethodTable(
        admin.router,
        core.router,
        events.router,
        executions.router,
        executors.router,
        files.router,
        login.router,
        sdk.router,
        sessions.router,
        tools.router,
        upstreams.router,
    )
    # Aliases copy their targets' entries, so they are added once every target is in.
    compat.add_aliases(table)
    return table
