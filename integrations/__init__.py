"""Conduit as the code runner of agent frameworks: one small module per framework.

```
conduit.integrations.smolagents     ConduitExecutor: a CodeAgent's steps run in a session
conduit.integrations.pydantic_ai    ConduitToolset: execute_python / execute_typescript
conduit.integrations.openai_agents  conduit_tool(): a FunctionTool that runs a program
conduit.integrations.langchain      ConduitTool: a LangChain tool that runs a program
```

Each module imports its framework when it is imported (install it with the extra of the
same name, e.g. `pip install 'conduit[smolagents]'`), and talks to the daemon through
`conduit.client` only; this package's `__init__` imports no framework, and
`conduit.client` never imports this package.
"""

__all__: list[str] = []
