"""The bench folder's JSON keeps every finished benchmark when one was interrupted in its first
round, as the GPU recipe interrupts a step at its limit (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

UNFINISHED = """
def test_finished(benchmark):
    benchmark.pedantic(sum, args=(range(10),), rounds=3)

def test_unfinished(benchmark):
    def interrupted():  # as SIGINT interrupts a call in its first round
        raise KeyboardInterrupt

    benchmark.pedantic(interrupted, rounds=3)
"""


@pytest.mark.usefixtures("outside_xdist")
def test_a_benchmark_that_timed_no_round_is_left_out_and_the_others_kept(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_unfinished=UNFINISHED)
    written = pytester.path / "bench.json"
    result = pytester.runpytest_inprocess(
        "--benchmark-enable", f"--benchmark-json={written}", no_reraise_ctrlc=True
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    names = [benchmark["name"] for benchmark in json.loads(written.read_text())["benchmarks"]]
    assert names == ["test_finished"]
