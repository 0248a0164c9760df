import torch

from pytest_cudagraph.conformance import graphed_callables


def make_target(device):
    model = torch.nn.Linear(64, 64).to(device).requires_grad_(False)

    def draw(generator, case):  # one call's inputs; case.key is a graph key, an input shape
        return {"x": torch.randn(*case.key, generator=generator, device=device)}

    return graphed_callables(model, device=device, keys=[(n, 64) for n in (1, 2, 4, 8)], draw=draw)
