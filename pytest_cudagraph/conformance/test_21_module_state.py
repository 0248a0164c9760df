"""Module state: a graphed call changes the state of the modules it runs on as an eager call
changes the eager side's. Python in a forward runs at warm-up and capture, never on replay: a
counter it bumps or an attribute it sets stays as the capture left it (PyTorch #114844,
Megatron-LM #1494); and warm-ups run the forward more often than the caller called it, so state
the forward updates moves further than eager's (BatchNorm's running statistics: LibreYOLO #671,
TransformerEngine #869, and ``make_graphed_callables``' own warm-ups).

Needs ``state.sides`` (the adapters give it where each side runs modules of its own). Before
each pair of calls the eager side is given the graphed side's state, copied in place
(``judging.transplant``), so that both start alike; then one eager and one graphed call on the
same inputs, and their states compared (parameters, buffers, tensor and number attributes,
tensors kept in lists and dicts) within the state's tolerance (``judging.state_tolerance``). On each of up to 2 keys, two pairs: the first graphed call of a key after ``reset()``
builds its graph (warm-ups, capture, its first replay), the second replays it. 4 graphed and 4
eager calls, well under a second."""

from __future__ import annotations

from pytest_cudagraph.conformance.catalog import given, needed
from pytest_cudagraph.conformance.judging import (
    case_in_key,
    checked_sides,
    draw,
    eager_call,
    graphed_call,
    keys_held,
    states_apart,
    transplant,
)
from pytest_cudagraph.conformance.protocol import Cache, CudaGraphTarget, State
from pytest_cudagraph.conformance.suite import FigureRecorder
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.state import module_state
from pytest_cudagraph.skips import needs_cuda

MAX_KEYS = 2
CALLS_PER_KEY = 2  # the first builds the key's graph, the second replays it


@needs_cuda
def test_module_state(
    target: CudaGraphTarget, capture_counter: CaptureCounter, record_figure: FigureRecorder
) -> None:
    sides = needed(target, State, "sides").sides
    assert sides is not None
    pair = checked_sides(sides)
    key_count = keys_held(target, MAX_KEYS, given(target, Cache, "capacity"))
    problems: list[str] = []
    built = 0
    with capture_counter:
        for key_index in range(key_count):
            for repeat in range(CALLS_PER_KEY):
                case = case_in_key(target, key_index, repeat)
                inputs = draw(target, case, seed=case)
                transplant(pair)
                captures = len(capture_counter.captures)
                eager_call(target, inputs, seed=case)
                graphed_call(target, draw(target, case, seed=case), seed=case)
                building = len(capture_counter.captures) > captures
                built += building
                what = "building its graph (warm-ups, capture, replay)" if building else "a replay"
                key = target.key_of(inputs)
                problems += [
                    f"case {case} (key {key!r}), {what}: {m.describe()}"
                    for m in states_apart(target, pair)
                ]
    pieces = len(module_state(pair[1]))
    record_figure(
        f"{key_count * CALLS_PER_KEY} call pairs over {key_count} keys ({built} built a graph): "
        f"{pieces} pieces of state compared"
    )
    assert not problems, (
        "a graphed call changed its modules' state unlike an eager call:\n"
        + "\n".join(problems[:10])
    )
