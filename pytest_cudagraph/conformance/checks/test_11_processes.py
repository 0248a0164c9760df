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

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import called, tolerated
from pytest_cudagraph.conformance._protocol import EXACT, Workers
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement

# What starts a process: (owner, attribute, how the report names it).
STARTERS = (
    (multiprocessing.process.BaseProcess, "start", "multiprocessing.Process.start"),
    (subprocess.Popen, "__init__", "subprocess.Popen"),
    (os, "fork", "os.fork"),
    (os, "posix_spawn", "os.posix_spawn"),
    (os, "posix_spawnp", "os.posix_spawnp"),
)


@check("worker processes", needs=("workers",), runs_on="gpu")
def test_worker_processes(workers: Workers, conclude: Conclude) -> None:
    results, expected = called("Workers.run", workers.run, 2, False)
    problems = tolerated(list(expected), list(results), EXACT)
    figure = f"2 workers on one GPU, graphs off: {len(results)} jobs"
    conclude(Judgement(problems, figure, len(results), "jobs"), "worker results differ from eager:")


@check("worker refusal", needs=("workers",), runs_on="cpu")
def test_worker_refusal(workers: Workers, conclude: Conclude) -> None:
    with processes_started() as started, pytest.raises(ValueError) as refused:
        workers.run(2, True)
    problems = [f"{len(started)} process(es) started before the refusal: {', '.join(started)}"]
    figure = f"graphs with 2 workers per GPU refused: {refused.value}"
    conclude(Judgement(problems if started else [], figure, 1, "refusals"), "")


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
