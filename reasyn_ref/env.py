"""The upstream environment toggles; an explicit argument always wins over them."""

from __future__ import annotations

import os

# name -> default when unset
TOGGLES = {
    "REASYN_BATCHED_AR": True,
    "REASYN_BF16": False,
    "REASYN_BUCKET": True,
    "REASYN_CUDAGRAPH": False,
}


def resolve_toggle(name: str, explicit: bool | None) -> bool:
    """``explicit`` if given, else the environment variable, else the upstream default.

    The variable must be "0" or "1" (surrounding whitespace ignored); unset, empty or blank
    means the default. Anything else ("yes", "true", "2") is refused naming the variable.
    """
    if name not in TOGGLES:
        raise ValueError(f"unknown toggle {name!r}; known: {', '.join(TOGGLES)}")
    if explicit is not None:
        if not isinstance(explicit, bool):
            raise TypeError(f"{name}: an explicit setting must be a bool or None, got {explicit!r}")
        return explicit
    value = os.environ.get(name, "").strip()
    if value == "":
        return TOGGLES[name]
    if value not in ("0", "1"):
        raise ValueError(
            f"environment variable {name}={os.environ[name]!r} must be 0 or 1 "
            f"(or unset/empty for the default, {int(TOGGLES[name])})"
        )
    return value == "1"
