"""Captures witnessed: a check whose verdict rests on a capture proves that it saw one of the keys
it called.

A check judging what a capture does (the inputs a graph keeps, inputs baked in, tensors rebound,
outputs' storage, the captures themselves) passes vacuously when every graph it calls was
captured before it: by an earlier check, or at start-up. ``Witness`` runs the check's calls (a
``Judge``, which labels each graphed call with its key: ``labelled``) under a capture counter and,
when no capture of a key it called served a later call of that key, runs them again where one
can be had: after ``cache.reset()``, on a key the check did not call, or on a fresh target from
the factory, built inside the count (code that captures at start-up: what its building captured
and a call replayed is a witness). A graph captured and replayed in one call only (a runner's
throwaway graph) is none. Where none can be had the check fails, not exercised: a skip would
leave the run green. ``graphs_per_call`` tells how many graphs a call of the target replays,
which the suite asks before and after the checks that may break a target.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import pytest
import torch

from pytest_cudagraph.conformance._judging import (
    called,
    case_of,
    draw,
    eager_call,
    graphed_call,
    probe,
    probed_like,
)
from pytest_cudagraph.conformance._protocol import Case, CudaGraphTarget
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines.captures import Capture, CaptureCounter
from pytest_cudagraph.engines.devices import cuda_initialized

# The most calls of one key a capture may take: cudagraph trees run a key's first call eagerly
# and record its graph on the next (make_graphed_callables warms up inside one call).
CALLS_TO_CAPTURE = 3
# A fresh target of the session's spec, on its device (the suite's ``target_factory``).
Factory = Callable[[], CudaGraphTarget]
SEED = 0  # torch's generators, for both sides of the calls ``graphs_per_call`` makes


# judge(target, keys, counter): the check's calls on ``target`` over ``keys``, ``counter``
# counting their captures already.
Judge = Callable[[CudaGraphTarget, Sequence[Hashable], CaptureCounter], Judgement]


@dataclass(frozen=True)
class Witnessed:
    """A judgement, the captures witnessed for it and where they were had."""

    judgement: Judgement
    captures: int
    where: str

    def describe(self) -> str:
        return f"{self.captures} capture(s) of its keys {self.where}"


def labelled(counter: CaptureCounter, case: Case) -> AbstractContextManager[object]:
    """The block as one call of ``case``: what it captures and replays is counted for its key,
    in the round of its repeat (``CaptureCounter.call``)."""
    return counter.call(case.key, round_number=case.repeat)


class Witness:
    """The witnessed checks' skeleton: ``witness(judge, keys)`` judges the target over ``keys``
    with a capture of one of them seen (see the module)."""

    def __init__(
        self,
        target: CudaGraphTarget,
        counter: CaptureCounter,
        fresh: Factory | None,
        after_capture: Callable[[], None] | None = None,
    ) -> None:
        self.target, self.counter, self.fresh = target, counter, fresh
        self.after_capture = after_capture

    def __call__(self, judge: Judge, keys: Sequence[Hashable]) -> Witnessed:
        """``judge`` on the target over ``keys``; judged again where a capture can be had when
        none of a called key was witnessed (a failure stands as it is: what was found is
        found). Fails the check as not exercised when no capture can be had."""
        counter = self.counter
        counter.after_capture = self.after_capture
        with counter:
            judgement = judge(self.target, keys, counter)
        if judgement.problems or served(counter, keys):
            return Witnessed(judgement, len(served(counter, keys)), "in this check")
        tried = []
        probe(self.target)  # before any count: a fresh target takes it (``fresh_target``)
        for where, chance in chances(self.target, keys, self.fresh):
            again = CaptureCounter(counter.graph_class, self.after_capture, record=counter.record)
            try:
                with again, chance as (chosen, chosen_keys):
                    built = len(again.captures)  # what building a fresh target captured
                    judgement = judge(chosen, chosen_keys, again)
            except FactoryError as error:
                tried.append(f"{where} ({error})")
                continue
            if judgement.problems or served(again, chosen_keys, built):
                return Witnessed(judgement, len(served(again, chosen_keys, built)), where)
            tried.append(where)
        no_factory = [] if self.fresh is not None else ["a fresh target (no factory given)"]
        pytest.fail(
            "not exercised: no capture of a key this check called served a later call of it "
            "(every graph it called was captured before it, or captured and never replayed "
            f"again), and none could be had here (tried: {', '.join([*tried, *no_factory])}); a "
            "verdict on graphs captured elsewhere would say nothing of what a capture does",
            pytrace=False,
        )


def served(counter: CaptureCounter, keys: Sequence[Hashable], built: int = 0) -> list[Capture]:
    """The captures that served a later call of ``keys``: those of the keys replayed in a
    call other than their own (``CaptureCounter.witnessed``), and of the first ``built``
    captures, made while a fresh target was built (code that captures every key at start-up),
    those a call of the check replayed. Any other capture made outside a call of the check
    (the state probe's, say, on inputs of its own) is none."""
    building = [capture for capture in counter.captures[:built] if capture.replayed_in]
    return [*counter.witnessed(keys), *building]


class FactoryError(Exception):
    """The factory could not build a fresh target."""


Chance = AbstractContextManager[tuple[CudaGraphTarget, Sequence[Hashable]]]


def chances(
    target: CudaGraphTarget, keys: Sequence[Hashable], fresh: Factory | None
) -> Iterator[tuple[str, Chance]]:
    """Where a capture may be had, cheapest first, each a context giving the target and keys to
    judge: after the cache's reset, on the last key when the check did not call it, on a fresh
    target from the factory (dropped afterwards)."""
    reset = target.cache.reset if target.cache is not None else None
    if reset is not None:
        yield "after cache.reset()", after_reset(target, keys, reset)
    last = target.keys[-1]
    if last not in keys:
        yield f"on key {last!r}, which this check had not called", as_is(target, [last])
    if fresh is not None:
        yield "on a fresh target from the factory", fresh_target(fresh, keys, target)


@contextmanager
def after_reset(
    target: CudaGraphTarget, keys: Sequence[Hashable], reset: Callable[[], object]
) -> Iterator[tuple[CudaGraphTarget, Sequence[Hashable]]]:
    called("Cache.reset", reset)
    yield target, keys


@contextmanager
def as_is(
    target: CudaGraphTarget, keys: Sequence[Hashable]
) -> Iterator[tuple[CudaGraphTarget, Sequence[Hashable]]]:
    yield target, keys


@contextmanager
def fresh_target(
    fresh: Factory, keys: Sequence[Hashable], like: CudaGraphTarget
) -> Iterator[tuple[CudaGraphTarget, Sequence[Hashable]]]:
    """A target from ``fresh`` (FactoryError naming what it raised) that knows its state as
    ``like``, the session's target, was probed (``probed_like``: a probe of its own would
    capture before the check's calls), its graphs and memory let go afterwards."""
    try:
        made = fresh()
    except Exception as error:
        raise FactoryError(f"the factory raised {type(error).__name__}: {error}") from error
    try:
        probed_like(made, like)
        yield made, keys
    finally:
        if made.cache is not None and made.cache.reset is not None:
            made.cache.reset()
        del made
        gc.collect()
        if cuda_initialized():
            torch.cuda.empty_cache()


def graphs_per_call(target: CudaGraphTarget, graph_class: type | None = None) -> int | None:
    """The most graphs one call of the target's first key replays, over two calls, each after
    the eager side's call of the same case (both sides called alike); None when the target
    declares both calls eager (``fallbacks.runs_eagerly``), so that nothing can be told."""
    runs_eagerly = target.fallbacks.runs_eagerly if target.fallbacks is not None else None
    declared = []
    with CaptureCounter(graph_class) as counter:
        for repeat in range(2):
            case = case_of(target, target.keys[0], repeat)
            eager_call(target, draw(target, case, seed=case.number), SEED)
            inputs = draw(target, case, seed=case.number)
            with labelled(counter, case):
                graphed_call(target, inputs, SEED)
            declared.append(runs_eagerly is not None and runs_eagerly(inputs))
    return None if all(declared) else max(counter.most_graphs_per_call().values(), default=0)
