"""Trajectory: a decode of many steps on graphs follows the eager decode step for step. Each
call of the other checks is drawn afresh; a decode feeds each step's output into the next, so
the steps share what the code carries from one to the next (a token written only where it
changed, a slot kept per row, a key that changes when the sequence outgrows its bucket), and a
fault there shows only several steps in (vLLM #55238, TRT-LLM #13133). The target's
``trajectory`` makes each step's inputs from the last step's; free running each side follows
its own outputs, teacher-forced both follow eager's. The first step whose outputs differ is
reported with its key. A target that keeps state is stepped in lockstep from one state, its
two sides' states compared after each step: the first step after which they parted is named.

Needs ``trajectory``. 64 steps: 64 eager and 64 graphed calls (about a second on the
reference, whose decode grows each row by one token a step and crosses from one sequence
bucket into the next)."""

from __future__ import annotations

import functools

from pytest_cudagraph.conformance.catalog import given, needed
from pytest_cudagraph.conformance.judging import Lockstep, differences, draw
from pytest_cudagraph.conformance.protocol import CudaGraphTarget, Inputs, State, Trajectory
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.trajectory import first_divergence
from pytest_cudagraph.skips import needs_cuda

STEPS = 64
SEED = 0  # of the first step's inputs; step t runs under seed t


@needs_cuda
def test_trajectory(
    target: CudaGraphTarget, capture_counter: CaptureCounter, record_figure: FigureRecorder
) -> None:
    trajectory = needed(target, Trajectory)
    # One trajectory is one episode: no reset inside it.
    lockstep = Lockstep(target, given(target, State, "sides"), None, capture_counter)
    keys: list[object] = []

    def graphed(step: int, inputs: Inputs) -> object:
        key = target.key_of(inputs)
        if not keys or keys[-1] != key:
            keys.append(key)
        return lockstep.graphed(inputs, step, f"step {step}, key {key!r}")

    with capture_counter:
        found = first_divergence(
            functools.partial(draw, target, trajectory.case, SEED),
            STEPS,
            lambda step, inputs: lockstep.eager(inputs, step),
            graphed,
            trajectory.next_inputs,
            functools.partial(differences, target),
            teacher_forced=trajectory.teacher_forced,
            copy=trees.cloned,
        )
    fed = "teacher-forced" if trajectory.teacher_forced else "free running"
    steps = STEPS if found is None else found.step
    state = f"; {lockstep.describe()}" if lockstep.stateful else ""
    record_figure(
        f"{steps} of {STEPS} steps equal from case {trajectory.case} ({fed}), over "
        f"{len(keys)} key{'s' if len(keys) != 1 else ''} in turn{state}"
    )
    assert not lockstep.problems(), "\n".join(lockstep.problems())
    if found is not None:
        key = target.key_of(found.inputs)
        raise AssertionError(
            f"step {found.step} of a {fed} trajectory from case {trajectory.case} (key {key!r}, "
            f"seed {found.step}) differs after {found.step} equal steps:\n"
            + "\n".join(found.differences[:10])
        )
