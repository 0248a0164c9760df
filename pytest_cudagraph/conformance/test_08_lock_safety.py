"""Lock safety: a fault injected at each stage (warm-up, capture, replay, and any other the
target names) leaves the lock free and no half-built entry, and the next call is correct.

Build stages fail on a key not yet cached; the others on a cached key, with new inputs."""

from __future__ import annotations

from collections.abc import Callable

from pytest_cudagraph.conformance.support import differences, draw, lock_was_held, skip_without
from pytest_cudagraph.conformance.target import CudaGraphTarget
from pytest_cudagraph.engines.faults import FaultInjector
from pytest_cudagraph.skips import needs_cuda

BUILD_STAGES = ("warm_up", "capture")


class InjectedFault(RuntimeError):
    pass


@needs_cuda
def test_lock_safety(
    target: CudaGraphTarget,
    fault_injector: FaultInjector,
    record_figure: Callable[[str], None],
) -> None:
    skip_without(target, "fault_points", "lock", "reset")
    problems = []
    for case, (stage, (owner, method)) in enumerate(target.fault_points.items()):
        target.reset()
        if stage not in BUILD_STAGES:
            target.graphed(draw(target, case, seed=0))
        cached_before = set(target.cached_keys()) if target.cached_keys else set()
        inputs = draw(target, case, seed=1)
        fault = fault_injector.fail(owner, method, exc=InjectedFault(f"fault at {stage}"))
        try:
            returned = target.graphed(inputs)
        except Exception:
            returned = None
        finally:
            fault_injector.restore()
        if not fault.raised:
            problems.append(f"{stage}: {method} was never called, so no fault was injected")
            continue
        if lock_was_held(target):
            problems.append(f"{stage}: the lock was still held after the fault (released to go on)")
        if target.cached_keys is not None:
            left = set(target.cached_keys()) - cached_before
            if left:
                problems.append(
                    f"{stage}: the failed call left keys {sorted(map(repr, left))} cached"
                )
        expected = target.eager(inputs)
        if returned is not None:  # the target recovered by itself; it must still be right
            problems += [
                f"{stage}: recovered call: {d}"
                for d in differences(expected, returned, target.tolerance)
            ]
        problems += [
            f"{stage}: next call: {d}"
            for d in differences(expected, target.graphed(inputs), target.tolerance)
        ]
    stages = ", ".join(target.fault_points)
    checked = "lock, entries, next call" if target.cached_keys else "lock, next call"
    record_figure(f"faults at {stages}: {checked} checked")
    assert not problems, "\n".join(problems)
