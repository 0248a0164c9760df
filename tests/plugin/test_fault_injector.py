"""fault_injector: failing a call on cue, undoing the patch, and checking locks."""

from __future__ import annotations

import multiprocessing
import threading

import pytest

from pytest_cudagraph.engines.faults import FaultInjector


class GraphCache:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.captures = 0

    def capture(self, key: int) -> int:
        self.captures += 1
        return key * 10

    def get(self, key: int) -> int:
        with self.lock:
            return self.capture(key)

    def get_leaky(self, key: int) -> int:
        self.lock.acquire()
        value = self.capture(key)  # an exception here leaves the lock held
        self.lock.release()
        return value

    @staticmethod
    def bucket(n: int) -> int:
        return 1 << (n - 1).bit_length()

    @classmethod
    def name(cls) -> str:
        return cls.__name__


def test_raises_on_the_nth_call_only_and_counts_calls() -> None:
    cache, injector = GraphCache(), FaultInjector()
    fault = injector.fail(cache, "capture", on_call=2)
    assert cache.get(1) == 10
    with pytest.raises(RuntimeError, match="injected fault on call 2 of capture"):
        cache.get(2)
    assert cache.get(3) == 30
    assert (fault.calls, fault.raised, cache.captures) == (3, True, 2)


def test_custom_exception_class_or_instance() -> None:
    cache, injector = GraphCache(), FaultInjector()
    injector.fail(cache, "capture", exc=MemoryError)
    with pytest.raises(MemoryError):
        cache.capture(1)
    injector.fail(cache, "get", exc=TimeoutError("replay timed out"))
    with pytest.raises(TimeoutError, match="replay timed out"):
        cache.get(1)


def test_restore_undoes_instance_class_and_static_patches() -> None:
    cache, injector = GraphCache(), FaultInjector()
    injector.fail(cache, "capture", on_call=5)
    injector.fail(GraphCache, "get", on_call=5)
    injector.fail(GraphCache, "bucket", on_call=5)
    injector.fail(GraphCache, "name", on_call=5)
    assert (GraphCache().get(2), GraphCache.bucket(5), GraphCache().bucket(3)) == (20, 8, 4)
    assert (GraphCache.name(), GraphCache().name()) == ("GraphCache", "GraphCache")
    injector.restore()
    assert "capture" not in vars(cache)
    assert GraphCache.get.__name__ == "get"
    assert isinstance(vars(GraphCache)["bucket"], staticmethod)
    assert isinstance(vars(GraphCache)["name"], classmethod)
    assert injector.faults == []


def test_on_call_must_be_positive() -> None:
    with pytest.raises(ValueError, match="on_call must be an integer >= 1, got 0"):
        FaultInjector().fail(GraphCache(), "capture", on_call=0)


def test_lock_released_by_a_with_block_is_free() -> None:
    cache, injector = GraphCache(), FaultInjector()
    injector.fail(cache, "capture")
    with pytest.raises(RuntimeError):
        cache.get(1)
    injector.assert_lock_free(cache.lock)
    assert not cache.lock.locked()


def test_lock_left_held_is_reported_with_the_fault() -> None:
    cache, injector = GraphCache(), FaultInjector()
    injector.fail(cache, "capture")
    with pytest.raises(RuntimeError):
        cache.get_leaky(1)
    with pytest.raises(AssertionError) as raised:
        injector.assert_lock_free(cache.lock, "GraphCache.lock")
    assert str(raised.value) == (
        "fault_injector: GraphCache.lock is still held after RuntimeError('injected fault on "
        "call 1 of capture') on call 1 of GraphCache.capture: the code under test did not "
        "release it"
    )


def test_reentrant_lock_held_by_this_thread_counts_as_held() -> None:
    lock = threading.RLock()
    with lock, pytest.raises(AssertionError, match="is still held"):
        FaultInjector().assert_lock_free(lock)
    FaultInjector().assert_lock_free(lock)


def test_multiprocessing_lock() -> None:
    lock = multiprocessing.get_context("spawn").Lock()
    FaultInjector().assert_lock_free(lock)
    with lock, pytest.raises(AssertionError, match="is still held"):
        FaultInjector().assert_lock_free(lock)


def test_fixture_undoes_its_patches_at_teardown(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import json

        def test_patch(fault_injector):
            fault_injector.fail(json, "dumps")

        def test_restored():
            assert json.dumps(1) == "1"
        """
    )
    pytester.runpytest_inprocess().assert_outcomes(passed=2)
