"""The import graph of Conduit's own modules: layers point down, and nothing new joins an
import cycle.

Read from the source (every `import` and `from … import`, at any depth: lazy imports
and those made only for type checking included), not from what happens to be loaded,
so an import behind a condition counts.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each package's folder, and the packages beside it that it may import. `core` is the
# bottom; the daemon composes everything (its command line talks to a running daemon
# through the client); the client and the sandboxes' shims stand on `core` alone.
LAYERS: dict[str, set[str]] = {
    "core": set(),
    "client": {"core"},
    "shims": set(),
    "executors": {"core"},
    "gateway": {"core"},
    "daemon": {"core", "client", "executors", "gateway"},
    # The agent frameworks' adapters: users of the client, like any agent.
    "integrations": {"client"},
}
# Modules that import cycles still run through, counting imports made only for type
# checking (a cycle of types is a cycle of design). None do: each part of the daemon is
# handed what it uses, not the `Daemon`. This set may only shrink.
KNOWN_CYCLE: frozenset[str] = frozenset()


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in LAYERS:
        for path in (ROOT / folder).rglob("*.py"):
            if "node_modules" in path.parts or "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(["conduit", *parts])] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The Conduit modules `name` (at `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from package import module` imports the module; anything else, the base.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            owner = _nearest(target, known)
            if owner and owner != name:
                yield owner


def _nearest(dotted: str, known: dict[str, Path]) -> str:
    """The Conduit module `dotted` names or lies in ("" for none: another library)."""
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted


def _graph() -> dict[str, set[str]]:
    """Who imports whom, imports made only for type checking included."""
    known = _modules()
    return {name: set(_imports(name, path, known)) for name, path in known.items()}


def _layer(module: str) -> str:
    return module.split(".")[1]


def test_every_import_points_down_or_stays_in_its_layer() -> None:
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if _layer(target) != _layer(module) and _layer(target) not in LAYERS[_layer(module)]
    )
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_joins_an_import_cycle() -> None:
    in_cycles = set().union(*_cycles(_graph()))
    assert in_cycles <= KNOWN_CYCLE, sorted(in_cycles - KNOWN_CYCLE)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [{"a", "b", "c"}]


# Public classes that still share a name across the package. None do: what both ends of
# the wire read is one model in `conduit.core`, and each side's own classes say whose
# they are (`BusEvent`, `UpstreamTool`). This set may only shrink.
KNOWN_SHARED_NAMES: frozenset[str] = frozenset()


def test_one_name_per_thing() -> None:
    homes: dict[str, list[str]] = {}
    for name, path in _modules().items():
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                homes.setdefault(node.name, []).append(name)
    shared = {cls: where for cls, where in homes.items() if len(where) > 1}
    assert set(shared) <= KNOWN_SHARED_NAMES, {
        cls: where for cls, where in shared.items() if cls not in KNOWN_SHARED_NAMES
    }
