"""Owned outputs: a graphed output stays what it was for as long as the target says it does
(``output_lifetime``), and no longer is asked of it.

- every lifetime: eager calls on other inputs leave a kept output unchanged (the output is
  valid once the call returns, and the eager side does not reach the graphed side's buffers);
- ``next call of its key``: so do graphed calls of other keys (where there are others);
- ``owned``: so do later replays of its own key, and its storage is neither graph memory nor
  shared with a later output (a static output buffer is rewritten by every replay).

Both sides make the same calls on the same inputs (where graphed calls are made at all), so a
target that keeps state stays in step; where only eager calls are made, the sides' states are
brought together after them. The output kept is the first a graph gave (the first case is
called up to three times: cudagraph trees run a function's first call eagerly); a last call of
its key, against eager, shows the capture served a later call (witnessed: ``_witness``)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, cast

import torch

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import (
    Lockstep,
    case_of,
    differences,
    draw,
    synchronize,
    tensors_in,
    tolerated,
)
from pytest_cudagraph.conformance._protocol import EXACT, NEXT_CALL_OF_KEY, OWNED, CudaGraphTarget
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.conformance._witness import CALLS_TO_CAPTURE, Witness, labelled
from pytest_cudagraph.engines.captures import CaptureCounter

CASE = 1
LATER_CALLS = 4
SEED = 0


DEFAULT_POOL = (0, 0)  # the caching allocator's own pool; graphs get private ones


def graph_pool_of(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The private (graph) memory pool holding ``tensor``'s storage; None when the storage
    lies in the allocator's default pool, outside the allocator or off CUDA."""
    if tensor.device.type != "cuda":
        return None
    address = tensor.untyped_storage().data_ptr()
    snapshot = cast("Callable[[], list[dict[str, Any]]]", torch.cuda.memory_snapshot)
    for segment in snapshot():  # torch leaves memory_snapshot unannotated
        if segment.get("device") != tensor.device.index:
            continue
        start = segment["address"]
        if start <= address < start + segment["total_size"]:
            pool = tuple(segment["segment_pool_id"])
            return None if pool == DEFAULT_POOL else pool
    return None


@check("owned outputs", sharper_with=("state.sides", "state.reset"), witnessed=True)
def test_owned_outputs(target: CudaGraphTarget, witness: Witness, conclude: Conclude) -> None:
    seen = witness(judge, [target.keys[CASE % len(target.keys)]])
    conclude(seen.judgement, "outputs that did not stay as long as declared:", seen.describe())


def judge(target: CudaGraphTarget, keys: Sequence[Hashable], counter: CaptureCounter) -> Judgement:
    """An output of ``keys[0]`` kept over the later calls its lifetime allows, both sides called
    alike."""
    lifetime = target.output_lifetime
    key = keys[0]
    others = [other for other in target.keys if other != key]
    other_keys = lifetime == NEXT_CALL_OF_KEY and bool(others)
    lockstep = Lockstep(target)
    case = case_of(target, key)
    replays = counter.all_replays
    for call in range(1, CALLS_TO_CAPTURE + 1):  # the output kept: the first a graph gave
        first = draw(target, case, seed=0)  # a draw each: a call may write its inputs
        expected = lockstep.eager(draw(target, case, seed=0), SEED)
        with labelled(counter, case):
            # As it is: the lifetime is what this check judges.
            kept = lockstep.graphed(first, SEED, f"the first case's call {call}", raw=True)
        if counter.all_replays > replays:  # a graph gave it
            break
    snapshot = [tensor.clone() for tensor in tensors_in(kept)]
    problems = [
        f"first call differs from eager: {d}" for d in differences(target, first, expected, kept)
    ]
    later: list[object] = []
    for repeat in range(1, LATER_CALLS + 1):
        later_case = case_of(target, others[repeat % len(others)] if other_keys else key, repeat)
        lockstep.eager(draw(target, later_case, seed=repeat), SEED)
        if other_keys or lifetime == OWNED:  # later graphed calls may not overwrite it
            inputs = draw(target, later_case, seed=repeat)
            with labelled(counter, later_case):
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
    # One more call of the key, read at once: what it answers, and the witness of a capture
    # that served a later call.
    last = case_of(target, key, LATER_CALLS + 1)
    with labelled(counter, last):
        problems += lockstep.judge(lambda: draw(target, last, seed=0), SEED, "a last call")
    problems += lockstep.problems()
    state = f"; {lockstep.describe()}" if lockstep.stateful else ""
    built = f", from the first case's call {call}" if call > 1 else ""
    figure = f"outputs {lifetime}: kept over {between} (key {key!r}{built}){state}"
    return Judgement(problems, figure, len(snapshot), "output tensors kept")
