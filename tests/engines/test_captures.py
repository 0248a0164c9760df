"""CaptureCounter on a stand-in graph class with torch.cuda.CUDAGraph's method names."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from graph_stand_ins import StandInGraph

from pytest_cudagraph.engines.captures import (
    COMPILED_CAPTURES,
    Capture,
    CaptureCounter,
    replays_to_repay,
)


class BaseGraph:
    """Like torch._C._CUDAGraph: the methods live on a base class."""

    def capture_begin(self, pool: object = None, capture_error_mode: str = "global") -> None:
        self.capturing = True

    def capture_end(self) -> None:
        if getattr(self, "broken", False):
            raise RuntimeError("operation failed due to a previous error during capture")
        self.capturing = False

    def replay(self) -> str:
        return "replayed"


@pytest.fixture
def graph_class() -> type:
    """A fresh subclass per test, like torch.cuda.CUDAGraph over its C base."""
    return type("FakeGraph", (BaseGraph,), {"replay": BaseGraph.replay})


def capture(graph: BaseGraph, seconds: float = 0.0) -> None:
    graph.capture_begin(capture_error_mode="thread_local")
    time.sleep(seconds)
    graph.capture_end()


class Cache:
    """A per-key graph cache; ``recapture`` builds the key's graph again on every call."""

    def __init__(self, graph_class: type, recapture: bool = False) -> None:
        self.graph_class, self.recapture, self.graphs = graph_class, recapture, {}

    def __call__(self, key: int) -> str:
        if key not in self.graphs or self.recapture:
            self.graphs[key] = self.graph_class()
            capture(self.graphs[key])
        return self.graphs[key].replay()


@pytest.mark.parametrize("recapture", [False, True])
def test_a_cache_that_captures_a_held_key_again_is_seen(graph_class: type, recapture: bool) -> None:
    cache = Cache(graph_class, recapture)
    with CaptureCounter(graph_class) as counter:
        for key in [1, 2, 1, 1, 2, 1]:
            with counter.key(key):
                assert cache(key) == "replayed"
    if recapture:
        assert counter.recaptured_keys() == {1: 4, 2: 2}
        assert counter.replays_per_capture() == 1.0
    else:
        assert counter.recaptured_keys() == {}
        assert counter.captures_per_key() == {1: 1, 2: 1}
        assert [capture.replays for capture in counter.captures] == [4, 2]
        assert counter.replays_per_capture() == 3.0
    assert counter.replays == 6


class PooledCache(Cache):
    """Like torch.compile's cudagraph trees: on its first call it captures an empty graph
    that only holds the memory pool and is never replayed."""

    def __call__(self, key: int) -> str:
        if not hasattr(self, "pool_graph"):
            self.pool_graph = self.graph_class()
            capture(self.pool_graph)
        return super().__call__(key)


@pytest.mark.parametrize("recapture", [False, True])
def test_a_graph_never_replayed_is_not_a_recapture(graph_class: type, recapture: bool) -> None:
    cache = PooledCache(graph_class, recapture)
    with CaptureCounter(graph_class) as counter:
        for key in [1, 1, 2, 1]:
            with counter.key(key):
                cache(key)
    # The pool's graph is a capture under key 1 (it shows in the time spent capturing) ...
    assert counter.captures_per_key() == ({1: 4, 2: 1} if recapture else {1: 2, 2: 1})
    assert counter.captures[0].replays == 0
    # ... but serves no call, so only a cache that records key 1 again is caught.
    if recapture:
        assert counter.served_captures_per_key() == {1: 3, 2: 1}
        assert counter.recaptured_keys() == {1: 3}
    else:
        assert counter.served_captures_per_key() == {1: 1, 2: 1}
        assert counter.recaptured_keys() == {}


def test_capture_time_runs_from_begin_to_end(graph_class: type) -> None:
    with CaptureCounter(graph_class) as counter:
        capture(graph_class(), seconds=0.02)
    [only] = counter.captures
    assert only.key is None
    assert 0.02 <= only.seconds < 1.0
    assert counter.capture_seconds() == only.seconds


def test_only_work_inside_the_scope_counts(graph_class: type) -> None:
    before = graph_class()
    capture(before)
    with CaptureCounter(graph_class) as counter:
        before.replay()  # captured outside: not this scope's capture
        inside = graph_class()
        capture(inside)
        inside.replay()
    inside.replay()
    capture(graph_class())
    assert counter.captures == [Capture(None, counter.captures[0].seconds, 1)]


def test_all_replays_counts_graphs_captured_before_the_scope_too(graph_class: type) -> None:
    """A runner captures its buckets at start-up: its replays still count as replays."""
    before = graph_class()
    capture(before)
    before.replay()  # outside the scope: not counted
    with CaptureCounter(graph_class) as counter:
        before.replay()
        inside = graph_class()
        capture(inside)
        inside.replay()
        before.replay()
    before.replay()
    assert (counter.all_replays, counter.replays) == (3, 1)


def test_a_graph_captured_again_starts_a_new_count(graph_class: type) -> None:
    graph = graph_class()
    with CaptureCounter(graph_class) as counter:
        capture(graph)
        graph.replay()
        capture(graph)
        graph.replay()
        graph.replay()
    assert [capture.replays for capture in counter.captures] == [1, 2]


def test_a_failed_capture_is_not_counted(graph_class: type) -> None:
    graph = graph_class()
    graph.broken = True
    with CaptureCounter(graph_class) as counter:
        with pytest.raises(RuntimeError, match="previous error during capture"):
            capture(graph)
    assert counter.captures == []


def test_leaving_the_scope_restores_the_class_exactly(graph_class: type) -> None:
    own_replay = vars(graph_class)["replay"]
    with CaptureCounter(graph_class):
        assert vars(graph_class)["capture_begin"] is not BaseGraph.capture_begin
    assert vars(graph_class)["replay"] is own_replay
    assert "capture_begin" not in vars(graph_class)
    assert "capture_end" not in vars(graph_class)


def test_nested_counters_both_count(graph_class: type) -> None:
    with CaptureCounter(graph_class) as outer:
        capture(graph_class())
        with CaptureCounter(graph_class) as inner:
            capture(graph_class())
    assert (len(outer.captures), len(inner.captures)) == (2, 1)
    assert "capture_begin" not in vars(graph_class)


def test_a_counter_counts_one_scope(graph_class: type) -> None:
    counter = CaptureCounter(graph_class)
    with counter, pytest.raises(RuntimeError, match="already counting"):
        counter.__enter__()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="graph_class must be a class"):
        CaptureCounter(BaseGraph())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"lacks the methods \['replay'\]"):
        CaptureCounter(type("NoReplay", (), {"capture_begin": print, "capture_end": print}))
    with pytest.raises(TypeError, match="unhashable"):
        with CaptureCounter(BaseGraph).key([8, 64]):
            pass


def test_replays_to_repay_one_capture() -> None:
    assert replays_to_repay(0.5, eager_seconds=0.010, graph_seconds=0.005) == pytest.approx(100)
    assert replays_to_repay(0.5, eager_seconds=0.005, graph_seconds=0.005) == math.inf
    with pytest.raises(ValueError, match="graph_seconds must be a finite number >= 0"):
        replays_to_repay(0.5, 0.01, -1.0)
    with pytest.raises(TypeError, match="capture_seconds must be a number"):
        replays_to_repay("0.5", 0.01, 0.005)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="capture_seconds must be a finite number >= 0"):
        replays_to_repay(10**400, 0.01, 0.005)  # past what a float holds


def test_each_thread_labels_its_own_captures(graph_class: type) -> None:
    """Thread A holds key "a" while the main thread opens key "b": A's next capture is still
    "a", so A capturing "a" twice is a recapture, and "b" is not one."""
    cache = Cache(graph_class, recapture=True)
    inside, captured_b = threading.Event(), threading.Event()

    def thread_a() -> None:
        with counter.key("a"):
            cache("a")
            inside.set()
            captured_b.wait(5)
            cache("a")

    with CaptureCounter(graph_class) as counter:
        worker = threading.Thread(target=thread_a)
        worker.start()
        inside.wait(5)
        with counter.key("b"):
            cache("b")
            captured_b.set()
            worker.join(5)
        cache("c")  # no key in this thread now
    assert counter.captures_per_key() == {"a": 2, "b": 1, None: 1}
    assert counter.recaptured_keys() == {"a": 2}


def test_nested_keys_label_a_capture_with_the_innermost(graph_class: type) -> None:
    with CaptureCounter(graph_class) as counter:
        with counter.key("outer"):
            capture(graph_class())
            with counter.key("inner"):
                capture(graph_class())
            capture(graph_class())
    assert [c.key for c in counter.captures] == ["outer", "inner", "outer"]


def test_a_call_labels_the_captures_of_any_thread_with_its_key_and_round(
    graph_class: type,
) -> None:
    """Code that captures on a thread of its own (the compiled adapter's) is labelled too; a
    thread's own key wins."""
    with CaptureCounter(graph_class) as counter, counter.call("k", 1):
        worker = threading.Thread(target=lambda: capture(graph_class()))
        worker.start()
        worker.join(5)
        with counter.key("own"):
            capture(graph_class())
    assert [(c.key, c.round, c.call) for c in counter.captures] == [
        ("k", 1, 0),
        ("own", None, None),
    ]


def test_a_keys_graphs_of_one_round_are_one_capture_and_a_later_rounds_another(
    graph_class: type,
) -> None:
    """A piecewise runner captures three graphs for a key in its first round; a key captured
    in a second round is captured again."""
    graphs = {key: [graph_class() for _ in range(3)] for key in ("a", "b")}
    with CaptureCounter(graph_class) as counter:
        for round_number in range(3):
            for key, pieces in graphs.items():
                with counter.call(key, round_number):
                    for graph in pieces:
                        if round_number == 0 or (key == "b" and graph is pieces[0]):
                            capture(graph)
                        graph.replay()
    assert counter.captures_per_key() == {"a": 3, "b": 5}
    assert counter.keys_captured_again() == {"b": 3}


def test_after_capture_is_called_after_each_counted_capture(graph_class: type) -> None:
    seen: list[int] = []
    counter = CaptureCounter(graph_class, after_capture=lambda: seen.append(len(counter.captures)))
    capture(graph_class())  # before the scope: not counted
    with counter:
        capture(graph_class())
        capture(graph_class())
    assert seen == [1, 2]


def test_calls_are_numbered_and_each_capture_knows_its_call_and_the_calls_that_replayed_it(
    graph_class: type,
) -> None:
    graph, other = graph_class(), graph_class()
    with CaptureCounter(graph_class) as counter:
        with counter.call("k", 0) as first:
            capture(graph)
            graph.replay()
        graph.replay()  # in no call: a replay, in no call's set
        with counter.call("k", 1) as second:
            graph.replay()
            graph.replay()
        with counter.call("j", 1) as third:
            capture(other)
    assert (first, second, third, counter.calls) == (0, 1, 2, 3)
    served, unserved = counter.captures
    assert (served.call, served.replays, served.replayed_in) == (0, 4, frozenset({0, 1}))
    assert (unserved.call, unserved.replayed_in) == (2, frozenset())


class Throwaway:
    """A runner whose real graphs were captured before the check; each call it captures one
    unrelated graph and replays it once, in that call, beside its real graph."""

    def __init__(self, graph_class: type) -> None:
        self.graph_class = graph_class
        self.real = graph_class()
        capture(self.real)

    def __call__(self) -> None:
        throwaway = self.graph_class()
        capture(throwaway)
        throwaway.replay()
        self.real.replay()


def test_a_capture_witnessed_for_a_key_serves_a_later_call_of_it(graph_class: type) -> None:
    """A graph replayed only in the call that captured it proves nothing of the key's graphs."""
    runner = Throwaway(graph_class)
    cache = Cache(graph_class)
    with CaptureCounter(graph_class) as counter:
        for round_number in range(3):
            with counter.call("thrown", round_number):
                runner()
            with counter.call("cached", round_number):
                cache(1)
    assert counter.witnessed(["thrown"]) == []
    [witnessed] = counter.witnessed(["thrown", "cached"])
    assert (witnessed.key, witnessed.call, witnessed.replayed_in) == (
        "cached",
        1,
        frozenset({1, 3, 5}),
    )
    assert counter.witnessed(["other"]) == []


def test_a_capture_replayed_in_one_later_call_is_witnessed(graph_class: type) -> None:
    graph = graph_class()
    with CaptureCounter(graph_class) as counter:
        with counter.call("k", 0):
            capture(graph)
        with counter.call("k", 1):
            graph.replay()
    assert [capture.call for capture in counter.witnessed(["k"])] == [0]


class SetDefault:
    """``graphs.setdefault(key, captured())``: the default is captured on every call, and only
    the first graph is replayed."""

    def __init__(self, graph_class: type) -> None:
        self.graph_class, self.graphs = graph_class, {}

    def captured(self) -> BaseGraph:
        graph = self.graph_class()
        capture(graph)
        return graph

    def __call__(self, key: int) -> None:
        self.graphs.setdefault(key, self.captured()).replay()


def test_a_key_captured_in_a_later_round_is_captured_again_replayed_or_not(
    graph_class: type,
) -> None:
    cache = SetDefault(graph_class)
    with CaptureCounter(graph_class) as counter:
        for round_number in range(3):
            for key in (1, 2):
                with counter.call(key, round_number):
                    cache(key)
    assert counter.served_captures_per_key() == {1: 1, 2: 1}
    assert counter.keys_captured_again() == {1: 3, 2: 3}
    cache = SetDefault(graph_class)
    with CaptureCounter(graph_class) as counter:
        for _ in range(2):
            with counter.key(1):
                cache(1)
    assert counter.recaptured_keys() == {1: 2}


class Compiled:
    """Like torch.compile's cudagraph trees: the first call runs without a graph and builds
    the tree manager, which captures an empty graph to hold its pool, never replayed; the
    second records the key's graph; later calls replay it."""

    def __init__(self, graph_class: type) -> None:
        self.graph_class, self.calls, self.graph = graph_class, 0, graph_class()

    def __call__(self) -> None:
        self.calls += 1
        if self.calls == 1:
            capture(self.graph_class())  # the pool's graph
            return
        if self.calls == 2:
            capture(self.graph)
        self.graph.replay()


def test_a_graph_never_replayed_before_its_key_served_a_replay_is_no_capture_of_it(
    graph_class: type,
) -> None:
    compiled = Compiled(graph_class)
    with CaptureCounter(graph_class) as counter:
        for round_number in range(4):
            with counter.call("k", round_number):
                compiled()
        for _ in range(2):  # unlabelled, replayed: never a key's
            unlabelled = graph_class()
            capture(unlabelled)
            unlabelled.replay()
        with counter.call("k", 4):
            capture(graph_class())  # after the key served replays: captured again
    assert counter.captures_per_key() == {"k": 3, None: 2}
    assert [c.follows_replay for c in counter.captures] == [False, False, False, False, True]
    assert counter.keys_captured_again() == {"k": 2}
    assert counter.recaptured_keys() == {"k": 2}


class Piecewise:
    """Two graphs per call, around an eager part; ``fallen_back`` runs the second piece
    eagerly from then on."""

    def __init__(self, graph_class: type) -> None:
        self.pieces = [graph_class(), graph_class()]
        for piece in self.pieces:
            capture(piece)
        self.fallen_back = False

    def __call__(self) -> None:
        self.pieces[0].replay()
        self.pieces[0].replay()  # a graph replayed twice in a call is one graph
        if not self.fallen_back:
            self.pieces[1].replay()


def test_each_call_counts_the_graphs_it_replayed_captured_before_the_count_too(
    graph_class: type,
) -> None:
    runner = Piecewise(graph_class)
    with CaptureCounter(graph_class) as counter:
        with counter.call("k", 0) as first:
            runner()
        runner.fallen_back = True
        with counter.call("k", 1) as second:
            runner()
        with counter.call("j", 1) as third:
            pass
    assert [counter.graphs_in_call(n) for n in (first, second, third)] == [2, 1, 0]
    assert [counter.replays_in_call(n) for n in (first, second, third)] == [3, 2, 0]
    assert counter.most_graphs_per_call() == {"k": 2, "j": 0}
    assert counter.graphs_in_call(7) == 0 == counter.replays_in_call(7)


def test_replays_on_another_thread_inside_a_call_count_for_that_call(graph_class: type) -> None:
    graph = graph_class()
    with CaptureCounter(graph_class) as counter:
        with counter.call("k", 0):
            worker = threading.Thread(target=lambda: capture(graph))
            worker.start()
            worker.join(5)
        with counter.call("k", 1) as second:
            worker = threading.Thread(target=graph.replay)
            worker.start()
            worker.join(5)
    assert counter.graphs_in_call(second) == 1
    assert [capture.replayed_in for capture in counter.witnessed(["k"])] == [frozenset({1})]


# What each capture read, wrote and allocated (``record=True``)


def test_a_recording_counter_keeps_what_an_emulated_capture_read() -> None:
    from pytest_cudagraph.engines.emulation import CUDAGraph, emulated_graphs

    weight, static = torch.ones(4), torch.zeros(4)
    with emulated_graphs(), CaptureCounter(CUDAGraph, record=True) as counter:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = static * weight
        graph.replay()
    [capture] = counter.captures
    assert capture.record is not None
    assert capture.record.reads_storage_of(weight) and capture.record.reads_storage_of(static)
    assert not capture.record.reads_storage_of(out)  # the graph's own output, in its pool
    with emulated_graphs(), CaptureCounter(CUDAGraph) as unrecorded:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static * weight
    assert unrecorded.captures[0].record is None


def test_compiled_codes_captures_are_not_recorded() -> None:
    """torch.compile's kernels do not reach the dispatcher: a record of its captures would hold
    part of the graph, its buffers taken for inputs. Known by torch's cudagraph trees on the
    stack at capture_begin (here a function compiled as if from that module)."""
    trees = {}
    path = str(Path("torch", *COMPILED_CAPTURES))
    exec(compile("def capture(graph):\n    graph.capture_begin()\n", path, "exec"), trees)
    LivenessGraph.asked = []
    with CaptureCounter(LivenessGraph, record=True) as counter:
        for begin in (trees["capture"], LivenessGraph.capture_begin):
            graph = LivenessGraph()
            begin(graph)
            torch.ones(2) + 1
            graph.capture_end()
    compiled, own = counter.captures
    assert compiled.record is None and LivenessGraph.asked[0] is False
    assert own.record is not None and LivenessGraph.asked[1] is True


class LivenessGraph(StandInGraph):
    """A stand-in whose capture_begin takes torch 2.13's ``check_input_liveness``."""

    asked: ClassVar[list[bool]] = []

    def capture_begin(
        self, *args: object, check_input_liveness: bool = False, **kwargs: object
    ) -> None:
        self.asked.append(check_input_liveness)


def test_a_recording_counter_asks_torch_to_check_the_inputs_where_torch_can() -> None:
    LivenessGraph.asked = []
    with CaptureCounter(LivenessGraph, record=True):
        graph = LivenessGraph()
        graph.capture_begin()
        graph.capture_end()
    with CaptureCounter(LivenessGraph):
        graph = LivenessGraph()
        graph.capture_begin()
        graph.capture_end()
    assert LivenessGraph.asked == [True, False]
    with CaptureCounter(StandInGraph, record=True):  # a capture_begin that takes no such flag
        graph = StandInGraph()
        graph.capture_begin()
        graph.capture_end()
