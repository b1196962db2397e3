"""The component cache: built once per set of inputs, superseded builds deleted.

The recipe here is a stand-in whose "build" writes a file: this tests the cache around
the build tools (the real builds are tested with the executors that run them).
"""

from __future__ import annotations

from pathlib import Path

from conduit.executors.wasm_build import GuestRecipe, ensure_component


def recipe(version: str, builds: list[Path]) -> GuestRecipe:
    def build(work: Path, _cache_dir: Path) -> None:
        builds.append(work)
        (work / "guest.wasm").write_bytes(f"component {version}".encode())

    return GuestRecipe("wasm-test", ("world.wit",), lambda: {"tool": version}, build)


def test_a_build_is_reused_and_a_new_one_supersedes_the_old(tmp_path: Path) -> None:
    tmp_path = tmp_path / "cache"
    builds: list[Path] = []
    first = ensure_component(recipe("1", builds), tmp_path)
    again = ensure_component(recipe("1", builds), tmp_path)
    assert (first.built, again.built, len(builds)) == (True, False, 1)
    assert again.path == first.path and again.component_hash == first.component_hash
    unrelated = tmp_path / "wasm-test-npm-0123456789abcdef"  # another kind of entry
    unrelated.mkdir()
    upgraded = ensure_component(recipe("2", builds), tmp_path)
    assert upgraded.built and upgraded.path != first.path
    assert not first.path.parent.exists()  # the superseded build is gone
    assert unrelated.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [upgraded.path.parent.name, unrelated.name]
    )
