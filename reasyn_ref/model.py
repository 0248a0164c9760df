"""The reference decoder and encoder: upstream ReaSyn's AR model, made capture-clean.

The causal mask is built once (a non-persistent buffer sliced per length) and
``tgt_is_causal=True`` / ``memory_is_causal=False`` are passed explicitly, so the forward never
compares masks on the host (upstream's per-call device-to-host sync, which also made the
forward uncapturable). The forward checks shapes, dtypes and devices only: value checks that
would read the device (token ids, NaN memory) belong to the host entry points (the sampler's
``sample``, the encoder), never to the forward a graph captures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from collections.abc import Callable, Mapping
from copy import deepcopy
from typing import TypeVar

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .checks import check_bool, check_int, check_tensor
from .config import DecoderConfig, EncoderConfig
from .step import ARStep, check_step_tensors

Model = TypeVar("Model", bound="Decoder | Encoder")

# Where both models keep their layers: layer i's weights are named LAYERS + f"{i}." + ... in a
# state_dict.
LAYERS = "transformer.layers."


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


def _unless_meta(meta: bool, shape: tuple[int, ...], build: Callable[[], Tensor]) -> Tensor:
    """``build()``, or for a model built on the meta device (a ``skeleton``) an empty tensor of
    ``shape``: a meta tensor holds no values, and computing them there imports torch._dynamo on
    first use (seconds of a fresh process's time)."""
    return torch.empty(shape) if meta else build()


def skeleton(config: DecoderConfig | EncoderConfig) -> Decoder | Encoder:
    """The model of ``config`` with one layer, on the meta device: the name, shape and dtype of
    every weight it holds (layer weights once, as layer 0's), with nothing allocated or computed.
    What a checkpoint's weights are checked against before any model is built from them."""
    one_layer = dataclasses.replace(config, num_layers=1)
    with torch.device("meta"), _FillsSkipped():
        if isinstance(one_layer, DecoderConfig):
            return Decoder(one_layer)
        return Encoder(one_layer)


def with_weights(build: Callable[[], Model], weights: Mapping[str, Tensor]) -> Model:
    """``build()``'s model holding the tensors of ``weights`` themselves as its parameters (no
    copies, their dtypes kept; every name and shape must be the model's), in eval mode on the
    CPU. The model is built on the meta device with torch's default init skipped, so nothing is
    allocated or drawn only to be overwritten; then its buffers (the position table, the causal
    mask) are computed."""
    with torch.device("meta"), _FillsSkipped():
        model = build()
    model.load_state_dict(weights, assign=True)
    model._build_buffers()
    model.eval()
    return model


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

    positions: Tensor  # [max_len, d] sinusoidal table (a buffer)
    causal: Tensor  # [max_len, max_len] additive causal mask (a buffer)

    def __init__(self, config: DecoderConfig) -> None:
        if not isinstance(config, DecoderConfig):
            raise TypeError(f"config must be a DecoderConfig, got {type(config).__name__}")
        super().__init__()
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d)
        self._build_buffers()
        layer = nn.TransformerDecoderLayer(**_layer_options(config))
        self.transformer = nn.TransformerDecoder(layer, config.num_layers, norm=nn.LayerNorm(d))
        self.head = nn.Sequential(
            nn.Linear(d, 2 * d),
            nn.ReLU(),
            nn.Linear(2 * d, 2 * d),
            nn.ReLU(),
            nn.Linear(2 * d, config.vocab_size),
        )

    @property
    def final_norm(self) -> nn.LayerNorm:
        """The LayerNorm closing the transformer (always built; torch types it optional)."""
        norm = self.transformer.norm
        if not isinstance(norm, nn.LayerNorm):
            raise TypeError(f"the decoder's transformer has no final LayerNorm, got {norm!r}")
        return norm

    def forward(
        self,
        tokens: Tensor,
        memory: Tensor,
        memory_padding_mask: Tensor | None = None,
        gather: Tensor | None = None,
    ) -> Tensor:
        """Logits [B, vocab] of the head at ``h[arange(B), gather]`` (gather defaults to L - 1).

        Shapes, dtypes and devices are always checked (free). Token and gather values are
        checked only for CPU inputs: on a GPU that check would be the device-to-host sync this
        forward exists to avoid, so callers that stage GPU inputs check values on the host copy
        (``check_token_values``). Under autocast the memory and its mask are converted once
        for all layers rather than in each (``cross_attention_inputs``; same results).
        """
        device_type = tokens.device.type if isinstance(tokens, Tensor) else "cpu"
        autocast = torch.is_autocast_enabled(device_type)
        batch, length = check_decoder_inputs(
            self.config, tokens, memory, memory_padding_mask, gather
        )
        if not autocast and memory.dtype != self.embed.weight.dtype:
            raise ValueError(
                f"memory must be {self.embed.weight.dtype} (the decoder's dtype) outside "
                f"autocast, got {memory.dtype}"
            )
        if device_type == "cpu":
            check_token_values(self.config, tokens, gather)
        memory_mask = None
        if autocast:
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

    def _build_buffers(self) -> None:
        """The position table and causal mask: non-persistent, so not in checkpoints."""
        max_len, d_model, meta = self.config.max_len, self.config.d_model, self.embed.weight.is_meta
        table = _unless_meta(
            meta, (max_len, d_model), lambda: sinusoidal_positions(max_len, d_model)
        )
        mask = _unless_meta(meta, (max_len, max_len), lambda: causal_mask(max_len))
        self.register_buffer("positions", table, persistent=False)
        self.register_buffer("causal", mask, persistent=False)

    def _embed(self, tokens: Tensor, length: int) -> Tensor:
        return self.embed(tokens) + self.positions[:length]

    def _head_at(self, h: Tensor, gather: Tensor | None, batch: int, length: int) -> Tensor:
        if gather is None:
            last = h[:, length - 1]
        else:  # row b's hidden state at position gather[b]: one gather kernel
            last = torch.take_along_dim(h, gather.view(batch, 1, 1), dim=1).squeeze(1)
        return self.head(last)


def seeded_decoder(
    config: DecoderConfig,
    seed: int,
    device: torch.device | str = "cpu",
    *,
    portable: bool = True,
) -> Decoder:
    """A decoder with random weights from ``seed``, in eval mode on ``device``; see
    ``seeded_init`` (``portable=False`` draws them on ``device``)."""
    draw_on = "cpu" if check_bool("portable", portable) else device
    return seeded_init(lambda: Decoder(config), seed, draw_on=draw_on).to(device)


def seeded_encoder(config: EncoderConfig, seed: int, device: torch.device | str = "cpu") -> Encoder:
    """An encoder with random weights from ``seed``, in eval mode on ``device``."""
    return seeded_init(lambda: Encoder(config), seed).to(device)


def seeded_init(
    build: Callable[[], Model], seed: int, *, draw_on: torch.device | str = "cpu"
) -> Model:
    """``build()``'s model with weights drawn from a generator of its own seeded with
    ``seed``, in eval mode on ``draw_on``: the same weights from any thread, and the global RNG
    is neither read nor changed. Drawn on the CPU (the default), a seed gives the same weights
    wherever the model goes next; drawn on a GPU they take milliseconds instead of seconds, but
    differ from the CPU's (another generator). The model is built on ``draw_on`` with torch's
    default init skipped, then its parameters are drawn module by module, children first,
    with the scale of torch's default init (Linear: uniform +-1/sqrt(fan_in); attention:
    Xavier uniform input projection, zero biases; LayerNorm: ones and zeros; Embedding:
    standard normal) and its buffers rebuilt."""
    check_int("seed", seed, minimum=0)
    draw_on = torch.device(draw_on)
    with torch.device(draw_on), _FillsSkipped():
        model = build()
    # Built on the CPU wherever the weights are drawn: the buffers are not saved in checkpoints,
    # so a loaded copy rebuilds them there, and must get the same bits.
    model._build_buffers()
    generator = torch.Generator(draw_on).manual_seed(seed)
    with torch.no_grad():
        # Children before parents, so that a parent's init has the last word, as in torch's
        # (attention zeroes its output projection's bias).
        for module in reversed(list(model.modules())):
            _draw_parameters(module, generator)
    model.to(draw_on).eval()  # both in place, as for every module
    return model


class _FillsSkipped(TorchFunctionMode):
    """Skips the fills of torch's default init while a model is built for weights of another
    origin: drawn by ``seeded_init`` (its parameters are allocated and left for
    ``_draw_parameters``, and the global RNG is not touched), or given by ``with_weights`` and
    checked against a ``skeleton`` on the meta device, where a fill would run as a Python
    reference whose first call imports torch._dynamo (seconds of a fresh process's time)."""

    FILLS = frozenset(
        {"normal_", "uniform_", "trunc_normal_", "fill_", "zero_", "constant_", "ones_", "zeros_"}
        | {"kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_"}
    )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in self.FILLS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def _draw_parameters(module: nn.Module, generator: torch.Generator) -> None:
    """Draw ``module``'s own parameters (not its children's) from ``generator``."""
    if isinstance(module, nn.Linear):
        bound = 1 / math.sqrt(module.in_features)
        module.weight.uniform_(-bound, bound, generator=generator)
        if module.bias is not None:
            module.bias.uniform_(-bound, bound, generator=generator)
    elif isinstance(module, nn.MultiheadAttention):
        fan_out, fan_in = module.in_proj_weight.shape
        bound = math.sqrt(6 / (fan_in + fan_out))
        module.in_proj_weight.uniform_(-bound, bound, generator=generator)
        module.in_proj_bias.zero_()
        module.out_proj.bias.zero_()
    elif isinstance(module, nn.LayerNorm):
        module.weight.fill_(1.0)
        module.bias.zero_()
    elif isinstance(module, nn.Embedding):
        module.weight.normal_(0.0, 1.0, generator=generator)
        if module.padding_idx is not None:
            module.weight[module.padding_idx].zero_()
    elif any(True for _ in module.parameters(recurse=False)):
        raise TypeError(f"seeded_init does not know how to draw {type(module).__name__}")


class Encoder(nn.Module):
    """SMILES tokens -> memory for the decoder, once per target."""

    positions: Tensor  # [max_len, d] sinusoidal table (a buffer)

    def __init__(self, config: EncoderConfig, d_model: int | None = None) -> None:
        if not isinstance(config, EncoderConfig):
            raise TypeError(f"config must be an EncoderConfig, got {type(config).__name__}")
        super().__init__()
        if d_model is not None and d_model != config.d_model:
            raise ValueError(f"encoder d_model {config.d_model} != decoder d_model {d_model}")
        self.config = config
        d = config.d_model
        self.embed = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token)
        self._build_buffers()
        layer = nn.TransformerEncoderLayer(**_layer_options(config))
        # Nested tensors would make the output depend on how torch's fused encoder kernels
        # handle padding.
        self.transformer = nn.TransformerEncoder(
            layer, config.num_layers, norm=nn.LayerNorm(d), enable_nested_tensor=False
        )

    def _build_buffers(self) -> None:
        max_len, d_model, meta = self.config.max_len, self.config.d_model, self.embed.weight.is_meta
        table = _unless_meta(
            meta, (max_len, d_model), lambda: sinusoidal_positions(max_len, d_model)
        )
        self.register_buffer("positions", table, persistent=False)

    def forward(self, smiles: Tensor) -> tuple[Tensor, Tensor]:
        """smiles: long [T, S] (pad = config.pad_token) -> (memory [T, S, d], padding mask [T, S]).

        The encoder runs once per target, on the host's schedule, so it also checks values
        (a host read on a GPU): ids inside the vocabulary, and no row of only padding (its
        attention would have nothing to attend to, and its memory would be all NaN).
        """
        smiles = check_tensor("smiles", smiles, torch.long)
        if smiles.dim() != 2 or smiles.shape[0] < 1 or smiles.shape[1] < 1:
            raise ValueError(
                f"smiles must be [targets >= 1, length >= 1], got {tuple(smiles.shape)}"
            )
        if smiles.shape[1] > self.config.max_len:
            raise ValueError(
                f"smiles length {smiles.shape[1]} exceeds max_len {self.config.max_len}"
            )
        lo, hi = int(smiles.min()), int(smiles.max())
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(
                f"smiles holds token ids in [{lo}, {hi}]; vocab is [0, {self.config.vocab_size})"
            )
        padding = smiles == self.config.pad_token
        empty = padding.all(dim=1).nonzero().view(-1).tolist()
        if empty:
            raise ValueError(
                f"smiles row {empty[0]} holds only pad tokens ({self.config.pad_token}): "
                "every target needs at least one real token"
            )
        h = self.embed(smiles) + self.positions[: smiles.shape[1]]
        return self.transformer(h, src_key_padding_mask=padding), padding


def expand_memory(memory: Tensor, padding_mask: Tensor, batch: int) -> tuple[Tensor, Tensor]:
    """One target's memory [1, M, d] and mask [1, M] viewed over ``batch`` rows, no copy."""
    check_int("batch", batch, minimum=1)
    memory = check_tensor("memory", memory, None)
    padding_mask = check_tensor("memory_padding_mask", padding_mask, torch.bool)
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
    """Shape, dtype and device checks of a forward's inputs (no host sync), those a step's
    tensors need (``check_step_tensors``) plus the config's widths; returns (batch, length)."""
    batch, length = check_step_tensors(
        tokens, memory, memory_padding_mask, gather, gather_required=False
    )
    if length > config.max_len:
        raise ValueError(f"tokens length {length} exceeds max_len {config.max_len}")
    if memory.shape[2] != config.d_model:
        raise ValueError(
            f"memory must be [B={batch}, M, d_model={config.d_model}], got {tuple(memory.shape)}"
        )
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


class _CudnnAttentionOff:
    """Turns cuDNN attention off while any AR step runs on CUDA; a context manager.

    Why: inside a CUDA graph, cuDNN's fused attention (torch's first choice on Hopper) leaves
    the device idle before each launch, where flash and memory-efficient attention start
    promptly (docs/benchmarks.md, "What replay efficiency is made of"). Eager steps and graphs
    run under the same switch, so they still compute the same thing.

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


def ar_step_logits(decoder: nn.Module, step: ARStep, *, bf16: bool) -> Tensor:
    """The eager AR step that the graph cache captures: fp32 logits of ``step``'s real rows
    (the rest are bucket padding), as a tensor of its own. ``decoder`` is a ``Decoder`` (with
    ``bf16``: under bf16 autocast) or a ``lean.LeanDecoder`` (bf16 itself: ``bf16=False``)."""
    if not isinstance(step, ARStep):
        raise TypeError(f"step must be an ARStep, got {type(step).__name__}")
    with step_context(step.device, check_bool("bf16", bf16)):
        logits = decoder(step.tokens, step.memory, step.memory_padding_mask, step.gather)
    return logits[: step.rows].to(torch.float32, copy=True)


def with_bf16_matmul_weights(decoder: Decoder) -> Decoder:
    """A copy of ``decoder`` whose matmul weights and biases (every Linear and the attention
    input projections) are stored in bf16; layer norms and the embedding stay fp32.

    Under bf16 autocast the copy computes bit-identical results: autocast casts each matmul
    operand to bf16 on every call (its weight cache is off, as graphs need), and a cast made
    once gives the same values. What changes is the work: no cast kernel per weight per step,
    which in a captured graph is a third of its kernels. The copy is a snapshot: changing the
    decoder's weights later does not reach it.
    """
    if not isinstance(decoder, Decoder):
        raise TypeError(f"decoder must be a reasyn_ref Decoder, got {type(decoder).__name__}")
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


def split_heads(t: Tensor, heads: int) -> Tensor:
    """[B, T, d] -> [B, heads, T, d / heads], a view."""
    batch, length, d = t.shape
    return t.view(batch, length, heads, d // heads).transpose(1, 2)


def merge_heads(t: Tensor) -> Tensor:
    """[B, heads, T, head_dim] -> [B, T, d]."""
    batch, heads, length, head_dim = t.shape
    return t.transpose(1, 2).reshape(batch, length, heads * head_dim)
