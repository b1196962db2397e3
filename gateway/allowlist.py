"""Allowlists: which tools a caller, or one execution, may see and call.

A pattern is one of:

- `*`            every tool;
- `ns.*`         every tool in namespace `ns` (segment boundary: `git.*` matches
                 `git.status`, never `github.create_issue`);
- `ns.tool`      exactly that SDK path (`UpstreamTool.path`);
- `up__tool`     exactly that tool id (`UpstreamTool.id`), for callers who think in wire ids.

Matching is case-sensitive. Namespaces and tool names in path patterns are SDK
identifiers (`tools/packages` lists them), not raw upstream names: `my-git.*` is refused
with a hint to write `my_git.*`. A pattern with `__` and no `*` is a tool id (SDK names
never contain `__`, so this is unambiguous). Anything else (`gi*`, `*.x`, `a.b.c`, empty)
raises `ValueError` naming the pattern and the valid forms.

Several allowlists that must *all* allow a tool are a plain list, `list[Allowlist]`:
that is how "the request's `allowed_tools` intersected with the caller's own" is
represented, with no attempt to compute a single intersected pattern set. `None` means
unrestricted. An empty list also allows everything (nothing restricts it); `intersect()`, the way to
build these lists, returns `None` rather than an empty list.
An `Allowlist` with no patterns allows nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from conduit.gateway.model import UpstreamTool
from conduit.gateway.naming import identifier, namespace_for

__all__ = ["Allowlist", "intersect", "permits"]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_PATH = re.compile(rf"({_IDENT})\.(\*|{_IDENT})")
_FORMS = "'*', 'namespace.*', 'namespace.tool' or a tool id 'upstream__tool'"


def _invalid(pattern: str, why: str) -> ValueError:
    return ValueError(f"invalid allowlist pattern {pattern!r}: {why}; use {_FORMS}")


def _check_path(pattern: str) -> None:
    """Raise `ValueError` unless `pattern` is `ns.*` or `ns.tool`, saying what is wrong."""
    if _PATH.fullmatch(pattern):
        return
    namespace, dot, name = pattern.partition(".")
    if "*" in namespace or (name != "*" and "*" in name):
        raise _invalid(pattern, "'*' stands alone or as the whole last segment ('ns.*')")
    if not dot:
        raise _invalid(pattern, f"a bare name; did you mean '{namespace_for(pattern)}.*'?")
    if "." in name:
        raise _invalid(pattern, "a path has exactly two segments, 'namespace.tool'")
    hint = f"{namespace_for(namespace)}.{name if name == '*' else identifier(name)}"
    raise _invalid(pattern, f"segments are SDK identifiers; did you mean '{hint}'?")


class Allowlist:
    """A set of patterns (see the module docstring); immutable once built.

    Raises `ValueError` for an invalid pattern, naming it.
    """

    __slots__ = ("_everything", "_exact", "_namespaces", "_patterns")

    def __init__(self, patterns: Iterable[str]) -> None:
        self._patterns = tuple(patterns)
        self._everything = False
        self._namespaces: set[str] = set()
        self._exact: set[str] = set()  # SDK paths and tool ids alike: they never clash
        for pattern in self._patterns:
            self._add(pattern)

    def _add(self, pattern: str) -> None:
        if not isinstance(pattern, str) or not pattern.strip():
            raise _invalid(str(pattern), "it is empty")
        if pattern != pattern.strip():
            raise _invalid(pattern, "it has surrounding whitespace")
        if pattern == "*":
            self._everything = True
        elif "__" in pattern and "*" not in pattern:
            self._exact.add(pattern)
        else:
            _check_path(pattern)
            namespace, _, name = pattern.partition(".")
            if name == "*":
                self._namespaces.add(namespace)
            else:
                self._exact.add(pattern)

    @classmethod
    def everything(cls) -> Allowlist:
        """The allowlist `["*"]`."""
        return cls(["*"])

    @property
    def patterns(self) -> tuple[str, ...]:
        """The patterns as given."""
        return self._patterns

    def allows(self, tool: UpstreamTool) -> bool:
        """Whether any pattern matches the tool's SDK path or id."""
        return (
            self._everything
            or tool.namespace in self._namespaces
            or tool.path in self._exact
            or tool.id in self._exact
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Allowlist):
            return NotImplemented
        return self._patterns == other._patterns

    def __hash__(self) -> int:
        return hash(self._patterns)

    def __repr__(self) -> str:
        return f"Allowlist({list(self._patterns)!r})"


def intersect(*parts: Allowlist | Sequence[Allowlist] | None) -> list[Allowlist] | None:
    """All the restrictions in `parts` at once: a tool must be allowed by every one.

    Each part is an `Allowlist`, a list of them (an earlier intersection), or `None`
    (no restriction). Returns `None` when nothing restricts, never an empty list.
    """
    result: list[Allowlist] = []
    for part in parts:
        if isinstance(part, Allowlist):
            result.append(part)
        elif part is not None:
            result.extend(part)
    return result or None


def permits(allow: Sequence[Allowlist] | None, tool: UpstreamTool) -> bool:
    """Whether every allowlist in `allow` allows `tool` (`None`: no restriction)."""
    return allow is None or all(allowlist.allows(tool) for allowlist in allow)
