"""Sampling worker processes, several per GPU, as upstream ReaSyn runs them.

Workers start with the spawn method (a forked child cannot use CUDA), bind their GPU before any
CUDA work, and load their own model from a checkpoint. The workers of one GPU share one lock,
held around GPU work only. CUDA graphs need exactly one worker per GPU (a graph cache belongs to
one process), so graphs with more workers per GPU are refused before any process starts.
``device_type="cpu"`` runs the same pool eagerly on the CPU (``num_gpus`` is then the number of
lock groups), which is how CI tests it.

Every message carries the id of the ``map`` call it belongs to, so a call only ever takes its
own answers: those of an earlier call that was interrupted (Ctrl-C, a job that could not be
sent) are dropped when they arrive. A dead worker, or one silent past ``timeout``, is a
``WorkerError`` and closes the pool: no call hangs and no process is left behind.
"""

from __future__ import annotations

import itertools
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
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch import Tensor

from .checkpoint import load_checkpoint
from .checks import (
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_tensor,
    describe,
    token_rows,
)
from .env import resolve_toggle
from .model import Decoder
from .sampler import ARSampler

# How long close() waits for workers to leave on their own before it terminates them.
JOIN_SECONDS = 10.0


@dataclass(frozen=True)
class SampleJob:
    """One target to sample: its memory [1, M, d] and padding mask [1, M] (CPU tensors), the
    prefixes to continue (kept as a tuple of tuples of ints), and the seed of the job's
    generator. Types and shapes are checked here, in the caller's process; what depends on
    the model (width, vocabulary, finite memory) is checked by the worker's sampler."""

    memory: Tensor
    memory_padding_mask: Tensor
    prefixes: Sequence[Sequence[int]]
    seed: int
    max_len: int | None = None

    def __post_init__(self) -> None:
        for name, dtype in (("memory", None), ("memory_padding_mask", torch.bool)):
            value = check_tensor(f"SampleJob.{name}", getattr(self, name), dtype)
            if value.device.type != "cpu":
                raise ValueError(f"SampleJob.{name} must be a CPU tensor (workers move it)")
        if self.memory.dim() != 3:
            raise ValueError(
                f"SampleJob.memory must be a floating-point [1, M, d], got {describe(self.memory)}"
            )
        if self.memory_padding_mask.shape != self.memory.shape[:2]:
            raise ValueError(
                f"SampleJob.memory_padding_mask must be bool {tuple(self.memory.shape[:2])}, "
                f"got {describe(self.memory_padding_mask)}"
            )
        object.__setattr__(self, "prefixes", token_rows("SampleJob.prefixes", self.prefixes))
        check_int("SampleJob.seed", self.seed, minimum=0)
        if self.max_len is not None:
            check_int("SampleJob.max_len", self.max_len, minimum=1)


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
    ``REASYN_CUDAGRAPH`` / ``REASYN_BF16``; explicit arguments win; ``lean`` picks the workers'
    step (``ARSampler``'s). ``timeout`` bounds each wait for a worker's answer during ``map``,
    ``startup_timeout`` the wait for every worker to be ready (importing torch, binding the GPU,
    loading the model) in the constructor.
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
        lean: bool = False,
        timeout: float = 120.0,
        startup_timeout: float = 300.0,
        job_fn: Callable[[ARSampler, SampleJob], Any] = run_sample_job,
    ) -> None:
        check_int("num_gpus", num_gpus, minimum=1)
        check_int("num_workers_per_gpu", num_workers_per_gpu, minimum=1)
        check_choice("device_type", device_type, ("cuda", "cpu"))
        for name, seconds in (("timeout", timeout), ("startup_timeout", startup_timeout)):
            check_number(name, seconds, minimum=0, inclusive=False, what="a number of seconds")
        cudagraph = resolve_toggle("REASYN_CUDAGRAPH", cudagraph)
        bf16 = resolve_toggle("REASYN_BF16", bf16)
        check_bool("lean", lean)
        if lean and not bf16:
            raise ValueError("lean=True needs bf16=True (REASYN_BF16=1): the lean step is bf16")
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
        if not isinstance(checkpoint, (str, os.PathLike)):
            raise TypeError(f"checkpoint must be a path, got {type(checkpoint).__name__}")
        if not os.path.isfile(checkpoint):
            raise ValueError(f"checkpoint: no file at {os.fspath(checkpoint)!r}")
        if not callable(job_fn):
            raise TypeError(f"job_fn must be a module-level function, got {job_fn!r}")
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
        self._call_ids = itertools.count(1)  # 0 is the startup's
        settings = _WorkerSettings(
            os.fspath(checkpoint), device_type, cudagraph, bf16, lean, job_fn
        )
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
        """Run every job on the workers; the results in input order.

        A failed job (an error in it, or a result that cannot be pickled) raises a WorkerError
        for the first failed job once all jobs have answered; a job that cannot be pickled
        raises a ValueError before any job is sent. Either way the pool stays usable. A dead or
        silent worker raises a WorkerError at once and closes the pool."""
        jobs = list(jobs)
        for index, job in enumerate(jobs):
            if not isinstance(job, SampleJob):
                raise TypeError(f"jobs[{index}] must be a SampleJob, got {type(job).__name__}")
        with self._map_lock:
            if self._closed:
                raise RuntimeError("this WorkerPool is closed")
            call = next(self._call_ids)
            messages = [_pickled_job(call, index, job) for index, job in enumerate(jobs)]
            results: list[Any] = [None] * len(jobs)
            failures: dict[int, tuple[int, str]] = {}
            pending = deque(range(len(jobs)))
            # A worker still busy with an interrupted call's job takes this call's next, after it.
            idle = deque(range(len(self.processes)))
            running: dict[int, int] = {}  # worker -> job index
            while pending or running:
                while pending and idle:
                    worker = idle.popleft()
                    index = pending.popleft()
                    self._send(worker, messages[index], index)
                    running[worker] = index
                for worker, (kind, answered_call, index, payload) in self._receive(
                    running, self.timeout
                ):
                    if answered_call != call:
                        continue  # an interrupted call's answer: not this call's to take
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
                kind, _, _, details = message
                if kind != "ready":
                    self._fail(worker, None, f"failed to start:\n{details}")
                del starting[worker]

    def _send(self, worker: int, message: memoryview, index: int) -> None:
        try:
            self._connections[worker].send_bytes(message)
        except OSError:
            self._fail(worker, index, self._exit_reason(worker))
        except BaseException:
            # Interrupted inside a message (Ctrl-C): the pipe may be out of step for good.
            self._shutdown(grace=0.0)
            raise

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
                data = connection.recv_bytes()
            except (EOFError, OSError):
                self._fail(worker, waiting[worker], self._exit_reason(worker))
            except BaseException:
                # Interrupted inside a message (Ctrl-C): the pipe may be out of step for good.
                self._shutdown(grace=0.0)
                raise
            # A whole message was read, so the pipe stays in step whatever happens next.
            messages.append((worker, ForkingPickler.loads(data)))
            answered.add(worker)
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
    lean: bool
    job_fn: Callable[[ARSampler, SampleJob], Any]


def _worker_main(settings: _WorkerSettings, gpu: int, lock: Any, connection: Connection) -> None:
    """A worker: bind the device, load the model, then run jobs until told to stop. Each
    answer is (kind, call id, job index, payload), kind "ready", "failed" or "done"."""
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
        sampler = ARSampler(
            decoder.to(device),
            bf16=settings.bf16,
            cudagraph=settings.cudagraph,
            lean=settings.lean,
        )
    except Exception:
        connection.send(("failed", 0, None, traceback.format_exc()))
        return
    connection.send(("ready", 0, None, None))
    while True:
        try:
            message = connection.recv()
        except EOFError:  # the parent is gone
            return
        if message is None:
            return
        call, index, job = message
        try:
            with lock:
                result = settings.job_fn(sampler, job)
            answer = ForkingPickler.dumps(("done", call, index, result))
        except Exception:
            answer = ForkingPickler.dumps(("failed", call, index, traceback.format_exc()))
        connection.send_bytes(answer)


def _pickled_job(call: int, index: int, job: SampleJob) -> memoryview:
    """The message that sends job ``index`` of map call ``call``, pickled as the pipe would."""
    try:
        return ForkingPickler.dumps((call, index, job))
    except Exception as exc:
        raise ValueError(f"jobs[{index}] cannot be pickled to send to a worker: {exc!r}") from exc
