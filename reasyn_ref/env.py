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

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def resolve_toggle(name: str, explicit: bool | None) -> bool:
    """explicit if given, else the environment variable, else the upstream default."""
    if name not in TOGGLES:
        raise ValueError(f"unknown toggle {name!r}; known: {', '.join(TOGGLES)}")
    if explicit is not None:
        return bool(explicit)
    raw = os.environ.get(name)
    if raw is None:
        return TOGGLES[name]
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {name}={raw!r} must be 0 or 1")
