"""Module state: a graphed call changes the state of the modules it runs on as an eager call
changes the eager side's. Python in a forward runs at warm-up and capture, never on replay: a
counter it bumps or an attribute it sets stays as the capture left it (PyTorch #114844,
Megatron-LM #1494); and warm-ups run the forward more often than the caller called it, so state
the forward updates moves further than eager's (BatchNorm's running statistics: LibreYOLO #671,
TransformerEngine #869, and ``make_graphed_callables``' own warm-ups).

Needs ``state.sides``. Before each pair of calls the graphed side is given the eager side's
written state, copied in place (``bring_together``: what no call writes, parameters and modes
among it, must already be equal), so that both start alike; then one eager and one graphed call
on the same inputs, and their states compared (parameters, buffers, tensor, number and array
attributes, namespaces, lists and dicts of them) within the state's tolerance
(``loosest_tolerance``). On each of up to 2 keys, two pairs: the first graphed call of a key
after ``reset()`` builds its graph (warm-ups, capture, its first replay), the second replays it.
4 graphed and 4 eager calls, well under a second."""

from __future__ import annotations

from pytest_cudagraph.conformance._catalog import check, declared
from pytest_cudagraph.conformance._judging import (
    Episodes,
    bring_together,
    case_of,
    draw,
    eager_call,
    first_keys,
    graphed_call,
    sides_of,
    states_apart,
)
from pytest_cudagraph.conformance._protocol import Cache, CudaGraphTarget
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.state import module_state

MAX_KEYS = 2
CALLS_PER_KEY = 2  # the first builds the key's graph, the second replays it


@check("module state", needs=("state.sides",), sharper_with=("cache.capacity",))
def test_module_state(
    target: CudaGraphTarget,
    cache: Cache | None,
    capture_counter: CaptureCounter,
    conclude: Conclude,
) -> None:
    sides = declared(sides_of(target))
    keys = first_keys(target, MAX_KEYS, cache.capacity if cache is not None else None)
    problems: list[str] = []
    built = 0
    episodes = Episodes(target)
    with capture_counter:
        for key in keys:
            for repeat in range(CALLS_PER_KEY):
                case = case_of(target, key, repeat)
                inputs = draw(target, case, seed=case.number)
                episodes.begin()
                bring_together(target, sides)
                captures = len(capture_counter.captures)
                eager_call(target, inputs, seed=case.number)
                graphed_call(target, draw(target, case, seed=case.number), seed=case.number)
                building = len(capture_counter.captures) > captures
                built += building
                what = "building its graph (warm-ups, capture, replay)" if building else "a replay"
                problems += [
                    f"case {case.number} (key {key!r}), {what}: {m.describe()}"
                    for m in states_apart(target, sides)
                ]
    pieces = len(module_state(sides.graphed))
    pairs = len(keys) * CALLS_PER_KEY
    figure = (
        f"{pairs} call pairs over {len(keys)} keys ({built} built a graph): "
        f"{pieces} pieces of state compared"
    )
    headline = "a graphed call changed its modules' state unlike an eager call:"
    conclude(Judgement(problems, figure, pieces * pairs, "pieces of state compared"), headline)
