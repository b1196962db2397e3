"""Measure what tokenless uploads cost a running daemon (not collected by pytest).

    python tests/e2e/mcp_http_preauth_memory.py PID PORT [CONNECTIONS]

Opens CONNECTIONS (100) connections to the daemon's MCP HTTP endpoint, without a token
or a valid Host, and on each sends all but the last byte of an 8 MiB body. Prints the
daemon's resident memory before, while they are held, and after they close. The daemon
refuses each at its head (403) and drops what follows unread, so the memory held should
not grow with CONNECTIONS; a daemon that buffered bodies before checking the head held
about 8 MiB per connection.
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
