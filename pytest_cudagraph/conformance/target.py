"""Deprecated: 0.3.0's home of the target protocol, kept until 0.5.0. The protocol is in
``pytest_cudagraph.conformance`` now (``protocol``, ``loading``); every name 0.3.0 gave here is
the same object there. ``python -m pytest_cudagraph.conformance.target`` still lists the
installed targets, as ``pytest-cudagraph targets`` does."""

from pytest_cudagraph.conformance.legacy import REMOVED_IN, warn_at_user
from pytest_cudagraph.conformance.loading import (
    ENTRY_POINT_GROUP,
    TargetError,
    build_target,
    describe_spec,
    installed_lines,
    installed_targets,
    load_factory,
    resolve_spec,
    validate_target,
)
from pytest_cudagraph.conformance.protocol import (
    CONCURRENT,
    EXACT,
    FAULT_STAGES,
    NEXT_CALL,
    NEXT_CALL_OF_KEY,
    OUTPUT_LIFETIMES,
    OWNED,
    SERIAL,
    SINGLE,
    THREAD_MODELS,
    USAGE_ERRORS,
    CudaGraphTarget,
    Inputs,
    Padding,
    Part,
    RealIndex,
    Tolerance,
    Trajectory,
)
from pytest_cudagraph.engines.faults import LockLike

__all__ = [
    "CONCURRENT",
    "ENTRY_POINT_GROUP",
    "EXACT",
    "FAULT_STAGES",
    "NEXT_CALL",
    "NEXT_CALL_OF_KEY",
    "OUTPUT_LIFETIMES",
    "OWNED",
    "SERIAL",
    "SINGLE",
    "THREAD_MODELS",
    "USAGE_ERRORS",
    "CudaGraphTarget",
    "Inputs",
    "LockLike",
    "Padding",
    "Part",
    "RealIndex",
    "TargetError",
    "Tolerance",
    "Trajectory",
    "build_target",
    "describe_spec",
    "installed_targets",
    "load_factory",
    "resolve_spec",
    "validate_target",
]

if __name__ == "__main__":
    print("\n".join(installed_lines()))
else:
    warn_at_user(
        "pytest_cudagraph.conformance.target is 0.3.0's home of the target protocol, kept "
        f"until {REMOVED_IN}; import from pytest_cudagraph.conformance"
    )
