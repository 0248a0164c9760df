"""Running a conformance check as a plain function on the CPU: a small target to vary, and the
fixtures a check asks for, stood in for (torch.cuda.CUDAGraph's shape for capture and replay
counts, a progress that says nothing, errors explained with the user's frames, no account)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from graph_stand_ins import StandInGraph
from torch import Tensor

from pytest_cudagraph.conformance import Case, CudaGraphTarget
from pytest_cudagraph.conformance.loading import explained
from pytest_cudagraph.engines.captures import CaptureCounter

CPU = torch.device("cpu")
KEYS = (2, 3, 4)  # rows of x, one key each


def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
    return {"x": torch.randn(case.key, 4, generator=generator)}


def double(inputs: dict[str, Tensor]) -> Tensor:
    return inputs["x"] * 2


def cpu_target(**changes: object) -> CudaGraphTarget:
    """Three keys (x of 2, 3 or 4 rows); both sides double x."""
    fields: dict[str, object] = dict(
        device=CPU,
        eager=double,
        graphed=double,
        keys=KEYS,
        draw=draw,
        key_of=lambda inputs: inputs["x"].shape[0],
    )
    return CudaGraphTarget(**{**fields, **changes})


def run(check: Callable[..., None], target: CudaGraphTarget, **fixtures: object) -> list[str]:
    """The check's figures; AssertionError (its verdict) propagates. A fixture the check asks
    for and is not given is a stand-in (no factory for ``target_factory``)."""
    figures: list[str] = []
    wanted = inspect.signature(check).parameters
    if "capture_counter" in wanted:
        fixtures.setdefault("capture_counter", CaptureCounter(StandInGraph))
    if "target_factory" in wanted:
        fixtures.setdefault("target_factory", None)
    if "progress" in wanted:
        fixtures.setdefault("progress", lambda where: None)
    if "explain" in wanted:
        fixtures.setdefault("explain", explained)
    if "record_account" in wanted:
        fixtures.setdefault("record_account", lambda ran, gpu_skips: None)
    check(target, **fixtures, record_figure=figures.append)
    return figures
