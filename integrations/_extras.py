"""The error an integration raises when its framework is not installed: it names the
extra that brings the framework in."""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra(module: str, needs: str, extra: str) -> ModuleNotFoundError:
    """What `conduit.integrations.<module>` raises without `needs` (from `extra`)."""
    return ModuleNotFoundError(
        f"conduit.integrations.{module} needs {needs}: pip install 'conduit[{extra}]'"
    )
