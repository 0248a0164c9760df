"""The conformance suite's own duration on this GPU, per bundled target, as pytest counts it
(the session time in its JUnit report), run in a fresh process the way a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from bench_workloads import SUITE_TARGETS

from pytest_cudagraph.skips import needs_cuda

pytestmark = needs_cuda


def run_suite(target: str, junit: str) -> subprocess.CompletedProcess:
    # A clean child: not an xdist worker, no options of ours leaking in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    command = [
        sys.executable, "-m", "pytest", "--pyargs", "pytest_cudagraph.conformance",
        "--cudagraph-target", target, "-p", "no:cacheprovider", "-q", f"--junitxml={junit}",
    ]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("target", SUITE_TARGETS)
def test_conformance_suite(target, benchmark, tmp_path):
    junit = str(tmp_path / "suite.xml")
    finished = benchmark.pedantic(run_suite, args=(target, junit), rounds=1, iterations=1)
    assert os.path.exists(junit), f"the suite wrote no report:\n{finished.stdout[-3000:]}"
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {name: int(suite.get(name, 0)) for name in ("tests", "failures", "errors", "skipped")}
    benchmark.extra_info.update(
        bench="conformance_suite",
        target=target,
        suite_s=float(suite.get("time")),
        passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        skipped=counts["skipped"],
        failed=counts["failures"] + counts["errors"],
    )  # recorded before the verdict, so the report shows a failed suite too
    assert finished.returncode == 0, f"the suite failed on {target}:\n{finished.stdout[-3000:]}"
