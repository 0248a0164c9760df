"""What a conformance target author writes: the target, its contract and its capabilities.

A factory ``make_target(device) -> CudaGraphTarget`` tells the suite how to call the code
eagerly and through its graphs, the graph keys it meets and how to draw one call's inputs for
each, and what the code promises (tolerance, real part, output lifetime, threads). Everything
else the code can give is a capability: a small frozen object in a slot of its own (``cache``,
``state``, ``sampling``, ...) that checks its fields when made. A check that needs a capability
the target does not give skips, naming it; ``pytest-cudagraph checks`` lists what each check
needs. Old spellings (0.3.0's flat fields, ``make_inputs``/``num_keys``) are still accepted,
with a DeprecationWarning naming the new one (``legacy``). No pytest here; torch is imported
only when a target is made.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict, TypeVar

from pytest_cudagraph.conformance import legacy
from pytest_cudagraph.engines.compare import EXACT, Tolerance
from pytest_cudagraph.engines.faults import LockLike

if TYPE_CHECKING:
    import torch

__all__ = [
    "CONCURRENT",
    "EXACT",
    "NEXT_CALL",
    "NEXT_CALL_OF_KEY",
    "OWNED",
    "SERIAL",
    "SINGLE",
    "Cache",
    "CaptureClean",
    "Case",
    "CudaGraphTarget",
    "Fallbacks",
    "Guards",
    "Padding",
    "Sampling",
    "State",
    "TargetOptions",
    "Tolerance",
    "Trajectory",
    "Workers",
]

# How long a graphed output stays valid (``CudaGraphTarget.output_lifetime``).
OWNED = "owned"  # the caller's for good: no later call changes it
NEXT_CALL_OF_KEY = "next call of its key"  # a static buffer per key (make_graphed_callables)
NEXT_CALL = "next call"  # one buffer for every key (a shared pool, cudagraph trees)
OUTPUT_LIFETIMES = (OWNED, NEXT_CALL_OF_KEY, NEXT_CALL)

# How the graphed path may be called from threads (``CudaGraphTarget.threads``).
CONCURRENT = "concurrent"  # from several threads at once
SERIAL = "serial"  # from any thread, one call at a time (the caller serializes)
SINGLE = "single"  # from one thread only
THREAD_MODELS = (CONCURRENT, SERIAL, SINGLE)

# What refuses an unsupported mode unless the target says otherwise (``Guards``).
USAGE_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, RuntimeError)
# The stages the lock-safety check injects a fault into when the target names its own.
FAULT_STAGES = ("warm_up", "capture", "replay")
# The largest real batch padded batches calls (it calls every size up to ``Padding.largest``,
# each on both sides); graph runners capture batches up to a few hundred rows.
MAX_PADDED_ROWS = 1024

Inputs = dict[str, Any]
# One entry of an output: a dict's key, or a tuple's or list's index.
Part = Hashable
# What ``real_part`` gives: an index of a tensor (a slice, an int, a tuple of them) for every
# tensor of the output, or such an index per part.
RealIndex = Any


@dataclass(frozen=True)
class Case:
    """What one draw is for: ``key``, one of the target's keys; ``repeat``, how many draws of
    that key came before it (shapes that vary inside a key, such as a real batch padded up to
    its bucket, come from it: two draws of one case must have the same shapes); ``number``,
    the suite's case number (case ``n`` lands in ``keys[n % len(keys)]``)."""

    number: int
    key: Hashable
    repeat: int


# Capabilities


class Capability:
    """What every capability shares: the target's slot it goes in (``SLOT``) and the fields it
    gives. Each subclass is a frozen dataclass that checks its fields when made."""

    SLOT: ClassVar[str]

    def given(self) -> list[str]:
        """The names of the fields this capability gives (not None)."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]  # type: ignore[arg-type]


C = TypeVar("C", bound=Capability)


@dataclass(frozen=True)
class Cache(Capability):
    """A graph cache the suite can control and look into; every field optional.

    reset(): drop every graph and buffer, in place (the objects named here stay valid). The
      suite calls it before and after each check; bounded memory needs it.
    lock: the cache's lock (acquire/release, any thread may release it). Every check fails when
      it is left held; lock safety checks it is free after each fault.
    cached_keys() -> the keys now cached: lock safety proves a failed build left no entry.
    capacity: how many graphs the cache keeps at most: captures and bounded memory need it;
      the checks that call each key again walk no more keys than this.
    largest_key: one of the target's keys, the one whose graph takes the most memory: bounded
      memory needs it (it measures that graph first).
    fault_points: stage -> (object, method name) for at least warm_up, capture and replay: lock
      safety makes each method raise on its next call (without them, it injects its faults at
      torch's own graph API).
    static() -> the tensors the graphs read at the addresses they were captured on (weights,
      static input and output buffers, a KV cache), as tensors, modules or containers of them:
      no rebound tensors judges these alone. Without it, it judges every tensor the graphed
      side holds that was alive when a graph was captured; give it when the graphed side also
      holds tensors it replaces that no graph reads (cudagraph trees copy such inputs into
      their own buffers).

    The lock may be a threading Lock, RLock or Condition, or a multiprocessing Lock or RLock:
    the checks try it from another thread. An asyncio lock (taken by awaiting it) and a
    semaphore (a count: a probe cannot tell one slot left taken) are refused."""

    SLOT: ClassVar[str] = "cache"

    reset: Callable[[], object] | None = None
    lock: LockLike | None = None
    cached_keys: Callable[[], Sequence[Hashable]] | None = None
    capacity: int | None = None
    largest_key: Hashable | None = None
    fault_points: Mapping[str, tuple[object, str]] | None = None
    static: Callable[[], object] | None = None

    def __post_init__(self) -> None:
        _callable_or_none(self, "reset", "cached_keys", "static")
        if self.capacity is not None:
            _count(self, "capacity", low=1)
        if self.lock is not None:
            _check_lock(self.lock)
        if self.fault_points is not None:
            _check_fault_points(self.fault_points)


@dataclass(frozen=True)
class State(Capability):
    """The state the code carries from one call to the next: a KV cache written in place,
    positions, lengths, running statistics, a counter.

    sides() -> (eager's, graphed's): what holds each side's state: modules (their parameters,
      buffers and tensor and number attributes) or tensors, alone or in dicts and lists. The
      two must be alike and apart (each side its own). Module state needs it, and every check
      that compares the two sides then compares their states too.
    reset(): end the state of both sides in place, as between two requests, keeping every
      graph. Giving it says calls are episodes: the stateful checks (state isolation, state
      reset) need it."""

    SLOT: ClassVar[str] = "state"

    sides: Callable[[], tuple[object, object]] | None = None
    reset: Callable[[], object] | None = None

    def __post_init__(self) -> None:
        _callable_or_none(self, "sides", "reset")
        if self.sides is None and self.reset is None:
            raise TypeError("State gives nothing: give sides, reset or both")


@dataclass(frozen=True)
class Sampling(Capability):
    """sample(seed, graphs) -> tokens: the code's sampler run under ``seed`` with its graphs on
    (``graphs=True``) or off. Identical sampling needs it."""

    SLOT: ClassVar[str] = "sampling"

    sample: Callable[[int, bool], object]

    def __post_init__(self) -> None:
        _callable(self, "sample")


@dataclass(frozen=True)
class Guards(Capability):
    """Modes the code must refuse. Guards needs it.

    modes: name -> (zero-arg callable, regex): calling it must raise one of ``refusal_errors``
      whose message matches the regex (says what is unmet); a regex that matches the empty
      message (``.*``, ``x*``) proves nothing and is refused.
    refusal_errors: the exception classes that refuse (default ValueError, TypeError,
      RuntimeError; add AssertionError for guards written as asserts)."""

    SLOT: ClassVar[str] = "guards"

    modes: Mapping[str, tuple[Callable[[], object], str]]
    refusal_errors: tuple[type[Exception], ...] = USAGE_ERRORS

    def __post_init__(self) -> None:
        if not isinstance(self.modes, Mapping) or not self.modes:
            raise TypeError("Guards.modes must be a non-empty mapping name -> (callable, regex)")
        for name, mode in self.modes.items():
            if not (
                isinstance(mode, tuple)
                and len(mode) == 2
                and callable(mode[0])
                and isinstance(mode[1], str)
                and mode[1]
            ):
                raise TypeError(
                    f"Guards.modes[{name!r}] must be (zero-arg callable, regex), got {mode!r}"
                )
            try:
                says_nothing = re.search(mode[1], "") is not None
            except (re.error, RecursionError, OverflowError) as error:
                raise ValueError(
                    f"Guards.modes[{name!r}]: {mode[1]!r} is not a regex ({error})"
                ) from None
            if says_nothing:
                raise ValueError(
                    f"Guards.modes[{name!r}]: {mode[1]!r} matches the empty message, so any "
                    "refusal would pass; give a regex of what the message says is unmet"
                )
        errors = self.refusal_errors
        if not (
            isinstance(errors, tuple)
            and errors
            and all(isinstance(error, type) and issubclass(error, Exception) for error in errors)
        ):
            raise TypeError(
                "Guards.refusal_errors must be a non-empty tuple of exception classes, got "
                f"{errors!r}"
            )


@dataclass(frozen=True)
class Workers(Capability):
    """run(workers_per_gpu, graphs) -> (results, eager answers): jobs through spawned worker
    processes sharing this device's lock, and the same jobs eagerly in this process; with
    graphs on and two workers per GPU it must raise ValueError before starting any process.
    Worker processes and worker refusal need it."""

    SLOT: ClassVar[str] = "workers"

    run: Callable[[int, bool], tuple[Sequence[object], Sequence[object]]]

    def __post_init__(self) -> None:
        _callable(self, "run")


@dataclass(frozen=True)
class Fallbacks(Capability):
    """When the graphed path runs without its graphs.

    graph_skips() -> reasons: every time it ran without its graph so far (a skipped capture, a
      re-recording past a limit), one reason each: graphs not skipped needs it.
    runs_eagerly(inputs) -> bool: whether the code runs this call without a graph by design
      (above its largest bucket, say): graphs used counts such calls instead of failing them.
      Anything but True or False (a shape, "no", [0]) is a TypeError naming it."""

    SLOT: ClassVar[str] = "fallbacks"

    graph_skips: Callable[[], Sequence[str]] | None = None
    runs_eagerly: Callable[[Inputs], bool] | None = None

    def __post_init__(self) -> None:
        _callable_or_none(self, "graph_skips", "runs_eagerly")
        if self.graph_skips is None and self.runs_eagerly is None:
            raise TypeError("Fallbacks gives nothing: give graph_skips, runs_eagerly or both")
        _checked(self, "runs_eagerly", _flag_rule)


@dataclass(frozen=True)
class CaptureClean(Capability):
    """forward(): one eager forward of the largest key on the device, which capture clean
    forward runs in sync debug mode "error" (it is called once before, so that first-use setup
    such as drawing its inputs is not judged)."""

    SLOT: ClassVar[str] = "capture_clean"

    forward: Callable[[], object]

    def __post_init__(self) -> None:
        _callable(self, "forward")


@dataclass(frozen=True)
class Padding(Capability):
    """How the code pads a real batch up to its bucket. Padded batches needs it.

    largest: the largest real batch the graphs serve, at most ``MAX_PADDED_ROWS`` (1024); the
      check calls every size from 1 to it.
    make_inputs(generator, rows) -> inputs: one call with exactly ``rows`` real rows (the rest
      of its bucket, if any, padding), its values from the generator.
    junk(inputs) -> inputs: the same call, as new tensors, with junk (NaN, or a value no real
      row may read) in the padded part the caller writes; None where the caller writes none
      (the code pads the batch itself).

    What each callback returns is checked on every call: a dict of input name -> value (junk's
    with the names of the inputs it was given), else a TypeError naming the field."""

    SLOT: ClassVar[str] = "padding"

    largest: int
    make_inputs: Callable[[torch.Generator, int], Inputs]
    junk: Callable[[Inputs], Inputs] | None = None

    def __post_init__(self) -> None:
        _count(self, "largest", low=1)
        if self.largest > MAX_PADDED_ROWS:
            raise ValueError(
                f"Padding.largest must be at most {MAX_PADDED_ROWS} (padded batches calls every "
                f"size up to it), got {self.largest}"
            )
        _callable(self, "make_inputs")
        _callable_or_none(self, "junk")
        _checked(self, "make_inputs", _inputs_rule)
        _checked(self, "junk", _same_call_rule)


@dataclass(frozen=True)
class Trajectory(Capability):
    """How one call leads to the next, each call one step. Trajectory needs it.

    next_inputs(inputs, output) -> inputs: the next step's inputs from this step's inputs and
      output (e.g. the prefixes with each row's most likely token appended).
    teacher_forced: both sides take the eager trajectory's inputs at every step (for code
      within a tolerance, whose token may flip); by default each follows its own outputs.
    case: the case the trajectory starts from.

    What next_inputs returns is checked on every call: a dict of input name -> value, else a
    TypeError naming the field."""

    SLOT: ClassVar[str] = "trajectory"

    next_inputs: Callable[[Inputs, Any], Inputs]
    teacher_forced: bool = False
    case: int = 0

    def __post_init__(self) -> None:
        _callable(self, "next_inputs")
        _checked(self, "next_inputs", _inputs_rule)
        if not isinstance(self.teacher_forced, bool):
            raise TypeError(
                f"Trajectory.teacher_forced must be True or False, got {self.teacher_forced!r}"
            )
        _count(self, "case", low=0)


CAPABILITIES: tuple[type[Capability], ...] = (
    Cache,
    State,
    Sampling,
    Guards,
    Workers,
    Fallbacks,
    CaptureClean,
    Padding,
    Trajectory,
)


# The target


@legacy.accepts_old_spellings(CAPABILITIES)
@dataclass(kw_only=True, eq=False)
class CudaGraphTarget:
    """What the conformance checks need to know about CUDA-graph code and its eager twin.

    The core (required):
      device: where the graphs live (the device the factory was called with).
      eager(inputs) -> outputs: the reference computation.
      graphed(inputs) -> outputs: the graphed path, equal to eager within ``tolerance``.
        Outputs are tensors, or containers of them (tuples, lists, dicts). None only away from
        CUDA, where the graphed path cannot run; the dry run then calls eager alone.
      keys: the graph keys to exercise (shapes, buckets); one is enough.
      draw(generator, case) -> inputs: one call's inputs for ``case.key`` (see Case): a dict of
        name -> value (tensors, and plain values such as a row count), every value drawn from
        ``generator`` on ``device``. Two draws of one case must be interchangeable input by
        input: the no-baked-inputs check swaps one tensor at a time between them.
      key_of(inputs) -> hashable: the code's own key for a call; it must tell the keys apart.
        Every key it returns is checked: a plain value, equal to itself and to the key of the
        same inputs again (not a tensor, NaN or a fresh object()), else a TypeError.

    The contract the code keeps (each has a default; every check honours it):
      tolerance: how close graphed must be to eager: one Tolerance for the whole output, or a
        mapping part -> Tolerance (a part is a key of a dict output, an index of a tuple or
        list output), parts not named exact.
      real_part(inputs) -> index, or {part: index}: which part of each output is real when
        the graph runs a padded bucket; the checks compare ``output[index]`` of both sides.
        None: every element is real.
      output_lifetime: how long a graphed output stays valid: ``owned`` (the caller's for
        good), ``next call of its key`` (a static buffer per key) or ``next call`` (one buffer
        for every key). The checks read an output before the call that may overwrite it.
      threads: ``concurrent`` (several threads at once), ``serial`` (any thread, one call at a
        time) or ``single`` (one thread): what the concurrency check holds it to.

    Capabilities (optional; each a class above, in the slot of its name): cache, state,
    sampling, guards, workers, fallbacks, capture_clean, padding, trajectory.
    """

    device: torch.device
    eager: Callable[[Inputs], object]
    graphed: Callable[[Inputs], object] | None
    keys: Sequence[Hashable]
    draw: Callable[[torch.Generator, Case], Inputs]
    key_of: Callable[[Inputs], Hashable]
    tolerance: Tolerance | Mapping[Part, Tolerance] = EXACT
    real_part: Callable[[Inputs], RealIndex | Mapping[Part, RealIndex]] | None = None
    output_lifetime: str = OWNED
    threads: str = CONCURRENT
    cache: Cache | None = None
    state: State | None = None
    sampling: Sampling | None = None
    guards: Guards | None = None
    workers: Workers | None = None
    fallbacks: Fallbacks | None = None
    capture_clean: CaptureClean | None = None
    padding: Padding | None = None
    trajectory: Trajectory | None = None

    def __post_init__(self) -> None:
        import torch

        if not isinstance(self.device, torch.device):
            raise TypeError(
                f"CudaGraphTarget.device must be a torch.device, got {self.device!r}"
                + (
                    f" (write torch.device({self.device!r}))"
                    if isinstance(self.device, str)
                    else ""
                )
            )
        _callable(self, "eager", "draw", "key_of")
        _callable_or_none(self, "graphed", "real_part")
        _checked(self, "key_of", _key_rule)
        if self.graphed is None and self.device.type == "cuda":
            raise TypeError(
                "CudaGraphTarget.graphed is None on a CUDA device; only away from CUDA may it be left out"
            )
        self.keys = checked_keys(self.keys)
        _check_tolerance(self.tolerance)
        _choice(self, "output_lifetime", OUTPUT_LIFETIMES)
        _choice(self, "threads", THREAD_MODELS)
        for kind in CAPABILITIES:
            value = getattr(self, kind.SLOT)
            if value is not None and not isinstance(value, kind):
                raise TypeError(
                    f"CudaGraphTarget.{kind.SLOT} must be a {kind.__name__}, got "
                    f"{type(value).__name__}"
                )
        if self.cache is not None and self.cache.largest_key is not None:
            if self.cache.largest_key not in self.keys:
                raise ValueError(
                    f"Cache.largest_key {self.cache.largest_key!r} is not one of the keys"
                )

    @property
    def num_keys(self) -> int:
        return len(self.keys)

    def case(self, number: int) -> Case:
        """Case ``number``: key ``keys[number % len(keys)]``, its ``number // len(keys)``-th draw."""
        repeat, index = divmod(number, len(self.keys))
        return Case(number, self.keys[index], repeat)

    def make_inputs(self, generator: torch.Generator, number: int) -> Inputs:
        """The inputs of case ``number``, drawn from ``generator``."""
        return self.draw(generator, self.case(number))

    def capability(self, kind: type[C]) -> C | None:
        """The capability of class ``kind`` the target gives, or None."""
        return getattr(self, kind.SLOT)

    def tolerance_of(self, part: Part | None) -> Tolerance:
        """The tolerance of one part of the output (None: the whole output)."""
        if isinstance(self.tolerance, Tolerance):
            return self.tolerance
        return self.tolerance.get(part, EXACT) if part is not None else EXACT

    def describe_tolerance(self) -> str:
        if isinstance(self.tolerance, Tolerance):
            return self.tolerance.describe()
        named = [f"{part!r} {tolerance.describe()}" for part, tolerance in self.tolerance.items()]
        return "; ".join([*named, f"other parts {EXACT.describe()}"])

    def __getattr__(self, name: str) -> Any:
        # Only names the class does not have reach here: 0.3.0's flat fields, read from their
        # new homes with a DeprecationWarning.
        return legacy.old_attribute(self, name, {"refusal_errors": USAGE_ERRORS})


class TargetOptions(TypedDict, total=False):
    """The target's fields an adapter takes by name: the contract and the capabilities (the
    fields of ``CudaGraphTarget`` after its core)."""

    tolerance: Tolerance | Mapping[Part, Tolerance]
    real_part: Callable[[Inputs], RealIndex | Mapping[Part, RealIndex]] | None
    output_lifetime: str
    threads: str
    cache: Cache | None
    state: State | None
    sampling: Sampling | None
    guards: Guards | None
    workers: Workers | None
    fallbacks: Fallbacks | None
    capture_clean: CaptureClean | None
    padding: Padding | None
    trajectory: Trajectory | None


def checked_keys(keys: object) -> Sequence[Hashable]:
    """``keys`` as a sequence of distinct hashable keys (a range as it is), or TypeError /
    ValueError naming what is wrong."""
    if isinstance(keys, range):
        if not keys:
            raise ValueError("CudaGraphTarget.keys must hold at least one graph key, got range()")
        return keys
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(
            f"CudaGraphTarget.keys must be a sequence of graph keys, got {type(keys).__name__}"
        )
    found = tuple(keys)
    for index, key in enumerate(found):
        try:
            hash(key)
        except TypeError:
            raise TypeError(
                f"CudaGraphTarget.keys[{index}] must be hashable, got {type(key).__name__} {key!r}"
            ) from None
    if not found or len(set(found)) != len(found):
        raise ValueError(
            f"CudaGraphTarget.keys must be at least one graph key, each once, got {list(found)!r}"
        )
    return found


# Callbacks whose every result is checked


@dataclass(frozen=True)
class CheckedCallback:
    """A callback of the user's whose every result is checked: ``rule(result, again, *args)``
    says what is wrong with it ("" when nothing; ``again()`` calls the callback anew on the same
    arguments), and a wrong result is a TypeError naming ``field``. It returns what the
    callback returns."""

    function: Callable[..., object]
    field: str
    rule: Callable[..., str]

    def __call__(self, *args: object) -> Any:
        result = self.function(*args)
        problem = self.rule(result, lambda: self.function(*args), *args)
        if problem:
            raise TypeError(f"{self.field} {problem}")
        return result


def _checked(owner: object, name: str, rule: Callable[..., str]) -> None:
    """Wrap the callback ``owner.name`` (when given, and not wrapped yet) in ``rule``."""
    function = getattr(owner, name)
    if function is not None and not isinstance(function, CheckedCallback):
        object.__setattr__(owner, name, CheckedCallback(function, _named(owner, name), rule))


def _inputs_rule(result: object, again: object, *args: object) -> str:
    if isinstance(result, dict) and all(isinstance(name, str) for name in result):
        return ""
    return f"returned {_shown(result)}; it must return a dict of input name -> value"


def _same_call_rule(result: object, again: object, inputs: Inputs) -> str:
    problem = _inputs_rule(result, again)
    if problem or not isinstance(result, dict) or set(result) == set(inputs):
        return problem
    return (
        f"returned inputs named {sorted(result)}, not the call's {sorted(inputs)}: it must "
        "return the same call"
    )


def _flag_rule(result: object, again: object, *args: object) -> str:
    if isinstance(result, bool):
        return ""
    return f"returned {_shown(result)}; it must return True or False"


def _key_rule(key: object, again: Callable[[], object], *args: object) -> str:
    return key_problem(key, again, "for the same inputs")


def key_problem(key: object, other: Callable[[], object], of: str) -> str:
    """What is wrong with a graph key ``key_of`` returned ("" when nothing): it must be a plain
    value, equal to itself and to ``other()``, the key of the same call taken again (``of``
    says which): a tensor, NaN or a fresh ``object()`` never finds its graph again."""
    import torch

    if isinstance(key, torch.Tensor):
        return (
            f"returned a tensor ({_shown(key)}); a key must be a plain value, e.g. int(x) or "
            "tuple(x.shape)"
        )
    try:
        hash(key)
        second = other()
        itself, alike = bool(key == key), bool(key == second) and hash(key) == hash(second)
    except Exception as error:  # an unhashable key, or one whose == raises
        return f"returned {_shown(key)}, which cannot be a key: {type(error).__name__}: {error}"
    if not itself:
        return f"returned {_shown(key)}, which is not equal to itself (NaN): no call finds it again"
    if not alike:
        return (
            f"gave two keys {of} ({_shown(key)}, then {_shown(second)}): a key must be a "
            "plain value that compares equal, not a fresh object"
        )
    return ""


def _shown(value: object) -> str:
    """A value as a message shows it: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


# The checks of the fields, each naming ``Class.field``


def _named(owner: object, name: str) -> str:
    return f"{type(owner).__name__}.{name}"


def _callable(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if not callable(value):
            raise TypeError(f"{_named(owner, name)} must be callable, got {type(value).__name__}")


def _callable_or_none(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if value is not None and not callable(value):
            raise TypeError(
                f"{_named(owner, name)} must be callable or None, got {type(value).__name__}"
            )


def _count(owner: object, name: str, *, low: int) -> None:
    value = getattr(owner, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{_named(owner, name)} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{_named(owner, name)} must be >= {low}, got {value!r}")


def _choice(owner: object, name: str, choices: Sequence[str]) -> None:
    value = getattr(owner, name)
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"{_named(owner, name)} must be one of {listed}, got {value!r}")


def _check_tolerance(tolerance: object) -> None:
    if isinstance(tolerance, Tolerance):
        return
    if not isinstance(tolerance, Mapping):
        raise TypeError(
            "CudaGraphTarget.tolerance must be a Tolerance or a mapping output part -> "
            f"Tolerance, got {type(tolerance).__name__}"
        )
    if not tolerance:
        raise ValueError(
            "CudaGraphTarget.tolerance must name at least one output part when a mapping"
        )
    for part, value in tolerance.items():
        if not isinstance(value, Tolerance):
            raise TypeError(
                f"CudaGraphTarget.tolerance[{part!r}] must be a Tolerance, got {type(value).__name__}"
            )


def _check_lock(lock: LockLike) -> None:
    """A lock the checks can try from another thread, or TypeError naming what it is."""
    if not (callable(getattr(lock, "acquire", None)) and callable(getattr(lock, "release", None))):
        raise TypeError(f"Cache.lock must have acquire() and release(), got {type(lock).__name__}")
    kind = f"{type(lock).__module__}.{type(lock).__qualname__}"
    if inspect.iscoroutinefunction(lock.acquire):
        raise TypeError(
            f"Cache.lock is an asyncio lock ({kind}), taken by awaiting it: the checks try the "
            "lock from another thread; give the threading or multiprocessing lock around the "
            "graphs"
        )
    multiprocessing_semaphore = type(lock).__module__ == "multiprocessing.synchronize" and any(
        klass.__name__ == "Semaphore" for klass in type(lock).__mro__
    )
    if isinstance(lock, threading.Semaphore) or multiprocessing_semaphore:
        raise TypeError(
            f"Cache.lock is a semaphore ({kind}): a count, not a lock, and a probe cannot tell "
            "one slot left taken; give the lock the cache takes around its graphs"
        )


def _check_fault_points(points: object) -> None:
    if not isinstance(points, Mapping):
        raise TypeError(f"Cache.fault_points must be a mapping, got {type(points).__name__}")
    try:
        entries = list(points.items())
    except Exception as error:  # a mapping whose reading raises
        raise ValueError(
            f"Cache.fault_points: reading its entries raised {type(error).__name__}: {error}"
        ) from None
    missing = [stage for stage in FAULT_STAGES if stage not in dict(entries)]
    if missing:
        raise ValueError(f"Cache.fault_points lacks the stage(s) {', '.join(missing)}")
    for stage, point in entries:
        if not (isinstance(point, tuple) and len(point) == 2 and isinstance(point[1], str)):
            raise TypeError(
                f"Cache.fault_points[{stage!r}] must be (object, method name), got {point!r}"
            )
        owner, attribute = point
        try:
            found = getattr(owner, attribute, None)
        except Exception as error:  # a property that raises
            raise ValueError(
                f"Cache.fault_points[{stage!r}]: reading {type(owner).__name__}.{attribute} "
                f"raised {type(error).__name__}: {error}"
            ) from None
        if not callable(found):
            raise ValueError(
                f"Cache.fault_points[{stage!r}]: {type(owner).__name__} has no method {attribute!r}"
            )
