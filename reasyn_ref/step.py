"""One AR step's inputs as one value: ``ARStep`` (tokens, memory, its padding mask, gather and
the number of real rows) and ``GraphKey``, the shapes and layout a captured graph of it depends
on. The eager step, the graph cache, the sampler, the tests and the benchmarks all pass steps
in this form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from .checks import check_int, check_tensor


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
        check_int("rows", self.rows, minimum=1, maximum=batch, label="B")

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
    tokens = check_tensor("tokens", tokens, torch.long)
    if tokens.dim() != 2 or tokens.shape[0] < 1 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be [B >= 1, L >= 1], got shape {tuple(tokens.shape)}")
    batch, length = tokens.shape
    memory = check_tensor("memory", memory, None)
    if memory.dim() != 3 or memory.shape[0] != batch or memory.shape[1] < 1:
        raise ValueError(f"memory must be [B={batch}, M >= 1, d], got {tuple(memory.shape)}")
    _check_same_device("memory", memory, tokens)
    if memory_padding_mask is not None:
        memory_padding_mask = check_tensor("memory_padding_mask", memory_padding_mask, torch.bool)
        if memory_padding_mask.shape != memory.shape[:2]:
            raise ValueError(
                f"memory_padding_mask must be [B, M] = {tuple(memory.shape[:2])}, "
                f"got {tuple(memory_padding_mask.shape)}"
            )
        _check_same_device("memory_padding_mask", memory_padding_mask, tokens)
    if gather is None:
        if gather_required:
            raise TypeError(
                "gather must be a torch.long tensor [B] (each row's last index), got None"
            )
        return batch, length
    gather = check_tensor("gather", gather, torch.long)
    if gather.shape != (batch,):
        raise ValueError(f"gather must be [B={batch}], got {tuple(gather.shape)}")
    _check_same_device("gather", gather, tokens)
    return batch, length


def _check_same_device(name: str, tensor: Tensor, tokens: Tensor) -> None:
    if tensor.device != tokens.device:
        raise ValueError(f"{name} is on {tensor.device} but tokens are on {tokens.device}")
