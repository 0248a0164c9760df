"""Stateful targets: a graphed path that keeps state between calls (a KV cache, positions,
lengths) must not let one episode's state reach the next. A target says it keeps state by
giving ``state.reset``; calls are then episodes (docs/conformance.md, "Stateful targets"): one
call each where a call leaves the state as it found it (position-addressed writes), else whole
episodes of the length the probe found or the target declares (``State.episode_calls``), each
from a reset. Both sides make every episode (in lockstep: one call sequence, from one state),
and where the target gives ``state.sides`` their states are compared after each call.

- state isolation: two episodes on one cached key, back to back in both orders from one state
  (so that each follows the other once: a longer one before a shorter one, whichever it is),
  each equal to eager. A counter or length not reset between episodes shows through.
- state reset: ``reset_state()`` keeps every graph cached, and the next episode on each key is
  equal to eager. A reset that gives the state new buffers leaves the graphs reading the old
  ones (a cache pointer baked in at capture); one that resets nothing is caught by the probe
  (a repeated episode from a reset answers otherwise than the first)."""

from __future__ import annotations

import functools

from pytest_cudagraph.conformance._catalog import check, declared
from pytest_cudagraph.conformance._judging import (
    Lockstep,
    called,
    case_of,
    draw,
    first_keys,
)
from pytest_cudagraph.conformance._protocol import Cache, Case, CudaGraphTarget, State
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement

KEYS = 4
EPISODE_KEYS = 2  # keys whose whole episodes (of several calls each) are judged


def episode(lockstep: Lockstep, case: Case, seed: int, when: str) -> list[str]:
    """One episode of ``case`` on both sides under ``seed`` (a reset first where episodes are
    whole runs of calls), each difference described."""
    target = lockstep.target
    calls = 1
    if lockstep.episodic and lockstep.probe is not None:
        lockstep.sync()
        calls = lockstep.probe.episode_calls or 1
    problems = []
    for call in range(calls):
        where = f"key {case.key!r}, {when}" + (f", call {call + 1} of {calls}" if calls > 1 else "")
        problems += lockstep.judge(functools.partial(draw, target, case, seed), seed, where)
    return problems


def judged_keys(target: CudaGraphTarget, lockstep: Lockstep, capacity: int | None) -> list[object]:
    return first_keys(target, EPISODE_KEYS if lockstep.episodic else KEYS, capacity)


@check("state isolation", needs=("state.reset",), sharper_with=("state.sides",))
def test_state_isolation(target: CudaGraphTarget, conclude: Conclude) -> None:
    lockstep = Lockstep(target)
    keys = judged_keys(target, lockstep, None)
    problems = []
    for index, key in enumerate(keys):
        pair = [(case_of(target, key, repeat), 2 * index + repeat) for repeat in (0, 1)]
        for (first, first_seed), (second, second_seed) in (pair, pair[::-1]):
            lockstep.sync()
            problems += episode(lockstep, first, first_seed, "an episode")
            problems += episode(lockstep, second, second_seed, "right after another episode")
    problems += lockstep.problems()
    figure = f"{2 * len(keys)} episode pairs on {len(keys)} keys, both orders"
    judgement = Judgement(problems, figure, lockstep.calls, "graphed calls compared")
    conclude(judgement, "an episode's answer depends on the one before it:", lockstep.describe())


@check(
    "state reset",
    needs=("state.reset",),
    sharper_with=("state.sides", "cache.cached_keys", "cache.capacity"),
)
def test_state_reset(
    target: CudaGraphTarget, state: State, cache: Cache | None, conclude: Conclude
) -> None:
    reset_state = declared(state.reset)
    lockstep = Lockstep(target)
    keys = judged_keys(target, lockstep, cache.capacity if cache is not None else None)
    problems = []
    for key in keys:
        case = case_of(target, key)
        problems += episode(lockstep, case, case.number, "before reset_state()")
    cached_keys = cache.cached_keys if cache is not None else None
    cached = set(called("Cache.cached_keys", cached_keys)) if cached_keys is not None else None
    called("State.reset", reset_state)
    after = set(called("Cache.cached_keys", cached_keys)) if cached_keys is not None else None
    if cached is not None and after != cached:
        problems.append(
            f"reset_state() changed the cached keys from {sorted(map(repr, cached))} to "
            f"{sorted(map(repr, after or ()))}: it must keep every graph"
        )
    for key in keys:
        later = case_of(target, key, 1)
        problems += episode(lockstep, later, later.number, "after reset_state()")
    problems += lockstep.problems()
    kept = "graphs kept, " if cached is not None else ""
    figure = f"reset_state() after {len(keys)} keys: {kept}next episode on each checked"
    judgement = Judgement(problems, figure, lockstep.calls, "graphed calls compared")
    conclude(judgement, "after reset_state():", lockstep.describe())
