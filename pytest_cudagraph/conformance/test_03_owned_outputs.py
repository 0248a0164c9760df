"""Owned outputs: an output kept while the same graph replays for other inputs does not
change, and its storage is not graph memory (the static output buffer is rewritten by every
replay)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pytest_cudagraph.conformance.support import differences, draw, graph_pool_of, tensors_in
from pytest_cudagraph.conformance.target import CudaGraphTarget
from pytest_cudagraph.skips import needs_cuda

CASE = 1
LATER_REPLAYS = 4


@needs_cuda
def test_owned_outputs(target: CudaGraphTarget, record_figure: Callable[[str], None]) -> None:
    first = draw(target, CASE, seed=0)
    kept = target.graphed(first)
    snapshot = [tensor.clone() for tensor in tensors_in(kept)]
    problems = [
        f"first call differs from eager: {d}"
        for d in differences(target.eager(first), kept, target.tolerance)
    ]
    later = [target.graphed(draw(target, CASE, seed)) for seed in range(1, LATER_REPLAYS + 1)]
    torch.cuda.synchronize(target.device)
    problems += [f"kept output changed: {d}" for d in differences(snapshot, tensors_in(kept))]
    later_storages = {t.untyped_storage().data_ptr() for out in later for t in tensors_in(out)}
    for index, tensor in enumerate(tensors_in(kept)):
        pool = graph_pool_of(tensor)
        if pool is not None:
            problems.append(f"output tensor {index} lives in graph memory pool {pool}")
        if tensor.untyped_storage().data_ptr() in later_storages:
            problems.append(f"output tensor {index} shares storage with a later call's output")
    record_figure(f"output kept over {LATER_REPLAYS} replays of key {target.key_of(first)!r}")
    assert not problems, "\n".join(problems)
