"""A LangChain tool that runs a program in Conduit (on `langchain-core` alone).

```python
from conduit.client import Client
from conduit.integrations.langchain import ConduitTool

with Client() as client:
    execute = ConduitTool.from_client(client, allowed_tools=["echo.*"])
    execute.invoke({"code": "tools.echo.add(a=2, b=3)"})   # '{"status": "ok", ...}'
```

The tool (`execute_python`, or `execute_<language>`) takes `code` and answers in
LangChain's `content_and_artifact` form: the content the model reads is JSON text,
`{status, result, stdout, stderr, error}`, and the artifact is the whole
`ExecutionResult` for the application. A program that fails is such an answer;
errors of the connection or the daemon are raised as `conduit.client` errors.

`from_client` takes a blocking `Client` (`invoke`, and `ainvoke` in a worker thread);
`afrom_client` an `AsyncClient` opened in the event loop the tool runs in (`ainvoke`
only). The description holds the typed `tools.*` declarations (`sdk/get`) for exactly
`allowed_tools`, asked for once, when the tool is made.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from conduit.integrations._extras import missing_extra

try:
    from langchain_core.tools import BaseTool
    from pydantic import BaseModel, Field
except ModuleNotFoundError as exc:
    raise missing_extra("langchain", "langchain-core", "langchain") from exc

from conduit.client import AsyncClient, Client, ExecutionResult
from conduit.integrations._programs import LANGUAGES, describe_tool, outcome

__all__ = ["ConduitTool", "ProgramArgs"]


class ProgramArgs(BaseModel):
    """What the model passes: the program."""

    code: str = Field(description="The whole program.")


class ConduitTool(BaseTool):
    """Runs one program per call in a fresh Conduit sandbox; make it with
    `from_client` or `afrom_client`."""

    name: str = "execute_python"
    description: str = "Run a Python program in a Conduit sandbox."
    args_schema: type[BaseModel] = ProgramArgs
    response_format: str = "content_and_artifact"
    client: Any = Field(exclude=True)
    language: str = "python"
    allowed_tools: list[str] | None = None
    limits: dict[str, int] | None = None

    @classmethod
    def from_client(
        cls,
        client: Client,
        *,
        language: str = "python",
        allowed_tools: Iterable[str] | None = None,
        limits: Mapping[str, int] | None = None,
    ) -> ConduitTool:
        """A tool on a blocking `Client`, which the caller keeps open and closes."""
        allowed = _checked(language, allowed_tools)
        declarations = client.sdk(language, allowed_tools=allowed)
        return cls._made(client, language, allowed, limits, declarations)

    @classmethod
    async def afrom_client(
        cls,
        client: AsyncClient,
        *,
        language: str = "python",
        allowed_tools: Iterable[str] | None = None,
        limits: Mapping[str, int] | None = None,
    ) -> ConduitTool:
        """A tool on an `AsyncClient` (for `ainvoke`), which the caller keeps open."""
        allowed = _checked(language, allowed_tools)
        declarations = await client.sdk(language, allowed_tools=allowed)
        return cls._made(client, language, allowed, limits, declarations)

    @classmethod
    def _made(
        cls,
        client: Client | AsyncClient,
        language: str,
        allowed: list[str] | None,
        limits: Mapping[str, int] | None,
        declarations: str,
    ) -> ConduitTool:
        return cls(
            name=f"execute_{language}",
            description=describe_tool(language, declarations),
            client=client,
            language=language,
            allowed_tools=allowed,
            limits=dict(limits) if limits is not None else None,
        )

    def _run(self, code: str, **kwargs: Any) -> tuple[str, ExecutionResult]:
        if not isinstance(self.client, Client):
            raise TypeError("this tool runs on an AsyncClient: call ainvoke, not invoke")
        # One call at a time on a blocking client, which is not thread-safe: LangGraph
        # runs a turn's tool calls in threads at once.
        with _lock_of(self.client):
            result = self.client.execute(
                code, language=self.language, allowed_tools=self.allowed_tools, limits=self.limits
            )
        return _answer(result)

    async def _arun(self, code: str, **kwargs: Any) -> tuple[str, ExecutionResult]:
        if not isinstance(self.client, AsyncClient):
            return await super()._arun(code, **kwargs)  # _run, in a worker thread
        result = await self.client.execute(
            code, language=self.language, allowed_tools=self.allowed_tools, limits=self.limits
        )
        return _answer(result)


def _checked(language: str, allowed_tools: Iterable[str] | None) -> list[str] | None:
    if language not in LANGUAGES:
        raise ValueError(f"no execute tool for {language!r}; choose from {sorted(LANGUAGES)}")
    return list(allowed_tools) if allowed_tools is not None else None


def _answer(result: ExecutionResult) -> tuple[str, ExecutionResult]:
    """LangChain's content and artifact: JSON for the model, the result for the caller."""
    return json.dumps(outcome(result)), result


_LOCKS: weakref.WeakKeyDictionary[Client, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()


def _lock_of(client: Client) -> threading.Lock:
    """The lock every tool on `client` takes around a call."""
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(client, threading.Lock())
