"""Operator-chosen Python packages for the Python sandboxes: resolved, checked, locked.

`[executors.wasm_python] packages` and `[executors.pyodide] packages` list
requirements (`sympy==1.14.0`). When the executor builds its component or snapshot,
`download` runs pip on the host, with the guest's Python version and nothing but
pure-Python wheels allowed (tags `none-any`), dependencies included; a package that
has only compiled wheels or a source distribution fails the build with a `BuildError`
naming it, since no compiled extension can load in the sandbox. pip judges environment
markers by the host's Python, so each wheel's dependencies are judged again for the
guest's (`package_markers`) and what pip left out is asked for. Each wheel's name,
version and SHA-256 are written to a lock file kept with what was built, and read back
(`read_lock`) for `conduit doctor` and the tools' descriptions: a restart with the
build cached needs no network. The builds are keyed by the requested requirements
(`requirements_key`), not by what they resolved to; `package_pins` keeps a list's
first resolution so that a rebuild downloads the same wheels (`download_pinned`).

The wheels' files reach the guest through `extract_wheels`, then as that directory or
zipped (`zip_directory`, for `zipimport`); it takes only the importable part of a
wheel (its top level and `*.data/purelib`, `platlib`) and refuses a member whose path
could land outside (absolute, `..`, backslashes) or that is a link, a native library or
a `componentize-py.toml` (which would steer the host's componentize-py build), and a
malformed wheel, each with a `BuildError` naming the wheel. A package the sandbox has
already (`PROVIDED`: tzdata) is locked but not unpacked: the sandbox's own is used.

Requirements come from the trusted configuration but end up on pip's command line:
`core.requirements.parse_requirement` (the configuration's validator) lets through only a
name, extras and version specifiers, and pip is handed them after `--`.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import lzma
import re
import stat
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from conduit.core.requirements import parse_requirement
from conduit.executors.package_markers import (
    GuestEnvironment,
    MissingDependency,
    missing,
    read_installed,
)
from conduit.executors.wasm_build import BuildError, run_tool

__all__ = [
    "LOCK_FILE",
    "PROVIDED",
    "RESOLUTION",
    "LockedPackage",
    "download",
    "download_pinned",
    "extract_wheels",
    "project_names",
    "read_lock",
    "requirements_key",
    "write_lock",
    "zip_directory",
]

LOCK_FILE = "packages.lock.json"
# How requirements are resolved, an input of every build keyed by them: changed when a
# list may resolve to other packages than before (2: dependencies judged by the
# guest's markers), so that builds resolved the old way are made again.
RESOLUTION = "2"
LOCK_FORMAT = 1
# What the unpacked packages may take in all: sympy, among the largest pure-Python
# packages, takes ~70 MB; past this something is wrong (a zip bomb).
MAX_UNPACKED_BYTES = 512 * 1024 * 1024
# How many members the wheels may hold in all: sympy, among the largest, has ~1,500;
# past this something is wrong (a wheel of empty members, each a file to make).
MAX_MEMBERS = 100_000
# How many times pip is asked again for what the guest's markers add: each time adds
# the dependencies only the guest needs, one level deeper; real chains are one deep.
MAX_MARKER_ROUNDS = 5
# Packages every sandbox has already (the time-zone database, a pinned dependency of
# Conduit's): locked when resolved, never unpacked, so the sandbox's own is imported.
PROVIDED = frozenset({"tzdata"})
# pip resolves and downloads in seconds; sympy's ~6 MB wheel on a slow link in a minute.
PIP_TIMEOUT_S = 600
# How pip says a requirement has no distribution it may take, and which versions have.
_NOT_FOUND = re.compile(
    r"Could not find a version that satisfies the requirement (\S+) \(from versions: ([^)]*)\)"
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_VERSION = re.compile(r"^[A-Za-z0-9.+!_-]{1,100}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_WHEEL = re.compile(r"^[A-Za-z0-9._+!-]{1,250}\.whl$")
# What to do about a package that cannot be installed (it may be a dependency).
_REMOVE = "remove it, or the package that requires it, from the executor's packages"
# Parts of a wheel that are not importable code: scripts, headers, data files.
_IMPORTABLE_DATA = frozenset({"purelib", "platlib"})
# What componentize-py looks for in every directory of its Python path, which the build
# that compiles the packages has them in: a config that changes the build, native
# libraries it links in. No pure-Python wheel needs them.
_BUILD_CONFIG = "componentize-py.toml"
_NATIVE = re.compile(r".*\.(so(\.[0-9][0-9.]*)?|pyd|dylib)", re.IGNORECASE)
# What reading a malformed or unsupported zip raises.
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    NotImplementedError,
    RuntimeError,
    EOFError,
    ValueError,
    OSError,
    zlib.error,
    lzma.LZMAError,
)


@dataclass(frozen=True, slots=True)
class LockedPackage:
    """One wheel the build installed: its project name, version and SHA-256."""

    name: str
    version: str
    sha256: str
    wheel: str
    provided: bool = False  # the sandbox's own copy is used (see PROVIDED)


def requirements_key(requirements: Iterable[str], *parts: str) -> str:
    """A hex digest of the requirements (order and repeats aside) and `parts`: what a
    build of them is keyed by."""
    digest = hashlib.sha256()
    for line in (*sorted(set(requirements)), *parts):
        digest.update(f"{line}\n".encode())
    return digest.hexdigest()


# -- resolving --------------------------------------------------------------------------


def download(
    requirements: Sequence[str], guest: GuestEnvironment, dest: Path
) -> list[LockedPackage]:
    """Download the pure-Python wheels of `requirements` and their dependencies for
    the `guest`'s Python into `dest`; what was downloaded, by name.

    pip judges markers by the host's Python: what the guest's markers require that pip
    left out is added to the requirements and pip is run again, until nothing is
    missing (at most MAX_MARKER_ROUNDS times). Raises BuildError naming the package
    when one has no pure-Python wheel, when a dependency cannot be had, or when pip
    fails (its output's tail says why).
    """
    try:
        canonical = [parse_requirement(text) for text in requirements]
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    dest = dest.resolve()
    roots = [Requirement(text) for text in canonical]
    added: list[str] = []
    for _round in range(MAX_MARKER_ROUNDS):
        _pip_download([*canonical, *added], guest.python_version, dest)
        files = sorted(path.name for path in dest.iterdir())
        packages = sorted((_locked(dest / file) for file in files), key=lambda p: p.name)
        needed = missing(roots, read_installed(dest, files), guest)
        if not needed:
            return packages
        for dependency in needed:
            text = _unmarked(dependency)
            if text in added:
                raise _unsatisfied(dependency, guest)
            added.append(text)
        for path in dest.iterdir():
            path.unlink()
    raise _unsatisfied(needed[0], guest)


def download_pinned(
    pinned: Sequence[LockedPackage], python_version: str, dest: Path
) -> list[LockedPackage]:
    """Download exactly the wheels `pinned` names (a lock of an earlier resolution,
    dependencies included) into `dest`, each checked against its SHA-256 by pip
    (`--require-hashes`); what was downloaded. Raises BuildError if pip fails or
    hands over anything else."""
    dest = dest.resolve()
    with tempfile.TemporaryDirectory(prefix="conduit-pins-") as directory:
        pins = Path(directory) / "requirements.txt"
        lines = [f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in pinned]
        pins.write_text("".join(lines), encoding="utf-8")
        options = ["--no-deps", "--require-hashes", "-r", str(pins)]
        _pip_download([], python_version, dest, options)
    packages = sorted((_locked(path) for path in dest.iterdir()), key=lambda p: p.name)
    if packages != sorted(pinned, key=lambda p: p.name):
        got = ", ".join(p.wheel for p in packages)
        raise BuildError(f"pip downloaded {got}, which is not what the packages are pinned to")
    return packages


def _pip_download(
    requirements: Sequence[str], python_version: str, dest: Path, options: Sequence[str] = ()
) -> None:
    command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:"]
    command += ["--platform", "any", "--abi", "none", "--python-version", python_version]
    command += ["--no-input", "--disable-pip-version-check", "--progress-bar", "off"]
    command += ["--dest", str(dest), *options, "--", *requirements]
    try:
        run_tool("pip download", command, cwd=dest, timeout_s=PIP_TIMEOUT_S)
    except BuildError as exc:
        raise _explained(exc, python_version) from None


def _unmarked(dependency: MissingDependency) -> str:
    """The dependency as a requirement for pip's command line: its marker, judged
    already, dropped; BuildError if it names a URL."""
    requirement = Requirement(str(dependency.requirement))
    if requirement.url:
        raise BuildError(
            f"package {dependency.by} requires {requirement.name} from a URL, which "
            f"cannot be installed; {_REMOVE}"
        )
    requirement.marker = None
    return str(requirement)


def _unsatisfied(dependency: MissingDependency, guest: GuestEnvironment) -> BuildError:
    what = f"package {dependency.by}" if dependency.by else "the executor's packages"
    return BuildError(
        f"{what} requires {dependency.requirement} on Python {guest.python_version} in "
        f"the sandbox, which could not be downloaded with the rest; {_REMOVE}"
    )


def _explained(error: BuildError, python_version: str) -> BuildError:
    """pip's failure to find a distribution, said in the sandbox's terms."""
    found = _NOT_FOUND.search(str(error))
    if found is None:
        return error
    requirement, versions = found.group(1), found.group(2).strip()
    if versions == "none":
        return BuildError(
            f"package {requirement} cannot be installed: it has no pure-Python wheel for "
            f"Python {python_version} (only compiled wheels or a source distribution), and "
            f"only pure-Python wheels can run in the sandbox; {_REMOVE}"
        )
    return BuildError(
        f"package {requirement} cannot be installed: no version it allows has a "
        f"pure-Python wheel for Python {python_version}, and only pure-Python wheels can "
        f"run in the sandbox; versions that have one: {versions}"
    )


def _locked(path: Path) -> LockedPackage:
    """What one downloaded file is; BuildError unless it is a pure-Python wheel."""
    try:
        name, version, _build, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename:
        raise BuildError(
            f"pip downloaded {path.name}, which is no wheel: only pure-Python wheels "
            "can run in the sandbox"
        ) from None
    if any(tag.abi != "none" or tag.platform != "any" for tag in tags):
        raise BuildError(
            f"package {name} has compiled code ({path.name}), and only pure-Python "
            f"wheels can run in the sandbox; {_REMOVE}"
        )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    provided = name in PROVIDED
    return LockedPackage(str(name), str(version), digest, path.name, provided)


# -- the lock file ----------------------------------------------------------------------


def write_lock(
    path: Path, requirements: Sequence[str], python_version: str, packages: Sequence[LockedPackage]
) -> None:
    """Record what `requirements` resolved to, for `read_lock`."""
    lock = {
        "format": LOCK_FORMAT,
        "python": python_version,
        "resolution": RESOLUTION,
        "requested": sorted(set(requirements)),
        "packages": [asdict(package) for package in packages],
    }
    path.write_text(json.dumps(lock, indent=1) + "\n", encoding="utf-8")


def read_lock(path: Path) -> tuple[LockedPackage, ...]:
    """The packages a lock file records. Raises BuildError if it is unreadable or
    holds anything but well-formed names, versions and digests."""
    try:
        lock = json.loads(path.read_text(encoding="utf-8"))
        entries = lock["packages"] if lock.get("format") == LOCK_FORMAT else None
        if not isinstance(entries, list):
            raise ValueError("no packages of a known format")
        packages = tuple(LockedPackage(**entry) for entry in entries)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BuildError(f"the package lock {path} is unreadable ({exc}): delete it") from None
    for package in packages:
        if not (
            isinstance(package.name, str)
            and _NAME.match(package.name)
            and isinstance(package.version, str)
            and _VERSION.match(package.version)
            and isinstance(package.sha256, str)
            and _SHA256.match(package.sha256)
            and isinstance(package.wheel, str)
            and _WHEEL.match(package.wheel)
            and isinstance(package.provided, bool)
        ):
            raise BuildError(f"the package lock {path} holds a malformed entry: delete it")
    return packages


# -- unpacking --------------------------------------------------------------------------


def extract_wheels(
    wheels: Path,
    packages: Sequence[LockedPackage],
    target: Path,
    *,
    taken: frozenset[str] = frozenset(),
) -> None:
    """Unpack the importable part of each wheel in `wheels` into `target`, as pip
    would install it into site-packages; the wheels of PROVIDED packages are skipped.
    Raises BuildError naming the wheel for an unsafe member, a malformed wheel, or a
    file at a path of `taken` (what the sandbox holds already)."""
    target.mkdir(parents=True, exist_ok=True)
    for _member, relative, data in _members(wheels, packages, taken):
        out = target.joinpath(*relative.parts)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("xb") as handle:
            handle.write(data)


def zip_directory(
    directory: Path, out: zipfile.ZipFile, *, taken: frozenset[str] = frozenset()
) -> None:
    """Add every file under `directory` (unpacked by `extract_wheels`) to `out`, in
    order and with fixed times: the same packages make the same zip. Raises BuildError
    for a file at a path of `taken` (what `out` holds already)."""
    for path in sorted(directory.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        name = path.relative_to(directory).as_posix()
        if name in taken:
            raise BuildError(f"a package holds {name}, which the sandbox has already")
        out.writestr(zipfile.ZipInfo(name), path.read_bytes(), zipfile.ZIP_DEFLATED)


def _members(
    wheels: Path, packages: Sequence[LockedPackage], taken: frozenset[str]
) -> Iterator[tuple[zipfile.ZipInfo, PurePosixPath, bytes]]:
    """Each importable file of the wheels: its entry, where it goes, its bytes."""
    seen: dict[PurePosixPath, str] = {}
    total_bytes = total_members = 0
    for package in packages:
        if package.provided:
            continue
        with _opened(wheels / package.wheel) as wheel:
            members = wheel.infolist()
            total_members += len(members)
            if total_members > MAX_MEMBERS:
                raise BuildError(
                    f"wheel {package.wheel} takes the packages past {MAX_MEMBERS} members: refused"
                )
            for member in members:
                relative = _destination(member, package.wheel)
                if relative is None:
                    continue
                if relative.as_posix() in taken:
                    raise BuildError(
                        f"wheel {package.wheel} holds {relative}, which the sandbox has "
                        f"already; {_REMOVE}"
                    )
                if relative in seen:
                    raise BuildError(
                        f"wheels {seen[relative]} and {package.wheel} both hold {relative}"
                    )
                seen[relative] = package.wheel
                total_bytes += member.file_size
                if total_bytes > MAX_UNPACKED_BYTES:
                    raise BuildError(
                        f"the packages unpack to over {MAX_UNPACKED_BYTES // 2**20} MiB"
                    )
                yield member, relative, _read(wheel, member, package.wheel)


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[zipfile.ZipFile]:
    """The wheel at `path`, open; BuildError naming it if it is no readable zip."""
    try:
        wheel = zipfile.ZipFile(path)
    except _ZIP_ERRORS as exc:
        raise BuildError(f"wheel {path.name} is malformed ({_described(exc)}): refused") from None
    with wheel:
        yield wheel


def _read(wheel: zipfile.ZipFile, member: zipfile.ZipInfo, name: str) -> bytes:
    """A member's bytes; BuildError naming the wheel if they cannot be read (a bad
    CRC, an unknown compression method, encryption, a truncated file)."""
    try:
        return wheel.read(member)
    except _ZIP_ERRORS as exc:
        raise BuildError(
            f"wheel {name} is malformed ({member.filename!r}: {_described(exc)}): refused"
        ) from None


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _destination(member: zipfile.ZipInfo, wheel: str) -> PurePosixPath | None:
    """Where a wheel's member is installed, relative to site-packages; None for a
    directory or a part that is not importable. Raises BuildError for an unsafe one."""
    name = member.filename
    if member.is_dir():
        return None
    path = PurePosixPath(name)
    unsafe = (
        path.is_absolute()
        or "\\" in name
        or "\0" in name
        or ":" in path.parts[0]
        or any(part in ("", ".", "..") for part in name.split("/"))
        or stat.S_ISLNK(member.external_attr >> 16)
    )
    if unsafe:
        raise BuildError(f"wheel {wheel} holds an unsafe member {name!r}: refused")
    if path.name.lower() == _BUILD_CONFIG or _NATIVE.fullmatch(path.name):
        raise BuildError(
            f"wheel {wheel} holds {name!r}, a native library or build configuration, "
            f"which no pure-Python package needs: refused; {_REMOVE}"
        )
    first = path.parts[0]
    if first.endswith(".data") and len(path.parts) > 2:
        if path.parts[1] not in _IMPORTABLE_DATA:
            return None
        return PurePosixPath(*path.parts[2:])
    if first.endswith(".data"):
        return None
    return path


def project_names(packages: Iterable[LockedPackage]) -> dict[str, str]:
    """The packages' versions by canonical project name, sorted, for display; for a
    PROVIDED one, the version the sandbox has, saying so."""
    return {str(canonicalize_name(p.name)): _shown(p) for p in sorted(packages, key=_by_name)}


def _shown(package: LockedPackage) -> str:
    if not package.provided:
        return package.version
    try:
        own = importlib.metadata.version(package.name)
    except importlib.metadata.PackageNotFoundError:
        return package.version
    return f"{own} (the sandbox's own)"


def _by_name(package: LockedPackage) -> str:
    return str(canonicalize_name(package.name))
