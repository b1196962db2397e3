"""Configuration: the documented file, validation messages, substitution, precedence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from conduit.core.errors import ConfigError
from conduit.daemon.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]


def _keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys |= _keys(annotation, f"{prefix}{name}.")
        elif name != "source":
            keys.add(f"{prefix}{name}")
    return keys


def test_conduit_toml_is_the_defaults_and_documents_every_key() -> None:
    loaded = load_config(ROOT / "conduit.toml", environ={})
    assert loaded.model_dump(exclude={"source"}) == Config().model_dump(exclude={"source"})
    text = (ROOT / "conduit.toml").read_text()
    documented = set(re.findall(r"^#?\s*([a-z_]+)\s*=", text, re.MULTILINE))
    documented |= set(re.findall(r"^#?\s*\[\[(?:[a-z_]+\.)?([a-z_]+)\]\]", text, re.MULTILINE))
    leaves = {key.rsplit(".", 1)[-1] for key in _keys(Config)}
    assert leaves - documented == set()


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "[server]\nsockett = '/tmp/x'\n")
    with pytest.raises(ConfigError, match=r"unknown config key server\.sockett"):
        load_config(path, environ={})


def test_bad_value_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "[limits]\nmax_concurrent_executions = 0\n")
    with pytest.raises(ConfigError, match=r"limits\.max_concurrent_executions"):
        load_config(path, environ={})


def test_invalid_toml_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path, "[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, environ={})


def test_substitution_with_defaults_and_missing_variables(tmp_path: Path) -> None:
    path = _write(tmp_path, '[server]\nsocket = "${SOCK_DIR:-/tmp/d}/c.sock"\n')
    assert load_config(path, environ={}).server.socket == "/tmp/d/c.sock"
    assert load_config(path, environ={"SOCK_DIR": "/run/x"}).server.socket == "/run/x/c.sock"
    missing = _write(tmp_path, '[auth]\ntoken = "${NOPE}"\n')
    with pytest.raises(ConfigError, match=r"auth\.token uses \$\{NOPE\}"):
        load_config(missing, environ={})


def test_precedence_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = _write(tmp_path, '[server]\nsocket = "/tmp/file.sock"\n')
    assert load_config(path, environ={}).server.socket == "/tmp/file.sock"
    env = {"CONDUIT_SOCKET": "/tmp/env.sock"}
    assert load_config(path, environ=env).server.socket == "/tmp/env.sock"
    flags = {"server.socket": "/tmp/flag.sock"}
    assert load_config(path, environ=env, overrides=flags).server.socket == "/tmp/flag.sock"
    assert load_config(environ={"CONDUIT_CONFIG": str(path)}).source == str(path)


def test_non_loopback_tcp_needs_explicit_permission(tmp_path: Path) -> None:
    path = _write(tmp_path, '[server]\ntcp = "0.0.0.0:7780"\n')
    with pytest.raises(ConfigError, match="not a loopback address"):
        load_config(path, environ={})
    allowed = _write(tmp_path, '[server]\ntcp = "0.0.0.0:7780"\nallow_remote_tcp = true\n')
    assert load_config(allowed, environ={}).server.tcp == "0.0.0.0:7780"


def test_mcp_http_is_off_by_default_and_loopback_only(tmp_path: Path) -> None:
    assert load_config(environ={}).mcp_http.listen == ""
    path = _write(tmp_path, '[mcp_http]\nlisten = "0.0.0.0:8766"\n')
    with pytest.raises(ConfigError, match=r"mcp_http\.listen .* not a loopback address"):
        load_config(path, environ={})
    ok = _write(
        tmp_path, '[mcp_http]\nlisten = "[::1]:0"\nallowed_origins = ["https://a.example"]\n'
    )
    assert load_config(ok, environ={}).mcp_http.allowed_origins == ("https://a.example",)
    bad = _write(tmp_path, '[mcp_http]\nlisten = "127.0.0.1:1"\nallowed_origins = ["evil"]\n')
    with pytest.raises(ConfigError, match=r"mcp_http\.allowed_origins"):
        load_config(bad, environ={})


def test_default_limit_above_its_maximum_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "[limits.defaults]\ntimeout_ms = 999999999\n")
    with pytest.raises(ConfigError, match=r"limits\.defaults\.timeout_ms"):
        load_config(path, environ={})


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", environ={})


def test_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    # Anything else would escape the SIGHUP handler, which keeps the old config only
    # on a ConfigError, and stop the daemon.
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path, environ={})


def test_packages_are_kept_canonical(tmp_path: Path) -> None:
    text = (
        "[executors.wasm_python]\npackages = ['Tabulate == 0.9.0', 'sympy[dev]>=1.14,<2']\n"
        "[executors.pyodide]\npackages = ['humanize']\n"
    )
    config = load_config(_write(tmp_path, text), environ={})
    assert config.executors.wasm_python.packages == ("Tabulate==0.9.0", "sympy[dev]<2,>=1.14")
    assert config.executors.pyodide.packages == ("humanize",)
    wasm_js = {"enabled": True, "fuel": 0, "move_after_cpu_ms": 50}
    assert config.executors.wasm_js.model_dump() == wasm_js


@pytest.mark.parametrize(
    ("requirement", "why"),
    [
        ("tabulate @ https://example.com/tabulate.whl", "URL"),
        ("./vendor/tabulate", "not a requirement"),
        ("/tmp/tabulate-0.9.0-py3-none-any.whl", "not a requirement"),
        ("--index-url=https://evil.example/simple", "pip option"),
        ("-r requirements.txt", "pip option"),
        ("tabulate --extra-index-url https://evil.example", "not a requirement"),
        ("tabulate\n--pre", "not a requirement"),
        ("tabulate; python_version > '3'", "environment marker"),
        ("x" * 300, "at most"),
    ],
)
def test_packages_other_than_requirements_are_refused(
    tmp_path: Path, requirement: str, why: str
) -> None:
    text = f"[executors.pyodide]\npackages = [{json.dumps(requirement)}]\n"
    with pytest.raises(ConfigError, match=r"executors\.pyodide\.packages\.0") as refused:
        load_config(_write(tmp_path, text), environ={})
    assert why in str(refused.value)


def test_a_relative_state_dir_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandboxes' directories under it are named on command lines that take no
    relative path (Deno refused them: `--state-dir state` left deno unavailable)."""
    monkeypatch.chdir(tmp_path)
    config = load_config(None, environ={}, overrides={"server.state_dir": "state"})
    assert config.server.state_dir == str(tmp_path / "state")


def test_the_cpu_time_before_a_move_reaches_wasm_js(tmp_path: Path) -> None:
    from conduit.daemon.wiring import build_registry

    heavy = "let n = 0; for (;;) n++"
    settings = (("", 0.05), ("move_after_cpu_ms = 0", None), ("move_after_cpu_ms = 250", 0.25))
    for text, after_s in settings:
        state = f'[server]\nstate_dir = "{tmp_path}"\n[executors.deno]\nenabled = false\n'
        config = load_config(_write(tmp_path, f"{state}[executors.wasm_js]\n{text}\n"), environ={})
        wasm_js = build_registry(config, None)._executors["wasm-js"]
        assert wasm_js.moves(heavy) == after_s, text
