"""Device binding: a target on cuda:1 works while cuda:0 is current, and leaves cuda:0
untouched: no CUDA context there (NVML), no torch memory, and cuda:0 still current.

It runs in a fresh spawned process, the only place where cuda:0 can be current and untouched."""

from __future__ import annotations

import pytest
import torch

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._processes import binding_probe, run_in_fresh_process
from pytest_cudagraph.conformance._suite import Conclude, FigureRecorder, chosen_target_spec
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines.units import MiB

CASES = (0, 1, 2, 3)  # four keys, each captured and then replayed
TIMEOUT_S = 300


@check("device binding", runs_on="gpu")
@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2,
    reason="needs 2 visible GPUs (under xdist each worker sees only its own GPU: run this "
    "check without -n)",
)
def test_device_binding(
    request: pytest.FixtureRequest, record_figure: FigureRecorder, conclude: Conclude
) -> None:
    spec = chosen_target_spec(request.config)
    found = run_in_fresh_process(binding_probe, spec, CASES, timeout=TIMEOUT_S)
    problems = list(found["problems"])
    if found["current_after"] != 0:
        problems.append(f"cuda:{found['current_after']} was left current instead of cuda:0")
    if found["torch_reserved_on_current"]:
        reserved = found["torch_reserved_on_current"] / MiB
        problems.append(f"torch reserved {reserved:.1f} MiB on cuda:0")
    before, after = found["nvml_on_current"]
    if before is None and after is not None:
        problems.append(f"a CUDA context appeared on cuda:0 (NVML: {after / MiB:.0f} MiB)")
    elif isinstance(before, int) and isinstance(after, int) and after - before >= MiB:
        problems.append(f"this process's memory on cuda:0 grew by {(after - before) / MiB:.0f} MiB")
    figure = f"{found['calls']} calls over {found['keys']} keys on cuda:1 with cuda:0 current"
    conclude(
        Judgement(problems, figure, found["calls"], "calls"), "cuda:1's target touched cuda:0:"
    )
    if not isinstance(found["nvml_on_target"], int):
        pytest.skip(
            "graphs on cuda:1 match eager and torch left cuda:0 alone, but NVML cannot see "
            f"this process's contexts ({found['nvml_on_target']!r} on cuda:1)"
        )
    record_figure(
        f"{found['calls']} calls over {found['keys']} keys on cuda:1 with cuda:0 current: "
        "max |diff| 0, no context on cuda:0"
    )
