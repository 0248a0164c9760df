"""pytest_cudagraph.conformance._catalog: each check declares itself once (``@check``: its name,
what it needs and what sharpens it, where it judges), a declaration names only capabilities and
their fields, ``declared_checks`` lists the suite's checks in the table's order, the suite reads
each declaration at collection (a check without one is a usage error; the ones that need CUDA
are marked so), each declaration names what its check reads of a target, and
docs/own-graphs.md shows the table as the declarations say."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from types import FunctionType, ModuleType

import pytest
import torch

from pytest_cudagraph.conformance import Cache, CudaGraphTarget
from pytest_cudagraph.conformance._catalog import (
    CHECKS_FOLDER,
    MARK,
    Declaration,
    check,
    declaration_of,
    declared,
    declared_checks,
    lacking_reason,
    needs_table,
)
from pytest_cudagraph.conformance._protocol import CAPABILITIES

ROOT = Path(__file__).resolve().parents[2]


def target_with(**capabilities: object) -> CudaGraphTarget:
    return CudaGraphTarget(
        device=torch.device("cpu"),
        eager=len,
        graphed=None,
        keys=[1],
        draw=lambda generator, case: {},
        key_of=len,
        **capabilities,  # type: ignore[arg-type]
    )


def test_a_declaration_names_what_the_target_lacks_and_the_skip_says_it() -> None:
    target = target_with(cache=Cache(capacity=3))
    bounded = Declaration("bounded", needs=("cache.reset", "cache.capacity", "cache.largest_key"))
    assert bounded.lacking(target) == ["cache.reset", "cache.largest_key"]
    assert Declaration("sampled", needs=("sampling",)).lacking(target) == ["sampling"]
    assert Declaration("cached", needs=("cache", "cache.capacity")).lacking(target) == []
    mixed = Declaration("mixed", needs=("cache.capacity", "cache.lock", "sampling"))
    assert mixed.lacking(target) == ["cache.lock", "sampling"]
    # What only sharpens a check is never lacking.
    assert Declaration("sharper", sharper_with=("cache.lock", "state")).lacking(target) == []
    assert lacking_reason(bounded.lacking(target)) == (
        "the target does not give cache.reset, cache.largest_key (optional; `pytest-cudagraph "
        "checks` lists what each check needs)"
    )
    assert declared(3) == 3
    with pytest.raises(TypeError, match=r"declare it in needs"):
        declared(None)


def test_a_check_is_declared_once_as_a_mark_on_its_function() -> None:
    @check(
        "made up",
        needs=["cache.capacity"],
        sharper_with=["state.sides"],
        runs_on="gpu",
        witnessed=True,
        breaks_target=True,
    )
    def test_made_up() -> None: ...

    assert declaration_of(test_made_up) == Declaration(
        "made up", ("cache.capacity",), ("state.sides",), "gpu", True, True
    )
    [mark] = test_made_up.pytestmark  # type: ignore[attr-defined]
    assert mark.name == MARK
    assert declaration_of(lambda: None) is None
    assert Declaration("plain") == Declaration("plain", (), (), "graphs", False, False)

    @getattr(pytest.mark, MARK)("not a declaration")
    def test_mismarked() -> None: ...

    with pytest.raises(TypeError, match=rf"the {MARK} mark takes a Declaration, got str"):
        declaration_of(test_mismarked)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: Declaration("x", needs=("nothing",)),
            ValueError,
            "check 'x': 'nothing' is no capability or field of one",
        ),
        (
            lambda: Declaration("x", needs=("cache.nope",)),
            ValueError,
            "check 'x': 'cache.nope' is no capability or field of one",
        ),
        (
            lambda: Declaration("x", needs=("cache.capacity.more",)),
            ValueError,
            "check 'x': 'cache.capacity.more' is no capability or field of one",
        ),
        (
            lambda: Declaration("x", needs=(".capacity",)),
            ValueError,
            "check 'x': '.capacity' is no capability or field of one",
        ),
        (
            lambda: Declaration("x", sharper_with=("state.episode",)),
            ValueError,
            "check 'x': 'state.episode' is no capability or field of one",
        ),
        (
            lambda: Declaration("x", sharper_with=("Cache",)),
            ValueError,
            "check 'x': 'Cache' is no capability or field of one",
        ),
        (
            lambda: Declaration("x", runs_on="tpu"),  # type: ignore[arg-type]
            ValueError,
            "check 'x': runs_on must be one of ('cpu', 'graphs', 'gpu')",
        ),
        (lambda: Declaration(""), TypeError, "a check's name must be a non-empty string, got ''"),
    ],
)
def test_a_declaration_names_only_capabilities_and_their_fields(
    make: Callable[[], object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as refused:
        make()
    assert str(refused.value) == message


def test_every_capability_and_each_of_its_fields_can_be_declared() -> None:
    slots = [kind.SLOT for kind in CAPABILITIES]
    fields = [
        f"{kind.SLOT}.{field.name}" for kind in CAPABILITIES for field in dataclasses.fields(kind)
    ]
    declaration = Declaration("all", needs=tuple(slots), sharper_with=tuple(fields))
    assert "cache.static" in declaration.sharper_with and "state.episode_calls" in fields


def test_the_needs_table_has_a_row_per_check_in_the_order_given() -> None:
    rows = needs_table(
        [
            Declaration("first", runs_on="cpu"),
            Declaration(
                "second",
                needs=("cache.capacity", "sampling"),
                sharper_with=("state.sides",),
                runs_on="gpu",
                witnessed=True,
            ),
            Declaration("third", sharper_with=("cache.static", "cache.reset")),
        ]
    )
    assert rows == [
        "| check | judges on | needs | sharper with | witnessed |",
        "| --- | --- | --- | --- | --- |",
        "| first | anything | - | - | no |",
        "| second | a GPU | `cache.capacity`, `sampling` | `state.sides` | yes |",
        "| third | CUDA graphs | - | `cache.static`, `cache.reset` | no |",
    ]
    assert needs_table([]) == rows[:2]


# The suite's own checks


def check_modules() -> list[ModuleType]:
    return [
        importlib.import_module(f"pytest_cudagraph.conformance.checks.{path.stem}")
        for path in sorted(CHECKS_FOLDER.glob("test_*.py"))
    ]


def check_functions(module: ModuleType) -> list[FunctionType]:
    """The test functions a module defines itself, in the order it defines them."""
    found = [
        value
        for name, value in vars(module).items()
        if name.startswith("test_")
        and inspect.isfunction(value)
        and value.__module__ == module.__name__
    ]
    return sorted(found, key=lambda function: function.__code__.co_firstlineno)


def test_declared_checks_lists_every_check_of_every_module_in_order() -> None:
    functions = [function for module in check_modules() for function in check_functions(module)]
    declarations = [declaration_of(function) for function in functions]
    assert None not in declarations, "every test function of the checks declares itself"
    assert declared_checks() == declarations
    names = [declaration.name for declaration in declared_checks()]
    assert len(set(names)) == len(names), "each check has a name of its own"


def test_the_suites_declarations_name_what_each_check_needs() -> None:
    checks = {row.name: row for row in declared_checks()}
    assert len(checks) == 29 and list(checks)[:2] == ["target contract", "dry run"]
    assert checks["bounded memory"].needs == ("cache.reset", "cache.capacity", "cache.largest_key")
    assert checks["identical sampling"].needs == ("sampling",)
    assert checks["capture clean forward"].needs == ("capture_clean",)
    assert set(checks["lock safety"].sharper_with) == {
        "cache.fault_points",
        "cache.reset",
        "cache.cached_keys",
        "cache.lock",
        "state.sides",  # the comparing checks keep a stateful target's sides in step
        "state.reset",
    }
    assert checks["capture does not advance state"].needs == ("state.sides",)
    assert checks["guards"].runs_on == "cpu" and checks["parity"].runs_on != "cpu"
    assert [name for name, row in checks.items() if row.breaks_target] == [
        "lock safety",
        "bounded memory",
        "memory over a long run",
    ]


# What each check reads of a target, found in its source and the module's functions it reaches:
# a capability's field (``cache.capacity``, ``target.cache.reset``, a parameter typed with the
# capability's class), the sides called in step (``Lockstep``: state.sides, and state.reset
# unless it keeps to one episode) or their states (``sides_of``).
CLASSES = {kind.__name__: kind.SLOT for kind in CAPABILITIES}
SLOTS = set(CLASSES.values())


def reached(start: ast.FunctionDef, functions: dict[str, ast.FunctionDef]) -> list[ast.FunctionDef]:
    seen = {start.name: start}
    todo = [start]
    while todo:
        names = {node.id for node in ast.walk(todo.pop()) if isinstance(node, ast.Name)}
        for name in sorted(names & functions.keys() - seen.keys()):
            seen[name] = functions[name]
            todo.append(functions[name])
    return list(seen.values())


def typed_parameters(function: ast.FunctionDef) -> dict[str, str]:
    """Parameter -> the slot of the capability class its annotation names."""
    typed = {}
    for argument in [*function.args.args, *function.args.kwonlyargs]:
        for node in ast.walk(argument.annotation or ast.Pass()):
            if isinstance(node, ast.Name) and node.id in CLASSES:
                typed[argument.arg] = CLASSES[node.id]
    return typed


def reads(function: ast.FunctionDef) -> set[str]:
    typed = typed_parameters(function)
    found: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "Lockstep":
                one_episode = any(
                    keyword.arg == "episodes" and ast.unparse(keyword.value) == "False"
                    for keyword in node.keywords
                )
                found |= {"state.sides"} if one_episode else {"state.sides", "state.reset"}
            elif node.func.id == "sides_of":
                found.add("state.sides")
        elif isinstance(node, ast.Attribute):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in typed:
                found.add(f"{typed[owner.id]}.{node.attr}")
            elif (
                isinstance(owner, ast.Attribute)
                and ast.unparse(owner.value) == "target"
                and owner.attr in SLOTS
            ):
                found.add(f"{owner.attr}.{node.attr}")
    return found


def undeclared_reads(source: str, declarations: dict[str, Declaration]) -> dict[str, list[str]]:
    """Check function -> what it reads of a target that its declaration does not name."""
    functions = {
        node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)
    }
    found = {}
    for name, declaration in declarations.items():
        read = set().union(*(reads(f) for f in reached(functions[name], functions)))
        named = {*declaration.needs, *declaration.sharper_with}
        missing = sorted(r for r in read if r not in named and r.split(".")[0] not in named)
        if missing:
            found[declaration.name] = missing
    return found


def test_each_declaration_names_what_its_check_reads_of_a_target() -> None:
    found: dict[str, list[str]] = {}
    for module in check_modules():
        assert module.__file__ is not None
        declarations = {f.__name__: declaration_of(f) for f in check_functions(module)}
        source = Path(module.__file__).read_text()
        found |= undeclared_reads(source, {n: d for n, d in declarations.items() if d})
    assert found == {}, "declare what the check reads in needs or sharper_with"


SAMPLE_CHECKS = """
def test_first(target, cache: Cache | None, conclude):
    helper(target)
    lockstep = Lockstep(target)
    return cache.capacity

def helper(target):
    return target.cache.reset, target.padding

def test_second(target, state: State):
    Lockstep(target, episodes=False)
    return state.sides, target.cache.static
"""


def test_what_a_check_reads_is_found_through_its_helpers_and_its_typed_fixtures() -> None:
    declarations = {
        "test_first": Declaration("first", needs=("cache.capacity",), sharper_with=("state",)),
        "test_second": Declaration("second", sharper_with=("state.sides", "cache.static")),
    }
    assert undeclared_reads(SAMPLE_CHECKS, declarations) == {"first": ["cache.reset"]}
    declarations["test_second"] = Declaration("second", needs=("state.sides",))
    assert undeclared_reads(SAMPLE_CHECKS, declarations) == {
        "first": ["cache.reset"],
        "second": ["cache.static"],
    }
    declarations["test_first"] = Declaration("first", needs=("cache",), sharper_with=("state",))
    declarations["test_second"] = Declaration("second", needs=("state.reset",))
    assert undeclared_reads(SAMPLE_CHECKS, declarations) == {
        "second": ["cache.static", "state.sides"]
    }


def test_the_own_graphs_page_shows_what_each_check_needs_as_the_declarations_say() -> None:
    page = (ROOT / "docs" / "own-graphs.md").read_text()
    table = needs_table(declared_checks())
    assert "\n".join(table) in page, "regenerate it: pytest-cudagraph checks"


# The suite reads the declarations at collection

UNDECLARED = """
import pytest_cudagraph.conformance.checks.test_07_guards as guards


def test_undeclared():
    pass


guards.test_undeclared = test_undeclared  # a test of the checks' folder that declares nothing
"""


@pytest.mark.slow
def test_a_test_in_the_checks_folder_without_a_declaration_is_a_usage_error(
    pytester: pytest.Pytester, run_suite: Callable[..., pytest.RunResult]
) -> None:
    pytester.makepyfile(undeclared_plugin=UNDECLARED)
    result = run_suite("--collect-only", "-q", "-p", "undeclared_plugin")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: checks/test_07_guards.py::test_undeclared declares nothing: every check of "
            "the suite is declared with @check(...) (pytest_cudagraph.conformance._catalog)"
        ]
    )


@pytest.mark.slow
def test_the_checks_that_judge_without_cuda_are_those_declared_to(
    run_suite: Callable[..., pytest.RunResult],
) -> None:
    """Without CUDA the checks declared to judge anything run; with graphs emulated, those that
    judge CUDA graphs too; those that need a GPU itself carry the ``cuda`` marker either way."""
    by_function = {
        function.__name__: declaration_of(function)
        for module in check_modules()
        for function in check_functions(module)
    }
    for emulate, judged_on in (("off", {"cpu"}), ("on", {"cpu", "graphs"})):
        result = run_suite(
            "--collect-only", "-q", "-m", "not cuda", f"--cudagraph-emulate={emulate}"
        )
        assert result.ret == pytest.ExitCode.OK
        collected = [line.split("::")[1] for line in result.stdout.lines if "::" in line]
        assert collected == [
            name
            for name, declaration in by_function.items()
            if declaration is not None and declaration.runs_on in judged_on
        ]
        assert len(collected) == (4 if emulate == "off" else 24)
