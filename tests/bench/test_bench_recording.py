"""What recording a capture's reads costs the capture: the exact graph cache's build at each key
under ``CaptureCounter(record=True)`` (a dispatch mode sees every op the capture makes, and what
each reads: ``engines.graph_recorder``), against the same build under ``CaptureCounter()``.

A round builds the key's graph twice from an empty cache, unrecorded (the benchmark's untimed
setup) and recorded (its timed call); ``recording_overhead`` is the median over rounds of the
recorded capture's seconds over the unrecorded one's, each as the counter times it, from
``capture_begin`` to the return of ``capture_end`` (where the recorder runs), so that both sides
of a pair see the same clocks.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from bench_workloads import FORWARD_KEYS, forward_inputs, key_id

from pytest_cudagraph.engines.captures import Capture, CaptureCounter
from pytest_cudagraph.skips import needs_cuda
from reasyn_ref.graph_cache import GraphCache

pytestmark = needs_cuda

ROUNDS = 10


@pytest.mark.parametrize("key", FORWARD_KEYS, ids=key_id)
def test_recording(key, cuda_benchmark, cuda_device, default_decoder):
    ar_step = forward_inputs(default_decoder.config, key, cuda_device)
    cache = GraphCache(default_decoder, cuda_device)
    builds: dict[bool, list[tuple[Capture, torch.Tensor]]] = {False: [], True: []}

    def build(record: bool) -> None:
        cache.clear()
        with CaptureCounter(record=record) as counter:
            logits = cache(ar_step)
        [capture] = counter.captures
        builds[record].append((capture, logits))

    # A warm-up pair, not kept: the first builds at a key pay first uses (cuBLAS handles and
    # workspaces, the allocator's first blocks) that no later build pays again.
    build(False)
    build(True)
    for made in builds.values():
        made.clear()
    cuda_benchmark.pedantic(build, args=(True,), setup=lambda: build(False), rounds=ROUNDS)
    want = cache.eager(ar_step)
    for record, made in builds.items():
        assert all(torch.equal(logits, want) for _, logits in made), f"record={record}"
        assert all((capture.record is not None) == record for capture, _ in made)
    recorded = builds[True][-1][0].record
    # What the recorder saw of the capture: its ops, and the weights the graph reads.
    assert recorded.ops and recorded.reads_storage_of(cache.graph_module.embed.weight)
    unrecorded, recorded_s = ([c.seconds for c, _ in builds[r]] for r in (False, True))
    cuda_benchmark.extra_info.update(
        bench="recording",
        key=list(key),
        recording_overhead=statistics.median(
            on / off for off, on in zip(unrecorded, recorded_s, strict=True)
        ),
        recorded_capture_s=statistics.median(recorded_s),
        unrecorded_capture_s=statistics.median(unrecorded),
        recorded_ops=len(recorded.ops),
        recorded_reads=len(recorded.reads),
        pairs=len(recorded_s),
    )
    cache.clear()
