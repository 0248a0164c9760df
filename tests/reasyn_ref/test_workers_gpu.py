"""WorkerPool on GPUs: two workers sharing one GPU and its lock, one worker with graphs on
matching sampling without graphs, and (on two GPUs) each worker bound to its own GPU only.

Spawned workers import this module for ``gpu_job`` (and test_workers for ``scripted_job``).
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch
from test_workers import TIMED_SEEDS, make_job, scripted_job

from pytest_cudagraph.skips import needs_cuda
from reasyn_ref.checkpoint import load_checkpoint
from reasyn_ref.sampler import ARSampler
from reasyn_ref.workers import SampleJob, WorkerPool, run_sample_job

pytestmark = [
    *needs_cuda,
    pytest.mark.usefixtures("no_toggles_in_env"),
]
needs_two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 CUDA devices: one worker per GPU"
)

WHERE_SEED = 950


def gpu_job(sampler: ARSampler, job: SampleJob):
    """scripted_job, plus a job that reports where its worker runs: its sampler's device, the
    current CUDA device, and every other GPU on which NVML lists the worker (strays)."""
    if job.seed != WHERE_SEED:
        return scripted_job(sampler, job)
    where = {"device": str(sampler.device), "current": torch.cuda.current_device()}
    try:
        from pytest_cudagraph.engines import devices
    except ImportError as error:
        return {**where, "nvml": f"cannot check: {error}"}
    status = devices.nvml_status()
    if not status.available:
        return {**where, "nvml": f"cannot check: {status.detail}"}
    check = devices.check_stray_contexts(sampler.device, os.getpid(), f"worker {os.getpid()}")
    return {**where, "nvml": check.note or "checked", "strays": list(check.strays)}


def gpu_pool(checkpoint, num_gpus: int, per_gpu: int, *, cudagraph: bool) -> WorkerPool:
    return WorkerPool(checkpoint, num_gpus, per_gpu, cudagraph=cudagraph, bf16=True, job_fn=gpu_job)


def sample_here(checkpoint, jobs, device: torch.device):
    """The jobs sampled in this process on ``device``, graphs off."""
    decoder = load_checkpoint(checkpoint).to(device)
    sampler = ARSampler(decoder, bf16=True, cudagraph=False, batched=True, bucket=True)
    return [run_sample_job(sampler, job) for job in jobs]


def test_two_workers_share_one_gpu_and_take_turns(checkpoint):
    jobs = [make_job(seed) for seed in range(4)]
    with gpu_pool(checkpoint, 1, 2, cudagraph=False) as pool:
        where = pool.map([make_job(WHERE_SEED), make_job(WHERE_SEED)])
        intervals = pool.map([make_job(seed) for seed in TIMED_SEEDS[:4]])
        results = pool.map(jobs)
    assert [(w["device"], w["current"]) for w in where] == [("cuda:0", 0), ("cuda:0", 0)]
    assert len({interval["pid"] for interval in intervals}) == 2, "both workers must take jobs"
    intervals.sort(key=lambda interval: interval["start"])
    for earlier, later in itertools.pairwise(intervals):
        assert later["start"] >= earlier["end"], f"overlapping jobs: {earlier} and {later}"
    assert results == sample_here(checkpoint, jobs, torch.device("cuda", 0))
    assert not any(process.is_alive() for process in pool.processes)


def test_a_worker_with_graphs_samples_as_without(checkpoint):
    jobs = [make_job(seed) for seed in range(4)]
    with gpu_pool(checkpoint, 1, 1, cudagraph=True) as pool:
        results = pool.map(jobs)
    assert results == sample_here(checkpoint, jobs, torch.device("cuda", 0))


@needs_two_gpus
def test_each_worker_binds_its_own_gpu_and_no_other(checkpoint):
    with gpu_pool(checkpoint, 2, 1, cudagraph=True) as pool:
        where = pool.map([make_job(WHERE_SEED), make_job(WHERE_SEED)])
    assert sorted((w["device"], w["current"]) for w in where) == [("cuda:0", 0), ("cuda:1", 1)]
    if any(w["nvml"] != "checked" for w in where):
        pytest.skip(f"devices bound as asked; NVML could not check for strays: {where}")
    assert [w["strays"] for w in where] == [[], []]
