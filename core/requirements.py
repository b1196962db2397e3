"""What the configuration takes as a package requirement for the Python sandboxes.

Requirements come from the trusted configuration but end up on pip's command line
(`executors.packages`): only a name, extras and version specifiers pass. Here, among
the leaves, so that reading a configuration imports nothing but `packaging`.
"""

from __future__ import annotations

from packaging.requirements import InvalidRequirement, Requirement

__all__ = ["MAX_REQUIREMENT_CHARS", "parse_requirement"]

# Longer than any real requirement with a few specifiers.
MAX_REQUIREMENT_CHARS = 200


def parse_requirement(text: str) -> str:
    """`text` as a canonical requirement (a name, extras and version specifiers).

    Raises ValueError, saying why, for anything else: a URL or a path, an
    environment marker, a pip option, text that is no requirement at all.
    """
    if len(text) > MAX_REQUIREMENT_CHARS:
        raise ValueError(f"a requirement is at most {MAX_REQUIREMENT_CHARS} characters")
    if text.lstrip().startswith("-"):
        raise ValueError(f"{text!r} is a pip option, not a requirement")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(f"{text!r} is not a requirement such as 'sympy==1.14.0': {exc}") from None
    if requirement.url:
        raise ValueError(f"{text!r} names a URL or a file: name a package on the index instead")
    if requirement.marker is not None:
        raise ValueError(f"{text!r} has an environment marker: list the package without it")
    return str(requirement)
