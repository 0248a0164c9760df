"""The lean AR step: the decoder's step rewritten for speed, within a stated bf16 tolerance of
the upstream step (``LEAN_TOLERANCE``) rather than bit for bit.

What it saves over the upstream step under autocast: everything runs in bf16 (weights, residual
stream, layer norms: no cast kernels); attention is called directly (flash for the causal
self-attention); the cross-attention keys and values of all layers come from one matmul over one
target's memory, not one per layer over the memory expanded to every row; and the last layer runs
its query, feed-forward and head at each row's gathered position only. ``LeanDecoder`` is a
snapshot of a ``Decoder``'s weights: changing the decoder later does not reach it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import DecoderConfig
from .model import Decoder, check_decoder_inputs, merge_heads, split_heads

# How far the lean step's logits may lie from the upstream bf16-autocast step's: the largest
# absolute difference over the largest absolute upstream logit (the tests hold it to this).
LEAN_TOLERANCE = 3e-2


def _frozen(tensor: Tensor, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(tensor.detach().to(dtype, copy=True), requires_grad=False)


class LeanLayer(nn.Module):
    """One pre-norm decoder layer (``nn.TransformerDecoderLayer``, ReLU) with its weights in
    ``dtype``; attention through ``F.scaled_dot_product_attention``."""

    def __init__(self, layer: nn.TransformerDecoderLayer, dtype: torch.dtype) -> None:
        super().__init__()
        d = layer.self_attn.embed_dim
        self.nhead = layer.self_attn.num_heads
        self.eps = layer.norm1.eps
        cross = layer.multihead_attn
        self.qkv_w = _frozen(layer.self_attn.in_proj_weight, dtype)  # [3 d, d]: q, k, v rows
        self.qkv_b = _frozen(layer.self_attn.in_proj_bias, dtype)
        self.out_w = _frozen(layer.self_attn.out_proj.weight, dtype)
        self.out_b = _frozen(layer.self_attn.out_proj.bias, dtype)
        self.cross_q_w = _frozen(cross.in_proj_weight[:d], dtype)
        self.cross_q_b = _frozen(cross.in_proj_bias[:d], dtype)
        self.cross_out_w = _frozen(cross.out_proj.weight, dtype)
        self.cross_out_b = _frozen(cross.out_proj.bias, dtype)
        self.ff1_w, self.ff1_b = (
            _frozen(layer.linear1.weight, dtype),
            _frozen(layer.linear1.bias, dtype),
        )
        self.ff2_w, self.ff2_b = (
            _frozen(layer.linear2.weight, dtype),
            _frozen(layer.linear2.bias, dtype),
        )
        norms = (layer.norm1, layer.norm2, layer.norm3)
        self.norms = nn.ParameterList(
            _frozen(p, dtype) for norm in norms for p in (norm.weight, norm.bias)
        )

    def forward(
        self, h: Tensor, cross_k: Tensor, cross_v: Tensor, cross_mask: Tensor | None
    ) -> Tensor:
        """Every position: h [B, L, d] -> [B, L, d]."""
        q, k, v = F.linear(self.norm(h, 0), self.qkv_w, self.qkv_b).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(
            self.heads(q), self.heads(k), self.heads(v), is_causal=True
        )
        h = h + F.linear(merge_heads(a), self.out_w, self.out_b)
        return self.cross_and_feed_forward(h, cross_k, cross_v, cross_mask)

    def forward_at(
        self,
        h: Tensor,
        gather: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        cross_mask: Tensor | None,
    ) -> Tensor:
        """Row b at position gather[b] only: h [B, L, d] -> [B, 1, d]. Keys and values still
        come from every position; the one query attends to positions <= gather[b]."""
        batch, length, d = h.shape
        x = self.norm(h, 0)
        k, v = F.linear(x, self.qkv_w[d:], self.qkv_b[d:]).chunk(2, dim=-1)  # [B, L, d] each
        at = gather.view(batch, 1, 1)
        h, x = torch.take_along_dim(h, at, dim=1), torch.take_along_dim(x, at, dim=1)  # [B, 1, d]
        q = F.linear(x, self.qkv_w[:d], self.qkv_b[:d])
        visible = torch.arange(length, device=h.device) <= gather.view(batch, 1, 1, 1)
        a = F.scaled_dot_product_attention(
            self.heads(q), self.heads(k), self.heads(v), attn_mask=visible
        )
        h = h + F.linear(merge_heads(a), self.out_w, self.out_b)
        return self.cross_and_feed_forward(h, cross_k, cross_v, cross_mask)

    def cross_and_feed_forward(
        self, h: Tensor, cross_k: Tensor, cross_v: Tensor, cross_mask: Tensor | None
    ) -> Tensor:
        """The cross-attention and feed-forward blocks with their residuals; h [B, L, d]."""
        q = self.heads(F.linear(self.norm(h, 1), self.cross_q_w, self.cross_q_b))
        a = F.scaled_dot_product_attention(q, cross_k, cross_v, attn_mask=cross_mask)
        h = h + F.linear(merge_heads(a), self.cross_out_w, self.cross_out_b)
        hidden = F.relu(F.linear(self.norm(h, 2), self.ff1_w, self.ff1_b))
        return h + F.linear(hidden, self.ff2_w, self.ff2_b)

    def norm(self, h: Tensor, which: int) -> Tensor:
        weight, bias = self.norms[2 * which], self.norms[2 * which + 1]
        return F.layer_norm(h, h.shape[-1:], weight, bias, self.eps)

    def heads(self, x: Tensor) -> Tensor:
        """[B, L, d] -> [B, H, L, d / H], a view."""
        return split_heads(x, self.nhead)


class LeanDecoder(nn.Module):
    """The lean step of ``decoder``: ``lean(tokens, memory, memory_padding_mask, gather)``
    takes the decoder's inputs (memory in the decoder's dtype, one target's expanded over the
    batch or one per row; gather required) and returns logits [B, vocab] in ``dtype`` at each
    row's gathered position. ``model.ar_step_logits(lean, step, bf16=False)`` runs it as an AR
    step; ``GraphCache(decoder, device, lean=True)`` captures it."""

    def __init__(self, decoder: Decoder, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        if not isinstance(decoder, Decoder):
            raise TypeError(f"decoder must be a reasyn_ref Decoder, got {type(decoder).__name__}")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.config: DecoderConfig = decoder.config
        self.memory_dtype = decoder.embed.weight.dtype
        self.dtype = dtype
        d = self.config.d_model
        layers = decoder.transformer.layers
        self.embed = _frozen(decoder.embed.weight, dtype)
        self.positions = _frozen(decoder.positions, dtype)
        lean_layers = [LeanLayer(layer, dtype) for layer in layers]
        self.layers = nn.ModuleList(lean_layers)  # registered: moved and listed with the model
        self.lean_layers = lean_layers  # the same layers, typed as what they are
        # Every layer's cross-attention key and value rows stacked [layers * 2 d, d]: one matmul.
        cross = [layer.multihead_attn for layer in layers]
        self.cross_kv_w = _frozen(torch.cat([m.in_proj_weight[d:] for m in cross]), dtype)
        self.cross_kv_b = _frozen(torch.cat([m.in_proj_bias[d:] for m in cross]), dtype)
        final = decoder.final_norm
        self.final_w, self.final_b = _frozen(final.weight, dtype), _frozen(final.bias, dtype)
        self.final_eps = final.eps
        head = [m for m in decoder.head if isinstance(m, nn.Linear)]
        self.head = nn.ParameterList(_frozen(p, dtype) for m in head for p in (m.weight, m.bias))
        self.eval()

    def forward(
        self,
        tokens: Tensor,
        memory: Tensor,
        memory_padding_mask: Tensor | None,
        gather: Tensor,
    ) -> Tensor:
        if gather is None:
            raise TypeError(
                "gather must be a torch.long tensor [B]: the lean step runs its last layer there"
            )
        batch, length = check_decoder_inputs(
            self.config, tokens, memory, memory_padding_mask, gather
        )
        if memory.dtype != self.memory_dtype:
            raise ValueError(
                f"memory must be {self.memory_dtype} (the decoder's dtype), got {memory.dtype}"
            )
        h = F.embedding(tokens, self.embed) + self.positions[:length]  # [B, L, d]
        cross_k, cross_v, cross_mask = self.cross_inputs(memory, memory_padding_mask, batch)
        *layers, last = self.lean_layers
        for i, layer in enumerate(layers):
            h = layer(h, cross_k[i], cross_v[i], cross_mask)
        h = last.forward_at(h, gather, cross_k[-1], cross_v[-1], cross_mask).squeeze(1)  # [B, d]
        h = F.layer_norm(h, h.shape[-1:], self.final_w, self.final_b, self.final_eps)
        w1, b1, w2, b2, w3, b3 = self.head
        return F.linear(F.relu(F.linear(F.relu(F.linear(h, w1, b1)), w2, b2)), w3, b3)

    def cross_inputs(
        self, memory: Tensor, memory_padding_mask: Tensor | None, batch: int
    ) -> tuple[list[Tensor], list[Tensor], Tensor | None]:
        """Every layer's cross-attention keys and values [B, H, M, d / H] and the additive
        padding mask [B, 1, 1, M] (None without a mask). A memory expanded over the batch
        (batch stride 0) is projected once and expanded again: its rows are all the same."""
        shared = batch > 1 and memory.stride(0) == 0
        rows = memory[:1] if shared else memory
        kv = F.linear(rows.to(self.dtype), self.cross_kv_w, self.cross_kv_b)  # [1 or B, M, ...]
        per_layer = kv.expand(batch, -1, -1).chunk(len(self.lean_layers), dim=-1)
        keys, values = [], []
        for layer, layer_kv in zip(self.lean_layers, per_layer, strict=True):
            k, v = layer_kv.chunk(2, dim=-1)
            keys.append(layer.heads(k))
            values.append(layer.heads(v))
        if memory_padding_mask is None:
            return keys, values, None
        padding = memory_padding_mask[:1] if shared else memory_padding_mask
        additive = torch.zeros(padding.shape, dtype=self.dtype, device=memory.device)
        additive.masked_fill_(padding, float("-inf"))
        return keys, values, additive.view(-1, 1, 1, memory.shape[1]).expand(batch, -1, -1, -1)
