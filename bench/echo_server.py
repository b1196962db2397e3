"""The reference for idle latency: a plain blocking Unix-socket echo server.

    python bench/echo_server.py SOCKET_PATH

One thread per connection, `recv` then `sendall` of what came, nothing else: what a
request costs this machine after it sat idle (waking the server, then the client),
with no event loop, no threads handing work to each other and no parsing. Prints
"ready" once it listens.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

# Bytes read at once: far more than a request line.
CHUNK = 1 << 16


def serve(connection: socket.socket) -> None:
    with connection:
        while data := connection.recv(CHUNK):
            connection.sendall(data)


def main(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen()
        print("ready", flush=True)
        while True:
            connection, _ = listener.accept()
            threading.Thread(target=serve, args=(connection,), daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1])
