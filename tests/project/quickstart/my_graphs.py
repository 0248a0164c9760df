import torch

from pytest_cudagraph.conformance.adapters import graphed_callables


def make_target(device):
    model = torch.nn.Linear(64, 64).to(device).requires_grad_(False)

    def draw(generator, key):  # one call's inputs for a graph key, here an input shape
        return {"x": torch.randn(*key, generator=generator, device=device)}

    return graphed_callables(model, device=device, keys=[(n, 64) for n in (1, 2, 4, 8)], draw=draw)
