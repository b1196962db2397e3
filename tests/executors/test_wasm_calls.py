"""The world's two functions (`wasm_calls`), through the real JS component."""

from __future__ import annotations

import gc
import json
import logging
import weakref

import pytest
import wasmtime

from conduit.executors import _wasmtime
from conduit.executors.wasm_instances import Instance, Instances
from tests.executors.conftest import JsComponent
from tests.sandboxes import WAIT_S

# Every width of UTF-8, and the characters JSON escapes.
TEXT = 'plain, é, ☃, 𝄞, "quoted", back\\slash, new\nline'


def run(instances: Instances, body: str, inputs: object = None) -> str:
    """`run` a fresh instance on a program of `body`; the guest's answer, unparsed."""
    instance: Instance = instances.new()
    try:
        instance.install(_wasmtime.Interrupt(WAIT_S))
        request = {"function": f"(async function () {{\n{body}\n}})", "line_offset": 1}
        return instance.run(instance.store, json.dumps({**request, "inputs": inputs}))
    finally:
        instance.close()


def test_strings_cross_the_export_whole_both_ways(js_instances: Instances) -> None:
    answer = run(js_instances, "return [inputs, inputs.length]", inputs=TEXT)
    assert json.loads(answer) == {"result": [TEXT, len(TEXT.encode("utf-16-le")) // 2]}


def test_a_trap_in_the_export_is_raised(js_component: JsComponent) -> None:
    instance = js_component.instances().new()
    try:
        interrupt = _wasmtime.Interrupt(WAIT_S)
        instance.install(interrupt)
        # Stopped before it starts, with its epoch deadline passed: the guest traps at
        # its first check.
        interrupt.stop(_wasmtime.StopReason.CANCELLED)
        js_component.engine.increment_epoch()
        spin = {"function": "(async function () { while (true) {} })", "line_offset": 1}
        # The epoch callback names the reason; without it, Wasmtime's own trap says why.
        by_callback = _wasmtime.stops_by_callback()
        stopped = r"execution stopped \(cancelled\)" if by_callback else "interrupt"
        with pytest.raises(wasmtime.WasmtimeError, match=stopped):
            instance.run(instance.store, json.dumps(spin))
    finally:
        instance.close()


def test_the_import_gets_both_strings_and_its_answer_reaches_the_guest(
    js_component: JsComponent,
) -> None:
    calls: list[tuple[str, str]] = []

    def host_call(method: str, params: str) -> str:
        calls.append((method, params))
        done = [
            [started["ticket"], {"result": {"value": {"echo": started["call"]["params"]}}}]
            for started in json.loads(params)["start"]
        ]
        return json.dumps({"result": done})

    answer = run(
        js_component.instances(host_call), "return await tools.ns.echo({text: inputs})", TEXT
    )
    assert json.loads(answer) == {
        "result": {"echo": {"name": "ns.echo", "arguments": {"text": TEXT}, "shape": "value"}}
    }
    # A tool call is started, and waited for, by the guest's one `calls/wait`.
    assert [method for method, _ in calls] == ["calls/wait"]
    (started,) = json.loads(calls[0][1])["start"]
    assert started["call"]["method"] == "tools/call"
    assert started["call"]["params"]["arguments"] == {"text": TEXT}


def test_an_import_that_raises_traps_the_guest_and_is_logged(
    js_component: JsComponent, caplog: pytest.LogCaptureFixture
) -> None:
    def host_call(_method: str, _params: str) -> str:
        raise RuntimeError("the host broke")

    instances = js_component.instances(host_call)
    with pytest.raises(wasmtime.WasmtimeError, match="host-call failed: RuntimeError: the host br"):
        run(instances, "return await tools.ns.echo({})")
    assert "host-call failed" in caplog.text
    assert any(record.levelno == logging.ERROR for record in caplog.records)
    # The next instance is unharmed.
    assert json.loads(run(instances, "return 1 + 1")) == {"result": 2}


def test_an_import_answering_no_string_traps_the_guest(js_component: JsComponent) -> None:
    instances = js_component.instances(lambda _method, _params: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(wasmtime.WasmtimeError, match="host-call failed: TypeError: it returned"):
        run(instances, "return await tools.ns.echo({})")
    assert json.loads(run(instances, "return 1 + 1")) == {"result": 2}


def test_a_registered_import_is_let_go_with_its_linker(js_component: JsComponent) -> None:
    owner = _Owner()
    instances = js_component.instances(owner.host_call)
    alive = weakref.ref(owner)
    del owner
    gc.collect()
    assert alive() is not None
    del instances
    gc.collect()
    assert alive() is None


class _Owner:
    def host_call(self, _method: str, _params: str) -> str:
        return '{"result": 1}'
