"""What every framework's tool shows the model of a finished program (no framework)."""

from __future__ import annotations

import json

from conduit.client import ExecutionResult
from conduit.integrations._programs import MAX_SHOWN_CHARS, outcome


def test_what_the_model_is_shown_is_bounded_and_small_values_pass_unchanged() -> None:
    big = ExecutionResult.from_wire(
        {
            "execution_id": "ex_1",
            "status": "error",
            "result": {"rows": ["x" * 100] * 1000},
            "stdout": "o" * 1_000_000,
            "error": {"type": "ValueError", "message": "m" * 100_000, "traceback": ""},
        }
    )
    shown = outcome(big)
    assert len(json.dumps(shown)) < 6 * MAX_SHOWN_CHARS
    assert "characters left out" in shown["stdout"]
    assert "characters left out" in shown["result"]
    assert shown["error"]["type"] == "ValueError"
    small = ExecutionResult.from_wire({"execution_id": "ex_2", "status": "ok", "result": [1, 2]})
    assert outcome(small)["result"] == [1, 2]
    assert outcome(small)["stdout"] == ""
