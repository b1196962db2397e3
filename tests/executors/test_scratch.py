"""Scratch directories: private to their owner, swept once their owner is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conduit.executors.scratch import ENTRY_BYTES, ScratchDirs


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


def test_an_empty_directory_released_is_given_out_again(tmp_path: Path) -> None:
    dirs = ScratchDirs(tmp_path)
    empty, used = dirs.new(), dirs.new()
    (used.path / "sub").mkdir()
    (used.path / "sub" / "data").write_text("the program's")
    empty.release()
    used.release()
    # The used one is gone with what was in it; the empty one comes back.
    assert not used.path.exists()
    again, fresh = dirs.new(), dirs.new()
    assert again.path == empty.path and fresh.path not in (empty.path, used.path)
    assert list(fresh.path.iterdir()) == [] and list(again.path.iterdir()) == []
    dirs.close()
    again.release()  # after its home closed: nothing to keep it in
    assert not dirs.root.exists()


def test_a_directory_with_only_a_link_in_it_is_not_kept(tmp_path: Path) -> None:
    dirs = ScratchDirs(tmp_path)
    scratch = dirs.new()
    (scratch.path / "link").symlink_to("/nonexistent")
    scratch.release()
    assert not scratch.path.exists()
    assert dirs.new().path != scratch.path
    dirs.close()


def test_a_directory_a_program_changed_and_emptied_again_is_not_kept(tmp_path: Path) -> None:
    """Emptied is not enough: its times or its size would tell the next execution
    what this one did (ext4 never shrinks a directory)."""
    dirs = ScratchDirs(tmp_path)
    times, grown = dirs.new(), dirs.new()
    time.sleep(0.05)  # past the file system's clock granularity
    os.utime(times.path, ns=(1, 222_222_222_123_456_789))  # 64 bits of its choosing
    for i in range(400):
        (grown.path / f"f{i:03}").touch()
    for i in range(400):
        (grown.path / f"f{i:03}").unlink()
    times.release()
    grown.release()
    assert not times.path.exists() and not grown.path.exists()
    assert {dirs.new().path, dirs.new().path}.isdisjoint({times.path, grown.path})
    dirs.close()


def test_a_kept_directory_comes_back_with_its_access_time_reset(tmp_path: Path) -> None:
    dirs = ScratchDirs(tmp_path)
    scratch = dirs.new()
    before = os.stat(scratch.path)
    time.sleep(0.05)
    os.listdir(scratch.path)  # reading it may move its access time
    scratch.release()
    again = dirs.new()
    assert again.path == scratch.path
    after = os.stat(again.path)
    assert after.st_atime_ns == after.st_mtime_ns == before.st_mtime_ns
    dirs.close()


def test_a_directory_released_twice_is_handed_out_once(tmp_path: Path) -> None:
    dirs = ScratchDirs(tmp_path)
    scratch = dirs.new()
    scratch.release()
    first = dirs.new()
    scratch.release()  # a second release of what is now `first`'s
    assert first.path == scratch.path and dirs.new().path != first.path
    assert first.path.is_dir()
    dirs.close()


def test_a_directory_removed_is_let_go_of_and_a_stale_handle_removes_nothing(
    tmp_path: Path,
) -> None:
    """Deno's workers remove theirs rather than release it: nothing of it is kept (a
    daemon makes one a worker for its whole life), and a handle to a directory that
    is another execution's by now deletes nothing of it."""
    dirs = ScratchDirs(tmp_path)
    removed = dirs.new()
    removed.remove()
    assert not removed.path.exists()
    assert dirs.forget(removed) == (False, None)  # not still counted as handed out
    stale = dirs.new()
    stale.release()
    current = dirs.new()
    assert current.path == stale.path
    stale.remove()
    assert current.path.is_dir()
    dirs.close()


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


def nest(top: Path, depth: int, name: str = "d") -> int:
    """Directories `depth` deep under `top`, made as a guest makes them (each from its
    parent's descriptor, so no path is ever spelled whole); the deepest's descriptor."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir(name, dir_fd=fd)
        child = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    return fd


def test_files_nested_past_the_longest_path_still_count(tmp_path: Path) -> None:
    dirs = ScratchDirs(tmp_path)
    scratch = dirs.new()
    deepest = nest(scratch.path, 30, "d" * 200)  # ~6000 characters of path
    try:
        file = os.open("big", os.O_WRONLY | os.O_CREAT, dir_fd=deepest)
        os.write(file, os.urandom(1 << 20))
        os.close(file)
    finally:
        os.close(deepest)
    assert scratch.usage() > 1 << 20
    assert scratch.over(1 << 20)
    dirs.close()


def test_links_out_of_the_directory_count_as_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(1 << 20))
    dirs = ScratchDirs(tmp_path / "scratch")
    scratch = dirs.new()
    (scratch.path / "up").symlink_to("../../../outside")
    assert scratch.usage() == ENTRY_BYTES + os.lstat(scratch.path / "up").st_blocks * 512
    scratch.remove()
    dirs.close()
    assert (outside / "big").exists()


def test_a_tree_deeper_than_the_interpreter_recurses_is_removed(tmp_path: Path) -> None:
    dirs = ScratchDirs(tmp_path)
    scratch = dirs.new()
    os.close(nest(scratch.path, sys.getrecursionlimit() + 200))
    scratch.remove()
    assert not scratch.path.exists()
    os.close(nest(dirs.new().path, sys.getrecursionlimit() + 200))
    dirs.close()
    assert not dirs.root.exists()


def test_a_dead_owners_deep_tree_is_swept(tmp_path: Path) -> None:
    dead = tmp_path / "run-dead"
    (dead / "xold").mkdir(parents=True)
    os.close(nest(dead / "xold", sys.getrecursionlimit() + 200))
    owner = ScratchDirs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".sweep.lock", owner.root.name])
    owner.close()
