"""One tool model: what `tools/list` sends is what the client reads."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from conduit.client import Tool as ClientTool
from conduit.core.tools import Tool
from conduit.gateway.model import UpstreamTool

text = st.text()
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
objects = st.dictionaries(text, json_scalars, max_size=3)
# The wire leaves an empty output schema or annotations out: they read back as None.
present = st.none() | objects.filter(bool)
tools = st.builds(
    Tool,
    name=text,
    description=text,
    input_schema=objects,
    output_schema=present,
    path=st.none() | text,
    upstream=st.none() | text,
    annotations=present,
)


@given(tools)
def test_a_tool_round_trips_through_its_wire_form(tool: Tool) -> None:
    assert Tool.from_wire(tool.to_wire()) == tool


def test_the_client_reads_the_core_tool() -> None:
    assert ClientTool is Tool


def test_an_upstream_tool_is_listed_by_id_with_its_names() -> None:
    tool = UpstreamTool("echo__add", "echo", "add", "echo", "add", "Add two numbers.")
    assert tool.listed().to_wire() == {
        "name": "echo__add",
        "description": "Add two numbers.",
        "inputSchema": {"type": "object"},
        "_meta": {"conduit/path": "echo.add", "conduit/upstream": "echo"},
    }


def test_a_built_in_tool_is_listed_without_conduit_names() -> None:
    tool = Tool("execute_python", "Run Python.", {"type": "object"}, {"type": "object"})
    assert tool.to_wire() == {
        "name": "execute_python",
        "description": "Run Python.",
        "inputSchema": {"type": "object"},
        "outputSchema": {"type": "object"},
    }
