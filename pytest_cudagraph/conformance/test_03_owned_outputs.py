"""Owned outputs: a graphed output stays what it was for as long as the target says it does
(``output_lifetime``), and no longer is asked of it.

- every lifetime: eager calls on other inputs leave a kept output unchanged (the output is
  valid once the call returns, and the eager side does not reach the graphed side's buffers);
- ``next call of its key``: so do graphed calls of other keys (where there are others);
- ``owned``: so do later replays of its own key, and its storage is neither graph memory nor
  shared with a later output (a static output buffer is rewritten by every replay).

Both sides make the same calls on the same inputs (where graphed calls are made at all), so
that a target that keeps state stays in step; where only eager calls are made (outputs valid
until the next call), the two sides' states are brought together after them. The output kept
is the first a graph gave (the first case is called up to three times: cudagraph trees run a
function's first call eagerly), so the check's captures are witnessed (``witness``): seeing
none replayed, it has one made."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pytest_cudagraph.conformance.catalog import given
from pytest_cudagraph.conformance.judging import (
    Lockstep,
    case_in_key,
    differences,
    draw,
    synchronize,
    tensors_in,
    tolerated,
)
from pytest_cudagraph.conformance.protocol import (
    EXACT,
    NEXT_CALL_OF_KEY,
    OWNED,
    CudaGraphTarget,
    State,
)
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.conformance.witness import Factory, Judgement, witnessed
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.skips import needs_cuda

CASE = 1
LATER_CALLS = 4
SEED = 0
# The most calls of the first case made for its output: a graph may be built over several
# (cudagraph trees run the first call of a function eagerly and capture on the next), and the
# output kept is the first one a graph gave.
FIRST_CALLS = 3


DEFAULT_POOL = (0, 0)  # the caching allocator's own pool; graphs get private ones


def graph_pool_of(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The private (graph) memory pool holding ``tensor``'s storage; None when the storage
    lies in the allocator's default pool, outside the allocator or off CUDA."""
    if tensor.device.type != "cuda":
        return None
    address = tensor.untyped_storage().data_ptr()
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device") != tensor.device.index:
            continue
        start = segment["address"]
        if start <= address < start + segment["total_size"]:
            pool = tuple(segment["segment_pool_id"])
            return None if pool == DEFAULT_POOL else pool
    return None


@needs_cuda
def test_owned_outputs(
    target: CudaGraphTarget,
    capture_counter: CaptureCounter,
    target_factory: Factory | None,
    record_figure: FigureRecorder,
) -> None:
    seen = witnessed(target, capture_counter, judge, [CASE % target.num_keys], target_factory)
    record_figure(f"{seen.judgement.figure}; {seen.describe()}")
    assert not seen.judgement.problems, "\n".join(seen.judgement.problems)


def judge(target: CudaGraphTarget, keys: Sequence[int], counter: CaptureCounter) -> Judgement:
    """An output of the key numbered ``keys[0]`` kept over the later calls its lifetime allows,
    both sides called alike."""
    lifetime = target.output_lifetime
    key_index = keys[0]
    other_keys = lifetime == NEXT_CALL_OF_KEY and target.num_keys > 1
    lockstep = Lockstep(target, given(target, State, "sides"), given(target, State, "reset"))
    for call in range(1, FIRST_CALLS + 1):
        first = draw(target, key_index, seed=0)  # a draw each: a call may write its inputs
        expected = lockstep.eager(draw(target, key_index, seed=0), SEED)
        # As it is: the lifetime is what this check judges.
        kept = lockstep.graphed(first, SEED, f"the first case's call {call}", raw=True)
        if counter.all_replays:  # a graph gave it
            break
    snapshot = [tensor.clone() for tensor in tensors_in(kept)]
    problems = [
        f"first call differs from eager: {d}" for d in differences(target, first, expected, kept)
    ]
    later: list[object] = []
    for repeat in range(1, LATER_CALLS + 1):
        if other_keys:
            case = case_in_key(target, (key_index + repeat) % target.num_keys, repeat)
            if case % target.num_keys == key_index:
                case = case_in_key(target, (key_index + 1) % target.num_keys, repeat)
        else:
            case = case_in_key(target, key_index, repeat)
        lockstep.eager(draw(target, case, seed=repeat), SEED)
        if other_keys or lifetime == OWNED:  # later graphed calls may not overwrite it
            inputs = draw(target, case, seed=repeat)
            later.append(lockstep.graphed(inputs, SEED, f"later call {repeat}", raw=True))
    synchronize(target.device)
    problems += [f"kept output changed: {d}" for d in tolerated(snapshot, tensors_in(kept), EXACT)]
    if not later:
        lockstep.sync()  # eager alone made the later calls
    if lifetime == OWNED:
        later_storages = {t.untyped_storage().data_ptr() for out in later for t in tensors_in(out)}
        for index, tensor in enumerate(tensors_in(kept)):
            pool = graph_pool_of(tensor)
            if pool is not None:
                problems.append(f"output tensor {index} lives in graph memory pool {pool}")
            if tensor.untyped_storage().data_ptr() in later_storages:
                problems.append(f"output tensor {index} shares storage with a later call's output")
    if lifetime == OWNED:
        between = f"{LATER_CALLS} replays of its key and {LATER_CALLS} eager calls"
    elif other_keys:
        between = f"{LATER_CALLS} graphed calls of other keys and {LATER_CALLS} eager calls"
    else:  # valid until the next call, or the next of its key where it is the only key
        between = f"{LATER_CALLS} eager calls"
    problems += lockstep.problems()
    state = f"; {lockstep.describe()}" if lockstep.stateful else ""
    built = f", from the first case's call {call}" if call > 1 else ""
    figure = f"outputs {lifetime}: kept over {between} (key {target.key_of(first)!r}{built}){state}"
    return Judgement(problems, figure)
