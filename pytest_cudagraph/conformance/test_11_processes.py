"""Processes: two spawned workers sharing one GPU's lock give the eager answers; graphs with two
workers per GPU are refused before any process starts (that half runs on the CPU too)."""

from __future__ import annotations

import multiprocessing

import pytest

from pytest_cudagraph.conformance.catalog import needed
from pytest_cudagraph.conformance.judging import tolerated
from pytest_cudagraph.conformance.protocol import EXACT, CudaGraphTarget, Workers
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.skips import needs_cuda


@needs_cuda
def test_worker_processes(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    run_workers = needed(target, Workers).run
    results, expected = run_workers(2, False)
    problems = tolerated(list(expected), list(results), EXACT)
    record_figure(f"2 workers on one GPU, graphs off: {len(results)} jobs")
    assert not problems, "worker results differ from eager:\n" + "\n".join(problems)


def test_worker_refusal(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    run_workers = needed(target, Workers).run
    children = set(multiprocessing.active_children())
    with pytest.raises(ValueError) as refused:
        run_workers(2, True)
    started = set(multiprocessing.active_children()) - children
    assert not started, f"{len(started)} worker process(es) started before the refusal"
    record_figure(f"graphs with 2 workers per GPU refused: {refused.value}")
