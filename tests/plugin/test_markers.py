"""Marker registration, --markers help, and argument errors reported at collection."""

from __future__ import annotations

import pytest


def test_markers_help_is_built_from_the_marker_functions(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.cuda_graph_parity(toggle=None, seed=None): Compare a graphed callable*",
            "@pytest.mark.graph_memory_bound(bound=None): Fail when this process's memory*",
            "@pytest.mark.pinned_stack(python=None, torch=None, cuda=None): Skip unless*",
            "@pytest.mark.no_host_sync(trial_capture=False): Fail the test when its body makes*",
        ]
    )
    assert result.ret == pytest.ExitCode.OK


def test_markers_pass_strict_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.pinned_stack(python=">=3")
        @pytest.mark.no_host_sync
        @pytest.mark.graph_memory_bound(8)
        @pytest.mark.cuda_graph_parity(seed=1)
        def test_marked():
            pass
        """
    )
    result = pytester.runpytest_inprocess("--strict-markers", "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["test_*.py::test_marked"])


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (
            "graph_memory_bound(-5)",
            "graph_memory_bound on {id}: bound must be a positive size, got -5",
        ),
        (
            "graph_memory_bound('8MB')",
            "graph_memory_bound on {id}: bound must be a number of MiB or a size with a unit "
            "KiB, MiB or GiB (e.g. 512MiB, 1.5GiB), got '8MB'",
        ),
        (
            "graph_memory_bound(True)",
            "graph_memory_bound on {id}: bound must be a number of MiB or a size string such as '512MiB', got True",
        ),
        (
            "graph_memory_bound(8, 9)",
            "graph_memory_bound on {id}: takes from 0 to 1 positional arguments but 2 were given",
        ),
        (
            "graph_memory_bound",
            "graph_memory_bound on {id}: needs a bound, or a default from --cudagraph-memory-bound",
        ),
        (
            "cuda_graph_parity(seed=-1)",
            "cuda_graph_parity on {id}: seed must be in ?0, 2??63 - 1? (case k runs under "
            "torch.manual_seed(seed + k)), got -1",
        ),
        (
            "cuda_graph_parity(seed=2**64)",
            "cuda_graph_parity on {id}: seed must be in *, got 18446744073709551616",
        ),
        (
            "cuda_graph_parity(seed='3')",
            "cuda_graph_parity on {id}: seed must be an integer, got '3'",
        ),
        (
            "cuda_graph_parity(toggle='')",
            "cuda_graph_parity on {id}: toggle must name an environment*",
        ),
        (
            "cuda_graph_parity(tolerance=1)",
            "cuda_graph_parity on {id}: got an unexpected keyword argument 'tolerance'",
        ),
        (
            "pinned_stack(torch='2.7')",
            "pinned_stack on {id}: torch: '2.7' is not a PEP 440 specifier set",
        ),
        (
            "pinned_stack(numpy='>=1')",
            "pinned_stack on {id}: got an unexpected keyword argument 'numpy'",
        ),
        (
            "pinned_stack('~=3.10')",
            "pinned_stack on {id}: takes 0 positional arguments but 1 was given",
        ),
        (
            "no_host_sync(strict=True)",
            "no_host_sync on {id}: got an unexpected keyword argument 'strict'",
        ),
    ],
)
def test_bad_marker_arguments_are_collection_errors_naming_test_and_marker(
    pytester: pytest.Pytester, marker: str, message: str
) -> None:
    pytester.makepyfile(
        test_bad=f"""
        import pytest

        @pytest.mark.{marker}
        def test_a():
            pass

        def test_b():
            pass
        """
    )
    result = pytester.runpytest_inprocess()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(
        [message.format(id="test_bad.py::test_a"), "*1 error during collection*"]
    )
    result.assert_outcomes(errors=1)


# test_a's marker argument is invalid; test_b has none.
ONE_BAD_MARKER_ONE_PLAIN_TEST = """
import pytest

@pytest.mark.graph_memory_bound(0)
def test_a():
    pass

def test_b():
    pass
"""


def test_other_tests_run_with_continue_on_collection_errors(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ONE_BAD_MARKER_ONE_PLAIN_TEST)
    result = pytester.runpytest_inprocess("--continue-on-collection-errors")
    result.assert_outcomes(passed=1, errors=1)


def test_deselected_tests_are_not_validated(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(ONE_BAD_MARKER_ONE_PLAIN_TEST)
    result = pytester.runpytest_inprocess("-k", "test_b")
    result.assert_outcomes(passed=1, deselected=1)


def test_bound_from_option_completes_a_bare_memory_marker(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        """
        import pytest

        @pytest.mark.fake_memory(growth_mib=10)
        @pytest.mark.graph_memory_bound
        def test_a():
            pass
        """
    )
    result = cpu_pytester.runpytest_inprocess("--cudagraph-memory-bound=4MiB")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*grew by 10.0 MiB, over the 4 MiB bound*"])
