"""scripts/mutants.py: its mutants still match the code, and its runner tells killed from
survived on a tiny tree made here (CPU, runs in CI; the full run is the lint env's)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from script_modules import script_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mutants():
    with script_module("mutants") as module:
        yield module


def test_every_mutant_matches_its_file_once_and_names_tests_that_exist(mutants):
    names = [mutant.name for mutant in mutants.MUTANTS]
    assert len(names) == len(set(names)), "two mutants share a name"
    for mutant in mutants.MUTANTS:
        source = (ROOT / mutant.path).read_text()
        assert mutant.apply(source) != source, mutant.name
        assert mutant.tests, mutant.name
        for test in mutant.tests:
            assert (ROOT / test.split("::")[0]).exists(), (mutant.name, test)


def test_a_snippet_that_no_longer_matches_is_an_error(mutants):
    mutant = mutants.Mutant("gone", "x.py", "old", "new", ("t.py",))
    with pytest.raises(ValueError, match=r"gone: its snippet occurs 0 times in x\.py"):
        mutant.apply("nothing here")
    with pytest.raises(ValueError, match="occurs 2 times"):
        mutant.apply("old old")


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
            mutants.Mutant("add subtracts", "calc.py", "return a + b", "return a - b", ("test_calc.py",)),
            mutants.Mutant("sub adds", "calc.py", "return a - b", "return a + b", ("test_calc.py",)),
            mutants.Mutant("stale", "calc.py", "return a * b", "return a", ("test_calc.py",)),
        ],
        root=tree,
        jobs=2,
    )  # fmt: skip
    assert [(o.mutant.name, o.verdict) for o in found] == [
        ("add subtracts", "killed"),
        ("sub adds", "survived"),
        ("stale", "error"),
    ]
    assert (tree / "calc.py").read_text().count("return a + b") == 1, "the tree itself is untouched"
    lines, all_killed = mutants.summary(found)
    assert not all_killed
    assert lines[-1] == "1 of 3 mutants killed (33.3%)"
    assert lines[1].startswith("survived") and lines[1].endswith("calc.py: sub adds")


def test_tests_that_fail_unchanged_kill_nothing(mutants, tmp_path):
    tree = tiny_tree(tmp_path, "def test_broken():\n    assert False\n")
    mutant = mutants.Mutant(
        "add subtracts", "calc.py", "return a + b", "return a - b", ("test_calc.py",)
    )
    [outcome] = mutants.run([mutant], root=tree, jobs=1)
    assert outcome.verdict == "error"
    assert outcome.detail.startswith("the tests fail without any mutant")


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
    assert len(lines) == len(mutants.MUTANTS)
    first = mutants.MUTANTS[0]
    assert lines[0] == f"{first.path}: {first.name} -> {' '.join(first.tests)}"


def test_an_equivalent_mutant_is_matched_but_not_run_nor_scored(mutants, tmp_path):
    tree = tiny_tree(tmp_path, "def test_broken():\n    assert False\n")
    same = mutants.Mutant(
        "same", "calc.py", "return a + b", "return b + a", ("test_calc.py",), "a + b is b + a"
    )
    stale = mutants.Mutant(
        "stale same", "calc.py", "return a * b", "return b * a", ("test_calc.py",), "commutes"
    )
    found = mutants.run([same, stale], root=tree, jobs=1)
    assert [(o.mutant.name, o.verdict, o.detail) for o in found] == [
        ("same", "equivalent", "a + b is b + a"),
        ("stale same", "error", "stale same: its snippet occurs 0 times in calc.py"),
    ], "the failing test never ran: equivalent mutants select no tests"
    lines, all_killed = mutants.summary(found)
    assert not all_killed, "a stale equivalent mutant still fails the run"
    assert lines[-1] == "0 of 1 mutants killed (0.0%); 1 equivalent, not run"


def test_equivalents_leave_the_denominator(mutants):
    def outcome(verdict):
        mutant = mutants.Mutant(verdict, "x.py", "a", "b", ("t.py",))
        return mutants.Outcome(mutant, verdict, 0.0)

    lines, all_killed = mutants.summary([outcome("killed"), outcome("equivalent")])
    assert all_killed
    assert lines[-1] == "1 of 1 mutants killed (100.0%); 1 equivalent, not run"
