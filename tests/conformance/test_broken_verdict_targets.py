"""The new checks can fail, and one failing check changes no later verdict: each target of
broken_verdict_targets.py fails the check meant for it, named, and passes the others; the
targets that are right pass the new checks.

The GPU runs are the conformance suite in a fresh process; they leave out the worker-processes
check (its workers load the plain reference from a checkpoint, so no broken cache reaches it)
and device binding (two GPUs; no broken target here is about devices). On the CPU: what a
failure leaves behind is let go, and each broken target builds and keeps the protocol."""

from __future__ import annotations

import gc
import re
import sys
import weakref
from collections.abc import Callable

import pytest
import torch
from suite_runner import table_verdicts
from test_broken_zoo_targets import declared_names

from pytest_cudagraph.conformance._judging import draw, numbered
from pytest_cudagraph.conformance._loading import build_target
from pytest_cudagraph.conformance._suite import forget_last_failure
from pytest_cudagraph.skips import needs_cuda

# Each test runs the suite on a broken target (the README's test command leaves it out).
pytestmark = pytest.mark.slow

FACTORIES = ("output_in_input", "recapturing", "raising_sampler")
# Slow, and about nothing these targets break.
LEFT_OUT = "not worker_processes and not device_binding"


# CPU


class Held:
    """Stands for what a failed check built (a sampler and its graphs)."""


def fail_holding(held: Held) -> None:
    raise RuntimeError(f"failed while holding {held!r}")


def test_forgetting_the_last_failure_lets_what_its_frames_held_go() -> None:
    held = Held()
    alive = weakref.ref(held)
    try:
        fail_holding(held)
    except RuntimeError as error:  # as pytest's runner keeps it, for post-mortem debugging
        sys.last_type, sys.last_value, sys.last_traceback = type(error), error, error.__traceback__
        if sys.version_info >= (3, 12):
            sys.last_exc = error
    del held
    gc.collect()
    assert alive() is not None, "the failure's frames must hold the object for this to prove it"
    forget_last_failure()
    gc.collect()
    assert alive() is None
    assert not any(hasattr(sys, name) for name in ("last_exc", "last_value", "last_traceback"))
    forget_last_failure()  # nothing to forget is fine


@pytest.mark.parametrize("factory", FACTORIES)
def test_each_broken_target_keeps_the_protocol_on_the_cpu(factory: str) -> None:
    target = build_target(f"broken_verdict_targets:{factory}", torch.device("cpu"))
    case = numbered(target, 1)
    inputs = draw(target, case, seed=0)
    assert target.key_of(inputs) == target.key_of(draw(target, case, seed=1)) == case.key


def test_the_raising_sampler_samples_as_the_reference_with_graphs_off() -> None:
    broken = build_target("broken_verdict_targets:raising_sampler", torch.device("cpu"))
    reference = build_target("reasyn", torch.device("cpu"))
    assert broken.sampling is not None and reference.sampling is not None
    assert broken.sampling.sample(0, False) == reference.sampling.sample(0, False)


# GPU


# The checks whose verdicts the GPU tests read, by their rows' names.
NAMED = {"output storage", "parity", "captures", "concurrency", "identical sampling"}


def test_the_gpu_verdicts_name_declared_checks() -> None:
    assert NAMED <= declared_names(), NAMED - declared_names()


def failed(result: pytest.RunResult) -> set[str]:
    return {
        check for check, verdict in table_verdicts(result).items() if verdict in ("FAILED", "ERROR")
    }


@needs_cuda
@pytest.mark.parametrize(
    ("spec", "named"),
    [
        (
            "broken_verdict_targets:output_in_input",
            r"call 0 \(key .*\): output shares storage with its inputs\['x'\]",
        ),
        # A view of the graph's static output: the next call of its key hands out the same memory.
        (
            "broken_targets:static_output",
            r"call \d+ \(key .*\): output shares storage with call \d+ \(key .*\)'s output",
        ),
    ],
)
def test_output_storage_names_what_an_output_shares(
    run_suite: Callable[..., pytest.RunResult], spec: str, named: str
) -> None:
    result = run_suite("--cudagraph-target", spec, "-k", "output_storage or parity")
    assert failed(result) == {"output storage", "parity"}, result.stdout.str()
    assert re.search(named, result.stdout.str()), result.stdout.str()


@needs_cuda
@pytest.mark.parametrize("spec", ["reasyn", "foreign:make_target"])
def test_the_right_targets_pass_the_new_checks(
    run_suite: Callable[..., pytest.RunResult], spec: str
) -> None:
    result = run_suite("--cudagraph-target", spec, "-k", "output_storage or captures")
    verdicts = table_verdicts(result)
    assert verdicts == {"output storage": "passed", "captures": "passed"}, result.stdout.str()
    result.stdout.fnmatch_lines(["  captures * replays per capture; a capture takes *"])


@needs_cuda
def test_a_cache_recapturing_held_keys_fails_captures(
    run_suite: Callable[..., pytest.RunResult],
) -> None:
    result = run_suite(
        "--cudagraph-target",
        "broken_verdict_targets:recapturing",
        "-k",
        f"{LEFT_OUT} and not memory",
    )
    # Capturing on every call also races the other threads of the concurrency check now and
    # then (on the H200: 1 of 48 calls hit "operation failed due to a previous error during
    # capture"), so concurrency may fail too; every other check must pass.
    found = failed(result)
    assert "captures" in found, result.stdout.str()
    assert found <= {"captures", "concurrency"}, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*keys the cache held were captured again (* keys, capacity *): * in * of 5 rounds*"]
    )


@needs_cuda
def test_a_failing_check_changes_no_later_verdict(
    run_suite: Callable[..., pytest.RunResult],
) -> None:
    """The raising sampler fails identical sampling; every other check, bounded memory after
    it included, gives the reference's verdict."""
    right = table_verdicts(run_suite("--cudagraph-target", "reasyn", "-k", LEFT_OUT))
    result = run_suite(
        "--cudagraph-target", "broken_verdict_targets:raising_sampler", "-k", LEFT_OUT
    )
    broken = table_verdicts(result)
    assert right["identical sampling"] == "passed"
    assert broken["identical sampling"] == "FAILED", result.stdout.str()
    result.stdout.fnmatch_lines(["*SamplerFault: the sampler failed after its * graph(s) ran*"])
    del right["identical sampling"], broken["identical sampling"]
    assert broken == right, result.stdout.str()
