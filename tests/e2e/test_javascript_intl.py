"""JavaScript that uses Intl runs where Intl works, and the result says where.

wasm-js, the default for JavaScript, has no ICU (componentize-js's SpiderMonkey is built
without it): with no executor named, a program using `Intl` or a locale-taking method
runs on `deno`; named, wasm-js runs it as it is. Real Deno and the real component.
"""

from __future__ import annotations

from typing import Any

from tests.e2e.helpers import execute

FORMATS = """
const number = new Intl.NumberFormat("de-DE", { style: "currency", currency: "EUR" });
const date = new Intl.DateTimeFormat("en-GB", {
  timeZone: "Asia/Tokyo", dateStyle: "long", timeStyle: "short",
});
const sorted = ["z", "ä", "a"].sort(new Intl.Collator("de").compare);
({
  number: number.format(1234.5),
  date: date.format(new Date(0)),
  sorted,
  grouped: (1234567.891).toLocaleString("en-US"),
})
"""


async def test_a_program_using_intl_runs_on_deno_and_says_so(client: Any) -> None:
    result = await execute(client, FORMATS, language="javascript")
    assert (result["status"], result["executor"]) == ("ok", "deno"), result
    assert result["result"] == {
        "number": "1.234,50\u00a0€",
        "date": "1 January 1970 at 09:00",
        "sorted": ["a", "ä", "z"],
        "grouped": "1,234,567.891",
    }
    plain = await execute(client, "[3, 1, 2].sort()", language="javascript")
    assert (plain["executor"], plain["result"]) == ("wasm-js", [1, 2, 3])


async def test_named_wasm_js_runs_it_as_it_is(client: Any) -> None:
    result = await execute(client, FORMATS, language="javascript", executor="wasm-js")
    assert (result["status"], result["executor"]) == ("error", "wasm-js"), result
    assert result["error"]["type"] == "ReferenceError"
    assert "Intl" in result["error"]["message"]


async def test_without_deno_wasm_js_runs_it(start_daemon: Any, connect: Any) -> None:
    _, info = await start_daemon(executors={"deno": {"enabled": False}})
    client = await connect(info)
    result = await execute(client, "typeof Intl", language="javascript")
    assert (result["status"], result["executor"], result["result"]) == (
        "ok",
        "wasm-js",
        "undefined",
    )
