"""How an execution ended, worded once for every executor.

Executors observe different things (exit codes, traps, epoch deadlines) but report the
same statuses with the same messages: each message says which limit was hit and what
to do about it. Partial output is always kept.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from conduit.core import jsontext
from conduit.core.jsontext import JsonTextError
from conduit.executors.base import ErrorInfo, Limits, Outcome, Status
from conduit.executors.output import OutputCapture
from conduit.executors.process import describe_returncode

__all__ = [
    "V8_OUT_OF_MEMORY",
    "answered",
    "captured",
    "disk_limit",
    "error_exit_code",
    "error_info",
    "failed",
    "memory_limit",
    "output_limit",
    "process_ended",
    "result_too_large",
    "stopped",
    "timed_out",
]


# How V8 words running out of memory on a Deno process's stderr.
V8_OUT_OF_MEMORY = ("out of memory", "memory allocation of")


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


def disk_limit(outcome: Outcome, limits: Limits) -> Outcome:
    """The program's working directory took, or would have taken, more than
    `limits.disk_mb` (a write refused as a full disk's counts, even if it went on)."""
    return failed(
        outcome,
        Status.DISK_LIMIT,
        "DiskLimit",
        f"the program's files took more than limits.disk_mb ({limits.disk_mb} MB) and it "
        "was stopped; write less, or raise limits.disk_mb",
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


def answered(
    outcome: Outcome,
    payload: bytes,
    is_out_of_memory: Callable[[ErrorInfo], bool],
    sender: str,
) -> Outcome:
    """The outcome a sandbox's shim answered, `{"result"}` or `{"error"}`. Whatever the
    program made its result or error hold (lone surrogates, NaN, huge numbers), this
    never raises: an answer the daemon cannot read makes the execution crash."""
    try:
        message = jsontext.loads(payload, lenient_numbers=True)
    except JsonTextError as exc:
        return _unreadable(outcome, sender, str(exc))
    if not isinstance(message, dict):
        return _unreadable(outcome, sender, "not a JSON object")
    calls = message.get("calls")
    if type(calls) is int and calls > 0:
        outcome.calls_written = calls
    error = message.get("error")
    outcome.exit_code = 0 if error is None else error_exit_code(message)
    if error is None:
        outcome.result = message.get("result")
        return outcome
    if not isinstance(error, dict):
        return _unreadable(outcome, sender, "its error is not a JSON object")
    info = error_info(error)
    outcome.error = info
    # An allocation refused by the memory backstop.
    outcome.status = Status.MEMORY_LIMIT if is_out_of_memory(info) else Status.ERROR
    return outcome


def _unreadable(outcome: Outcome, sender: str, why: str) -> Outcome:
    return failed(
        outcome, Status.CRASHED, "Crashed", f"the {sender} sent an unreadable result: {why}"
    )


def process_ended(outcome: Outcome, returncode: int | None, limits: Limits, what: str) -> Outcome:
    """A sandbox process (`what`) that ended without answering: out of memory, out of
    CPU time, or killed."""
    if returncode is not None and any(sign in outcome.stderr for sign in V8_OUT_OF_MEMORY):
        return memory_limit(outcome, limits)
    if returncode == -signal.SIGXCPU:
        return failed(
            outcome,
            Status.TIMEOUT,
            "Timeout",
            "the program used up its CPU time and was stopped; make it faster, or raise "
            "limits.timeout_ms",
        )
    how = "an unknown cause" if returncode is None else describe_returncode(returncode)
    return failed(outcome, Status.CRASHED, "Crashed", f"the {what} was killed by {how}")
