"""Captures witnessed: a check whose verdict rests on a capture proves that it saw one.

A check judging what a capture does (the inputs a graph keeps, inputs baked in, tensors rebound,
outputs' storage, the captures themselves) passes vacuously when every graph it calls was
captured before it: by an earlier check, or at start-up. ``witnessed`` runs the check's calls (a
``Judge``) under a capture counter and, when no graph captured there was replayed, runs them
again where a capture can be had: after ``cache.reset()``, on a key the check did not call, or
on a fresh target from the factory, built inside the count (code that captures at start-up).
Where none can be had the check fails, not exercised: a skip would leave the run green.
``runs_its_graphs`` tells whether a target still replays its graphs, which the suite asks after
the checks that inject faults or fill a cache.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import pytest
import torch

from pytest_cudagraph.conformance.judging import case_in_key, draw, eager_call, graphed_call
from pytest_cudagraph.conformance.protocol import CudaGraphTarget
from pytest_cudagraph.engines.captures import CaptureCounter

# A fresh target of the session's spec, on its device (the suite's ``target_factory``).
Factory = Callable[[], CudaGraphTarget]
SEED = 0  # torch's generators, for both sides of the calls ``runs_its_graphs`` makes


@dataclass(frozen=True)
class Judgement:
    """What a check's calls found: its problems (none: it passes) and the figure behind them."""

    problems: list[str]
    figure: str


# judge(target, keys, counter): the check's calls on ``target`` over the keys numbered ``keys``
# (indices into ``target.keys``), ``counter`` counting their captures already.
Judge = Callable[[CudaGraphTarget, Sequence[int], CaptureCounter], Judgement]


@dataclass(frozen=True)
class Witnessed:
    """A judgement, the captures made for it and where they were had."""

    judgement: Judgement
    captures: int
    where: str

    def describe(self) -> str:
        return f"{self.captures} capture(s) {self.where}"


def witnessed(
    target: CudaGraphTarget,
    counter: CaptureCounter,
    judge: Judge,
    keys: Sequence[int],
    fresh: Factory | None,
    after_capture: Callable[[], None] | None = None,
) -> Witnessed:
    """``judge`` on ``target`` over ``keys``, counted by ``counter``; judged again where a
    capture can be had when no graph captured in the first count was replayed (a failure
    stands as it is: what was found is found). Each count calls ``after_capture`` after every
    capture. Fails the check as not exercised when no capture can be had."""
    counter.after_capture = after_capture
    with counter:
        judgement = judge(target, keys, counter)
    if judgement.problems or counter.replays:
        return Witnessed(judgement, len(counter.captures), "in this check")
    tried = []
    for where, chance in chances(target, keys, fresh):
        again = CaptureCounter(counter.graph_class, after_capture)
        try:
            with again, chance as (chosen, chosen_keys):
                judgement = judge(chosen, chosen_keys, again)
        except FactoryError as error:
            tried.append(f"{where} ({error})")
            continue
        if judgement.problems or again.replays:
            return Witnessed(judgement, len(again.captures), where)
        tried.append(where)
    no_factory = [] if fresh is not None else ["a fresh target (no factory given)"]
    pytest.fail(
        "not exercised: every graph this check called was captured before it, and no capture "
        f"could be had here (tried: {', '.join([*tried, *no_factory])}); a verdict on graphs "
        "captured elsewhere would say nothing of what a capture does",
        pytrace=False,
    )


class FactoryError(Exception):
    """The factory could not build a fresh target."""


Chance = AbstractContextManager[tuple[CudaGraphTarget, Sequence[int]]]


def chances(
    target: CudaGraphTarget, keys: Sequence[int], fresh: Factory | None
) -> Iterator[tuple[str, Chance]]:
    """Where a capture may be had, cheapest first, each a context giving the target and keys to
    judge: after the cache's reset, on the last key when the check did not call it, on a fresh
    target from the factory (dropped afterwards)."""
    reset = target.cache.reset if target.cache is not None else None
    if reset is not None:
        yield "after cache.reset()", after_reset(target, keys, reset)
    last = target.num_keys - 1
    if last not in keys:
        yield (
            f"on key {target.keys[last]!r}, which this check had not called",
            as_is(target, [last]),
        )
    if fresh is not None:
        yield "on a fresh target from the factory", fresh_target(fresh, keys)


@contextmanager
def after_reset(
    target: CudaGraphTarget, keys: Sequence[int], reset: Callable[[], object]
) -> Iterator[tuple[CudaGraphTarget, Sequence[int]]]:
    reset()
    yield target, keys


@contextmanager
def as_is(
    target: CudaGraphTarget, keys: Sequence[int]
) -> Iterator[tuple[CudaGraphTarget, Sequence[int]]]:
    yield target, keys


@contextmanager
def fresh_target(
    fresh: Factory, keys: Sequence[int]
) -> Iterator[tuple[CudaGraphTarget, Sequence[int]]]:
    """A target from ``fresh`` (FactoryError naming what it raised), its graphs and memory let
    go afterwards."""
    try:
        made = fresh()
    except Exception as error:
        raise FactoryError(f"the factory raised {type(error).__name__}: {error}") from error
    try:
        yield made, keys
    finally:
        if made.cache is not None and made.cache.reset is not None:
            made.cache.reset()
        del made
        gc.collect()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def runs_its_graphs(target: CudaGraphTarget, graph_class: type | None = None) -> bool | None:
    """Whether the graphed path replays graphs: two calls on the target's first key, each after
    the eager side's call of the same case (both sides called alike); None when the target
    declares both calls eager (``fallbacks.runs_eagerly``), so that nothing can be told."""
    runs_eagerly = target.fallbacks.runs_eagerly if target.fallbacks is not None else None
    declared = []
    with CaptureCounter(graph_class) as counter:
        for repeat in range(2):
            case = case_in_key(target, 0, repeat)
            eager_call(target, draw(target, case, seed=case), SEED)
            inputs = draw(target, case, seed=case)
            graphed_call(target, inputs, SEED)
            declared.append(runs_eagerly is not None and runs_eagerly(inputs))
    return None if all(declared) else counter.all_replays > 0
