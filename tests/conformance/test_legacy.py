"""Targets written for earlier releases keep working until 0.5.0 (pytest_cudagraph.conformance
._legacy, a layer on top of the protocol): 0.3.0's flat fields and ``make_inputs``/``num_keys``
(``dataclasses.replace`` of such a target too), 0.4.0's helpers of the target and the old import
paths, each with one PytestCudagraphDeprecationWarning that points at the user's line and names
the new spelling; a form that cannot be told apart fails naming both spellings. Without the
layer, everything else works and an old spelling is a plain error."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from cpu_checks import run

from pytest_cudagraph import PytestCudagraphDeprecationWarning
from pytest_cudagraph.conformance import (
    EXACT,
    Cache,
    Case,
    CudaGraphTarget,
    Sampling,
    State,
    Tolerance,
    hand_written,
)
from pytest_cudagraph.conformance._catalog import declared_checks
from pytest_cudagraph.conformance._judging import numbered
from pytest_cudagraph.conformance._loading import explained, installed_lines
from pytest_cudagraph.conformance.checks import test_00_target

CPU = torch.device("cpu")


def make_inputs(generator: torch.Generator, case: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(2 + case % 3, generator=generator)}


@contextmanager
def one_deprecation(*fragments: str) -> Iterator[list[warnings.WarningMessage]]:
    """Exactly one warning, a PytestCudagraphDeprecationWarning, saying each of ``fragments``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    assert [w.category for w in caught] == [PytestCudagraphDeprecationWarning], [
        f"{w.category.__name__}: {w.message}" for w in caught
    ]
    for fragment in fragments:
        assert fragment in str(caught[0].message)


def this_line() -> int:
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def at(caught: list[warnings.WarningMessage]) -> tuple[str, int]:
    return caught[0].filename, caught[0].lineno


def test_a_target_of_0_3_0s_flat_fields_runs_with_one_warning_at_the_users_line() -> None:
    lock = threading.Lock()
    with one_deprecation(
        "is the spelling of pytest-cudagraph 0.3.0, accepted until 0.5.0",
        "keys=[the key key_of gives each of cases 0 to num_keys - 1], draw=lambda generator, "
        "case: make_inputs(generator, case.number)",
        "cache=Cache(reset=..., lock=..., capacity=..., largest_key=...)",
        "sampling=Sampling(sample=...)",
        "state=State(reset=...)",
        "guards=Guards(modes=..., refusal_errors=...)",
    ) as caught:
        line = this_line() + 1
        target = CudaGraphTarget(device=CPU, eager=lambda i: i["x"], graphed=None, make_inputs=make_inputs, key_of=lambda i: i["x"].shape[0], num_keys=3, reset=lambda: None, lock=lock, capacity=2, largest_case=5, sampler=lambda seed, graphs: [seed], reset_state=lambda: None, unsupported_modes={"m": (lambda: None, "x")}, refusal_errors=(AssertionError,))  # fmt: skip
    assert at(caught) == (__file__, line)
    assert target.keys == (2, 3, 4)  # the code's keys of cases 0 to 2, as key_of gives them
    assert target.cache == Cache(reset=target.cache.reset, lock=lock, capacity=2, largest_key=4)
    assert isinstance(target.sampling, Sampling) and isinstance(target.state, State)
    assert target.guards is not None and target.guards.refusal_errors == (AssertionError,)
    drawn = target.draw(torch.Generator().manual_seed(0), Case(4, 1, 1))
    assert drawn["x"].shape == (3,)  # make_inputs got the case number, 4


def test_refusal_errors_alone_is_dropped_and_replace_merges_an_old_field() -> None:
    with one_deprecation("refusal_errors"):
        target = CudaGraphTarget(device=CPU, eager=len, graphed=None, make_inputs=make_inputs, key_of=len, num_keys=1, refusal_errors=(AssertionError,))  # fmt: skip
    assert target.guards is None
    with_cache = CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=[1], draw=lambda g, c: {}, key_of=len, cache=Cache(capacity=4, reset=lambda: None))  # fmt: skip
    with one_deprecation("cache=Cache(capacity=...)"):
        changed = CudaGraphTarget(**{**vars(with_cache), "capacity": 6})
    assert changed.cache is not None and changed.cache.capacity == 6
    assert changed.cache.reset is with_cache.cache.reset  # type: ignore[union-attr]


def test_0_3_0s_attribute_names_read_from_their_new_homes_with_a_warning() -> None:
    target = CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=["a", "b"], draw=lambda g, c: {}, key_of=len, cache=Cache(capacity=4, largest_key="b"))  # fmt: skip
    with one_deprecation(
        "CudaGraphTarget.capacity is the spelling", "read CudaGraphTarget.cache.capacity"
    ) as caught:
        line = this_line() + 1
        assert target.capacity == 4
    assert at(caught) == (__file__, line)
    with one_deprecation("read CudaGraphTarget.cache.largest_key"):
        assert target.largest_case == 1
    with one_deprecation("read CudaGraphTarget.guards.refusal_errors"):
        assert target.refusal_errors == (ValueError, TypeError, RuntimeError)
    with one_deprecation("read CudaGraphTarget.sampling.sample"):
        assert target.sampler is None
    with one_deprecation(
        "CudaGraphTarget.num_keys is the target's helper in pytest-cudagraph 0.4.0",
        "write len(target.keys)",
    ):
        assert target.num_keys == 2
    with pytest.raises(AttributeError, match="has no attribute 'capacityy'"):
        target.capacityy  # noqa: B018


def helper_of(target: CudaGraphTarget, name: str) -> object:
    """``target.<name>``, read with exactly one warning at this function's reading line."""
    with one_deprecation(
        f"CudaGraphTarget.{name} is the target's helper in pytest-cudagraph 0.4.0, accepted "
        "until 0.5.0; "
    ) as caught:
        line = this_line() + 1
        found = getattr(target, name)
    assert at(caught) == (__file__, line)
    return found


def test_0_4_0s_helpers_of_the_target_still_work_with_one_warning_each() -> None:
    def draw(generator: torch.Generator, case: Case) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(case.key, generator=generator)}

    cache = Cache(capacity=2)
    target = CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=[2, 3, 5], draw=draw, key_of=len, tolerance={"logits": Tolerance(atol=1e-3)}, cache=cache)  # fmt: skip
    assert helper_of(target, "num_keys") == 3
    case = helper_of(target, "case")
    assert [case(number) for number in (0, 4, 8)] == [Case(0, 2, 0), Case(4, 3, 1), Case(8, 5, 2)]  # type: ignore[operator]
    inputs = helper_of(target, "make_inputs")(torch.Generator(), 4)  # type: ignore[operator]
    assert inputs["x"].shape == (3,)
    capability = helper_of(target, "capability")
    assert capability(Cache) is cache and capability(Sampling) is None  # type: ignore[operator]
    tolerance_of = helper_of(target, "tolerance_of")
    assert tolerance_of("logits") == Tolerance(atol=1e-3) and tolerance_of("cache") == EXACT  # type: ignore[operator]
    describe = helper_of(target, "describe_tolerance")
    assert describe() == "'logits' atol 0.001, rtol 0; other parts exact"  # type: ignore[operator]
    many = CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=range(10**9), draw=draw, key_of=len)  # fmt: skip
    assert helper_of(many, "case")(10**9 + 7) == Case(10**9 + 7, 7, 1)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        (
            {"make_inputs": make_inputs},
            TypeError,
            "make_inputs and num_keys go together; num_keys is missing",
        ),
        (
            {"num_keys": 2},
            TypeError,
            "make_inputs and num_keys go together; make_inputs is missing",
        ),
        (
            {"make_inputs": make_inputs, "num_keys": 0},
            ValueError,
            "num_keys must be an int >= 1, got 0",
        ),
        (
            {"make_inputs": make_inputs, "num_keys": 2, "keys": [1]},
            TypeError,
            "give draw and keys, not both spellings",
        ),
        (
            {"make_inputs": make_inputs, "num_keys": 2, "largest_case": -1},
            ValueError,
            "largest_case must be an int >= 0, got -1",
        ),
    ],
)
def test_an_old_form_that_does_not_hold_together_is_named(
    given: dict[str, object], error: type[Exception], message: str
) -> None:
    fields: dict[str, object] = dict(device=CPU, eager=len, graphed=None, key_of=len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PytestCudagraphDeprecationWarning)
        with pytest.raises(error, match=message):
            CudaGraphTarget(**fields, **given)


def test_an_adapter_given_0_3_0s_flat_fields_builds_the_capabilities() -> None:
    def draw(generator: torch.Generator, case: Case) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(case.key, generator=generator)}

    with one_deprecation("hand_written(capacity=..., largest_key=..., sampler=...)") as caught:
        line = this_line() + 1
        target = hand_written(device=CPU, eager=len, graphed=None, keys=[1, 2], draw=draw, key_of=len, capacity=2, largest_key=2, sampler=lambda seed, graphs: [])  # fmt: skip
    assert at(caught) == (__file__, line)
    assert target.cache == Cache(capacity=2, largest_key=2)
    with pytest.raises(
        TypeError,
        match=r"hand_written\(\) got unknown field\(s\) capacityy; it takes by name cache, capture_clean",
    ):
        hand_written(device=CPU, eager=len, graphed=None, keys=[1], draw=draw, key_of=len, capacityy=2)  # type: ignore[call-arg]  # fmt: skip


def test_largest_case_0_names_the_first_key() -> None:
    with one_deprecation("cache=Cache(largest_key=...)"):
        target = CudaGraphTarget(device=CPU, eager=len, graphed=None, make_inputs=make_inputs, key_of=len, num_keys=3, largest_case=0)  # fmt: skip
    assert target.cache == Cache(largest_key=0)


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        ({"make_inputs": make_inputs, "num_keys": True}, ValueError, "num_keys must be an int >= 1, got True"),
        ({"make_inputs": 3, "num_keys": 2}, TypeError, "make_inputs must be callable, got int"),
        ({"make_inputs": make_inputs, "num_keys": 2, "largest_case": True}, ValueError, "largest_case must be an int >= 0, got True"),
        ({"draw": len, "largest_case": 0}, TypeError, r"largest_case needs keys \(or num_keys\)"),
    ],
)  # fmt: skip
def test_more_old_forms_that_do_not_hold_together_are_named(
    given: dict[str, object], error: type[Exception], message: str
) -> None:
    fields: dict[str, object] = dict(device=CPU, eager=len, graphed=None, key_of=len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PytestCudagraphDeprecationWarning)
        with pytest.raises(error, match=message):
            CudaGraphTarget(**fields, **given)


def test_an_old_field_given_as_none_gives_no_capability() -> None:
    with one_deprecation("sampler"):
        target = CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=[1], draw=lambda g, c: {}, key_of=len, sampler=None)  # fmt: skip
    assert target.sampling is None


def test_make_inputs_gets_the_case_number_not_its_key() -> None:
    numbers: list[int] = []

    def recorded(generator: torch.Generator, number: int) -> dict[str, torch.Tensor]:
        numbers.append(number)
        return make_inputs(generator, number)

    with one_deprecation("make_inputs"):
        target = CudaGraphTarget(device=CPU, eager=len, graphed=None, make_inputs=recorded, key_of=len, num_keys=3)  # fmt: skip
    numbers.clear()  # the cases the translation drew to learn the keys
    target.draw(torch.Generator(), Case(4, 1, 1))
    assert numbers == [4]


# dataclasses.replace of a 0.3.0 target, as 0.3.0 took it


def old_target() -> CudaGraphTarget:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PytestCudagraphDeprecationWarning)
        return CudaGraphTarget(device=CPU, eager=len, graphed=None, make_inputs=make_inputs, key_of=len, num_keys=3, reset=lambda: None, capacity=2, reset_state=lambda: None)  # fmt: skip


def test_replace_gives_a_0_3_0_target_new_make_inputs_keeping_its_keys() -> None:
    old = old_target()

    def rows_of_seven(generator: torch.Generator, number: int) -> dict[str, torch.Tensor]:
        return {"x": torch.zeros(7 + number)}

    with one_deprecation("keys=[the key key_of gives each of cases 0", "draw=lambda") as caught:
        line = this_line() + 1
        changed = dataclasses.replace(old, make_inputs=rows_of_seven)
    assert at(caught) == (__file__, line)
    assert changed.keys == range(3)
    assert changed.draw(torch.Generator(), Case(4, 1, 1))["x"].shape == (11,)
    assert (changed.cache, changed.state) == (old.cache, old.state)


def test_replace_gives_a_0_3_0_target_new_num_keys_keeping_its_make_inputs() -> None:
    old = old_target()
    with one_deprecation("CudaGraphTarget(num_keys=...)") as caught:
        line = this_line() + 1
        changed = dataclasses.replace(old, num_keys=5)
    assert at(caught) == (__file__, line)
    assert changed.keys == range(5)
    drawn = changed.draw(torch.Generator().manual_seed(0), Case(4, 4, 0))
    assert torch.equal(drawn["x"], make_inputs(torch.Generator().manual_seed(0), 4)["x"])


def test_replace_with_an_old_field_none_clears_that_field_alone() -> None:
    old = old_target()
    assert old.cache is not None and old.cache.reset is not None
    with one_deprecation("cache=Cache(reset=...)"):
        changed = dataclasses.replace(old, reset=None)
    assert changed.cache == Cache(capacity=2)
    assert changed.state == old.state and changed.keys == old.keys
    # A capability left giving nothing is dropped (State() gives nothing).
    with one_deprecation("state=State(reset=...)"):
        stateless = dataclasses.replace(old, reset_state=None)
    assert stateless.state is None and stateless.cache == old.cache
    with one_deprecation("cache=Cache(capacity=...)"):
        resetting = dataclasses.replace(changed, capacity=None)
    assert resetting.cache is None


def test_a_0_3_0_side_state_giving_both_sides_one_object_is_left_out_with_a_warning() -> None:
    model = torch.nn.Linear(2, 2)
    with one_deprecation(
        "State(sides=...) giving each side its own state",
        "gives both sides the same one, which 0.3.0 compared with itself: it is left out here",
    ) as caught:
        line = this_line() + 1
        target = CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=[1], draw=lambda g, c: {}, key_of=len, side_state=lambda: (model, model), reset_state=lambda: None)  # fmt: skip
    assert at(caught) == (__file__, line)
    assert target.state is not None and target.state.sides is None  # its reset is kept
    assert len(str(caught[0].message).splitlines()) == 1
    apart = torch.nn.Linear(2, 2)
    with one_deprecation("state=State(sides=...)"):
        own = CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=[1], draw=lambda g, c: {}, key_of=len, side_state=lambda: (model, apart))  # fmt: skip
    assert own.state is not None and own.state.sides is not None
    assert own.state.sides() == (model, apart)


def needs_cuda_itself(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    raise AssertionError("0.3.0 never called the graphed side without CUDA")


def test_a_0_3_0_target_on_the_cpu_leaves_its_graphed_side_out_and_runs_the_dry_run() -> None:
    with one_deprecation(
        "graphed=None without CUDA (0.3.0 never called the graphed side there"
    ) as caught:
        line = this_line() + 1
        target = CudaGraphTarget(device=CPU, eager=lambda i: i["x"] * 2, graphed=needs_cuda_itself, make_inputs=make_inputs, key_of=lambda i: i["x"].shape[0], num_keys=3)  # fmt: skip
    assert at(caught) == (__file__, line)
    assert target.graphed is None
    [figure] = run(test_00_target.test_dry_run, target, explain=explained)
    assert figure.startswith("eager once on each of 3 keys;")  # not "eager and graphed"
    new_spelling = CudaGraphTarget(device=CPU, eager=len, graphed=needs_cuda_itself, keys=[1], draw=lambda g, c: {}, key_of=len)  # fmt: skip
    assert new_spelling.graphed is needs_cuda_itself  # the new spelling is taken as written


def test_every_deprecation_is_filtered_by_its_one_class() -> None:
    old = old_target()
    spellings = [
        lambda: CudaGraphTarget(
            device=CPU, eager=len, graphed=None, make_inputs=make_inputs, key_of=len, num_keys=1
        ),
        lambda: dataclasses.replace(old, num_keys=2),
        lambda: old.capacity,
        lambda: old.num_keys,
    ]
    for spelling in spellings:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", category=PytestCudagraphDeprecationWarning)
            spelling()
        assert caught == []
        with warnings.catch_warnings():
            warnings.simplefilter("error", PytestCudagraphDeprecationWarning)
            with pytest.raises(PytestCudagraphDeprecationWarning):
                spelling()
    assert issubclass(PytestCudagraphDeprecationWarning, DeprecationWarning)


# The old import paths, each in a fresh process (a module is imported once per process)

OLD_IMPORTS = """\
import warnings
warnings.simplefilter("always")
from pytest_cudagraph.conformance.target import CudaGraphTarget, Tolerance, TargetError, validate_target, Padding, Trajectory, installed_targets
import pytest_cudagraph.target as old_target
import pytest_cudagraph.adapters as old_adapters
from pytest_cudagraph.conformance.adapters import hand_written, compiled, graphed_callables, InductorSkips, Case
from pytest_cudagraph.conformance.protocol import State, CAPABILITIES
import pytest_cudagraph.conformance.loading as old_loading
import pytest_cudagraph.conformance as door
from pytest_cudagraph.conformance import _adapters, _loading, _protocol
assert CudaGraphTarget is door.CudaGraphTarget and old_target.TargetError is door.TargetError
assert old_adapters is _adapters and hand_written is door.hand_written and Case is door.Case
assert State is door.State and CAPABILITIES is _protocol.CAPABILITIES
assert old_loading is _loading and installed_targets is _loading.installed_targets
print("ok")
"""
# Line of OLD_IMPORTS -> the start of its warning.
OLD_IMPORT_WARNINGS = {
    3: "pytest_cudagraph.conformance.target is 0.3.0's home of the target protocol, kept until 0.5.0; import from pytest_cudagraph.conformance",
    4: "pytest_cudagraph.target moved to pytest_cudagraph.conformance in 0.3.0; the old name goes in 0.5.0",
    5: "pytest_cudagraph.adapters moved to pytest_cudagraph.conformance.adapters in 0.3.0; the old name goes in 0.5.0; import from pytest_cudagraph.conformance",
    6: "pytest_cudagraph.conformance.adapters is private now, kept until 0.5.0; import from pytest_cudagraph.conformance",
    7: "pytest_cudagraph.conformance.protocol is private now, kept until 0.5.0; import from pytest_cudagraph.conformance",
    8: "pytest_cudagraph.conformance.loading is private now, kept until 0.5.0; import from pytest_cudagraph.conformance",
}  # fmt: skip


def test_the_old_import_paths_give_the_same_objects_each_with_a_warning_at_its_import() -> None:
    done = subprocess.run(
        [sys.executable, "-c", OLD_IMPORTS], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr
    lines = [line for line in done.stderr.splitlines() if "Warning: " in line]
    assert lines == [
        f"<string>:{line}: PytestCudagraphDeprecationWarning: {message}"
        for line, message in OLD_IMPORT_WARNINGS.items()
    ], done.stderr


def test_an_old_import_path_is_filtered_by_the_deprecation_class() -> None:
    code = (
        "import warnings\n"
        "from pytest_cudagraph import PytestCudagraphDeprecationWarning as Old\n"
        "warnings.simplefilter('always')\n"
        "warnings.filterwarnings('ignore', category=Old)\n"
        "import pytest_cudagraph.conformance.protocol\n"
        "warnings.simplefilter('error', Old)\n"
        "try:\n"
        "    import pytest_cudagraph.conformance.loading\n"
        "except Old as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("pytest_cudagraph.conformance.loading is private now")


@pytest.mark.parametrize(
    "old_home", ["pytest_cudagraph.conformance.target", "pytest_cudagraph.target"]
)
def test_python_m_of_an_old_home_lists_the_installed_targets(old_home: str) -> None:
    spec = importlib.util.find_spec(old_home)  # no file of its own: the layer serves it
    assert spec is not None and spec.origin is None and type(spec.loader).__name__ == "AliasFinder"
    done = subprocess.run(
        [sys.executable, "-m", old_home], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "\n".join(installed_lines()) + "\n"
    assert "reasyn  reasyn_ref.targets.reference:make_target" in done.stdout


# The layer removed: everything else works, and an old spelling is a plain error

LEGACY = "pytest_cudagraph.conformance._legacy"
WITHOUT_THE_LAYER = f"""\
import importlib.abc
import sys


class Removed(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {LEGACY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Removed())
import pytest
import torch

import pytest_cudagraph.conformance as door
from pytest_cudagraph.conformance import Cache, Case, CudaGraphTarget, compiled, graphed_callables, hand_written, validate_target

cpu = torch.device("cpu")
for name in door.__all__:
    getattr(door, name)


def draw(generator, case):
    return {{"x": torch.randn(case.key, 4, generator=generator)}}


def double(x):
    return x * 2


target = CudaGraphTarget(device=cpu, eager=lambda i: i["x"] * 2, graphed=None, keys=[2, 3], draw=draw, key_of=lambda i: i["x"].shape[0], cache=Cache(capacity=2))
validate_target("mine:make", target, cpu)
for adapted in (
    hand_written(device=cpu, eager=lambda i: i["x"], graphed=None, keys=[2, 3], draw=draw, key_of=lambda i: i["x"].shape[0]),
    compiled(double, device=cpu, keys=[2, 3], draw=draw),
    graphed_callables(double, device=cpu, keys=[2, 3], draw=draw),
):
    validate_target("mine:make", adapted, cpu)
    assert adapted.key_of(draw(torch.Generator(), Case(1, 3, 0))) == 3
print("targets ok")
for old in (
    lambda: CudaGraphTarget(device=cpu, eager=len, graphed=None, keys=[2], draw=draw, key_of=len, capacity=2),
    lambda: hand_written(device=cpu, eager=len, graphed=None, keys=[2], draw=draw, key_of=len, capacity=2),
):
    try:
        old()
    except TypeError as error:
        print(type(error).__name__, error)
try:
    target.num_keys
except AttributeError as error:
    print(type(error).__name__, error)
try:
    import pytest_cudagraph.target
except ModuleNotFoundError as error:
    print(type(error).__name__, error)
status = pytest.main(["--pyargs", "pytest_cudagraph.conformance", "--collect-only", "-q", "-p", "no:cacheprovider"])
print("collection", int(status), {LEGACY!r} in sys.modules)
"""


@pytest.mark.slow
def test_without_the_layer_everything_else_works_and_an_old_field_is_a_plain_type_error(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_LAYER],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "targets ok"
    assert lines[-1] == "collection 0 False"
    assert f"{len(declared_checks())} tests collected" in done.stdout
    assert [line for line in lines if line.split(" ", 1)[0].endswith("Error")] == [
        "TypeError CudaGraphTarget.__init__() got an unexpected keyword argument 'capacity'",
        "TypeError hand_written() got unknown field(s) capacity; it takes by name cache, "
        "capture_clean, fallbacks, generators, guards, output_lifetime, padding, real_part, "
        "sampling, state, threads, tolerance, trajectory, workers",
        "AttributeError 'CudaGraphTarget' object has no attribute 'num_keys'",
        "ModuleNotFoundError No module named 'pytest_cudagraph.target'",
    ]


def test_a_0_3_0_target_whose_key_of_gives_the_codes_key_keeps_passing_the_contract() -> None:
    """0.3.0's key_of gave the code's own key (here the rows): the target's keys are those of
    its cases, so each draw's key is the key it was drawn for, as the contract asks."""
    with one_deprecation("make_inputs"):
        target = CudaGraphTarget(device=CPU, eager=len, graphed=None, make_inputs=make_inputs, key_of=lambda i: i["x"].shape[0], num_keys=3)  # fmt: skip
    for number in range(6):
        problems = test_00_target.key_problems(target, numbered(target, number), lambda w: None)
        assert problems == []
