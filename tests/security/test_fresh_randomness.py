"""Every execution draws its own random numbers, on every executor.

Pre-built snapshots (the wasm-python component, Pyodide's restored heap, the wasm-js
component) hold whatever a module seeded when the snapshot was made: an executor that
did not seed again would hand every program the same "random" numbers, and one program
could predict another's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.security.test_hostile_text import EXECUTORS, start_for  # noqa: F401 (a fixture)

DRAWS = {
    "typescript": "return [Math.random(), crypto.randomUUID()]",
    "javascript": "[Math.random(), crypto.randomUUID()]",
    "python": "import random, uuid, os\n[random.random(), str(uuid.uuid4()), os.urandom(8).hex()]",
}


@pytest.mark.parametrize(("language", "executor"), EXECUTORS)
async def test_two_fresh_executions_draw_different_numbers(
    start_for: Callable[..., Any],  # noqa: F811 (the fixture)
    connect: Any,
    language: str,
    executor: str,
) -> None:
    _, info = await start_for(executor)
    client = await connect(info)
    params = {"language": language, "executor": executor, "code": DRAWS[language]}
    first = await client.call("execute", params)
    second = await client.call("execute", params)
    assert first["status"] == second["status"] == "ok", (first, second)
    assert all(a != b for a, b in zip(first["result"], second["result"], strict=True)), (
        first["result"],
        second["result"],
    )
