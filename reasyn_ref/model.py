"""The reference decoder and encoder: upstream ReaSyn's AR model, made capture-clean.

Upstream builds a causal mask on every forward and leaves ``tgt_is_causal=None``, so
``nn.TransformerDecoder`` compares that mask with a fresh one and calls ``bool(...)`` on the
result: a device-to-host sync per forward, which also makes the forward uncapturable. Here the
mask is built once (a non-persistent buffer sliced per length) and ``tgt_is_causal=True`` /
``memory_is_causal=False`` are passed explicitly, so no comparison runs.
"""

from __future__ import annotations

import contextlib
import math
import threading
from copy import deepcopy

import torch
from torch import Tensor, nn

from .config import DecoderConfig, EncoderConfig


def sinusoidal_positions(max_len: int, d_model: int) -> Tensor:
    """The classic sin/cos position table, [max_len, d_model]."""
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: d_model // 2])
    return table


def causal_mask(size: int) -> Tensor:
    """Float mask with -inf above the diagonal, as nn.Transformer builds it."""
    return torch.triu(torch.full((size, size), float("-inf")), diagonal=1)


def _layer_options(config: DecoderConfig | EncoderConfig) -> dict:
    """Upstream's layer settings: pre-norm, batch-first, no dropout (inference only)."""
    return {
        "d_model": config.d_model,
        "nhead": config.nhead,
        "dim_feedforward": config.dim_feedforward,
        "dropout": 0.0,
        "batch_first": True,
        "norm_first": True,
    }


class Decoder(nn.Module):
    """Token embedding + positions -> pre-norm TransformerDecoder -> MLP head at one position."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d)
        self.register_buffer("positions", sinusoidal_positions(config.max_len, d), persistent=False)
        self.register_buffer("causal", causal_mask(config.max_len), persistent=False)
        layer = nn.TransformerDecoderLayer(**_layer_options(config))
        self.transformer = nn.TransformerDecoder(layer, config.num_layers, norm=nn.LayerNorm(d))
        self.head = nn.Sequential(
            nn.Linear(d, 2 * d),
            nn.ReLU(),
            nn.Linear(2 * d, 2 * d),
            nn.ReLU(),
            nn.Linear(2 * d, config.vocab_size),
        )

    def forward(
        self,
        tokens: Tensor,
        memory: Tensor,
        memory_padding_mask: Tensor | None = None,
        gather: Tensor | None = None,
    ) -> Tensor:
        """Logits [B, vocab] of the head at ``h[arange(B), gather]`` (gather defaults to L - 1).

        Shapes and dtypes are always checked (free). Token and gather values are checked only
        for CPU inputs: on a GPU that check would be the device-to-host sync this forward exists
        to avoid, so callers that stage GPU inputs check values on the host copy
        (``check_token_values``). Under autocast the memory and its mask are converted once
        for all layers rather than in each (``cross_attention_inputs``; same results).
        """
        batch, length = check_decoder_inputs(
            self.config, tokens, memory, memory_padding_mask, gather
        )
        if tokens.device.type == "cpu":
            check_token_values(self.config, tokens, gather)
        memory_mask = None
        device_type = tokens.device.type
        if torch.is_autocast_enabled(device_type):
            memory, memory_mask = cross_attention_inputs(
                memory,
                memory_padding_mask,
                self.config.nhead,
                length,
                torch.get_autocast_dtype(device_type),
            )
            memory_padding_mask = None  # now inside memory_mask
        mask = self.causal[:length, :length]
        h = self._embed(tokens, length)
        h = self.transformer(
            h,
            memory,
            tgt_mask=mask,
            memory_mask=memory_mask,
            memory_key_padding_mask=memory_padding_mask,
            tgt_is_causal=True,
            memory_is_causal=False,
        )
        return self._head_at(h, gather, batch, length)

    def forward_upstream(
        self,
        tokens: Tensor,
        memory: Tensor,
        memory_padding_mask: Tensor | None = None,
        gather: Tensor | None = None,
    ) -> Tensor:
        """Upstream's forward, kept as the contrast the checks must catch: a fresh mask every
        call and ``tgt_is_causal`` left as None (a host sync per call; not capturable)."""
        batch, length = check_decoder_inputs(
            self.config, tokens, memory, memory_padding_mask, gather
        )
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        h = self._embed(tokens, length)
        h = self.transformer(h, memory, tgt_mask=mask, memory_key_padding_mask=memory_padding_mask)
        return self._head_at(h, gather, batch, length)

    def _embed(self, tokens: Tensor, length: int) -> Tensor:
        return self.embed(tokens) + self.positions[:length]

    def _head_at(self, h: Tensor, gather: Tensor | None, batch: int, length: int) -> Tensor:
        if gather is None:
            last = h[:, length - 1]
        else:  # row b's hidden state at position gather[b]: one gather kernel
            last = torch.take_along_dim(h, gather.view(batch, 1, 1), dim=1).squeeze(1)
        return self.head(last)


def seeded_decoder(config: DecoderConfig, seed: int) -> Decoder:
    """A decoder with random weights from ``seed``, in eval mode; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Decoder(config).eval()


class Encoder(nn.Module):
    """SMILES tokens -> memory for the decoder, once per target."""

    def __init__(self, config: EncoderConfig, d_model: int | None = None) -> None:
        super().__init__()
        if d_model is not None and d_model != config.d_model:
            raise ValueError(f"encoder d_model {config.d_model} != decoder d_model {d_model}")
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token)
        self.register_buffer("positions", sinusoidal_positions(config.max_len, d), persistent=False)
        layer = nn.TransformerEncoderLayer(**_layer_options(config))
        # Nested tensors would make the output depend on the fast path's padding handling.
        self.transformer = nn.TransformerEncoder(
            layer, config.num_layers, norm=nn.LayerNorm(d), enable_nested_tensor=False
        )

    def forward(self, smiles: Tensor) -> tuple[Tensor, Tensor]:
        """smiles: long [T, S] (pad = config.pad_token) -> (memory [T, S, d], padding mask [T, S])."""
        if smiles.dtype != torch.long:
            raise ValueError(f"smiles must be torch.long, got {smiles.dtype}")
        if smiles.dim() != 2 or smiles.shape[1] < 1:
            raise ValueError(f"smiles must be [targets, length >= 1], got {tuple(smiles.shape)}")
        if smiles.shape[1] > self.config.max_len:
            raise ValueError(
                f"smiles length {smiles.shape[1]} exceeds max_len {self.config.max_len}"
            )
        if smiles.device.type == "cpu" and smiles.numel():
            lo, hi = int(smiles.min()), int(smiles.max())
            if lo < 0 or hi >= self.config.vocab_size:
                raise ValueError(
                    f"smiles holds token ids in [{lo}, {hi}]; vocab is [0, {self.config.vocab_size})"
                )
        padding = smiles == self.config.pad_token
        h = self.embed(smiles) + self.positions[: smiles.shape[1]]
        return self.transformer(h, src_key_padding_mask=padding), padding


def expand_memory(memory: Tensor, padding_mask: Tensor, batch: int) -> tuple[Tensor, Tensor]:
    """One target's memory [1, M, d] and mask [1, M] viewed over ``batch`` rows, no copy."""
    if memory.dim() != 3 or memory.shape[0] != 1:
        raise ValueError(f"memory must be one target [1, M, d], got {tuple(memory.shape)}")
    if padding_mask.shape != memory.shape[:2]:
        raise ValueError(
            f"memory_padding_mask shape {tuple(padding_mask.shape)} != {tuple(memory.shape[:2])}"
        )
    return memory.expand(batch, -1, -1), padding_mask.expand(batch, -1)


def check_decoder_inputs(
    config: DecoderConfig,
    tokens: Tensor,
    memory: Tensor,
    memory_padding_mask: Tensor | None,
    gather: Tensor | None,
) -> tuple[int, int]:
    """Shape, dtype and device checks (no host sync); returns (batch, length)."""
    if not isinstance(tokens, Tensor) or tokens.dtype != torch.long:
        raise ValueError(f"tokens must be a torch.long tensor, got {_describe(tokens)}")
    if tokens.dim() != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be [B >= 1, L >= 1], got shape {tuple(tokens.shape)}")
    batch, length = tokens.shape
    if length > config.max_len:
        raise ValueError(f"tokens length {length} exceeds max_len {config.max_len}")
    if not isinstance(memory, Tensor) or not memory.is_floating_point():
        raise ValueError(f"memory must be a floating-point tensor, got {_describe(memory)}")
    if memory.dim() != 3 or memory.shape[0] != batch or memory.shape[2] != config.d_model:
        raise ValueError(
            f"memory must be [B={batch}, M, d_model={config.d_model}], got {tuple(memory.shape)}"
        )
    _check_same_device("memory", memory, tokens)
    if memory_padding_mask is not None:
        if not isinstance(memory_padding_mask, Tensor) or memory_padding_mask.dtype != torch.bool:
            raise ValueError(
                f"memory_padding_mask must be a torch.bool tensor, got {_describe(memory_padding_mask)}"
            )
        if memory_padding_mask.shape != memory.shape[:2]:
            raise ValueError(
                f"memory_padding_mask must be [B, M] = {tuple(memory.shape[:2])}, "
                f"got {tuple(memory_padding_mask.shape)}"
            )
        _check_same_device("memory_padding_mask", memory_padding_mask, tokens)
    if gather is not None:
        if not isinstance(gather, Tensor) or gather.dtype != torch.long:
            raise ValueError(f"gather must be a torch.long tensor, got {_describe(gather)}")
        if gather.shape != (batch,):
            raise ValueError(f"gather must be [B={batch}], got {tuple(gather.shape)}")
        _check_same_device("gather", gather, tokens)
    return batch, length


def check_token_values(config: DecoderConfig, tokens: Tensor, gather: Tensor | None) -> None:
    """Value checks (a host read): token ids inside the vocabulary, gather inside [0, L)."""
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= config.vocab_size:
        raise ValueError(
            f"tokens holds ids in [{lo}, {hi}]; the vocabulary is [0, {config.vocab_size})"
        )
    if gather is not None:
        length = tokens.shape[1]
        glo, ghi = int(gather.min()), int(gather.max())
        if glo < 0 or ghi >= length:
            raise ValueError(f"gather holds [{glo}, {ghi}]; it must lie in [0, L={length})")


def _check_same_device(name: str, tensor: Tensor, tokens: Tensor) -> None:
    if tensor.device != tokens.device:
        raise ValueError(f"{name} is on {tensor.device} but tokens are on {tokens.device}")


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


class _CudnnAttentionOff:
    """Turns cuDNN attention off while any AR step runs on CUDA; a context manager.

    Why: inside a CUDA graph, cuDNN's fused attention (torch's first choice on Hopper) comes
    with a memset node and leaves about 5 us idle before each launch. With 20 attention calls
    per step that was most of a replay's idle time on the H200 (docs/benchmarks.md).
    Without it, SDPA picks flash attention for the causal self-attention and memory-efficient
    attention for the masked cross-attention, which start as promptly as any other kernel.
    Eager steps and graphs run under the same switch, so they still compute the same thing.

    The switch is torch's process-wide flag, so its users are counted: the first to enter turns
    it off, the last to leave puts back the setting found on entry, in whatever order threads
    leave. Attention run by other code while a step is in flight sees the flag off too.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._setting_on_entry = True

    def __enter__(self) -> None:
        with self._lock:
            if self._users == 0:
                self._setting_on_entry = torch.backends.cuda.cudnn_sdp_enabled()
                torch.backends.cuda.enable_cudnn_sdp(False)
            self._users += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                torch.backends.cuda.enable_cudnn_sdp(self._setting_on_entry)


CUDNN_ATTENTION_OFF = _CudnnAttentionOff()


def step_context(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    """What one AR step runs under: no grad; on CUDA, cuDNN attention off
    (``CUDNN_ATTENTION_OFF``) and, with ``bf16``, bf16 autocast with its weight cache off (as
    upstream; a cached cast would be baked into a captured graph)."""
    with contextlib.ExitStack() as stack:  # exits what it entered if a later enter fails
        stack.enter_context(torch.no_grad())
        if device.type == "cuda":
            stack.enter_context(CUDNN_ATTENTION_OFF)
            if bf16:
                autocast = torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
                stack.enter_context(autocast)
        return stack.pop_all()


def ar_step_logits(
    decoder: Decoder,
    tokens: Tensor,
    memory: Tensor,
    memory_padding_mask: Tensor | None,
    gather: Tensor,
    *,
    rows: int,
    bf16: bool,
) -> Tensor:
    """The eager AR step that the graph cache captures: fp32 logits of the first ``rows`` rows
    (the rest are bucket padding), as a tensor of its own."""
    with step_context(tokens.device, bf16):
        logits = decoder(tokens, memory, memory_padding_mask, gather)
    return logits[:rows].to(torch.float32, copy=True)


def with_bf16_matmul_weights(decoder: Decoder) -> Decoder:
    """A copy of ``decoder`` whose matmul weights and biases (every Linear and the attention
    input projections) are stored in bf16; layer norms and the embedding stay fp32.

    Under bf16 autocast the copy computes bit-identical results: autocast casts each matmul
    operand to bf16 on every call (its weight cache is off, as graphs need), and a cast made
    once gives the same values. What changes is the work: no cast kernel per weight per step,
    which in a captured graph is a third of its kernels. The copy is a snapshot: changing the
    decoder's weights later does not reach it.
    """
    copy = deepcopy(decoder)
    for module in copy.modules():
        if isinstance(module, nn.Linear):
            names = ("weight", "bias")
        elif isinstance(module, nn.MultiheadAttention):
            names = ("in_proj_weight", "in_proj_bias")
        else:
            continue
        for name in names:
            param = getattr(module, name)
            if param is not None:
                param.data = param.data.to(torch.bfloat16)
    return copy.eval()


def cross_attention_inputs(
    memory: Tensor,
    memory_padding_mask: Tensor | None,
    nhead: int,
    length: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor | None]:
    """The memory and the attention mask that every cross-attention layer makes from its
    inputs under autocast to ``dtype``, made once: (memory, mask [B * nhead, length, M] or
    None). A decoder given these (the mask as ``memory_mask``, no key padding mask) computes
    bit-identical results with four or five fewer kernels per layer.

    Each layer's attention casts the memory, viewed sequence-first, with ``.to(dtype)``; here the
    same cast runs once on the same view, so the result has the very layout each layer makes
    (the layout picks the matmul path). Each layer also turns the bool padding mask into a
    float one (0 kept, -inf padded), repeats it per head, and has SDPA cast it to ``dtype``
    and broadcast it over the queries; here it is built in ``dtype`` directly (0 and -inf are
    exact in any float type) and broadcast as a view, which is what SDPA's kernel is handed.
    """
    batch, memory_len = memory.shape[:2]
    memory = memory.transpose(0, 1).to(dtype).transpose(0, 1)
    if memory_padding_mask is None:
        return memory, None
    per_head = torch.zeros(batch, nhead, 1, memory_len, dtype=dtype, device=memory.device)
    per_head.masked_fill_(memory_padding_mask.view(batch, 1, 1, memory_len), float("-inf"))
    return memory, per_head.view(batch * nhead, 1, memory_len).expand(-1, length, -1)
