import torch

from examples.tiny_model import make_model  # your model
from pytest_cudagraph.conformance.adapters import compiled

KEYS = [(1, 32), (2, 32), (4, 64), (8, 64)]  # (batch, seq): the shapes your code meets


def make_target(device, model=None, **options):
    def draw(generator, key):
        return {"input": torch.randn(*key, 64, generator=generator, device=device)}

    model = model or make_model(device)
    return compiled(model, device=device, keys=KEYS, draw=draw, **options)
