"""A small eager function and its CUDA graph, for the GPU tests and the pytest runs in them.

The graph is captured the way a graph cache does it: warm-ups on a side stream, capture,
then each call copies its input into a static buffer and replays.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def make_eager(device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(16, 16, device=device, generator=generator)
    bias = torch.randn(16, device=device, generator=generator)

    def eager(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(torch.tanh(x @ weight + bias) * 2.0, dim=-1)

    return eager


def make_graphed(
    device: torch.device,
    function: Callable[[torch.Tensor], torch.Tensor],
    shape: tuple[int, ...],
    *,
    clone_output: bool = True,
) -> Callable[[torch.Tensor], torch.Tensor]:
    static_input = torch.zeros(shape, device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            function(static_input)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_output = function(static_input)

    def graphed(x: torch.Tensor) -> torch.Tensor:
        static_input.copy_(x)
        graph.replay()
        # The next replay overwrites static_output; without the clone, the trap parity catches.
        return static_output.clone() if clone_output else static_output

    return graphed


def make_inputs(generator: torch.Generator, case: object) -> torch.Tensor:
    return torch.randn(8, 16, device=generator.device, generator=generator)
