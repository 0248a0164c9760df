"""fault_injector's restore: slots, a failing restore step, and monkeypatch in the same test."""

from __future__ import annotations

import types

import pytest

from pytest_cudagraph.engines.faults import FaultInjector


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
