"""reasyn_ref: a capture-clean reference of ReaSyn's AR decoder with a per-shape CUDA-graph cache."""

from .bucketing import bucket_batch, bucket_seq
from .config import DecoderConfig, EncoderConfig
from .model import Decoder, Encoder, expand_memory

__all__ = [
    "Decoder",
    "DecoderConfig",
    "Encoder",
    "EncoderConfig",
    "bucket_batch",
    "bucket_seq",
    "expand_memory",
]
