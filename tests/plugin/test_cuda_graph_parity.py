"""The graph_parity fixture and the cuda_graph_parity marker around the parity engine
(cuda_device is the CPU in these runs; the engine's own rules are in tests/engines)."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from pytest_cudagraph import settings


def test_failing_check_fails_the_test_with_reason_and_section(
    cpu_pytester: pytest.Pytester,
) -> None:
    cpu_pytester.makepyfile(
        """
        import torch

        def inputs(generator, case):
            return {"tokens": torch.randn(2, 8, generator=generator)}

        def eager(tokens):
            return torch.tanh(tokens)

        def test_differs(graph_parity):
            graph_parity.check(eager, lambda tokens: eager(tokens) * 1.5, inputs, cases=3)

        def test_matches(graph_parity):
            result = graph_parity.check(eager, lambda tokens: tokens.tanh(), inputs, cases=3)
            assert result.passed == 3
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_differs _*",
            "cuda_graph_parity: case 0 of 3 differs: output at index (0, 0): eager *, graphed * "
            "(|diff| *, rel 0.5; tolerance exact); 16 of 16 elements differ, largest |diff| *; "
            "input shapes: tokens (2, 8); seed 0; 3 of 3 cases differ; rerun: pytest "
            "test_failing_check_fails_the_test_with_reason_and_section.py::test_differs "
            "--cudagraph-seed=0 --cudagraph-case=0",
            "*- cudagraph parity -*",
            "case 0 of 3, seed 0 (input shapes: tokens (2, 8)):",
            "    rerun: pytest *::test_differs --cudagraph-seed=0 --cudagraph-case=0",
            "case 2 of 3, seed 2 (input shapes: tokens (2, 8)):",
            "0 of 3 match",
            "*= cudagraph =*",
            "parity: 3 of 6 checked cases match",
            "  test_*.py::test_differs: 0 of 3 cases match",
            "  test_*.py::test_matches: 3 of 3 cases match",
        ]
    )


def test_one_case_of_four_differing_fails_the_test_naming_it(
    cpu_pytester: pytest.Pytester,
) -> None:
    cpu_pytester.makepyfile(
        """
        import pytest
        import torch

        def inputs(generator, case):
            return torch.full((3,), float(case))

        def graphed(x):
            return x * 2 + (x[0] == 2).float()  # case 2 alone is off by one

        @pytest.mark.cuda_graph_parity
        def test_one_differs(graph_parity):
            graph_parity.check(lambda x: x * 2, graphed, inputs, cases=4)
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "cuda_graph_parity: case 2 of 4 differs: output at index (0,): eager 4, graphed 5 *",
            "  test_*.py::test_one_differs: 3 of 4 cases match",
        ]
    )
    assert "cases differ" not in result.stdout.str()  # one case only


SWALLOWED = """
import concurrent.futures
import threading

import pytest
import torch


def inputs(generator, case):
    return torch.randn(3, generator=generator)


def wrong(x):
    return x * 3


@pytest.mark.cuda_graph_parity
def test_bare_except(graph_parity):
    try:
        graph_parity.check(lambda x: x * 2, wrong, inputs, cases=2)
    except BaseException:
        pass


@pytest.mark.cuda_graph_parity
def test_retry_after_failure(graph_parity):
    for graphed in (wrong, lambda x: x * 2):
        try:
            graph_parity.check(lambda x: x * 2, graphed, inputs, cases=2)
            break
        except BaseException:
            continue


@pytest.mark.cuda_graph_parity
def test_in_a_thread(graph_parity):
    worker = threading.Thread(
        target=graph_parity.check, args=(lambda x: x * 2, wrong, inputs, 2)
    )
    worker.start()
    worker.join()


@pytest.mark.cuda_graph_parity
def test_future_never_read(graph_parity):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(graph_parity.check, lambda x: x * 2, wrong, inputs, 2)


def test_unmarked_fixture_swallowed(graph_parity):
    try:
        graph_parity.check(lambda x: x * 2, wrong, inputs, cases=2)
    except BaseException:
        pass


@pytest.mark.cuda_graph_parity
def test_passing_retry_only(graph_parity):
    graph_parity.check(lambda x: x * 2, lambda x: x + x, inputs, cases=2)
"""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failing_check_fails_its_test_whatever_the_body_did(
    cpu_pytester: pytest.Pytester,
) -> None:
    cpu_pytester.makepyfile(SWALLOWED)
    result = cpu_pytester.runpytest_inprocess("-p", "no:threadexception")
    result.assert_outcomes(passed=1, failed=5)
    for test in ("bare_except", "retry_after_failure", "in_a_thread", "future_never_read"):
        result.stdout.fnmatch_lines(
            [
                f"cuda_graph_parity on test_*.py::test_{test}: the body went on after a failing "
                "check (*), and a failing check fails its test: cuda_graph_parity: case 0 of 2 "
                "differs: *"
            ]
        )
    result.stdout.fnmatch_lines(
        [
            "cuda_graph_parity on test_*.py::test_unmarked_fixture_swallowed: the body went on *",
            "  test_*.py::test_retry_after_failure: 2 of 4 cases match",
        ]
    )


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_check_still_running_when_the_body_returns_fails_the_test(
    cpu_pytester: pytest.Pytester,
) -> None:
    cpu_pytester.makepyfile(
        """
        import threading

        import pytest
        import torch

        RELEASE = threading.Event()

        def slow(x):
            RELEASE.wait(10)
            return x * 2

        @pytest.mark.cuda_graph_parity
        def test_not_waited_for(graph_parity):
            started = threading.Event()

            def graphed(x):
                started.set()
                return slow(x)

            threading.Thread(
                target=graph_parity.check,
                args=(lambda x: x * 2, graphed, lambda g, c: torch.ones(2), 1),
                daemon=True,
            ).start()
            started.wait(10)

        def test_release():
            RELEASE.set()
        """
    )
    result = cpu_pytester.runpytest_inprocess("-p", "no:threadexception")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*cuda_graph_parity on test_*.py::test_not_waited_for: a graph_parity check was still "
            "running when the test body returned (in a thread it did not wait for)*"
        ]
    )


def test_the_rerun_command_runs_just_the_failing_case(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import torch

        SEEN = []

        def inputs(generator, case):
            SEEN.append(case)
            return torch.full((2,), float(case))

        def test_cases(graph_parity):
            graph_parity.check(lambda x: x * 2, lambda x: x * 2 + (x[0] == 3), inputs, cases=5)

        def test_seen():
            print("seen", sorted(set(SEEN)))
        """
    )
    first = cpu_pytester.runpytest_inprocess("-s", "--cudagraph-seed=7")
    first.assert_outcomes(passed=1, failed=1)
    [reason] = [line for line in first.stdout.lines if line.startswith("cuda_graph_parity: case")]
    command = reason.split("; rerun: ")[1]
    assert command == (
        "pytest test_the_rerun_command_runs_just_the_failing_case.py::test_cases "
        "--cudagraph-seed=7 --cudagraph-case=3"
    )
    again = cpu_pytester.runpytest_inprocess("-s", *shlex.split(command)[1:], "-k", "cases or seen")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["cuda_graph_parity: case 3 of 5 differs: *; seed 10; rerun: *"])
    alone = cpu_pytester.runpytest_inprocess("-s", "--cudagraph-case=3")
    alone.stdout.fnmatch_lines(["*seen [[]3[]]*"])


def test_a_case_no_check_has_is_a_clear_failure(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        def test_two_cases(graph_parity):
            graph_parity.check(abs, abs, lambda generator, case: -1.5, cases=2)
        """
    )
    result = cpu_pytester.runpytest_inprocess("--cudagraph-case=4")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*ValueError: only_case 4 names no case of this check, which has cases 0 to 1"]
    )


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_a_bad_case_setting_is_a_usage_error(cpu_pytester: pytest.Pytester, value: str) -> None:
    result = cpu_pytester.runpytest_inprocess(f"--cudagraph-case={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --cudagraph-case='{value}': case must be *"])


def test_the_json_results_hold_each_failing_case(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import torch

        def test_cases(graph_parity):
            graph_parity.check(
                lambda x: x * 2, lambda x: x * 2 + (x[0] == 1.5), lambda g, c: torch.full((2,), c + 0.5),
                cases=3, atol=0.25,
            )
        """
    )
    cpu_pytester.runpytest_inprocess("--cudagraph-json=out.json", "--cudagraph-seed=3")
    [parity] = json.loads((cpu_pytester.path / "out.json").read_text())["parity"]
    assert {key: parity[key] for key in ("form", "checked", "passed")} == {
        "form": "cases",
        "checked": 3,
        "passed": 2,
    }
    assert parity["failures"] == [
        {
            "title": "case 1 of 3",
            "mismatches": [
                {
                    "path": "output",
                    "detail": "",
                    "first_index": [0],
                    "eager": 3.0,
                    "graphed": 4.0,
                    "abs_diff": 1.0,
                    "rel_diff": pytest.approx(1 / 3),
                    "tolerance": {"atol": 0.25, "rtol": 0.0},
                    "seed": 4,
                }
            ],
        }
    ]


def test_toggle_marker_runs_the_body_twice_and_compares(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import os
        import pytest
        import torch

        RUNS = []

        @pytest.fixture
        def shared():
            return []

        @pytest.mark.cuda_graph_parity(toggle="DEMO_GRAPHS", seed=5)
        def test_same(graph_parity, shared):
            shared.append(os.environ["DEMO_GRAPHS"])
            RUNS.append(list(shared))
            graph_parity.record("noise", torch.randn(3))

        @pytest.mark.cuda_graph_parity(toggle="DEMO_GRAPHS")
        def test_differs(graph_parity):
            graph_parity.record("mode", int(os.environ["DEMO_GRAPHS"]))

        def test_after():
            assert RUNS == [["0"], ["0", "1"]]
            assert "DEMO_GRAPHS" not in os.environ
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "cuda_graph_parity: runs with DEMO_GRAPHS=0 and =1 differ: recorded['mode'][0]: "
            "0 in DEMO_GRAPHS=0, 1 in DEMO_GRAPHS=1 (|diff| 1, rel inf; tolerance exact); seed 0; "
            "rerun: pytest test_toggle_marker_runs_the_body_twice_and_compares.py::test_differs "
            "--cudagraph-seed=0",
            "*= cudagraph =*",
            "  test_*.py::test_same: 1 of 1 toggled run pairs match",
            "  test_*.py::test_differs: 0 of 1 toggled run pairs match",
        ]
    )


SEED_TEST = """
import pytest

@pytest.mark.cuda_graph_parity{arguments}
def test_seed(graph_parity):
    print("seed", graph_parity.seed)
    graph_parity.check(abs, abs, lambda generator, case: -1.5, cases=1)
"""


@pytest.mark.parametrize(
    ("arguments", "env", "option", "ini", "expected"),
    [
        ("", None, None, None, 0),
        ("", None, None, "4", 4),
        ("", "3", None, "4", 3),
        ("", "3", "2", "4", 2),
        ("(seed=1)", "3", "2", "4", 1),
    ],
    ids=["default", "ini", "env-over-ini", "option-over-env", "marker-over-option"],
)
def test_seed_precedence_is_marker_option_env_ini(
    cpu_pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    arguments: str,
    env: str | None,
    option: str | None,
    ini: str | None,
    expected: int,
) -> None:
    if ini is not None:
        cpu_pytester.makeini(f"[pytest]\ncudagraph_seed = {ini}")
    if env is not None:
        monkeypatch.setenv("PYTEST_CUDAGRAPH_SEED", env)
    cpu_pytester.makepyfile(SEED_TEST.format(arguments=arguments))
    args = ["-s"] + ([f"--cudagraph-seed={option}"] if option else [])
    result = cpu_pytester.runpytest_inprocess(*args)
    result.stdout.fnmatch_lines([f"*seed {expected}*"])


@pytest.mark.skipif(not settings.TYPED_INI, reason="native TOML numbers need pytest >= 9.2")
def test_seed_as_a_native_toml_integer(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyprojecttoml("[tool.pytest]\ncudagraph_seed = 7\n")
    cpu_pytester.makepyfile(SEED_TEST.format(arguments=""))
    result = cpu_pytester.runpytest_inprocess("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*seed 7*"])


def test_a_marked_test_that_compares_nothing_fails_saying_so(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cuda_graph_parity
        def test_forgot(graph_parity):
            pass

        @pytest.mark.cuda_graph_parity(toggle="DEMO_GRAPHS")
        def test_records_nothing(graph_parity):
            pass
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["*cuda_graph_parity on test_*.py::test_forgot: the test compared nothing; call *"]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip where CUDA is absent")
def test_marker_skips_without_cuda(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cuda_graph_parity
        def test_check(graph_parity):
            pass

        @pytest.mark.cuda_graph_parity(toggle="DEMO")
        def test_toggle():
            raise AssertionError("must not run")
        """
    )
    result = pytester.runpytest_inprocess("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [
            "skips by reason:",
            "  2 x needs CUDA: torch.cuda.is_available() is False",
            "SKIPPED [[]1[]] test_*.py:*: needs CUDA: torch.cuda.is_available() is False",
            "SKIPPED [[]1[]] test_*.py:*: needs CUDA: torch.cuda.is_available() is False",
        ]
    )


@pytest.mark.parametrize("toggle", [" REASYN_CUDAGRAPH", "REASYN_CUDAGRAPH\n", "REASYN CUDAGRAPH"])
def test_a_toggle_that_is_not_a_plain_variable_name_is_a_collection_error(
    pytester: pytest.Pytester, toggle: str
) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.cuda_graph_parity(toggle={toggle!r})
        def test_toggled(graph_parity):
            pass
        """
    )
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [
            "*cuda_graph_parity on test_*.py::test_toggled: toggle must name an environment "
            "variable: letters, digits and underscores, not starting with a digit, with no space "
            "or newline around it; got *"
        ]
    )
