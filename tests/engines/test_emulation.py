"""CUDA graphs emulated on the CPU: each test is a behaviour a real CUDA graph has, shown on user
code written as for a GPU (``torch.cuda.CUDAGraph()``, ``with torch.cuda.graph(g)``,
``static_x.copy_(new); g.replay()``) with CPU tensors."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from pytest_cudagraph.engines import emulation
from pytest_cudagraph.engines.emulation import active, emulated_graphs, pool_bytes
from pytest_cudagraph.engines.graph_recorder import INVALIDATED, NOT_PERMITTED, holds_garbage


@pytest.fixture
def emulated() -> Iterator[None]:
    with emulated_graphs():
        yield


def captured(
    fn: Callable[..., object], *static_inputs: torch.Tensor, pool: tuple[int, int] | None = None
) -> tuple[emulation.CUDAGraph, Any]:
    """Warm up on a side stream, then capture ``fn(*static_inputs)``, as torch's docs do."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*static_inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn(*static_inputs)
    return graph, out


# What a replay runs: the recorded kernels, no Python


class Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0  # a Python float: read by the capture, not by a replay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + 1


@pytest.mark.usefixtures("emulated")
def test_a_python_scalar_read_at_capture_is_baked_into_the_graph() -> None:
    module, static_x = Scaled(), torch.zeros(3)
    graph, out = captured(module, static_x)
    module.scale = 5.0
    new = torch.tensor([1.0, 2.0, 3.0])
    static_x.copy_(new)
    graph.replay()
    assert torch.equal(out, new * 2.0 + 1)
    assert not torch.equal(module(new), new * 2.0 + 1)  # eager reads the new scale


@pytest.mark.usefixtures("emulated")
def test_an_autocast_region_around_a_replay_changes_nothing() -> None:
    static_x = torch.tensor([1.0, 1.0 / 3.0])
    graph, out = captured(lambda x: x @ torch.ones(2, 2), static_x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        graph.replay()
    assert out.dtype == torch.float32
    assert torch.equal(out, static_x @ torch.ones(2, 2))


@pytest.mark.usefixtures("emulated")
def test_a_callers_new_tensor_the_graph_never_reads_leaves_the_static_inputs_answer() -> None:
    static_x = torch.tensor([1.0, 2.0])
    graph, out = captured(lambda x: x * 3, static_x)
    new = torch.tensor([10.0, 20.0])  # passed to nothing the graph reads: a stale static input
    graph.replay()
    assert torch.equal(out, torch.tensor([3.0, 6.0]))
    assert graph.record is not None
    assert graph.record.reads_storage_of(static_x)
    assert not graph.record.reads_storage_of(new)


@pytest.mark.usefixtures("emulated")
def test_an_output_kept_from_one_replay_is_overwritten_by_the_next() -> None:
    static_x = torch.zeros(2)
    graph, out = captured(lambda x: x + 1, static_x)
    static_x.copy_(torch.tensor([1.0, 2.0]))
    graph.replay()
    kept = out
    static_x.copy_(torch.tensor([5.0, 6.0]))
    graph.replay()
    assert kept is out
    assert torch.equal(kept, torch.tensor([6.0, 7.0]))


@pytest.mark.usefixtures("emulated")
def test_in_place_state_advances_per_replay_and_the_capture_leaves_it_as_it_was() -> None:
    """A KV-cache step: write at ``pos``, then ``pos += 1``, in the graph."""
    cache, pos = torch.zeros(4), torch.zeros(1, dtype=torch.long)

    def step(x: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, pos, x)
        pos.add_(1)
        return cache.sum()

    static_x = torch.ones(1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(static_x)
    assert pos.item() == 0 and torch.equal(cache, torch.zeros(4))
    for value in (1.0, 2.0, 3.0):
        static_x.fill_(value)
        graph.replay()
    assert pos.item() == 3
    assert torch.equal(cache, torch.tensor([1.0, 2.0, 3.0, 0.0]))


@pytest.mark.usefixtures("emulated")
def test_memory_allocated_in_the_capture_is_garbage_until_the_first_replay() -> None:
    static_x = torch.tensor([-1.0, 2.0, 3.0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        doubled, positive, rounded = static_x * 2, static_x > 0, static_x.long() + 1
    assert torch.isnan(doubled).all()
    assert torch.equal(rounded, torch.full((3,), torch.iinfo(torch.long).max))
    assert all(holds_garbage(t) for t in (doubled, positive, rounded))
    graph.replay()
    assert torch.equal(doubled, torch.tensor([-2.0, 4.0, 6.0]))
    assert torch.equal(positive, torch.tensor([False, True, True]))
    assert torch.equal(rounded, torch.tensor([0, 3, 4]))
    assert not any(holds_garbage(t) for t in (doubled, positive, rounded))


@pytest.mark.usefixtures("emulated")
def test_memory_the_graph_allocates_and_never_writes_stays_garbage_across_replays() -> None:
    """``torch.empty`` launches nothing: a replay leaves its memory as it was."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        block = torch.empty(4)
        block[:1].fill_(1.0)
    for _ in range(2):
        graph.replay()
        assert block[0] == 1.0 and holds_garbage(block[1:])


@pytest.mark.usefixtures("emulated")
def test_an_error_of_the_block_ends_the_capture_and_propagates() -> None:
    static_x, graph = torch.ones(2), torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="the block's own"):
        with torch.cuda.graph(graph):
            out = static_x * 3
            raise ValueError("the block's own")
    assert not torch.cuda.is_current_stream_capturing()
    graph.replay()  # what was captured before the error
    assert torch.equal(out, torch.full((2,), 3.0))


# Host syncs in a capture

# Each body, and what its error names.
HOST_SYNCS: dict[str, tuple[Callable[[torch.Tensor], object], str]] = {
    "item": (lambda x: x.sum().item(), "aten._local_scalar_dense"),
    "bool": (lambda x: bool(x[0] > 0), "aten._local_scalar_dense"),
    "nonzero": (torch.nonzero, "aten.nonzero"),
    "masked_select": (lambda x: x.masked_select(x > 0), "aten.masked_select"),
    "unique": (torch.unique, "aten._unique2"),
    "equal": (lambda x: torch.equal(x, x), "aten.equal"),
    "mask_index": (lambda x: x[x > 0], "boolean mask"),
    "synchronize": (lambda x: torch.cuda.synchronize(), "torch.cuda.synchronize()"),
    "stream": (lambda x: torch.cuda.current_stream().synchronize(), "Stream.synchronize()"),
    # What dispatches no op on an emulated device's (CPU) tensor: seen as method calls.
    "cpu": (lambda x: x.cpu(), "Tensor.cpu() copies it to the host"),
    "to cpu": (lambda x: x.to("cpu"), "Tensor.to() copies it to the host"),
    "tolist": (lambda x: x.tolist(), "Tensor.tolist()"),
    "numpy": (lambda x: x.numpy(), "Tensor.numpy()"),
}


@pytest.mark.usefixtures("emulated")
@pytest.mark.parametrize("name", HOST_SYNCS)
def test_a_host_sync_in_a_capture_raises_and_invalidates_it(name: str) -> None:
    x = torch.tensor([1.0, -2.0, 3.0])
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin()
    body, named = HOST_SYNCS[name]
    with pytest.raises(RuntimeError, match=NOT_PERMITTED) as raised:
        body(x)
    assert named in str(raised.value)
    with pytest.raises(RuntimeError, match=INVALIDATED):
        x + 1  # work after the error, in the invalidated capture
    with pytest.raises(RuntimeError, match=INVALIDATED):
        graph.capture_end()
    assert not torch.cuda.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        graph.replay()
    fresh, out = captured(lambda t: t * 2, x)  # nothing was left half-captured
    fresh.replay()
    assert torch.equal(out, x * 2)


@pytest.mark.usefixtures("emulated")
def test_the_graph_context_raises_the_invalidated_capture_with_the_sync_as_its_context() -> None:
    x = torch.ones(2)
    with pytest.raises(RuntimeError, match=INVALIDATED) as raised:
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            x.sum().item()
    assert NOT_PERMITTED in str(raised.value.__context__)
    assert torch.cuda.current_stream() is torch.cuda.default_stream()


@pytest.mark.usefixtures("emulated")
def test_work_that_does_not_sync_on_cuda_captures() -> None:
    """Integer indexing and a repeat_interleave with its output size wait for nothing."""
    x, index = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2, 0])
    repeats = torch.tensor([1, 2])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        picked = x[index]
        repeated = torch.repeat_interleave(repeats, repeats, output_size=3)
    graph.replay()
    assert torch.equal(picked, torch.tensor([3.0, 1.0]))
    assert torch.equal(repeated, torch.tensor([1, 2, 2]))


# Random numbers


@pytest.mark.usefixtures("emulated")
def test_a_replay_draws_what_eager_draws_after_the_same_seed_and_the_capture_draws_nothing() -> (
    None
):
    torch.manual_seed(0)
    before = torch.get_rng_state()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        noise = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(7)
    graph.replay()
    first = noise.clone()
    graph.replay()
    second = noise.clone()
    torch.manual_seed(7)
    assert torch.equal(first, torch.rand(4))
    assert torch.equal(second, torch.rand(4))
    assert not torch.equal(first, second)


@pytest.mark.usefixtures("emulated")
def test_a_generator_passed_to_the_graph_behaves_alike() -> None:
    generator = torch.Generator().manual_seed(1)
    before = generator.get_state()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        noise = torch.rand(4, generator=generator)
    assert torch.equal(generator.get_state(), before)
    generator.manual_seed(5)
    graph.replay()
    assert torch.equal(noise, torch.rand(4, generator=torch.Generator().manual_seed(5)))


# Pools


@pytest.mark.usefixtures("emulated")
def test_graphs_in_one_shared_pool_capture_and_replay_in_order() -> None:
    pool = torch.cuda.graph_pool_handle()
    static_x = torch.zeros(3)
    first, hidden = captured(lambda x: x + 1, static_x, pool=pool)
    second, out = captured(lambda h: h * 2, hidden, pool=pool)
    static_x.copy_(torch.tensor([1.0, 2.0, 3.0]))
    first.replay()
    second.replay()
    assert torch.equal(out, torch.tensor([4.0, 6.0, 8.0]))
    assert first.pool() == second.pool() == pool
    assert first.pool_bytes == second.pool_bytes == 3 * 4
    assert pool_bytes(pool) == first.pool_bytes + second.pool_bytes
    first.reset()
    assert pool_bytes(pool) == second.pool_bytes


@pytest.mark.usefixtures("emulated")
def test_a_graph_owns_one_capture_until_reset() -> None:
    graph, x = torch.cuda.CUDAGraph(), torch.ones(2)
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        graph.replay()
    with torch.cuda.graph(graph):
        x + 1
    with pytest.raises(RuntimeError, match="already owns a captured graph"):
        graph.capture_begin()
    graph.reset()
    with torch.cuda.graph(graph, check_input_liveness=True):
        out = x * 5
    graph.replay()
    assert torch.equal(out, torch.full((2,), 5.0))


# make_graphed_callables


@pytest.mark.usefixtures("emulated")
def test_make_graphed_callables_on_a_function_warms_up_then_copies_into_the_sample_args() -> None:
    calls = []

    def function(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return x * 2

    sample = torch.zeros(3)  # the caller's first tensor: the graph's static input from now on
    graphed = torch.cuda.make_graphed_callables(function, (sample,), num_warmup_iters=2)
    assert len(calls) == 2 + 1  # the warm-ups, then the capture
    first = graphed(torch.tensor([1.0, 2.0, 3.0]))
    second = graphed(torch.tensor([4.0, 5.0, 6.0]))
    assert len(calls) == 3  # a call replays; no Python of the function runs
    assert torch.equal(sample, torch.tensor([4.0, 5.0, 6.0]))
    assert torch.equal(second, torch.tensor([8.0, 10.0, 12.0]))
    # torch hands out the static outputs detached: new objects, the same memory.
    assert first.data_ptr() == second.data_ptr() and torch.equal(first, second)


class Counted(torch.nn.Linear):
    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Counted.calls += 1
        return super().forward(x)


@pytest.mark.usefixtures("emulated")
def test_make_graphed_callables_on_a_module_replays_forward_and_backward() -> None:
    torch.manual_seed(0)
    module, eager = Counted(3, 2), torch.nn.Linear(3, 2)
    eager.load_state_dict(module.state_dict())
    Counted.calls = 0
    graphed = torch.cuda.make_graphed_callables(module, (torch.zeros(4, 3),))
    assert Counted.calls == 3 + 1
    x = torch.randn(4, 3)
    out = graphed(x)
    assert Counted.calls == 4
    torch.testing.assert_close(out, eager(x))
    out.pow(2).sum().backward()
    eager(x).pow(2).sum().backward()
    torch.testing.assert_close(module.weight.grad, eager.weight.grad)
    torch.testing.assert_close(module.bias.grad, eager.bias.grad)


# Liveness


@pytest.mark.usefixtures("emulated")
def test_a_replay_after_an_external_input_was_freed_raises_naming_it() -> None:
    static_x = torch.ones(2)
    weight = torch.full((2, 5), 3.0)  # read by the graph, then freed by its only owner
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = static_x @ weight
    graph.replay()
    assert torch.equal(out, torch.full((5,), 6.0))
    del weight
    gc.collect()
    with pytest.raises(RuntimeError, match="1 dead tensor") as raised:
        graph.replay()
    assert "torch.float32 tensor of shape (2x5)" in str(raised.value)
    assert "test_emulation.py" in str(raised.value)  # where the capture first used it


# The stand-ins come and go


def torch_names() -> dict[tuple[str, str], object]:
    import torch.cuda.graphs

    modules = {"torch.cuda": torch.cuda, "torch.cuda.graphs": torch.cuda.graphs}
    names = {"torch.cuda": emulation.CUDA_NAMES, "torch.cuda.graphs": emulation.GRAPH_NAMES}
    return {
        (module, name): vars(modules[module]).get(name)
        for module in modules
        for name in names[module]
    }


def test_the_api_is_put_back_after_the_block_even_when_it_raises() -> None:
    before = torch_names()
    with pytest.raises(ValueError, match="the block's own"):
        with emulated_graphs():
            assert active()
            assert torch.cuda.CUDAGraph is emulation.CUDAGraph
            assert torch.cuda.graphs.graph_pool_handle is emulation.graph_pool_handle
            raise ValueError("the block's own")
    assert not active()
    after = torch_names()
    assert all(after[key] is before[key] for key in before)


def test_scopes_nest_and_the_last_to_close_puts_torch_back() -> None:
    before = torch_names()
    with emulated_graphs():
        with emulated_graphs():
            pass
        assert active() and torch.cuda.graph is emulation.graph
    assert not active()
    assert all(torch_names()[key] is before[key] for key in before)


def test_a_name_patched_again_in_the_scope_is_left_to_its_patcher() -> None:
    original = vars(torch.cuda)["synchronize"]

    def own() -> None:
        """Someone else's patch."""

    try:
        with emulated_graphs():
            torch.cuda.synchronize = own
        assert torch.cuda.synchronize is own
        assert torch.cuda.CUDAGraph is not emulation.CUDAGraph
    finally:
        torch.cuda.synchronize = original


def test_a_second_thread_shares_the_scope_and_not_the_capture() -> None:
    """Captures are per thread: another thread's work is neither recorded nor refused (a real
    "global" capture would refuse its unsafe calls), and it sees no capture underway."""
    seen: dict[str, object] = {}

    def other_thread() -> None:
        with emulated_graphs():
            seen["capturing"] = torch.cuda.is_current_stream_capturing()
            seen["sum"] = (torch.ones(2) + 1).sum().item()
            torch.cuda.synchronize()

    with emulated_graphs():
        x = torch.ones(2)
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin()
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        out = x * 4
        assert torch.cuda.is_current_stream_capturing()
        graph.capture_end()
        assert active()
        graph.replay()
    assert seen == {"capturing": False, "sum": 4.0}
    assert graph.record is not None and len(graph.record.ops) == 1
    assert torch.equal(out, torch.full((2,), 4.0))
    assert not active()


# Streams, events and devices


@pytest.mark.usefixtures("emulated")
def test_streams_events_and_devices_behave_as_torchs_outside_a_capture() -> None:
    side = torch.cuda.Stream()
    assert torch.cuda.current_stream() is torch.cuda.default_stream()
    with torch.cuda.stream(side):
        assert torch.cuda.current_stream() is side
    assert torch.cuda.current_stream() is torch.cuda.default_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    end = side.record_event(end)
    assert end.query() and side.query()
    assert end.elapsed_time(start) <= 0.0 <= start.elapsed_time(end)
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        torch.cuda.Event().elapsed_time(end)
    torch.cuda.synchronize()
    with torch.cuda.device(1):
        assert torch.cuda.current_device() == 1
    assert torch.cuda.current_device() == 0


@pytest.mark.usefixtures("emulated")
def test_the_cuda_generator_is_the_cpus_so_fork_rng_over_the_device_works() -> None:
    """Code that saves and restores the device's generator around a capture (``fork_rng``
    over ``torch.cuda.current_device()``) runs: an emulated device draws from the CPU's."""
    torch.cuda.manual_seed_all(7)
    first = torch.randn(3)
    torch.cuda.manual_seed(7)
    assert torch.equal(torch.randn(3), first)
    saved = torch.cuda.get_rng_state()
    with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
        torch.randn(5)
    assert torch.equal(torch.cuda.get_rng_state(), saved)
    drawn = torch.randn(3)
    torch.cuda.set_rng_state(saved)
    assert torch.equal(torch.randn(3), drawn)


@pytest.mark.usefixtures("emulated")
def test_a_capture_runs_the_kernels_eager_runs_a_modules_fast_path_included() -> None:
    """Nothing the emulation adds around a capture may change what the code runs: a torch
    function mode would turn TransformerEncoder's fast path off inside the capture only."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        expected = layer(x)
        graph, out = captured(layer, x)
        graph.replay()
    assert torch.equal(out, expected)
