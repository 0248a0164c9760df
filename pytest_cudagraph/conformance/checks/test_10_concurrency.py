"""Concurrency: 8 threads calling the graphed path on mixed shapes (more keys than the cache
holds, so captures and evictions race with replays) all get the eager answer, within a time
bound (no deadlock). Results are compared once every thread is done, so an output that another
thread's replay overwrote is caught too. What is asked follows the target's ``threads``: ``concurrent`` code is called from all threads
at once, ``serial`` code from all threads one call at a time (state tied to the thread that
captured shows), ``single`` code is not called from threads (the check skips, saying so). Calls
are made one at a time too when the answers depend on torch's generators (eager under two
seeds differs): they are process-wide, so only one call at a time can draw what eager drew
under its seed; and when outputs are valid until the next call, which the check reads before
any other call starts (until the next call of their key: one call at a time per key); and when
the target keeps state (``State``): each answer then depends on the calls before it, so the
order the threads' calls took is kept and the eager side makes the same calls in that order,
from the same state, and the two states are compared at the end (where the state accumulates,
no more calls than one episode holds)."""

from __future__ import annotations

import collections
import functools
import threading
import time

import pytest

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import (
    Lockstep,
    case_of,
    differences,
    draw,
    draws_random_numbers,
    eager_call,
    graphed_call,
    graphed_path,
    kept,
)
from pytest_cudagraph.conformance._protocol import (
    CONCURRENT,
    NEXT_CALL,
    NEXT_CALL_OF_KEY,
    SINGLE,
    Case,
    CudaGraphTarget,
)
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement

THREADS = 8
CALLS_PER_THREAD = 6
KEYS = 6
TIMEOUT_S = 120.0


@check("concurrency", sharper_with=("state.sides", "state.reset"), runs_on="gpu")
def test_concurrency(target: CudaGraphTarget, conclude: Conclude) -> None:
    if target.threads == SINGLE:
        pytest.skip(
            "the target is single-threaded (threads='single'): its graphed path is called from "
            "one thread only"
        )
    keys = list(target.keys[:KEYS])
    key_count = len(keys)
    lockstep = Lockstep(target)
    threads, per_thread = fitting(lockstep)
    plans: list[list[Case]] = [
        [case_of(target, keys[(thread + call) % key_count], call) for call in range(per_thread)]
        for thread in range(threads)
    ]

    def seed_of(thread: int, call: int) -> int:
        return thread * per_thread + call

    random = any(
        draws_random_numbers(target, draw(target, case_of(target, key), seed=0)) for key in keys
    )
    why_serial = [
        reason
        for reason, applies in (
            ("threads='serial'", target.threads != CONCURRENT),
            ("its answers depend on torch's generators", random),
            ("outputs valid until the next call", target.output_lifetime == NEXT_CALL),
            ("it keeps state: each answer depends on the calls before it", lockstep.stateful),
        )
        if applies
    ]
    order: list[tuple[int, int]] = []  # (thread, call) in the order the calls were made
    if lockstep.stateful:
        lockstep.sync()  # the eager calls above were eager's alone
        expected: list[list[object]] = [[None] * per_thread for _ in range(threads)]
    else:
        expected = [
            [
                eager_call(target, draw(target, case, seed_of(t, c)), seed_of(t, c))
                for c, case in enumerate(plan)
            ]
            for t, plan in enumerate(plans)
        ]
    # Outputs valid until the next call of their key: calls of one key one at a time.
    per_key = not why_serial and target.output_lifetime == NEXT_CALL_OF_KEY
    locks: dict[object, threading.Lock] = collections.defaultdict(threading.Lock)
    results: list[list[object]] = [[] for _ in range(threads)]
    errors: list[str] = []
    start_together = threading.Barrier(threads)

    def run(thread: int) -> None:
        try:
            start_together.wait()
            for call, case in enumerate(plans[thread]):
                inputs = draw(target, case, seed_of(thread, call))
                if why_serial:  # seeded, read, and only then the next call
                    with locks[None]:
                        output = graphed_call(target, inputs, seed_of(thread, call))
                        order.append((thread, call))
                elif per_key:  # read before the next call of its key
                    with locks[case.key]:
                        output = kept(target, graphed_path(target)(inputs))
                else:  # unseeded: nothing it computes depends on torch's generators
                    output = graphed_path(target)(inputs)
                results[thread].append(output)
        except Exception as error:
            errors.append(f"thread {thread}: {type(error).__name__}: {error}")

    workers = [
        threading.Thread(target=run, args=(i,), daemon=True, name=f"cudagraph-concurrency-{i}")
        for i in range(threads)
    ]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(max(0.0, TIMEOUT_S - (time.perf_counter() - started)))
    seconds = time.perf_counter() - started
    stuck = [i for i, worker in enumerate(workers) if worker.is_alive()]
    problems = list(errors)
    if stuck:
        problems.insert(0, f"threads {stuck} still running after {TIMEOUT_S:g} s: deadlock?")
    for thread, call in order if lockstep.stateful else ():  # the same calls, in that order
        inputs = draw(target, plans[thread][call], seed_of(thread, call))
        expected[thread][call] = eager_call(target, inputs, seed_of(thread, call))
    for thread, plan in enumerate(plans):
        # A thread that raised has fewer results; its error is listed already.
        for call, (want, got) in enumerate(zip(expected[thread], results[thread], strict=False)):
            inputs = draw(target, plan[call], seed_of(thread, call))
            found = differences(target, inputs, want, got)
            if found and lockstep.stateful and not problems:
                make = functools.partial(draw, target, plan[call], seed_of(thread, call))
                found.append(lockstep.diagnose(make, seed_of(thread, call)))
            problems += [f"thread {thread} call {call}: {d}" for d in found if d]
    lockstep.compare_state(f"after the {len(order)} calls, made in the threads' order")
    problems += lockstep.problems()
    calls = threads * per_thread
    how = f"one call at a time ({'; '.join(why_serial)})" if why_serial else "at once"
    if per_key:
        how += " (one at a time per key: outputs valid until the next call of their key)"
    figure = (
        f"{threads} threads x {per_thread} calls over {key_count} keys {how} in {seconds:.1f} s"
    )
    compared = sum(len(done) for done in results)
    judgement = Judgement(problems, figure, compared, "threaded results compared")
    conclude(judgement, f"{len(problems)} of {calls} threaded results differ:")


def fitting(lockstep: Lockstep) -> tuple[int, int]:
    """How many threads, and calls each, fit in one episode of accumulating state (the threads'
    calls are one call sequence, from one reset); ``THREADS`` x ``CALLS_PER_THREAD`` else."""
    probe = lockstep.probe
    if not lockstep.episodic or probe is None or probe.episode_calls is None:
        return THREADS, CALLS_PER_THREAD
    threads = min(THREADS, probe.episode_calls)
    return threads, max(1, min(CALLS_PER_THREAD, probe.episode_calls // threads))
