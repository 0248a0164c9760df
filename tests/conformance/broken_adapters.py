"""The adapters' examples (examples/compiled_target.py, examples/graphed_callables_target.py)
used wrongly, one way each, to show that the checks meant for those mistakes fail. Use as
``--cudagraph-target broken_adapters:<factory>`` with this folder importable."""

from __future__ import annotations

import torch
from examples import compiled_target, graphed_callables_target
from examples.tiny_model import make_model
from torch import Tensor, nn

from pytest_cudagraph.target import CudaGraphTarget


def compiled_outputs_kept(device: torch.device) -> CudaGraphTarget:
    """reduce-overhead outputs handed out as they are: the next step overwrites them."""
    return compiled_target.make_target(device, copy_outputs=False)


def graphed_outputs_kept(device: torch.device) -> CudaGraphTarget:
    """make_graphed_callables' static outputs handed out: the next replay overwrites them."""
    return graphed_callables_target.make_target(device, copy_outputs=False)


class ScaledOnTheCpu(nn.Module):
    """The model with a scale kept on the CPU: inductor skips CUDA graphs for it."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("scale", torch.full((64,), 2.0))
        self.to(device)
        self.scale = self.scale.cpu()

    def forward(self, input: Tensor) -> Tensor:
        return self.model(input) * self.scale.to(input.device)


def compiled_graph_skipped(device: torch.device) -> CudaGraphTarget:
    """A model inductor cannot graph (a CPU tensor in it): it runs without graphs, silently."""
    return compiled_target.make_target(device, model=ScaledOnTheCpu(make_model(device), device))
