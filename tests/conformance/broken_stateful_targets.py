"""Stateful CUDA-graph code shaped like the real thing, right and wrong: gpt-fast's decoder
(examples/decode_model.py) with its static KV cache in module buffers, written in place, one
token a call.

- ``decode_step``: ``decode_one_token`` compiled with ``mode="reduce-overhead"``, each side a
  model of its own (the docs' example, examples/decode_token_target.py): right; it passes
  every check, in any order of checks.
- ``stale_position``: the step in a hand-written graph that copies each call's token into its
  static input, but not its position: every replay writes and reads at the capture's
  position (no baked inputs).
- ``capture_advancing_cache``: a decoder that keeps its position on the device and advances
  it each call (accumulating state), in a graph whose three warm-ups run the step on the live
  cache: the capturing call moves it four positions (capture does not advance state).
- ``accumulating_decode``: the same decoder, its runner putting the state back after the
  warm-ups: right, judged by episodes from ``State.reset``.

Use as ``--cudagraph-target broken_stateful_targets:<factory>`` with this folder importable.
Each factory builds on the CPU too: its eager twin alone, or, given a stand-in of torch's graph
class (``graph_class``, tests/helpers/graph_stand_ins.py), the same code on that stand-in,
whose replay runs the step, for the checks called as functions.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch
from torch import Tensor, nn

from pytest_cudagraph.conformance import (
    Cache,
    Case,
    CudaGraphTarget,
    State,
    graphs_on,
    hand_written,
)
from pytest_cudagraph.examples import decode_token_target
from pytest_cudagraph.examples.decode_model import MAX_SEQ, VOCAB, decode_one_token, make_model

KEY = (1, 1)  # one token of one sequence


class StepGraph:
    """A hand-written graph of ``step`` over static inputs, as a decode runner keeps one: on
    the first call ``warm_ups`` runs of the step and a capture, on every call each of
    ``refreshed`` (every input when None) copied into its static tensor and a replay, whose
    output is copied out. ``undo_warm_ups`` puts ``state``'s buffers back after the warm-ups:
    they were not calls. ``graph_class`` None: torch's CUDA graphs; else a stand-in class,
    whose replay runs the step here."""

    def __init__(
        self,
        step: Callable[..., object],
        state: nn.Module,
        *,
        warm_ups: int = 3,
        refreshed: tuple[str, ...] | None = None,
        undo_warm_ups: bool = False,
        graph_class: type | None = None,
    ) -> None:
        self.step, self.state, self.warm_ups = step, state, warm_ups
        self.refreshed, self.undo_warm_ups, self.graph_class = refreshed, undo_warm_ups, graph_class
        self.graph: object = None
        self.static: dict[str, Tensor] = {}
        self.output: object = None
        self.lock = threading.Lock()

    def __call__(self, inputs: dict[str, Tensor]) -> object:
        with self.lock, torch.no_grad():
            if self.graph is None:
                self.capture(inputs)
            for name in self.refreshed or tuple(inputs):
                self.static[name].copy_(inputs[name])
            self.graph.replay()  # type: ignore[attr-defined]
            if self.graph_class is not None:  # a stand-in replays nothing itself
                self.output = self.step(**self.static)
            return copied(self.output)

    def capture(self, inputs: dict[str, Tensor]) -> None:
        self.static = {name: value.clone() for name, value in inputs.items()}
        saved = [buffer.clone() for buffer in self.state.buffers()]
        if self.graph_class is not None:
            # Warm-ups draw from a copy of torch's generators: the first replay samples what an
            # eager call would (as inductor's graphs, which keep their own random state).
            with torch.random.fork_rng(devices=[]):
                for _ in range(self.warm_ups):
                    self.step(**self.static)
            self.restore(saved)
            graph = self.graph_class()
            graph.capture_begin()
            graph.capture_end()
            self.graph = graph  # kept once its capture succeeded
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.random.fork_rng(devices=[torch.cuda.current_device()]):
            for _ in range(self.warm_ups):
                self.step(**self.static)
        torch.cuda.current_stream().wait_stream(side)
        self.restore(saved)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # records the step; runs nothing
            self.output = self.step(**self.static)
        self.graph = graph  # kept once its capture succeeded

    def drop(self) -> None:
        """The graph let go (the next call captures again); the state stays."""
        with self.lock:
            self.graph, self.static, self.output = None, {}, None

    def restore(self, saved: list[Tensor]) -> None:
        if self.undo_warm_ups:
            for buffer, value in zip(self.state.buffers(), saved, strict=True):
                buffer.copy_(value)


def copied(output: object) -> object:
    if isinstance(output, tuple):
        return tuple(item.clone() for item in output)
    assert isinstance(output, Tensor)
    return output.clone()


def draw_token_at(device: torch.device) -> Callable[[torch.Generator, Case], dict[str, Tensor]]:
    """One token at a random position of the cache (the decode step's inputs)."""

    def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        x = torch.randint(VOCAB, case.key, generator=generator, device=device)
        input_pos = torch.randint(MAX_SEQ, (1,), generator=generator, device=device)
        return {"x": x, "input_pos": input_pos}

    return draw


def draw_token(device: torch.device) -> Callable[[torch.Generator, Case], dict[str, Tensor]]:
    """One token (the decoder that keeps its position)."""

    def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"x": torch.randint(VOCAB, case.key, generator=generator, device=device)}

    return draw


def token_shape(inputs: dict[str, Tensor]) -> tuple[int, ...]:
    return tuple(inputs["x"].shape)


def logits_at(model: nn.Module, x: Tensor, input_pos: Tensor) -> Tensor:
    return model(x, input_pos)[:, -1]


def runner_target(
    device: torch.device,
    build: Callable[[], nn.Module],
    step_of: Callable[[nn.Module], Callable[..., object]],
    draw: Callable[[torch.Generator, Case], dict[str, Tensor]],
    graph_class: type | None,
    reset: Callable[[nn.Module], None] | None = None,
    **runner: object,
) -> CudaGraphTarget:
    """Eager on one model, a ``StepGraph`` on another (None on the CPU without a stand-in),
    each side's model given as its state."""
    eager_model, graphed_model = build(), build()
    graphs = graphs_on(device) or graph_class is not None
    graph = StepGraph(step_of(graphed_model), graphed_model, graph_class=graph_class, **runner)  # type: ignore[arg-type]

    def eager(inputs: dict[str, Tensor]) -> object:
        with torch.no_grad():
            return step_of(eager_model)(**inputs)

    def reset_both() -> None:
        assert reset is not None
        for model in (eager_model, graphed_model):
            reset(model)

    return hand_written(
        device=device,
        eager=eager,
        graphed=graph if graphs else None,
        cache=Cache(reset=graph.drop, lock=graph.lock, capacity=1),
        keys=[KEY],
        draw=draw,
        key_of=token_shape,
        state=State(
            sides=lambda: (eager_model, graphed_model),
            reset=reset_both if reset is not None else None,
        ),
    )


# A decode step over a static KV cache, its position an input


def decode_step(device: torch.device, graph_class: type | None = None) -> CudaGraphTarget:
    """The docs' compiled example; on the CPU with a stand-in, the same step in a graph that
    warms up once, as cudagraph trees do."""
    if graph_class is None:
        return decode_token_target.make_target(device)
    return runner_target(
        device,
        functools.partial(make_model, device),
        lambda model: functools.partial(decode_one_token, model),
        draw_token_at(device),
        graph_class,
        warm_ups=1,
    )


def stale_position(device: torch.device, graph_class: type | None = None) -> CudaGraphTarget:
    """Only the token is copied into the graph's static inputs: the capture's position stays."""
    return runner_target(
        device,
        functools.partial(make_model, device),
        lambda model: functools.partial(logits_at, model),
        draw_token_at(device),
        graph_class,
        refreshed=("x",),
    )


# A decoder that keeps its position on the device: accumulating state


class CountedDecoder(nn.Module):
    """gpt-fast's decoder with its position in a buffer: each call decodes one token there and
    advances it (wrapping at the cache's end), as decoders that own their position do."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.decoder = make_model(device)
        self.register_buffer("position", torch.zeros(1, dtype=torch.long, device=device))

    def forward(self, x: Tensor) -> Tensor:
        logits = self.decoder(x, self.position)[:, -1]
        self.position.add_(1).remainder_(MAX_SEQ)
        return logits


def zero_buffers(model: nn.Module) -> None:
    """A new sequence: the position and the cache zeroed in place (the graph reads them)."""
    for buffer in model.buffers():
        if buffer.dtype != torch.bool:  # the causal mask is no state
            buffer.zero_()


def counted(device: torch.device, graph_class: type | None, undo: bool) -> CudaGraphTarget:
    return runner_target(
        device,
        functools.partial(CountedDecoder, device),
        lambda model: model,
        draw_token(device),
        graph_class,
        reset=zero_buffers,
        undo_warm_ups=undo,
    )


def capture_advancing_cache(
    device: torch.device, graph_class: type | None = None
) -> CudaGraphTarget:
    """The warm-ups run the step on the live cache and position: three steps no one called."""
    return counted(device, graph_class, undo=False)


def accumulating_decode(device: torch.device, graph_class: type | None = None) -> CudaGraphTarget:
    """The runner puts the position and cache back after its warm-ups."""
    return counted(device, graph_class, undo=True)
