"""The conformance suite's own duration on this GPU, per bundled target, as pytest counts it
(the session time in its JUnit report), run in a fresh process the way a user runs it."""

from __future__ import annotations

import pytest
from bench_workloads import SUITE_TARGETS, run_suite

from pytest_cudagraph.skips import needs_cuda

pytestmark = needs_cuda


@pytest.mark.parametrize("target", SUITE_TARGETS)
def test_conformance_suite(target, benchmark, tmp_path):
    run = benchmark.pedantic(run_suite, args=(target, tmp_path / "suite.xml"), rounds=1)
    benchmark.extra_info.update(
        bench="conformance_suite",
        target=target,
        suite_s=run.suite_s,
        passed=run.passed,
        skipped=run.skipped,
        failed=run.failed,
    )  # recorded before the verdict, so the report shows a failed suite too
    assert run.returncode == 0, f"the suite failed on {target}:\n{run.output[-3000:]}"
