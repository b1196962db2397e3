"""What the frameworks' code-running tools share: how a tool describes itself to the
model, and what a model is shown of how its program ended. No framework is imported."""

from __future__ import annotations

import json
from typing import Any

from conduit.client import ExecutionResult

__all__ = ["LANGUAGES", "MAX_SHOWN_CHARS", "bounded", "describe_tool", "outcome"]

# What a model is shown of one text (output, a result, an error) at most: a program may
# print megabytes, which would fill the model's context on its next turn. The whole
# result stays with the application (the `ExecutionResult`).
MAX_SHOWN_CHARS = 20_000

# Wire language -> how the model is told to write, the fence of the declarations and
# how a program returns its answer.
LANGUAGES: dict[str, tuple[str, str, str]] = {
    "python": ("Python", "python", "`return value` or a final bare expression"),
    "typescript": ("TypeScript", "ts", "`return value`; top-level `await` works"),
    "javascript": ("JavaScript", "ts", "`return value`; top-level `await` works"),
}


def describe_tool(language: str, declarations: str) -> str:
    """The description of a tool that runs `language` programs: how the program answers,
    and the typed `tools.*` declarations (`sdk/get`) it may call, so the model writes
    against exactly the tools it is allowed."""
    name, fence, answer = LANGUAGES[language]
    return (
        f"Run a {name} program in a fresh sandbox (no files, network or environment) "
        f"and get back how it ended: status, result, stdout, stderr and error. "
        f"The answer is {answer}; it must be JSON. print() output comes back as stdout. "
        "Tool calls made from the program: the `tools` object declared below.\n\n"
        f"```{fence}\n{declarations}\n```"
    )


def bounded(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """`text`, or its start and end with what was left out said between them."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"


def outcome(result: ExecutionResult) -> dict[str, Any]:
    """What the model is shown of a finished program: enough to use its answer or fix
    it (`error` holds type, message and traceback), nothing of the daemon's bookkeeping;
    each text at most MAX_SHOWN_CHARS (`bounded`), a result too long as JSON as text."""
    value = result.result
    if not isinstance(value, bool | int | float | None):  # only text can be long
        text = json.dumps(value, default=str)
        if len(text) > MAX_SHOWN_CHARS:
            value = bounded(text)
    shown: dict[str, Any] = {
        "status": result.status,
        "result": value,
        "stdout": bounded(result.stdout),
        "stderr": bounded(result.stderr),
        "error": None,
    }
    if result.error is not None:
        shown["error"] = {
            "type": result.error.type,
            "message": bounded(result.error.message),
            "traceback": bounded(result.error.traceback),
        }
    return shown
