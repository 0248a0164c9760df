"""The user's side of the decode-step example, gpt-fast style: a small decoder whose static KV
cache is written in place at ``input_pos``, and gpt-fast's generation functions (prefill, one
decode step that samples inside itself with ``exponential_``, the decode loop)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

VOCAB, DIM, HEADS, LAYERS, MAX_SEQ = 128, 64, 4, 2, 64


class KVCache(nn.Module):
    def __init__(self, batch: int, device: torch.device) -> None:
        super().__init__()
        shape = (batch, HEADS, MAX_SEQ, DIM // HEADS)
        self.register_buffer("k_cache", torch.zeros(shape, device=device))
        self.register_buffer("v_cache", torch.zeros(shape, device=device))

    def update(self, input_pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # input_pos: [S], k and v: [B, H, S, D]
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v
        return self.k_cache, self.v_cache


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.wqkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)
        self.ffn = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.SiLU(), nn.Linear(4 * DIM, DIM))
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, input_pos: Tensor, mask: Tensor) -> Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).split(DIM, dim=-1)
        q, k, v = (t.view(batch, seq, HEADS, DIM // HEADS).transpose(1, 2) for t in (q, k, v))
        k, v = self.kv_cache.update(input_pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.wo(y.transpose(1, 2).reshape(batch, seq, DIM))
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.pos_embeddings = nn.Embedding(MAX_SEQ, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)
        self.register_buffer(
            "causal_mask", torch.tril(torch.ones(MAX_SEQ, MAX_SEQ, dtype=torch.bool))
        )

    def setup_caches(self, max_batch_size: int) -> None:
        for layer in self.layers:
            layer.kv_cache = KVCache(max_batch_size, self.causal_mask.device)

    def forward(self, idx: Tensor, input_pos: Tensor) -> Tensor:
        assert self.layers[0].kv_cache is not None, "Caches must be initialized first"
        mask = self.causal_mask[None, None, input_pos]
        x = self.tok_embeddings(idx) + self.pos_embeddings(input_pos)
        for layer in self.layers:
            x = layer(x, input_pos, mask)
        return self.output(self.norm(x))


def make_model(device: torch.device, max_batch_size: int | None = 1) -> Transformer:
    """The decoder with weights from a fixed seed and its caches set up (None: no caches)."""
    torch.manual_seed(0)
    model = Transformer().to(device).eval().requires_grad_(False)
    if max_batch_size is not None:
        model.setup_caches(max_batch_size)
    return model


def multinomial_sample_one_no_sync(probs_sort: Tensor) -> Tensor:  # no CUDA sync
    q = torch.empty_like(probs_sort).exponential_(1)
    return torch.argmax(probs_sort / q, dim=-1, keepdim=True).to(dtype=torch.int)


def sample(logits: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    probs = F.softmax(logits[:, -1] / max(temperature, 1e-5), dim=-1)
    return multinomial_sample_one_no_sync(probs), probs


def prefill(model: Transformer, x: Tensor, input_pos: Tensor) -> Tensor:
    return sample(model(x, input_pos))[0]


def decode_one_token(model: Transformer, x: Tensor, input_pos: Tensor) -> tuple[Tensor, Tensor]:
    # input_pos: [1]
    return sample(model(x, input_pos))


def decode_n_tokens(
    model: Transformer,
    cur_token: Tensor,
    input_pos: Tensor,
    num_new_tokens: int,
    decode=decode_one_token,
) -> tuple[list[Tensor], list[Tensor]]:
    new_tokens, new_probs = [], []
    for _ in range(num_new_tokens):
        next_token, next_prob = decode(model, cur_token, input_pos)
        input_pos += 1
        new_tokens.append(next_token.clone())
        new_probs.append(next_prob.clone())
        cur_token = next_token.clone()
    return new_tokens, new_probs
