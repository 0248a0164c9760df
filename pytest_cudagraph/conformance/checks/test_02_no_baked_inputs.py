"""No baked inputs: on one cached key, changing any single input (a tensor, one nested in a
container too, or a number given as an input) changes the graphed answer exactly as it changes
the eager one. A graph that baked an input in at capture (upstream baked the encoder memory; a
Python number read at capture is baked into the kernels' arguments) keeps answering for the old
value. The first graphed call must capture, so the check's captures are witnessed
(``_witness``): seeing none, it has one made."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import (
    Episodes,
    case_of,
    differences,
    draw,
    eager_call,
    graphed_call,
    input_tensor_paths,
)
from pytest_cudagraph.conformance._protocol import CudaGraphTarget, Inputs
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.conformance._witness import CALLS_TO_CAPTURE, Witness, labelled
from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.compare import compare_outputs

KEY = 1  # the key (by its place among the keys) whose inputs are changed
OTHER_DRAWS = 4  # draws to take a changed input from, until one changes the eager answer
SEED = 0  # torch's generators, for both sides of every call
NUMBERS = (int, float)


@check("no baked inputs", witnessed=True)
def test_no_baked_inputs(target: CudaGraphTarget, witness: Witness, conclude: Conclude) -> None:
    seen = witness(judge, [target.keys[KEY % len(target.keys)]])
    conclude(seen.judgement, "graphed answers after changing one input:", seen.describe())


def judge(target: CudaGraphTarget, keys: Sequence[Hashable], counter: CaptureCounter) -> Judgement:
    """The first calls capture (until a graph replays); then each input in turn is taken from
    another draw."""
    case = case_of(target, keys[0])

    def base() -> Inputs:
        return draw(target, case, seed=0)

    def changed(path: str, seed: int) -> Inputs:
        other = draw(target, case, seed)
        if path in base() and isinstance(base()[path], NUMBERS):
            return {**base(), path: other[path]}
        swapped: Inputs = trees.with_tensor(base(), path, dict(trees.tensors(other))[path])
        return swapped

    episodes = Episodes(target)

    def both(inputs: Inputs) -> tuple[object, object]:
        # Both sides make every call, so that a target that keeps state stays in step; the
        # graphed side gets tensors of its own, copied before eager may write its inputs.
        episodes.begin()
        own: Inputs = trees.cloned(inputs)
        expected = eager_call(target, inputs, SEED)
        with labelled(counter, case):
            return expected, graphed_call(target, own, SEED)

    key = target.key_of(base())
    replays = counter.all_replays
    for _ in range(CALLS_TO_CAPTURE):
        base_answer, first = both(base())
        if counter.all_replays > replays:  # a graph answered
            break
    problems = [f"first call: {d}" for d in differences(target, base(), base_answer, first)]
    numbers = [name for name, value in base().items() if isinstance(value, NUMBERS)]
    varied: list[str] = []
    for path in [*input_tensor_paths(base()), *numbers]:
        for seed in range(1, OTHER_DRAWS + 1):
            inputs = changed(path, seed)
            if target.key_of(inputs) != key:
                if path not in numbers:
                    problems.append(f"changing {path!r} moved the call off key {key!r}")
                break  # a number that picks the key is the key's, not an input to bake
            expected, actual = both(inputs)
            problems += [
                f"{path} changed: {d}" for d in differences(target, inputs, expected, actual)
            ]
            if not compare_outputs(base_answer, expected):
                continue  # this draw's value happens not to matter; take another
            varied.append(path)
            break
        else:
            if path not in numbers:
                problems.append(
                    f"{path} changed in {OTHER_DRAWS} draws and the eager answer never did; "
                    "draw must vary it in a way that matters"
                )
    figure = f"key {key!r}: changed {', '.join(varied) or 'nothing'} one at a time"
    return Judgement(problems, figure, len(varied), "inputs changed")
