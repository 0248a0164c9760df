"""The storage rule on every parity path: the marker's ``graph_parity.check`` and the toggle
form (engine and marker) fail a graphed output that does not own its memory (CPU)."""

from __future__ import annotations

import os

import pytest
import torch

from pytest_cudagraph.engines.parity import ParityChecker

TOGGLE = "H13B_DEMO_GRAPHS"
STATIC = torch.zeros(3)


def body_returning_a_static_buffer_when_graphed(checker: ParityChecker) -> None:
    for step in range(2):
        value = torch.full((3,), float(step))
        graphed = os.environ[TOGGLE] == "1"
        checker.record("y", STATIC.copy_(value) if graphed else value)


def test_a_toggled_run_recording_one_buffer_again_fails() -> None:
    checker = ParityChecker("cpu")
    result = checker.run_toggled(
        lambda: body_returning_a_static_buffer_when_graphed(checker), TOGGLE
    )
    assert not result.ok
    [mismatch] = result.outcomes[0].mismatches
    assert mismatch.describe() == (
        f"recorded['y'][1]: shares storage with recorded['y'][0] in the run with {TOGGLE}=1"
    )


def test_a_tensor_recorded_twice_in_both_runs_is_the_body_not_the_graph() -> None:
    checker = ParityChecker("cpu")

    def body() -> None:
        checker.record("weights", STATIC)
        checker.record("weights", STATIC[:2])
        checker.record("y", STATIC * 2)

    result = checker.run_toggled(body, TOGGLE)
    assert result.ok, result.reason()


def test_the_markers_paths_fail_on_shared_storage(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        f"""
        import os

        import pytest
        import torch

        STATIC = torch.zeros(4)


        def make_inputs(generator, case):
            return (torch.randn(4, generator=generator),)


        @pytest.mark.cuda_graph_parity
        def test_returns_its_input(graph_parity):
            graph_parity.check(lambda x: x * 1, lambda x: x, make_inputs, cases=2)


        @pytest.mark.cuda_graph_parity
        def test_returns_a_copy(graph_parity):
            graph_parity.check(lambda x: x * 1, lambda x: x.clone(), make_inputs, cases=2)


        @pytest.mark.cuda_graph_parity(toggle="{TOGGLE}")
        def test_toggled_static_buffer(graph_parity):
            for step in range(2):
                value = torch.full((4,), float(step))
                graphed = os.environ["{TOGGLE}"] == "1"
                graph_parity.record("y", STATIC.copy_(value) if graphed else value)
        """
    )
    result = cpu_pytester.runpytest_inprocess()
    result.assert_outcomes(passed=1, failed=2)
    output = result.stdout.str()  # (fnmatch would read the brackets as character sets)
    assert "cuda_graph_parity: case 0 of 2 differs: output: shares storage with inputs[0]" in output
    assert (
        f"differ: recorded['y'][1]: shares storage with recorded['y'][0] in the run with {TOGGLE}=1"
        in output
    )
