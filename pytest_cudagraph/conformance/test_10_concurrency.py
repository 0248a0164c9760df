"""Concurrency: 8 threads calling the graphed path on mixed shapes (more keys than the cache
holds, so captures and evictions race with replays) all get the eager answer, within a time
bound (no deadlock). Results are compared once every thread is done, so an output that another
thread's replay overwrote is caught too."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pytest_cudagraph.conformance.support import differences, draw
from pytest_cudagraph.conformance.target import CudaGraphTarget
from pytest_cudagraph.skips import needs_cuda

THREADS = 8
CALLS_PER_THREAD = 6
KEYS = 6
TIMEOUT_S = 120.0


@needs_cuda
def test_concurrency(target: CudaGraphTarget, record_figure: Callable[[str], None]) -> None:
    key_count = min(KEYS, target.num_keys)
    plans = [
        [
            draw(target, (thread + call) % key_count, seed=thread * CALLS_PER_THREAD + call)
            for call in range(CALLS_PER_THREAD)
        ]
        for thread in range(THREADS)
    ]
    expected = [[target.eager(inputs) for inputs in plan] for plan in plans]
    results: list[list[object]] = [[] for _ in range(THREADS)]
    errors: list[str] = []
    start_together = threading.Barrier(THREADS)

    def run(thread: int) -> None:
        try:
            start_together.wait()
            for inputs in plans[thread]:
                results[thread].append(target.graphed(inputs))
        except Exception as error:
            errors.append(f"thread {thread}: {type(error).__name__}: {error}")

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(THREADS)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(max(0.0, TIMEOUT_S - (time.perf_counter() - started)))
    seconds = time.perf_counter() - started
    stuck = [i for i, worker in enumerate(workers) if worker.is_alive()]
    assert not stuck, f"threads {stuck} still running after {TIMEOUT_S:g} s: deadlock?"
    problems = list(errors)
    for thread in range(THREADS):
        # A thread that raised has fewer results; its error is listed already.
        pairs = zip(expected[thread], results[thread], strict=False)
        for call, (want, got) in enumerate(pairs):
            problems += [
                f"thread {thread} call {call}: {d}"
                for d in differences(want, got, target.tolerance)
            ]
    calls = THREADS * CALLS_PER_THREAD
    record_figure(
        f"{THREADS} threads x {CALLS_PER_THREAD} calls over {key_count} keys in {seconds:.1f} s"
    )
    assert not problems, f"{len(problems)} of {calls} threaded results differ:\n" + "\n".join(
        problems[:10]
    )
