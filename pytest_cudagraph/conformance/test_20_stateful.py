"""Stateful targets: a graphed path that keeps state between calls (a KV cache, positions,
lengths) must not let one call's state reach the next. A target says it keeps state by giving
``state.reset``; each call is then an episode (docs/conformance.md, "Stateful targets"). Both
sides make every episode (in lockstep: one call sequence, from one state), and where the target
gives ``state.sides`` their states are compared after each.

- state isolation: two episodes on one cached key, back to back in both orders from one state
  (so that each follows the other once: a longer one before a shorter one, whichever it is),
  each equal to eager. A counter or length not reset between targets shows through.
- state reset: ``reset_state()`` keeps every graph cached, and the next episode on each key is
  equal to eager. A reset that gives the state new buffers leaves the graphs reading the old
  ones (a cache pointer baked in at capture)."""

from __future__ import annotations

import functools

from pytest_cudagraph.conformance.catalog import given, needed
from pytest_cudagraph.conformance.judging import Lockstep, case_in_key, draw, keys_held
from pytest_cudagraph.conformance.protocol import Cache, CudaGraphTarget, State
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.skips import needs_cuda

KEYS = 4


def judge(lockstep: Lockstep, case: int, seed: int, when: str) -> list[str]:
    """The episode of ``case`` on both sides, under ``seed``, each difference described."""
    key = lockstep.target.key_of(draw(lockstep.target, case, seed))
    return lockstep.judge(
        functools.partial(draw, lockstep.target, case, seed), seed, f"key {key!r}, {when}"
    )


@needs_cuda
def test_state_isolation(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    reset_state = needed(target, State, "reset").reset
    lockstep = Lockstep(target, given(target, State, "sides"), reset_state)
    key_count = min(KEYS, target.num_keys)
    problems = []
    for key_index in range(key_count):
        pair = [
            (case_in_key(target, key_index, repeat), 2 * key_index + repeat) for repeat in (0, 1)
        ]
        for (first, first_seed), (second, second_seed) in (pair, pair[::-1]):
            lockstep.sync()
            problems += judge(lockstep, first, first_seed, "an episode")
            problems += judge(lockstep, second, second_seed, "right after another episode")
    problems += lockstep.problems()
    record_figure(f"{2 * key_count} episode pairs on {key_count} keys, both orders")
    assert not problems, "an episode's answer depends on the one before it:\n" + "\n".join(problems)


@needs_cuda
def test_state_reset(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    reset_state = needed(target, State, "reset").reset
    assert reset_state is not None
    lockstep = Lockstep(target, given(target, State, "sides"), reset_state)
    key_count = keys_held(target, KEYS, given(target, Cache, "capacity"))
    keys = [case_in_key(target, key_index, 0) for key_index in range(key_count)]
    problems = []
    for case in keys:
        problems += judge(lockstep, case, case, "before reset_state()")
    cached_keys = given(target, Cache, "cached_keys")
    cached = set(cached_keys()) if cached_keys is not None else None
    reset_state()
    if cached_keys is not None and cached is not None and set(cached_keys()) != cached:
        problems.append(
            f"reset_state() changed the cached keys from {sorted(map(repr, cached))} to "
            f"{sorted(map(repr, cached_keys()))}: it must keep every graph"
        )
    for case in keys:
        later = case + target.num_keys
        problems += judge(lockstep, later, later, "after reset_state()")
    problems += lockstep.problems()
    kept = "graphs kept, " if cached is not None else ""
    record_figure(f"reset_state() after {key_count} keys: {kept}next episode on each checked")
    assert not problems, "\n".join(problems)
