"""One AR step's inputs as one value: ``ARStep`` (tokens, memory, its padding mask, gather and
the number of real rows) and ``GraphKey``, the shapes and layout a captured graph of it depends
on. The eager step, the graph cache, the sampler, the tests and the benchmarks all pass steps
in this form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from .checks import describe


class GraphKey(NamedTuple):
    """Every shape and layout one captured forward depends on. ``shared_memory``: the memory
    is one target's expanded over the batch (batch stride 0, batch > 1)."""

    batch: int
    seq: int
    memory_len: int
    has_mask: bool
    shared_memory: bool = False


@dataclass(frozen=True, eq=False)
class ARStep:
    """The inputs of one AR step in the decoder's layout, all on one device:

    - tokens: long [B, L], each row right-padded;
    - memory: floating [B, M, d] (one target's [1, M, d] expanded over the batch is fine);
    - memory_padding_mask: bool [B, M] (True = padding), or None;
    - gather: long [B], the index of each row's last real token;
    - rows: the first ``rows`` rows are real, the rest bucket padding (1 <= rows <= B).

    Construction checks types, shapes and devices, never values (that would read the device).
    What depends on a model (widths, max_len, token ids) is checked by whoever runs the step.
    """

    tokens: Tensor
    memory: Tensor
    memory_padding_mask: Tensor | None
    gather: Tensor
    rows: int

    def __post_init__(self) -> None:
        batch, _ = check_step_tensors(
            self.tokens, self.memory, self.memory_padding_mask, self.gather
        )
        if isinstance(self.rows, bool) or not isinstance(self.rows, int):
            raise TypeError(f"rows must be an int in [1, B={batch}], got {self.rows!r}")
        if not 1 <= self.rows <= batch:
            raise ValueError(f"rows must be an int in [1, B={batch}], got {self.rows!r}")

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @property
    def key(self) -> GraphKey:
        """The graph key of this step's shapes and layout (whether they are buckets is the
        graph cache's check)."""
        batch, seq = self.tokens.shape
        shared = batch > 1 and self.memory.stride(0) == 0
        return GraphKey(
            batch, seq, self.memory.shape[1], self.memory_padding_mask is not None, shared
        )

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> ARStep:
        """This step on ``device``; an expanded memory stays one target's, expanded there."""

        def move(tensor: Tensor) -> Tensor:
            if tensor.dim() > 1 and tensor.shape[0] > 1 and tensor.stride(0) == 0:
                return tensor[:1].to(device, non_blocking=non_blocking).expand_as(tensor)
            return tensor.to(device, non_blocking=non_blocking)

        mask = self.memory_padding_mask
        return ARStep(
            move(self.tokens),
            move(self.memory),
            None if mask is None else move(mask),
            move(self.gather),
            self.rows,
        )


def as_step(step: ARStep | Tensor, loose: tuple[object, ...], rows: int | None) -> ARStep:
    """``step`` itself, or the step of the loose form ``(tokens, memory, memory_padding_mask,
    gather, rows=...)`` that callers written before ARStep pass (reasyn_ref/targets/reference.py)."""
    if isinstance(step, ARStep):
        if loose or rows is not None:
            raise TypeError("pass an ARStep alone, or tokens, memory, mask, gather and rows=")
        return step
    if len(loose) != 3 or rows is None:
        raise TypeError(
            "expected an ARStep, or tokens, memory, memory_padding_mask, gather and rows="
        )
    memory, memory_padding_mask, gather = loose
    return ARStep(step, memory, memory_padding_mask, gather, rows)  # type: ignore[arg-type]


def check_step_tensors(
    tokens: object,
    memory: object,
    memory_padding_mask: object,
    gather: object,
    *,
    gather_required: bool = True,
) -> tuple[int, int]:
    """Types, dtypes, shapes and devices of one step's tensors (no host sync); returns
    (batch, length). Model-dependent checks (widths, max_len) are the model's."""
    if not isinstance(tokens, Tensor):
        raise TypeError(f"tokens must be a torch.long tensor, got {describe(tokens)}")
    if tokens.dtype != torch.long:
        raise ValueError(f"tokens must be a torch.long tensor, got {describe(tokens)}")
    if tokens.dim() != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be [B >= 1, L >= 1], got shape {tuple(tokens.shape)}")
    batch, length = tokens.shape
    if not isinstance(memory, Tensor):
        raise TypeError(f"memory must be a floating-point tensor, got {describe(memory)}")
    if not memory.is_floating_point():
        raise ValueError(f"memory must be a floating-point tensor, got {describe(memory)}")
    if memory.dim() != 3 or memory.shape[0] != batch or memory.shape[1] < 1:
        raise ValueError(f"memory must be [B={batch}, M >= 1, d], got {tuple(memory.shape)}")
    _check_same_device("memory", memory, tokens)
    if memory_padding_mask is not None:
        if not isinstance(memory_padding_mask, Tensor):
            raise TypeError(
                "memory_padding_mask must be a torch.bool tensor or None, got "
                f"{describe(memory_padding_mask)}"
            )
        if memory_padding_mask.dtype != torch.bool:
            raise ValueError(
                f"memory_padding_mask must be a torch.bool tensor, got {describe(memory_padding_mask)}"
            )
        if memory_padding_mask.shape != memory.shape[:2]:
            raise ValueError(
                f"memory_padding_mask must be [B, M] = {tuple(memory.shape[:2])}, "
                f"got {tuple(memory_padding_mask.shape)}"
            )
        _check_same_device("memory_padding_mask", memory_padding_mask, tokens)
    if gather is None:
        if gather_required:
            raise ValueError("gather is required: each row's last index is read from it")
        return batch, length
    if not isinstance(gather, Tensor):
        raise TypeError(f"gather must be a torch.long tensor, got {describe(gather)}")
    if gather.dtype != torch.long:
        raise ValueError(f"gather must be a torch.long tensor, got {describe(gather)}")
    if gather.shape != (batch,):
        raise ValueError(f"gather must be [B={batch}], got {tuple(gather.shape)}")
    _check_same_device("gather", gather, tokens)
    return batch, length


def _check_same_device(name: str, tensor: Tensor, tokens: Tensor) -> None:
    if tensor.device != tokens.device:
        raise ValueError(f"{name} is on {tensor.device} but tokens are on {tokens.device}")
