"""reasyn_ref: a capture-clean reference of ReaSyn's AR decoder with a per-shape CUDA-graph cache."""

from .bucketing import bucket_batch, bucket_memory, bucket_seq
from .checkpoint import load_checkpoint, save_checkpoint
from .config import DecoderConfig, EncoderConfig
from .graph_cache import GraphCache
from .kv_decoder import EagerSteps, KVDecoder, StepBuffers, StepKey
from .kv_graphs import StepGraphCache
from .kv_sampler import KVSampler
from .model import Decoder, Encoder, expand_memory
from .sampler import ARSampler
from .step import ARStep, GraphKey
from .workers import SampleJob, WorkerError, WorkerPool

__all__ = [
    "ARSampler",
    "ARStep",
    "Decoder",
    "DecoderConfig",
    "EagerSteps",
    "Encoder",
    "EncoderConfig",
    "GraphCache",
    "GraphKey",
    "KVDecoder",
    "KVSampler",
    "SampleJob",
    "StepBuffers",
    "StepGraphCache",
    "StepKey",
    "WorkerError",
    "WorkerPool",
    "bucket_batch",
    "bucket_memory",
    "bucket_seq",
    "expand_memory",
    "load_checkpoint",
    "save_checkpoint",
]
