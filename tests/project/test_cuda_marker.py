"""The ``cuda`` marker tells the tests needing a GPU apart, and the GPU recipe's test steps select
them by it (``-m cuda``): so on a machine without CUDA, every test of tests/ that skips for want
of a GPU must carry it, and every test carrying it must skip. The tests are set up without
running (``--setup-only``): the skip marks and the fixtures' skips, where a test skips for want
of a GPU (a skip of its own saying so is test_layout.py's to refuse). A fixture project shows
that the check fails a test missing the marker, and one carrying it that runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from pytest_cudagraph.skips import NEEDS_CUDA

ROOT = Path(__file__).resolve().parents[2]
# A reason for want of a GPU: the one needs_cuda gives, two GPUs, the driver's NVML.
WANT_OF_A_GPU = re.compile(r"\b(CUDA|GPUs?|NVML)\b")

PROBE = """
import json, os

import pytest

marked, skipped = [], {}


@pytest.hookimpl(trylast=True)  # after every hook that adds markers
def pytest_collection_modifyitems(items):
    marked.extend(item.nodeid for item in items if item.get_closest_marker("cuda"))


def reason(report):
    return str(report.longrepr[2]).removeprefix("Skipped: ")


def pytest_runtest_logreport(report):
    if report.skipped:
        skipped[report.nodeid] = reason(report)


def pytest_collectreport(report):
    if report.skipped:  # a module skipped whole
        skipped[report.nodeid] = reason(report)


def pytest_sessionfinish(session):
    with open(os.environ["CUDA_MARKER_PROBE"], "w") as out:
        json.dump({"marked": marked, "skipped": skipped}, out)
"""

without_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the skips where CUDA is absent"
)


def set_up(folder: Path, probe_dir: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """The tests pytest collects in ``folder`` set up only: those carrying the marker, and
    the skipped ones with their reasons."""
    probe_dir.mkdir()
    (probe_dir / "cuda_marker_probe.py").write_text(PROBE)
    out = probe_dir / "found.json"
    paths = [str(probe_dir), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path for path in paths if path),
        "CUDA_MARKER_PROBE": str(out),
    }
    ran = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "--setup-only", "-q"),
            *("-p", "cuda_marker_probe", "-p", "no:randomly", "-p", "no:cacheprovider"),
            *args,
        ],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    found = json.loads(out.read_text())
    return found["marked"], found["skipped"]


def mismatches(marked: Sequence[str], skipped: dict[str, str]) -> tuple[list[str], list[str]]:
    """The tests skipping for want of a GPU without the marker, and those carrying it that
    do not skip."""
    unmarked = sorted(
        f"{test}: {reason}"
        for test, reason in skipped.items()
        if WANT_OF_A_GPU.search(reason) and test not in marked
    )
    running = sorted(test for test in marked if test not in skipped)
    return unmarked, running


@without_cuda
@pytest.mark.slow
@pytest.mark.usefixtures("outside_xdist")
def test_every_test_skipping_for_want_of_a_gpu_carries_the_marker_and_no_other(
    tmp_path: Path,
) -> None:
    marked, skipped = set_up(ROOT, tmp_path / "probe", "tests")
    assert mismatches(marked, skipped) == ([], [])
    # Every folder's GPU tests are seen: by needs_cuda, and by the cuda_device fixture alone
    # (the README's quick start).
    folders = {test.split("/")[1] for test in marked}
    assert folders >= {"bench", "conformance", "engines", "plugin", "project", "reasyn_ref"}
    assert "tests/project/quickstart/test_my_model.py::test_forward_is_capture_clean" in marked


FIXTURE_MODULE = """
import pytest
import torch

from pytest_cudagraph.skips import NEEDS_CUDA, needs_cuda


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NEEDS_CUDA)
def test_skips_without_the_marker():
    pass


def test_takes_the_device(cuda_device):
    pass


@needs_cuda
def test_marked():
    pass


@pytest.mark.cuda
def test_marked_but_runs():
    pass


class TestMarkedClass:
    pytestmark = needs_cuda

    def test_in_a_class(self):
        pass
"""


@without_cuda
@pytest.mark.usefixtures("outside_xdist")
def test_the_check_fails_a_test_missing_the_marker_and_one_that_runs(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_fixture=FIXTURE_MODULE)
    # A project of its own, strict: the plugin registers the marker.
    marked, skipped = set_up(pytester.path, pytester.path / "probe", "--strict-markers")
    unmarked, running = mismatches(marked, skipped)
    assert unmarked == [
        f"test_fixture.py::test_skips_without_the_marker: {NEEDS_CUDA}",
        f"test_fixture.py::test_takes_the_device: {NEEDS_CUDA}",
    ]
    assert running == ["test_fixture.py::test_marked_but_runs"]
    assert "test_fixture.py::TestMarkedClass::test_in_a_class" in marked
