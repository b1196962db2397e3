"""The audit journal on its own: what a past life left is read back whole, a line cut
short is skipped, one daemon holds it at a time, and it never outgrows its cap."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.core.jsontext import clean_text
from conduit.daemon import audit_journal
from conduit.daemon.audit_journal import RecordJournal, journal_line, record_from_line
from conduit.daemon.records import ExecutionRecord, FileRecord, SessionRecord, ToolCallRecord
from tests.daemon.test_audit import fabricated

text = st.text(st.characters(codec=None), max_size=40)  # lone surrogates included
numbers = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def records(draw: st.DrawFn) -> ExecutionRecord:
    return fabricated(
        draw(text),
        draw(st.floats(0, 2e9)),
        stdout_head=draw(text),
        error_message=draw(st.none() | text),
        exit_code=draw(st.none() | numbers),
        allowed_tools=tuple(draw(st.lists(text, max_size=3))),
        tool_calls=tuple(
            ToolCallRecord(draw(text), draw(st.floats(0, 1e6)), draw(text))
            for _ in range(draw(st.integers(0, 3)))
        ),
        files_out=tuple(
            FileRecord(draw(text), draw(numbers)) for _ in range(draw(st.integers(0, 2)))
        ),
        session_id=draw(st.none() | text),
    )


@settings(max_examples=200, deadline=None)
@given(records())
def test_any_record_comes_back_from_its_line_with_its_text_cleaned(record: ExecutionRecord) -> None:
    line = journal_line(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    back = record_from_line(line[:-1])
    assert back.execution_id == clean_text(record.execution_id)
    assert back.stdout_head == clean_text(record.stdout_head)
    assert back.exit_code == record.exit_code
    assert back.allowed_tools == tuple(clean_text(t) for t in record.allowed_tools)
    assert [c.tool for c in back.tool_calls] == [clean_text(c.tool) for c in record.tool_calls]
    assert [f.size for f in back.files_out] == [f.size for f in record.files_out]


def test_what_a_past_life_left_is_read_back_in_order(tmp_path: Path) -> None:
    path = tmp_path / "audit.journal"
    journal, left = RecordJournal.open(path)
    assert left == []
    started = fabricated("ex_1", 1.0, status="running")
    ended = fabricated("ex_1", 1.0, status="ok")
    session = SessionRecord("se_1", "master", "wasm-python", "python", 1.0)
    for record in (started, session, ended):
        assert journal.append(record)
    # Killed here: the descriptor dies with the process and its lock with it.
    os.close(journal._fd)  # type: ignore[arg-type]

    journal, left = RecordJournal.open(path)
    assert left == [started, session, ended]
    journal.clear()
    journal.close(remove=True)
    assert not path.exists()


def test_a_line_cut_short_or_foreign_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "audit.journal"
    whole = journal_line(fabricated("ex_whole", 1.0))
    path.write_bytes(
        b'{"kind": "other", "record": {}}\n'
        + b"not json\n"
        + b'{"kind": "execution", "record": {"execution_id": 1}}\n'
        + whole
        + journal_line(fabricated("ex_cut", 1.0))[:40]
    )
    journal, left = RecordJournal.open(path)
    assert [r.execution_id for r in left] == ["ex_whole"]
    journal.close(remove=False)


def test_one_daemon_holds_the_journal_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "audit.journal"
    journal, _ = RecordJournal.open(path)
    with pytest.raises(BlockingIOError):
        RecordJournal.open(path)
    journal.close(remove=False)
    again, _ = RecordJournal.open(path)
    again.close(remove=True)


def test_the_journal_takes_nothing_past_its_cap_until_emptied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = fabricated("ex_1", 1.0)
    monkeypatch.setattr(audit_journal, "MAX_BYTES", 2 * len(journal_line(record)))
    journal, _ = RecordJournal.open(tmp_path / "audit.journal")
    assert [journal.append(record) for _ in range(3)] == [True, True, False]
    journal.clear()
    assert journal.append(record)
    assert (tmp_path / "audit.journal").stat().st_size == len(journal_line(record))
    journal.close(remove=False)


def test_a_journal_that_cannot_be_written_is_given_up(tmp_path: Path) -> None:
    journal, _ = RecordJournal.open(tmp_path / "audit.journal")
    os.close(journal._fd)  # type: ignore[arg-type]
    journal._fd = os.open(os.devnull, os.O_RDONLY)  # writes fail with EBADF
    assert not journal.append(fabricated("ex_1", 1.0))
    assert not journal.is_open
    assert not journal.append(fabricated("ex_2", 1.0))


def test_a_number_no_json_can_carry_comes_back_empty_never_failing(tmp_path: Path) -> None:
    huge = 10**5000  # past Python's 4,300-digit limit for text
    record = fabricated("ex_huge", 1.0, memory_peak_bytes=huge, exit_code=2**70)
    line = journal_line(record)
    back = record_from_line(line[:-1])
    assert (back.memory_peak_bytes, back.exit_code) == (None, 2**70)
    journal, _ = RecordJournal.open(tmp_path / "audit.journal")
    assert journal.append(record)
    journal.close(remove=False)
    _, left = RecordJournal.open(tmp_path / "audit.journal")
    assert [r.execution_id for r in left] == ["ex_huge"]
