import torch

from pytest_cudagraph.conformance import Guards, compiled
from pytest_cudagraph.examples import decode_model as gpt  # gpt-fast's model, cut down


def generate(decode, model, inputs):  # gpt-fast's generate for one prompt: 8 new tokens
    input_pos = torch.arange(inputs["prompt"].shape[1], device=inputs["prompt"].device)
    token = gpt.prefill(model, inputs["prompt"], input_pos)
    tokens, probs = gpt.decode_n_tokens(model, token, input_pos[-1:] + 1, 8, decode=decode)
    return {"tokens": torch.cat([token, *tokens], dim=1), "probs": torch.stack(probs)}


def make_target(device):
    def draw(generator, case):  # a prompt of case.key's shape: (batch, tokens)
        return {"prompt": torch.randint(gpt.VOCAB, case.key, generator=generator, device=device)}

    uncached, token = gpt.make_model(device, None), torch.tensor([[0]], device=device)
    no_cache = {"no KV cache": (lambda: uncached(token, token[0]), "Caches must")}
    return compiled(
        gpt.decode_one_token,  # as gpt-fast compiles it: mode="reduce-overhead", fullgraph=True
        fullgraph=True,
        model=lambda: gpt.make_model(device),  # each side a model and KV cache of its own
        call=generate,
        device=device,
        keys=[(1, 8)],  # one decode graph
        draw=draw,
        output_lifetime="owned",  # generate clones each step's outputs
        guards=Guards(no_cache, refusal_errors=(AssertionError,)),  # gpt-fast guards with assert
    )
