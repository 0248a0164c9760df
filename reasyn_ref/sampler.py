"""Batched autoregressive sampling over one target's memory, as upstream ReaSyn's AR loop.

Each step lays the unfinished rows out on the host: tokens right-padded with ``pad_token`` and,
with bucketing, the length rounded up to a multiple of 64 and the batch up to a power of two
with dummy rows, and the target's memory padded (masked) to a multiple of 64 positions. That
layout is the same whether CUDA graphs are on or off, so the two are bit-identical. Per step:
one host-to-device copy of the tokens, one of gather (pinned on CUDA), one device-to-host copy
of the sampled tokens.

``batched=False`` is upstream's per-row path: each unfinished row runs alone at its exact
length and draws from the same generator in row order, so its tokens are not expected to match
the batched path's (its logits agree within floating-point tolerance). ``sample`` checks the
target's memory once per call, values included (it reads the device); the step never does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .bucketing import bucket_batch, bucket_memory, bucket_seq
from .checks import check_bool, check_int, check_number, check_tensor, token_rows
from .config import DecoderConfig
from .env import resolve_toggle
from .lean import LeanDecoder
from .model import Decoder, ar_step_logits, check_token_values, expand_memory
from .step import ARStep

if TYPE_CHECKING:
    from .graph_cache import GraphCache

# Logits are divided by the temperature in float32: below the smallest normal float32 the
# divisor would be a subnormal (flushed to zero on some devices) or zero.
MIN_TEMPERATURE = torch.finfo(torch.float32).tiny


@dataclass
class SampleCall:
    """A ``sample`` call's arguments, checked: one target's memory and padding mask, the rows
    to grow (fresh lists of token ids), the caller's generator and the resolved ``max_len``."""

    memory: Tensor
    memory_padding_mask: Tensor
    sequences: list[list[int]]
    generator: torch.Generator
    max_len: int


class TargetSampler:
    """What both samplers share: the decoder (its weights, config and device), the temperature,
    the ``bf16`` and ``cudagraph`` flags (None: from ``REASYN_BF16``, ``REASYN_CUDAGRAPH``), the
    capacity of the graph cache (used with graphs on, checked either way), the checked ``sample``
    call (each sampler decodes in ``_decode``), its host-to-device staging and its draw.

    ``temperature`` is a finite number >= ``MIN_TEMPERATURE`` (about 1.2e-38); a tiny one
    samples the most likely token (ties at random), never NaN: the largest logit is subtracted
    before dividing, so no quotient overflows.

    A sampler builds what its steps run in ``_build_steps``, called last, once every setting is
    resolved: a sampler with settings of its own resolves them before calling this.
    """

    def __init__(
        self,
        decoder: Decoder,
        *,
        temperature: float = 0.1,
        bf16: bool | None = None,
        cudagraph: bool | None = None,
        graph_capacity: int = 3,
    ) -> None:
        if not isinstance(decoder, Decoder):
            raise TypeError(f"decoder must be a reasyn_ref Decoder, got {type(decoder).__name__}")
        self.temperature = check_number("temperature", temperature, minimum=MIN_TEMPERATURE)
        self.graph_capacity = check_int("graph_capacity", graph_capacity, minimum=1)
        self.decoder = decoder
        self.config: DecoderConfig = decoder.config
        self.device = next(decoder.parameters()).device
        self.bf16 = resolve_toggle("REASYN_BF16", bf16)
        self.cudagraph = resolve_toggle("REASYN_CUDAGRAPH", cudagraph)
        self._build_steps()

    def _build_steps(self) -> None:
        """Check the settings against each other and build what the steps run (the decoder's
        copies, the graph cache)."""
        raise NotImplementedError

    def sample(
        self,
        memory: Tensor,
        memory_padding_mask: Tensor,
        prefixes: Sequence[Sequence[int]],
        generator: torch.Generator,
        max_len: int | None = None,
    ) -> list[list[int]]:
        """Each row's full sequence: its prefix plus the sampled tokens, ending with
        ``end_token`` when one was sampled, or at ``max_len`` (default ``config.max_len``).

        memory [1, M, d_model] (the decoder's dtype, finite) and its padding mask [1, M]
        (True = padding; at least one position unmasked) are one target's, shared by every
        row. A prefix that already ends with ``end_token`` or has ``max_len`` tokens is
        returned as it is. Every argument is checked before any work.
        """
        max_len = check_max_len(self.config, max_len)
        check_target(
            self.config,
            self.device,
            self.decoder.embed.weight.dtype,
            memory,
            memory_padding_mask,
            generator,
        )
        sequences = check_prefixes(self.config, prefixes, max_len)
        return self._decode(SampleCall(memory, memory_padding_mask, sequences, generator, max_len))

    def _decode(self, call: SampleCall) -> list[list[int]]:
        """``sample`` on checked arguments: grows ``call.sequences`` and returns them."""
        raise NotImplementedError

    def stage_inputs(self, tokens: Tensor, gather: Tensor) -> tuple[Tensor, Tensor]:
        """The host-to-device copies of a step's layout: one for tokens, one for gather. Every
        step's inputs pass here, so wrapping it observes what a sampler stages."""
        return (
            tokens.to(self.device, non_blocking=True),
            gather.to(self.device, non_blocking=True),
        )

    def _draw(self, logits: Tensor, generator: torch.Generator) -> list[int]:
        """One token per row of ``logits``; the step's one device-to-host copy."""
        # The largest logit subtracted first: no quotient overflows, however small the temperature.
        scaled = (logits - logits.amax(dim=-1, keepdim=True)) / self.temperature
        probs = torch.softmax(scaled, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).cpu().view(-1).tolist()

    def _finished(self, sequence: list[int], max_len: int) -> bool:
        return sequence[-1] == self.config.end_token or len(sequence) >= max_len


class ARSampler(TargetSampler):
    """Samples continuations of token prefixes with a ``Decoder``, one target at a time.

    Flags left as None come from the environment (``REASYN_BATCHED_AR``, ``REASYN_BF16``,
    ``REASYN_BUCKET``, ``REASYN_CUDAGRAPH``); explicit arguments win. The resolved flags are
    the attributes ``batched``, ``bf16``, ``bucket`` and ``cudagraph``. ``temperature``: see
    ``TargetSampler``.

    ``lean=True`` runs the lean step (``lean.LeanDecoder``), eagerly or graphed, instead of the
    upstream step: faster, within ``LEAN_TOLERANCE`` of it rather than equal, so its samples can
    differ from upstream's. It needs the batched bf16 path. Off by default: the upstream step's
    samples are the ones upstream's users know, bit for bit.
    """

    def __init__(
        self,
        decoder: Decoder,
        *,
        temperature: float = 0.1,
        batched: bool | None = None,
        bf16: bool | None = None,
        bucket: bool | None = None,
        cudagraph: bool | None = None,
        graph_capacity: int = 3,
        lean: bool = False,
    ) -> None:
        self.batched = resolve_toggle("REASYN_BATCHED_AR", batched)
        self.bucket = resolve_toggle("REASYN_BUCKET", bucket)
        self.lean = check_bool("lean", lean)
        super().__init__(
            decoder,
            temperature=temperature,
            bf16=bf16,
            cudagraph=cudagraph,
            graph_capacity=graph_capacity,
        )

    def _build_steps(self) -> None:
        if self.cudagraph:
            check_graph_settings(
                batched=self.batched, bucket=self.bucket, bf16=self.bf16, device=self.device
            )
        if self.lean and not (self.batched and self.bf16):
            raise ValueError(
                "lean=True needs batched=True and bf16=True (REASYN_BATCHED_AR=1, REASYN_BF16=1):"
                " the lean step is the batched step in bf16"
            )
        self.graph_cache: GraphCache | None = None
        self.lean_decoder: LeanDecoder | None = None
        if self.cudagraph:
            from .graph_cache import GraphCache  # only graph runs need it

            self.graph_cache = GraphCache(
                self.decoder, self.device, lean=self.lean, capacity=self.graph_capacity
            )
        elif self.lean:
            self.lean_decoder = LeanDecoder(self.decoder)

    def _decode(self, call: SampleCall) -> list[list[int]]:
        memory, memory_padding_mask = call.memory, call.memory_padding_mask
        if self.bucket:
            memory, memory_padding_mask = pad_memory(memory, memory_padding_mask)
        sequences, generator, max_len = call.sequences, call.generator, call.max_len
        active = [i for i, seq in enumerate(sequences) if not self._finished(seq, max_len)]
        while active:
            rows = [sequences[i] for i in active]
            if self.batched:
                drawn = self._step(rows, memory, memory_padding_mask, generator, bucket=self.bucket)
            else:
                drawn = [
                    self._step([row], memory, memory_padding_mask, generator, bucket=False)[0]
                    for row in rows
                ]
            for i, token in zip(active, drawn, strict=True):
                sequences[i].append(token)
            active = [i for i in active if not self._finished(sequences[i], max_len)]
        return sequences

    def step_logits(self, step: ARStep) -> Tensor:
        """fp32 logits [step.rows, vocab] of one AR step; rows past ``step.rows`` are bucket
        padding. Runs the graph cache when graphs are on, the eager step otherwise; each
        checks what it needs of the step against the decoder."""
        if not isinstance(step, ARStep):
            raise TypeError(f"step must be an ARStep, got {type(step).__name__}")
        if self.graph_cache is not None:
            return self.graph_cache(step)
        if self.lean_decoder is not None:
            return ar_step_logits(self.lean_decoder, step, bf16=False)
        return ar_step_logits(self.decoder, step, bf16=self.bf16)

    def _step(
        self,
        rows: list[list[int]],
        memory: Tensor,
        memory_padding_mask: Tensor,
        generator: torch.Generator,
        *,
        bucket: bool,
    ) -> list[int]:
        """One AR step for ``rows``: lay out, stage, run, sample; one token per row."""
        tokens, gather = pad_rows(
            rows, self.config, bucket=bucket, pin_memory=self.device.type == "cuda"
        )
        check_token_values(self.config, tokens, gather)
        tokens, gather = self.stage_inputs(tokens, gather)
        step_memory, step_mask = expand_memory(memory, memory_padding_mask, tokens.shape[0])
        logits = self.step_logits(ARStep(tokens, step_memory, step_mask, gather, len(rows)))
        return self._draw(logits, generator)


def check_max_len(config: DecoderConfig, max_len: int | None) -> int:
    """``max_len`` of a ``sample`` call, resolved: config.max_len when None."""
    if max_len is None:
        return config.max_len
    return check_int("max_len", max_len, minimum=1, maximum=config.max_len, label="config.max_len")


def check_target(
    config: DecoderConfig,
    device: torch.device,
    dtype: torch.dtype,
    memory: Tensor,
    memory_padding_mask: Tensor,
    generator: torch.Generator,
) -> None:
    """One target's memory [1, M >= 1, d_model] of the decoder's ``dtype``, finite, and its
    padding mask [1, M] with a position unmasked, and a generator, all on the decoder's
    ``device``. The value checks read the device: a host entry point's check, once per call."""
    d_model = config.d_model
    check_tensor("memory", memory, dtype)
    if memory.dim() != 3 or memory.shape[0] != 1 or memory.shape[1] < 1:
        raise ValueError(
            f"memory must be one target's [1, M >= 1, d_model={d_model}], got {tuple(memory.shape)}"
        )
    if memory.shape[2] != d_model:
        raise ValueError(
            f"memory must be [1, M >= 1, d_model={d_model}], got {tuple(memory.shape)}"
        )
    check_tensor("memory_padding_mask", memory_padding_mask, torch.bool)
    if memory_padding_mask.shape != memory.shape[:2]:
        raise ValueError(
            f"memory_padding_mask must be [1, M] = {tuple(memory.shape[:2])}, got "
            f"{tuple(memory_padding_mask.shape)}"
        )
    for name, tensor in (("memory", memory), ("memory_padding_mask", memory_padding_mask)):
        if tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device}; the decoder is on {device}")
    rule = f"a torch.Generator on the decoder's device {device}"
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be {rule}, got {type(generator).__name__}")
    if _indexed(generator.device) != device:
        raise ValueError(f"generator must be {rule}, got one on {generator.device}")
    if bool(memory_padding_mask.all()):
        raise ValueError("memory_padding_mask masks every position: nothing to attend to")
    if not bool(torch.isfinite(memory).all()):
        raise ValueError("memory holds NaN or infinite values")


def pad_rows(
    rows: Sequence[Sequence[int]], config: DecoderConfig, *, bucket: bool, pin_memory: bool = False
) -> tuple[Tensor, Tensor]:
    """The host layout of one AR step: tokens [Bb, Lb] right-padded with ``pad_token`` and
    gather [Bb] = each row's last index. With ``bucket``, Bb = bucket_batch(rows) and
    Lb = bucket_seq(longest), and the rows past the real ones are dummies ([start_token] +
    padding, gather 0); without it Bb is the row count and Lb the longest row."""
    longest = max(len(row) for row in rows)
    if bucket:
        batch, length = bucket_batch(len(rows)), bucket_seq(longest, config.max_len)
    else:
        batch, length = len(rows), longest
    pad = config.pad_token
    dummies = batch - len(rows)
    padded = [list(row) + [pad] * (length - len(row)) for row in rows]
    padded += [[config.start_token] + [pad] * (length - 1)] * dummies
    gather = [len(row) - 1 for row in rows] + [0] * dummies
    return (
        torch.tensor(padded, dtype=torch.long, pin_memory=pin_memory),
        torch.tensor(gather, dtype=torch.long, pin_memory=pin_memory),
    )


def pad_memory(memory: Tensor, memory_padding_mask: Tensor) -> tuple[Tensor, Tensor]:
    """One target's memory [1, M, d] and mask padded to ``bucket_memory(M)`` positions; the new
    positions are zeros and masked. Done once per ``sample`` call, on both the eager and the
    graph path, so the two see the same layout."""
    length = memory.shape[1]
    extra = bucket_memory(length) - length
    if extra == 0:
        return memory, memory_padding_mask
    memory = torch.nn.functional.pad(memory, (0, 0, 0, extra))
    memory_padding_mask = torch.nn.functional.pad(memory_padding_mask, (0, extra), value=True)
    return memory, memory_padding_mask


def check_prefixes(
    config: DecoderConfig, prefixes: Sequence[Sequence[int]], max_len: int
) -> list[list[int]]:
    """The prefixes as fresh lists of int token ids (``checks.token_rows``), each of length at
    most ``max_len`` with ids in the vocabulary."""
    sequences = [list(row) for row in token_rows("prefixes", prefixes)]
    for i, row in enumerate(sequences):
        if len(row) > max_len:
            raise ValueError(
                f"prefixes[{i}] has length {len(row)}; it must be in [1, max_len={max_len}]"
            )
        outside = [token for token in row if not 0 <= token < config.vocab_size]
        if outside:
            raise ValueError(
                f"prefixes[{i}] holds token id {outside[0]}; the vocabulary is "
                f"[0, {config.vocab_size})"
            )
    return sequences


def check_graph_settings(*, batched: bool, bucket: bool, bf16: bool, device: torch.device) -> None:
    """cudagraph=True is defined only on the path the graphs capture, on a CUDA device."""
    needs = (
        ("batched", batched, "REASYN_BATCHED_AR", "graphs capture the batched step"),
        ("bucket", bucket, "REASYN_BUCKET", "graphs are captured per bucketed shape"),
        ("bf16", bf16, "REASYN_BF16", "graphs capture the bf16 autocast path"),
    )
    for name, on, variable, why in needs:
        if not on:
            raise ValueError(f"cudagraph=True needs {name}=True ({variable}=1): {why}")
    if not torch.cuda.is_available():
        raise ValueError("cudagraph=True needs CUDA, and torch.cuda.is_available() is False")
    if device.type != "cuda":
        raise ValueError(f"cudagraph=True needs the decoder on a CUDA device, it is on {device}")


def _indexed(device: torch.device) -> torch.device:
    """``torch.Generator(device="cuda")`` reports plain "cuda": it means the current device."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
