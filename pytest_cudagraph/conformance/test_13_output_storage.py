"""Output storage: every graphed output owns its memory. Over rounds of calls on a few cached
keys, no output tensor shares storage (views included) with the call's inputs, the eager
output of those inputs, or any output kept from an earlier call. A graph that hands back its
static output buffer, a view of it, or an input it wrote into is caught by name."""

from __future__ import annotations

from collections.abc import Callable

from pytest_cudagraph.conformance.support import case_in_key, draw
from pytest_cudagraph.conformance.target import CudaGraphTarget
from pytest_cudagraph.engines.parity import storage_overlaps
from pytest_cudagraph.skips import needs_cuda

MAX_KEYS = 4
ROUNDS = 3  # the first captures each key, the later ones replay it


@needs_cuda
def test_output_storage(target: CudaGraphTarget, record_figure: Callable[[str], None]) -> None:
    # No more keys than the cache holds, so later rounds replay rather than capture afresh.
    key_count = min(MAX_KEYS, target.num_keys, target.capacity or MAX_KEYS)
    # Every input and output stays alive to the end: memory freed by one call and handed to
    # the next would look shared when it is not.
    kept: dict[str, object] = {}
    problems = []
    for repeat in range(ROUNDS):
        for key_index in range(key_count):
            case = case_in_key(target, key_index, repeat)
            inputs = draw(target, case, seed=case)
            name = f"call {repeat * key_count + key_index} (key {target.key_of(inputs)!r})"
            expected = target.eager(inputs)
            output = target.graphed(inputs)
            others = {"its inputs": inputs, "its eager output": expected, **kept}
            problems += [
                overlap.describe()
                for overlap in storage_overlaps(output, others, path=f"{name}: output")
            ]
            kept[f"{name}'s output"] = output
            kept[f"{name}'s inputs"] = inputs
    calls = ROUNDS * key_count
    record_figure(f"{calls} calls over {key_count} keys: {len(problems)} shared storage(s)")
    assert not problems, "graphed outputs that do not own their memory:\n" + "\n".join(
        problems[:10]
    )
