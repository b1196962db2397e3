"""Scratch directories: private to their owner, swept once their owner is gone."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from conduit.executors.scratch import ScratchDirs


def test_two_owners_of_one_parent_keep_each_others_files(tmp_path: Path) -> None:
    first = ScratchDirs(tmp_path)
    mine = first.new()
    (mine.path / "data").write_text("kept")
    second = ScratchDirs(tmp_path)
    theirs = second.new()
    assert (mine.path / "data").read_text() == "kept"
    assert first.root != second.root and theirs.path.parent == second.root
    second.close()
    assert not second.root.exists() and (mine.path / "data").exists()
    first.close()
    first.close()  # idempotent
    assert not first.root.exists()


def test_what_a_dead_owner_left_is_swept_by_the_next(tmp_path: Path) -> None:
    # An owner that died: its root is there, its lock held by no one.
    dead = tmp_path / "run-dead"
    (dead / "xold").mkdir(parents=True)
    (dead / ".owner").touch()
    (dead / "xold" / "secret").write_text("left behind")
    half_made = tmp_path / "run-nolock"  # died before it locked
    half_made.mkdir()
    legacy = tmp_path / "xlegacy"  # the layout before owners had roots
    legacy.mkdir()
    owner = ScratchDirs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".sweep.lock", owner.root.name])
    owner.close()


def test_a_root_another_process_owns_is_not_swept(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                from pathlib import Path
                from conduit.executors.scratch import ScratchDirs
                dirs = ScratchDirs(Path({str(tmp_path)!r}))
                (dirs.new().path / "data").write_text("live")
                print(dirs.root, flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        theirs = Path(holder.stdout.readline().strip())
        mine = ScratchDirs(tmp_path)
        assert [p.read_text() for p in theirs.glob("x*/data")] == ["live"]
        mine.close()
    finally:
        holder.communicate("", timeout=30)
    # Once the holder is gone, its root is anyone's to sweep.
    ScratchDirs(tmp_path).close()
    assert not theirs.exists()
