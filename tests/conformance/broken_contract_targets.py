"""Targets that break the contract a target declares, one way each, built on the examples: the
bucket runner (examples/bucket_runner_target.py), gpt-fast's decode step
(examples/decode_step_target.py) and a small state shared by both sides. The CPU twins fail a
check that runs without CUDA (test_broken_contract_targets.py runs the suite on them on the
CPU); the GPU twins fail a check that needs the graphs.

Use as ``--cudagraph-target broken_contract_targets:<factory>`` with this folder importable.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from pytest_cudagraph.conformance import (
    Case,
    CudaGraphTarget,
    Guards,
    Tolerance,
    graphs_on,
    hand_written,
)
from pytest_cudagraph.engines.units import MiB
from pytest_cudagraph.examples import bucket_runner_target, decode_step_target
from pytest_cudagraph.examples.bucket_runner import VOCAB, BucketRunner

# CPU twins: the checks that run without CUDA fail them.


def eager_raises(device: torch.device) -> CudaGraphTarget:
    """Its eager side reads an input the draw does not give (a plumbing error): every call
    raises KeyError, on a laptop too."""
    target = bucket_runner_target.make_target(device)
    return dataclasses.replace(target, eager=lambda inputs: inputs["ids"])


def unseeded_eager(device: torch.device) -> CudaGraphTarget:
    """Its eager side adds noise from a generator of its own, which no seed of the suite's
    reaches: no two calls agree, so no comparison with it can pass."""
    target = bucket_runner_target.make_target(device)
    own = torch.Generator(device).manual_seed(0)
    eager = target.eager

    def noisy(inputs: dict[str, Tensor]) -> Tensor:
        output = eager(inputs)
        return output + torch.rand(output.shape, generator=own, device=device)

    return dataclasses.replace(target, eager=noisy)


def tolerance_of_a_missing_part(device: torch.device) -> CudaGraphTarget:
    """A tolerance for the output part "logits" of an output that is one tensor."""
    target = bucket_runner_target.make_target(device)
    return dataclasses.replace(target, tolerance={"logits": Tolerance(atol=1e-3)})


def assert_guard_undeclared(device: torch.device) -> CudaGraphTarget:
    """gpt-fast's guard is an assert; without AssertionError among its refusal_errors, it is
    not a refusal."""
    target = decode_step_target.make_target(device)
    assert target.guards is not None
    return dataclasses.replace(target, guards=Guards(target.guards.modes))


def rows_from_the_generator(device: torch.device) -> CudaGraphTarget:
    """Draws each real batch's size from the generator: two draws of one case differ in shape,
    so no input can be swapped for another draw's."""
    target = bucket_runner_target.make_target(device)

    def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        bucket = case.key
        rows = int(torch.randint(bucket // 2 + 1, bucket + 1, (), generator=generator))
        tokens = torch.randint(VOCAB, (rows,), generator=generator, device=device)
        return {"input_ids": tokens, "positions": torch.zeros_like(tokens)}

    return dataclasses.replace(target, draw=draw)


# GPU twins: a check that needs the graphs fails them.


class BusyAfterAFault(BucketRunner):
    """Marks itself busy for a call and refuses a call while busy, but an error in the call
    leaves the mark: the call after a failed replay raises (and clears it)."""

    busy = False

    def run(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        if self.busy:
            self.busy = False
            raise RuntimeError("the runner is busy with another call")
        self.busy = True
        output = super().run(input_ids, positions)
        self.busy = False
        return output


def runner_busy_after_a_fault(device: torch.device) -> CudaGraphTarget:
    return bucket_runner_target.make_target(device, BusyAfterAFault)


class KeepsAWorkspacePerCall(BucketRunner):
    """Allocates a 64 MiB workspace on every call and keeps it: memory grows without bound."""

    def run(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        workspaces = self.__dict__.setdefault("workspaces", [])
        workspaces.append(torch.empty(64 * MiB, dtype=torch.uint8, device=input_ids.device))
        return super().run(input_ids, positions)


def runner_keeps_a_workspace_per_call(device: torch.device) -> CudaGraphTarget:
    return bucket_runner_target.make_target(device, KeepsAWorkspacePerCall)


def unwritten_shared_state(device: torch.device) -> CudaGraphTarget:
    """Both sides read one state buffer, and only the eager side writes it: the graph computes
    from whatever the last eager call left, which parity (eager, then graphed, on the same
    inputs) cannot tell from the right answer."""
    state = torch.zeros(64, device=device)

    def eager(inputs: dict[str, Tensor]) -> Tensor:
        state.copy_(inputs["x"])
        return state * 2

    def draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"x": torch.randn(64, generator=generator, device=device)}

    graphed = None
    if graphs_on(device):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_output = state * 2  # reads the state; nothing writes x into it

        def graphed(inputs: dict[str, Tensor]) -> Tensor:
            graph.replay()
            return static_output.clone()

    return hand_written(
        device=device, eager=eager, graphed=graphed, keys=[64], draw=draw, key_of=lambda inputs: 64
    )
