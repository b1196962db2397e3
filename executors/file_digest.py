"""SHA-256 digests of large files the daemon reads at every start, computed once per
process for each version of a file.

A daemon checks its compiled components against their digests as it starts; a process
that starts several daemons (an embedding application, the tests) would hash the same
tens of megabytes each time. A file's version is its identity, size and change times:
a write changes its ctime, which no one can set back, and a replaced file is a new
inode. The kernel keeps those times coarsely, so a write in the same tick as the last
one may leave them as they were: a file changed less than `SETTLED_NS` before it was
hashed is hashed again next time, and a digest is reused only for the very bytes it was
computed from.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

__all__ = ["file_version", "sha256_hex"]

READ_BYTES = 1024 * 1024
# Far beyond the coarsest tick the kernel keeps file times in.
SETTLED_NS = 1_000_000_000
# Versions remembered; more are hashed again, oldest forgotten first.
MAX_REMEMBERED = 64

_lock = threading.Lock()
_digests: dict[tuple[int, ...], str] = {}
_now_ns = time.time_ns


def sha256_hex(path: Path) -> str:
    """The hex SHA-256 of the file at `path`. Raises OSError if it cannot be read."""
    with open(path, "rb") as file:
        stat = os.fstat(file.fileno())
        version = _version(stat)
        with _lock:
            known = _digests.get(version)
        if known is not None:
            return known
        settled = _now_ns() - stat.st_ctime_ns >= SETTLED_NS
        digest = _hash(file)
        # Changed while it was read: the digest is of no one version.
        settled = settled and _version(os.fstat(file.fileno())) == version
    if settled:
        with _lock:
            while len(_digests) >= MAX_REMEMBERED:
                del _digests[next(iter(_digests))]
            _digests[version] = digest
    return digest


def file_version(path: Path) -> tuple[int, ...]:
    """What tells one version of the file at `path` (links followed) from another, as
    far as its times can.

    Raises OSError if it cannot be read.
    """
    return _version(os.stat(path))


def _hash(file: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := file.read(READ_BYTES):
        digest.update(chunk)
    return digest.hexdigest()


def _version(stat: os.stat_result) -> tuple[int, ...]:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
