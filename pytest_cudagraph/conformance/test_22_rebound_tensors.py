"""No rebound tensors: every tensor a graph may read keeps its storage from one call to the
next. A graph reads the addresses it was captured on, so a tensor replaced instead of copied
into (``self.cache = torch.zeros(...)``, weights loaded with ``assign=True``) leaves the graph
on the old memory (vLLM's input-address check, TensorRT-LLM's strict buffers, FastDeploy #6746).

Judged: the tensors the graphed side holds (``engines.reach``: its closure, the module globals
its code names, its object, their attributes, modules and containers) that were alive when a
graph was captured, so a clone recorded after the captures may be replaced at will; or, where
the target names what its graphs read (``cache.static``), those alone. Over 3 rounds on up to 4
keys (no more than ``capacity``), storages are compared before and after each call that
captured nothing (a capture may give a new graph new buffers): at most 12 graphed calls, no
eager one, a walk of the target's objects after each call and a look at the tensors alive at
each capture. The captures are witnessed (``witness``): seeing none, the check has one made."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from pytest_cudagraph.conformance.catalog import given
from pytest_cudagraph.conformance.judging import calls_over_keys, draw, graphed_path, keys_held
from pytest_cudagraph.conformance.protocol import Cache, CudaGraphTarget
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.conformance.witness import Factory, Judgement, witnessed
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.reach import Alive, reachable_tensors, rebound, storages
from pytest_cudagraph.skips import needs_cuda

MAX_KEYS = 4
ROUNDS = 3  # the first captures each key, the later ones replay it


@needs_cuda
def test_no_rebound_tensors(
    target: CudaGraphTarget,
    capture_counter: CaptureCounter,
    target_factory: Factory | None,
    record_figure: FigureRecorder,
) -> None:
    key_count = keys_held(target, MAX_KEYS, given(target, Cache, "capacity"))
    alive = Alive(target.device)  # the tensors alive at each capture's end
    judge = functools.partial(judge_rebinding, alive=alive)
    seen = witnessed(target, capture_counter, judge, range(key_count), target_factory, alive.record)
    record_figure(f"{seen.judgement.figure}; {seen.describe()}")
    problems = seen.judgement.problems
    assert not problems, "tensors a graph may read were replaced:\n" + "\n".join(problems[:10])


def judge_rebinding(
    target: CudaGraphTarget, keys: Sequence[int], counter: CaptureCounter, alive: Alive
) -> Judgement:
    """Each call that captured nothing: the tensors judged before it that lie elsewhere after."""
    static = given(target, Cache, "static")

    def look() -> dict[str, torch.Tensor]:
        root, name = (static(), "cache.static()") if static else (graphed_path(target), "graphed")
        reach = reachable_tensors(root, name, device=target.device)
        assert not reach.truncated, f"{name} holds too many objects to walk"
        return reach.tensors

    def judged(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {path: t for path, t in tensors.items() if static is not None or t in alive}

    problems: list[str] = []
    calls_judged = 0
    before = look()
    for call, case in calls_over_keys(target, keys, range(ROUNDS)):
        inputs = draw(target, case, seed=case)
        captures = len(counter.captures)
        graphed_path(target)(inputs)
        after = look()
        if len(counter.captures) == captures:
            calls_judged += 1
            where = f"call {call} (case {case}, key {target.key_of(inputs)!r})"
            moved = rebound(storages(judged(before)), storages(after))
            problems += [f"{where}: {r.describe()}" for r in moved]
        before = after
    held = (
        f"{len(before)} tensors of cache.static()"
        if static
        else (f"{len(before)} tensors held, {len(judged(before))} of them alive at a capture")
    )
    figure = (
        f"{ROUNDS * len(keys)} calls over {len(keys)} keys, {calls_judged} without a capture: "
        f"{held}"
    )
    return Judgement(problems, figure)
