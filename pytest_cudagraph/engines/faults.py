"""fault_injector: make a named call raise on its N-th invocation, then check locks were freed.

Graph caches and worker pools take locks around capture and replay; the question these
helpers answer is whether an error in the middle leaves a lock held (``lock_held``, probed from
another thread), and how to free one that is (``release_held``).
"""

from __future__ import annotations

import inspect
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

_MISSING = object()


class LockLike(Protocol):
    """A lock that can be tried without waiting: threading.Lock and RLock, a Condition over
    either, multiprocessing.Lock and RLock. A check that finds it held after a fault releases
    it (``release_held``), so that the checks after it can run."""

    def acquire(self, blocking: bool = ..., /) -> bool: ...
    def release(self) -> None: ...


@dataclass
class InjectedFault:
    """One patched attribute; ``calls`` counts every call, the failing one included.

    After ``restore`` the replacement is disarmed: should another patcher put it back (one
    that recorded it as the value it replaced), calls go straight to the original.
    """

    target: object
    name: str
    on_call: int
    exc: BaseException | type[BaseException]
    calls: int = 0
    raised: bool = False
    armed: bool = True
    _restore: Callable[[], None] = field(default=lambda: None, repr=False)

    def describe(self) -> str:
        owner = getattr(self.target, "__name__", type(self.target).__name__)
        return f"{self.exc!r} on call {self.on_call} of {owner}.{self.name}"


class FaultInjector:
    """Patches attributes to fail on cue; every patch is undone at teardown (``restore``)."""

    def __init__(self) -> None:
        self.faults: list[InjectedFault] = []

    def fail(
        self,
        target: object,
        name: str,
        on_call: int = 1,
        exc: BaseException | type[BaseException] | None = None,
    ) -> InjectedFault:
        """Make ``target.name(...)`` raise ``exc`` on its ``on_call``-th call; other calls go
        through. The default ``exc`` is a RuntimeError saying which call was injected.

        Refused before anything is patched: a name that is not a string or names no callable
        attribute of ``target``, an ``on_call`` that is not an integer >= 1, an ``exc`` that is
        neither an exception nor an exception class."""
        if not isinstance(name, str):
            raise TypeError(f"fault_injector: name must be a string, got {name!r}")
        if isinstance(on_call, bool) or not isinstance(on_call, int):
            raise TypeError(f"fault_injector: on_call must be an integer, got {on_call!r}")
        if on_call < 1:
            raise ValueError(f"fault_injector: on_call must be an integer >= 1, got {on_call!r}")
        exception_class = isinstance(exc, type) and issubclass(exc, BaseException)
        if exc is not None and not (isinstance(exc, BaseException) or exception_class):
            raise TypeError(
                f"fault_injector: exc must be an exception or an exception class, got {exc!r}"
            )
        owner = getattr(target, "__name__", type(target).__name__)
        try:
            original = getattr(target, name)
        except AttributeError:
            raise AttributeError(
                f"fault_injector: {owner} has no attribute {name!r} to fail"
            ) from None
        except Exception as error:  # a property that raises
            raise TypeError(
                f"fault_injector: reading {owner}.{name} raised {type(error).__name__}: {error}"
            ) from error
        if not callable(original):
            raise TypeError(
                f"fault_injector: {owner}.{name} is not callable (a "
                f"{type(original).__name__}); only a call can be made to fail"
            )
        if exc is None:
            exc = RuntimeError(f"injected fault on call {on_call} of {name}")
        fault = InjectedFault(target, name, on_call, exc)

        def injected(*args: object, **kwargs: object) -> object:
            if not fault.armed:
                return original(*args, **kwargs)
            fault.calls += 1
            if fault.calls == on_call:
                fault.raised = True
                raise exc
            return original(*args, **kwargs)

        own = _own_value(target, name)
        replacement: object = injected
        static = isinstance(inspect.getattr_static(target, name), (staticmethod, classmethod))
        if inspect.isclass(target) and static:
            # ``original`` is already bound to the class; keep instances from binding it again.
            replacement = staticmethod(injected)
        setattr(target, name, replacement)
        fault._restore = lambda: _undo(target, name, replacement, own)
        self.faults.append(fault)
        return fault

    def assert_lock_free(self, lock: LockLike, name: str | None = None) -> None:
        """Assert ``lock`` can be taken without waiting (``lock_held``)."""
        if name is not None and not isinstance(name, str):
            raise TypeError(f"fault_injector: name must be a string or None, got {name!r}")
        if lock_held(lock):
            after = "; ".join(fault.describe() for fault in self.faults if fault.raised)
            raise AssertionError(
                f"fault_injector: {name or repr(lock)} is still held"
                + (f" after {after}" if after else "")
                + ": the code under test did not release it"
            )

    def restore(self) -> None:
        """Undo every patch, newest first; a step that raises does not stop the others, and
        the first such error is raised once all have run."""
        errors = []
        while self.faults:
            fault = self.faults.pop()
            fault.armed = False
            try:
                fault._restore()
            except Exception as error:
                errors.append(error)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise RuntimeError(
                f"fault_injector: {len(errors)} patches could not be undone: "
                + "; ".join(repr(error) for error in errors)
            ) from errors[0]


def lock_held(lock: LockLike) -> bool:
    """Whether ``lock`` (threading or multiprocessing) is held. The attempt to take it is made
    from another thread, so a re-entrant lock held by this thread counts as held; TypeError for
    what is not a lock, or one that cannot be tried without waiting."""
    if not all(callable(getattr(lock, method, None)) for method in ("acquire", "release")):
        raise TypeError(
            f"fault_injector: lock must be a lock with acquire() and release() (threading "
            f"or multiprocessing), got {lock!r}"
        )
    outcome: list[object] = []

    def try_acquire() -> None:
        try:
            taken = lock.acquire(False)
            if taken:
                lock.release()
            outcome.append(bool(taken))
        except Exception as error:  # reported from the caller's thread
            outcome.append(error)

    probe = threading.Thread(target=try_acquire, name="cudagraph-lock-probe")
    probe.start()
    probe.join()
    if isinstance(outcome[0], Exception):
        raise TypeError(
            f"fault_injector: {lock!r} is not a lock that can be tried without waiting: "
            f"acquire(False) raised {outcome[0]!r}"
        ) from outcome[0]
    return not outcome[0]


def release_held(lock: LockLike) -> None:
    """Free ``lock`` while it is held: a plain lock with one release (any thread may), a
    re-entrant one (an RLock, a Condition over one) with one release per level, by the thread
    that holds it. RuntimeError when another thread holds it: only that thread can free it."""
    while lock_held(lock):
        try:
            lock.release()
        except (RuntimeError, AssertionError, ValueError) as error:  # not this thread's
            raise RuntimeError(
                f"{lock!r} is held by another thread, which alone can release it ({error})"
            ) from None


def _own_value(target: object, name: str) -> object:
    """The value stored on ``target`` itself (its ``__dict__`` or a ``__slots__`` slot), or
    _MISSING when ``name`` comes from its class."""
    stored = getattr(target, "__dict__", {})
    if name in stored:
        return stored[name]
    if inspect.isclass(target):
        return _MISSING
    for klass in type(target).__mro__:
        slot = vars(klass).get(name)
        if isinstance(slot, types.MemberDescriptorType):
            try:
                return slot.__get__(target, type(target))
            except AttributeError:  # a slot never set
                return _MISSING
    return _MISSING


def _undo(target: object, name: str, replacement: object, own: object) -> None:
    """Put back what the patch replaced, but only while the patch is still in place.

    If the attribute holds something else, another patcher (monkeypatch) changed it after
    this patch and has already undone its own change, so its value is the right one: the
    fault_injector and monkeypatch fixtures are torn down in either order.
    """
    if _own_value(target, name) is not replacement:
        return
    if own is _MISSING:
        delattr(target, name)
    else:
        setattr(target, name, own)
