"""The tool gateway: upstream MCP servers as a catalogue of tools sandboxes may call.

Empty in this version: the daemon lists only its built-in execution tools.
"""

__all__: list[str] = []
