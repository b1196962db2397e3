"""A smolagents remote Python executor backed by Conduit: a `CodeAgent`'s steps run in a
Conduit sandbox instead of the agent's own process.

```python
from conduit.client import Client
from conduit.integrations.smolagents import ConduitExecutor

executor = ConduitExecutor(Client(), allowed_tools=["echo.*"])
with CodeAgent(tools=[], model=model, executor=executor,
               instructions=executor.sdk_instructions()) as agent:
    agent.run("Add 2 and 3 with the echo tools")
```

It follows smolagents' own remote executors (E2B, Docker): the agent's tools, its
`final_answer` included, are sent into the sandbox as source (`send_tools`) and run
there, so a tool works only if its code runs in a sandbox (the standard library, no
network); the answer comes back as the `FinalAnswerException` those executors use. The
daemon's own tools are callable from the code as `tools.<namespace>.<tool>(...)`; show
them to the model with `sdk_instructions()`.

State: the executor keeps one Conduit session from its first step until `cleanup()`
(`with CodeAgent(...) as agent:` calls it), so the variables of one step are there for
the next, as in smolagents' other executors. A step that resets the session (a timeout,
the memory cap) or a session that expired is followed by the tools and variables being
sent again. Against a daemon without sessions, or with `use_session=False`, every step
runs in a fresh sandbox with the tools' definitions and the variables before it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from conduit.integrations._extras import missing_extra

try:
    from smolagents.local_python_executor import CodeOutput
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import RemotePythonExecutor
    from smolagents.serialization import SafeSerializer
    from smolagents.tools import Tool, get_tools_definition_code
    from smolagents.utils import AgentError
except ModuleNotFoundError as exc:
    raise missing_extra("smolagents", "smolagents", "smolagents") from exc

from conduit.client import (
    Client,
    ConduitError,
    ExecutionResult,
    MethodNotFound,
    NotFound,
    Session,
)
from conduit.integrations._programs import bounded

__all__ = ["ConduitExecutor"]

# Told the model after a step that ended the session's sandbox (a timeout, a memory
# limit): what it defined before is gone.
RESET_NOTICE = (
    "[the sandbox was reset: variables and functions from earlier steps are gone; "
    "the agent's tools and variables are defined again]"
)


class ConduitExecutor(RemotePythonExecutor):
    """Runs a `CodeAgent`'s code in Conduit (`CodeAgent(..., executor=ConduitExecutor())`).

    `client` is the connection to use (a new `Client()`, from CONDUIT_SOCKET and
    CONDUIT_TOKEN, if None; closed by `cleanup()` only then). `allowed_tools` and
    `limits` are those of `execute`. Errors of the connection or the daemon are raised
    as `conduit.client` errors; a program that fails raises smolagents' `AgentError`,
    which the agent shows the model.
    """

    def __init__(
        self,
        client: Client | None = None,
        *,
        allowed_tools: Iterable[str] | None = None,
        limits: Mapping[str, int] | None = None,
        use_session: bool = True,
        logger: AgentLogger | None = None,
        allow_pickle: bool = False,
    ) -> None:
        # Conduit installs nothing at run time: there are no additional imports to add.
        super().__init__([], logger or AgentLogger(level=LogLevel.INFO), allow_pickle)
        self.client = client if client is not None else Client()
        self._owns_client = client is None
        self.allowed_tools = list(allowed_tools) if allowed_tools is not None else None
        self.limits = dict(limits) if limits is not None else None
        self.use_session = use_session
        self._session: Session | None = None
        self._sandbox_is_new = True
        # Run again in a fresh sandbox: the tools' definitions, then the variables.
        self._tools_code = ""
        self._variables_code = ""

    def __repr__(self) -> str:
        where = self._session.session_id if self._session else "no session"
        return f"<ConduitExecutor {self.client.endpoint} {where}>"

    # ---- what the agent calls -----------------------------------------------------------

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        """Run one step; its output, or the final answer. Raises `AgentError` for a
        program that did not end `ok`, with what the model needs to fix it."""
        result = self._run(code)
        logs = bounded(result.stdout + result.stderr)
        if result.session_reset:
            logs += f"\n{RESET_NOTICE}"
        if result.error is not None and result.error.type == self.FINAL_ANSWER_EXCEPTION:
            # Never unpickled, whatever `allow_pickle` says: the sandbox's program writes
            # this message, and our `final_answer` only ever sends "safe:" answers.
            answer = self._deserialize_final_answer(result.error.message, False)
            return CodeOutput(output=answer, logs=logs, is_final_answer=True)
        if not result.ok:
            raise AgentError(_failure(result, logs), self.logger)
        return CodeOutput(output=result.result, logs=logs, is_final_answer=False)

    def send_tools(self, tools: dict[str, Tool]) -> None:
        """Define the agent's tools in the sandbox, from their source, as smolagents'
        remote executors do; `final_answer` is patched to raise the answer back."""
        if "final_answer" in tools:
            self._patch_final_answer_with_exception(tools["final_answer"])
        self._tools_code = get_tools_definition_code(tools) if tools else ""
        self._define(self._tools_code)
        # smolagents shows the model any error of a step, but raises those of this call:
        # a daemon that is not there, or a config it refuses, stops the run here.
        self.client.sdk("python", allowed_tools=self.allowed_tools)
        if self.use_session:
            self._open_session()

    def send_variables(self, variables: dict[str, Any]) -> None:
        """Define the agent's state (its `additional_args`) in the sandbox."""
        self._variables_code = _variables_code(variables, self.allow_pickle) if variables else ""
        self._define(self._variables_code)

    def _patch_final_answer_with_exception(self, final_answer_tool: Tool) -> None:
        """Make `final_answer` raise its answer back, as smolagents' remote executors do,
        but with a `forward` that imports only `json`: smolagents moves every import of
        the method it sends to the top of the tool's source, and its own `forward`
        imports PIL and numpy, which a Conduit sandbox does not have."""
        if getattr(final_answer_tool, "_forward", None) is not None:
            return  # patched for an earlier run: patching again would make it call itself
        original = final_answer_tool.forward.__func__

        # A class statement, not type(), with its methods set afterwards: smolagents reads
        # the class's source and refuses methods assigned in its body.
        class _FinalAnswerTool(final_answer_tool.__class__):  # type: ignore[misc,name-defined]
            pass

        _FinalAnswerTool.forward = _final_answer_forward  # type: ignore[method-assign]
        _FinalAnswerTool._forward = original  # type: ignore[attr-defined]
        original.__source__ = inspect.getsource(original).replace("def forward(", "def _forward(")
        final_answer_tool.__class__ = _FinalAnswerTool

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Conduit's sandboxes install nothing at run time (the operator chooses their
        packages, docs/packages.md): say so rather than let `pip` fail in the sandbox."""
        if additional_imports:
            self.logger.log(
                f"Conduit installs no packages at run time; not installed: {additional_imports}",
                level=LogLevel.INFO,
            )
        return []

    def sdk_instructions(self, language: str = "python") -> str:
        """Text for the agent's `instructions`: the typed declarations (`sdk/get`) of the
        daemon's tools the code may call, for exactly `allowed_tools`."""
        declarations = self.client.sdk(language, allowed_tools=self.allowed_tools)
        return (
            "Besides the tools above, your code can call these tools through the `tools` "
            f"object, synchronously:\n```python\n{declarations}\n```"
        )

    def cleanup(self) -> None:
        """Close the session (and the client, if this executor made it); idempotent."""
        session, self._session = self._session, None
        try:
            if session is not None and not session.closed:
                # Expired, or the daemon is gone: nothing left to close, and the error
                # that ended the run (if one did) is the one to see.
                with contextlib.suppress(ConduitError):
                    session.close()
        finally:
            if self._owns_client:
                self.client.close()

    # ---- how a step runs ----------------------------------------------------------------

    def _define(self, code: str) -> None:
        """Have definitions sent before the next step: into the session once, or into
        every fresh sandbox when there is no session."""
        if code:
            self._sandbox_is_new = True

    def _run(self, code: str) -> ExecutionResult:
        if self.use_session:
            session = self._open_session()
            if session is not None:
                return self._step(session, code)
        prelude = [self._tools_code, self._variables_code]
        program = "\n".join([*(part for part in prelude if part), code])
        return self.client.execute(
            program, language="python", allowed_tools=self.allowed_tools, limits=self.limits
        )

    def _open_session(self) -> Session | None:
        """The session, opened on the first step; None against a daemon without sessions
        (the executor then runs every step in a fresh sandbox)."""
        if self._session is None:
            try:
                self._session = self.client.open_session("python", limits=self.limits)
            except MethodNotFound:
                self.logger.log("The daemon has no sessions: each step runs in a fresh sandbox")
                self.use_session = False
                return None
            self._sandbox_is_new = True
        return self._session

    def _step(self, session: Session, code: str, *, replace: bool = True) -> ExecutionResult:
        try:
            if self._sandbox_is_new:
                self._redefine(session)
                self._sandbox_is_new = False
            result = session.execute(code, allowed_tools=self.allowed_tools, limits=self.limits)
        except NotFound:
            if not replace:
                raise
            # It expired while the agent was thinking: a new one, with the definitions.
            self._session = None
            return self._step(self._open_session() or session, code, replace=False)
        self._sandbox_is_new = result.session_reset
        return result

    def _redefine(self, session: Session) -> None:
        """Send the tools and variables into a sandbox that has none of them yet."""
        for code in (self._tools_code, self._variables_code):
            if code:
                result = session.execute(code, allowed_tools=self.allowed_tools)
                if not result.ok:
                    raise AgentError(_failure(result, result.stdout + result.stderr), self.logger)


def _final_answer_forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    """`final_answer` in the sandbox: the answer as JSON (what JSON cannot hold, as its
    repr), raised as the exception `run_code_raise_errors` looks for. Sent as source:
    it must stand alone."""
    import json

    class FinalAnswerException(BaseException):
        pass

    answer = self._forward(*args, **kwargs)
    raise FinalAnswerException("safe:" + json.dumps(answer, default=repr))


# What smolagents sends for it: the method under the name it has on the tool.
_final_answer_forward.__source__ = inspect.getsource(_final_answer_forward).replace(  # type: ignore[attr-defined]
    "def _final_answer_forward(", "def forward(", 1
)


def _variables_code(variables: dict[str, Any], allow_pickle: bool) -> str:
    """The program that defines `variables` as globals: smolagents' own serializer, as
    its remote executors send them."""
    serialized = SafeSerializer.dumps(variables, allow_pickle=allow_pickle)
    deserializer = SafeSerializer.get_deserializer_code(allow_pickle)
    return f"{deserializer}\nglobals().update(_deserialize({serialized!r}))\n"


def _failure(result: ExecutionResult, logs: str) -> str:
    """The error the model sees, in the shape of smolagents' E2B executor's."""
    error = result.error
    kind, message, traceback = (
        (error.type, error.message, error.traceback) if error else ("", "", "")
    )
    return (
        f"{logs}\nExecuting code yielded an error (status {result.status}):\n"
        f"{kind}\n{bounded(message)}\n{bounded(traceback)}"
    )
