"""What a conformance target author writes: the target, its contract and its capabilities.

A factory ``make_target(device) -> CudaGraphTarget`` tells the suite how to call the code
eagerly and through its graphs, the graph keys it meets and how to draw one call's inputs for
each, and what the code promises (tolerance, real part, output lifetime, threads, the generators
it samples with). Everything else the code can give is a capability: a small frozen object in a
slot of its own (``cache``, ``state``, ``sampling``, ...) that checks its fields when made. A
check that needs a capability the target does not give skips, naming it; ``pytest-cudagraph
checks`` lists what each check needs. Layers on top may accept other releases' spellings of the
target (``SPELLINGS``). No pytest here; torch is imported only when a target is made.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypedDict

from pytest_cudagraph.conformance import _validation as valid
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
    "Inputs",
    "OutputLifetime",
    "Padding",
    "Sampling",
    "State",
    "TargetOptions",
    "Threads",
    "Tolerance",
    "Trajectory",
    "Workers",
    "graphs_on",
]

# How long a graphed output stays valid (``CudaGraphTarget.output_lifetime``).
OutputLifetime = Literal["owned", "next call of its key", "next call"]
OWNED: OutputLifetime = "owned"  # the caller's for good: no later call changes it
NEXT_CALL_OF_KEY: OutputLifetime = "next call of its key"  # a static buffer per key
NEXT_CALL: OutputLifetime = "next call"  # one buffer for every key (cudagraph trees)
OUTPUT_LIFETIMES: tuple[OutputLifetime, ...] = (OWNED, NEXT_CALL_OF_KEY, NEXT_CALL)

# How the graphed path may be called from threads (``CudaGraphTarget.threads``).
Threads = Literal["concurrent", "serial", "single"]
CONCURRENT: Threads = "concurrent"  # from several threads at once
SERIAL: Threads = "serial"  # from any thread, one call at a time (the caller serializes)
SINGLE: Threads = "single"  # from one thread only
THREAD_MODELS: tuple[Threads, ...] = (CONCURRENT, SERIAL, SINGLE)

# What refuses an unsupported mode unless the target says otherwise (``Guards``).
USAGE_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, RuntimeError)
# The largest real batch padded batches calls (it calls every size up to ``Padding.largest``,
# each on both sides); graph runners capture batches up to a few hundred rows.
MAX_PADDED_ROWS = 1024
# The longest episode a target may declare (``State.episode_calls``): each stateful check makes
# whole episodes on both sides.
MAX_EPISODE_CALLS = 4096

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


def graphs_on(device: torch.device) -> bool:
    """Whether graph code can run on ``device``: a CUDA device, or any where CUDA graphs are
    emulated on the CPU (the conformance suite's runs without CUDA, ``--cudagraph-emulate``).
    A factory builds its graphs where this holds and gives ``graphed=None`` elsewhere."""
    from pytest_cudagraph.engines import emulation

    return device.type == "cuda" or emulation.active()


# Capabilities


@dataclass(frozen=True)
class Capability:
    """What every capability shares: the target's slot it goes in (``SLOT``) and the fields it
    gives. Each subclass is a frozen dataclass that checks its fields when made."""

    SLOT: ClassVar[str]

    def given(self) -> list[str]:
        """The names of the fields this capability gives (not None)."""
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]


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
      no rebound tensors judges these where it saw no capture of its own (where it saw one, it
      judges what that capture read).

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
        for name in ("reset", "cached_keys", "static"):
            valid.require_callable(f"Cache.{name}", getattr(self, name), optional=True)
        if self.capacity is not None:
            valid.require_count("Cache.capacity", self.capacity, low=1)
        if self.lock is not None:
            valid.check_lock(self.lock)
        if self.fault_points is not None:
            valid.check_fault_points(self.fault_points)


@dataclass(frozen=True)
class State(Capability):
    """The state the code carries from one call to the next: a KV cache written in place,
    positions, lengths, running statistics, a counter.

    sides() -> (eager's, graphed's): what holds each side's state, the same objects on every
      call (not copies): modules (their parameters, buffers, tensor, number and array attributes
      and namespaces, lists and dicts of them), runner objects, tensors, alone or in dicts and
      lists. The two must be alike and apart (each side its own). Every check that compares the
      two sides then compares their states too; the eager side is the reference, never written
      from the graphed side.
    reset(): end the state of both sides in place, as between two requests, keeping every
      graph. Giving it says calls are episodes: the stateful checks (state isolation, state
      reset) need it.
    episode_calls: how many calls one episode takes, at most (a KV cache of N positions decoded
      one token a call: N), so that accumulating state is judged in whole episodes; without it
      the suite finds the length, calling the eager side from a reset until a call raises."""

    SLOT: ClassVar[str] = "state"

    sides: Callable[[], tuple[object, object]] | None = None
    reset: Callable[[], object] | None = None
    episode_calls: int | None = None

    def __post_init__(self) -> None:
        valid.require_callable("State.sides", self.sides, optional=True)
        valid.require_callable("State.reset", self.reset, optional=True)
        if self.sides is None and self.reset is None:
            raise TypeError("State gives nothing: give sides, reset or both")
        if self.episode_calls is not None:
            valid.require_count("State.episode_calls", self.episode_calls, low=1)
            if self.episode_calls > MAX_EPISODE_CALLS:
                raise ValueError(
                    f"State.episode_calls must be at most {MAX_EPISODE_CALLS}, got "
                    f"{self.episode_calls}"
                )


@dataclass(frozen=True)
class Sampling(Capability):
    """sample(seed, graphs) -> tokens: the code's sampler run under ``seed`` with its graphs on
    (``graphs=True``) or off. Identical sampling needs it."""

    SLOT: ClassVar[str] = "sampling"

    sample: Callable[[int, bool], object]

    def __post_init__(self) -> None:
        valid.require_callable("Sampling.sample", self.sample)


@dataclass(frozen=True)
class Guards(Capability):
    """Modes the code must refuse. Guards needs it.

    modes: name -> (zero-arg callable, regex): calling it must raise one of ``refusal_errors``
      whose message matches the regex (says what is unmet); a regex that matches the empty
      message or any message (``.*``, ``.``, ``\\w``) proves nothing and is refused.
    refusal_errors: the exception classes that refuse (default ValueError, TypeError,
      RuntimeError; add AssertionError for guards written as asserts)."""

    SLOT: ClassVar[str] = "guards"

    modes: Mapping[str, tuple[Callable[[], object], str]]
    refusal_errors: tuple[type[Exception], ...] = USAGE_ERRORS

    def __post_init__(self) -> None:
        valid.check_guard_modes(self.modes)
        valid.check_refusal_errors(self.refusal_errors)


@dataclass(frozen=True)
class Workers(Capability):
    """run(workers_per_gpu, graphs) -> (results, eager answers): jobs through spawned worker
    processes sharing this device's lock, and the same jobs eagerly in this process; with
    graphs on and two workers per GPU it must raise ValueError before starting any process.
    Worker processes and worker refusal need it."""

    SLOT: ClassVar[str] = "workers"

    run: Callable[[int, bool], tuple[Sequence[object], Sequence[object]]]

    def __post_init__(self) -> None:
        valid.require_callable("Workers.run", self.run)


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
        valid.require_callable("Fallbacks.graph_skips", self.graph_skips, optional=True)
        valid.require_callable("Fallbacks.runs_eagerly", self.runs_eagerly, optional=True)
        if self.graph_skips is None and self.runs_eagerly is None:
            raise TypeError("Fallbacks gives nothing: give graph_skips, runs_eagerly or both")
        valid.wrap_checked(self, "runs_eagerly", valid.flag_rule)


@dataclass(frozen=True)
class CaptureClean(Capability):
    """forward(): one eager forward of the largest key on the device, which capture clean
    forward runs in sync debug mode "error" (it is called once before, so that first-use setup
    such as drawing its inputs is not judged)."""

    SLOT: ClassVar[str] = "capture_clean"

    forward: Callable[[], object]

    def __post_init__(self) -> None:
        valid.require_callable("CaptureClean.forward", self.forward)


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
        valid.require_count("Padding.largest", self.largest, low=1)
        if self.largest > MAX_PADDED_ROWS:
            raise ValueError(
                f"Padding.largest must be at most {MAX_PADDED_ROWS} (padded batches calls every "
                f"size up to it), got {self.largest}"
            )
        valid.require_callable("Padding.make_inputs", self.make_inputs)
        valid.require_callable("Padding.junk", self.junk, optional=True)
        valid.wrap_checked(self, "make_inputs", valid.inputs_rule)
        valid.wrap_checked(self, "junk", valid.same_call_rule)


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
        valid.require_callable("Trajectory.next_inputs", self.next_inputs)
        valid.wrap_checked(self, "next_inputs", valid.inputs_rule)
        valid.require_flag("Trajectory.teacher_forced", self.teacher_forced)
        valid.require_count("Trajectory.case", self.case, low=0)


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


# Other releases' spellings, which layers on top may accept


class Spelling(Protocol):
    """Another release's spelling of the target, accepted by a layer on top of the protocol
    (registered in ``SPELLINGS``): the field names it takes beside the target's own, how it
    translates a construction's fields, and how it reads an attribute the target does not have
    (AttributeError when the name is not one of its)."""

    names: frozenset[str]

    def translate(self, owner: str, given: dict[str, object]) -> dict[str, object]: ...

    def read(self, target: CudaGraphTarget, name: str) -> object: ...


SPELLINGS: list[Spelling] = []


def spelled_names() -> frozenset[str]:
    """Every field name the registered spellings accept beside the target's own."""
    return frozenset().union(*(spelling.names for spelling in SPELLINGS))


def translated(owner: str, given: dict[str, object]) -> dict[str, object]:
    """``given`` (the fields of a target ``owner`` builds) with every registered spelling's
    names translated into the target's own."""
    for spelling in SPELLINGS:
        if spelling.names & given.keys():
            given = spelling.translate(owner, given)
    return given


# The target


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
      key_of(inputs) -> hashable: the code's own key for a call; it must give each case's key
        (``key_of(draw(generator, case)) == case.key``). Every key it returns is checked: a
        plain value, equal to itself and to the key of the same inputs again (not a tensor, NaN
        or a fresh object()), else a TypeError.

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
      generators() -> the torch.Generators the code draws from itself (a sampler's own), both
        sides': the suite seeds each with the call's seed before every call of either side, as
        it seeds torch's default generators.

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
    output_lifetime: OutputLifetime = OWNED
    threads: Threads = CONCURRENT
    generators: Callable[[], Iterable[torch.Generator]] | None = None
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
        for name in ("eager", "draw", "key_of"):
            valid.require_callable(f"CudaGraphTarget.{name}", getattr(self, name))
        for name in ("graphed", "real_part", "generators"):
            valid.require_callable(f"CudaGraphTarget.{name}", getattr(self, name), optional=True)
        valid.wrap_checked(self, "key_of", valid.key_rule)
        if self.graphed is None and self.device.type == "cuda":
            raise TypeError(
                "CudaGraphTarget.graphed is None on a CUDA device; only away from CUDA may it be "
                "left out"
            )
        self.keys = valid.checked_keys(self.keys)
        valid.check_tolerance(self.tolerance)
        valid.require_choice(
            "CudaGraphTarget.output_lifetime", self.output_lifetime, OUTPUT_LIFETIMES
        )
        valid.require_choice("CudaGraphTarget.threads", self.threads, THREAD_MODELS)
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

    def __getattr__(self, name: str) -> Any:
        # Only names the class does not have reach here: another release's, where a layer on
        # top reads it.
        for spelling in SPELLINGS:
            try:
                return spelling.read(self, name)
            except AttributeError:
                continue
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def _accepting_spellings(init: Callable[..., None]) -> Callable[..., None]:
    """The target's ``__init__``, taking the names a registered spelling translates too."""

    @functools.wraps(init)
    def __init__(self: CudaGraphTarget, **given: object) -> None:
        init(self, **translated(type(self).__name__, given))

    return __init__


CudaGraphTarget.__init__ = _accepting_spellings(CudaGraphTarget.__init__)  # type: ignore[method-assign]


class TargetOptions(TypedDict, total=False):
    """The target's fields an adapter takes by name: the contract and the capabilities (the
    fields of ``CudaGraphTarget`` after its core)."""

    tolerance: Tolerance | Mapping[Part, Tolerance]
    real_part: Callable[[Inputs], RealIndex | Mapping[Part, RealIndex]] | None
    output_lifetime: OutputLifetime
    threads: Threads
    generators: Callable[[], Iterable[torch.Generator]] | None
    cache: Cache | None
    state: State | None
    sampling: Sampling | None
    guards: Guards | None
    workers: Workers | None
    fallbacks: Fallbacks | None
    capture_clean: CaptureClean | None
    padding: Padding | None
    trajectory: Trajectory | None
