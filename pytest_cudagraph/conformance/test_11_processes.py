"""Processes: two spawned workers sharing one GPU's lock give the eager answers; graphs with two
workers per GPU are refused before any process starts (that half runs on the CPU too): every
way of starting one (multiprocessing, subprocess, os.fork and os.posix_spawn) is watched while
the refusal is asked for, so a process started and joined before the ValueError is seen."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from unittest import mock

import pytest

from pytest_cudagraph.conformance.catalog import needed
from pytest_cudagraph.conformance.judging import tolerated
from pytest_cudagraph.conformance.protocol import EXACT, CudaGraphTarget, Workers
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.skips import needs_cuda

# What starts a process: (owner, attribute, how the report names it).
STARTERS = (
    (multiprocessing.process.BaseProcess, "start", "multiprocessing.Process.start"),
    (subprocess.Popen, "__init__", "subprocess.Popen"),
    (os, "fork", "os.fork"),
    (os, "posix_spawn", "os.posix_spawn"),
    (os, "posix_spawnp", "os.posix_spawnp"),
)


@needs_cuda
def test_worker_processes(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    run_workers = needed(target, Workers).run
    results, expected = run_workers(2, False)
    problems = tolerated(list(expected), list(results), EXACT)
    record_figure(f"2 workers on one GPU, graphs off: {len(results)} jobs")
    assert not problems, "worker results differ from eager:\n" + "\n".join(problems)


def test_worker_refusal(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    run_workers = needed(target, Workers).run
    with processes_started() as started, pytest.raises(ValueError) as refused:
        run_workers(2, True)
    assert not started, (
        f"{len(started)} process(es) started before the refusal: {', '.join(started)}"
    )
    record_figure(f"graphs with 2 workers per GPU refused: {refused.value}")


@contextmanager
def processes_started() -> Iterator[list[str]]:
    """How each process started inside the block was started (they start as they would; one
    forked by multiprocessing shows twice, its start and its fork)."""
    started: list[str] = []

    def watched(original: Callable[..., object], how: str) -> Callable[..., object]:
        def starting(*args: object, **kwargs: object) -> object:
            started.append(how)
            return original(*args, **kwargs)

        return starting

    with ExitStack() as patches:
        for owner, name, how in STARTERS:
            original = getattr(owner, name, None)
            if original is not None:  # os.posix_spawn is not on every platform
                patches.enter_context(mock.patch.object(owner, name, watched(original, how)))
        yield started
