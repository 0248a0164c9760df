"""Output storage: every graphed output owns its memory. Over rounds of calls on a few cached
keys, no output tensor shares storage (views included) with the call's inputs, the eager
output of those inputs, or any output kept from an earlier call. A graph that hands back its
static output buffer, a view of it, or an input it wrote into is caught by name.

Outputs the target says are valid only until the next call of their key (or of any key) may
share storage with earlier outputs of that key (or of any key): that is their contract, which
the owned-outputs check holds them to. Sharing with the call's inputs or eager output never
is. A graph's outputs lie where its capture put them, so the check's captures are witnessed
(``witness``): seeing none, it has one made."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import (
    Episodes,
    calls_over_keys,
    draw,
    first_keys,
    graphed_path,
)
from pytest_cudagraph.conformance._protocol import (
    NEXT_CALL,
    NEXT_CALL_OF_KEY,
    Cache,
    CudaGraphTarget,
)
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.conformance._witness import Witness, labelled
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.storage import storage_overlaps

MAX_KEYS = 4
ROUNDS = 3  # the first captures each key, the later ones replay it


@check("output storage", sharper_with=("cache.capacity",), witnessed=True)
def test_output_storage(
    target: CudaGraphTarget, cache: Cache | None, witness: Witness, conclude: Conclude
) -> None:
    keys = first_keys(target, MAX_KEYS, cache.capacity if cache is not None else None)
    seen = witness(judge, keys)
    conclude(seen.judgement, "graphed outputs that do not own their memory:", seen.describe())


def judge(target: CudaGraphTarget, keys: Sequence[Hashable], counter: CaptureCounter) -> Judgement:
    """Each call's output, against its inputs, its eager output and what earlier calls kept."""
    # Every input and output stays alive to the end: memory freed by one call and handed to
    # the next would look shared when it is not.
    kept: dict[str, tuple[object, object]] = {}  # description -> (key, value)
    problems = []
    episodes = Episodes(target)
    for call, case in calls_over_keys(target, keys, range(ROUNDS)):
        episodes.begin()
        inputs = draw(target, case, seed=case.number)
        key = case.key
        name = f"call {call} (key {key!r})"
        expected = target.eager(draw(target, case, seed=case.number))
        with labelled(counter, case):
            output = graphed_path(target)(inputs)
        earlier = {
            what: value
            for what, (earlier_key, value) in kept.items()
            if not may_share(target, key, earlier_key, what)
        }
        others = {"its inputs": inputs, "its eager output": expected, **earlier}
        problems += [
            overlap.describe()
            for overlap in storage_overlaps(output, others, path=f"{name}: output")
        ]
        kept[f"{name}'s output"] = (key, output)
        kept[f"{name}'s inputs"] = (key, inputs)
    calls = ROUNDS * len(keys)
    figure = f"{calls} calls over {len(keys)} keys: {len(problems)} shared storage(s)"
    return Judgement(problems, figure, calls, "outputs checked")


def may_share(target: CudaGraphTarget, key: object, earlier_key: object, what: str) -> bool:
    """Whether an output of ``key`` may share storage with ``what``, kept from a call of
    ``earlier_key``: an earlier output, when the declared lifetime lets the next call overwrite it."""
    if not what.endswith("'s output"):
        return False
    if target.output_lifetime == NEXT_CALL:
        return True
    return target.output_lifetime == NEXT_CALL_OF_KEY and key == earlier_key
