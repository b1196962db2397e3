"""How an execution ended, worded once for every executor.

Executors observe different things (exit codes, traps, epoch deadlines) but report the
same statuses with the same messages: each message says which limit was hit and what
to do about it. Partial output is always kept.
"""

from __future__ import annotations

from typing import Any

from conduit.executors.base import ErrorInfo, Limits, Outcome, Status
from conduit.executors.output import OutputCapture

__all__ = [
    "captured",
    "error_exit_code",
    "error_info",
    "failed",
    "memory_limit",
    "output_limit",
    "result_too_large",
    "stopped",
    "timed_out",
]


def captured(capture: OutputCapture) -> Outcome:
    """An ok outcome carrying everything the program printed that fit the budget."""
    return Outcome(
        Status.OK,
        stdout=capture.text("stdout"),
        stderr=capture.text("stderr"),
        truncated_stdout=capture.truncated("stdout"),
        truncated_stderr=capture.truncated("stderr"),
    )


def failed(outcome: Outcome, status: Status, kind: str, message: str) -> Outcome:
    outcome.status = status
    outcome.error = ErrorInfo(kind, message)
    return outcome


def output_limit(outcome: Outcome, limits: Limits) -> Outcome:
    return failed(
        outcome,
        Status.OUTPUT_LIMIT,
        "OutputLimit",
        f"the program printed more than {limits.output_bytes} bytes or "
        f"{limits.output_lines} lines and was stopped; print less, or raise "
        "limits.output_bytes or limits.output_lines",
    )


def timed_out(outcome: Outcome, limits: Limits) -> Outcome:
    return failed(
        outcome,
        Status.TIMEOUT,
        "Timeout",
        f"the program did not finish within {limits.timeout_ms} ms and was stopped; "
        "make it faster, or raise limits.timeout_ms",
    )


def result_too_large(outcome: Outcome, limits: Limits) -> Outcome:
    return failed(
        outcome,
        Status.ERROR,
        "ResultTooLarge",
        f"the result is larger than {limits.result_bytes} bytes as JSON; return "
        "less (print bulk data instead), or raise limits.result_bytes",
    )


def memory_limit(outcome: Outcome, limits: Limits, traceback: str = "") -> Outcome:
    outcome.status = Status.MEMORY_LIMIT
    outcome.error = ErrorInfo(
        "MemoryLimit",
        f"the program ran out of memory (limit {limits.memory_mb} MB); use less memory, "
        "or raise limits.memory_mb",
        traceback,
    )
    return outcome


def files_limit(outcome: Outcome, limits: Limits) -> Outcome:
    """The program's files took more than its memory limit (they count against it)."""
    return failed(
        outcome,
        Status.MEMORY_LIMIT,
        "MemoryLimit",
        f"the program's files took more than its memory limit ({limits.memory_mb} MB); "
        "write less, or raise limits.memory_mb",
    )


def stopped(outcome: Outcome) -> Outcome:
    """The daemon stopped it (cancel, drain, tool limit); the daemon names the reason."""
    return failed(outcome, Status.CANCELLED, "Cancelled", "the execution was stopped")


def error_info(error: dict[str, Any]) -> ErrorInfo:
    """A guest shim's `{type, message, traceback}` as an `ErrorInfo`."""
    return ErrorInfo(
        type=str(error.get("type", "Error")),
        message=str(error.get("message", "")),
        traceback=str(error.get("traceback", "")),
    )


def error_exit_code(answer: dict[str, Any]) -> int:
    """The exit code of a guest shim's error answer: its `exit_code` when that is a
    nonzero C int (a Python program's `sys.exit(n)`), else 1."""
    code = answer.get("exit_code")
    if type(code) is int and code != 0 and -(2**31) <= code < 2**31:
        return code
    return 1
