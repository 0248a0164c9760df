"""Running a conformance check as a plain function on the CPU: a small target to vary, and the
fixtures a check asks for, stood in for (torch.cuda.CUDAGraph's shape for capture and replay
counts and faults, a progress that says nothing, no account, a conclusion that keeps the figure,
a parity engine that fails on a mismatch as the ``graph_parity`` fixture does), the target's
capabilities by their slot's name, as the suite's conftest hands them, and the target made
ready as the suite's ``target`` fixture makes it."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import torch
from graph_stand_ins import StandInGraph
from torch import Tensor, nn

from pytest_cudagraph.conformance import Case, CudaGraphTarget
from pytest_cudagraph.conformance._judging import called, in_step
from pytest_cudagraph.conformance._loading import explained
from pytest_cudagraph.conformance._protocol import CAPABILITIES
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.conformance._witness import Witness
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.faults import FaultInjector
from pytest_cudagraph.engines.graph_faults import GraphFaults
from pytest_cudagraph.engines.parity import ParityChecker, ParityResult

CPU = torch.device("cpu")
KEYS = (2, 3, 4)  # rows of x, one key each


def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
    return {"x": torch.randn(case.key, 4, generator=generator)}


def double(inputs: dict[str, Tensor]) -> Tensor:
    return inputs["x"] * 2


class RunningTotal(nn.Module):
    """A step that adds each batch into a running total it answers with: accumulating state."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        self.total += inputs["x"].sum(0)
        return self.total + inputs["x"]


def rows(inputs: dict[str, Tensor]) -> int:
    """The key of a call of ``cpu_target``: the rows of x."""
    return inputs["x"].shape[0]


def cpu_target(**changes: object) -> CudaGraphTarget:
    """Three keys (x of 2, 3 or 4 rows); both sides double x."""
    fields: dict[str, object] = dict(
        device=CPU, eager=double, graphed=double, keys=KEYS, draw=draw, key_of=rows
    )
    return CudaGraphTarget(**{**fields, **changes})


class StandInConclude:
    """The ``conclude`` fixture without a test item: figures kept in a list, the verdict as the
    suite gives it (pytest.fail)."""

    def __init__(self, figures: list[str]) -> None:
        self.figures = figures

    def __call__(self, judgement: Judgement, headline: str, also: str = "") -> None:
        self.figures.append("; ".join(part for part in (judgement.figure, also) if part))
        failure = judgement.failure(headline)
        if failure is not None:
            pytest.fail(failure, pytrace=False)


def reported(failure: pytest.ExceptionInfo[BaseException]) -> list[str]:
    """The lines of a check's failure: its headline, then each problem."""
    return str(failure.value).splitlines()


def failing_on_mismatch(result: ParityResult) -> None:
    """What the ``graph_parity`` fixture does with a result: a mismatch fails the test."""
    if not result.ok:
        pytest.fail(result.reason(), pytrace=False)


def run(
    check: Callable[..., None],
    target: CudaGraphTarget,
    /,
    *,
    prepared: bool = True,
    **fixtures: object,
) -> list[str]:
    """The check's figures; its failure (pytest.fail) propagates. A fixture the check asks for
    and is not given is a stand-in (no factory for ``target_factory``). Before the check the
    target is made ready as the suite's ``target`` fixture makes it (``prepared``): its cache
    reset, its two sides brought together (what breaks a rule of the state fails, as there);
    without, what the check itself does is all there is."""
    if prepared:
        prepare(target)
    figures: list[str] = []
    wanted = inspect.signature(check).parameters
    fixtures.setdefault("capture_counter", CaptureCounter(StandInGraph))
    fixtures.setdefault("target_factory", None)
    stand_ins: dict[str, Callable[[], object]] = {
        "target": lambda: target,
        "progress": lambda: lambda where: None,
        "record_account": lambda: lambda *account: None,
        "conclude": lambda: StandInConclude(figures),
        "explain": lambda: explained,
        "graph_parity": lambda: ParityChecker(CPU, on_result=failing_on_mismatch),
        "fault_injector": FaultInjector,
        "torch_graph_faults": lambda: GraphFaults(StandInGraph),
        "witness": lambda: Witness(target, fixtures["capture_counter"], fixtures["target_factory"]),  # type: ignore[arg-type]
        **{kind.SLOT: (lambda slot=kind.SLOT: getattr(target, slot)) for kind in CAPABILITIES},
    }
    given = {
        name: fixtures[name] if name in fixtures else stand_ins[name]()
        for name in wanted
        if name in fixtures or name in stand_ins
    }
    check(**given)
    return figures


def prepare(target: CudaGraphTarget) -> None:
    """The target as a check gets it from the suite: its cache reset, its sides in step."""
    if target.cache is not None and target.cache.reset is not None:
        called("Cache.reset", target.cache.reset)
    try:
        in_step(target)
    except AssertionError as error:
        pytest.fail(str(error), pytrace=False)
