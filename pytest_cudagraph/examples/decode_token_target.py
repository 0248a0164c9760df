import torch

from pytest_cudagraph.conformance import compiled
from pytest_cudagraph.examples.decode_model import MAX_SEQ, VOCAB, decode_one_token, make_model


def make_target(device):
    def draw(generator, case):  # one token at a position of the static KV cache
        x = torch.randint(VOCAB, case.key, generator=generator, device=device)
        input_pos = torch.randint(MAX_SEQ, (1,), generator=generator, device=device)
        return {"x": x, "input_pos": input_pos}

    # Each side a model with a KV cache of its own, in module buffers written in place at
    # input_pos: the adapter gives them as State.sides, so every check calls both sides in
    # lockstep and compares their caches after each call.
    return compiled(
        decode_one_token,  # as gpt-fast compiles it: mode="reduce-overhead", fullgraph=True
        fullgraph=True,
        model=lambda: make_model(device),
        device=device,
        keys=[(1, 1)],  # one token of one sequence: one decode graph
        draw=draw,
    )
