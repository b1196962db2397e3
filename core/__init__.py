"""What every layer shares, at the bottom of the import graph: errors, the wire
protocol and its framing, the models both ends of the wire read (execution results,
events, tools), addresses, the version, JSON text handling, terminal-safe quoting and
log redaction.

`conduit.client`, `conduit.daemon`, `conduit.executors` and `conduit.gateway` import
these modules; they import nothing of Conduit's but each other, so the client can be
installed and imported without the daemon.
"""
