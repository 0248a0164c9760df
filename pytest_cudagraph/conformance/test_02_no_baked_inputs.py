"""No baked inputs: on one cached key, changing any single input tensor (one nested in a
container too) changes the graphed answer exactly as it changes the eager one. A graph that
baked an input in at capture (upstream baked the encoder memory) keeps answering for the old
value. The first graphed call must capture, so the check's captures are witnessed
(``witness``): seeing none, it has one made."""

from __future__ import annotations

from collections.abc import Sequence

from pytest_cudagraph.conformance.judging import (
    case_in_key,
    differences,
    draw,
    eager_call,
    graphed_call,
    input_tensor_paths,
)
from pytest_cudagraph.conformance.protocol import CudaGraphTarget, Inputs
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.conformance.witness import Factory, Judgement, witnessed
from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.parity import compare_outputs
from pytest_cudagraph.skips import needs_cuda

KEY = 1  # the key (by its index) whose inputs are changed
OTHER_DRAWS = 4  # draws to take a changed input from, until one changes the eager answer
SEED = 0  # torch's generators, for both sides of every call


@needs_cuda
def test_no_baked_inputs(
    target: CudaGraphTarget,
    capture_counter: CaptureCounter,
    target_factory: Factory | None,
    record_figure: FigureRecorder,
) -> None:
    seen = witnessed(target, capture_counter, judge, [KEY % target.num_keys], target_factory)
    record_figure(f"{seen.judgement.figure}; {seen.describe()}")
    problems = seen.judgement.problems
    assert not problems, "graphed answers after changing one input:\n" + "\n".join(problems)


def judge(target: CudaGraphTarget, keys: Sequence[int], counter: CaptureCounter) -> Judgement:
    """The first call captures; then each input tensor in turn is taken from another draw."""
    case = case_in_key(target, keys[0], 0)

    def base() -> Inputs:
        return draw(target, case, seed=0)

    def changed(path: str, seed: int) -> Inputs:
        other = dict(trees.tensors(draw(target, case, seed)))[path]
        return trees.with_tensor(base(), path, other)

    key = target.key_of(base())
    base_answer = eager_call(target, base(), SEED)
    problems = [
        f"first call: {d}"
        for d in differences(target, base(), base_answer, graphed_call(target, base(), SEED))
    ]
    varied = []
    for path in input_tensor_paths(base()):
        for seed in range(1, OTHER_DRAWS + 1):
            if target.key_of(changed(path, seed)) != key:
                problems.append(f"changing {path!r} moved the call off key {key!r}")
                break
            # Both sides make every call, so that a target that keeps state stays in step.
            expected = eager_call(target, changed(path, seed), SEED)
            actual = graphed_call(target, changed(path, seed), SEED)
            problems += [
                f"{path} changed: {d}"
                for d in differences(target, changed(path, seed), expected, actual)
            ]
            if not compare_outputs(base_answer, expected):
                continue  # this draw's value happens not to matter; take another
            varied.append(path)
            break
        else:
            problems.append(
                f"{path} changed in {OTHER_DRAWS} draws and the eager answer never did; "
                "draw must vary it in a way that matters"
            )
    return Judgement(problems, f"key {key!r}: changed {', '.join(varied)} one at a time")
