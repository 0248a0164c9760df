"""The conformance suite: checks that CUDA-graph code computes what its eager twin computes and
behaves under errors, threads, processes and memory pressure.

A target author imports everything from here: ``CudaGraphTarget``, its capabilities (``Cache``,
``State``, ``Sampling``, ...), ``Tolerance``, the adapters (``compiled``, ``graphed_callables``,
``hand_written``). Run the suite against the one installed target, one chosen by name, or yours::

    pytest --pyargs pytest_cudagraph.conformance
    pytest --pyargs pytest_cudagraph.conformance --cudagraph-target NAME
    pytest --pyargs pytest_cudagraph.conformance --cudagraph-target mypkg.graphs:make_target

Names resolve on first use: the suite's plugin imports this package in every pytest session.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Public name -> the module that defines it.
_EXPORTS = {
    **dict.fromkeys(
        (
            "CudaGraphTarget",
            "TargetOptions",
            "Case",
            "Cache",
            "State",
            "Sampling",
            "Guards",
            "Workers",
            "Fallbacks",
            "CaptureClean",
            "Padding",
            "Trajectory",
            "Tolerance",
            "EXACT",
            "OWNED",
            "NEXT_CALL_OF_KEY",
            "NEXT_CALL",
            "CONCURRENT",
            "SERIAL",
            "SINGLE",
        ),
        "pytest_cudagraph.conformance.protocol",
    ),
    **dict.fromkeys(("TargetError", "validate_target"), "pytest_cudagraph.conformance.loading"),
    **dict.fromkeys(
        ("compiled", "graphed_callables", "hand_written", "InductorSkips"),
        "pytest_cudagraph.conformance.adapters",
    ),
}
__all__ = [
    "CONCURRENT",
    "EXACT",
    "NEXT_CALL",
    "NEXT_CALL_OF_KEY",
    "OWNED",
    "SERIAL",
    "SINGLE",
    "Cache",
    "CaptureClean",
    "Case",
    "CudaGraphTarget",
    "Fallbacks",
    "Guards",
    "InductorSkips",
    "Padding",
    "Sampling",
    "State",
    "TargetError",
    "TargetOptions",
    "Tolerance",
    "Trajectory",
    "Workers",
    "compiled",
    "graphed_callables",
    "hand_written",
    "validate_target",
]

if TYPE_CHECKING:
    from pytest_cudagraph.conformance.adapters import (
        InductorSkips,
        compiled,
        graphed_callables,
        hand_written,
    )
    from pytest_cudagraph.conformance.loading import TargetError, validate_target
    from pytest_cudagraph.conformance.protocol import (
        CONCURRENT,
        EXACT,
        NEXT_CALL,
        NEXT_CALL_OF_KEY,
        OWNED,
        SERIAL,
        SINGLE,
        Cache,
        CaptureClean,
        Case,
        CudaGraphTarget,
        Fallbacks,
        Guards,
        Padding,
        Sampling,
        State,
        TargetOptions,
        Tolerance,
        Trajectory,
        Workers,
    )


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_cudagraph.conformance' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
