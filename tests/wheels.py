"""Small wheels made in tests: well-formed, hostile or spoilt, for the package build to
refuse or unpack without asking an index."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

from conduit.executors.packages import LockedPackage

EVIL_WHEEL = "evil-1.0-py3-none-any.whl"
EVIL_SOURCE = b"x = 1  # the member whose bytes are spoilt\n"


def make_wheel(path: Path, members: dict[str, bytes], links: tuple[str, ...] = ()) -> LockedPackage:
    """A wheel at `path` of `members` and of `links` to /etc/passwd, as locked."""
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in members.items():
            wheel.writestr(name, data)
        for name in links:
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            wheel.writestr(info, "/etc/passwd")
    return LockedPackage("evil", "1.0", "0" * 64, path.name)


def spoilt_wheel(path: Path, how: str) -> LockedPackage:
    """A wheel whose one member cannot be read: its bytes changed under its CRC, its
    compression method unknown, or marked encrypted (in the central directory, which
    is what zipfile reads)."""
    package = make_wheel(path, {"evil/__init__.py": EVIL_SOURCE})
    data = bytearray(path.read_bytes())
    central = data.index(b"PK\x01\x02")
    if how == "crc":
        start = data.index(EVIL_SOURCE)
        data[start] ^= 0xFF
    elif how == "method":
        data[central + 10 : central + 12] = (99).to_bytes(2, "little")
    elif how == "encrypted":
        data[central + 8] |= 0x01
    elif how == "not a zip":
        data = bytearray(b"this is no zip file")
    path.write_bytes(bytes(data))
    return package
