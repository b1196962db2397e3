"""docs/executors.md tells users what a Python program may import: it must say what the
guest really pre-imports, and which modules each Python executor lacks."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUEST = ROOT / "shims" / "wasm_python" / "guest.py"
DOC = ROOT / "docs" / "executors.md"
# The doc's list sits between these two markers, one `module` per code span.
LIST = re.compile(r"<!-- preloaded:start -->(.*?)<!-- preloaded:end -->", re.DOTALL)


def guest_preloaded() -> list[str]:
    """The guest's PRELOADED tuple, read from its source without running it."""
    tree = ast.parse(GUEST.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "PRELOADED" for target in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{GUEST} has no PRELOADED assignment")


def documented() -> list[str]:
    found = LIST.search(DOC.read_text(encoding="utf-8"))
    assert found, f"{DOC} lost its <!-- preloaded:start/end --> markers"
    return re.findall(r"`([^`]+)`", found.group(1))


def test_the_doc_lists_exactly_the_preloaded_modules() -> None:
    modules = documented()
    assert len(modules) == len(set(modules)), "a module is listed twice in the doc"
    preloaded = guest_preloaded()
    missing = sorted(set(preloaded) - set(modules))
    extra = sorted(set(modules) - set(preloaded))
    assert not missing and not extra, (
        f"docs/executors.md is out of step with PRELOADED in {GUEST.name}: "
        f"add {missing}, remove {extra}"
    )


def test_the_doc_lists_exactly_the_missing_modules() -> None:
    from conduit.executors.python_stdlib import MISSING

    text = DOC.read_text(encoding="utf-8")
    for executor, groups in MISSING.items():
        table = re.search(
            rf"<!-- missing:{executor}:start -->(.*?)<!-- missing:{executor}:end -->",
            text,
            re.DOTALL,
        )
        assert table, f"{DOC} lost its <!-- missing:{executor}:start/end --> markers"
        rows = [row for row in table.group(1).splitlines() if row.startswith("| `")]
        documented = {
            row.rsplit("|", 2)[1].strip(): re.findall(r"`([^`]+)`", row.rsplit("|", 2)[0])
            for row in rows
        }
        expected = {reason: list(modules) for reason, modules in groups.items()}
        assert documented == expected, f"docs/executors.md's {executor} table is out of step"
