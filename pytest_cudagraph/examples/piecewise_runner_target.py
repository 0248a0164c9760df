import torch

from pytest_cudagraph.conformance import Cache, graphs_on, hand_written
from pytest_cudagraph.examples.piecewise_runner import (
    D_MODEL,
    PiecewiseRunner,
    make_layers,
    run_eagerly,
)

SHAPES = [(1, 16, D_MODEL), (2, 32, D_MODEL)]  # (batch, tokens, hidden): a key each


def make_target(device):
    layers = make_layers(device)
    runner = PiecewiseRunner(layers, device) if graphs_on(device) else None  # CUDA, or emulated

    def draw(generator, case):
        return {"hidden": torch.randn(*case.key, generator=generator, device=device)}

    return hand_written(
        device=device,
        eager=lambda inputs: run_eagerly(layers, inputs["hidden"]),
        graphed=runner and (lambda inputs: runner.run(inputs["hidden"])),
        keys=SHAPES,
        draw=draw,
        key_of=lambda inputs: tuple(inputs["hidden"].shape),
        cache=Cache(capacity=len(SHAPES)),  # every shape's graphs kept: one per layer
        threads="single",  # one set of static buffers, no lock
    )
