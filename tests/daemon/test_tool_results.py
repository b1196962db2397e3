"""An execution's result as an MCP tool's: text, images beside it, the whole structured."""

from __future__ import annotations

import base64
import json

from conduit.core.files import FileData, returned_files
from conduit.core.results import ExecutionResult
from conduit.daemon.methods.tools import _execution_result

PNG = b"\x89PNG\r\n\x1a\n" + b"\x01" * 16


def test_a_returned_image_is_image_content_and_other_files_are_listed() -> None:
    files = [
        FileData("chart.png", PNG),
        FileData("table.csv", b"a\n1\n"),
        FileData("fake.png", b"no"),
    ]
    result = ExecutionResult("ex_1", "ok", result=1, files=returned_files(files, 10_000))
    tool = _execution_result(result)
    text, *images = tool["content"]
    assert images == [
        {"type": "image", "data": base64.b64encode(PNG).decode(), "mimeType": "image/png"}
    ]
    summary = json.loads(text["text"])
    assert [f["path"] for f in summary["files"]] == ["chart.png", "fake.png", "table.csv"]
    assert "base64" not in summary["files"][0]  # the bytes are in the image and structured
    assert tool["structuredContent"]["files"][0]["base64"] == images[0]["data"]
    assert tool["isError"] is False


def test_an_image_cut_for_the_budget_is_not_shown() -> None:
    result = ExecutionResult("ex_1", "ok", files=returned_files([FileData("c.png", PNG)], 4))
    tool = _execution_result(result)
    assert [part["type"] for part in tool["content"]] == ["text"]
    assert json.loads(tool["content"][0]["text"])["files"][0]["truncated"] is True


def test_an_svg_is_never_image_content_but_its_text_as_a_resource() -> None:
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><image href="https://evil/?d=1"/></svg>'
    result = ExecutionResult("ex_1", "ok", files=returned_files([FileData("a b.svg", svg)], 10_000))
    text, resource = _execution_result(result)["content"]
    assert resource == {
        "type": "resource",
        "resource": {
            "uri": "file:///out/a%20b.svg",
            "mimeType": "image/svg+xml",
            "text": svg.decode(),
        },
    }
