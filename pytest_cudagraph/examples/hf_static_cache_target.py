import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pytest_cudagraph.conformance import compiled
from pytest_cudagraph.examples.hf_static_cache import static_cache  # transformers 4.45 to 5.x

CONFIG = LlamaConfig(  # a tiny random Llama: 2 layers, hidden 64, vocabulary 128
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def make_model(device):  # the same weights on both sides, a static KV cache each
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG).to(device).eval().requires_grad_(False)
    model.static_cache = static_cache(model, batch=1, length=CONFIG.max_position_embeddings)
    return model


def next_token(model, tokens, cache, position):  # greedy: the most likely next token
    return model(tokens, past_key_values=cache, cache_position=position).logits[:, -1:].argmax(-1)


def generate(decode, model, inputs):  # a prefill, then 7 decode steps through the static cache
    cache, prompt = model.static_cache, inputs["prompt"]
    cache.reset()
    position = torch.arange(prompt.shape[1], device=prompt.device)
    tokens = [next_token(model, prompt, cache, position)]
    for _ in range(7):
        position = position[-1:] + 1
        tokens.append(decode(model, tokens[-1], cache, position).clone())
    return torch.cat(tokens, dim=1)


def make_target(device):
    def draw(generator, case):  # a prompt of case.key's shape: (batch, tokens)
        prompt = torch.randint(CONFIG.vocab_size, case.key, generator=generator, device=device)
        return {"prompt": prompt}

    return compiled(
        next_token,  # the decode step, under torch.compile(mode="reduce-overhead")
        model=lambda: make_model(device),
        call=generate,
        device=device,
        keys=[(1, 8)],  # one decode graph
        draw=draw,
        output_lifetime="owned",  # generate clones each step's token
    )
