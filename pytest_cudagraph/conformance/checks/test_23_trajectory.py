"""Trajectory: a decode of many steps on graphs follows the eager decode step for step. Each
call of the other checks is drawn afresh; a decode feeds each step's output into the next, so
the steps share what the code carries from one to the next (a token written only where it
changed, a slot kept per row, a key that changes when the sequence outgrows its bucket), and a
fault there shows only several steps in (vLLM #55238, TRT-LLM #13133). The target's
``trajectory`` makes each step's inputs from the last step's; free running each side follows
its own outputs, teacher-forced both follow eager's. The first step whose outputs differ is
reported with its key. A target that keeps state is stepped in lockstep from one state, its
two sides' states compared after each step: the first step after which they parted is named.
One trajectory is one episode: where the state accumulates and ``State.reset`` is given, it
starts from a reset and takes no more steps than an episode holds.

Needs ``trajectory``. 64 steps: 64 eager and 64 graphed calls (about a second on the
reference, whose decode grows each row by one token a step and crosses from one sequence
bucket into the next)."""

from __future__ import annotations

import functools

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import Lockstep, called, differences, draw, numbered
from pytest_cudagraph.conformance._protocol import CudaGraphTarget, Inputs, Trajectory
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.trajectory import first_divergence

STEPS = 64
SEED = 0  # of the first step's inputs; step t runs under seed t


@check("trajectory", needs=("trajectory",), sharper_with=("state.sides", "state.reset"))
def test_trajectory(
    target: CudaGraphTarget,
    trajectory: Trajectory,
    capture_counter: CaptureCounter,
    conclude: Conclude,
) -> None:
    # One trajectory is one episode: no reset inside it.
    lockstep = Lockstep(target, capture_counter, episodes=False)
    most = STEPS
    reset = target.state.reset if target.state is not None else None
    if reset is not None and lockstep.probe is not None and lockstep.probe.model.accumulating:
        called("State.reset", reset)  # the episode from its start, as long as it may be
        most = min(STEPS, lockstep.probe.episode_calls or STEPS)
    keys: list[object] = []

    def graphed(step: int, inputs: Inputs) -> object:
        key = target.key_of(inputs)
        if not keys or keys[-1] != key:
            keys.append(key)
        return lockstep.graphed(inputs, step, f"step {step}, key {key!r}")

    with capture_counter:
        found = first_divergence(
            functools.partial(draw, target, numbered(target, trajectory.case), SEED),
            most,
            lambda step, inputs: lockstep.eager(inputs, step),
            graphed,
            trajectory.next_inputs,
            functools.partial(differences, target),
            teacher_forced=trajectory.teacher_forced,
            copy=trees.cloned,
        )
    fed = "teacher-forced" if trajectory.teacher_forced else "free running"
    steps = most if found is None else found.step
    state = f"; {lockstep.describe()}" if lockstep.stateful else ""
    episode = f" (an episode of {most} calls)" if most < STEPS else ""
    figure = (
        f"{steps} of {most} steps{episode} equal from case {trajectory.case} ({fed}), over "
        f"{len(keys)} key{'s' if len(keys) != 1 else ''} in turn{state}"
    )
    problems = lockstep.problems()
    headline = "the two sides' states parted:"
    if not problems and found is not None:
        key = target.key_of(found.inputs)
        problems = list(found.differences)
        headline = (
            f"step {found.step} of a {fed} trajectory from case {trajectory.case} (key {key!r}, "
            f"seed {found.step}) differs after {found.step} equal steps:"
        )
    conclude(Judgement(problems, figure, steps + (found is not None), "steps compared"), headline)
