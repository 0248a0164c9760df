"""Replay order: graphs replayed in other orders than they were captured in, the reverse and
A-B-A, each answer as eager does, and tensors that live outside the graphs (canaries the check
lays before and between the captures) keep their values. Graphs that share a memory pool are
safe in any order only while none keeps data in memory another's capture took from the pool
(PyTorch's test_graph_three_successive; ROCm aiter #5393: a buffer allocated in the pool after
capture aliases a graph's freed temporaries); a graph that writes memory it no longer owns
reaches the canaries.

On up to 4 keys (no more than ``capacity``, and at least 2; one key has no order): a round in
key order (the captures, after ``reset()``), the reverse, then A-B-A for each neighbouring pair;
each call against eager, and every canary compared after each call: 17 graphed and 17 eager
calls on 4 keys, 12 of each on the reference's 3 (about half a second). A target that keeps
state is called in lockstep, its two sides' states compared after each call."""

from __future__ import annotations

import functools

import pytest
import torch

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import Lockstep, case_of, draw, first_keys
from pytest_cudagraph.conformance._protocol import Cache, CudaGraphTarget
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.unchanged import Unchanged
from pytest_cudagraph.engines.units import KiB, MiB

MAX_KEYS = 4
# Canary sizes (bytes): the caching allocator's small-block, large-block and huge-block
# classes, so that memory of each kind handed back and reused shows.
CANARY_BYTES = (512, 256 * KiB, 4 * MiB)


def replay_orders(keys: int) -> list[tuple[str, list[int]]]:
    """(name, key indices) of each order: key order (the captures), the reverse, and A-B-A for
    each neighbouring pair."""
    orders = [("in key order", list(range(keys))), ("reversed", list(reversed(range(keys))))]
    for a in range(keys - 1):
        orders.append((f"A-B-A of keys {a} and {a + 1}", [a, a + 1, a]))
    return orders


def lay_canaries(canaries: Unchanged, device: torch.device, where: str) -> None:
    """Canaries of each size, random values, held until the end of the check."""
    generator = torch.Generator(device).manual_seed(len(canaries))
    for size in CANARY_BYTES:
        tensor = torch.rand(size // 4, generator=generator, device=device)
        canaries.keep(f"a canary of {size} bytes laid {where}", tensor)


@check("replay order", sharper_with=("cache.capacity", "state.sides", "state.reset"))
def test_replay_order(
    target: CudaGraphTarget,
    cache: Cache | None,
    capture_counter: CaptureCounter,
    conclude: Conclude,
) -> None:
    keys = first_keys(target, MAX_KEYS, cache.capacity if cache is not None else None)
    key_count = len(keys)
    if key_count < 2:
        pytest.skip(
            f"the target has {key_count} key{'s' if key_count != 1 else ''} it can hold at once: "
            "replay order needs 2"
        )
    lockstep = Lockstep(target, capture_counter)
    canaries = Unchanged()
    lay_canaries(canaries, target.device, "before the first call")
    problems: list[str] = []
    calls = 0
    with capture_counter:
        for order, key_indices in replay_orders(key_count):
            for key_index in key_indices:
                case = case_of(target, keys[key_index], calls)
                inputs = functools.partial(draw, target, case, calls)
                call = f"call {calls} ({order}: case {case.number}, seed {calls}, key {case.key!r})"
                problems += lockstep.judge(inputs, calls, call)
                problems += [change.describe() for change in canaries.changes(after=call)]
                if order == "in key order":
                    lay_canaries(canaries, target.device, f"after {call}")
                calls += 1
    problems += lockstep.problems()
    state = f"; {lockstep.describe()}" if lockstep.stateful else ""
    figure = (
        f"{calls} calls over {key_count} keys (key order, reversed, A-B-A); {len(canaries)} "
        f"canaries{state}"
    )
    judgement = Judgement(problems, figure, calls, "calls compared")
    conclude(judgement, "answers that depend on the order of replays:")
