"""Which dependencies the guest's Python needs, judged by the guest's markers.

pip runs on the host and evaluates environment markers (`; python_version >= "3.13"`)
with the host's interpreter, whatever `--python-version` says: on a 3.11 host it skips
`legacy-cgi; python_version >= "3.13"`, which webob needs on 3.14. `missing` reads the
`Requires-Dist` of the wheels pip downloaded, evaluates each marker for the guest
(`GuestEnvironment`), and names what the guest requires that was not downloaded, so
`packages.download` can ask pip for it. It knows nothing of pip or of the sandboxes.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from conduit.executors.wasm_build import BuildError

__all__ = ["GuestEnvironment", "Installed", "MissingDependency", "missing", "read_installed"]


@dataclass(frozen=True, slots=True)
class GuestEnvironment:
    """The guest's interpreter as environment markers see it.

    `python_version` is "3.14"; `sys_platform` "wasi" or "emscripten", and
    `platform_system` and `platform_release` what `platform.system()` and
    `platform.release()` say there ("wasi", "Emscripten").
    """

    python_version: str
    python_full_version: str
    sys_platform: str
    platform_system: str
    platform_release: str = ""

    def markers(self, extra: str = "") -> dict[str, str]:
        """The environment `Marker.evaluate` takes: every key set, none the host's."""
        return {
            "implementation_name": "cpython",
            "implementation_version": self.python_full_version,
            "os_name": "posix",
            "platform_machine": "wasm32",
            "platform_python_implementation": "CPython",
            "platform_release": self.platform_release,
            "platform_system": self.platform_system,
            "platform_version": "",
            "python_full_version": self.python_full_version,
            "python_version": self.python_version,
            "sys_platform": self.sys_platform,
            "extra": extra,
        }


@dataclass(frozen=True, slots=True)
class Installed:
    """One downloaded wheel: its version and what its METADATA requires."""

    version: Version
    requires: tuple[Requirement, ...]


@dataclass(frozen=True, slots=True)
class MissingDependency:
    """`requirement`, required by `by` (a project name, or None for the operator's
    list), that no downloaded wheel satisfies."""

    by: str | None
    requirement: Requirement


def read_installed(wheels: Path, files: Iterable[str]) -> dict[NormalizedName, Installed]:
    """The wheels `files` in `wheels` by canonical name. Raises BuildError naming a
    wheel whose METADATA is missing or unreadable."""
    found = {}
    for file in files:
        name, version, _build, _tags = parse_wheel_filename(file)
        found[name] = Installed(version, _requires(wheels / file))
    return found


def _requires(wheel: Path) -> tuple[Requirement, ...]:
    try:
        with zipfile.ZipFile(wheel) as archive:
            metadata = next(
                archive.read(info)
                for info in archive.infolist()
                if re.fullmatch(r"[^/]+\.dist-info/METADATA", info.filename)
            )
        headers = HeaderParser().parsestr(metadata.decode("utf-8", "replace"))
        return tuple(Requirement(text) for text in headers.get_all("Requires-Dist") or ())
    except (StopIteration, InvalidRequirement) as exc:
        raise BuildError(f"wheel {wheel.name} has no readable METADATA ({exc!r})") from None
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError, EOFError, OSError) as exc:
        raise BuildError(f"wheel {wheel.name} is malformed: {exc}") from None


def missing(
    roots: Sequence[Requirement],
    installed: Mapping[NormalizedName, Installed],
    guest: GuestEnvironment,
) -> list[MissingDependency]:
    """What `roots` need, through every dependency the guest's markers select (extras
    included), that `installed` lacks or holds at a version outside its specifier."""
    needed: list[MissingDependency] = []
    queue: list[tuple[str | None, Requirement]] = [(None, root) for root in roots]
    seen: set[str] = set()
    while queue:
        by, requirement = queue.pop()
        if str(requirement) in seen:
            continue
        seen.add(str(requirement))
        found = installed.get(canonicalize_name(requirement.name))
        if found is None or not requirement.specifier.contains(found.version, prereleases=True):
            needed.append(MissingDependency(by, requirement))
            continue
        extras = ("", *sorted(requirement.extras))
        for dependency in found.requires:
            if dependency.marker is None or any(
                dependency.marker.evaluate(guest.markers(extra)) for extra in extras
            ):
                queue.append((requirement.name, dependency))
    return needed
