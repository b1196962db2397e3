"""The reference for a file's round trip: what its wire form alone costs.

    python bench/wire_echo.py SOCKET_PATH

A plain blocking Unix-socket server that answers each JSON line as the daemon answers
an `execute` carrying files, without running anything: it decodes the line (JSON, then
each file's base64), writes each file into a temporary directory and reads it back,
and answers with the files' base64 in a JSON line. Beside the daemon's figure it shows
how much of a 1 MB round trip is the JSON and base64 at both ends, which no sandbox
can make cheaper. Prints "ready" once it listens.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path

from conduit.core import b64, jsontext

# Bytes read at once: a megabyte's line in a few reads.
CHUNK = 1 << 20


def answer(line: bytes, directory: Path) -> bytes:
    """The reply to one request line: its files, written, read back and returned."""
    request = jsontext.loads(line)
    files = []
    for file in request["params"].get("files", []):
        path = directory / "file.bin"
        path.write_bytes(b64.decode(file["base64"]))
        data = path.read_bytes()
        files.append({"path": file["path"], "size": len(data), "base64": b64.encode(data)})
    reply = {"jsonrpc": "2.0", "id": request["id"], "result": {"status": "ok", "files": files}}
    return jsontext.encode(reply) + b"\n"


def serve(connection: socket.socket, directory: Path) -> None:
    buffer = bytearray()
    with connection:
        while data := connection.recv(CHUNK):
            buffer += data
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                connection.sendall(answer(line, directory))


def main(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    with (
        tempfile.TemporaryDirectory(prefix="wire-echo-") as directory,
        socket.socket(socket.AF_UNIX) as listener,
    ):
        listener.bind(path)
        listener.listen()
        print("ready", flush=True)
        while True:
            connection, _ = listener.accept()
            serve(connection, Path(directory))


if __name__ == "__main__":
    main(sys.argv[1])
