"""pytest_cudagraph.engines.graph_faults on the CPU, with a stand-in of torch.cuda.CUDAGraph's
shape: each stage raises once, where a real fault would leave the graph, and the class is put
back as it was. On a GPU the lock-safety check injects these faults into the real class for
every target without fault points of its own (tests/conformance/test_own_graphs.py)."""

from __future__ import annotations

import threading

import pytest

from pytest_cudagraph.engines.graph_faults import STAGES, GraphFaults


class FakeGraph:
    """torch.cuda.CUDAGraph's methods, recording what ran."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def capture_begin(self, *args: object, **kwargs: object) -> None:
        self.log.append("capture_begin")

    def capture_end(self) -> None:
        self.log.append("capture_end")

    def replay(self) -> None:
        self.log.append("replay")

    def reset(self) -> None:
        self.log.append("reset")


class Boom(RuntimeError):
    pass


def capture_and_replay(graph: FakeGraph) -> None:
    graph.capture_begin()
    graph.capture_end()
    graph.replay()


@pytest.mark.parametrize(
    ("stage", "ran_before_the_fault"),
    [
        ("capture_begin", []),  # nothing captured
        ("capture_end", ["capture_begin", "capture_end", "reset"]),  # ended, then reset
        ("replay", ["capture_begin", "capture_end"]),  # the graph does not run
    ],
)
def test_each_stage_raises_once_where_a_real_fault_would_leave_the_graph(
    stage: str, ran_before_the_fault: list[str]
) -> None:
    faults = GraphFaults(FakeGraph)
    graph = FakeGraph()
    with faults.inject(stage, Boom(stage)) as fault:
        assert not fault.fired
        with pytest.raises(Boom, match=stage):
            capture_and_replay(graph)
        assert fault.fired
        assert graph.log == ran_before_the_fault
        graph.log.clear()
        capture_and_replay(graph)  # the next call goes through
        assert graph.log == ["capture_begin", "capture_end", "replay"]


def test_the_class_is_put_back_and_untouched_stages_never_fire() -> None:
    originals = {stage: vars(FakeGraph)[stage] for stage in STAGES}
    with GraphFaults(FakeGraph).inject("replay", Boom()) as fault:
        assert vars(FakeGraph)["replay"] is not originals["replay"]
        FakeGraph().capture_begin()
    assert not fault.fired
    assert {stage: vars(FakeGraph)[stage] for stage in STAGES} == originals


def test_an_inherited_method_is_put_back_by_deleting_the_patch() -> None:
    class Subclass(FakeGraph):
        pass

    with GraphFaults(Subclass).inject("replay", Boom()):
        assert "replay" in vars(Subclass)
    assert "replay" not in vars(Subclass)


def test_a_fault_fires_once_whichever_thread_calls_first() -> None:
    raised: list[bool] = []

    def replay() -> None:
        try:
            FakeGraph().replay()
            raised.append(False)
        except Boom:
            raised.append(True)

    with GraphFaults(FakeGraph).inject("replay", Boom()):
        threads = [threading.Thread(target=replay) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(raised) == [False] * 7 + [True]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: GraphFaults(3), TypeError, r"graph_class must be a class, got 3"),
        (lambda: GraphFaults(object), TypeError, r"graph_class object lacks the methods"),
        (
            lambda: GraphFaults(FakeGraph).inject("warm_up", Boom()).__enter__(),
            ValueError,
            r"stage must be one of capture_begin, capture_end, replay, got 'warm_up'",
        ),
        (
            lambda: GraphFaults(FakeGraph).inject("replay", Boom).__enter__(),
            TypeError,
            r"exc must be an exception instance",
        ),
    ],
)
def test_bad_arguments_are_named(call: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


def test_reset_is_not_a_stage_to_fail() -> None:
    # reset is what a failed capture_end calls to undo the capture, never a stage of its own.
    with pytest.raises(ValueError, match=r"got 'reset'"):
        GraphFaults(FakeGraph).inject("reset", Boom()).__enter__()
