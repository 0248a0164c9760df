"""The adapters used wrongly, one way each, to show that the checks meant for those mistakes
fail: a small MLP (examples/tiny_model.py) through ``compiled`` and ``graphed_callables`` with a
declared output lifetime the graphs do not keep, a model inductor will not graph, or a layer
of the graphed side that computes otherwise. Use as
``--cudagraph-target broken_adapters:<factory>`` with this folder importable."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from pytest_cudagraph.conformance import (
    NEXT_CALL_OF_KEY,
    OWNED,
    Case,
    CudaGraphTarget,
    compiled,
    graphed_callables,
)
from pytest_cudagraph.examples.tiny_model import make_model

KEYS = [(1, 32), (2, 32), (4, 64), (8, 64)]  # (batch, seq)


def mlp_target(
    adapter: Callable[..., CudaGraphTarget], device: torch.device, **options: object
) -> CudaGraphTarget:
    def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"input": torch.randn(*case.key, 64, generator=generator, device=device)}

    model = options.pop("model", None) or make_model(device)
    return adapter(model, device=device, keys=KEYS, draw=draw, **options)


def compiled_outputs_claimed_owned(device: torch.device) -> CudaGraphTarget:
    """reduce-overhead outputs said to be owned: the next step overwrites them."""
    return mlp_target(compiled, device, output_lifetime=OWNED)


def compiled_outputs_claimed_per_key(device: torch.device) -> CudaGraphTarget:
    """reduce-overhead outputs said to be valid until the next call of their key: the next
    step of any key overwrites them (cudagraph trees share one memory pool)."""
    return mlp_target(compiled, device, output_lifetime=NEXT_CALL_OF_KEY)


def graphed_outputs_claimed_owned(device: torch.device) -> CudaGraphTarget:
    """make_graphed_callables' static outputs said to be owned: the next replay overwrites
    them."""
    return mlp_target(graphed_callables, device, output_lifetime=OWNED)


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
    return mlp_target(compiled, device, model=CleansItsInput(make_model(device)))


class ScaledLinear(nn.Linear):
    """A linear layer whose output is half again what its parameters give: the same state as
    the layer it replaces, other code."""

    def forward(self, input: Tensor) -> Tensor:
        return 1.5 * super().forward(input)


def graphed_layer_off(device: torch.device) -> CudaGraphTarget:
    """The graphed side's second linear layer (module "2") computing otherwise: parity fails,
    and the diagnosis names that module, the first that differs. (Scaling its weight would not
    do: each check starts by copying the graphed side's state, parameters too, into eager's.)"""
    target = mlp_target(graphed_callables, device)
    assert target.state is not None and target.state.sides is not None
    _, graphed_model = target.state.sides()
    layer = graphed_model[2]
    graphed_model[2] = ScaledLinear(layer.in_features, layer.out_features, device=device)
    graphed_model[2].load_state_dict(layer.state_dict())
    graphed_model[2].requires_grad_(False)
    return target
