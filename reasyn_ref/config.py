"""Model configurations: defaults are the upstream ReaSyn v2 AR model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from .checks import check_int

C = TypeVar("C", bound="_TransformerConfig")

# The longest max_len a model takes: the decoder builds a causal mask of max_len x max_len
# (4096: 64 MiB in fp32), so a config from a file cannot ask for terabytes.
MAX_LEN = 4096


class _TransformerConfig:
    """What the decoder's and the encoder's configs share: the width checks and the dict form
    stored in checkpoints."""

    # Every subclass is a dataclass (what dataclasses.asdict and fields need).
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    d_model: int
    nhead: int
    max_len: int

    def _check_widths(self) -> None:
        _check_types(self)
        name = type(self).__name__
        for field in ("d_model", "nhead", "dim_feedforward", "num_layers", "vocab_size"):
            check_int(f"{name}.{field}", getattr(self, field), minimum=1)
        check_int(f"{name}.max_len", self.max_len, minimum=1, maximum=MAX_LEN, label="MAX_LEN")
        if self.d_model % self.nhead:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by nhead ({self.nhead})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """The config stored as ``to_dict()``; unknown fields and wrong types are refused."""
        return cls(**_known_fields(cls, data))


@dataclass(frozen=True)
class DecoderConfig(_TransformerConfig):
    """The autoregressive decoder: token embedding, sinusoidal positions, 10 pre-norm layers."""

    d_model: int = 768
    nhead: int = 16
    dim_feedforward: int = 4096
    num_layers: int = 10
    vocab_size: int = 272
    max_len: int = 512
    pad_token: int = 0
    start_token: int = 1
    end_token: int = 2
    # Reaction tokens: the part of the vocabulary upstream compares top-k orders over.
    reaction_tokens: tuple[int, int] = (157, 272)
    norm_first: bool = True
    batch_first: bool = True

    def __post_init__(self) -> None:
        self._check_widths()
        for name in ("pad_token", "start_token", "end_token"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"{name} must be in [0, vocab_size={self.vocab_size})")
        if self.start_token == self.end_token:
            raise ValueError(
                f"DecoderConfig.start_token and end_token must differ: every row starts with the "
                f"start token, and a sampler ends a row at its end token; both are "
                f"{self.end_token}"
            )
        lo, hi = self.reaction_tokens
        if not 0 <= lo < hi <= self.vocab_size:
            raise ValueError(f"reaction_tokens {self.reaction_tokens} must lie in [0, vocab_size]")
        if not (self.norm_first and self.batch_first):
            raise ValueError("the reference decoder is pre-norm and batch-first, as upstream")

    @classmethod
    def tiny(cls) -> DecoderConfig:
        """Small widths for fast CPU tests; vocabulary and max_len stay upstream's."""
        return cls(d_model=32, nhead=4, dim_feedforward=64, num_layers=2)


@dataclass(frozen=True)
class EncoderConfig(_TransformerConfig):
    """The SMILES encoder whose output is the decoder's memory."""

    d_model: int = 768
    nhead: int = 16
    dim_feedforward: int = 4096
    num_layers: int = 6
    vocab_size: int = 200
    max_len: int = 256
    pad_token: int = 0

    def __post_init__(self) -> None:
        self._check_widths()
        if not 0 <= self.pad_token < self.vocab_size:
            raise ValueError(f"pad_token must be in [0, vocab_size={self.vocab_size})")

    @classmethod
    def tiny(cls) -> EncoderConfig:
        return cls(d_model=32, nhead=4, dim_feedforward=64, num_layers=2)


def _check_types(config: _TransformerConfig) -> None:
    """Every field has its annotated type: an int field takes no bool or float (``2.5`` or
    ``True`` as a token id would load, and a float end token would never be sampled)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.type == "bool":
            ok = isinstance(value, bool)
        elif f.type == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:  # tuple[int, int]
            ok = (
                isinstance(value, tuple)
                and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            )
        if not ok:
            raise TypeError(f"{type(config).__name__}.{f.name} must be {f.type}, got {value!r}")


def _known_fields(cls: type, data: object) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError(f"a {cls.__name__} must be given as a dict, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names, key=repr)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {', '.join(map(str, unknown))}")
    out = dict(data)
    if isinstance(out.get("reaction_tokens"), list):  # what a stored tuple reads back as
        out["reaction_tokens"] = tuple(out["reaction_tokens"])
    return out
