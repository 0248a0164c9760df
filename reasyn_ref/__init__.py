"""reasyn_ref: a capture-clean reference of ReaSyn's AR decoder with a per-shape CUDA-graph cache."""

from .bucketing import bucket_batch, bucket_memory, bucket_seq
from .checkpoint import load_checkpoint, save_checkpoint
from .config import DecoderConfig, EncoderConfig
from .graph_cache import GraphCache
from .incremental import EagerSteps, IncrementalDecoder, StepBuffers, StepKey
from .incremental_graphs import StepGraphCache
from .incremental_sampler import IncrementalSampler
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
    "IncrementalDecoder",
    "IncrementalSampler",
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
