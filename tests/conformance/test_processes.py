"""pytest_cudagraph.conformance._processes on the CPU: a function run in a freshly spawned
process gives back its value, its error or its death."""

from __future__ import annotations

import os

import pytest

from pytest_cudagraph.conformance._processes import run_in_fresh_process

# Run in the spawned children: module-level, so that the children can import them.


def child_pid_and_sum(a: int, b: int) -> tuple[int, int]:
    return os.getpid(), a + b


def child_raises() -> None:
    raise ValueError("bad thing in the child")


def child_dies() -> None:
    os._exit(3)


@pytest.mark.slow
def test_a_fresh_process_returns_the_value_from_another_pid() -> None:
    pid, total = run_in_fresh_process(child_pid_and_sum, 2, 3, timeout=60)
    assert total == 5
    assert pid != os.getpid()


@pytest.mark.slow
def test_a_fresh_process_reports_the_childs_error_and_death() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)child_raises failed.*ValueError: bad thing"):
        run_in_fresh_process(child_raises, timeout=60)
    with pytest.raises(RuntimeError, match=r"child_dies's process died \(exit code 3\)"):
        run_in_fresh_process(child_dies, timeout=60)
