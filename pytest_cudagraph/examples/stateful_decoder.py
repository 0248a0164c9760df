"""The user's side of the stateful decoder example, as a newcomer writes one: a small GPT whose
static KV cache and decode position are buffers it advances itself, one hand-written
``torch.cuda.CUDAGraph`` per batch size around its decode step, and a sampler drawing from a
``torch.Generator`` of its own."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

VOCAB, DIM, HEADS, LAYERS, MAX_SEQ, MAX_BATCH = 96, 32, 2, 2, 24, 4


class TinyGPT(nn.Module):
    """One token per row per call: its keys and values written at ``pos``, attention over the
    positions written so far, ``pos`` advanced by one; ``reset()`` starts a new sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.position = nn.Embedding(MAX_SEQ, DIM)
        self.qkv = nn.ModuleList(nn.Linear(DIM, 3 * DIM) for _ in range(LAYERS))
        self.mlp = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)
        shape = (LAYERS, 2, MAX_BATCH, HEADS, MAX_SEQ, DIM // HEADS)
        self.register_buffer("kv", torch.zeros(shape))
        self.register_buffer("pos", torch.zeros((), dtype=torch.long))

    def reset(self) -> None:
        self.kv.zero_()
        self.pos.zero_()

    def forward(self, tokens: Tensor) -> Tensor:  # tokens [B, 1] -> logits [B, VOCAB]
        batch = tokens.shape[0]
        x = self.embed(tokens) + self.position(self.pos)
        seen = (torch.arange(MAX_SEQ, device=tokens.device) <= self.pos).view(1, MAX_SEQ)
        for layer in range(LAYERS):
            q, k, v = self.qkv[layer](x).view(batch, 1, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
            self.kv[layer, 0, :batch].index_copy_(2, self.pos.view(1), k)
            self.kv[layer, 1, :batch].index_copy_(2, self.pos.view(1), v)
            keys, values = self.kv[layer, 0, :batch], self.kv[layer, 1, :batch]
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=seen)
            x = x + self.mlp[layer](y.transpose(1, 2).reshape(batch, 1, DIM))
        self.pos += 1
        return self.head(x[:, 0])


class GraphedGPT:
    """``model(tokens)`` through one CUDA graph per batch size, captured on its first call after
    warm-ups that leave the model's state as they found it (they run the step for real)."""

    def __init__(self, model: TinyGPT) -> None:
        self.model = model
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Tensor, Tensor]] = {}

    def __call__(self, tokens: Tensor) -> Tensor:
        if tokens.shape[0] not in self.graphs:
            self.graphs[tokens.shape[0]] = self.capture(tokens)
        graph, static_tokens, logits = self.graphs[tokens.shape[0]]
        static_tokens.copy_(tokens)
        graph.replay()
        return logits.clone()

    def capture(self, tokens: Tensor) -> tuple[torch.cuda.CUDAGraph, Tensor, Tensor]:
        static_tokens = tokens.clone()
        saved = {name: buffer.clone() for name, buffer in self.model.named_buffers()}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                self.restore(saved)  # each warm-up from the live state, which it leaves
                self.model(static_tokens)
        torch.cuda.current_stream().wait_stream(stream)
        self.restore(saved)  # the warm-ups' writes undone
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.model(static_tokens)
        return graph, static_tokens, logits

    def restore(self, saved: dict[str, Tensor]) -> None:
        for name, buffer in self.model.named_buffers():
            buffer.copy_(saved[name])

    def clear(self) -> None:
        self.graphs.clear()


class Sampler:
    """The next token of each row, drawn with temperature from a generator of its own."""

    def __init__(self, device: torch.device, temperature: float = 0.8) -> None:
        self.generator = torch.Generator(device).manual_seed(1234)
        self.temperature = temperature

    def __call__(self, logits: Tensor) -> Tensor:
        probabilities = torch.softmax(logits / self.temperature, dim=-1)
        return torch.multinomial(probabilities, 1, generator=self.generator)
