"""Broken twins of the bugs that break CUDA graphs in the wild, one class each: every twin is
the reference or one of the examples wrong in one way, right in every answer the other checks
compare, and failed by the check meant for its class (test_broken_zoo_targets.py runs the suite
on each on a GPU).

- ``caller_tensors_as_static_inputs`` (the graphed layer): the caller's tensors become the
  graph's static inputs (inputs unchanged).
- ``padding_in_a_batch_scale`` (the reference): its graphs scale the memory by a statistic of
  the whole padded batch (padded batches).
- ``shared_pool_calibration`` (the hand-written cache): one memory pool for every graph, and a
  tensor kept in it (replay order).
- ``lookup_by_real_size`` (the bucket runner): a batch that is not a bucket size runs eagerly
  (graphs used); ``lookup_by_real_size_declared`` says so (its control: it passes).
- ``warm_up_updates_batch_norm`` (the graphed layer): make_graphed_callables' warm-ups update
  a batch norm's running statistics (module state).
- ``weights_reloaded_by_assignment`` (the graphed layer): weights reloaded by assignment, the
  graph still on the old ones (no rebound tensors).
- ``stale_slot_after_a_bucket_switch`` (the reference): a decode's fast path that skips the
  prefix where a graph never held it (trajectory).

Use as ``--cudagraph-target broken_zoo_targets:<factory>`` with this folder importable. Each
factory builds on the CPU too (without the graphs), for the checks that need no GPU.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref

import torch
from torch import Tensor, nn

from pytest_cudagraph.conformance import (
    NEXT_CALL_OF_KEY,
    SINGLE,
    Cache,
    Case,
    CudaGraphTarget,
    Fallbacks,
    graphed_callables,
    graphs_on,
    hand_written,
)
from pytest_cudagraph.conformance._adapters import Draw
from pytest_cudagraph.examples import (
    bucket_runner_target,
    graphed_layer_target,
    hand_written_target,
)
from pytest_cudagraph.examples.bucket_runner import BUCKETS, BucketRunner
from pytest_cudagraph.examples.encoder_cache import D_MODEL, EncoderGraphCache, Entry, make_encoder
from reasyn_ref import ARStep
from reasyn_ref.graph_cache import GraphCache, GraphEntry
from reasyn_ref.targets.reference import ReferenceTarget

SHAPE = graphed_layer_target.SHAPE


def draw_hidden_states(device: torch.device) -> Draw:
    """The graphed layer's draw: hidden states of the key's shape."""

    def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"hidden_states": torch.randn(*case.key, generator=generator, device=device)}

    return draw


def shape_of(inputs: dict[str, Tensor]) -> tuple[int, ...]:
    return tuple(inputs["hidden_states"].shape)


# Inputs unchanged


def caller_tensors_as_static_inputs(device: torch.device) -> CudaGraphTarget:
    """The layer through make_graphed_callables with the caller's first tensors as its sample
    arguments (petals' design): they become the graph's static inputs, and every later call of
    that shape copies its inputs into them, rewriting what the first caller still holds."""
    layer, eager_layer = make_encoder(device), make_encoder(device)
    graphs: dict[tuple[int, ...], object] = {}
    lock = threading.Lock()

    def graphed(inputs: dict[str, Tensor]) -> Tensor:
        x = inputs["hidden_states"]
        with lock, torch.no_grad():
            if shape_of(inputs) not in graphs:
                graphs[shape_of(inputs)] = torch.cuda.make_graphed_callables(
                    lambda hidden: layer(hidden), (x,)
                )
            return graphs[shape_of(inputs)](x)

    def eager(inputs: dict[str, Tensor]) -> Tensor:
        with torch.no_grad():
            return eager_layer(inputs["hidden_states"])

    def reset() -> None:
        with lock:
            graphs.clear()

    return hand_written(
        device=device,
        eager=eager,
        graphed=graphed if graphs_on(device) else None,
        keys=[SHAPE],
        draw=draw_hidden_states(device),
        key_of=shape_of,
        cache=Cache(reset=reset, lock=lock, capacity=1),
        output_lifetime=NEXT_CALL_OF_KEY,
    )


# Padded batches


def batch_scaled(memory: Tensor) -> Tensor:
    """``memory`` divided and multiplied again by a power of two taken from its largest
    magnitude over the whole batch, as a per-tensor scale for a low-precision step is: exact for
    finite values (a power of two), NaN everywhere once any row, a padded one too, holds NaN."""
    largest = memory.abs().amax().clamp(min=torch.finfo(memory.dtype).tiny)
    scale = torch.exp2(torch.floor(torch.log2(largest)))
    return memory / scale * scale


class BatchScaledMemory(GraphCache):
    """Its graphs scale the memory by a statistic of every row of the bucket, the padded rows
    included (``batch_scaled``): right while the padding is finite, NaN in every real row once
    a padded row holds NaN."""

    def static_step(self, entry: GraphEntry) -> Tensor:
        return super().static_step(dataclasses.replace(entry, memory=batch_scaled(entry.memory)))


def padding_in_a_batch_scale(device: torch.device) -> CudaGraphTarget:
    return ReferenceTarget(device, cache_class=BatchScaledMemory).as_target()


# Replay order


class SharedPoolCalibration(EncoderGraphCache):
    """Captures every graph into one shared memory pool (vLLM's runner does, to save memory)
    and scales each key's input by a calibration vector (ones) allocated inside the key's
    capture and written once, after it. That memory comes from the pool, where an earlier key's
    capture freed its temporaries; that key's replays still write them there: a key replayed
    after it reads its calibration overwritten."""

    def __init__(self, encoder: nn.Module, device: torch.device, capacity: int = 3) -> None:
        super().__init__(encoder, device, capacity)
        self.pool = torch.cuda.graph_pool_handle()

    def forward(self, entry: Entry) -> Tensor:
        return self.encoder(entry.x * entry.gain * entry.calibration)

    def warm_up(self, entry: Entry) -> None:
        entry.calibration = torch.ones_like(entry.gain)  # until the capture gives it pool memory
        super().warm_up(entry)

    def capture(self, entry: Entry) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.side_stream):
            entry.calibration = torch.empty_like(entry.gain)  # from the shared pool
            entry.out = self.forward(entry)
        entry.calibration.fill_(1.0)  # once, outside the graph
        entry.graph = graph

    def clear(self) -> None:
        super().clear()
        # torch refuses a capture into a pool that every graph sharing it has let go of.
        self.pool = torch.cuda.graph_pool_handle()


def shared_pool_calibration(device: torch.device) -> CudaGraphTarget:
    """Called from one thread (so the concurrency check, whose threads interleave keys, does
    not run into the same fault)."""
    target = hand_written_target.make_target(device, cache_class=SharedPoolCalibration)
    return dataclasses.replace(target, threads=SINGLE)


# Graphs used


class LookupByRealSize(BucketRunner):
    """Looks a batch's graph up by its real size, not its bucket's (SGLang once looked up by a
    raw size graphs stored by shape key): a batch that is not a bucket size runs the model
    eagerly, right and slow."""

    @torch.inference_mode()
    def run(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        if input_ids.size(0) not in self.graphs:
            return self.model(input_ids, positions)
        return super().run(input_ids, positions)


def lookup_by_real_size(device: torch.device) -> CudaGraphTarget:
    return bucket_runner_target.make_target(device, runner_class=LookupByRealSize)


def runs_eagerly_between_buckets(inputs: dict[str, Tensor]) -> bool:
    return len(inputs["input_ids"]) not in BUCKETS


def lookup_by_real_size_declared(device: torch.device) -> CudaGraphTarget:
    """The same runner saying which calls it runs eagerly: counted and reported, it passes."""
    target = lookup_by_real_size(device)
    return dataclasses.replace(
        target, fallbacks=Fallbacks(runs_eagerly=runs_eagerly_between_buckets)
    )


# Module state


class TokenNorm(nn.Module):
    """A batch norm over the hidden size, in training mode: it normalises by each call's own
    statistics and updates its running ones."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(D_MODEL)

    def forward(self, hidden: Tensor) -> Tensor:  # [B, S, D]
        return self.norm(hidden.transpose(1, 2)).transpose(1, 2)


def warm_up_updates_batch_norm(device: torch.device) -> CudaGraphTarget:
    """The layer and a batch norm in training mode through make_graphed_callables, whose three
    warm-ups update the running statistics three more times than the caller called it; the
    answers use each call's own statistics and stay right."""
    layer = nn.Sequential(make_encoder(device), TokenNorm().to(device).requires_grad_(False))
    return graphed_callables(layer, device=device, keys=[SHAPE], draw=draw_hidden_states(device))


# No rebound tensors


class ReloadedByAssignment:
    """The layer graphed whole by make_graphed_callables (which keeps the parameters it was
    graphed with), its weights reloaded from a checkpoint before every call with
    ``load_state_dict(..., assign=True)``: each parameter becomes a new tensor, the graph keeps
    running the old ones, and the answers stay right only while the checkpoint does not
    change."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with torch.no_grad():
            self.layer = make_encoder(self.device)
            self.checkpoint = {name: t.clone() for name, t in self.layer.state_dict().items()}
        self.graphed: nn.Module | None = None

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        x = inputs["hidden_states"]
        with self.lock, torch.no_grad():
            reloaded = {name: tensor.clone() for name, tensor in self.checkpoint.items()}
            self.layer.load_state_dict(reloaded, assign=True)
            if self.graphed is None:
                self.graphed = torch.cuda.make_graphed_callables(self.layer, (x.clone(),))
            return self.graphed(x)


def weights_reloaded_by_assignment(device: torch.device) -> CudaGraphTarget:
    eager_layer = make_encoder(device)

    def eager(inputs: dict[str, Tensor]) -> Tensor:
        with torch.no_grad():
            return eager_layer(inputs["hidden_states"])

    common = dict(
        device=device,
        eager=eager,
        keys=[SHAPE],
        draw=draw_hidden_states(device),
        key_of=shape_of,
        output_lifetime=NEXT_CALL_OF_KEY,
    )
    if not graphs_on(device):
        return hand_written(graphed=None, cache=Cache(capacity=1), **common)
    layer = ReloadedByAssignment(device)
    return hand_written(
        graphed=layer, cache=Cache(reset=layer.reset, lock=layer.lock, capacity=1), **common
    )


# Trajectory


class ContinuedStep(GraphCache):
    """A decode's fast path: when a step continues the last one (the same memory tensor, as one
    target's decode passes it) only each row's newest token is copied into the graph's static
    prefix. The last step is remembered for the whole cache, not per graph, so the first step
    in a new sequence bucket finds a graph whose static prefix never held this decode's."""

    last_memory: weakref.ref[Tensor] | None = None  # not kept alive: a new one is a new target

    def replay(self, entry: GraphEntry, step: ARStep) -> None:
        if self.last_memory is not None and self.last_memory() is step.memory:
            rows = torch.arange(step.tokens.shape[0], device=self.device)
            entry.tokens[rows, step.gather] = step.tokens[rows, step.gather]
            entry.gather.copy_(step.gather)
            self.replay_graph(entry)
        else:
            super().replay(entry, step)
        self.last_memory = weakref.ref(step.memory)

    def clear(self) -> None:
        super().clear()
        self.last_memory = None


def stale_slot_after_a_bucket_switch(device: torch.device) -> CudaGraphTarget:
    return ReferenceTarget(device, cache_class=ContinuedStep).as_target()
