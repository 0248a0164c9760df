"""The engines on a real GPU: the trial-capture host-sync detector against sync debug mode,
CUDA state after failed trials, capture counting for every way torch builds graphs, output
storage of a real graph, comparisons that never wait for the device, and the memory engine's
order independence.

Every test skips, with the reason, where CUDA (or NVML, or triton) is absent; the CPU suite
covers the same logic through the seams.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from gpu_graph_helpers import make_eager, make_graphed, make_inputs

from pytest_cudagraph.engines import devices
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.compare import Tolerance, pending_comparison, settle_comparison
from pytest_cudagraph.engines.hostsync import trial_capture
from pytest_cudagraph.engines.parity import ParityChecker
from pytest_cudagraph.engines.units import MiB
from pytest_cudagraph.skips import needs_cuda

ORDER_TOLERANCE_MIB = 32

pytestmark = needs_cuda


# Host syncs: which detector catches what (the table in docs/plugin.md, no_host_sync).

SYNCING_BODIES: dict[str, Callable[[torch.Tensor], object]] = {
    ".item()": lambda x: x.sum().item(),
    ".cpu()": lambda x: x.cpu(),
    "torch.nonzero": lambda x: torch.nonzero(x > 0),
    "bool() of a CUDA tensor": lambda x: bool((x > 0).any()),
    "torch.cuda.synchronize()": lambda x: torch.cuda.synchronize(),
    "copy from pageable CPU memory": lambda x: x.add_(torch.ones(x.shape).to(x.device)),
    "non_blocking copy from pageable CPU memory": lambda x: x.add_(
        torch.ones(x.shape).to(x.device, non_blocking=True)
    ),
}
# body: (caught by sync debug mode "error", caught by the trial capture)
CAUGHT = {
    ".item()": (True, True),
    ".cpu()": (True, True),
    "torch.nonzero": (True, True),
    "bool() of a CUDA tensor": (True, True),
    "torch.cuda.synchronize()": (False, True),
    "copy from pageable CPU memory": (True, True),
    "non_blocking copy from pageable CPU memory": (False, True),
}


def caught_by_sync_debug_mode(body: Callable[[], object]) -> bool:
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        body()
    except RuntimeError as error:
        if "called a synchronizing CUDA operation" not in str(error):
            raise
        return True
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return False


def assert_cuda_usable(device: torch.device) -> None:
    """Plain work, random numbers, a fresh capture and its replay all still work, on the
    default stream."""
    assert torch.cuda.current_stream(device) == torch.cuda.default_stream(device)
    assert (torch.arange(4.0, device=device) * 2).sum().item() == 12.0
    assert torch.rand(4, device=device).lt(1).all().item()
    static = torch.zeros(4, device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        static * 3
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = static * 3
    static.copy_(torch.ones(4, device=device))
    graph.replay()
    assert out.sum().item() == 12.0


@pytest.mark.parametrize("name", list(SYNCING_BODIES))
def test_which_detector_catches_which_sync(name: str, cuda_device: torch.device) -> None:
    x = torch.randn(64, device=cuda_device)
    body = SYNCING_BODIES[name]
    by_debug_mode = caught_by_sync_debug_mode(lambda: body(x))
    trial = trial_capture(lambda: body(x), cuda_device)
    found = (by_debug_mode, not trial.clean)
    assert found == CAUGHT[name], (
        f"{name}: sync debug mode caught it: {by_debug_mode}; trial capture: "
        f"{trial.error or 'captured cleanly'} (docs/plugin.md's table says {CAUGHT[name]})"
    )
    assert_cuda_usable(cuda_device)


def test_a_capture_clean_body_passes_and_leaves_rng_and_stream_as_they_were(
    cuda_device: torch.device,
) -> None:
    weight = torch.randn(64, 64, device=cuda_device)
    x = torch.randn(8, 64, device=cuda_device)
    rng_before = torch.cuda.get_rng_state(cuda_device)
    trial = trial_capture(lambda: torch.relu(x @ weight) + torch.rand_like(x), cuda_device)
    assert trial.clean, trial.error
    assert torch.equal(torch.cuda.get_rng_state(cuda_device), rng_before)
    assert_cuda_usable(cuda_device)


def test_failed_trials_give_their_memory_back(cuda_device: torch.device) -> None:
    x = torch.randn(1024, 1024, device=cuda_device)
    trial_capture(lambda: (x * 2).sum().item(), cuda_device)  # first-use costs
    torch.cuda.synchronize(cuda_device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(cuda_device)
    for _ in range(10):
        assert not trial_capture(lambda: (x * 2).sum().item(), cuda_device).clean
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved(cuda_device) - before <= 2 * MiB
    assert_cuda_usable(cuda_device)


def test_an_error_of_the_body_itself_propagates(cuda_device: torch.device) -> None:
    def broken() -> None:
        raise KeyError("not a capture problem")

    with pytest.raises(KeyError, match="not a capture problem"):
        trial_capture(broken, cuda_device)
    assert_cuda_usable(cuda_device)


# Captures


def test_counter_sees_hand_written_captures_and_their_replays(cuda_device: torch.device) -> None:
    static = torch.zeros(16, device=cuda_device)
    with CaptureCounter() as counter:
        with counter.key("hand-written"):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static * 2
        for _ in range(3):
            graph.replay()
    [capture] = counter.captures
    assert (capture.key, capture.replays) == ("hand-written", 3)
    assert capture.seconds > 0


def test_counter_sees_make_graphed_callables(cuda_device: torch.device) -> None:
    layer = torch.nn.Linear(16, 16, device=cuda_device)
    x = torch.randn(8, 16, device=cuda_device)
    with CaptureCounter() as counter:
        graphed = torch.cuda.make_graphed_callables(layer, (x,))
        for _ in range(3):
            graphed(x)
    # One forward and one backward graph; the forward one replays on each call.
    assert len(counter.captures) == 2
    assert counter.replays == 3


def test_counter_sees_compile_cudagraph_trees(cuda_device: torch.device) -> None:
    from torch.utils._triton import has_triton

    if not has_triton():
        pytest.skip("needs triton for torch.compile on CUDA")
    compiled = torch.compile(lambda x: (x * 2).sin() + 1, mode="reduce-overhead", dynamic=False)
    with CaptureCounter() as counter:
        for shape in [(8, 16)] * 5 + [(4, 16)] * 5:
            with counter.key(shape):
                compiled(torch.randn(shape, device=cuda_device))
    # Recorded once per shape, each graph then serving its replays; a re-record would be
    # replayed too, to produce its outputs, and show here.
    assert counter.served_captures_per_key() == {(8, 16): 1, (4, 16): 1}
    assert counter.recaptured_keys() == {}
    assert counter.replays >= 6
    # Besides those, at most the tree manager's memory-pool graph, captured empty on the first
    # call and never replayed.
    unserved = [capture for capture in counter.captures if not capture.replays]
    assert [capture.key for capture in unserved] in ([], [(8, 16)])


# Output storage


def test_a_graph_returning_its_static_output_fails_parity(cuda_device: torch.device) -> None:
    eager = make_eager(cuda_device)
    graphed = make_graphed(cuda_device, eager, (8, 16), clone_output=False)
    result = ParityChecker(cuda_device).check(eager, graphed, make_inputs, cases=3)
    assert [outcome.passed for outcome in result.outcomes] == [True, False, False]
    assert "output: shares storage with case 0 output" in result.reason()


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.complex64],
)
@pytest.mark.parametrize("atol", [0.0, 0.5])
def test_a_pending_comparison_never_waits_for_the_device(
    cuda_device: torch.device, dtype: torch.dtype, atol: float
) -> None:
    """Queued under sync debug mode "error": any read by the host would raise. The figures of
    the differing element are then right, read once."""
    expected = torch.zeros(64, 32, device=cuda_device).to(dtype)
    actual = expected.clone()
    actual[3, 5] = 1
    torch.cuda.synchronize(cuda_device)
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        found = pending_comparison(expected.t(), actual.t(), Tolerance(atol=atol))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    [mismatch] = settle_comparison(found)
    assert (mismatch.first_index, mismatch.differing, mismatch.numel) == ((5, 3), 1, 2048)
    assert mismatch.graphed == (True if dtype == torch.bool else 1)


def test_a_parity_check_holds_earlier_outputs_only_within_its_budget(
    cuda_device: torch.device,
) -> None:
    """Sixteen cases of 16 MiB outputs: with no budget the check's peak is a few outputs, not
    the 512 MiB both outputs of every case were."""
    rows = 16 * MiB // (4 * 4096)

    def step(row: torch.Tensor) -> torch.Tensor:
        return row.expand(rows, -1) * 2.0

    def one_row(generator: torch.Generator, case: int) -> torch.Tensor:
        return torch.randn(1, 4096, generator=generator, device=cuda_device)

    torch.cuda.synchronize(cuda_device)
    torch.cuda.reset_peak_memory_stats(cuda_device)
    before = torch.cuda.memory_allocated(cuda_device)
    result = ParityChecker(cuda_device, output_budget_bytes=0).check(step, step, one_row, 16)
    peak = torch.cuda.max_memory_allocated(cuda_device) - before
    assert result.ok, result.reason()
    assert peak <= 8 * 16 * MiB, f"{peak / MiB:.0f} MiB"


# Memory: the same workload measured alone and after other first-use work


def run_order(before: str, warmup: str) -> dict[str, object]:
    script = Path(__file__).with_name("gpu_memory_runs.py")
    command = [sys.executable, str(script), "order", "--before", before, "--warmup", warmup]
    # The checkout's packages, whether or not they are installed.
    path = os.pathsep.join(filter(None, [str(script.parents[2]), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(
    not devices.nvml_status().available, reason=f"needs NVML: {devices.nvml_status().detail}"
)
def test_memory_figures_do_not_depend_on_what_ran_before(record_property) -> None:
    alone = run_order("none", "yes")
    after = run_order("other", "yes")
    print(json.dumps({"alone": alone, "after other work": after}, indent=1))
    for figure in ("growth_mib", "torch_reserved_growth_mib", "outside_torch_growth_mib"):
        record_property(f"{figure} alone", alone[figure])
        record_property(f"{figure} after other work", after[figure])
        assert abs(alone[figure] - after[figure]) <= ORDER_TOLERANCE_MIB, (figure, alone, after)
    assert alone["growth_mib"] > 0
