"""Behaviour with and without pytest-xdist: worker GPU binding and the controller's summary."""

from __future__ import annotations

import pytest

# Each test starts xdist workers (the README's test command leaves it out).
pytestmark = pytest.mark.slow

# Each worker checks its own binding; the other tests feed the controller's summary.
WORKER_TESTS = """
import os

import pytest
import torch

from pytest_cudagraph import plugin


@pytest.mark.parametrize("n", range(4))
def test_bound(n, pytestconfig):
    worker = pytestconfig.workerinput["workerid"]
    expected = EXPECTED[worker]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == expected
    binding = pytestconfig.stash[plugin.BINDING]
    assert binding.how == f"xdist worker {worker}: CUDA_VISIBLE_DEVICES={expected} (of {ALL})"


@pytest.mark.parametrize("n", range(2))
def test_parity(n, graph_parity):
    inputs = lambda generator, case: torch.randn(4, generator=generator)  # noqa: E731
    graph_parity.check(torch.sin, torch.sin, inputs, cases=5)


@pytest.mark.fake_memory(growth_mib=2)
@pytest.mark.graph_memory_bound(16)
def test_memory():
    pass


@pytest.mark.pinned_stack(python="<3")
def test_pinned():
    pass
"""


def test_workers_take_the_nth_gpu_of_an_outer_list_and_report_to_the_controller(
    cpu_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    cpu_pytester.makepyfile('EXPECTED = {"gw0": "5", "gw1": "7"}\nALL = "5,7"\n' + WORKER_TESTS)
    result = cpu_pytester.runpytest_subprocess("-n", "2", "-p", "no:benchmark")
    result.assert_outcomes(passed=7, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*= cudagraph =*",
            "parity: 10 of 10 checked cases match",
            "  test_*.py::test_parity[[]?[]]: 5 of 5 cases match",
            "  test_*.py::test_parity[[]?[]]: 5 of 5 cases match",
            "memory growth across the test body (NVML, this process):",
            "  test_*.py::test_memory on cuda:0: +2.0 MiB of 16 MiB bound ok; *",
            "skips by reason:",
            "  1 x pinned stack not running: python * not <3*",
        ]
    )


def test_workers_take_the_nth_of_the_gpus_counted_on_the_host(
    cpu_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cpu_pytester.makeconftest(
        cpu_pytester.path.joinpath("conftest.py").read_text()
        + "\nimport pytest_cudagraph.engines.devices\n"
        + "pytest_cudagraph.engines.devices.host_gpu_count = lambda: 3  # a simulated 3-GPU host\n"
    )
    cpu_pytester.makepyfile('EXPECTED = {"gw0": "0", "gw1": "1"}\nALL = "0,1,2"\n' + WORKER_TESTS)
    result = cpu_pytester.runpytest_subprocess("-n", "2", "-p", "no:benchmark", "-k", "test_bound")
    result.assert_outcomes(passed=4)


@pytest.mark.parametrize(
    ("args", "registered"), [([], True), (["-p", "no:xdist"], False)], ids=["xdist", "no-xdist"]
)
def test_xdist_hooks_are_registered_only_with_xdist(
    pytester: pytest.Pytester, args: list[str], registered: bool
) -> None:
    pytester.makepyfile(
        f"""
        def test_registration(pytestconfig):
            hooks = pytestconfig.pluginmanager.get_plugin("cudagraph-xdist")
            assert (hooks is not None) is {registered}
            assert pytestconfig.pluginmanager.hasplugin("xdist") is {registered}
        """
    )
    pytester.runpytest_inprocess(*args).assert_outcomes(passed=1)


def test_without_xdist_the_process_keeps_cuda_0(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch
        from pytest_cudagraph import plugin

        def test_binding(pytestconfig):
            binding = pytestconfig.stash[plugin.BINDING]
            assert (binding.device, binding.how) == (torch.device("cuda", 0), "default")
        """
    )
    pytester.runpytest_inprocess("-p", "no:xdist").assert_outcomes(passed=1)
