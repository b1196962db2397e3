"""unwrap_fence: one enclosing markdown fence is removed, anything else is left alone."""

from __future__ import annotations

import pytest

from conduit.executors.source import unwrap_fence

UNWRAPPED = [
    pytest.param("```ts\nconst x = 1;\nx\n```", "const x = 1;\nx", id="ts"),
    pytest.param("```typescript\nlet a: number = 1\n```", "let a: number = 1", id="typescript"),
    pytest.param("```js\nconsole.log(1)\n```", "console.log(1)", id="js"),
    pytest.param("```javascript\n1 + 1\n```", "1 + 1", id="javascript"),
    pytest.param("```python\nprint('hi')\n```", "print('hi')", id="python"),
    pytest.param("```py\nx = 1\nx\n```", "x = 1\nx", id="py"),
    pytest.param("```\nplain()\n```", "plain()", id="no-language"),
    pytest.param("~~~ts\nconst a = `b`\n~~~", "const a = `b`", id="tildes"),
    pytest.param("~~~\nx\n~~~~~", "x", id="longer-closing-tildes"),
    pytest.param("````ts\nconst s = '```'\n````", "const s = '```'", id="four-backticks"),
    pytest.param("```ts {linenos}\nx\n```", "x", id="info-string-with-attributes"),
    pytest.param("\n\n  ```ts\nx\n```  \n\n", "x", id="surrounding-blank-lines"),
    pytest.param("```ts\r\nconst x = 1\r\nx\r\n```\r\n", "const x = 1\r\nx", id="crlf"),
    pytest.param("```ts\n\n  indented()\n\n```", "\n  indented()\n", id="blank-lines-kept"),
    pytest.param("```ts\n```", "", id="empty-body"),
    pytest.param("```ts\r\n```\r\n", "", id="empty-body-crlf"),
    pytest.param("\t\n```js\nx\n```\n\t\n", "x", id="blank-lines-with-tabs"),
    pytest.param("  ```py\n  if x:\n      y()\n  ```", "if x:\n    y()", id="indented-fence"),
    pytest.param(
        "```ts\nconst md = `\n~~~\nnot a closing fence\n~~~`\n```",
        "const md = `\n~~~\nnot a closing fence\n~~~`",
        id="other-fence-character-inside",
    ),
    pytest.param(
        "```ts\nconst s = '```ts'\nx\n```", "const s = '```ts'\nx", id="opening-fence-inside"
    ),
    pytest.param("```ts\nx\n```   ", "x", id="closing-fence-trailing-blanks"),
]

UNCHANGED = [
    pytest.param("const x = 1\nx", id="no-fence"),
    pytest.param("const t = `a ${b} c`\nt", id="template-literal"),
    pytest.param("const s = `\n```\n`\ns", id="backticks-inside-template"),
    pytest.param("```ts\nconst x = 1", id="unclosed"),
    pytest.param("Here is the code:\n```ts\nx\n```", id="prose-before"),
    pytest.param("```ts\nx\n```\nThat prints x.", id="prose-after"),
    pytest.param("```ts\na\n```\n\n```ts\nb\n```", id="two-fences"),
    pytest.param("```ts\na\n~~~", id="mismatched-fence-character"),
    pytest.param("````ts\na\n```", id="closing-fence-too-short"),
    pytest.param("```js `x` ```", id="inline-code-span"),
    pytest.param("```js `x`\ny\n```", id="backtick-in-info-string"),
    pytest.param("    ```ts\n    x\n    ```", id="indented-code-block-not-a-fence"),
    pytest.param("``ts\nx\n``", id="two-backticks"),
    pytest.param("", id="empty"),
    pytest.param("```", id="lone-fence"),
    pytest.param("```ts\nx\n```y", id="text-after-closing-fence"),
]


@pytest.mark.parametrize(("code", "expected"), UNWRAPPED)
def test_unwraps_a_single_enclosing_fence(code: str, expected: str) -> None:
    assert unwrap_fence(code) == expected


@pytest.mark.parametrize("code", UNCHANGED)
def test_leaves_anything_else_unchanged(code: str) -> None:
    assert unwrap_fence(code) == code


def test_unwrapping_is_not_repeated() -> None:
    inner = "```ts\nx\n```"
    assert unwrap_fence(f"````md\n{inner}\n````") == inner
