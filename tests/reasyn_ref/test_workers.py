"""WorkerPool on the CPU: order of results, shared locks, errors, crashes, hangs, shutdown, and
the argument checks that run before any process starts.

Spawned workers import this module to find the job functions below (pytest put its folder on
sys.path, and spawn hands the parent's sys.path to the children).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time

import pytest
import torch

from reasyn_ref import DecoderConfig, Encoder, EncoderConfig, save_checkpoint, workers
from reasyn_ref.checkpoint import load_checkpoint
from reasyn_ref.sampler import ARSampler
from reasyn_ref.workers import SampleJob, WorkerError, WorkerPool, run_sample_job

# Most tests spawn worker processes (the README's test command leaves them out).
pytestmark = [pytest.mark.usefixtures("no_toggles_in_env"), pytest.mark.slow]

# Seeds that make scripted_job misbehave; every other seed samples normally.
RAISE_SEED = 900
CRASH_SEED = 901
HANG_SEED = 902
UNPICKLABLE_SEED = 903
TIMED_SEEDS = range(1000, 1100)
TIMED_SECONDS = 0.3
MAX_LEN = 12


def scripted_job(sampler: ARSampler, job: SampleJob):
    """The pool's job_fn in these tests: raise, crash, hang or time itself, by the job's seed."""
    if job.seed == RAISE_SEED:
        raise ValueError("scripted failure in the job")
    if job.seed == CRASH_SEED:
        os._exit(3)
    if job.seed == HANG_SEED:
        time.sleep(3600)
    if job.seed == UNPICKLABLE_SEED:
        return lambda: None  # a local function cannot be pickled back to the parent
    if job.seed in TIMED_SEEDS:
        start = time.monotonic()
        time.sleep(TIMED_SECONDS)
        return {"pid": os.getpid(), "start": start, "end": time.monotonic()}
    return run_sample_job(sampler, job)


def make_job(seed: int) -> SampleJob:
    """A job on one random target of 64 positions (a memory bucket, so that graph workers take
    it too; the last 3 padded) with three prefixes."""
    config = DecoderConfig.tiny()
    generator = torch.Generator().manual_seed(seed)
    memory = torch.randn(1, 64, config.d_model, generator=generator)
    padding = torch.zeros(1, 64, dtype=torch.bool)
    padding[:, -3:] = True
    start = config.start_token
    prefixes = [[start], [start, 5 + seed % 7], [start, 9, 11 + seed % 5, 40]]
    return SampleJob(memory, padding, prefixes, seed, max_len=MAX_LEN)


def cpu_pool(checkpoint, num_groups=1, per_group=2, timeout=60.0):
    return WorkerPool(
        checkpoint,
        num_groups,
        per_group,
        device_type="cpu",
        cudagraph=False,
        bf16=False,
        timeout=timeout,
        job_fn=scripted_job,
    )


@pytest.fixture(scope="module")
def pool(checkpoint):
    """Two workers sharing one lock group: the pool most tests use."""
    with cpu_pool(checkpoint) as pool:
        yield pool


def sample_here(checkpoint, jobs):
    """The jobs sampled in this process, from the same checkpoint, on one thread as CPU
    workers run."""
    sampler = ARSampler(load_checkpoint(checkpoint), bf16=False, cudagraph=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [run_sample_job(sampler, job) for job in jobs]
    finally:
        torch.set_num_threads(threads)


# --- results -------------------------------------------------------------------------------


def test_results_come_back_in_input_order_and_match_sampling_here(pool, checkpoint):
    jobs = [make_job(seed) for seed in (5, 1, 4, 2, 3, 0)]
    expected = sample_here(checkpoint, jobs)
    assert len({repr(result) for result in expected}) == len(jobs), "jobs must differ to test order"
    assert pool.map(jobs) == expected


def test_an_empty_map_returns_nothing(pool):
    assert pool.map([]) == []


def test_map_refuses_anything_but_sample_jobs(pool):
    with pytest.raises(TypeError, match=r"jobs\[1\] must be a SampleJob, got dict"):
        pool.map([make_job(0), {"seed": 1}])


def test_a_map_interrupted_in_the_caller_leaves_no_answers_for_the_next(
    pool, checkpoint, monkeypatch
):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as Ctrl-C while the parent waits for answers

    with monkeypatch.context() as patch:
        patch.setattr(workers, "wait", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pool.map([make_job(20), make_job(21)])  # both jobs were sent and will answer
    jobs = [make_job(22), make_job(23)]
    assert pool.map(jobs) == sample_here(checkpoint, jobs)
    assert pool.map(jobs[::-1]) == sample_here(checkpoint, jobs[::-1])


def unpicklable_job(seed: int) -> SampleJob:
    """A job whose memory is an autograd result, which torch refuses to send to a process."""
    job = make_job(seed)
    memory = job.memory.clone().requires_grad_() * 1.0
    return SampleJob(memory, job.memory_padding_mask, job.prefixes, seed, max_len=job.max_len)


def test_a_job_that_cannot_be_pickled_is_refused_before_any_is_sent(pool, checkpoint):
    with pytest.raises(ValueError, match=r"jobs\[1\] cannot be pickled to send to a worker"):
        pool.map([make_job(24), unpicklable_job(25), make_job(26)])
    jobs = [make_job(27), make_job(28), make_job(29)]
    assert pool.map(jobs) == sample_here(checkpoint, jobs)


def test_a_result_that_cannot_be_pickled_is_a_worker_error_and_the_pool_goes_on(pool, checkpoint):
    with pytest.raises(WorkerError, match=r"(?s)failed on job 1:.*pickle") as failure:
        pool.map([make_job(30), make_job(UNPICKLABLE_SEED), make_job(31)])
    assert failure.value.job == 1
    assert all(process.is_alive() for process in pool.processes)
    jobs = [make_job(32), make_job(33)]
    assert pool.map(jobs) == sample_here(checkpoint, jobs)


def test_workers_sharing_a_lock_never_run_jobs_at_the_same_time(pool):
    intervals = pool.map([make_job(seed) for seed in TIMED_SEEDS[:4]])
    assert len({interval["pid"] for interval in intervals}) == 2, "both workers must take jobs"
    intervals.sort(key=lambda interval: interval["start"])
    for earlier, later in itertools.pairwise(intervals):
        assert later["start"] >= earlier["end"], f"overlapping jobs: {earlier} and {later}"


def test_a_failed_job_is_reported_and_its_lock_released(pool, checkpoint):
    jobs = [make_job(0), make_job(RAISE_SEED), make_job(1)]
    with pytest.raises(WorkerError, match=r"scripted failure in the job") as failure:
        pool.map(jobs)
    error = failure.value
    assert error.job == 1
    assert error.worker in (0, 1)
    assert error.device == "cpu (lock group 0)"
    assert f"worker {error.worker} on cpu (lock group 0) failed on job 1" in str(error)
    assert "ValueError" in str(error)  # the worker's traceback comes along
    assert pool.locks[0].acquire(timeout=5), "the failed job left its GPU lock held"
    pool.locks[0].release()
    # Both workers still serve jobs, through the same lock.
    jobs = [make_job(seed) for seed in (7, 8, 9, 10)]
    assert pool.map(jobs) == sample_here(checkpoint, jobs)
    assert all(process.is_alive() for process in pool.processes)


# --- crashes, hangs, startup failures and shutdown -----------------------------------------


def test_a_crashed_worker_is_an_error_in_time_and_leaves_no_process(checkpoint):
    pool = cpu_pool(checkpoint, timeout=30.0)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"died \(exit code 3\) while running job 1") as failure:
        pool.map([make_job(0), make_job(CRASH_SEED), make_job(1)])
    assert time.monotonic() - start < pool.timeout
    assert failure.value.job == 1
    assert not any(process.is_alive() for process in pool.processes)
    with pytest.raises(RuntimeError, match=r"this WorkerPool is closed"):
        pool.map([make_job(0)])
    pool.close()  # closing again is harmless


def test_a_silent_worker_is_an_error_after_the_timeout(checkpoint):
    pool = cpu_pool(checkpoint, per_group=1, timeout=2.0)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"sent nothing for 2 s .* while running job 0"):
        pool.map([make_job(HANG_SEED)])
    assert 2.0 <= time.monotonic() - start < 20.0
    assert not any(process.is_alive() for process in pool.processes)


def test_a_worker_that_cannot_start_fails_the_constructor(tmp_path):
    encoder = Encoder(EncoderConfig.tiny())
    path = tmp_path / "encoder.pt"
    save_checkpoint(path, encoder, encoder.config)
    before = set(multiprocessing.active_children())
    with pytest.raises(
        WorkerError,
        match=r"(?s)failed to start:.*holds a model of type Encoder; workers need a Decoder",
    ):
        cpu_pool(path, per_group=1)
    assert set(multiprocessing.active_children()) <= before


def test_lock_groups_each_get_a_lock_and_close_lets_workers_leave(checkpoint):
    with cpu_pool(checkpoint, num_groups=2, per_group=1) as pool:
        assert len(pool.locks) == 2 and pool.locks[0] is not pool.locks[1]
        assert pool.devices == ["cpu (lock group 0)", "cpu (lock group 1)"]
        assert pool.map([make_job(3), make_job(4)]) == sample_here(
            checkpoint, [make_job(3), make_job(4)]
        )
    assert [process.exitcode for process in pool.processes] == [0, 0]  # left, not terminated
    pool.close()


# --- checks before any process starts -------------------------------------------------------


@pytest.fixture
def no_new_processes():
    before = set(multiprocessing.active_children())
    yield
    assert set(multiprocessing.active_children()) <= before, "a refused pool started processes"


def test_graphs_need_one_worker_per_gpu(checkpoint, no_new_processes):
    with pytest.raises(ValueError, match=r"cudagraph=True needs num_workers_per_gpu=1, got 2"):
        WorkerPool(checkpoint, 1, 2, cudagraph=True, bf16=True)


def test_graphs_from_the_environment_need_one_worker_per_gpu(
    checkpoint, monkeypatch, no_new_processes
):
    monkeypatch.setenv("REASYN_CUDAGRAPH", "1")
    with pytest.raises(ValueError, match=r"cudagraph=True needs num_workers_per_gpu=1, got 3"):
        WorkerPool(checkpoint, 1, 3, bf16=True)


def test_graphs_need_cuda_workers(checkpoint, no_new_processes):
    with pytest.raises(ValueError, match=r"cudagraph=True needs device_type='cuda'"):
        WorkerPool(checkpoint, 1, 1, device_type="cpu", cudagraph=True)


def test_more_gpus_than_visible_are_refused(checkpoint, no_new_processes):
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"num_gpus={count + 1} but {count} CUDA devices"):
        WorkerPool(checkpoint, count + 1, 1, cudagraph=False)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((0, 1), {}, ValueError, r"num_gpus must be an int >= 1, got 0"),
        ((True, 1), {}, TypeError, r"num_gpus must be an int >= 1, got True"),
        ((1, 0), {}, ValueError, r"num_workers_per_gpu must be an int >= 1, got 0"),
        ((1, 1.5), {}, TypeError, r"num_workers_per_gpu must be an int >= 1, got 1.5"),
        ((1, 1), {"device_type": "tpu"}, ValueError, r"device_type must be 'cuda' or 'cpu'"),
        ((1, 1), {"device_type": 0}, TypeError, r"device_type must be 'cuda' or 'cpu', got 0"),
        ((1, 1), {"timeout": 0}, ValueError, r"timeout must be a number of seconds > 0, got 0"),
        ((1, 1), {"timeout": float("nan")}, ValueError, r"timeout must be .* > 0, got nan"),
        ((1, 1), {"timeout": "5"}, TypeError, r"timeout must be a number of seconds > 0, got '5'"),
        ((1, 1), {"startup_timeout": -1.0}, ValueError, r"startup_timeout must be a number"),
        ((1, 1), {"job_fn": lambda s, j: []}, ValueError, r"job_fn must be a module-level"),
        ((1, 1), {"job_fn": 42}, TypeError, r"job_fn must be a module-level function, got 42"),
    ],
)
def test_bad_arguments_are_refused(checkpoint, no_new_processes, args, kwargs, error, message):
    with pytest.raises(error, match=message):
        WorkerPool(checkpoint, *args, device_type=kwargs.pop("device_type", "cpu"), **kwargs)


def test_a_missing_checkpoint_is_refused(tmp_path, no_new_processes):
    with pytest.raises(ValueError, match=r"checkpoint: no file at .*missing.pt"):
        WorkerPool(tmp_path / "missing.pt", 1, device_type="cpu")


def rows():
    yield [1]


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        (
            "memory",
            torch.zeros(1, 16, 32, device="meta"),
            ValueError,
            r"SampleJob.memory must be a CPU tensor",
        ),
        ("memory", torch.zeros(16, 32), ValueError, r"SampleJob.memory must be a floating-point"),
        (
            "memory_padding_mask",
            [[False] * 16],
            TypeError,
            r"SampleJob.memory_padding_mask must be a torch.bool tensor, got list",
        ),
        (
            "memory_padding_mask",
            torch.zeros(1, 63, dtype=torch.bool),
            ValueError,
            r"SampleJob.memory_padding_mask must be bool \(1, 64\)",
        ),
        ("prefixes", 42, TypeError, r"SampleJob.prefixes must be a sequence .* got int"),
        ("prefixes", rows(), TypeError, r"SampleJob.prefixes must be a sequence .* got generator"),
        ("prefixes", "abc", TypeError, r"SampleJob.prefixes must be a sequence .* got str"),
        ("prefixes", [], ValueError, r"SampleJob.prefixes must hold at least one row"),
        ("prefixes", [[1], 7], TypeError, r"SampleJob.prefixes\[1\] must be a sequence"),
        ("prefixes", [[1], []], ValueError, r"SampleJob.prefixes\[1\] is empty"),
        ("prefixes", [[1, 2.5]], TypeError, r"SampleJob.prefixes\[0\] must hold int token ids"),
        ("prefixes", [[True]], TypeError, r"SampleJob.prefixes\[0\] must hold int token ids"),
        ("seed", -1, ValueError, r"SampleJob.seed must be an int >= 0, got -1"),
        ("seed", True, TypeError, r"SampleJob.seed must be an int >= 0, got True"),
        ("max_len", 0, ValueError, r"SampleJob.max_len must be an int >= 1, got 0"),
        ("max_len", 8.0, TypeError, r"SampleJob.max_len must be an int >= 1, got 8.0"),
    ],
)
def test_sample_job_checks_its_fields(field, value, error, message):
    job = make_job(0)
    fields = {name: getattr(job, name) for name in ("memory", "memory_padding_mask", "prefixes")}
    fields.update(seed=0, max_len=MAX_LEN)
    fields[field] = value
    with pytest.raises(error, match=message):
        SampleJob(**fields)


def test_sample_job_keeps_its_prefixes_as_tuples_of_ints():
    job = make_job(0)
    rows = [list(row) for row in job.prefixes]
    rows[1] = torch.tensor(rows[1])  # a tensor row is fine too
    copy = SampleJob(job.memory, job.memory_padding_mask, rows, 0)
    assert copy.prefixes == tuple(tuple(int(t) for t in row) for row in rows)
    assert all(type(t) is int for row in copy.prefixes for t in row)
