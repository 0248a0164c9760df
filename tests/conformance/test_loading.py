"""pytest_cudagraph.conformance._loading on the CPU: loading installed names and ``module:factory``
specs, validating what the factory returns (a ``draw`` of keys, a release before 0.3.0's
spelling, stops there in one line), which spec is in force (option > env > ini > the one
installed target), and what a user sees when the target cannot be built."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import threading
import types
import warnings
from collections.abc import Callable

import pytest
import torch
from distributions import registered_targets
from suite_runner import plugin_arguments

from pytest_cudagraph.conformance import (
    Cache,
    Case,
    CudaGraphTarget,
    TargetError,
    Tolerance,
    _loading,
    validate_target,
)
from pytest_cudagraph.conformance._catalog import Declaration
from pytest_cudagraph.conformance._loading import (
    DRAW_OF_KEYS,
    UserCodeError,
    build_target,
    installed_lines,
    installed_targets,
    load_factory,
    resolve_spec,
    user_call,
)
from pytest_cudagraph.conformance._suite import chosen_target_spec

CPU = torch.device("cpu")


def rows_drawn(generator: torch.Generator, case: Case) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(case.key, generator=generator)}


def minimal_target(**changes: object) -> CudaGraphTarget:
    """A valid target with only the required fields, then ``changes``."""
    fields = dict(
        device=CPU,
        eager=lambda inputs: inputs["x"] * 2,
        graphed=lambda inputs: inputs["x"] * 2,
        keys=[1, 2, 3, 4],
        draw=rows_drawn,
        key_of=lambda inputs: inputs["x"].shape[0],
    )
    return CudaGraphTarget(**{**fields, **changes})


@pytest.fixture
def factories(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """An importable module ``fake_targets`` to point specs at."""
    module = types.ModuleType("fake_targets")
    module.NOT_CALLABLE = 3
    module.namespace = types.SimpleNamespace(make=lambda device: minimal_target())
    monkeypatch.setitem(sys.modules, "fake_targets", module)
    return module


def build_with(factories: types.ModuleType, factory: Callable[[torch.device], object]) -> None:
    factories.factory = factory
    build_target("fake_targets:factory", CPU)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("fake_targets", "no installed target of that name (installed: mine)"),
        ("fake_targets:", "must be a name or 'module:factory'"),
        (":factory", "must be a name or 'module:factory'"),
        ("no_such_module_here:make", "cannot import module 'no_such_module_here'"),
        ("fake_targets:missing", "fake_targets has no attribute 'missing'"),
        ("fake_targets:namespace.missing", "fake_targets has no attribute 'namespace.missing'"),
        ("fake_targets:NOT_CALLABLE", "NOT_CALLABLE is a int, not a callable factory"),
    ],
)
def test_a_spec_that_cannot_be_loaded_is_a_target_error_naming_it(
    factories: types.ModuleType, monkeypatch: pytest.MonkeyPatch, spec: str, problem: str
) -> None:
    fake_installed(monkeypatch, {"mine": "fake_targets:namespace.make"})
    with pytest.raises(TargetError) as error:
        load_factory(spec)
    assert str(error.value).startswith(f"conformance target {spec!r}: {problem}")


def test_a_dotted_factory_is_found(factories: types.ModuleType) -> None:
    assert load_factory("fake_targets:namespace.make") is factories.namespace.make
    assert len(build_target("fake_targets:namespace.make", CPU).keys) == 4


def test_a_factory_that_raises_is_reported_with_its_whole_error(
    factories: types.ModuleType,
) -> None:
    def factory(device: torch.device) -> CudaGraphTarget:
        raise RuntimeError("no GPU for you\nand a second line, the shapes say")

    with pytest.raises(
        TargetError,
        match=r"^conformance target 'fake_targets:factory': the factory raised RuntimeError: "
        r"no GPU for you\nand a second line, the shapes say$",
    ) as error:
        build_with(factories, factory)
    # Kept, so that the user's own traceback can be shown.
    assert isinstance(error.value.__cause__, RuntimeError)


def test_a_factory_that_exits_is_reported_like_any_error(factories: types.ModuleType) -> None:
    def factory(device: torch.device) -> CudaGraphTarget:
        sys.exit(3)

    with pytest.raises(
        TargetError,
        match=r"^conformance target 'fake_targets:factory': the factory raised SystemExit: 3$",
    ) as error:
        build_with(factories, factory)
    assert isinstance(error.value.__cause__, SystemExit)


def test_a_factory_returning_something_else_is_refused(factories: types.ModuleType) -> None:
    with pytest.raises(
        TargetError,
        match=r"the factory returned dict; expected a pytest_cudagraph\.conformance\.CudaGraphTarget",
    ):
        build_with(factories, lambda device: {"eager": None})


def test_a_core_field_left_out_or_malformed_is_named_from_the_factorys_error(
    factories: types.ModuleType,
) -> None:
    def factory(device: torch.device) -> CudaGraphTarget:
        fields = {
            f.name: getattr(minimal_target(), f.name) for f in dataclasses.fields(CudaGraphTarget)
        }
        del fields["key_of"]
        return CudaGraphTarget(**fields)

    with pytest.raises(TargetError, match=r"the factory raised TypeError: .*'key_of'"):
        build_with(factories, factory)
    with pytest.raises(
        TargetError, match=r"the factory raised ValueError: Cache.capacity must be >= 1, got 0"
    ):
        build_with(factories, lambda device: minimal_target(cache=Cache(capacity=0)))


def test_a_target_made_for_another_device_is_refused(factories: types.ModuleType) -> None:
    with pytest.raises(
        TargetError, match=r"device is device\(type='meta'\); the factory was asked for cpu"
    ):
        build_with(factories, lambda device: minimal_target(device=torch.device("meta")))


def test_the_plugin_registers_no_target_and_reasyn_ref_its_three() -> None:
    # What a user installs with the plugin alone: no target, so their one is the default.
    assert registered_targets("pytest-cudagraph") == {}
    assert registered_targets("reasyn-ref") == {
        "reasyn": "reasyn_ref.targets.reference:make_target",
        "reasyn-kv": "reasyn_ref.targets.kv:make_target",
        "reasyn-lean": "reasyn_ref.targets.reference:make_lean_target",
    }
    # Whatever else this environment holds, reasyn-ref's targets are among the installed ones.
    assert registered_targets("reasyn-ref").items() <= installed_targets().items()


def test_the_installed_reference_is_valid_on_the_cpu() -> None:
    target = build_target("reasyn", CPU)
    assert target.device == CPU
    assert target.tolerance == Tolerance()
    # On the CPU there is no graph cache: the capabilities about it are left out.
    needs = ("cache.lock", "cache.capacity", "guards", "workers")
    assert Declaration("reference", needs=needs).lacking(target) == ["cache.lock", "cache.capacity"]


def fake_installed(monkeypatch: pytest.MonkeyPatch, names: dict[str, str]) -> None:
    monkeypatch.setattr(_loading, "installed_targets", lambda: names)


def test_with_none_chosen_the_one_installed_target_is_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_installed(monkeypatch, {"reasyn": "reasyn_ref.targets.reference:make_target"})
    assert resolve_spec(None) == "reasyn"
    assert resolve_spec("mine:make") == "mine:make"
    fake_installed(monkeypatch, {"a": "pa:make", "b": "pb:make"})
    with pytest.raises(
        TargetError,
        match=r"none chosen and 2 installed \(a, b\); choose one with --cudagraph-target",
    ):
        resolve_spec(None)
    fake_installed(monkeypatch, {})
    with pytest.raises(TargetError, match=r"none chosen and none installed"):
        resolve_spec(None)


def test_an_installed_name_loads_its_factory(
    monkeypatch: pytest.MonkeyPatch, factories: types.ModuleType
) -> None:
    fake_installed(monkeypatch, {"fake": "fake_targets:namespace.make", "other": "x:y"})
    assert load_factory("fake") is factories.namespace.make
    with pytest.raises(TargetError, match=r"'nope': no installed target .*installed: fake, other"):
        load_factory("nope")


def test_the_installed_names_are_listed_from_the_command_line() -> None:
    listed = subprocess.run(
        ["pytest-cudagraph", "targets"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = installed_targets()
    assert installed, "the project's set-up installs reasyn-ref (pip install -e ./reasyn_ref)"
    assert listed.stdout.splitlines() == [f"{name}  {value}" for name, value in installed.items()]


def test_with_none_installed_the_listing_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_installed(monkeypatch, {})
    assert installed_lines() == [
        "no conformance targets installed (entry-point group pytest_cudagraph.targets)"
    ]


def test_a_module_in_the_rootdir_imports_without_being_on_sys_path(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(in_rootdir="def make(device):\n    return None\n")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(pytester.path))])
    assert "in_rootdir" not in sys.modules
    assert load_factory("in_rootdir:make", search_paths=[pytester.path]).__name__ == "make"
    assert str(pytester.path) in sys.path


@pytest.mark.parametrize(
    ("source", "problem", "line"),
    [
        (
            "def broken(:\n",
            "importing 'import_fails' failed: SyntaxError: invalid syntax (import_fails.py, line 1)",
            None,
        ),
        (
            "import os\nraise RuntimeError('no config\\nsecond line')\n",
            "importing 'import_fails' failed: RuntimeError: no config\nsecond line",
            2,
        ),
        ("import sys\nsys.exit(3)\n", "importing 'import_fails' failed: SystemExit: 3", 2),
        (
            "import no_such_dependency_here\n",
            "importing 'import_fails' failed: ModuleNotFoundError: No module named "
            "'no_such_dependency_here'",
            1,
        ),
    ],
)
def test_an_error_while_importing_is_shown_whole_at_the_users_line(
    pytester: pytest.Pytester, source: str, problem: str, line: int | None
) -> None:
    pytester.makepyfile(import_fails=source)
    with pytest.raises(TargetError) as error:
        load_factory("import_fails:make", search_paths=[pytester.path])
    sys.modules.pop("import_fails", None)
    assert str(error.value) == f"conformance target 'import_fails:make': {problem}"
    if line is not None:  # a SyntaxError has no frame of the module: it never ran
        shown = _loading.explained(error.value).splitlines()
        at = shown.index("Traceback (your code):")
        path = pytester.path / "import_fails.py"
        assert shown[at + 1] == f'  File "{path}", line {line}, in <module>'
        assert "left out: --tb=long shows every frame" in shown[-1]


@pytest.mark.parametrize(
    ("spec", "suggestion"),
    [
        ("fake_targets:namespace.mkae", "did you mean 'make'?"),
        ("fake_targets:factroy", "did you mean 'factory'?"),
        (
            "tests/mine.py:make",
            "'tests/mine.py' is a path; give a module name as an import "
            "statement names it: tests.mine:make, or mine:make with tests on sys.path (the ini's "
            "pythonpath)",
        ),
        ("mine.py:make", "give a module name as an import statement names it: mine:make"),
    ],
)
def test_a_misspelt_spec_gets_a_suggestion(
    factories: types.ModuleType, spec: str, suggestion: str
) -> None:
    factories.factory = lambda device: minimal_target()
    with pytest.raises(TargetError) as error:
        load_factory(spec)
    assert str(error.value).endswith(suggestion)


def test_a_misspelt_installed_name_gets_a_suggestion(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_installed(monkeypatch, {"reasyn": "a:b", "reasyn-kv": "a:c"})
    with pytest.raises(TargetError, match=r"did you mean 'reasyn' or 'reasyn-kv'\?$"):
        load_factory("reasin")


@pytest.mark.parametrize(
    "message",
    [
        "Tried to instantiate dummy base class CUDAGraph",
        "Torch not compiled with CUDA enabled",
        "No CUDA GPUs are available".replace("No", "no"),
        "CUDA error: CUDA driver version is insufficient for CUDA runtime version",
        "CUDA error: no CUDA-capable device is detected",
    ],
)
def test_a_factory_that_uses_cuda_when_called_for_the_cpu_is_told_the_rule(
    factories: types.ModuleType, message: str
) -> None:
    def factory(device: torch.device) -> CudaGraphTarget:
        raise RuntimeError(message)

    with pytest.raises(TargetError) as error:
        build_with(factories, factory)
    assert str(error.value).splitlines()[1:] == [
        "The factory is called with the CPU (cpu) when CUDA is missing: build the graphs only "
        "where pytest_cudagraph.conformance.graphs_on(device) holds (CUDA, or graphs emulated) "
        "and give graphed=None otherwise (docs/own-graphs.md)"
    ]


def test_a_cuda_graph_built_on_the_cpu_at_start_up_is_told_the_rule(
    factories: types.ModuleType,
) -> None:
    """What torch itself raises when runner code builds a CUDA graph without CUDA."""
    if torch.cuda.is_available():
        pytest.skip("torch.cuda.CUDAGraph() works here: torch's error without CUDA cannot be made")

    def factory(device: torch.device) -> CudaGraphTarget:
        torch.cuda.CUDAGraph()
        return minimal_target()

    with pytest.raises(
        TargetError, match=r"build the graphs only where .*graphs_on\(device\) holds"
    ):
        build_with(factories, factory)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"key_of": lambda inputs: inputs["x"][:1]},
            r"key_of\(inputs of case 0: key 1, repeat 0\) returned a tensor \(Tensor tensor",
        ),
        (
            {"key_of": lambda inputs: object()},
            r"key_of\(inputs of case 0: key 1, repeat 0\) gave two keys for two draws of one "
            r"case \(object <object object at .*>, then object <object .*>\): a key must be a "
            r"plain value that compares equal",
        ),
        (
            {"key_of": lambda inputs: float("nan")},
            r"key_of\(inputs of case 0: key 1, repeat 0\) returned float nan, which is not equal "
            r"to itself \(NaN\)",
        ),
        (
            {"key_of": lambda inputs: ["x"]},
            r"key_of\(inputs of case 0: key 1, repeat 0\) returned list \['x'\], which cannot be "
            r"a key: TypeError: unhashable type: 'list'",
        ),
        (
            {"key_of": lambda inputs: sys.exit(2)},
            r"key_of\(inputs of case 0: key 1, repeat 0\) raised SystemExit: 2",
        ),
        (
            {"draw": lambda g, case: sys.exit(2)},
            r"draw\(generator, case 0: key 1, repeat 0\) raised SystemExit: 2",
        ),
        (
            {"draw": lambda g, case: None},
            r"draw\(generator, case 0: key 1, repeat 0\) returned NoneType \(a forgotten return\?\)",
        ),
    ],
    ids=[
        "tensor key",
        "object key",
        "NaN key",
        "list key",
        "key_of exits",
        "draw exits",
        "no return",
    ],
)
def test_a_draw_or_key_that_cannot_work_is_named_before_any_check(
    factories: types.ModuleType, changes: dict[str, object], problem: str
) -> None:
    with pytest.raises(
        TargetError, match=rf"^conformance target 'fake_targets:factory': {problem}"
    ):
        build_with(factories, lambda device: minimal_target(**changes))


def run_configured(pytester: pytest.Pytester, *args: str) -> pytest.Config:
    return pytester.parseconfigure(*plugin_arguments(), *args)


@pytest.mark.slow
def test_the_spec_comes_from_option_then_env_then_ini(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, factories: types.ModuleType
) -> None:
    monkeypatch.delenv("PYTEST_CUDAGRAPH_TARGET", raising=False)
    assert chosen_target_spec(run_configured(pytester)) is None
    pytester.makeini("[pytest]\ncudagraph_target = fake_targets:namespace.make\n")
    assert chosen_target_spec(run_configured(pytester)) == "fake_targets:namespace.make"
    monkeypatch.setenv("PYTEST_CUDAGRAPH_TARGET", "fake_targets:NOT_CALLABLE")
    # Loaded at configure time where the session runs the suite: a bad one is a usage error
    # there, and nowhere else (a shared ini or environment must not stop unrelated runs).
    assert chosen_target_spec(run_configured(pytester)) == "fake_targets:NOT_CALLABLE"
    with pytest.raises(
        pytest.UsageError,
        match=r"^conformance target 'fake_targets:NOT_CALLABLE': NOT_CALLABLE is a int",
    ):
        run_configured(pytester, "--pyargs", "pytest_cudagraph.conformance")
    assert chosen_target_spec(run_configured(pytester, "--cudagraph-target", "reasyn")) == "reasyn"


# What a user sees when the target cannot be built, in a session of their own tests (the suite's
# own sessions: tests/conformance/test_suite_on_cpu.py).

USER_TESTS = """
def test_before():
    pass

def test_uses_the_target(conformance_target):
    pass

def test_uses_it_again(conformance_target):
    pass

def test_after():
    pass
"""

LOAD_CALL = "    return load_weights()"
RAISE = '    raise RuntimeError("no weights here")'
UNBUILDABLE = f"""
import sys


def make(device):
{LOAD_CALL}


def load_weights():
{RAISE}


def make_exiting(device):
    sys.exit(3)
"""


@pytest.fixture
def user_project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_mine=USER_TESTS, unbuildable=UNBUILDABLE)
    pytester.syspathinsert()
    return pytester


@pytest.mark.parametrize(
    ("installed", "problem"),
    [
        ({}, "none chosen and none installed; give --cudagraph-target module:factory"),
        (
            {"a": "pa:make", "b": "pb:make"},
            "none chosen and 2 installed (a, b); choose one with --cudagraph-target NAME",
        ),
    ],
    ids=["none installed", "two installed"],
)
def test_a_test_using_the_target_with_none_chosen_errors_alone(
    user_project: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    installed: dict[str, str],
    problem: str,
) -> None:
    fake_installed(monkeypatch, installed)
    result = user_project.runpytest_inprocess(*plugin_arguments())
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines([f"conformance target: {problem}"])
    assert "!!!" not in result.stdout.str(), "the session was stopped"


@pytest.mark.parametrize("factory", ["make", "make_exiting"])
def test_a_factory_that_fails_errors_only_the_tests_using_it(
    user_project: pytest.Pytester, factory: str
) -> None:
    result = user_project.runpytest_inprocess(
        *plugin_arguments(), "--cudagraph-target", f"unbuildable:{factory}"
    )
    result.assert_outcomes(passed=2, errors=2)
    output = result.stdout.str()
    assert "AssertionError" not in output and "INTERNALERROR" not in output
    # By default the user's own frames only, and how to see the rest.
    source = user_project.path / "unbuildable.py"
    result.stdout.fnmatch_lines(
        [
            "Traceback (your code):",
            f'  File "{source}", line *, in {factory}',
            "  (1 frame of Python, torch, pytest and pytest-cudagraph left out: --tb=long shows "
            "every frame)",
        ]
    )
    assert "Traceback (most recent call last)" not in output
    assert "in build_target" not in output


@pytest.mark.parametrize("asked", [["--tb=long"], ["--tb=native"], ["--full-trace"]])
def test_the_factory_traceback_names_the_users_file_and_line_when_asked(
    user_project: pytest.Pytester, asked: list[str]
) -> None:
    result = user_project.runpytest_inprocess(
        *plugin_arguments(), "--cudagraph-target", "unbuildable:make", *asked
    )
    result.assert_outcomes(passed=2, errors=2)
    source = user_project.path / "unbuildable.py"
    lines = source.read_text().splitlines()
    call, raised = (lines.index(text) + 1 for text in (LOAD_CALL, RAISE))
    # With --full-trace pytest prints the message as an exception's, each line after "E".
    result.stdout.fnmatch_lines(
        [
            "*conformance target 'unbuildable:make': the factory raised RuntimeError: no weights here",
            "*Traceback (most recent call last):",
            f'*  File "{source}", line {call}, in make',
            f"*{LOAD_CALL}",
            f'*  File "{source}", line {raised}, in load_weights',
            f"*{RAISE}",
            "*RuntimeError: no weights here",
        ]
    )
    # From the factory's own frame on, but with --full-trace from the call that made it too.
    shows_the_call = "in build_target" in result.stdout.str()
    assert shows_the_call == (asked == ["--full-trace"])


def raising(error: Exception) -> Callable[[object], object]:
    def call(inputs: object) -> object:
        raise error

    return call


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"draw": lambda generator, case: ["x"]},  # names alone are no inputs
            "draw(generator, case 0: key 1, repeat 0) returned list; it must return a dict of "
            "input name -> value",
        ),
        (
            {"draw": lambda generator, case: {0: torch.zeros(3)}},
            "draw(generator, case 0: key 1, repeat 0) returned dict; it must return a dict of "
            "input name -> value",
        ),
        (
            {"key_of": lambda inputs: [3]},
            "key_of(inputs of case 0: key 1, repeat 0) returned list [3], which cannot be a key: "
            "TypeError: unhashable type: 'list'",
        ),
        (
            {"key_of": raising(IndexError("no dim 2\nsecond line"))},
            "key_of(inputs of case 0: key 1, repeat 0) raised IndexError: no dim 2\nsecond line",
        ),
    ],
)
def test_case_0_is_drawn_and_keyed_when_the_target_is_validated(
    changes: dict[str, object], problem: str
) -> None:
    with pytest.raises(TargetError) as refused:
        _loading.validate_target("mine:make", minimal_target(**changes), CPU)
    assert str(refused.value) == f"conformance target 'mine:make': {problem}"


def test_a_title_names_the_spec_or_says_none_is_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _loading.describe_spec("mine:make") == "mine:make"
    fake_installed(monkeypatch, {})
    assert _loading.describe_spec(None) == "no target chosen"


# A draw of keys, the spelling of a release before 0.3.0, is no longer translated


def keyed_target(draw: Callable[..., object]) -> CudaGraphTarget:
    return CudaGraphTarget(device=CPU, eager=len, graphed=None, keys=[(2,), (3,)], draw=draw, key_of=lambda i: i["x"].shape)  # type: ignore[arg-type]  # fmt: skip


def test_a_draw_of_keys_stops_validation_in_one_line_without_being_called() -> None:
    given: list[object] = []

    def draw(generator: torch.Generator, key: tuple[int]) -> dict[str, torch.Tensor]:
        given.append(key)
        return {"x": torch.randn(*key, generator=generator)}  # a Case is no shape: torch raises

    def positional_only(generator: torch.Generator, key: object, /) -> dict[str, torch.Tensor]:
        given.append(key)
        return {"x": torch.zeros(2)}  # a Case would do here

    assert "draw(generator, case)" in DRAW_OF_KEYS and "case.key" in DRAW_OF_KEYS
    for spelt in (draw, positional_only, lambda generator, key: given.append(key)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(TargetError) as refused:
                validate_target("mine:make", keyed_target(spelt), CPU)
        assert str(refused.value) == f"conformance target 'mine:make': {DRAW_OF_KEYS}"
        assert refused.value.__cause__ is None and "\n" not in str(refused.value)
        assert caught == []
    assert given == []  # never called: no error from inside torch to show


def test_a_draw_of_keys_from_a_factory_is_refused_alike(factories: types.ModuleType) -> None:
    def draw(generator: torch.Generator, key: tuple[int]) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(*key, generator=generator)}

    with pytest.raises(TargetError) as refused:
        build_with(factories, lambda device: keyed_target(draw))
    assert str(refused.value) == f"conformance target 'fake_targets:factory': {DRAW_OF_KEYS}"


def test_a_draw_with_an_unnamed_parameter_is_called_with_a_case_and_its_error_named() -> None:
    calls: list[object] = []

    def shaped(generator: torch.Generator, shape: object) -> dict[str, torch.Tensor]:
        calls.append(shape)
        return {"x": torch.randn(*shape, generator=generator)}  # type: ignore[misc]

    def reads_rows(generator: torch.Generator, c: object) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(c.rows, generator=generator)}  # type: ignore[attr-defined]

    def keyed(generator: torch.Generator, c: Case) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(*c.key, generator=generator)}

    with pytest.raises(TargetError) as refused:
        validate_target("mine:make", keyed_target(shaped), CPU)
    assert re.fullmatch(  # Python words the TypeError itself
        r"conformance target 'mine:make': draw\(generator, case 0: key \(2,\), repeat 0\) "
        r"raised TypeError: [^\n]* after \* must be an iterable, not Case",
        str(refused.value),
    )
    assert calls == [Case(0, (2,), 0)]  # called once, with the case, never with its key
    assert isinstance(refused.value.__cause__, TypeError)
    with pytest.raises(TargetError) as refused:
        validate_target("mine:make", keyed_target(reads_rows), CPU)
    assert str(refused.value) == (
        "conformance target 'mine:make': draw(generator, case 0: key (2,), repeat 0) raised "
        "AttributeError: 'Case' object has no attribute 'rows'"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        validate_target("mine:make", keyed_target(keyed), CPU)


def test_a_draw_named_for_cases_is_called_once_and_never_with_the_key() -> None:
    given: list[object] = []

    def draw(generator: torch.Generator, case: Case) -> dict[str, torch.Tensor]:
        given.append(case)
        raise KeyError("hidden")

    with pytest.raises(
        TargetError,
        match=r"^conformance target 'mine:make': draw\(generator, case 0: key \(2,\), repeat 0\) "
        r"raised KeyError: 'hidden'$",
    ):
        validate_target("mine:make", keyed_target(draw), CPU)
    assert given == [Case(0, (2,), 0)]


def test_an_invalidated_capture_names_the_threads_that_may_have_done_it() -> None:
    """In torch's global capture mode another thread's CUDA call invalidates a capture: the
    error does not blame the call alone, and names the threads alive (the suite's marked)."""
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, name="cudagraph-memory-peak")
    theirs = threading.Thread(target=stop.wait, name="prefetcher")
    helper.start(), theirs.start()
    try:
        with pytest.raises(UserCodeError) as raised, user_call("graphed(case 0)"):
            raise RuntimeError(
                "CUDA error: operation failed due to a previous error during capture"
            )
        with pytest.raises(UserCodeError) as plain, user_call("graphed(case 0)"):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    finally:
        stop.set()
        helper.join(), theirs.join()
    message = str(raised.value)
    assert "The capture was invalidated, which need not be this call's doing" in message
    assert "cudagraph-memory-peak (the suite's)" in message
    assert "prefetcher" in message and "prefetcher (the suite's)" not in message
    assert "capture was invalidated" not in str(plain.value)
