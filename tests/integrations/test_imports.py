"""The integrations import their framework only when used, and say which extra is
missing when it is not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Each integration module: the package it imports, its distribution and the extra.
MODULES = {
    "smolagents": ("smolagents", "smolagents", "smolagents"),
    "pydantic_ai": ("pydantic_ai", "pydantic-ai-slim", "pydantic-ai"),
    "openai_agents": ("agents", "openai-agents", "openai-agents"),
    "langchain": ("langchain_core", "langchain-core", "langchain"),
    "ray": ("ray", "ray", "ray"),
}
FRAMEWORKS = sorted(framework for framework, _, _ in MODULES.values())


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )


@pytest.mark.no_wasm
@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_missing_framework_names_the_extra_to_install(module: str) -> None:
    framework, distribution, extra = MODULES[module]
    # None in sys.modules: the import fails as if the package were not installed.
    done = _python(
        f"import sys; sys.modules[{framework!r}] = None\nimport conduit.integrations.{module}"
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"ModuleNotFoundError: conduit.integrations.{module} needs {distribution}: "
        f"pip install 'conduit[{extra}]'"
    )


@pytest.mark.no_wasm
def test_the_client_and_the_package_import_no_framework() -> None:
    done = _python(
        "import sys, conduit.client, conduit.integrations\n"
        f"print([name for name in {FRAMEWORKS!r} if name in sys.modules])"
    )
    assert done.stdout.strip() == "[]", done.stderr
