"""The conformance suite's shared helpers that need no GPU: running a function in a fresh
process, finding and freeing a held lock, walking outputs."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from pytest_cudagraph.conformance.support import lock_was_held, run_in_fresh_process, tensors_in
from pytest_cudagraph.conformance.target import CudaGraphTarget

# Run in the spawned children: module-level, so that the children can import them.


def child_pid_and_sum(a: int, b: int) -> tuple[int, int]:
    return os.getpid(), a + b


def child_raises() -> None:
    raise ValueError("bad thing in the child")


def child_dies() -> None:
    os._exit(3)


def test_a_fresh_process_returns_the_value_from_another_pid() -> None:
    pid, total = run_in_fresh_process(child_pid_and_sum, 2, 3, timeout=60)
    assert total == 5
    assert pid != os.getpid()


def test_a_fresh_process_reports_the_childs_error_and_death() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)child_raises failed.*ValueError: bad thing"):
        run_in_fresh_process(child_raises, timeout=60)
    with pytest.raises(RuntimeError, match=r"child_dies's process died \(exit code 3\)"):
        run_in_fresh_process(child_dies, timeout=60)


def target_with_lock(lock: object) -> CudaGraphTarget:
    return CudaGraphTarget(
        device=torch.device("cpu"),
        eager=lambda inputs: None,
        graphed=lambda inputs: None,
        make_inputs=lambda generator, case: {},
        key_of=lambda inputs: 0,
        num_keys=4,
        reset=lambda: None,
        lock=lock,
    )


def test_a_held_lock_is_reported_and_released() -> None:
    lock = threading.Lock()
    target = target_with_lock(lock)
    assert not lock_was_held(target)
    lock.acquire()
    assert lock_was_held(target)
    assert lock.acquire(blocking=False), "lock_was_held must release the lock it found held"
    lock.release()
    assert not lock_was_held(target_with_lock(None))


def test_tensors_are_found_in_nested_outputs() -> None:
    a, b, c = torch.zeros(1), torch.ones(2), torch.arange(3)
    assert tensors_in({"x": a, "rest": [b, (c, "label")]}) == [a, b, c]
    assert tensors_in(3) == []
