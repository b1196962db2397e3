"""Measure what tokenless uploads cost a running daemon (not collected by pytest).

    python tests/e2e/mcp_http_preauth_memory.py PID PORT [CONNECTIONS]

Opens CONNECTIONS (100) connections to the daemon's MCP HTTP endpoint, without a token
or a valid Host, and on each sends all but the last byte of an 8 MiB body: the daemon
buffers each body whole before it checks Host, Origin or the token. Prints the daemon's
resident memory before, while they are held, and after they close. Measured: 86 MiB,
892 MiB with 100 held, 91 MiB after; max_connections (256) of them hold about 2 GiB.
"""

from __future__ import annotations

import socket
import sys
import time

SIZE = 8 * 1024 * 1024  # server.max_message_bytes' default


def rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0]) // 1024


def main() -> None:
    pid, port = int(sys.argv[1]), int(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    print("daemon RSS before, MiB:", rss_mib(pid))
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: evil.example\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {SIZE}\r\n\r\n"
    ).encode()
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(head + b"x" * (SIZE - 1))
        held.append(sock)
    time.sleep(2)
    print(f"daemon RSS with {count} tokenless uploads held, MiB:", rss_mib(pid))
    for sock in held:
        sock.close()
    time.sleep(2)
    print("daemon RSS after they closed, MiB:", rss_mib(pid))


if __name__ == "__main__":
    main()
