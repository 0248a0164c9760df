"""fault_injector's restore: slots, a failing restore step, and monkeypatch in the same test."""

from __future__ import annotations

import multiprocessing
import threading
import types
from collections.abc import Callable

import pytest

from pytest_cudagraph.engines.faults import FaultInjector, LockLike, lock_held, release_held


class Slotted:
    __slots__ = ("hook",)

    def __init__(self) -> None:
        self.hook = lambda: "original hook"


class Guarded:
    """An object whose attributes cannot be deleted once it is sealed."""

    sealed = False

    def work(self) -> str:
        return "work"

    def rest(self) -> str:
        return "rest"

    def __delattr__(self, name: str) -> None:
        if type(self).sealed and name == "work":
            raise AttributeError(f"{name} is sealed")
        super().__delattr__(name)


def test_a_slot_attribute_is_put_back() -> None:
    target = Slotted()
    original = target.hook
    injector = FaultInjector()
    injector.fail(target, "hook")
    with pytest.raises(RuntimeError, match="injected fault"):
        target.hook()
    injector.restore()
    assert target.hook is original
    assert target.hook() == "original hook"


def test_an_unset_slot_is_left_unset() -> None:
    target = Slotted.__new__(Slotted)
    with pytest.raises(AttributeError):
        FaultInjector().fail(target, "hook")  # nothing to wrap: refused before patching
    assert not hasattr(target, "hook")


def test_a_failing_restore_step_does_not_stop_the_others() -> None:
    target = Guarded()
    module = types.SimpleNamespace(helper=lambda: "helper")
    original_helper = module.helper
    injector = FaultInjector()
    injector.fail(module, "helper")
    injector.fail(target, "rest")
    injector.fail(target, "work")  # undone first, and raises
    Guarded.sealed = True
    try:
        with pytest.raises(AttributeError, match="work is sealed"):
            injector.restore()
    finally:
        Guarded.sealed = False
    assert module.helper is original_helper
    assert "rest" not in vars(target)
    assert injector.faults == []


def test_several_failing_steps_are_all_named() -> None:
    class Stuck:
        def __setattr__(self, name: str, value: object) -> None:
            if getattr(self, "frozen", False):
                raise AttributeError(f"cannot set {name}")
            object.__setattr__(self, name, value)

    first, second = Stuck(), Stuck()
    for target in (first, second):
        target.call = lambda: 1
    injector = FaultInjector()
    injector.fail(first, "call")
    injector.fail(second, "call")
    object.__setattr__(first, "frozen", True)
    object.__setattr__(second, "frozen", True)
    with pytest.raises(RuntimeError, match=r"2 patches could not be undone") as raised:
        injector.restore()
    assert isinstance(raised.value.__cause__, AttributeError)


def test_a_restored_fault_put_back_by_another_patcher_no_longer_fails() -> None:
    module = types.SimpleNamespace(load=lambda: "loaded")
    injector = FaultInjector()
    fault = injector.fail(module, "load", on_call=1)
    injected = module.load
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(module, "load", lambda: "fake")
    injector.restore()  # the fault is no longer in place: nothing to put back
    monkeypatch.undo()  # puts the injected wrapper back, as monkeypatch recorded it
    assert module.load is injected
    assert module.load() == "loaded"
    assert fault.calls == 0


@pytest.mark.parametrize("fixtures", ["fault_injector, monkeypatch", "monkeypatch, fault_injector"])
@pytest.mark.parametrize("order", ["monkeypatch first", "fault first"])
def test_fault_injector_and_monkeypatch_compose_in_any_order(
    pytester: pytest.Pytester, fixtures: str, order: str
) -> None:
    """Fixture teardown runs in reverse set-up order, so either may undo first; the next
    test must see the original either way. One combination cannot be undone exactly
    from inside the injector: a fault monkeypatched over, with monkeypatch torn down last,
    gets the (disarmed) fault wrapper put back by monkeypatch; it calls straight through."""
    patches = (
        'monkeypatch.setattr(target, "load", lambda: "fake")',
        'fault_injector.fail(target, "load", on_call=1)',
    )
    first, second = patches if order == "monkeypatch first" else patches[::-1]
    exact = not (order == "fault first" and fixtures.startswith("monkeypatch"))
    pytester.makepyfile(
        f"""
        import types

        target = types.SimpleNamespace(load=lambda: "loaded")
        original = target.load

        def test_patches({fixtures}):
            {first}
            {second}

        def test_sees_the_original():
            assert target.load() == "loaded"
            assert (target.load is original) == {exact}
        """
    )
    pytester.runpytest_inprocess("-p", "pytest_cudagraph").assert_outcomes(passed=2)


class Cache:
    size = 3

    def capture(self) -> str:
        return "captured"


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"name": 3}, TypeError, "name must be a string, got 3"),
        ({"name": "missing"}, AttributeError, "Cache has no attribute 'missing' to fail"),
        ({"name": "size"}, TypeError, r"Cache\.size is not callable \(a int\)"),
        ({"on_call": 1.5}, TypeError, "on_call must be an integer, got 1.5"),
        ({"on_call": True}, TypeError, "on_call must be an integer, got True"),
        ({"on_call": 0}, ValueError, "on_call must be an integer >= 1, got 0"),
        ({"exc": "boom"}, TypeError, "exc must be an exception or an exception class, got 'boom'"),
        ({"exc": int}, TypeError, "exc must be an exception or an exception class"),
    ],
)
def test_bad_arguments_are_refused_before_patching(
    arguments: dict[str, object], error: type[Exception], message: str
) -> None:
    target = Cache()
    injector = FaultInjector()
    with pytest.raises(error, match=message):
        injector.fail(target, **{"name": "capture", **arguments})  # type: ignore[arg-type]
    assert (injector.faults, vars(target)) == ([], {})
    assert target.capture() == "captured"


def test_an_exception_class_or_instance_is_accepted() -> None:
    injector = FaultInjector()
    injector.fail(Cache(), "capture", exc=KeyboardInterrupt)
    injector.fail(Cache(), "capture", exc=OSError("disk"))
    injector.restore()


@pytest.mark.parametrize("lock", [object(), "lock", types.SimpleNamespace(acquire=1, release=2)])
def test_assert_lock_free_refuses_what_is_not_a_lock(lock: object) -> None:
    with pytest.raises(TypeError, match="lock must be a lock with acquire"):
        FaultInjector().assert_lock_free(lock)


def test_a_lock_that_cannot_be_tried_is_named() -> None:
    class Stubborn:
        def acquire(self) -> bool:  # takes no blocking flag
            return True

        def release(self) -> None:
            pass

    with pytest.raises(TypeError, match=r"is not a lock that can be tried without waiting"):
        FaultInjector().assert_lock_free(Stubborn())


def test_assert_lock_free_name_must_be_text() -> None:
    with pytest.raises(TypeError, match="name must be a string or None, got 3"):
        FaultInjector().assert_lock_free(threading.Lock(), 3)  # type: ignore[arg-type]


def test_one_attribute_patched_twice_is_restored_fully_newest_patch_first() -> None:
    target = types.SimpleNamespace(load=lambda: "loaded")
    original = target.load
    injector = FaultInjector()
    injector.fail(target, "load", on_call=5)
    injector.fail(target, "load", on_call=5)
    assert target.load is not original
    injector.restore()
    assert target.load is original  # undoing the older patch first would leave the newer's
    assert target.load() == "loaded"


def test_an_attribute_whose_reading_raises_is_named_before_patching() -> None:
    class Faulty:
        @property
        def capture(self) -> object:
            raise ValueError("not built yet")

    with pytest.raises(TypeError, match=r"reading Faulty.capture raised ValueError: not built yet"):
        FaultInjector().fail(Faulty(), "capture")


@pytest.mark.parametrize(
    "make",
    [threading.Lock, threading.RLock, threading.Condition, multiprocessing.RLock],
    ids=["Lock", "RLock", "Condition", "multiprocessing.RLock"],
)
def test_a_lock_held_by_this_thread_is_freed_level_by_level(make: Callable[[], LockLike]) -> None:
    lock = make()
    assert not lock_held(lock)
    lock.acquire()
    if make is not threading.Lock:  # re-entrant: held twice
        lock.acquire()
    assert lock_held(lock)
    release_held(lock)
    assert not lock_held(lock)


@pytest.mark.parametrize("make", [threading.RLock, threading.Condition], ids=["RLock", "Condition"])
def test_a_reentrant_lock_held_by_another_thread_is_named_not_released(
    make: Callable[[], LockLike],
) -> None:
    lock = make()
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            done.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(5)
    try:
        with pytest.raises(RuntimeError, match=r"is held by another thread, which alone can"):
            release_held(lock)
        assert lock_held(lock)
    finally:
        done.set()
        holder.join(5)
    assert not lock_held(lock)
