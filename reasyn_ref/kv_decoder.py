"""The KV decoder: AR decoding with a static KV cache, for the weights of a ``Decoder``.

``Decoder`` recomputes the whole prefix at every step, as upstream does. ``KVDecoder``
reads the same modules (the same checkpoints load into it) and computes the same math one token
at a time: each layer's self-attention keys and values are kept in a static cache of
``cache_len`` positions per row, the cross-attention keys and values of the target's memory are
computed once, a prefill runs the right-padded prefixes, and each step feeds one token per row at
that row's own position and writes its keys and values there, in place.

A step reads and writes only ``StepBuffers`` of fixed shapes, so the same step can be captured
once per ``StepKey`` and replayed (``kv_graphs``); ``EagerSteps`` runs it eagerly on
buffers of the very same shapes, which is what makes graphs and eager bit-identical.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_bool, check_int, check_tensor, describe
from .config import DecoderConfig
from .model import Decoder, merge_heads, split_heads, step_context


class StepKey(NamedTuple):
    """The shapes of one set of step buffers: rows (a batch bucket), positions the self-attention
    cache holds per row, and the memory length."""

    batch: int
    cache_len: int
    memory_len: int


@dataclass(eq=False)
class StepBuffers:
    """Everything a KV step reads and writes, in fixed shapes (``L`` layers, ``Bb``
    rows, ``S`` cache positions, ``M`` memory positions, ``d`` the model width):

    inputs: long [2, Bb]; row 0 holds each row's token, row 1 the position it sits at.
    cache: [L, 2, Bb, S, d], the self-attention keys (index 0) and values (1) of each position.
    cross: [L, 2, M, d], the target's cross-attention keys and values, shared by all rows.
    cross_mask: [M], added to the cross-attention scores: 0 for memory, -inf for its padding.
    """

    inputs: Tensor
    cache: Tensor
    cross: Tensor
    cross_mask: Tensor

    @property
    def tokens(self) -> Tensor:
        return self.inputs[0]

    @property
    def positions(self) -> Tensor:
        return self.inputs[1]

    @property
    def key(self) -> StepKey:
        _, _, batch, cache_len, _ = self.cache.shape
        return StepKey(batch, cache_len, self.cross.shape[2])


class LayerWeights(NamedTuple):
    """One ``nn.TransformerDecoderLayer``'s weights, as the blocks of a step read them: the
    tensors themselves (views of the layer's parameters, no copies)."""

    norm1: tuple[Tensor, Tensor]
    self_in: tuple[Tensor, Tensor]  # the packed query, key and value projection
    self_out: tuple[Tensor, Tensor]
    norm2: tuple[Tensor, Tensor]
    cross_query: tuple[Tensor, Tensor]  # the query part of the cross-attention's projection
    cross_out: tuple[Tensor, Tensor]
    norm3: tuple[Tensor, Tensor]
    linear1: tuple[Tensor, Tensor]
    linear2: tuple[Tensor, Tensor]
    eps: float
    heads: int

    @classmethod
    def of(cls, layer: nn.TransformerDecoderLayer) -> LayerWeights:
        d = layer.self_attn.embed_dim
        cross = layer.multihead_attn
        return cls(
            norm1=(layer.norm1.weight, layer.norm1.bias),
            self_in=(layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias),
            self_out=(layer.self_attn.out_proj.weight, layer.self_attn.out_proj.bias),
            norm2=(layer.norm2.weight, layer.norm2.bias),
            cross_query=(cross.in_proj_weight[:d], cross.in_proj_bias[:d]),
            cross_out=(cross.out_proj.weight, cross.out_proj.bias),
            norm3=(layer.norm3.weight, layer.norm3.bias),
            linear1=(layer.linear1.weight, layer.linear1.bias),
            linear2=(layer.linear2.weight, layer.linear2.bias),
            eps=layer.norm1.eps,
            heads=layer.self_attn.num_heads,
        )


def self_attention_inputs(x: Tensor, weights: LayerWeights) -> Tensor:
    """Queries, keys and values [Bb, T, 3d] of ``norm1(x)``: the packed in-projection."""
    normed = F.layer_norm(x, x.shape[-1:], *weights.norm1, weights.eps)
    return F.linear(normed, *weights.self_in)


def rest_of_layer(
    x: Tensor,
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    mask: Tensor | None,
    cross: Tensor,
    cross_mask: Tensor,
    weights: LayerWeights,
) -> Tensor:
    """A layer from its self-attention on: the queries [Bb, T, d] over ``keys`` and ``values``
    [Bb, S, d] (``mask`` added to the scores, or causal where None), the out-projection and
    residual, then the cross-attention over ``cross`` [2, M, d] and the feed-forward block,
    residuals included. Every row attends over the same memory, so the rows' queries go in as
    one sequence [1, Bb * T]: one attention over one copy of the memory's keys and values."""
    batch, length, d = x.shape
    heads = weights.heads
    attended = F.scaled_dot_product_attention(
        split_heads(queries, heads),
        split_heads(keys, heads),
        split_heads(values, heads),
        attn_mask=mask,
        is_causal=mask is None,
    )
    x = x + F.linear(merge_heads(attended), *weights.self_out)
    normed = F.layer_norm(x, (d,), *weights.norm2, weights.eps)
    cross_queries = F.linear(normed, *weights.cross_query)
    attended = F.scaled_dot_product_attention(
        split_heads(cross_queries.reshape(1, batch * length, d), heads),
        split_heads(cross[0].unsqueeze(0), heads),
        split_heads(cross[1].unsqueeze(0), heads),
        attn_mask=cross_mask.view(1, 1, 1, -1),
    )
    x = x + F.linear(merge_heads(attended).view(batch, length, d), *weights.cross_out)
    normed = F.layer_norm(x, (d,), *weights.norm3, weights.eps)
    return x + F.linear(F.relu(F.linear(normed, *weights.linear1)), *weights.linear2)


class KVDecoder:
    """A ``Decoder``'s layers run one token at a time with a KV cache (eval mode, no dropout).

    Each ``nn.TransformerDecoderLayer`` (pre-norm, ReLU) is computed from its own weights:
    ``x += out_proj(attention(norm1(x)))`` over the cache, then the same with ``norm2`` over the
    memory, then ``x += linear2(relu(linear1(norm3(x))))``; the stack's final norm and the MLP
    head follow, as in ``Decoder``. Under autocast each matmul runs in the autocast dtype, which
    is then the dtype of the buffers; without it, the dtype of the attention weights.

    With ``compile_blocks`` a step runs each layer's two blocks (``self_attention_inputs``,
    ``rest_of_layer``) as ``torch.compile``d functions (inductor's fused kernels, fullgraph, one
    compilation per shape), the cache writes between them as they are: fewer, fused kernels,
    whose rounding is inductor's, so such a step matches another such step bit for bit, not
    the plain one. Prefill is always plain.

    Use: ``load_target`` once per target, ``prefill`` once per batch of prefixes, then ``step``
    once per token. Buffers from ``new_buffers`` (or of the same shapes and dtype).

    Inference only: the three run under ``torch.no_grad()`` whatever the caller's grad mode,
    since they write the buffers in place and no gradient is ever taken through them.
    """

    def __init__(self, decoder: Decoder, *, compile_blocks: bool = False) -> None:
        if not isinstance(decoder, Decoder):
            raise TypeError(f"decoder must be a reasyn_ref Decoder, got {type(decoder).__name__}")
        self.decoder = decoder
        self.config = decoder.config
        self.layers: list[nn.TransformerDecoderLayer] = list(decoder.transformer.layers)
        self.compile_blocks = check_bool("compile_blocks", compile_blocks)
        blocks: tuple[Callable[..., Tensor], ...] = (self_attention_inputs, rest_of_layer)
        if compile_blocks:
            blocks = tuple(
                torch.compile(block, mode="default", fullgraph=True, dynamic=False)
                for block in blocks
            )
        self.step_blocks = blocks

    @property
    def device(self) -> torch.device:
        return self.decoder.positions.device

    def compute_dtype(self) -> torch.dtype:
        """The dtype of keys, values and masks: autocast's on this device when it is on, else
        the attention weights' dtype."""
        if torch.is_autocast_enabled(self.device.type):
            return torch.get_autocast_dtype(self.device.type)
        return self.layers[0].self_attn.in_proj_weight.dtype

    def new_buffers(self, key: StepKey, dtype: torch.dtype) -> StepBuffers:
        """Zeroed buffers for ``key`` on the decoder's device, keys and values in ``dtype`` (a
        floating-point dtype: the step's, ``compute_dtype()``): zeros are valid inputs (token 0
        at position 0, memory without padding), so a graph can be captured on them."""
        check_step_key(self.config, key)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        if not dtype.is_floating_point:
            raise ValueError(
                f"dtype must be a floating-point torch.dtype (the step's: keys, values and the "
                f"-inf of masks), got {dtype}"
            )
        layers, d = self.config.num_layers, self.config.d_model
        batch, cache_len, memory_len = key
        device = self.device
        return StepBuffers(
            inputs=torch.zeros(2, batch, dtype=torch.long, device=device),
            cache=torch.zeros(layers, 2, batch, cache_len, d, dtype=dtype, device=device),
            cross=torch.zeros(layers, 2, memory_len, d, dtype=dtype, device=device),
            cross_mask=torch.zeros(memory_len, dtype=dtype, device=device),
        )

    @torch.no_grad()
    def load_target(
        self, buffers: StepBuffers, memory: Tensor, memory_padding_mask: Tensor
    ) -> None:
        """Write one target's cross-attention keys, values and mask into ``buffers``: memory
        [1, M, d] and its padding mask [1, M] (True = padding), M = the buffers' memory_len."""
        self.check_buffers(buffers)
        check_target_memory(self.config, buffers, memory, memory_padding_mask)
        # The step's dtype; under autocast also the decoder's (its embedding's), which autocast
        # casts, as the sampler hands it over.
        accepted = {self.compute_dtype()}
        if torch.is_autocast_enabled(self.device.type):
            accepted.add(self.decoder.embed.weight.dtype)
        if memory.dtype not in accepted:
            names = " or ".join(sorted(map(str, accepted)))
            raise ValueError(
                f"memory must be {names} (the step's dtype, or under autocast the decoder's), "
                f"got {describe(memory)}"
            )
        d = self.config.d_model
        for layer, cross in zip(self.layers, buffers.cross, strict=True):
            attn = layer.multihead_attn
            # The key/value part of the packed projection, as nn.MultiheadAttention splits it.
            keys_values = F.linear(memory[0], attn.in_proj_weight[d:], attn.in_proj_bias[d:])
            cross.copy_(keys_values.view(-1, 2, d).transpose(0, 1))
        buffers.cross_mask.zero_().masked_fill_(memory_padding_mask[0], float("-inf"))

    @torch.no_grad()
    def prefill(self, buffers: StepBuffers, tokens: Tensor, gather: Tensor) -> Tensor:
        """Run the prefixes, tokens long [Bb, P] right-padded (P <= cache_len), and write their
        keys and values at positions [0, P) of every row; returns the logits [Bb, vocab] at
        each row's last real token, ``gather[b]``. Padding past a row's end computes keys and
        values too; the row's steps overwrite them before any query can see them."""
        self.check_buffers(buffers)
        length = check_prefill_inputs(self.config, buffers, tokens, gather)
        x = self.decoder.embed(tokens) + self.decoder.positions[:length]
        for layer, cache, cross in zip(self.layers, buffers.cache, buffers.cross, strict=True):
            weights = LayerWeights.of(layer)
            queries, keys, values = self_attention_inputs(x, weights).chunk(3, dim=-1)
            cache[0, :, :length].copy_(keys)
            cache[1, :, :length].copy_(values)
            x = rest_of_layer(x, queries, keys, values, None, cross, buffers.cross_mask, weights)
        last = torch.take_along_dim(x, gather.view(-1, 1, 1), dim=1).squeeze(1)
        return self.decoder.head(self.decoder.final_norm(last))

    @torch.no_grad()
    def step(self, buffers: StepBuffers) -> Tensor:
        """One token per row: ``buffers.tokens`` at ``buffers.positions``. Writes each row's keys
        and values at its position, attends over positions [0, position] of that row, and
        returns the logits [Bb, vocab]. No host sync and fixed shapes: capturable."""
        self.check_buffers(buffers)
        batch, cache_len, _ = buffers.key
        tokens, positions = buffers.tokens, buffers.positions
        if tokens.device.type == "cpu":
            check_step_values(self.config, buffers)
        x = self.decoder.embed(tokens) + self.decoder.positions.index_select(0, positions)
        x = x.unsqueeze(1)  # [Bb, 1, d]
        # Row b sees cache positions [0, positions[b]]: an index-based mask, built on the device.
        unseen = torch.arange(cache_len, device=positions.device) > positions.unsqueeze(1)
        mask = torch.zeros(batch, 1, 1, cache_len, dtype=buffers.cache.dtype, device=x.device)
        mask.masked_fill_(unseen.view(batch, 1, 1, cache_len), float("-inf"))
        # Row b's slot in a layer's keys (and values) viewed as [Bb * S, d].
        slots = torch.arange(0, batch * cache_len, cache_len, device=positions.device) + positions
        d = self.config.d_model
        project, rest = self.step_blocks
        for layer, cache, cross in zip(self.layers, buffers.cache, buffers.cross, strict=True):
            weights = LayerWeights.of(layer)
            packed = project(x, weights)
            # The row's key and value, side by side in the packed projection, in one copy.
            keys_values = packed[:, 0, d:].view(batch, 2, d).transpose(0, 1)
            cache.view(2, batch * cache_len, d).index_copy_(1, slots, keys_values)
            x = rest(
                x, packed[..., :d], cache[0], cache[1], mask, cross, buffers.cross_mask, weights
            )
        return self.decoder.head(self.decoder.final_norm(x.squeeze(1)))

    def check_buffers(self, buffers: StepBuffers) -> None:
        """Shapes, dtypes and device of ``buffers`` against this decoder (no host sync)."""
        check_step_buffers(self.config, self.device, self.compute_dtype(), buffers)


class StepSlot(Protocol):
    """A set of buffers claimed for one target, and the step that runs on them; ``buffers`` is
    None once the slot was released (a graph's, evicted), which ``claimed`` refuses."""

    @property
    def buffers(self) -> StepBuffers | None: ...

    def step(self, rows: int) -> Tensor:
        """fp32 logits [rows, vocab] of one step on the buffers, a tensor of its own."""
        ...


class StepSource(Protocol):
    """Where a sampler claims a slot per target: ``EagerSteps`` or ``StepGraphCache``."""

    def claim(self, key: StepKey) -> contextlib.AbstractContextManager[StepSlot]: ...


def claimed(slot: StepSlot) -> StepBuffers:
    """The buffers of ``slot``; RuntimeError for a slot used past its claim."""
    if slot.buffers is None:
        raise RuntimeError("this step slot was released: use a slot only inside its claim")
    return slot.buffers


class EagerSteps:
    """Steps run eagerly on fresh buffers of each key's shapes: graphs off. ``claim`` has the
    same form as ``StepGraphCache.claim``, so a sampler runs either without knowing which."""

    def __init__(self, kv: KVDecoder, *, bf16: bool) -> None:
        if not isinstance(kv, KVDecoder):
            raise TypeError(f"kv must be a KVDecoder, got {type(kv).__name__}")
        self.kv = kv
        self.bf16 = check_bool("bf16", bf16)

    @contextlib.contextmanager
    def claim(self, key: StepKey) -> Iterator[StepSlot]:
        with step_context(self.kv.device, self.bf16):
            dtype = self.kv.compute_dtype()
        yield _EagerSlot(self, self.kv.new_buffers(key, dtype))


@dataclass(eq=False)
class _EagerSlot:
    steps: EagerSteps
    buffers: StepBuffers

    def step(self, rows: int) -> Tensor:
        check_int("rows", rows, minimum=1, maximum=self.buffers.key.batch, label="Bb")
        with step_context(self.steps.kv.device, self.steps.bf16):
            logits = self.steps.kv.step(self.buffers)
        return logits[:rows].to(torch.float32, copy=True)


def check_step_key(config: DecoderConfig, key: StepKey) -> None:
    """Each dimension a positive int; the cache no longer than the decoder's positions."""
    if not isinstance(key, tuple) or len(key) != 3:
        raise TypeError(f"key must be a StepKey (batch, cache_len, memory_len), got {key!r}")
    for name, value in zip(StepKey._fields, key, strict=True):
        check_int(f"key.{name}", value, minimum=1)
    if key[1] > config.max_len:
        raise ValueError(f"key.cache_len {key[1]} exceeds the decoder's max_len {config.max_len}")


def check_step_buffers(
    config: DecoderConfig, device: torch.device, dtype: torch.dtype, buffers: StepBuffers
) -> None:
    """Buffers of consistent shapes for ``config``, on ``device``, in ``dtype``."""
    if not isinstance(buffers, StepBuffers):
        raise TypeError(f"buffers must be StepBuffers, got {type(buffers).__name__}")
    for name in ("inputs", "cache", "cross", "cross_mask"):
        if not isinstance(getattr(buffers, name), Tensor):
            raise TypeError(
                f"buffers.{name} must be a tensor, got {describe(getattr(buffers, name))}"
            )
    if buffers.cache.dim() != 5 or buffers.cross.dim() != 4:
        raise ValueError(
            f"buffers.cache must be [L, 2, Bb, S, d] and buffers.cross [L, 2, M, d], got "
            f"{describe(buffers.cache)} and {describe(buffers.cross)}"
        )
    layers, d = config.num_layers, config.d_model
    batch, cache_len, memory_len = buffers.key
    check_step_key(config, buffers.key)
    expected = {
        "inputs": ((2, batch), torch.long),
        "cache": ((layers, 2, batch, cache_len, d), dtype),
        "cross": ((layers, 2, memory_len, d), dtype),
        "cross_mask": ((memory_len,), dtype),
    }
    for name, (shape, want) in expected.items():
        tensor = getattr(buffers, name)
        if tuple(tensor.shape) != shape or tensor.dtype != want:
            raise ValueError(
                f"buffers.{name} must be {want} of shape {shape}, got {tensor.dtype} of shape "
                f"{tuple(tensor.shape)} (step dtype {dtype}: autocast's if on, else the weights')"
            )
        if tensor.device != device:
            raise ValueError(f"buffers.{name} is on {tensor.device}; the decoder is on {device}")
        if not tensor.is_contiguous():
            raise ValueError(f"buffers.{name} must be contiguous: the step writes it in place")


def check_target_memory(
    config: DecoderConfig, buffers: StepBuffers, memory: Tensor, memory_padding_mask: Tensor
) -> None:
    memory_len = buffers.key.memory_len
    shape = (1, memory_len, config.d_model)
    check_tensor("memory", memory, None)
    if tuple(memory.shape) != shape:
        raise ValueError(f"memory must be one target's {shape}, got {tuple(memory.shape)}")
    check_tensor("memory_padding_mask", memory_padding_mask, torch.bool)
    if tuple(memory_padding_mask.shape) != shape[:2]:
        raise ValueError(
            f"memory_padding_mask must be {shape[:2]}, got {tuple(memory_padding_mask.shape)}"
        )
    for name, tensor in (("memory", memory), ("memory_padding_mask", memory_padding_mask)):
        if tensor.device != buffers.cache.device:
            raise ValueError(
                f"{name} is on {tensor.device}; the buffers are on {buffers.cache.device}"
            )


def check_prefill_inputs(
    config: DecoderConfig, buffers: StepBuffers, tokens: Tensor, gather: Tensor
) -> int:
    """tokens long [Bb, P] with P <= cache_len, gather long [Bb]; values checked on the CPU
    only (on a GPU that would be a host sync). Returns P."""
    batch, cache_len, _ = buffers.key
    check_tensor("tokens", tokens, torch.long)
    if tokens.dim() != 2 or tokens.shape[0] != batch or not 1 <= tokens.shape[1] <= cache_len:
        raise ValueError(
            f"tokens must be [Bb={batch}, P] with 1 <= P <= cache_len={cache_len}, got "
            f"{tuple(tokens.shape)}"
        )
    check_tensor("gather", gather, torch.long)
    if gather.shape != (batch,):
        raise ValueError(f"gather must be [Bb={batch}], got {tuple(gather.shape)}")
    for name, tensor in (("tokens", tokens), ("gather", gather)):
        if tensor.device != buffers.cache.device:
            raise ValueError(
                f"{name} is on {tensor.device}; the buffers are on {buffers.cache.device}"
            )
    length = tokens.shape[1]
    if tokens.device.type == "cpu":
        check_ids("tokens", tokens, config.vocab_size)
        check_ids("gather", gather, length)
    return length


def check_step_values(config: DecoderConfig, buffers: StepBuffers) -> None:
    """Token ids inside the vocabulary and positions inside the cache (a host read)."""
    check_ids("tokens", buffers.tokens, config.vocab_size)
    check_ids("positions", buffers.positions, buffers.key.cache_len)


def check_ids(name: str, values: Tensor, bound: int) -> None:
    lo, hi = int(values.min()), int(values.max())
    if lo < 0 or hi >= bound:
        raise ValueError(f"{name} holds values in [{lo}, {hi}]; they must lie in [0, {bound})")
