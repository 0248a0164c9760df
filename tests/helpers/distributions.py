"""What an installed distribution registers, read from its metadata."""

from __future__ import annotations

import importlib.metadata

from pytest_cudagraph.conformance._loading import ENTRY_POINT_GROUP


def registered_targets(distribution: str) -> dict[str, str]:
    """The conformance targets ``distribution`` registers: name -> ``module:factory``."""
    found = importlib.metadata.distribution(distribution).entry_points
    return {entry.name: entry.value for entry in found if entry.group == ENTRY_POINT_GROUP}
