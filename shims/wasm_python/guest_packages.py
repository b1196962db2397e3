"""The wasm-python guest with the operator's packages (see executors/packages.py).

Built instead of `guest` when the configuration lists packages. The build unpacks their
wheels into `packages/`, compiled beforehand by `packages_compile`; the host keeps that
directory with the component and mounts it read-only at PACKAGES in every instance.
The instance's first call puts PACKAGES on `sys.path`: searched at build time, where
the directory is not, it would be remembered as empty.
"""

import sys

import guest

PACKAGES = "/packages"


class PackagesWorld(guest.WitWorld):
    def run(self, request: str) -> str:
        if not request and PACKAGES not in sys.path:
            sys.path.append(PACKAGES)
        return super().run(request)


# The name componentize-py looks the world's exports up by.
WitWorld = PackagesWorld
