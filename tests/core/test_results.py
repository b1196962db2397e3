"""One result model: what the daemon sends, what MCP's schema says and what the client
reads are the same `ExecutionResult`."""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conduit.client import ExecutionResult as ClientResult
from conduit.core.results import (
    STATUSES,
    ExecutionResult,
    ProgramError,
    ProgramFailed,
    Status,
    Truncated,
)
from conduit.daemon.methods.tools import OUTPUT_SCHEMA
from conduit.executors.base import Status as ExecutorStatus

text = st.text()
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
errors = (
    st.none()
    | st.builds(ProgramError, text, text, text)
    | st.builds(
        ProgramError,
        st.just("PolicyViolation"),
        text,
        text,
        rule=text,
        line=st.integers(min_value=1),
        column=st.integers(min_value=1),
        snippet=text,
    )
)
results = st.builds(
    ExecutionResult,
    execution_id=text,
    status=st.sampled_from(STATUSES),
    result=json_values,
    stdout=text,
    stderr=text,
    exit_code=st.none() | st.integers(),
    error=errors,
    truncated=st.builds(Truncated, st.booleans(), st.booleans()),
    tool_calls=st.integers(min_value=0),
    duration_ms=st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    queue_ms=st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    executor=text,
    memory_peak_bytes=st.none() | st.integers(min_value=0),
)


@given(results)
def test_the_wire_form_reads_back_as_the_same_result(result: ExecutionResult) -> None:
    wire = result.to_wire()
    assert ExecutionResult.from_wire(wire) == result
    assert ExecutionResult.from_wire(wire).raw == wire


@given(results)
def test_every_result_is_valid_against_the_mcp_output_schema(result: ExecutionResult) -> None:
    jsonschema.validate(result.to_wire(), OUTPUT_SCHEMA)


def test_the_mcp_schema_the_client_and_the_executors_use_the_one_model() -> None:
    assert ExecutionResult.json_schema() == OUTPUT_SCHEMA
    assert ClientResult is ExecutionResult
    assert ExecutorStatus is Status
    assert set(OUTPUT_SCHEMA["required"]) == set(
        ExecutionResult(execution_id="x", status="ok").to_wire()
    )


def test_only_a_refused_programs_error_names_a_rule() -> None:
    plain = ProgramError("ValueError", "bad", "Traceback ...").to_wire()
    assert plain == {"type": "ValueError", "message": "bad", "traceback": "Traceback ..."}
    refused = ProgramError("PolicyViolation", "no", rule="r", line=2, column=3, snippet="x")
    assert refused.to_wire()["rule"] == "r"
    assert refused.to_wire()["snippet"] == "x"


def test_a_failed_result_raises_with_its_error_quoted() -> None:
    failed = ExecutionResult("ex_1", "error", error=ProgramError("E\x1b[31m", "line\nnext"))
    with pytest.raises(ProgramFailed) as raised:
        failed.raise_for_status()
    assert raised.value.result is failed
    assert "\x1b" not in str(raised.value) and "\n" not in str(raised.value)
    ok = ExecutionResult("ex_2", "ok")
    assert ok.raise_for_status() is ok


def test_a_hostile_results_files_are_read_leniently() -> None:
    wire = {
        "execution_id": "ex_1",
        "status": "ok",
        "files": [
            {"path": "a.txt", "size": "huge", "mime": "text/plain", "base64": "!!"},
            "not a file",
            {"path": "b.png", "size": -5, "base64": None, "truncated": True},
        ],
    }
    a, b = ExecutionResult.from_wire(wire).files
    assert (a.path, a.size, a.data) == ("a.txt", 0, None)
    assert (b.path, b.size, b.truncated, b.mime) == ("b.png", 0, True, "application/octet-stream")
