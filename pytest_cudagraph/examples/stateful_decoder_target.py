import torch

from pytest_cudagraph.conformance import Cache, State, graphs_on, hand_written
from pytest_cudagraph.examples.stateful_decoder import VOCAB, GraphedGPT, Sampler, TinyGPT


def make_target(device):
    torch.manual_seed(0)  # the same weights in every target made
    models = [TinyGPT().to(device).eval().requires_grad_(False) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())  # alike, each its own KV cache and position
    graphed = GraphedGPT(models[1]) if graphs_on(device) else None  # CUDA, or emulated
    samplers = Sampler(device), Sampler(device)  # each side's own generator

    def step(model, sampler, inputs):  # one decode step: logits, and the token sampled from them
        logits = model(inputs["tokens"])
        return {"logits": logits, "token": sampler(logits)}

    return hand_written(
        device=device,
        eager=lambda inputs: step(models[0], samplers[0], inputs),
        graphed=graphed and (lambda inputs: step(graphed, samplers[1], inputs)),
        keys=[1, 2, 4],  # batch sizes: one graph each
        draw=lambda generator, case: {
            "tokens": torch.randint(VOCAB, (case.key, 1), generator=generator, device=device)
        },
        key_of=lambda inputs: inputs["tokens"].shape[0],
        generators=lambda: [sampler.generator for sampler in samplers],
        state=State(sides=lambda: tuple(models), reset=lambda: [m.reset() for m in models]),
        cache=Cache(reset=graphed and graphed.clear),
    )
