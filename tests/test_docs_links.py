"""Every relative link in the documentation leads somewhere: the file exists, and a
`#anchor` names a heading of the file it points into. Docs cannot rot silently."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "deploy" / "README.md", *ROOT.glob("docs/*.md")])

# A fence opens with three or more backticks or tildes and closes with the same run.
FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1[ \t]*$", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"(`+).+?\1", re.DOTALL)
# [text](target) and [text](target "title"); images too, since `!` is not matched.
INLINE_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose(text: str) -> str:
    """The text with code blocks and code spans blanked out: links there are examples."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def links(document: Path) -> list[str]:
    text = prose(document.read_text(encoding="utf-8"))
    return INLINE_LINK.findall(text) + REFERENCE_DEFINITION.findall(text)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub renders it: lower case, punctuation dropped
    (backticks included), spaces turned into hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(document: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", document.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken(document: Path, target: str) -> str | None:
    """Why `target`, linked from `document`, leads nowhere; None when it leads somewhere."""
    path_part, _, anchor = target.partition("#")
    path = (document.parent / path_part).resolve() if path_part else document
    if not path.exists():
        return f"{path.relative_to(ROOT)} does not exist"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"{path.relative_to(ROOT)} has no heading #{anchor}"
    return None


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(document: Path) -> None:
    relative = [target for target in links(document) if not SCHEME.match(target)]
    problems = [
        f"[…]({target}): {why}"
        for target in relative
        if (why := broken(document, target)) is not None
    ]
    assert not problems, f"{document.relative_to(ROOT)} links to nothing:\n" + "\n".join(problems)


def test_the_checker_sees_links_anchors_and_code() -> None:
    text = "See [a](x.md#part) and `[b](code.md)`.\n```\n[c](block.md)\n```\n[d]: ref.md\n"
    assert INLINE_LINK.findall(prose(text)) + REFERENCE_DEFINITION.findall(prose(text)) == [
        "x.md#part",
        "ref.md",
    ]
    assert slug("The state directory") == "the-state-directory"
    assert slug("Pyodide: `tests/executors/test_pyodide.py` (marked slow)") == (
        "pyodide-testsexecutorstest_pyodidepy-marked-slow"
    )
    assert broken(ROOT / "docs" / "README.md", "nowhere.md") == "docs/nowhere.md does not exist"
    assert broken(ROOT / "docs" / "README.md", "operations.md#no-such-part") == (
        "docs/operations.md has no heading #no-such-part"
    )
    assert broken(ROOT / "docs" / "README.md", "operations.md#audit-store") is None
