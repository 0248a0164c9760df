"""pinned_stack: spec parsing, matching against a simulated stack, the skip it causes, and the
header line that counts what runs."""

from __future__ import annotations

import platform

import pytest
import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from pytest_cudagraph import settings
from pytest_cudagraph.engines import stack
from pytest_cudagraph.markers.pinned_stack import NOTHING_PINNED, pinned_stack

# A pin of every component: upstream ReaSyn's stack.
UPSTREAM = stack.parse_pinned_stack(["python~=3.10.0", "torch~=2.7.0", "cuda~=11.8"])


def test_a_pin_names_each_component_with_its_specifiers() -> None:
    assert UPSTREAM == {
        "python": SpecifierSet("~=3.10.0"),
        "torch": SpecifierSet("~=2.7.0"),
        "cuda": SpecifierSet("~=11.8"),
    }


def test_nothing_is_pinned_by_default(pytester: pytest.Pytester) -> None:
    assert stack.DEFAULT_PINNED_STACK == ()
    config = pytester.parseconfigure()
    assert settings.snapshot(config).value(settings.PINNED_STACK) == {}


def test_upstream_stack_matches() -> None:
    assert stack.mismatches(UPSTREAM, stack.RunningStack("3.10.14", "2.7.1", "11.8")) == []


def test_every_mismatch_is_listed_and_a_cpu_build_has_cuda_none() -> None:
    running = stack.RunningStack("3.11.7", "2.13.0", None)
    found = stack.mismatches(UPSTREAM, running)
    assert stack.skip_reason(found) == (
        "pinned stack not running: python 3.11.7 not ~=3.10.0; torch 2.13.0 not ~=2.7.0; "
        "cuda none not ~=11.8"
    )


@pytest.mark.parametrize(
    ("running", "mismatch"),
    [
        (stack.RunningStack("3.10.14", "2.8.0", "11.8"), "torch 2.8.0 not ~=2.7.0"),
        (stack.RunningStack("3.10.14", "2.7.1", "12.6"), "cuda 12.6 not ~=11.8"),
        (stack.RunningStack("3.12.1", "2.7.1", "11.8"), "python 3.12.1 not ~=3.10.0"),
    ],
)
def test_a_single_component_off_the_pin(running: stack.RunningStack, mismatch: str) -> None:
    assert stack.mismatches(UPSTREAM, running) == [mismatch]


def test_running_stack_drops_the_local_suffix_of_torch() -> None:
    running = stack.running_stack()
    assert running.python == platform.python_version()
    assert running.torch == Version(torch.__version__).public
    assert "+" not in running.torch
    assert running.cuda == torch.version.cuda


def test_entries_may_use_several_specifiers_and_leave_components_unpinned() -> None:
    pinned = stack.parse_pinned_stack(["torch>=2.7,<2.9", "python ==3.11.*"])
    assert set(pinned) == {"torch", "python"}
    assert stack.mismatches(pinned, stack.RunningStack("3.11.7", "2.8.0", None)) == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("numpy>=1", "unknown component 'numpy'"),
        ("torch", "torch needs PEP 440 specifiers"),
        ("torch=2.7", "torch: '=2.7' is not a PEP 440 specifier set"),
        ("~=2.7", "cannot read pinned-stack entry '~=2.7'"),
    ],
)
def test_bad_entries_are_rejected(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stack.parse_pinned_stack([entry])


def test_marker_keywords_override_the_ini_per_component() -> None:
    assert pinned_stack(torch=">=2.0") == {"torch": SpecifierSet(">=2.0")}


def test_a_component_pinned_twice_is_an_error() -> None:
    with pytest.raises(
        ValueError, match=r"component 'torch' is pinned twice \(torch~=2.7.0 and torch>=2\)"
    ):
        stack.parse_pinned_stack(["torch~=2.7.0", "python~=3.10", "torch>=2"])


def test_a_component_pinned_twice_in_the_ini_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncudagraph_pinned_stack = torch~=2.7.0 torch>=2")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: ini cudagraph_pinned_stack=*component 'torch' is pinned twice*"]
    )


# The running stack here is whatever the venv has, so these runs pin to specifiers that
# the running Python either always or never satisfies.
PINNED_TEST = """
import pytest

@pytest.mark.pinned_stack{arguments}
def test_pinned():
    pass
"""


def test_off_stack_test_skips_with_every_mismatch(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncudagraph_pinned_stack = python<3 torch<1")
    pytester.makepyfile(PINNED_TEST.format(arguments=""))
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    running = stack.running_stack()
    result.stdout.fnmatch_lines(
        [
            f"SKIPPED [[]1[]] test_*.py:*: pinned stack not running: python {running.python} "
            f"not <3; torch {running.torch} not <1"
        ]
    )


def test_on_stack_test_runs(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncudagraph_pinned_stack = python>=3 torch>=1")
    pytester.makepyfile(PINNED_TEST.format(arguments=""))
    pytester.runpytest_inprocess().assert_outcomes(passed=1)


def test_marker_override_beats_the_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncudagraph_pinned_stack = python<3")
    pytester.makepyfile(PINNED_TEST.format(arguments="(python='>=3')"))
    pytester.runpytest_inprocess().assert_outcomes(passed=1)


def test_pin_in_pyproject_as_a_list(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml(
        '[tool.pytest.ini_options]\ncudagraph_pinned_stack = ["python>=3", "torch<1"]'
    )
    pytester.makepyfile(PINNED_TEST.format(arguments=""))
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*pinned stack not running: torch * not <1"])


@pytest.mark.parametrize(
    "how", [["--cudagraph-stack=any"], ["env"], ["ini"]], ids=["option", "env", "ini"]
)
def test_stack_any_runs_off_stack_tests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: list[str]
) -> None:
    ini = "[pytest]\ncudagraph_pinned_stack = python<3\n"
    if how == ["ini"]:
        ini += "cudagraph_stack = any\n"
    if how == ["env"]:
        monkeypatch.setenv("PYTEST_CUDAGRAPH_STACK", "any")
    pytester.makeini(ini)
    pytester.makepyfile(PINNED_TEST.format(arguments=""))
    args = how if how[0].startswith("--") else []
    pytester.runpytest_inprocess(*args).assert_outcomes(passed=1)


def test_bad_pin_in_ini_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ncudagraph_pinned_stack = torch=2.7")
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: ini cudagraph_pinned_stack=*: torch: '=2.7' is not a PEP 440 specifier set"]
    )


def test_a_bare_marker_with_nothing_pinned_skips_saying_how_to_pin(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(PINNED_TEST.format(arguments=""))
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=1)
    assert NOTHING_PINNED.startswith("pinned_stack: no pinned stack is configured; name it in ")
    result.stdout.fnmatch_lines([f"SKIPPED [[]1[]] test_*.py:*: {NOTHING_PINNED}"])
    result.stdout.fnmatch_lines(
        ["cudagraph: 1 pinned_stack test(s), but no pinned stack is configured (*), so they skip"]
    )


def test_a_marker_with_its_own_pin_needs_nothing_configured(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(PINNED_TEST.format(arguments="(python='>=3')"))
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "cudagraph: 1 pinned_stack test(s), but no pinned stack is configured (*), so they "
            "run (1 with a pin of their own)"
        ]
    )


# Two tests: one with the session's pin, one with a pin of its own for Python.
BARE_AND_OWN_PIN = """
import pytest

@pytest.mark.pinned_stack
def test_session_pin():
    pass

@pytest.mark.pinned_stack(python="{own}")
def test_own_pin():
    pass
"""


@pytest.mark.parametrize(
    ("session_pin", "own_pin", "outcomes", "header"),
    [
        (
            "python<3",
            ">=3",
            {"passed": 1, "skipped": 1},
            "are meant for python<3; this is not it (python * not <3), so 1 run and 1 skip "
            "(1 with a pin of their own)",
        ),
        (
            "python>=3",
            "<3",
            {"passed": 1, "skipped": 1},
            "are meant for python>=3; this is it, so 1 run and 1 skip (1 with a pin of their own)",
        ),
        (
            "python>=3",
            ">=3",
            {"passed": 2},
            "are meant for python>=3; this is it, so they run (1 with a pin of their own)",
        ),
        (
            "python<3",
            "<2",
            {"skipped": 2},
            "are meant for python<3; this is not it (*), so they skip (1 with a pin of their own)",
        ),
    ],
    ids=["own pin runs off stack", "own pin skips on stack", "all run", "all skip"],
)
def test_the_header_counts_what_runs_and_what_skips(
    pytester: pytest.Pytester,
    session_pin: str,
    own_pin: str,
    outcomes: dict[str, int],
    header: str,
) -> None:
    pytester.makeini(f"[pytest]\ncudagraph_pinned_stack = {session_pin}")
    pytester.makepyfile(BARE_AND_OWN_PIN.format(own=own_pin))
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(**outcomes)
    result.stdout.fnmatch_lines([f"cudagraph: 2 pinned_stack test(s) {header}"])


def test_with_stack_any_the_header_says_they_run_anyway(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(BARE_AND_OWN_PIN.format(own="<3"))
    result = pytester.runpytest_inprocess("--cudagraph-stack=any")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "cudagraph: 2 pinned_stack test(s), but no pinned stack is configured (*); they run "
            "anyway (--cudagraph-stack any)"
        ]
    )


@pytest.mark.parametrize("pin", ["~=2.7.0", "~=2.7", ">=2.7", "==2.7.*", ">=2.6,<2.8"])
def test_a_pre_release_torch_matches_a_pin_its_release_matches(
    pin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NGC's containers ship torch as 2.x.0a0+<commit>: the release it becomes is 2.x.0."""
    monkeypatch.setattr(torch, "__version__", "2.7.0a0+79aa17489c.nv25.4")
    running = stack.running_stack()
    assert running.torch == "2.7.0a0"
    assert stack.mismatches({"torch": SpecifierSet(pin)}, running) == []
    assert stack.mismatches({"torch": SpecifierSet("~=2.8.0")}, running) == [
        "torch 2.7.0a0 not ~=2.8.0"
    ]
    assert stack.mismatches({"torch": SpecifierSet("==2.7.0a0")}, running) == []
