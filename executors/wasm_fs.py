"""The host side of the wasm-js guest's `fs` (shims/wasm_js/fs.js): `fs/*` calls.

The JavaScript guest has no WASI directory: its programs' file calls arrive through
the `host-call` import, in the runner thread, and are served here on the execution's
scratch directory with `workdir` (never through a link, never blocking on a special
file). Paths are Node's relative paths ("./out/a.png", "data//x.csv" and "." are
taken), normalised, then checked as `core.files` paths: nothing outside the working
directory can be named.

Writes count against the execution's disk cap as they happen: the directory's usage
is measured once, then kept up to date by each write's change, and measured again
after a removal. A write that takes it past the cap fails with ENOSPC and stops the
program (`on_full`), which then ends as `Status.DISK_LIMIT`, whatever it catches.

A failure is an `FsError` with Node's code ("ENOENT", "EISDIR", ...): the host answers
it as a JSON-RPC error whose data holds the code, and the guest throws it as Node does.

A write's bytes come on the guest's stdout, not in the call: a string the guest hands
to `host-call` is turned into UTF-8 by a loop in the guest's bindings, some 500 ns a
character, where the engine writes its stdout natively. So `fs/pipe` names the length
of the write's base64, the guest writes its base64 and a newline on stdout, which the
host takes here (`piped_output`) instead of the program's output, and `fs/write` with
`piped` writes it. The pipe takes no more than the announced length and its newline,
and nothing past the first newline: then, or when the guest makes its next host call,
whatever it is (`shut_pipe`), it takes no more. So whatever a program does to the
guest's `fs`, all but one announced line of its output is its own and counts against
its limits.

The same pipe carries a long `calls/wait` (the tool calls a program starts, arguments
and all, see `wasm_guest_calls`): `pipe_text` opens it for a line of at most so many
bytes, the guest writes its JSON on stdout, and the wait that follows, with empty
params, takes it (`take_text`). The bindings' loop also never frees what it encodes:
each argument sent in the call stayed in the guest's memory for good.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conduit.core import b64
from conduit.core.files import PathRefused, checked_path
from conduit.executors import workdir
from conduit.executors.scratch import Scratch

__all__ = ["METHOD_PREFIX", "FsError", "GuestFiles"]

# The host-call methods served here rather than by the daemon.
METHOD_PREFIX = "fs/"
# Text encodings a read may be asked for, by Node's names, as Python's codecs.
TEXT_ENCODINGS = {
    "utf8": "utf-8",
    "utf-8": "utf-8",
    "latin1": "latin-1",
    "binary": "latin-1",
    "ascii": "ascii",
}


class FsError(Exception):
    """A file call that failed, with Node's code for it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class GuestFiles:
    """One execution's file calls on `scratch`, within `disk_bytes`; `on_full` is
    called when a write takes the directory past it."""

    scratch: Scratch
    disk_bytes: int
    on_full: Callable[[], None]
    usage: int | None = None  # what the directory takes, if known
    # A write's base64 as it comes on stdout, and the most it may hold (see the module).
    pipe: bytearray | None = None
    pipe_bytes: int = 0
    # Whether the pipe still takes stdout: not once it holds a newline or is full.
    pipe_taking: bool = False
    # Whether the pipe was opened for text (`pipe_text`), rather than a write's base64.
    pipe_for_text: bool = False

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """Serve `fs/<operation>`; its result, or FsError."""
        piped = self._take_pipe(for_text=False)
        operation = _OPERATIONS.get(method.removeprefix(METHOD_PREFIX))
        if operation is None:
            raise FsError("ENOSYS", f"no such file operation: {method}")
        path = params.get("path")
        if params.get("piped") is True:
            if piped is None:
                raise FsError("EIO", "EIO: the bytes to write did not arrive whole")
            params = {**params, "base64": piped}
        try:
            return operation(self, _relative(path), params)
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or errno.EIO, "EIO")
            raise FsError(code, f"{code}: {exc.strerror or exc}, {path!r}") from None

    def piped_output(self, data: bytes) -> int:
        """How many bytes at the start of `data`, a piece of the guest's stdout, were
        taken for a write (Wasmtime's output thread); the rest is the program's output.

        The pipe takes up to its first newline and never more than announced: a line
        longer than announced fills it, and the rest of that line is output."""
        pipe = self.pipe
        if pipe is None or not self.pipe_taking:
            return 0
        room = self.pipe_bytes - len(pipe)
        newline = data.find(b"\n", 0, room)
        taken = min(len(data), room if newline < 0 else newline + 1)
        pipe += memoryview(data)[:taken]
        if newline >= 0 or len(pipe) == self.pipe_bytes:
            self.pipe_taking = False  # whole or broken, the write judges it
        return taken

    def shut_pipe(self) -> None:
        """Take no more stdout, and drop what was piped (any host call but a write's)."""
        self.pipe, self.pipe_taking = None, False

    def pipe_text(self, max_bytes: int) -> None:
        """Take the guest's next line on stdout, of at most `max_bytes` UTF-8 bytes
        and its newline, for the host call after it (`take_text`)."""
        self._open_pipe(max_bytes + 1, for_text=True)

    def take_text(self) -> str | None:
        """The line piped since `pipe_text`, shutting the pipe; None if none came
        whole, or it is not UTF-8."""
        line = self._take_pipe(for_text=True)
        try:
            return None if line is None else line.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def _take_pipe(self, *, for_text: bool) -> bytes | None:
        """The line piped for text or for a write, shutting the pipe; None if it is
        not whole (a write's fills the pipe exactly), or was piped for the other."""
        pipe = self.pipe
        self.shut_pipe()
        if pipe is None or self.pipe_for_text != for_text or not pipe.endswith(b"\n"):
            return None
        if not for_text and len(pipe) != self.pipe_bytes:
            return None
        return bytes(memoryview(pipe)[:-1])

    def _open_pipe(self, max_bytes: int, *, for_text: bool) -> None:
        self.pipe = bytearray()
        self.pipe_bytes = max_bytes
        self.pipe_taking = True
        self.pipe_for_text = for_text

    def _pipe(self, _path: str, params: dict[str, Any]) -> None:
        length = params.get("length")
        if type(length) is not int or length < 0 or length % 4:
            raise FsError("ERR_INVALID_ARG_TYPE", "the length to pipe is not base64's")
        if length // 4 * 3 > self.disk_bytes + 2:  # cannot fit, whatever its padding
            self._full()
        self._open_pipe(length + 1, for_text=False)  # the base64 and a newline

    def _read(self, path: str, params: dict[str, Any]) -> dict[str, str]:
        data = workdir.read(self.scratch.path, _file(path), self.disk_bytes)
        if data is None:
            raise _missing_or_not_a_file(self, path)
        encoding = params.get("encoding")
        if encoding is None:
            return {"data": b64.encode(data)}
        if encoding == "base64":
            return {"data": b64.encode(data)}
        if encoding == "hex":
            return {"data": data.hex()}
        codec = TEXT_ENCODINGS.get(str(encoding).lower())
        if codec is None:
            raise FsError("ERR_INVALID_ARG_VALUE", f"unknown encoding {encoding!r}")
        return {"data": data.decode(codec, errors="replace")}

    def _write(self, path: str, params: dict[str, Any]) -> None:
        data = _data_of(params)
        append = bool(params.get("append"))
        usage = self._usage()
        existing = workdir.stat_at(self.scratch.path, _file(path))
        replaced = workdir.cost(existing) if existing is not None and not append else 0
        if usage - replaced + len(data) > self.disk_bytes:  # refused before it is written
            self._full()
        change = workdir.write(self.scratch.path, path, data, append=append)
        self.usage = usage + change
        if self.usage > self.disk_bytes:
            self._full()

    def _stat(self, path: str, _params: dict[str, Any]) -> dict[str, Any] | None:
        info = os.stat(self.scratch.path) if not path else workdir.stat_at(self.scratch.path, path)
        if info is None:
            return None
        kind = (
            "file"
            if stat.S_ISREG(info.st_mode)
            else "directory"
            if stat.S_ISDIR(info.st_mode)
            else "link"
            if stat.S_ISLNK(info.st_mode)
            else "other"
        )
        return {"size": info.st_size, "kind": kind}

    def _mkdir(self, path: str, params: dict[str, Any]) -> None:
        parts = _file(path).split("/")
        usage = self._usage()
        made: list[int] = []
        if params.get("recursive"):
            os.close(workdir.open_dir(self.scratch.path, parts, create=True, made=made))
        else:
            fd = workdir.open_dir(self.scratch.path, parts[:-1])
            try:
                os.mkdir(parts[-1], 0o700, dir_fd=fd)
                made.append(workdir.cost(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)))
            finally:
                os.close(fd)
        self.usage = usage + sum(made)
        if self.usage > self.disk_bytes:
            self._full()

    def _readdir(self, path: str, _params: dict[str, Any]) -> list[str]:
        fd = workdir.open_dir(self.scratch.path, path.split("/") if path else ())
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def _rm(self, path: str, params: dict[str, Any]) -> None:
        *parents, name = _file(path).split("/")
        try:
            fd = workdir.open_dir(self.scratch.path, parents)
        except FileNotFoundError:
            if params.get("force"):
                return
            raise
        try:
            removed = _remove(fd, name, params)
        finally:
            os.close(fd)
        if removed is not None and self.usage is not None:
            self.usage -= removed
            return
        self.usage = None  # measured again at the next write
        if removed is None:
            # Every directory on the way was just opened without following a link,
            # and the guest, blocked in this call, cannot change them meanwhile.
            Scratch(self.scratch.path / path).remove()

    def _usage(self) -> int:
        if self.usage is None:
            self.usage = self.scratch.usage(stop_past=self.disk_bytes)
        return self.usage

    def _full(self) -> None:
        self.on_full()
        raise FsError(
            "ENOSPC",
            f"ENOSPC: the working directory would hold more than limits.disk_mb "
            f"({self.disk_bytes // (1024 * 1024)} MB)",
        )


_OPERATIONS: dict[str, Callable[[GuestFiles, str, dict[str, Any]], Any]] = {
    "pipe": GuestFiles._pipe,
    "read": GuestFiles._read,
    "write": GuestFiles._write,
    "stat": GuestFiles._stat,
    "mkdir": GuestFiles._mkdir,
    "readdir": GuestFiles._readdir,
    "rm": GuestFiles._rm,
}


def _relative(path: object) -> str:
    """A Node path as a `core.files` path; "" for the working directory itself."""
    if not isinstance(path, str):
        raise FsError("ERR_INVALID_ARG_TYPE", 'the "path" argument must be a string')
    if path.startswith("/"):
        raise FsError(
            "EACCES", f"EACCES: {path!r} is absolute; only the working directory is reachable"
        )
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts:
        return ""
    try:
        return checked_path("/".join(parts))
    except PathRefused as exc:
        raise FsError("EACCES", f"EACCES: {exc}") from None


def _file(path: str) -> str:
    """`path`, which must name something in the working directory, not itself."""
    if not path:
        raise FsError("EISDIR", "EISDIR: the working directory itself is a directory")
    return path


def _data_of(params: dict[str, Any]) -> bytes:
    encoded = params.get("base64")
    if not isinstance(encoded, str | bytes):
        raise FsError("ERR_INVALID_ARG_TYPE", "nothing to write")
    try:
        return b64.decode(encoded)
    except ValueError:  # binascii.Error, or a character outside ASCII
        raise FsError("ERR_INVALID_ARG_TYPE", "the data is not base64") from None


def _missing_or_not_a_file(files: GuestFiles, path: str) -> FsError:
    info = workdir.stat_at(files.scratch.path, path)
    if info is None:
        return FsError("ENOENT", f"ENOENT: no such file or directory, open {path!r}")
    if stat.S_ISDIR(info.st_mode):
        return FsError("EISDIR", f"EISDIR: illegal operation on a directory, read {path!r}")
    return FsError("EINVAL", f"EINVAL: not a regular file, open {path!r}")


def _remove(dir_fd: int, name: str, params: dict[str, Any]) -> int | None:
    """Remove `name` in `dir_fd` if it is a file or a link (never its target), and
    return what it counted for (0 if `force` and there was none); None if it is a
    directory, for the caller to remove (only if `recursive`)."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        if params.get("force"):
            return 0
        raise
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return workdir.cost(info)
    if params.get("file") or not params.get("recursive"):
        raise IsADirectoryError(errno.EISDIR, "is a directory")
    return None
