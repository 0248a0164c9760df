"""The conformance suite's view of CUDA-graph code: a small adapter a user writes once.

A target is built by a factory, chosen by ``--cudagraph-target`` (env PYTEST_CUDAGRAPH_TARGET,
ini ``cudagraph_target``) as either an installed name (entry-point group
``pytest_cudagraph.targets``; ``python -m pytest_cudagraph.conformance.target`` lists them) or
``module:factory``. With none chosen, the one installed target is the default. The module of a
``module:factory`` imports as a test module would: from the rootdir and ``pythonpath`` too.

The factory is called once per test session with the torch.device the process is bound to (the
CPU when CUDA is missing, so that the checks that need no GPU still run) and returns a
``CudaGraphTarget``: a small core (device, eager, graphed, make_inputs, key_of, num_keys), the
contract the code keeps (tolerance, real part, output lifetime, threads, refusals) and optional
capabilities; a check whose capability is missing skips, naming it.

Cases. ``make_inputs(generator, case)`` maps an int ``case`` to one call's inputs: a dict of
name -> value (tensors, and plain values such as a row count). The case fixes the graph key:
case ``c`` lands in key number ``c % num_keys``, so cases ``k, k + num_keys, ...`` share a key,
and it fixes the shapes (a real batch inside its bucket may vary from one case of a key to the
next). The generator gives the values. Two draws of one case must be interchangeable input by
input: the no-baked-inputs check swaps one tensor at a time between them.

This module imports torch only when a target is built or validated, so that the plugin costs
nothing when the suite does not run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import sys
import traceback
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# The comparison engine's tolerance is the protocol's: given here by name too.
from pytest_cudagraph.engines.compare import EXACT, Tolerance
from pytest_cudagraph.engines.faults import LockLike

if TYPE_CHECKING:
    import torch

ENTRY_POINT_GROUP = "pytest_cudagraph.targets"
# Where the suite's checks live: a session that collected one of them runs the suite.
CHECKS_FOLDER = Path(__file__).parent

# The stages a fault is injected into by the lock-safety check when the target names its own
# fault points; a target may name more.
FAULT_STAGES = ("warm_up", "capture", "replay")

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

# What refuses an unsupported mode unless the target says otherwise.
USAGE_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, RuntimeError)

Inputs = dict[str, Any]
# One entry of an output: a dict's key or a tuple's or list's index.
Part = Hashable
# What ``real_part`` gives: an index of a tensor (a slice, an int, a tuple of them) for every
# tensor of the output, or such an index per part.
RealIndex = Any


@dataclass(frozen=True)
class Padding:
    """How the code pads a real batch up to its bucket: what the padded-batches check needs.

    largest: the largest real batch the graphs serve; the check calls every size from 1 to it.
    make_inputs(generator, rows) -> inputs: one call with exactly ``rows`` real rows (the rest
      of its bucket, if any, padding), its values from the generator.
    junk(inputs) -> inputs: the same call, as new tensors, with junk (NaN, or a value no real
      row may read) in the padded part the caller writes; None where the caller writes none
      (the code pads the batch itself)."""

    largest: int
    make_inputs: Callable[[torch.Generator, int], Inputs]
    junk: Callable[[Inputs], Inputs] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.largest, bool) or not isinstance(self.largest, int):
            raise TypeError(f"Padding.largest must be an int, got {self.largest!r}")
        if self.largest < 1:
            raise ValueError(f"Padding.largest must be >= 1, got {self.largest!r}")
        if not callable(self.make_inputs):
            raise TypeError(
                f"Padding.make_inputs must be callable, got {type(self.make_inputs).__name__}"
            )
        if self.junk is not None and not callable(self.junk):
            raise TypeError(
                f"Padding.junk must be callable or None, got {type(self.junk).__name__}"
            )


@dataclass(frozen=True)
class Trajectory:
    """How one step leads to the next: what the trajectory check needs, each call one step.

    next_inputs(inputs, output) -> inputs: the next step's inputs from this step's inputs and
      output (e.g. the prefixes with each row's most likely token appended).
    teacher_forced: both sides take the eager trajectory's inputs at every step, so that each
      step is judged on eager's path (for code within a tolerance, whose token may flip); by
      default each side follows its own outputs, as a decode does.
    case: the case the trajectory starts from."""

    next_inputs: Callable[[Inputs, Any], Inputs]
    teacher_forced: bool = False
    case: int = 0

    def __post_init__(self) -> None:
        if not callable(self.next_inputs):
            raise TypeError(
                f"Trajectory.next_inputs must be callable, got {type(self.next_inputs).__name__}"
            )
        if not isinstance(self.teacher_forced, bool):
            raise TypeError(
                f"Trajectory.teacher_forced must be True or False, got {self.teacher_forced!r}"
            )
        if isinstance(self.case, bool) or not isinstance(self.case, int):
            raise TypeError(f"Trajectory.case must be an int, got {self.case!r}")
        if self.case < 0:
            raise ValueError(f"Trajectory.case must be >= 0, got {self.case!r}")


@dataclass(kw_only=True)
class CudaGraphTarget:
    """What the conformance checks need to know about CUDA-graph code and its eager twin.

    The core (required):
      device: where the graphs live (the device the factory was called with).
      eager(inputs) -> outputs: the reference computation.
      graphed(inputs) -> outputs: the graphed path; equal to eager within ``tolerance``.
        Outputs are tensors, or containers of them (tuples, lists, dicts). None only where the
        device is not CUDA and the graphed path cannot run there; the dry run then calls eager
        alone.
      make_inputs(generator, case) -> inputs: see the module docstring.
      key_of(inputs) -> hashable: the graph key those inputs land in.
      num_keys: how many keys the cases cycle through (at least 1: one graph is a target).

    The contract the code keeps (each has a default; every check honours it):
      tolerance: how close graphed must be to eager: one Tolerance for the whole output, or a
        mapping part -> Tolerance (a part is a key of a dict output, an index of a tuple or
        list output), parts not named exact (default exact; see Tolerance).
      real_part(inputs) -> index, or {part: index}: which part of each output is real when
        the graph runs a padded bucket; the checks compare ``output[index]`` of both sides (an
        index such as ``slice(0, rows)`` leaves a side already ``rows`` long as it is). None:
        every element is real.
      output_lifetime: how long a graphed output stays valid: ``owned`` (the caller's for
        good), ``next call of its key`` (a static buffer per key) or ``next call`` (one buffer
        for every key). The checks read an output before the call that may overwrite it, and
        the owned-outputs check checks what is declared.
      threads: ``concurrent`` (several threads at once), ``serial`` (any thread, one call at a
        time) or ``single`` (one thread): what the concurrency check holds it to.
      refusal_errors: the exception classes that refuse an unsupported mode (default
        ValueError, TypeError, RuntimeError; add AssertionError for guards written as asserts).

    Capabilities (optional; None: the checks that need one skip, naming it):
      reset(): drop every graph and buffer, in place (the objects named below stay valid);
        called before each check.
      reset_state(): for a stateful target, one whose graphed path keeps state between calls (a
        KV cache, positions, lengths): end that state, as between two targets, in place, keeping
        every graph. Giving it says the target is stateful; each call is then an episode (the
        inputs that build the state and every step's inputs; the output of every step and the
        state it leaves) and the stateful checks run (docs/conformance.md, "Stateful targets").
      lock: the cache's lock (see LockLike).
      cached_keys() -> the keys now cached, to prove that a failed call left no entry.
      fault_points: stage -> (object, method name) for at least warm_up, capture and replay;
        the check makes that method raise on its next call. Without them the lock-safety check
        injects its faults at torch's own graph API.
      capacity: how many graphs the code keeps at most.
      largest_case: a case landing in the key whose graph takes the most memory.
      capture_clean_forward(): one eager forward of the largest key on the device. It is called
        once before the checked call, so first-use setup (drawing its inputs) is not judged.
      sampler(seed, graphs) -> tokens: sampling under ``seed`` with graphs on or off.
      unsupported_modes: name -> (zero-arg callable, regex): the call must raise one of
        ``refusal_errors`` whose message matches the regex.
      graph_skips() -> reasons: every time the graphed path ran without its graph so far (a
        skipped capture, a re-recording past the limit), one reason each.
      run_workers(workers_per_gpu, graphs) -> (results, eager answers): runs jobs through
        spawned worker processes sharing this device's lock, and the same jobs eagerly in
        this process; with graphs on and two workers per GPU it must raise ValueError before
        starting any process.
      padding: how a real batch is padded up to its bucket (see Padding).
      runs_eagerly(inputs) -> bool: whether the code runs this call without a graph by design
        (above its largest bucket, say); the graphs-used check counts such calls and reports
        them, and holds every other call to a replay.
      side_state() -> (eager's, graphed's): the modules each side runs on (a module, or a dict
        or sequence of them, alike on both sides), whose state (parameters, buffers, tensor
        and number attributes) the module-state check compares.
      trajectory: how one call leads to the next, each call one step (see Trajectory).
    """

    device: torch.device
    eager: Callable[[Inputs], Any]
    graphed: Callable[[Inputs], Any] | None
    make_inputs: Callable[[torch.Generator, int], Inputs]
    key_of: Callable[[Inputs], Hashable]
    num_keys: int
    tolerance: Tolerance | Mapping[Part, Tolerance] = EXACT
    real_part: Callable[[Inputs], RealIndex | Mapping[Part, RealIndex]] | None = None
    output_lifetime: str = OWNED
    threads: str = CONCURRENT
    refusal_errors: tuple[type[BaseException], ...] = USAGE_ERRORS
    reset: Callable[[], None] | None = None
    reset_state: Callable[[], None] | None = None
    lock: LockLike | None = None
    cached_keys: Callable[[], Sequence[Hashable]] | None = None
    fault_points: Mapping[str, tuple[object, str]] | None = None
    capacity: int | None = None
    largest_case: int | None = None
    capture_clean_forward: Callable[[], Any] | None = None
    sampler: Callable[[int, bool], Any] | None = None
    unsupported_modes: Mapping[str, tuple[Callable[[], Any], str]] | None = None
    graph_skips: Callable[[], Sequence[str]] | None = None
    run_workers: Callable[[int, bool], tuple[Sequence[Any], Sequence[Any]]] | None = None
    padding: Padding | None = None
    runs_eagerly: Callable[[Inputs], bool] | None = None
    side_state: Callable[[], tuple[object, object]] | None = None
    trajectory: Trajectory | None = None

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


REQUIRED_FIELDS = tuple(f.name for f in fields(CudaGraphTarget) if f.default is MISSING)
CALLABLE_FIELDS = (
    "eager",
    "graphed",
    "make_inputs",
    "key_of",
    "real_part",
    "reset",
    "reset_state",
    "cached_keys",
    "capture_clean_forward",
    "sampler",
    "graph_skips",
    "run_workers",
    "runs_eagerly",
    "side_state",
)
# Capabilities given as a small value of their own: field -> its class.
VALUE_FIELDS: dict[str, type] = {"padding": Padding, "trajectory": Trajectory}


class TargetError(Exception):
    """A conformance target that cannot be loaded or does not follow the protocol (a usage
    error where the session chooses the target)."""

    def __init__(self, spec: str | None, problem: str) -> None:
        subject = f"conformance target {spec!r}" if spec else "conformance target"
        super().__init__(f"{subject}: {problem}")


# Choosing the target


def installed_targets() -> dict[str, str]:
    """Installed target name -> its ``module:factory`` (entry-point group
    ``pytest_cudagraph.targets``)."""
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return {entry.name: entry.value for entry in sorted(found, key=lambda entry: entry.name)}


def resolve_spec(spec: str | None) -> str:
    """``spec`` itself, or with none chosen the name of the one installed target."""
    if spec is not None:
        return spec
    names = sorted(installed_targets())
    if len(names) == 1:
        return names[0]
    if not names:
        raise TargetError(
            None,
            "none chosen and none installed; give --cudagraph-target module:factory",
        )
    raise TargetError(
        None,
        f"none chosen and {len(names)} installed ({', '.join(names)}); "
        "choose one with --cudagraph-target NAME",
    )


def describe_spec(spec: str | None) -> str:
    """The target for titles: the spec, or the default it stands for (without failing)."""
    try:
        return resolve_spec(spec)
    except TargetError:
        return "no target chosen"


def session_target(request: pytest.FixtureRequest, spec: str | None) -> CudaGraphTarget:
    """The target for this test process: on its bound CUDA device (the plugin's
    ``cuda_device``), or on the CPU where CUDA is missing, for the checks that need no GPU.

    A target that cannot be built (none chosen, a factory that raises, a malformed target)
    errors the test that asked for it with one line naming the spec and the problem; with
    ``--tb=long``, ``--tb=native`` or ``--full-trace`` the factory's traceback follows it. In
    a session that runs the suite's checks the run stops there (under xdist, each worker's
    run), rather than failing every check with the same message; anywhere else only the tests
    that use the target error, and the rest of the session runs."""
    import torch

    if torch.cuda.is_available():
        device = request.getfixturevalue("cuda_device")
    else:
        device = torch.device("cpu")
    try:
        return build_target(spec, device)
    except TargetError as error:
        problem = str(error)
        cause = error.__cause__
    if cause is not None and _wants_traceback(request.config):
        full = bool(request.config.getoption("fulltrace"))
        problem += "\n" + _factory_traceback(cause, full=full)
    if any(item.path.parent == CHECKS_FOLDER for item in request.session.items):
        request.session.shouldfail = problem.splitlines()[0]
    pytest.fail(problem, pytrace=False)


def _wants_traceback(config: pytest.Config) -> bool:
    """Whether the user asked for whole tracebacks (--tb=long, --tb=native, --full-trace)."""
    return bool(config.getoption("fulltrace") or config.getoption("tbstyle") in ("long", "native"))


def _factory_traceback(error: BaseException, *, full: bool) -> str:
    """``error``'s traceback from the factory's own frame on (``full``: from build_target's)."""
    frames = error.__traceback__
    if not full and frames is not None and frames.tb_next is not None:
        frames = frames.tb_next
    return "".join(traceback.format_exception(type(error), error, frames)).rstrip("\n")


# Loading


def load_factory(
    spec: str, search_paths: Sequence[Path] = ()
) -> Callable[[torch.device], CudaGraphTarget]:
    """The factory an installed name or a ``module:factory`` spec names (the factory may be a
    dotted attribute). A module not found on sys.path is looked for in ``search_paths`` (the
    rootdir, the invocation folder), which then join sys.path as they do for test modules."""
    if ":" not in spec:
        installed = installed_targets()
        if spec not in installed:
            names = ", ".join(installed) or "none"
            raise TargetError(
                spec,
                f"no installed target of that name (installed: {names}); "
                "or give module:factory, e.g. 'mypkg.graphs:make_target'",
            )
        return load_factory(installed[spec], search_paths)
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise TargetError(
            spec, "must be a name or 'module:factory', e.g. 'mypkg.graphs:make_target'"
        )
    found: Any = _import(spec, module_name, search_paths)
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise TargetError(spec, f"{module_name} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise TargetError(spec, f"{attribute} is a {type(found).__name__}, not a callable factory")
    return found


def _import(spec: str, module_name: str, search_paths: Sequence[Path]) -> Any:
    top = module_name.partition(".")[0]
    if top not in sys.modules and importlib.util.find_spec(top) is None:
        holders = [path for path in search_paths if _holds_module(path, top)]
        sys.path.extend(str(path) for path in holders if str(path) not in sys.path)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise TargetError(spec, f"cannot import module {module_name!r}: {error}") from error
    except (Exception, SystemExit) as error:  # whatever the module raises while it runs
        raise TargetError(
            spec, f"importing {module_name!r} failed: {type(error).__name__}: {_first_line(error)}"
        ) from error


def _holds_module(folder: Path, name: str) -> bool:
    return (folder / name).is_dir() or (folder / f"{name}.py").is_file()


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def build_target(spec: str | None, device: torch.device) -> CudaGraphTarget:
    """Load the factory (``spec`` None: the one installed), build the target for ``device``
    and validate it."""
    spec = resolve_spec(spec)
    factory = load_factory(spec)
    try:
        target = factory(device)
    except (Exception, SystemExit) as error:  # SystemExit too: a factory may call sys.exit
        raise TargetError(
            spec, f"the factory raised {type(error).__name__}: {_first_line(error)}"
        ) from error
    validate_target(spec, target, device)
    return target


# Validation


def validate_target(spec: str, target: object, device: torch.device) -> None:
    """Every core field present and well-formed; the contract and the capabilities well-formed
    when given. Case 0 is drawn and keyed once, so that a ``make_inputs`` or ``key_of`` that
    fails every call is named here, before any check."""
    import torch

    if not isinstance(target, CudaGraphTarget):
        raise TargetError(
            spec,
            f"the factory returned {type(target).__name__}; expected a "
            "pytest_cudagraph.conformance.target.CudaGraphTarget",
        )
    # Only away from CUDA may the graphed path be left out.
    required = [name for name in REQUIRED_FIELDS if name != "graphed" or device.type == "cuda"]
    missing = [name for name in required if getattr(target, name) is None]
    if missing:
        raise TargetError(spec, f"core field(s) missing: {', '.join(missing)}")
    if not isinstance(target.device, torch.device) or target.device != device:
        raise TargetError(spec, f"device is {target.device!r}; the factory was asked for {device}")
    for name in CALLABLE_FIELDS:
        value = getattr(target, name)
        if value is not None and not callable(value):
            raise TargetError(spec, f"{name} must be callable, got {type(value).__name__}")
    for name, kind in VALUE_FIELDS.items():
        value = getattr(target, name)
        if value is not None and not isinstance(value, kind):
            raise TargetError(
                spec,
                f"{name} must be a pytest_cudagraph.conformance.target.{kind.__name__}, got "
                f"{type(value).__name__}",
            )
    _check_int(spec, "num_keys", target.num_keys, low=1)
    _check_tolerance(spec, target.tolerance)
    _check_choice(spec, "output_lifetime", target.output_lifetime, OUTPUT_LIFETIMES)
    _check_choice(spec, "threads", target.threads, THREAD_MODELS)
    _check_refusal_errors(spec, target.refusal_errors)
    if target.capacity is not None:
        _check_int(spec, "capacity", target.capacity, low=1)
    if target.largest_case is not None:
        _check_int(spec, "largest_case", target.largest_case, low=0)
    if target.lock is not None and not (
        callable(getattr(target.lock, "acquire", None))
        and callable(getattr(target.lock, "release", None))
    ):
        raise TargetError(spec, "lock must have acquire() and release()")
    if target.fault_points is not None:
        _check_fault_points(spec, target.fault_points)
    if target.unsupported_modes is not None:
        _check_unsupported_modes(spec, target.unsupported_modes)
    _check_first_case(spec, target)


def _check_int(spec: str, name: str, value: object, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TargetError(spec, f"{name} must be an int >= {low}, got {value!r}")


def _check_choice(spec: str, name: str, value: object, choices: Sequence[str]) -> None:
    if value not in choices:
        listed = ", ".join(repr(choice) for choice in choices)
        raise TargetError(spec, f"{name} must be one of {listed}, got {value!r}")


def _check_tolerance(spec: str, tolerance: object) -> None:
    expected = "a pytest_cudagraph.conformance.target.Tolerance"
    if isinstance(tolerance, Tolerance):
        return
    if not isinstance(tolerance, Mapping):
        raise TargetError(
            spec,
            f"tolerance must be {expected} or a mapping output part -> Tolerance, got "
            f"{type(tolerance).__name__}",
        )
    if not tolerance:
        raise TargetError(spec, "tolerance must name at least one output part when a mapping")
    for part, value in tolerance.items():
        if not isinstance(value, Tolerance):
            raise TargetError(
                spec, f"tolerance[{part!r}] must be {expected}, got {type(value).__name__}"
            )


def _check_refusal_errors(spec: str, errors: object) -> None:
    well_formed = (
        isinstance(errors, tuple)
        and bool(errors)
        and all(isinstance(error, type) and issubclass(error, Exception) for error in errors)
    )
    if not well_formed:
        raise TargetError(
            spec, f"refusal_errors must be a non-empty tuple of exception classes, got {errors!r}"
        )


def _check_fault_points(spec: str, points: object) -> None:
    if not isinstance(points, Mapping):
        raise TargetError(spec, f"fault_points must be a mapping, got {type(points).__name__}")
    missing = [stage for stage in FAULT_STAGES if stage not in points]
    if missing:
        raise TargetError(spec, f"fault_points lacks the stage(s) {', '.join(missing)}")
    for stage, point in points.items():
        if not (isinstance(point, tuple) and len(point) == 2 and isinstance(point[1], str)):
            raise TargetError(
                spec, f"fault_points[{stage!r}] must be (object, method name), got {point!r}"
            )
        owner, attribute = point
        if not callable(getattr(owner, attribute, None)):
            raise TargetError(
                spec,
                f"fault_points[{stage!r}]: {type(owner).__name__} has no method {attribute!r}",
            )


def _check_unsupported_modes(spec: str, modes: object) -> None:
    if not isinstance(modes, Mapping) or not modes:
        raise TargetError(spec, "unsupported_modes must be a non-empty mapping")
    for name, mode in modes.items():
        well_formed = (
            isinstance(mode, tuple)
            and len(mode) == 2
            and callable(mode[0])
            and isinstance(mode[1], str)
            and bool(mode[1])
        )
        if not well_formed:
            raise TargetError(
                spec,
                f"unsupported_modes[{name!r}] must be (zero-arg callable, regex), got {mode!r}",
            )
        try:
            re.compile(mode[1])
        except re.error as error:
            raise TargetError(
                spec, f"unsupported_modes[{name!r}]: {mode[1]!r} is not a regex ({error})"
            ) from None


def _check_first_case(spec: str, target: CudaGraphTarget) -> None:
    """Draw case 0 and key it: inputs must be a dict keyed by name, the key hashable."""
    import torch

    generator = torch.Generator(target.device).manual_seed(0)
    try:
        inputs = target.make_inputs(generator, 0)
    except Exception as error:
        raise TargetError(spec, f"make_inputs(generator, 0) raised {_described(error)}") from None
    if not isinstance(inputs, dict) or not all(isinstance(name, str) for name in inputs):
        raise TargetError(
            spec,
            f"make_inputs(generator, 0) returned {type(inputs).__name__}; it must return a dict "
            "of input name -> value",
        )
    try:
        key = target.key_of(inputs)
    except Exception as error:
        raise TargetError(spec, f"key_of(case 0's inputs) raised {_described(error)}") from None
    try:
        hash(key)
    except TypeError:
        raise TargetError(
            spec, f"key_of(case 0's inputs) returned an unhashable {type(key).__name__}: {key!r}"
        ) from None


def _described(error: BaseException) -> str:
    return f"{type(error).__name__}: {_first_line(error)}"


def missing_field_reason(target: CudaGraphTarget, *names: str) -> str | None:
    """A skip reason when any of ``names`` is None on the target, else None."""
    missing = [name for name in names if getattr(target, name) is None]
    return not_given_reason(missing) if missing else None


def not_given_reason(names: Sequence[str]) -> str:
    """The skip reason of a check that needs the optional fields ``names``."""
    return f"the target does not give {', '.join(names)} (an optional capability)"


def main() -> None:
    """``python -m pytest_cudagraph.conformance.target``: the installed targets, one per line."""
    installed = installed_targets()
    if not installed:
        print(f"no conformance targets installed (entry-point group {ENTRY_POINT_GROUP})")
    for name, value in installed.items():
        print(f"{name}  {value}")


if __name__ == "__main__":
    main()
