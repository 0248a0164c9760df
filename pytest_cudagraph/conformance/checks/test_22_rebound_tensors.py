"""No rebound tensors: every tensor a graph reads keeps its storage from one call to the next.
A graph reads the addresses it was captured on, so a tensor replaced instead of copied into
(``self.cache = torch.zeros(...)``, weights loaded with ``assign=True``) leaves the graph on
the old memory (vLLM's input-address check, TensorRT-LLM's strict buffers, FastDeploy #6746).

Judged: what each capture of the check read that it did not allocate, as a recorder at
torch's dispatcher saw it (``engines.graph_recorder``; on torch 2.13 and later torch's own
input-liveness check too): after each call, a storage a graph reads that was freed since its
capture is named with where it was first used, wherever the object holding it lived (a
namespace, a class attribute). Where no capture's reads were recorded (kernels no dispatcher
sees), the tensors the graphed side holds alive at a capture (or ``cache.static``) are walked
instead, and the row says so; where it holds none, nothing could be rebound: the check skips. 3 rounds on up to 4 keys (no more than ``capacity``); the captures are
witnessed (``_witness``)."""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence

import pytest
import torch

from pytest_cudagraph.conformance._adapters import held_by_nobody
from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import (
    Episodes,
    called,
    calls_over_keys,
    draw,
    first_keys,
    graphed_path,
)
from pytest_cudagraph.conformance._protocol import Cache, CudaGraphTarget
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.conformance._witness import Factory, Witness, labelled
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.graph_recorder import DEAD_TENSOR
from pytest_cudagraph.engines.reach import Alive, reachable_tensors, rebound, storages

MAX_KEYS = 4
ROUNDS = 3  # the first captures each key, the later ones replay it


@check("no rebound tensors", sharper_with=("cache.capacity", "cache.static"), witnessed=True)
def test_no_rebound_tensors(
    target: CudaGraphTarget,
    cache: Cache | None,
    capture_counter: CaptureCounter,
    target_factory: Factory,
    conclude: Conclude,
) -> None:
    keys = first_keys(target, MAX_KEYS, cache.capacity if cache is not None else None)
    alive = Alive(target.device)  # the tensors alive at each capture's end
    witness = Witness(target, capture_counter, target_factory, alive.record)
    seen = witness(functools.partial(judge_rebinding, alive=alive), keys)
    conclude(seen.judgement, "tensors a graph may read were replaced:", seen.describe())


def judge_rebinding(
    target: CudaGraphTarget, keys: Sequence[Hashable], counter: CaptureCounter, alive: Alive
) -> Judgement:
    """Each call: the storages the graphs captured so far read, freed since; where no capture
    was recorded, the tensors walked before a call that captured nothing, elsewhere after it."""
    static = target.cache.static if target.cache is not None else None

    def look() -> dict[str, torch.Tensor]:
        if static is not None:
            root, name = called("Cache.static", static), "cache.static()"
        else:
            root, name = graphed_path(target), "graphed"
        reach = reachable_tensors(root, name, device=target.device)
        assert not reach.truncated, f"{name} holds too many objects to walk"
        return reach.tensors

    def judged(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {path: t for path, t in tensors.items() if static is not None or t in alive}

    problems: list[str] = []
    walked = reported = 0
    freed: set[int] = set()  # recorded storages already named, by id
    episodes = Episodes(target)
    before = look()
    holding = bool(before)  # whether the walk found any tensor held across calls
    for call, case in calls_over_keys(target, keys, range(ROUNDS)):
        if episodes.begin():  # a reset between calls: judged on its own, not as the call's
            before = look()
        where = f"call {call} (case {case.number}, key {case.key!r})"
        captures = len(counter.captures)
        try:
            with labelled(counter, case):
                graphed_path(target)(draw(target, case, seed=case.number))
        except RuntimeError as error:
            if DEAD_TENSOR not in str(error):
                raise
            problems.append(f"{where}: its replay read freed memory: {str(error).splitlines()[0]}")
            continue
        for capture in counter.captures:
            for storage in capture.record.dead_inputs() if capture.record else ():
                if id(storage) not in freed:
                    freed.add(id(storage))
                    problems.append(
                        f"{where}: the graph of key {capture.key!r} (captured in call "
                        f"{capture.call}) reads a {storage.describe()}, freed since its capture "
                        "(rebound, the old tensor dropped): its replays read freed memory"
                    )
        after = look()
        holding = holding or bool(after)
        if len(counter.captures) == captures:
            walked += len(judged(before))
            moved = rebound(storages(judged(before)), storages(after))
            problems += [f"{where}: {r.describe()}" for r in moved]
        before = after
    read = {id(s) for c in counter.captures if c.record for s in c.record.external}
    figure = f"{ROUNDS * len(keys)} calls over {len(keys)} keys: "
    if read:
        reported = len(read)
        figure += f"{reported} storages the graphs read (recorded at capture), {len(freed)} freed"
        return Judgement(problems, figure, reported, "storages the graphs read")
    held = "cache.static()" if static else "the graphed side"
    nothing_held = static is None or static is held_by_nobody  # not a static naming nothing
    if not problems and not holding and nothing_held and counter.witnessed(keys):
        pytest.skip(
            "nothing here a graph reads could be rebound: no capture's reads were recorded "
            f"(kernels the dispatcher does not see, as compiled code's) and {held} holds no "
            "tensor across calls"
        )
    figure += (
        f"no read recorded at capture, so {held} walked: {walked} tensors judged over the calls"
    )
    return Judgement(problems, figure, walked, "tensors judged across calls")
