"""The installed version, read once from the package metadata."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["VERSION"]

try:
    VERSION = version("conduit")
except PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0.0.0+source"
