"""CUDA graphs emulated on the CPU through the plugin: ``--cudagraph-emulate`` (and its ini key
and environment variable), the ``emulated_graphs`` fixture, and the two markers whose graph path
runs there where ``cuda_device`` is the CPU (``cuda_graph_parity``, ``no_host_sync`` with a trial
capture) instead of skipping."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _dispatch_imported() -> None:
    """The first capture imports what torch's dispatch modes need (torch._dynamo, which
    registers operators with torch's C++ library): imported here once, the in-process runs
    below find it imported (a second import of it there would register them twice)."""
    from pytest_cudagraph.engines.emulation import emulated_graphs

    with emulated_graphs():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            torch.ones(1) * 2


GRAPHED_LINEAR = """
import pytest
import torch


def graphed(model, device):
    static = torch.zeros(2, 4, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(static)

    def call(x):
        static.copy_(x)
        graph.replay()
        return out.clone() if CLONE else out

    return call


@pytest.mark.cuda_graph_parity
def test_parity(graph_parity, cuda_device):
    model = torch.nn.Linear(4, 4).to(cuda_device).requires_grad_(False)
    draw = lambda gen, case: (torch.randn(2, 4, generator=gen, device=cuda_device),)
    graph_parity.check(model, graphed(model, cuda_device), draw, 4)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the emulation where CUDA is absent")
@pytest.mark.parametrize(
    ("how", "clone", "outcome"),
    [
        (["--cudagraph-emulate", "on"], True, {"passed": 1}),
        (["--cudagraph-emulate", "on"], False, {"failed": 1}),  # the static output, overwritten
        (["--cudagraph-emulate", "off"], True, {"skipped": 1}),
        ([], True, {"skipped": 1}),  # auto: a test's own graphs are not emulated unasked
    ],
)
def test_emulate_on_runs_a_graph_parity_test_on_the_cpu(
    pytester: pytest.Pytester, how: list[str], clone: bool, outcome: dict[str, int]
) -> None:
    pytester.makepyfile(f"CLONE = {clone}\n" + GRAPHED_LINEAR)
    result = pytester.runpytest_inprocess("-p", "no:randomly", *how)
    result.assert_outcomes(**outcome)
    if "on" in how:
        result.stdout.fnmatch_lines(["cudagraph: CUDA graphs emulated on the CPU (*on)*"])


@pytest.mark.parametrize("source", ["ini", "env"])
def test_emulate_is_read_from_the_ini_and_the_environment(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    pytester.makepyfile("def test_device(cuda_device):\n    assert cuda_device.type == 'cpu'\n")
    if source == "ini":
        pytester.makeini("[pytest]\ncudagraph_emulate = on\n")
    else:
        monkeypatch.setenv("PYTEST_CUDAGRAPH_EMULATE", "on")
    pytester.runpytest_inprocess("-p", "no:randomly").assert_outcomes(passed=1)


def test_a_bad_emulate_value_is_refused_naming_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_inprocess("--cudagraph-emulate", "maybe")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--cudagraph-emulate*invalid choice: 'maybe'*"])


def test_the_markers_emulate_where_cuda_device_is_the_cpu(cpu_pytester: pytest.Pytester) -> None:
    cpu_pytester.makepyfile(
        "CLONE = True\n"
        + GRAPHED_LINEAR
        + """

@pytest.mark.no_host_sync(trial_capture=True)
def test_capture_clean(cuda_device):
    (torch.ones(4, device=cuda_device) * 2).sum()


@pytest.mark.no_host_sync(trial_capture=True)
def test_capture_syncs(cuda_device):
    float(torch.ones(4, device=cuda_device).sum())
"""
    )
    result = cpu_pytester.runpytest_inprocess("-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_capture_syncs _*",
            "no_host_sync: the test body cannot be captured in a CUDA graph *: RuntimeError: CUDA "
            "error: operation not permitted when stream is capturing (emulated: "
            "aten._local_scalar_dense.default reads a tensor's values on the host)",
        ]
    )
    assert not hasattr(torch.cuda.CUDAGraph, "record")  # torch's own class again after the run


def test_the_emulated_graphs_fixture_emulates_for_its_test_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import torch

        def test_inside(emulated_graphs):
            graph = torch.cuda.CUDAGraph()
            x = torch.ones(2)
            with torch.cuda.graph(graph):
                y = x * 3
            assert torch.isnan(y).all()  # memory the capture allocated: garbage until replayed
            graph.replay()
            assert y.tolist() == [3.0, 3.0]

        def test_after():
            from pytest_cudagraph.engines import emulation

            assert not emulation.active()
        """
    )
    pytester.runpytest_inprocess("-p", "no:randomly").assert_outcomes(passed=2)
