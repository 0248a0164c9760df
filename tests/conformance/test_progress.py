"""pytest_cudagraph.conformance._progress: when a long check says where it is, and where it says
it (the terminal, past output capturing; nothing under -q or in xdist workers); the dry run
saying it on a slow target."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from suite_runner import plugin_arguments

from pytest_cudagraph.conformance._catalog import declared_checks
from pytest_cudagraph.conformance._progress import EVERY_S, QUIET_S, CheckProgress

# Each test runs the suite to watch its progress lines (the README's test command leaves it out).
pytestmark = pytest.mark.slow


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_quiet_at_first_then_at_most_every_few_seconds() -> None:
    clock, lines = Clock(), []
    progress = CheckProgress("parity", lines.append, clock=clock)
    clock.now += QUIET_S - 0.1
    progress("key 1")
    assert lines == []
    clock.now += 0.1
    progress("key 2")
    assert lines == [f"cudagraph: parity: key 2 ({QUIET_S:.0f} s)"]
    clock.now += EVERY_S - 0.1
    progress("key 3")
    assert len(lines) == 1
    clock.now += 0.1
    progress("key 4")
    assert lines[-1] == f"cudagraph: parity: key 4 ({QUIET_S + EVERY_S:.0f} s)"


def test_without_a_writer_it_says_nothing() -> None:
    clock = Clock()
    progress = CheckProgress("parity", None, clock=clock, quiet_s=0)
    progress("key 1")  # nothing to write to, nothing raised


LONG_CHECK = """
from pytest_cudagraph import results
from pytest_cudagraph.conformance import _suite
from pytest_cudagraph.conformance._progress import check_progress


def test_long(request):
    progress = check_progress(request, quiet_s=0, every_s=0)
    for key in range(3):
        progress(f"key {key}")


def test_labelled(request):
    results.record(request.node, _suite.CHECK, "bounded memory")
    check_progress(request, quiet_s=0)("shape 1 of 24")
"""


@pytest.fixture
def long_check(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    # Under `pytest -n` the inner run must not take itself for an xdist worker.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makepyfile(test_long_check=LONG_CHECK)
    return pytester


def test_a_long_check_says_where_it_is_past_output_capturing(long_check: pytest.Pytester) -> None:
    result = long_check.runpytest_subprocess(*plugin_arguments())
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "cudagraph: test_long: key 0 (0 s)",
            "cudagraph: test_long: key 1 (0 s)",
            "cudagraph: test_long: key 2 (0 s)",
            # A check of the suite goes by its name in the conformance table.
            "cudagraph: bounded memory: shape 1 of 24 (0 s)",
        ]
    )


@pytest.mark.parametrize("quiet", [["-q"], ["-n", "2"]], ids=["-q", "xdist"])
def test_quiet_under_q_and_in_xdist_workers(long_check: pytest.Pytester, quiet: list[str]) -> None:
    result = long_check.runpytest_subprocess(*plugin_arguments(), *quiet)
    result.assert_outcomes(passed=2)
    assert "cudagraph: test_long" not in result.stdout.str()
    assert "cudagraph: bounded memory" not in result.stdout.str()


SLOW_TARGET = """
import time

import torch

from pytest_cudagraph.conformance import hand_written


def slow_eager(inputs):
    time.sleep(0.8)  # a compilation, a model's first call
    return inputs["x"] * 2


def make(device):
    return hand_written(
        device=device,
        eager=slow_eager,
        graphed=None,
        keys=[1, 2, 3, 4, 5],
        draw=lambda generator, case: {"x": torch.randn(case.key, generator=generator)},
        key_of=lambda inputs: inputs["x"].shape[0],
    )
"""


def test_the_dry_run_says_which_key_it_is_on(
    run_suite: Callable[..., pytest.RunResult],
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile(slow_target=SLOW_TARGET)
    result = run_suite("--cudagraph-target", "slow_target:make", "-k", "dry_run")
    result.assert_outcomes(passed=1, deselected=len(declared_checks()) - 1)
    result.stdout.fnmatch_lines(
        ["cudagraph: dry run: eager on case ?: key ?, repeat 0 (? of 5 keys) (? s)"]
    )
