"""Sampling worker processes, several per GPU, as upstream ReaSyn runs them.

Workers start with the spawn method (a forked child cannot use CUDA), bind their GPU before any
CUDA work, and load their own model from a checkpoint. The workers of one GPU share one lock,
held around GPU work only, so that they take turns on the device. CUDA graphs need exactly one
worker per GPU: a graph cache belongs to one process, and two processes capturing and
replaying on one device would contend for it, so graphs with more workers per GPU are refused
before any process starts.

``device_type="cpu"`` runs the same pool eagerly on the CPU (``num_gpus`` is then the number of
lock groups), which is how CI tests it.

Each worker talks to the parent over its own pipe; the parent waits on those pipes and on the
workers' process sentinels together, so a worker that dies is noticed at once and reported as a
``WorkerError``, and a worker that stops answering is reported after ``timeout`` seconds. Either
way the pool closes: no call ever hangs and no process is left behind.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
from torch import Tensor

from .checkpoint import load_checkpoint
from .env import resolve_toggle
from .graph_cache import check_count
from .model import Decoder
from .sampler import ARSampler

# How long close() waits for workers to leave on their own before it terminates them.
JOIN_SECONDS = 10.0


@dataclass(frozen=True)
class SampleJob:
    """One target to sample: its memory [1, M, d] and padding mask [1, M] (CPU tensors), the
    prefixes to continue, and the seed of the job's generator."""

    memory: Tensor
    memory_padding_mask: Tensor
    prefixes: Sequence[Sequence[int]]
    seed: int
    max_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("memory", "memory_padding_mask"):
            value = getattr(self, name)
            if not isinstance(value, Tensor) or value.device.type != "cpu":
                raise ValueError(f"SampleJob.{name} must be a CPU tensor (workers move it)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"SampleJob.seed must be an int >= 0, got {self.seed!r}")


def run_sample_job(sampler: ARSampler, job: SampleJob) -> list[list[int]]:
    """The default job: sample the job's prefixes on the sampler's device, seeded by the job."""
    device = sampler.device
    generator = torch.Generator(device=device).manual_seed(job.seed)
    return sampler.sample(
        job.memory.to(device),
        job.memory_padding_mask.to(device),
        job.prefixes,
        generator,
        max_len=job.max_len,
    )


class WorkerError(RuntimeError):
    """A job failed in a worker, or a worker died or stopped answering."""

    def __init__(self, message: str, *, worker: int, device: str, job: int | None) -> None:
        super().__init__(message)
        self.worker = worker
        self.device = device
        self.job = job


class WorkerPool:
    """``num_gpus * num_workers_per_gpu`` spawned workers, each with its own ARSampler.

    ``pool.map(jobs)`` returns each job's result in input order. Flags left as None come from
    ``REASYN_CUDAGRAPH`` / ``REASYN_BF16``; explicit arguments win. ``timeout`` bounds each wait
    for a worker's answer during ``map``, ``startup_timeout`` the wait for every worker to be
    ready (importing torch, binding the GPU, loading the model) in the constructor.
    ``job_fn(sampler, job)`` is what a worker runs per job; it must be a module-level function
    the workers can import.
    """

    def __init__(
        self,
        checkpoint: str | os.PathLike[str],
        num_gpus: int,
        num_workers_per_gpu: int = 1,
        *,
        device_type: str = "cuda",
        cudagraph: bool | None = None,
        bf16: bool | None = None,
        timeout: float = 120.0,
        startup_timeout: float = 300.0,
        job_fn: Callable[[ARSampler, SampleJob], Any] = run_sample_job,
    ) -> None:
        check_count("num_gpus", num_gpus)
        check_count("num_workers_per_gpu", num_workers_per_gpu)
        if device_type not in ("cuda", "cpu"):
            raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
        _check_seconds("timeout", timeout)
        _check_seconds("startup_timeout", startup_timeout)
        cudagraph = resolve_toggle("REASYN_CUDAGRAPH", cudagraph)
        bf16 = resolve_toggle("REASYN_BF16", bf16)
        if cudagraph and device_type != "cuda":
            raise ValueError("cudagraph=True needs device_type='cuda'")
        if cudagraph and num_workers_per_gpu != 1:
            raise ValueError(
                f"cudagraph=True needs num_workers_per_gpu=1, got {num_workers_per_gpu}: a "
                f"process's CUDA graphs must not share their GPU with another worker's"
            )
        if device_type == "cuda" and num_gpus > torch.cuda.device_count():
            raise ValueError(
                f"num_gpus={num_gpus} but {torch.cuda.device_count()} CUDA devices are visible"
            )
        if not os.path.isfile(checkpoint):
            raise ValueError(f"checkpoint: no file at {os.fspath(checkpoint)!r}")
        try:
            pickle.dumps(job_fn)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise ValueError(
                f"job_fn must be a module-level function the workers can import: {exc}"
            ) from exc

        self.cudagraph = cudagraph
        self.bf16 = bf16
        self.timeout = float(timeout)
        self.startup_timeout = float(startup_timeout)
        context = multiprocessing.get_context("spawn")
        self.locks = [context.Lock() for _ in range(num_gpus)]
        self.devices = [
            f"cuda:{gpu}" if device_type == "cuda" else f"cpu (lock group {gpu})"
            for gpu in range(num_gpus)
            for _ in range(num_workers_per_gpu)
        ]
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._connections: list[Connection] = []
        self._map_lock = threading.RLock()  # close() takes it too, also from map's _fail
        self._closed = False
        settings = _WorkerSettings(os.fspath(checkpoint), device_type, cudagraph, bf16, job_fn)
        try:
            for rank in range(len(self.devices)):
                gpu = rank // num_workers_per_gpu
                parent_end, child_end = context.Pipe()
                process = context.Process(
                    target=_worker_main,
                    args=(settings, gpu, self.locks[gpu], child_end),
                    name=f"reasyn-worker-{rank}",
                    daemon=True,
                )
                process.start()
                child_end.close()
                self.processes.append(process)
                self._connections.append(parent_end)
            self._wait_ready()
        except BaseException:
            self._shutdown(grace=0.0)
            raise

    def map(self, jobs: Sequence[SampleJob]) -> list[Any]:
        """Run every job on the workers; the results in input order. A failed job raises a
        WorkerError for the first failed job once all jobs have answered (the pool stays
        usable); a dead or silent worker raises one at once and closes the pool."""
        jobs = list(jobs)
        for index, job in enumerate(jobs):
            if not isinstance(job, SampleJob):
                raise ValueError(f"jobs[{index}] must be a SampleJob, got {type(job).__name__}")
        with self._map_lock:
            if self._closed:
                raise RuntimeError("this WorkerPool is closed")
            results: list[Any] = [None] * len(jobs)
            failures: dict[int, tuple[int, str]] = {}
            pending = deque(enumerate(jobs))
            idle = deque(range(len(self.processes)))
            running: dict[int, int] = {}  # worker -> job index
            while pending or running:
                while pending and idle:
                    worker = idle.popleft()
                    index, job = pending.popleft()
                    running[worker] = index
                    self._send(worker, (index, job), running)
                for worker, message in self._receive(running, self.timeout):
                    kind, index, payload = message
                    if kind == "done":
                        results[index] = payload
                    else:
                        failures[index] = (worker, payload)
                    del running[worker]
                    idle.append(worker)
            if failures:
                index = min(failures)
                worker, details = failures[index]
                raise WorkerError(
                    f"worker {worker} on {self.devices[worker]} failed on job {index}:\n{details}",
                    worker=worker,
                    device=self.devices[worker],
                    job=index,
                )
            return results

    def close(self) -> None:
        """Stop every worker: ask them to leave, give them ``JOIN_SECONDS``, then terminate and
        kill what remains. Waits for a map running in another thread to finish first."""
        self._shutdown(grace=JOIN_SECONDS)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _wait_ready(self) -> None:
        starting = {worker: None for worker in range(len(self.processes))}
        while starting:
            for worker, message in self._receive(starting, self.startup_timeout):
                kind, _, details = message
                if kind != "ready":
                    self._fail(worker, None, f"failed to start:\n{details}")
                del starting[worker]

    def _send(self, worker: int, message: object, running: dict[int, int]) -> None:
        try:
            self._connections[worker].send(message)
        except OSError:
            self._fail(worker, running.get(worker), self._exit_reason(worker))

    def _receive(self, waiting: dict[int, Any], timeout: float) -> list[tuple[int, tuple]]:
        """The next messages of the workers in ``waiting``; a worker that died or a wait past
        ``timeout`` seconds closes the pool and raises WorkerError."""
        connections = {self._connections[w]: w for w in waiting}
        sentinels = {self.processes[w].sentinel: w for w in waiting}
        ready = wait([*connections, *sentinels], timeout=timeout)
        if not ready:
            worker = next(iter(waiting))
            self._fail(
                worker,
                waiting[worker],
                f"sent nothing for {timeout:g} s (workers waited on: {sorted(waiting)})",
            )
        messages = []
        answered = set()
        for connection in (c for c in ready if c in connections):
            worker = connections[connection]
            try:
                messages.append((worker, connection.recv()))
                answered.add(worker)
            except (EOFError, OSError):
                self._fail(worker, waiting[worker], self._exit_reason(worker))
        # A worker that exited is lost; its last messages, if any, are read first.
        for sentinel in (s for s in ready if s in sentinels):
            worker = sentinels[sentinel]
            if worker not in answered and not self._connections[worker].poll():
                self._fail(worker, waiting[worker], self._exit_reason(worker))
        return messages

    def _exit_reason(self, worker: int) -> str:
        process = self.processes[worker]
        process.join(1.0)
        return f"died (exit code {process.exitcode})"

    def _shutdown(self, grace: float) -> None:
        with self._map_lock:
            if self._closed:
                return
            self._closed = True
            for connection, process in zip(self._connections, self.processes, strict=True):
                if process.is_alive():
                    try:
                        connection.send(None)
                    except OSError:  # the worker is gone already
                        pass
            for stop, seconds in (
                (None, grace),
                ("terminate", JOIN_SECONDS),
                ("kill", JOIN_SECONDS),
            ):
                deadline = time.monotonic() + seconds
                for process in self.processes:
                    if stop is not None and process.is_alive():
                        getattr(process, stop)()
                    process.join(max(0.0, deadline - time.monotonic()))
            for connection in self._connections:
                connection.close()

    def _fail(self, worker: int, job: int | None, what: str) -> None:
        # A dead or silent worker leaves the pool in an unknown state: stop everything now.
        self._shutdown(grace=0.0)
        during = f" while running job {job}" if job is not None else ""
        raise WorkerError(
            f"worker {worker} on {self.devices[worker]} {what}{during}; the pool is closed",
            worker=worker,
            device=self.devices[worker],
            job=job,
        )


@dataclass(frozen=True)
class _WorkerSettings:
    checkpoint: str
    device_type: str
    cudagraph: bool
    bf16: bool
    job_fn: Callable[[ARSampler, SampleJob], Any]


def _worker_main(settings: _WorkerSettings, gpu: int, lock: Any, connection: Connection) -> None:
    """A worker: bind the device, load the model, then run jobs until told to stop."""
    try:
        if settings.device_type == "cuda":
            torch.cuda.set_device(gpu)  # before any CUDA work, so nothing lands on GPU 0
            device = torch.device("cuda", gpu)
        else:
            torch.set_num_threads(1)  # the workers share the host's cores
            device = torch.device("cpu")
        decoder = load_checkpoint(settings.checkpoint)
        if not isinstance(decoder, Decoder):
            raise ValueError(
                f"{settings.checkpoint} holds a model of type {type(decoder).__name__}; "
                "workers need a Decoder"
            )
        sampler = ARSampler(decoder.to(device), bf16=settings.bf16, cudagraph=settings.cudagraph)
    except Exception:
        connection.send(("failed", None, traceback.format_exc()))
        return
    connection.send(("ready", None, None))
    while True:
        try:
            message = connection.recv()
        except EOFError:  # the parent is gone
            return
        if message is None:
            return
        index, job = message
        try:
            with lock:
                result = settings.job_fn(sampler, job)
        except Exception:
            connection.send(("failed", index, traceback.format_exc()))
        else:
            connection.send(("done", index, result))


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
