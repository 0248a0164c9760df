"""The bundled conformance targets: reasyn_ref's GraphCache around the upstream-sized decoder,
running the upstream step (``reasyn``) or the lean step (``reasyn-lean``).

``pytest --pyargs pytest_cudagraph.conformance`` checks this target unless
``--cudagraph-target`` names another. On CUDA the decoder has the default (upstream) config,
random weights from a fixed seed, and runs in bf16 autocast, as the sampler does with graphs on.
Without CUDA only the checks that need no GPU run (guards, worker refusal, the target's own
contract), so the factory then builds the tiny config on the CPU and no graph cache.

One call's inputs are those of one sampler step in the bucketed layout: tokens [Bb, Lb] with
``rows`` real rows (the rest dummies), gather [Bb], memory [Bb, M, d] and its padding mask.
"""

from __future__ import annotations

import abc
import functools
import tempfile
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from pytest_cudagraph.conformance import (
    Cache,
    CaptureClean,
    Case,
    CudaGraphTarget,
    Guards,
    Inputs,
    Padding,
    Sampling,
    State,
    Trajectory,
    Workers,
)

from ..bucketing import bucket_batch, bucket_seq
from ..capture_cache import CaptureCache
from ..checkpoint import save_checkpoint
from ..config import DecoderConfig
from ..graph_cache import GraphCache, GraphKey, check_graph_step, graph_step_module
from ..model import ar_step_logits, expand_memory, seeded_decoder
from ..sampler import ARSampler
from ..step import ARStep
from ..workers import SampleJob, WorkerPool

# Case c lands in key (BATCHES[c % 5], SEQS[c % 4], MEMORIES[c % 3]). The moduli are coprime,
# so cases 0..59 are 60 distinct keys and neighbouring cases differ in every dimension.
BATCHES = (1, 2, 4, 8, 16)
SEQS = (64, 128, 192, 256)
# (memory length, shared): a shared memory is one target's [1, M, d] expanded over the batch, as
# the sampler passes it; the others hold one memory per row. The cache keys on that layout too.
MEMORIES = ((64, False), (128, True), (192, False))
NUM_KEYS = len(BATCHES) * len(SEQS) * len(MEMORIES)
LARGEST_CASE = NUM_KEYS - 1  # 59 % 5, 59 % 4, 59 % 3 = 4, 3, 2: the largest of every dimension

MODEL_SEED = 0
TARGET_SEED = 1  # the memory the sampler and the worker jobs decode from
CHECKPOINT_NAME = "decoder.pt"  # in the folder ReferenceTarget.checkpoint() makes
# Sampling: prefix lengths on both sides of the 64 bucket, so keys change during a run.
SAMPLE_PREFIX_LENGTHS = (1, 5, 17, 40, 63, 70)
SAMPLE_MAX_LEN = 96
SAMPLE_MEMORY_LEN = 64
# Worker jobs: one per worker of the two the check starts, each the longest sampling prefixes
# decoded to WORKER_MAX_LEN (past the 64 bucket in a few steps), since what is checked is the
# shared lock and the answers, not long sampling.
WORKER_JOB_SEEDS = (11, 12)
WORKER_PREFIX_LENGTHS = SAMPLE_PREFIX_LENGTHS[3:]
WORKER_MAX_LEN = 72
# The padded-batches check: real batches of 1 to 16 rows, each in the smallest batch bucket that
# holds it, at the first sequence bucket and a memory per row (so that its padded rows can hold
# NaN).
PADDING_SEQ = SEQS[0]
PADDING_MEMORY = MEMORIES[0]
# The trajectory check starts at batch 16 in the first sequence bucket, with a shared memory:
# its longest row outgrows the bucket within 64 steps.
TRAJECTORY_CASE = 4


def key_for_case(case: int) -> GraphKey:
    """The graph cache's own key of a case: its bucketed batch and sequence, memory length
    (with a padding mask) and whether the memory is shared."""
    batch, (memory_len, shared) = BATCHES[case % len(BATCHES)], MEMORIES[case % len(MEMORIES)]
    # One row's memory is never taken for a shared one (the cache keys on its batch stride).
    return GraphKey(batch, SEQS[case % len(SEQS)], memory_len, True, shared and batch > 1)


def make_target(device: torch.device) -> CudaGraphTarget:
    """The conformance target for ``device`` (a CUDA device, or the CPU for the CPU-only checks)."""
    return ReferenceTarget(device).as_target()


def make_lean_target(device: torch.device) -> CudaGraphTarget:
    """``make_target`` with the lean step: its graphs are checked against the lean step run
    eagerly, and its sampler, workers and refusals run with ``lean=True``."""
    return ReferenceTarget(device, lean=True).as_target()


class SeededTarget(abc.ABC):
    """What both reasyn_ref targets share: the decoder (the default config with weights of
    MODEL_SEED on CUDA, the tiny config on the CPU), the target fields every target has, a graph
    cache's capabilities, and the capture-clean forward at the largest key. A subclass sets
    ``keys`` and ``largest_key`` and gives the methods ``eager``, ``graphed``, ``inputs_at``,
    ``key_of``, ``sample`` and ``unsupported_modes``."""

    keys: tuple[Hashable, ...]
    largest_key: Hashable

    @abc.abstractmethod
    def eager(self, inputs: Inputs) -> Any: ...

    @abc.abstractmethod
    def graphed(self, inputs: Inputs) -> Any: ...

    @abc.abstractmethod
    def inputs_at(self, generator: torch.Generator, key: Any) -> Inputs:
        """One call's inputs at ``key``, their values from ``generator``."""

    @abc.abstractmethod
    def key_of(self, inputs: Inputs) -> Hashable: ...

    @abc.abstractmethod
    def sample(self, seed: int, graphs: bool) -> list[list[int]]: ...

    @abc.abstractmethod
    def unsupported_modes(self) -> dict[str, tuple[Callable[[], object], str]]: ...

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.config = DecoderConfig() if device.type == "cuda" else DecoderConfig.tiny()
        # Drawn on the target's device: the CPU's generator takes seconds at the default config,
        # and nothing compares these weights with any drawn elsewhere (workers load a copy).
        self.decoder = seeded_decoder(self.config, MODEL_SEED, device, portable=False)
        self._largest_inputs: Inputs | None = None

    def draw(self, generator: torch.Generator, case: Case) -> Inputs:
        return self.inputs_at(generator, case.key)

    def make_inputs(self, generator: torch.Generator, case: int) -> Inputs:
        """The inputs of case number ``case`` (key ``keys[case % len(keys)]``)."""
        return self.inputs_at(generator, self.keys[case % len(self.keys)])

    def common_fields(self) -> dict[str, Any]:
        """The target fields that need no GPU: the calls (the graphed one on CUDA only), the
        keys, the sampler, the refusals."""
        return dict(
            device=self.device,
            eager=self.eager,
            graphed=self.graphed if self.device.type == "cuda" else None,
            keys=self.keys,
            draw=self.draw,
            key_of=self.key_of,
            sampling=Sampling(self.sample),
            guards=Guards(self.unsupported_modes()),
        )

    def graph_cache(
        self, cache: CaptureCache, stages: Sequence[str], reset: Callable[[], object]
    ) -> Cache:
        """What ``cache`` gives the suite: ``reset``, its lock, keys and capacity, and
        ``stages`` (its method names) as fault points."""
        return Cache(
            reset=reset,
            lock=cache.lock,
            cached_keys=lambda: list(cache.keys()),
            capacity=cache.capacity,
            largest_key=self.largest_key,
            fault_points={stage: (cache, stage) for stage in stages},
        )

    def capture_clean_forward(self) -> Any:
        """One eager call at the largest key; its inputs are drawn on the first call."""
        if self._largest_inputs is None:
            generator = torch.Generator(self.device).manual_seed(TARGET_SEED)
            self._largest_inputs = self.inputs_at(generator, self.largest_key)
        return self.eager(self._largest_inputs)


class ReferenceTarget(SeededTarget):
    """The decoder, its graph cache and what the checks call them with; ``lean`` picks the step
    (the cache's, the sampler's and the workers'). ``cache_class`` and ``sampler_class`` let the
    project's tests swap in deliberately broken ones."""

    keys = tuple(key_for_case(case) for case in range(NUM_KEYS))
    largest_key = key_for_case(LARGEST_CASE)
    sampler_class: type[ARSampler] = ARSampler

    def __init__(
        self,
        device: torch.device,
        cache_class: type[GraphCache] = GraphCache,
        *,
        lean: bool = False,
    ) -> None:
        super().__init__(device)
        self.lean = lean
        on_cuda = device.type == "cuda"
        # The eager side: the step the graphs capture, on a copy of its own alike to the one
        # the cache's graphs run, so that the two sides' module states compare piece by piece.
        # On the CPU, where no graph runs and the exact step has no autocast, the exact step
        # runs on the decoder itself (its bf16 matmul weights need autocast).
        self.eager_decoder = (
            graph_step_module(self.decoder, lean=lean) if on_cuda or lean else self.decoder
        )
        self.cache = cache_class(self.decoder, device, lean=lean) if on_cuda else None
        self._checkpoint_dir: tempfile.TemporaryDirectory[str] | None = None

    def as_target(self) -> CudaGraphTarget:
        common = dict(
            self.common_fields(),
            workers=Workers(self.run_workers),
            padding=Padding(BATCHES[-1], self.padded_inputs, self.junk),
            trajectory=Trajectory(self.next_step, case=TRAJECTORY_CASE),
        )
        if self.cache is None:
            return CudaGraphTarget(**common, cache=Cache(reset=self.reset))
        return CudaGraphTarget(
            **common,
            cache=self.graph_cache(self.cache, GraphCache.STAGES, self.reset),
            state=State(sides=self.side_state),
            capture_clean=CaptureClean(self.capture_clean_forward),
        )

    def side_state(self) -> tuple[nn.Module, nn.Module]:
        """(what eager calls run, what the cache's graphs run): two copies of the decoder's step
        of their own."""
        if self.cache is None:
            raise RuntimeError("reasyn_ref's graph cache needs CUDA; this target is on the CPU")
        return self.eager_decoder, self.cache.graph_module

    def eager(self, inputs: Inputs) -> Tensor:
        # The lean step is bf16 itself.
        return ar_step_logits(self.eager_decoder, ar_step(inputs), bf16=not self.lean)

    def graphed(self, inputs: Inputs) -> Tensor:
        if self.cache is None:
            raise RuntimeError("reasyn_ref's graph cache needs CUDA; this target is on the CPU")
        return self.cache(ar_step(inputs))

    def inputs_at(self, generator: torch.Generator, key: GraphKey) -> Inputs:
        """One sampler step at ``key``: ``rows`` real rows of random lengths (the longest one
        in the key's sequence bucket), random memory with a random padded suffix, one per row
        or one shared by all rows."""
        return self.step_inputs(generator, (key.batch, key.seq, key.memory_len, key.shared_memory))

    def padded_inputs(self, generator: torch.Generator, rows: int) -> Inputs:
        """One step of ``rows`` real rows in the smallest batch bucket that holds them."""
        return self.step_inputs(generator, (bucket_batch(rows), PADDING_SEQ, *PADDING_MEMORY), rows)

    def step_inputs(
        self,
        generator: torch.Generator,
        key: tuple[int, int, int, bool],
        rows: int | None = None,
    ) -> Inputs:
        """One step at ``key`` (batch, sequence, memory length, shared memory) with ``rows``
        real rows (None: drawn, more than half the batch)."""
        batch, seq, memory_len, shared = key
        config, device = self.config, self.device

        def draw(low: int, high: int, size: tuple[int, ...] = ()) -> Tensor:
            return torch.randint(low, high, size, generator=generator, device=device)

        if rows is None:
            rows = int(draw(batch // 2 + 1, batch + 1))
        longest = int(draw(max(seq - 63, 1), seq + 1))
        lengths = torch.ones(batch, dtype=torch.long, device=device)  # dummy rows: [start]
        lengths[:rows] = draw(1, longest + 1, (rows,))
        lengths[int(draw(0, rows))] = longest
        positions = torch.arange(seq, device=device)
        tokens = torch.where(
            positions < lengths[:, None], draw(3, config.vocab_size, (batch, seq)), config.pad_token
        )
        tokens[:, 0] = config.start_token
        memories = 1 if shared else batch
        memory = torch.randn(
            memories, memory_len, config.d_model, generator=generator, device=device
        )
        real_memory = draw(1, memory_len + 1, (memories, 1))
        padding = torch.arange(memory_len, device=device) >= real_memory
        if shared:  # what expand_memory gives the sampler: views, no copies
            memory, padding = expand_memory(memory, padding, batch)
        return {
            "tokens": tokens,
            "memory": memory,
            "memory_padding_mask": padding,
            "gather": lengths - 1,
            "rows": rows,
        }

    def junk(self, inputs: Inputs) -> Inputs:
        """The step with junk in its padded rows: the last token id, gather at the last
        position, nothing but padding in the mask and, for a memory per row, NaN memory."""
        rows, tokens = inputs["rows"], inputs["tokens"].clone()
        tokens[rows:] = self.config.vocab_size - 1
        gather = inputs["gather"].clone()
        gather[rows:] = tokens.shape[1] - 1
        mask = inputs["memory_padding_mask"].clone()
        mask[rows:] = True
        memory = inputs["memory"]
        if memory.stride(0) != 0:  # one memory per row, not one target's expanded
            memory = memory.clone()
            memory[rows:] = float("nan")
        return {
            **inputs,
            "tokens": tokens,
            "gather": gather,
            "memory_padding_mask": mask,
            "memory": memory,
        }

    def next_step(self, inputs: Inputs, logits: Tensor) -> Inputs:
        """The next step of a greedy decode: each real row's most likely token appended to its
        prefix, in the next sequence bucket once a prefix outgrows its own. The memory and its
        mask stay the same tensors, as one target's decode passes them."""
        rows, tokens = inputs["rows"], inputs["tokens"]
        gather = inputs["gather"].clone()
        gather[:rows] += 1
        length = max(tokens.shape[1], bucket_seq(int(gather.max()) + 1, self.config.max_len))
        grown = torch.full(
            (tokens.shape[0], length), self.config.pad_token, dtype=tokens.dtype, device=self.device
        )
        grown[:, : tokens.shape[1]] = tokens
        grown[torch.arange(rows, device=self.device), gather[:rows]] = logits.argmax(dim=-1)
        return {**inputs, "tokens": grown, "gather": gather}

    def key_of(self, inputs: Inputs) -> GraphKey:
        """The cache's own key for these inputs (its input check computes it)."""
        return check_graph_step(self.config, self.device, torch.float32, ar_step(inputs))

    def reset(self) -> None:
        if self.cache is not None:
            self.cache.clear()

    def sample(self, seed: int, graphs: bool) -> list[list[int]]:
        """Sampled tokens for fixed prefixes and memory under ``seed``, graphs on or off (the
        sampler's own switch, which REASYN_CUDAGRAPH sets when it is not given)."""
        sampler = self.sampler_class(
            self.decoder, bf16=True, batched=True, bucket=True, cudagraph=graphs, lean=self.lean
        )
        memory, padding = sample_target(self.config)
        memory, padding = memory.to(self.device), padding.to(self.device)
        generator = torch.Generator(self.device).manual_seed(seed)
        prefixes = sample_prefixes(self.config)
        return sampler.sample(memory, padding, prefixes, generator, max_len=SAMPLE_MAX_LEN)

    def run_workers(
        self, workers_per_gpu: int, graphs: bool
    ) -> tuple[list[list[list[int]]], list[list[list[int]]]]:
        """Sample a few jobs through a WorkerPool on this GPU and, in this process, eagerly;
        returns (the pool's results, the eager results)."""
        memory, padding = sample_target(self.config)
        prefixes = sample_prefixes(self.config, WORKER_PREFIX_LENGTHS)
        jobs = [
            SampleJob(memory, padding, prefixes, seed, max_len=WORKER_MAX_LEN)
            for seed in WORKER_JOB_SEEDS
        ]
        with WorkerPool(
            self.checkpoint(),
            1,
            workers_per_gpu,
            # "cuda" on a CPU host too: the refusal of graphs with two workers per GPU comes
            # before any device is needed, so the CPU-only run checks it as well.
            device_type="cuda",
            cudagraph=graphs,
            bf16=True,
            lean=self.lean,
        ) as pool:
            results = pool.map(jobs)
        # As the workers build theirs: batching and bucketing from the environment.
        sampler = ARSampler(self.decoder, bf16=True, cudagraph=False, lean=self.lean)
        expected = [
            sampler.sample(
                memory.to(self.device),
                padding.to(self.device),
                job.prefixes,
                torch.Generator(self.device).manual_seed(job.seed),
                max_len=job.max_len,
            )
            for job in jobs
        ]
        return results, expected

    def checkpoint(self) -> Path:
        """The decoder saved once, in a folder removed with this object (or at exit)."""
        if self._checkpoint_dir is None:
            folder = tempfile.TemporaryDirectory(prefix="reasyn-conformance-")
            save_checkpoint(Path(folder.name) / CHECKPOINT_NAME, self.decoder, self.config)
            self._checkpoint_dir = folder  # only once the checkpoint is there
        return Path(self._checkpoint_dir.name) / CHECKPOINT_NAME

    def unsupported_modes(self) -> dict[str, tuple[Callable[[], object], str]]:
        """Settings and inputs graphs do not support, each with the error it must raise."""
        decoder, lean = self.decoder, self.lean
        graphs = functools.partial(ARSampler, decoder, cudagraph=True, lean=lean)
        modes: dict[str, tuple[Callable[[], object], str]] = {
            "graphs without bf16": (
                lambda: graphs(bf16=False, batched=True, bucket=True),
                r"needs bf16=True",
            ),
            "graphs without bucketing": (
                lambda: graphs(bf16=True, batched=True, bucket=False),
                r"needs bucket=True",
            ),
            "graphs without batching": (
                lambda: graphs(bf16=True, batched=False, bucket=True),
                r"needs batched=True",
            ),
        }
        if self.cache is None:
            modes["graphs without CUDA"] = (
                lambda: GraphCache(decoder, self.device, lean=lean),
                r"GraphCache needs CUDA",
            )
            return modes
        cpu_decoder = seeded_decoder(DecoderConfig.tiny(), MODEL_SEED)
        modes["graphs of a decoder on the CPU"] = (
            lambda: GraphCache(cpu_decoder, "cpu", lean=lean),
            r"needs the decoder on a CUDA device",
        )
        for name, (change, message) in BAD_INPUTS.items():
            modes[name] = (functools.partial(self._graphed_with, change), message)
        return modes

    def _graphed_with(self, change: Callable[[Inputs], Inputs]) -> Tensor:
        """The graphed call on the largest case's inputs after ``change``."""
        generator = torch.Generator(self.device).manual_seed(TARGET_SEED)
        return self.graphed(change(self.make_inputs(generator, LARGEST_CASE)))


def ar_step(inputs: Inputs) -> ARStep:
    """One call's inputs as the step the decoder and its graph cache take."""
    return ARStep(
        inputs["tokens"],
        inputs["memory"],
        inputs["memory_padding_mask"],
        inputs["gather"],
        inputs["rows"],
    )


def sample_target(config: DecoderConfig) -> tuple[Tensor, Tensor]:
    """The sampled target's memory [1, M, d] and padding mask [1, M] on the CPU, the last 8
    padded."""
    generator = torch.Generator().manual_seed(TARGET_SEED)
    memory = torch.randn(1, SAMPLE_MEMORY_LEN, config.d_model, generator=generator)
    padding = torch.zeros(1, SAMPLE_MEMORY_LEN, dtype=torch.bool)
    padding[:, -8:] = True
    return memory, padding


def sample_prefixes(
    config: DecoderConfig, lengths: Sequence[int] = SAMPLE_PREFIX_LENGTHS
) -> list[list[int]]:
    """Prefixes of ``lengths`` tokens: the start token, then random ones."""
    generator = torch.Generator().manual_seed(TARGET_SEED)
    return [
        [
            config.start_token,
            *torch.randint(3, config.vocab_size, (n - 1,), generator=generator).tolist(),
        ]
        for n in lengths
    ]


# Inputs outside what a graph supports: how to make them from a valid call, and what the
# cache's error must say. They start from LARGEST_CASE (batch 16, seq 256, memory 192 per row).
BAD_INPUTS: dict[str, tuple[Callable[[Inputs], Inputs], str]] = {
    "inputs on the CPU": (
        lambda x: {k: v.cpu() if isinstance(v, Tensor) else v for k, v in x.items()},
        r"tokens are on cpu",
    ),
    "int32 tokens": (lambda x: {**x, "tokens": x["tokens"].int()}, r"tokens must be a torch\.long"),
    "bf16 memory": (
        lambda x: {**x, "memory": x["memory"].bfloat16()},
        r"memory must be torch\.float32",
    ),
    "batch not a bucket": (
        lambda x: {
            **{k: v[:3] for k, v in x.items() if isinstance(v, Tensor)},
            "rows": min(x["rows"], 3),
        },
        r"batch 3 is not a batch bucket",
    ),
    "sequence not a bucket": (
        lambda x: {**x, "tokens": x["tokens"][:, :100], "gather": x["gather"].clamp(max=99)},
        r"length 100 is not a sequence bucket",
    ),
    "memory length not a bucket": (
        lambda x: {
            **x,
            "memory": x["memory"][:, :100],
            "memory_padding_mask": x["memory_padding_mask"][:, :100],
        },
        r"memory length 100 is not a memory bucket",
    ),
}
