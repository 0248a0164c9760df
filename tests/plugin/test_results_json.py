"""--cudagraph-json: the session's results as a file, also under xdist (the controller writes)."""

from __future__ import annotations

import json

import pytest

RESULTS_TESTS = """
import pytest
import torch


def test_parity(graph_parity):
    graph_parity.check(torch.sin, torch.sin, lambda generator, case: torch.randn(3), cases=4)


@pytest.mark.fake_memory(growth_mib=2)
@pytest.mark.graph_memory_bound("16MiB")
def test_memory():
    pass


@pytest.mark.pinned_stack(python="<3")
def test_pinned():
    pass


def test_plain_skip():
    pytest.skip("not today")


def test_plain():
    pass
"""


def read_results(pytester: pytest.Pytester, name: str = "results.json") -> dict:
    return json.loads((pytester.path / name).read_text())


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_results_hold_records_stack_and_skips(
    cpu_pytester: pytest.Pytester, xdist: list[str]
) -> None:
    cpu_pytester.makepyfile(RESULTS_TESTS)
    result = cpu_pytester.runpytest_subprocess("--cudagraph-json=results.json", *xdist)
    result.assert_outcomes(passed=3, skipped=2)
    result.stdout.fnmatch_lines(["cudagraph results written to results.json"])
    results = read_results(cpu_pytester)
    assert results["format"] == 2
    [parity] = results["parity"]
    assert parity["nodeid"].endswith("::test_parity")
    assert parity == {"nodeid": parity["nodeid"], "form": "cases", "checked": 4, "passed": 4}
    [memory] = results["memory"]
    assert memory["bound_mib"] == 16
    assert memory["growth_mib"] == pytest.approx(2.0)
    assert memory["passed"] is True
    assert results["skips"]["total"] == 2
    reasons = {entry["reason"] for entry in results["skips"]["by_reason"]}
    assert "not today" in reasons
    assert any(reason.startswith("pinned stack not running: python") for reason in reasons)
    assert results["stack"]["torch"].startswith("2.")
    assert set(results["stack"]) >= {"python", "torch", "torch_cuda", "driver", "gpus"}
    assert results["pinned_stack"]["pinned"]["python"] == "~=3.10.0"
    assert results["conformance"] is None


def test_path_from_ini_or_env(
    cpu_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu_pytester.makepyfile("def test_a(graph_parity): pass")
    cpu_pytester.makeini("[pytest]\ncudagraph_json = from_ini.json")
    cpu_pytester.runpytest_inprocess().assert_outcomes(passed=1)
    assert read_results(cpu_pytester, "from_ini.json")["parity"] == []
    monkeypatch.setenv("PYTEST_CUDAGRAPH_JSON", "out/from_env.json")
    cpu_pytester.runpytest_inprocess().assert_outcomes(passed=1)
    assert read_results(cpu_pytester, "out/from_env.json")["skips"]["total"] == 0


def test_conformance_rows_are_in_the_results(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(
        "--pyargs",
        "pytest_cudagraph.conformance",
        "-k",
        "contract or guards",
        "--cudagraph-target",
        "reasyn",
        "--cudagraph-json=results.json",
    )
    result.assert_outcomes(passed=2)
    table = read_results(pytester)["conformance"]
    assert table["target"] == "reasyn"
    assert [(row["check"], row["verdict"]) for row in table["rows"]] == [
        ("target contract", "passed"),
        ("guards", "passed"),
    ]
    assert all(row["figure"] for row in table["rows"])
