import torch

from pytest_cudagraph.conformance import graphed_callables
from pytest_cudagraph.examples.encoder_cache import D_MODEL, make_encoder  # your layer

SHAPE = (1, 16, D_MODEL)  # (batch, tokens, hidden): the one shape the layer is graphed for


def make_target(device):
    def draw(generator, case):
        return {"hidden_states": torch.randn(*case.key, generator=generator, device=device)}

    # The graph returns its static output buffer: output_lifetime="next call of its key".
    return graphed_callables(make_encoder(device), device=device, keys=[SHAPE], draw=draw)
