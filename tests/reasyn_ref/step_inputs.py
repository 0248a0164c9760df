"""A valid bucketed AR step's inputs on the CPU, and the same with one input replaced: what
test_step.py and test_graph_cache.py build their steps from, and the key each shape gives."""

from __future__ import annotations

import torch

from reasyn_ref import DecoderConfig, GraphKey

CONFIG = DecoderConfig.tiny()
# step_inputs shapes and the key each gives: every shape and layout a forward depends on.
KEYED_SHAPES = [
    (dict(batch=4, seq=64, memory_len=64), GraphKey(4, 64, 64, True, True)),
    (dict(batch=1, seq=128, memory_len=256, rows=1), GraphKey(1, 128, 256, True, False)),
    (dict(batch=8, seq=512, memory_len=192, mask=False), GraphKey(8, 512, 192, False, True)),
    (dict(batch=2, rows=2, expanded=False), GraphKey(2, 64, 64, True, False)),
]


def step_inputs(batch=4, seq=64, memory_len=64, rows=3, mask=True, expanded=True):
    """A valid bucketed step on the CPU: memory expanded from one target, as the sampler does."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, CONFIG.vocab_size, (batch, seq), generator=generator)
    memory = torch.randn(1 if expanded else batch, memory_len, CONFIG.d_model, generator=generator)
    memory = memory.expand(batch, -1, -1)
    padding = torch.zeros(batch, memory_len, dtype=torch.bool) if mask else None
    gather = torch.zeros(batch, dtype=torch.long)
    return {
        "tokens": tokens,
        "memory": memory,
        "memory_padding_mask": padding,
        "gather": gather,
        "rows": rows,
    }


def replaced(name, value, **shape):
    """``step_inputs(**shape)`` with input ``name`` replaced by ``value`` (or ``value(inputs)``)."""
    inputs = step_inputs(**shape)
    inputs[name] = value(inputs) if callable(value) else value
    return inputs
