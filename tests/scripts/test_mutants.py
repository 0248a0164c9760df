"""scripts/mutants.py: every mutant of its table still matches its function once and names tests
that exist; a mutant follows its function wherever it moves and fails naming it when its rule is
gone; the runner tells killed from survived on a tiny tree made here (CPU, runs in CI; the full
run is the lint env's)."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from script_modules import script_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mutants():
    with script_module("mutants") as module:
        yield module


@functools.cache
def defined_tests(path: Path) -> set[str]:
    """The test functions of a test file, as node ids name them after the file."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{item.name}" for item in node.body if hasattr(item, "name")}
    return names


def test_every_mutant_matches_its_function_once_and_names_tests_that_exist(mutants):
    table = mutants.load()
    names = [mutant.name for mutant in table]
    assert len(names) == len(set(names)), "two mutants share a name"
    for mutant in table:
        source = (ROOT / mutant.path).read_text()
        assert mutant.apply(source) != source, mutant.name  # ValueError when stale
        assert mutant.tests, mutant.name
        for test in mutant.tests:
            file, _, name = test.partition("::")
            assert (ROOT / file).is_file(), (mutant.name, test)
            assert name.split("[")[0] in defined_tests(ROOT / file), (mutant.name, test)


SOURCE = """\
import functools


def add(a, b):
    return a + b


class Calculator:
    @functools.cache
    def add(self, a, b):
        def inner():
            return a + b

        return inner()


LIMIT = 10
"""


def mutant_of(mutants, where: str, pattern: str = "a + b", new: str = "a - b"):
    return mutants.Mutant("add subtracts", where, pattern, new, ("test_calc.py",))


def test_a_mutant_applies_only_inside_its_function(mutants):
    mutated = mutant_of(mutants, "calc.py::add").apply(SOURCE)
    assert mutated == SOURCE.replace("return a + b", "return a - b", 1)
    inner = mutant_of(mutants, "calc.py::Calculator.add.inner").apply(SOURCE)
    assert inner.count("a - b") == 1 and inner.index("a - b") > SOURCE.index("class")
    limit = mutant_of(mutants, "calc.py::LIMIT", "10", "11").apply(SOURCE)
    assert limit.endswith("LIMIT = 11\n")
    cached = mutant_of(mutants, "calc.py::Calculator.add", "@functools.cache", "")
    assert "cache" not in cached.apply(SOURCE).split("class")[1], "decorators are the function's"


def test_a_rule_kept_through_a_move_or_a_reformat_keeps_its_mutant(mutants):
    mutant = mutant_of(mutants, "other.py::add")
    moved = "import os\n\n\ndef add(a, b):\n    return (\n        a\n        + b\n    )\n"
    assert mutant.apply(moved).endswith("def add(a, b):\n    return (\n        a - b\n    )\n")


def test_later_lines_of_the_new_code_are_indented_as_the_pattern_is(mutants):
    mutant = mutant_of(
        mutants, "calc.py::Calculator.add.inner", "return a + b", "if a:\n    return a\nreturn b"
    )
    mutated = mutant.apply(SOURCE)
    assert "            if a:\n                return a\n            return b\n" in mutated


@pytest.mark.parametrize(
    ("where", "pattern", "new", "problem"),
    [
        ("calc.py::sub", "a + b", "a - b", "gone: calc.py has no sub"),
        ("calc.py::Calculator.sub", "a + b", "a - b", "gone: calc.py has no Calculator.sub"),
        ("calc.py::add", "a * b", "a", "gone: 'a * b' occurs 0 times in calc.py::add, not once"),
        (
            "calc.py::Calculator.add",
            "return",
            "",
            "gone: 'return' occurs 2 times in calc.py::Calculator.add",
        ),
        ("calc.py::add", "a + b", "a +", "gone: the mutated calc.py does not parse"),
    ],
)
def test_a_mutant_whose_rule_is_gone_fails_naming_its_function_and_pattern(
    mutants, where, pattern, new, problem
):
    with pytest.raises(ValueError) as stale:
        mutants.Mutant("gone", where, pattern, new, ("t.py",)).apply(SOURCE)
    assert str(stale.value).startswith(problem)


def test_a_table_entry_missing_a_field_is_named(mutants, tmp_path):
    table = tmp_path / "mutants.toml"
    table.write_text("[\"calc.py::add\".\"add subtracts\"]\npattern = 'a + b'\nnew = 'a - b'\n")
    with pytest.raises(
        ValueError, match=r"calc.py::add 'add subtracts' has the fields \['new', 'pattern'\]"
    ):
        mutants.load(table)


def tiny_tree(root: Path, test_body: str) -> Path:
    (root / "calc.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
    )
    (root / "test_calc.py").write_text(textwrap.dedent(test_body))
    (root / "__pycache__").mkdir()  # never copied: a stale bytecode file must not stand in
    return root


def test_the_runner_tells_killed_survived_and_stale_mutants_apart(mutants, tmp_path):
    tree = tiny_tree(
        tmp_path, "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    found = mutants.run(
        [
            mutants.Mutant("add subtracts", "calc.py::add", "a + b", "a - b", ("test_calc.py",)),
            mutants.Mutant("sub adds", "calc.py::sub", "a - b", "a + b", ("test_calc.py",)),
            mutants.Mutant("stale", "calc.py::add", "a * b", "a", ("test_calc.py",)),
            mutants.Mutant("moved", "gone.py::add", "a + b", "a", ("test_calc.py",)),
        ],
        root=tree,
        jobs=2,
        preload=(),
    )  # fmt: skip
    assert [(o.mutant.name, o.verdict) for o in found] == [
        ("add subtracts", "killed"),
        ("sub adds", "survived"),
        ("stale", "error"),
        ("moved", "error"),
    ]
    assert found[3].detail == "moved: there is no file gone.py"
    assert (tree / "calc.py").read_text().count("return a + b") == 1, "the tree itself is untouched"
    lines, all_killed = mutants.summary(found)
    assert not all_killed
    assert lines[-1] == "1 of 4 mutants killed (25.0%)"
    assert lines[1].startswith("survived") and lines[1].endswith("calc.py::sub: sub adds")


def test_tests_that_fail_unchanged_kill_nothing(mutants, tmp_path):
    tree = tiny_tree(tmp_path, "def test_broken():\n    assert False\n")
    mutant = mutants.Mutant("add subtracts", "calc.py::add", "a + b", "a - b", ("test_calc.py",))
    [outcome] = mutants.run([mutant], root=tree, jobs=1, preload=())
    assert outcome.verdict == "error"
    assert outcome.detail.startswith("the tests fail without any mutant")


def test_a_run_past_the_timeout_is_ended_with_its_processes(mutants, monkeypatch):
    monkeypatch.setattr(mutants, "TIMEOUT_S", 0.2)
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    assert mutants.waited(sleeper.pid) is None
    with pytest.raises(ChildProcessError):
        os.waitpid(sleeper.pid, 0)  # ended and reaped
    sleeper.wait()


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--jobs", "0"], "--jobs must be at least 1"), (["--only", "nope"], "no mutant named nope")],
)
def test_bad_arguments_are_refused_before_any_work(mutants, capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        mutants.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_list_names_each_mutant_and_its_tests(mutants, capsys):
    assert mutants.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = mutants.load()
    assert len(lines) == len(table)
    first = table[0]
    assert lines[0] == f"{first.where}: {first.name} -> {' '.join(first.tests)}"


def test_an_equivalent_mutant_is_matched_but_not_run_nor_scored(mutants, tmp_path):
    tree = tiny_tree(tmp_path, "def test_broken():\n    assert False\n")
    same = mutants.Mutant(
        "same", "calc.py::add", "a + b", "b + a", ("test_calc.py",), "a + b is b + a"
    )
    stale = mutants.Mutant(
        "stale same", "calc.py::add", "a * b", "b * a", ("test_calc.py",), "commutes"
    )
    found = mutants.run([same, stale], root=tree, jobs=1, preload=())
    assert [(o.mutant.name, o.verdict, o.detail) for o in found] == [
        ("same", "equivalent", "a + b is b + a"),
        ("stale same", "error", "stale same: 'a * b' occurs 0 times in calc.py::add, not once"),
    ], "the failing test never ran: equivalent mutants select no tests"
    lines, all_killed = mutants.summary(found)
    assert not all_killed, "a stale equivalent mutant still fails the run"
    assert lines[-1] == "0 of 1 mutants killed (0.0%); 1 equivalent, not run"


def test_equivalents_leave_the_denominator(mutants):
    def outcome(verdict):
        mutant = mutants.Mutant(verdict, "x.py::f", "a", "b", ("t.py",))
        return mutants.Outcome(mutant, verdict, 0.0)

    lines, all_killed = mutants.summary([outcome("killed"), outcome("equivalent")])
    assert all_killed
    assert lines[-1] == "1 of 1 mutants killed (100.0%); 1 equivalent, not run"
