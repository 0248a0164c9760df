"""The conformance suite's view of a CUDA-graph cache: a small adapter a user writes once.

A target is built by a factory named ``module:factory`` (option ``--cudagraph-target``, ini key
``cudagraph_target``, env var ``PYTEST_CUDAGRAPH_TARGET``; default the bundled reference,
``reasyn_ref.conformance:make_target``). The factory is called once per test session with the
torch.device the process is bound to (the CPU when CUDA is missing, so that the checks that
need no GPU still run) and returns a ``CudaGraphTarget``.

Cases. ``make_inputs(generator, case)`` maps an int ``case`` to one call's inputs: a dict of
name -> value (tensors, and plain values such as a row count). The case fixes the graph key:
case ``c`` lands in key number ``c % num_keys``, so cases ``k, k + num_keys, ...`` share a key.
Everything else (shapes inside the key's bucket, values, the memory/context tensors) comes from
the generator. Two draws of one case with different generators must be interchangeable input
by input: the no-baked-inputs check swaps one tensor at a time between them.

A spec that cannot be loaded, a factory that fails or returns something else, and a target with
a required field missing or malformed are usage errors that name the spec and the problem.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, Protocol

import pytest
import torch

from pytest_cudagraph import settings

DEFAULT_TARGET = "reasyn_ref.conformance:make_target"
TARGET = settings.Setting(
    "target",
    "conformance target factory, as module:factory",
    default=DEFAULT_TARGET,
)

# The stages a fault is injected into by the lock-safety check; a target may name more.
FAULT_STAGES = ("warm_up", "capture", "replay")

Inputs = dict[str, Any]


class LockLike(Protocol):
    """A lock any thread may release (threading.Lock, multiprocessing.Lock; not an RLock): a
    check that finds it held after a fault releases it, so that the checks after it can run."""

    def acquire(self, blocking: bool = ..., /) -> bool: ...
    def release(self) -> None: ...


@dataclass(kw_only=True)
class CudaGraphTarget:
    """What the conformance checks need to know about a graph cache and its eager twin.

    Required:
      device: where the graphs live (the device the factory was called with).
      eager(inputs) -> outputs: the reference computation.
      graphed(inputs) -> outputs: the cached-graph path; must equal eager bit for bit.
        Outputs are tensors, or tuples, lists and dicts of them.
      make_inputs(generator, case) -> inputs: see the module docstring.
      key_of(inputs) -> hashable: the graph key those inputs land in.
      num_keys: how many keys the cases cycle through (at least 4; the memory check uses 40).
      reset(): drop every graph and buffer, in place (the objects named below stay valid).

    Optional (None: the checks that need it skip, naming the field):
      lock: the cache's lock (see LockLike).
      cached_keys() -> the keys now cached, to prove that a failed call left no entry.
      fault_points: stage -> (object, method name) for at least warm_up, capture and replay;
        the check makes that method raise on its next call.
      capacity: how many graphs the cache keeps.
      largest_case: a case landing in the key whose graph takes the most memory.
      capture_clean_forward(): one eager forward of the largest key on the device. It is called
        once before the checked call, so first-use setup (drawing its inputs) is not judged.
      sampler(seed) -> tokens: sampling that turns graphs on or off as the environment variable
        ``graphs_toggle`` (e.g. REASYN_CUDAGRAPH) says; give both or neither.
      unsupported_modes: name -> (zero-arg callable, regex): the call must raise a
        ValueError, TypeError or RuntimeError whose message matches the regex.
      run_workers(workers_per_gpu, graphs) -> (results, eager answers): runs jobs through
        spawned worker processes sharing this device's lock, and the same jobs eagerly in
        this process; with graphs on and two workers per GPU it must raise ValueError before
        starting any process.
    """

    device: torch.device
    eager: Callable[[Inputs], Any]
    graphed: Callable[[Inputs], Any]
    make_inputs: Callable[[torch.Generator, int], Inputs]
    key_of: Callable[[Inputs], Hashable]
    num_keys: int
    reset: Callable[[], None]
    lock: LockLike | None = None
    cached_keys: Callable[[], Sequence[Hashable]] | None = None
    fault_points: Mapping[str, tuple[object, str]] | None = None
    capacity: int | None = None
    largest_case: int | None = None
    capture_clean_forward: Callable[[], Any] | None = None
    sampler: Callable[[int], Any] | None = None
    graphs_toggle: str | None = None
    unsupported_modes: Mapping[str, tuple[Callable[[], Any], str]] | None = None
    run_workers: Callable[[int, bool], tuple[Sequence[Any], Sequence[Any]]] | None = None


REQUIRED_FIELDS = tuple(f.name for f in fields(CudaGraphTarget) if f.default is MISSING)
CALLABLE_FIELDS = (
    "eager",
    "graphed",
    "make_inputs",
    "key_of",
    "reset",
    "cached_keys",
    "capture_clean_forward",
    "sampler",
    "run_workers",
)


class TargetError(pytest.UsageError):
    """A conformance target that cannot be loaded or does not follow the protocol."""

    def __init__(self, spec: str, problem: str) -> None:
        super().__init__(f"conformance target {spec!r}: {problem}")


def target_spec(config: pytest.Config) -> str:
    """The spec in force: ``--cudagraph-target`` > PYTEST_CUDAGRAPH_TARGET > ini > default.

    A spec given explicitly is loaded now, so that a bad one is a usage error before the run;
    the default is only loaded when the suite builds it.
    """
    resolved = settings.resolve(config, TARGET)
    spec = str(resolved.value)
    if resolved.source != "default":
        load_factory(spec)
    return spec


def session_target(request: pytest.FixtureRequest) -> CudaGraphTarget:
    """The target for this test process: on its bound CUDA device (the plugin's
    ``cuda_device``), or on the CPU where CUDA is missing, for the checks that need no GPU."""
    if torch.cuda.is_available():
        device = request.getfixturevalue("cuda_device")
    else:
        device = torch.device("cpu")
    return build_target(target_spec(request.config), device)


def load_factory(spec: str) -> Callable[[torch.device], CudaGraphTarget]:
    """The factory a ``module:factory`` spec names (the factory may be a dotted attribute)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise TargetError(spec, "must be 'module:factory', e.g. 'mypkg.graphs:make_target'")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(spec, f"cannot import module {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise TargetError(spec, f"{module_name} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise TargetError(spec, f"{attribute} is a {type(found).__name__}, not a callable factory")
    return found


def build_target(spec: str, device: torch.device) -> CudaGraphTarget:
    """Load the factory, build the target for ``device`` and validate it."""
    factory = load_factory(spec)
    try:
        target = factory(device)
    except Exception as exc:
        raise TargetError(spec, f"factory failed: {type(exc).__name__}: {exc}") from exc
    validate_target(spec, target, device)
    return target


def validate_target(spec: str, target: object, device: torch.device) -> None:
    """Every required field present and well-formed; optional fields well-formed when given."""
    if not isinstance(target, CudaGraphTarget):
        raise TargetError(
            spec,
            f"factory returned {type(target).__name__}; expected a "
            "pytest_cudagraph.target.CudaGraphTarget",
        )
    missing = [name for name in REQUIRED_FIELDS if getattr(target, name) is None]
    if missing:
        raise TargetError(spec, f"required field(s) missing: {', '.join(missing)}")
    if not isinstance(target.device, torch.device) or target.device != device:
        raise TargetError(spec, f"device is {target.device!r}; the factory was asked for {device}")
    for name in CALLABLE_FIELDS:
        value = getattr(target, name)
        if value is not None and not callable(value):
            raise TargetError(spec, f"{name} must be callable, got {type(value).__name__}")
    _check_int(spec, "num_keys", target.num_keys, low=4)
    if target.capacity is not None:
        _check_int(spec, "capacity", target.capacity, low=1)
    if target.largest_case is not None:
        _check_int(spec, "largest_case", target.largest_case, low=0)
    if target.lock is not None and not (
        callable(getattr(target.lock, "acquire", None))
        and callable(getattr(target.lock, "release", None))
    ):
        raise TargetError(spec, "lock must have acquire() and release()")
    if (target.sampler is None) != (target.graphs_toggle is None):
        raise TargetError(spec, "sampler and graphs_toggle must be given together")
    if target.graphs_toggle is not None and not (
        isinstance(target.graphs_toggle, str) and target.graphs_toggle
    ):
        raise TargetError(spec, "graphs_toggle must be an environment variable name")
    if target.fault_points is not None:
        _check_fault_points(spec, target.fault_points)
    if target.unsupported_modes is not None:
        _check_unsupported_modes(spec, target.unsupported_modes)


def _check_int(spec: str, name: str, value: object, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TargetError(spec, f"{name} must be an int >= {low}, got {value!r}")


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


def missing_field_reason(target: CudaGraphTarget, *names: str) -> str | None:
    """A skip reason when any of ``names`` is None on the target, else None."""
    missing = [name for name in names if getattr(target, name) is None]
    if not missing:
        return None
    return f"target does not provide {', '.join(missing)} (optional CudaGraphTarget field)"
