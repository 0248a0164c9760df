"""The adapters' examples (examples/compiled_target.py, examples/graphed_callables_target.py)
used wrongly, one way each, to show that the checks meant for those mistakes fail. Use as
``--cudagraph-target broken_adapters:<factory>`` with this folder importable."""

from __future__ import annotations

import torch
from examples import compiled_target, graphed_callables_target
from examples.tiny_model import make_model
from torch import Tensor, nn

from pytest_cudagraph.conformance.target import CudaGraphTarget


def compiled_outputs_kept(device: torch.device) -> CudaGraphTarget:
    """reduce-overhead outputs handed out as they are: the next step overwrites them."""
    return compiled_target.make_target(device, copy_outputs=False)


def graphed_outputs_kept(device: torch.device) -> CudaGraphTarget:
    """make_graphed_callables' static outputs handed out: the next replay overwrites them."""
    return graphed_callables_target.make_target(device, copy_outputs=False)


class CleansItsInput(nn.Module):
    """The model after replacing NaNs in its input in place: inductor does not graph a function
    that mutates an input it does not own. (A CPU tensor no longer makes it skip: since
    torch 2.9 inductor splits CPU work out of the graph and graphs the rest.)"""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input: Tensor) -> Tensor:
        return self.model(input.nan_to_num_())


def compiled_graph_skipped(device: torch.device) -> CudaGraphTarget:
    """A model inductor will not graph (it mutates its input): it runs without graphs, silently."""
    return compiled_target.make_target(device, model=CleansItsInput(make_model(device)))
