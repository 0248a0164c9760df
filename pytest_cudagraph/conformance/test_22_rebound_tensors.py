"""No rebound tensors: every tensor the graphed side holds on the target's device keeps its
storage from one call to the next. A graph reads and writes the addresses it was captured on,
so a tensor replaced instead of copied into (``self.cache = torch.zeros(...)`` after capture,
weights loaded with ``load_state_dict(..., assign=True)``) leaves the graph on the old memory:
it answers for the old values while they last, and for whatever lands there once they are
freed (vLLM's input-address check, TensorRT-LLM's strict buffers, FastDeploy #6746). The
tensors are found from ``graphed`` itself (``engines.reach``: its closure or object, their
attributes, modules and containers), each named by its path.

Over 3 rounds on up to 4 keys (no more than ``capacity``), the storages are taken after each
call and compared with the ones before it, on calls that captured nothing (counted by
``CaptureCounter``): a call that captures may give a new graph new buffers. At most 12 graphed
calls and no eager one; each look walks the target's objects (under a second on the
reference)."""

from __future__ import annotations

from pytest_cudagraph.conformance.catalog import given
from pytest_cudagraph.conformance.judging import calls_over_keys, draw, graphed_path, keys_held
from pytest_cudagraph.conformance.protocol import Cache, CudaGraphTarget
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.reach import reachable_tensors, rebound, storages
from pytest_cudagraph.skips import needs_cuda

MAX_KEYS = 4
ROUNDS = 3  # the first captures each key, the later ones replay it


@needs_cuda
def test_no_rebound_tensors(
    target: CudaGraphTarget, capture_counter: CaptureCounter, record_figure: FigureRecorder
) -> None:
    graphed = graphed_path(target)
    key_count = keys_held(target, MAX_KEYS, given(target, Cache, "capacity"))

    def look() -> dict[str, int]:
        reach = reachable_tensors(graphed, "graphed", device=target.device)
        assert not reach.truncated, "graphed holds too many objects to walk"
        return storages(reach.tensors)

    problems: list[str] = []
    judged = 0
    before = look()
    with capture_counter:
        for call, case in calls_over_keys(target, key_count, range(ROUNDS)):
            inputs = draw(target, case, seed=case)
            captures = len(capture_counter.captures)
            graphed(inputs)
            after = look()
            if len(capture_counter.captures) == captures:
                judged += 1
                where = f"call {call} (case {case}, key {target.key_of(inputs)!r})"
                problems += [f"{where}: {r.describe()}" for r in rebound(before, after)]
            before = after
    record_figure(
        f"{ROUNDS * key_count} calls over {key_count} keys, {judged} without a capture: "
        f"{len(before)} tensors held"
    )
    assert not problems, "tensors the graphed side holds were replaced:\n" + "\n".join(
        problems[:10]
    )
