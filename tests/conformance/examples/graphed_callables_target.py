import torch

from examples.tiny_model import make_model  # your model
from pytest_cudagraph.conformance.adapters import graphed_callables

KEYS = [(1, 32), (2, 32), (4, 64), (8, 64)]  # (batch, seq): one graph per input shape


def make_target(device, **options):
    def draw(generator, key):
        return {"input": torch.randn(*key, 64, generator=generator, device=device)}

    return graphed_callables(make_model(device), device=device, keys=KEYS, draw=draw, **options)
