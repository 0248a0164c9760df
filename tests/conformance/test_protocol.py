"""The protocol a target author writes (pytest_cudagraph.conformance._protocol), on the CPU: the
doors export exactly what they list, the core and the contract are checked when a target is
made, each capability checks its own fields, the fields the adapters take by name are the
target's own, the adapters key each call by the target's keys, and the cases go over the keys.
Each refusal names ``Class.field``, the rule and the value."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import multiprocessing
import subprocess
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import pytest_cudagraph
import pytest_cudagraph.conformance as door
from pytest_cudagraph.conformance import (
    EXACT,
    NEXT_CALL,
    SERIAL,
    Cache,
    CaptureClean,
    Case,
    CudaGraphTarget,
    Fallbacks,
    Guards,
    Padding,
    Sampling,
    State,
    TargetOptions,
    Tolerance,
    Trajectory,
    Workers,
    compiled,
    graphed_callables,
)
from pytest_cudagraph.conformance._judging import (
    case_of,
    describe_tolerance,
    differences,
    draw,
    numbered,
)
from pytest_cudagraph.conformance._protocol import CAPABILITIES, MAX_PADDED_ROWS
from pytest_cudagraph.engines import compare
from pytest_cudagraph.skips import needs_cuda

CPU = torch.device("cpu")


def draw_x(generator: torch.Generator, case: Case) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(case.key, generator=generator)}


def target_with(**changes: object) -> CudaGraphTarget:
    """A valid one-key target on the CPU, then ``changes``."""
    fields: dict[str, object] = dict(
        device=CPU,
        eager=lambda inputs: {"logits": inputs["x"] * 2, "cache": inputs["x"]},
        graphed=None,
        keys=[3],
        draw=draw_x,
        key_of=lambda inputs: inputs["x"].shape,
    )
    return CudaGraphTarget(**{**fields, **changes})


def test_one_key_and_no_graphed_side_away_from_cuda_make_a_valid_target() -> None:
    target = target_with()
    assert (list(target.keys), target.graphed, target.cache, target.sampling) == (
        [3],
        None,
        None,
        None,
    )


def test_case_numbers_cycle_through_the_keys() -> None:
    target = target_with(keys=[2, 3, 5])
    assert [numbered(target, number) for number in (0, 4, 8)] == [
        Case(0, 2, 0),
        Case(4, 3, 1),
        Case(8, 5, 2),
    ]
    assert case_of(target, 3, repeat=1) == numbered(target, 4)
    inputs = draw(target, numbered(target, 4), seed=0)
    assert inputs["x"].shape == (3,)
    assert numbered(target_with(keys=range(10**9)), 10**9 + 7) == Case(10**9 + 7, 7, 1)


def test_the_graphed_side_is_required_on_cuda() -> None:
    with pytest.raises(TypeError, match=r"CudaGraphTarget.graphed is None on a CUDA device"):
        target_with(device=torch.device("cuda", 0))


def test_the_declared_contract_is_accepted() -> None:
    target = target_with(
        tolerance={"logits": Tolerance(atol=1e-3)},
        real_part=lambda inputs: {"logits": slice(0, 2)},
        output_lifetime=NEXT_CALL,
        threads=SERIAL,
        guards=Guards({"bf16 off": (lambda: None, "needs bf16")}, (AssertionError, ValueError)),
    )
    assert target.tolerance == {"logits": Tolerance(atol=1e-3)}
    assert describe_tolerance(target) == "'logits' atol 0.001, rtol 0; other parts exact"
    # Each part is held to its own tolerance; a part not named is exact.
    x = torch.zeros(3)
    eager = {"logits": torch.zeros(3), "cache": torch.zeros(3)}
    within = {"logits": torch.full((3,), 5e-4), "cache": torch.zeros(3)}
    assert differences(target, {"x": x}, eager, within) == []
    beyond = {"logits": torch.zeros(3), "cache": torch.full((3,), 1e-6)}
    found = differences(target, {"x": x}, eager, beyond)
    assert len(found) == 1 and "cache" in found[0] and "logits" not in found[0]


@pytest.mark.parametrize(
    ("changes", "error", "problem"),
    [
        (
            {"device": "cpu"},
            TypeError,
            "CudaGraphTarget.device must be a torch.device, got 'cpu' (write torch.device('cpu'))",
        ),
        (
            {"keys": []},
            ValueError,
            "CudaGraphTarget.keys must be at least one graph key, each once, got []",
        ),
        (
            {"keys": [1, 1]},
            ValueError,
            "CudaGraphTarget.keys must be at least one graph key, each once, got [1, 1]",
        ),
        (
            {"keys": "ab"},
            TypeError,
            "CudaGraphTarget.keys must be a sequence of graph keys, got str",
        ),
        ({"keys": [[1]]}, TypeError, "CudaGraphTarget.keys[0] must be hashable, got list [1]"),
        ({"keys": range(0)}, ValueError, "CudaGraphTarget.keys must hold at least one graph key"),
        ({"draw": None}, TypeError, "CudaGraphTarget.draw must be callable, got NoneType"),
        ({"draw": 3}, TypeError, "CudaGraphTarget.draw must be callable, got int"),
        ({"eager": "f"}, TypeError, "CudaGraphTarget.eager must be callable, got str"),
        (
            {"tolerance": {}},
            ValueError,
            "CudaGraphTarget.tolerance must name at least one output part",
        ),
        (
            {"tolerance": {"logits": 1e-3}},
            TypeError,
            "CudaGraphTarget.tolerance['logits'] must be a Tolerance, got float",
        ),
        (
            {"real_part": slice(0, 2)},
            TypeError,
            "CudaGraphTarget.real_part must be callable or None, got slice",
        ),
        (
            {"output_lifetime": "until reset"},
            ValueError,
            "CudaGraphTarget.output_lifetime must be one of 'owned', 'next call of its key', 'next call', got 'until reset'",
        ),
        (
            {"threads": "many"},
            ValueError,
            "CudaGraphTarget.threads must be one of 'concurrent', 'serial', 'single', got 'many'",
        ),
        ({"cache": {"capacity": 3}}, TypeError, "CudaGraphTarget.cache must be a Cache, got dict"),
        ({"padding": 16}, TypeError, "CudaGraphTarget.padding must be a Padding, got int"),
        ({"cache": Cache(largest_key=7)}, ValueError, "Cache.largest_key 7 is not one of the keys"),
    ],
)
def test_a_malformed_core_or_contract_field_is_named(
    changes: dict[str, object], error: type[Exception], problem: str
) -> None:
    with pytest.raises(error) as refused:
        target_with(**changes)
    assert str(refused.value).startswith(problem)


def rows_of(generator: torch.Generator, rows: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(rows, generator=generator)}


def test_every_capability_is_accepted_in_its_slot_with_its_defaults() -> None:
    padding, trajectory = Padding(16, rows_of), Trajectory(lambda inputs, output: inputs)
    given = dict(
        cache=Cache(capacity=3, lock=threading.Lock(), largest_key=3),
        state=State(reset=lambda: None),
        sampling=Sampling(lambda seed, graphs: [seed]),
        guards=Guards({"bf16 off": (lambda: None, "needs bf16")}),
        workers=Workers(lambda per_gpu, graphs: ([], [])),
        fallbacks=Fallbacks(runs_eagerly=lambda inputs: False),
        capture_clean=CaptureClean(lambda: None),
        padding=padding,
        trajectory=trajectory,
    )
    target = target_with(**given)
    assert {kind.SLOT for kind in CAPABILITIES} == set(given)
    assert all(getattr(target, type(value).SLOT) is value for value in given.values())
    assert (padding.junk, trajectory.teacher_forced, trajectory.case) == (None, False, 0)
    assert Guards({"m": (lambda: None, "x")}).refusal_errors == (
        ValueError,
        TypeError,
        RuntimeError,
    )
    assert Cache(capacity=2).given() == ["capacity"]


def test_the_fields_the_adapters_take_by_name_are_the_targets_after_its_core() -> None:
    core = ("device", "eager", "graphed", "keys", "draw", "key_of")
    fields = [field.name for field in dataclasses.fields(CudaGraphTarget)]
    assert fields[: len(core)] == list(core)
    assert list(TargetOptions.__annotations__) == fields[len(core) :]


def test_the_protocols_tolerance_is_the_comparison_engines() -> None:
    """One rule and one wording for a tolerance: the engine's, named by the protocol too."""
    assert Tolerance is compare.Tolerance and EXACT is compare.EXACT


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Padding(0, rows_of), ValueError, r"Padding.largest must be >= 1, got 0"),
        (lambda: Padding(16.0, rows_of), TypeError, r"Padding.largest must be an int, got 16.0"),
        (lambda: Padding(True, rows_of), TypeError, r"Padding.largest must be an int, got True"),
        (
            lambda: Padding(4, None),
            TypeError,
            r"Padding.make_inputs must be callable, got NoneType",
        ),
        (lambda: Padding(4, rows_of, "nan"), TypeError, r"Padding.junk must be callable or None"),
        (lambda: Trajectory(3), TypeError, r"Trajectory.next_inputs must be callable, got int"),
        (
            lambda: Trajectory(rows_of, teacher_forced=1),
            TypeError,
            r"Trajectory.teacher_forced must be True or False, got 1",
        ),
        (lambda: Trajectory(rows_of, case=-1), ValueError, r"Trajectory.case must be >= 0, got -1"),
        (
            lambda: Trajectory(rows_of, case="0"),
            TypeError,
            r"Trajectory.case must be an int, got '0'",
        ),
        (lambda: Cache(capacity=0), ValueError, r"Cache.capacity must be >= 1, got 0"),
        (lambda: Cache(reset=3), TypeError, r"Cache.reset must be callable or None, got int"),
        (
            lambda: Cache(lock=object()),
            TypeError,
            r"Cache.lock must have acquire\(\) and release\(\)",
        ),
        (
            lambda: Cache(fault_points={"warm_up": (1, "x")}),
            ValueError,
            r"Cache.fault_points lacks the stage\(s\) capture, replay",
        ),
        (
            lambda: Cache(
                fault_points=dict.fromkeys(("warm_up", "capture", "replay"), (1, "nope"))
            ),
            ValueError,
            r"Cache.fault_points\['warm_up'\]: int has no method 'nope'",
        ),
        (lambda: State(), TypeError, r"State gives nothing: give sides, reset or both"),
        (
            lambda: State(sides=(1, 2)),
            TypeError,
            r"State.sides must be callable or None, got tuple",
        ),
        (lambda: Sampling(None), TypeError, r"Sampling.sample must be callable, got NoneType"),
        (lambda: Guards({}), TypeError, r"Guards.modes must be a non-empty mapping"),
        (
            lambda: Guards({"bf16 off": (lambda: None, "needs (bf16")}),
            ValueError,
            r"Guards.modes\['bf16 off'\]: 'needs \(bf16' is not a regex",
        ),
        (
            lambda: Guards({"m": (lambda: None, "x")}, AssertionError),
            TypeError,
            r"Guards.refusal_errors must be a non-empty tuple of exception classes",
        ),
        (
            lambda: Guards({"m": (lambda: None, "x")}, (ValueError, "assert")),
            TypeError,
            r"Guards.refusal_errors must be a non-empty tuple of exception classes",
        ),
        (lambda: Workers(3), TypeError, r"Workers.run must be callable, got int"),
        (lambda: Fallbacks(), TypeError, r"Fallbacks gives nothing"),
        (
            lambda: Fallbacks(runs_eagerly=True),
            TypeError,
            r"Fallbacks.runs_eagerly must be callable",
        ),
        (lambda: CaptureClean("f"), TypeError, r"CaptureClean.forward must be callable, got str"),
    ],
)
def test_a_malformed_capability_is_refused_naming_its_field(
    make: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()  # type: ignore[operator]


# What can be checked only when it is called: every result a callback returns


@pytest.mark.parametrize("pattern", [".*", "|", "x*", "(needs)?"])
def test_a_guard_regex_that_matches_the_empty_message_is_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"Guards.modes\['m'\]: .* matches the empty message"):
        Guards({"m": (lambda: None, pattern)})


def test_padding_is_bounded_since_every_size_up_to_the_largest_is_called() -> None:
    assert Padding(MAX_PADDED_ROWS, rows_of).largest == MAX_PADDED_ROWS
    with pytest.raises(ValueError, match=r"Padding.largest must be at most 1024 .*, got 10000000"):
        Padding(10**7, rows_of)


@pytest.mark.parametrize(
    "lock",
    [threading.Lock(), threading.RLock(), threading.Condition(), multiprocessing.RLock()],
    ids=["Lock", "RLock", "Condition", "multiprocessing.RLock"],
)
def test_every_lock_the_checks_can_try_from_another_thread_is_accepted(lock: object) -> None:
    assert Cache(lock=lock).lock is lock  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (asyncio.Lock, r"Cache.lock is an asyncio lock \(asyncio.locks.Lock\), taken by awaiting"),
        (threading.Semaphore, r"Cache.lock is a semaphore \(threading.Semaphore\): a count"),
        (threading.BoundedSemaphore, r"Cache.lock is a semaphore \(threading.BoundedSemaphore\)"),
        (multiprocessing.Semaphore, r"Cache.lock is a semaphore \(multiprocessing.synchronize"),
    ],
)
def test_a_lock_that_cannot_be_checked_is_refused_by_name(
    make: Callable[[], object], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        Cache(lock=make())  # type: ignore[arg-type]


def test_fault_points_whose_reading_raises_are_named() -> None:
    class Unreadable(dict):
        def items(self):  # type: ignore[override]
            raise RuntimeError("not ready")

    with pytest.raises(ValueError, match=r"Cache.fault_points: reading its entries raised"):
        Cache(fault_points=Unreadable())


@pytest.mark.parametrize(
    ("make", "call", "message"),
    [
        (
            lambda: Padding(4, lambda generator, rows: [rows]),
            lambda padding: padding.make_inputs(torch.Generator(), 3),
            r"Padding.make_inputs returned list \[3\]; it must return a dict of input name",
        ),
        (
            lambda: Padding(4, rows_of, junk=lambda inputs: {"y": inputs["x"]}),
            lambda padding: padding.junk({"x": torch.zeros(1)}),
            r"Padding.junk returned inputs named \['y'\], not the call's \['x'\]",
        ),
        (
            lambda: Padding(4, rows_of, junk=lambda inputs: None),
            lambda padding: padding.junk({"x": torch.zeros(1)}),
            r"Padding.junk returned NoneType None; it must return a dict",
        ),
        (
            lambda: Trajectory(lambda inputs, output: (inputs, output)),
            lambda trajectory: trajectory.next_inputs({}, 1),
            r"Trajectory.next_inputs returned tuple \(\{\}, 1\); it must return a dict",
        ),
        (
            lambda: Fallbacks(runs_eagerly=lambda inputs: torch.Size([4])),
            lambda fallbacks: fallbacks.runs_eagerly({}),
            r"Fallbacks.runs_eagerly returned Size torch.Size\(\[4\]\); it must return True or",
        ),
        (
            lambda: Fallbacks(runs_eagerly=lambda inputs: "no"),
            lambda fallbacks: fallbacks.runs_eagerly({}),
            r"Fallbacks.runs_eagerly returned str 'no'; it must return True or False",
        ),
        (
            lambda: Fallbacks(runs_eagerly=lambda inputs: [0]),
            lambda fallbacks: fallbacks.runs_eagerly({}),
            r"Fallbacks.runs_eagerly returned list \[0\]",
        ),
    ],
)
def test_a_callback_returning_the_wrong_thing_is_named_by_its_field(
    make: Callable[[], object], call: Callable[[object], object], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        call(make())


def test_a_checked_callback_returns_what_the_callback_returns_and_compares_alike() -> None:
    padding = Padding(4, rows_of)
    assert set(padding.make_inputs(torch.Generator(), 2)) == {"x"}
    assert padding == Padding(4, rows_of)
    assert dataclasses.replace(padding).make_inputs == padding.make_inputs  # not wrapped twice
    assert Fallbacks(runs_eagerly=lambda inputs: False).runs_eagerly is not None


@pytest.mark.parametrize(
    ("key_of", "message"),
    [
        (lambda inputs: inputs["x"].sum(), r"key_of returned a tensor \(Tensor tensor"),
        (lambda inputs: object(), r"key_of gave two keys for the same inputs \(object <object"),
        (lambda inputs: float("nan"), r"key_of returned float nan, which is not equal to itself"),
        (lambda inputs: [3], r"key_of returned list \[3\], which cannot be a key: TypeError"),
    ],
)
def test_a_key_that_no_call_could_find_again_is_named(
    key_of: Callable[[object], object], message: str
) -> None:
    target = target_with(key_of=key_of)
    with pytest.raises(TypeError, match=rf"CudaGraphTarget.{message}"):
        target.key_of(draw_x(torch.Generator(), Case(0, 3, 0)))
    assert target_with().key_of({"x": torch.zeros(3)}) == (3,)


class AcquireOnly:
    def acquire(self) -> bool:
        return True


class Unbuilt:
    @property
    def capture(self) -> object:
        raise RuntimeError("not built yet")


def fault_points(point: tuple[object, object]) -> dict[str, tuple[object, object]]:
    return dict.fromkeys(("warm_up", "capture", "replay"), point)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: Cache(lock=AcquireOnly()),
            TypeError,
            r"Cache.lock must have acquire\(\) and release\(\), got AcquireOnly",
        ),
        (
            lambda: Cache(fault_points=fault_points((Unbuilt(), 3))),
            TypeError,
            r"Cache.fault_points\['warm_up'\] must be \(object, method name\), got \(<",
        ),
        (
            lambda: Cache(fault_points=fault_points((Unbuilt(), "capture"))),
            ValueError,
            r"reading Unbuilt.capture raised RuntimeError: not built yet",
        ),
        (
            lambda: Guards({"m": (lambda: None, "")}),
            TypeError,
            r"Guards.modes\['m'\] must be \(zero-arg callable, regex\)",
        ),
        (
            lambda: Guards({"m": (lambda: None, "x")}, (ValueError, KeyboardInterrupt)),
            TypeError,
            r"Guards.refusal_errors must be a non-empty tuple of exception classes",
        ),
    ],
)
def test_a_capability_field_is_checked_in_each_of_its_parts(
    make: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        make()  # type: ignore[operator]


# The doors: each exports exactly the names of its ``if TYPE_CHECKING:`` imports, resolved on
# first use, so that importing it imports no torch.

# What a target author writes, and nothing else.
DOOR_NAMES = {
    *("CudaGraphTarget", "TargetOptions", "Case", "Inputs", "Cache", "State", "Sampling"),
    *("Guards", "Workers", "Fallbacks", "CaptureClean", "Padding", "Trajectory", "Tolerance"),
    *("EXACT", "OWNED", "NEXT_CALL_OF_KEY", "NEXT_CALL", "CONCURRENT", "SERIAL", "SINGLE"),
    *("OutputLifetime", "Threads", "TargetError", "validate_target", "compiled"),
    *("graphed_callables", "hand_written", "InductorSkips", "graphs_on"),
}
# What the package root defines itself beside the names it imports.
ROOT_DEFINED = {"__version__", "PytestCudagraphDeprecationWarning"}


def type_checking_imports(package: types.ModuleType) -> dict[str, str]:
    """Name -> the module it comes from, for each ``from module import Name as Name`` in the
    ``if TYPE_CHECKING:`` block of the package's ``__init__.py``, read from its source."""
    assert package.__file__ is not None
    tree = ast.parse(Path(package.__file__).read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module
                for alias in statement.names:
                    assert alias.asname == alias.name, "a re-export is spelt `import X as X`"
                    assert alias.name not in found, f"{alias.name} is imported twice"
                    found[alias.name] = statement.module
    return found


@pytest.mark.parametrize(
    ("package", "defined"),
    [(door, set()), (pytest_cudagraph, ROOT_DEFINED)],
    ids=["conformance", "root"],
)
def test_a_door_exports_exactly_its_type_checking_imports_each_resolving(
    package: types.ModuleType, defined: set[str]
) -> None:
    imports = type_checking_imports(package)
    assert imports, "the door lists its names in its TYPE_CHECKING imports"
    assert sorted(package.__all__) == sorted({*imports, *defined})
    assert len(set(package.__all__)) == len(package.__all__)
    for name, module in imports.items():
        assert getattr(package, name) is getattr(importlib.import_module(module), name), name
    assert set(package.__all__) <= set(dir(package))
    with pytest.raises(AttributeError, match=rf"module '{package.__name__}' has no attribute"):
        package.NotExported  # noqa: B018


def test_the_conformance_door_exports_what_a_target_author_writes_and_nothing_else() -> None:
    assert set(door.__all__) == DOOR_NAMES
    assert all(
        module.startswith("pytest_cudagraph.conformance._")
        for module in type_checking_imports(door).values()
    )


IMPORT_THE_DOORS = """\
import sys
import pytest_cudagraph
import pytest_cudagraph.conformance as door
assert "torch" not in sys.modules, "importing the doors imported torch"
assert sorted(door.__all__) == sys.argv[1:], sorted(door.__all__)
listed = set(door.__all__) | set(pytest_cudagraph.__all__)
assert set(door.__all__) <= set(dir(door)), "dir() of the door leaves names out"
from pytest_cudagraph.conformance import *
from pytest_cudagraph import *
print(sorted(listed - set(globals())))
"""


def test_importing_the_doors_imports_no_torch_and_every_name_resolves() -> None:
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_THE_DOORS, *sorted(DOOR_NAMES)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "[]\n"  # a star import of each door binds each of its names


# The adapters key each call by the target's keys


def scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale


def rows_and_scale(generator: torch.Generator, case: Case) -> dict[str, object]:
    device = generator.device
    return {"x": torch.randn(case.key, 4, generator=generator, device=device), "scale": 2.0}


@pytest.mark.parametrize(
    ("adapter", "unkeyed"),
    [
        (compiled, (("x", (7, 4), "torch.float32"),)),
        (graphed_callables, (((7, 4), "torch.float32"),)),
    ],
    ids=["compiled", "graphed_callables"],
)
def test_the_adapters_default_key_is_the_target_key_whose_draw_has_those_shapes(
    adapter: Callable[..., CudaGraphTarget], unkeyed: object
) -> None:
    target = adapter(scaled, device=CPU, keys=[5, 2, 3], draw=rows_and_scale)
    for number in range(6):
        case = numbered(target, number)
        assert target.key_of(draw(target, case, seed=number)) == case.key
    # Shapes no key's draw has keep their shapes as their key, which is none of the keys.
    assert target.key_of({"x": torch.zeros(7, 4), "scale": 2.0}) == unkeyed


def test_graphed_callables_gives_its_cached_keys_only_where_it_keys_the_calls_itself() -> None:
    def keyed(**given: object) -> CudaGraphTarget:
        return graphed_callables(scaled, device=CPU, keys=[2, 3], draw=rows_and_scale, **given)

    cache = keyed().cache
    assert cache is not None and cache.cached_keys is not None and list(cache.cached_keys()) == []
    own_key = keyed(key_of=lambda inputs: inputs["x"].shape[0]).cache
    own_call = keyed(call=lambda step, model, inputs: step(*inputs.values())).cache
    assert own_key is not None and own_key.cached_keys is None
    assert own_call is not None and own_call.cached_keys is None


@needs_cuda
def test_graphed_callables_cached_keys_are_the_target_keys() -> None:
    device = torch.device("cuda", 0)
    target = graphed_callables(
        torch.nn.Linear(4, 4).to(device),
        device=device,
        keys=[2, 3],
        draw=lambda generator, case: {"x": rows_and_scale(generator, case)["x"]},
    )
    assert target.cache is not None and target.cache.cached_keys is not None
    assert target.graphed is not None and target.cache.reset is not None
    for key in (3, 2, 3):
        target.graphed(draw(target, case_of(target, key), seed=0))
    assert list(target.cache.cached_keys()) == [3, 2]
    target.cache.reset()
    assert list(target.cache.cached_keys()) == []
