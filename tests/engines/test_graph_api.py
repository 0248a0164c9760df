"""The one patching of torch's graph class, on stand-in classes of its shape."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pytest_cudagraph.engines.graph_api import Method, graph_class_with, patched


class Base:
    def replay(self) -> str:
        """Replays the graph."""
        return "replayed"


def tagged(tag: str) -> Callable[[Method], Method]:
    """A wrap whose wrapper calls the method and tags what it returns."""

    def wrap(original: Method) -> Method:
        return lambda graph: f"{tag}({original(graph)})"

    return wrap


def test_the_method_is_wrapped_in_the_block_and_put_back_after_it() -> None:
    graph_class = type("Graph", (Base,), {"replay": Base.replay})
    own = vars(graph_class)["replay"]
    with patched(graph_class, "replay", tagged("seen")):
        assert graph_class().replay() == "seen(replayed)"
        assert (graph_class.replay.__name__, graph_class.replay.__doc__) == (
            "replay",
            "Replays the graph.",
        )
    assert vars(graph_class)["replay"] is own


def test_an_inherited_method_is_put_back_by_deleting_the_patch_even_after_an_error() -> None:
    graph_class = type("Graph", (Base,), {})
    with pytest.raises(RuntimeError, match="inside"), patched(graph_class, "replay", tagged("x")):
        assert "replay" in vars(graph_class)
        raise RuntimeError("inside")
    assert "replay" not in vars(graph_class)
    assert graph_class().replay() == "replayed"


def test_a_block_left_before_a_later_patch_leaves_that_patch_in_place() -> None:
    graph_class = type("Graph", (Base,), {})
    outer = patched(graph_class, "replay", tagged("outer"))
    inner = patched(graph_class, "replay", tagged("inner"))
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # out of order: the inner patch stays
    assert graph_class().replay() == "inner(outer(replayed))"
    inner.__exit__(None, None, None)  # puts back what it found: outer's wrapper, left behind
    assert graph_class().replay() == "outer(replayed)"


def test_a_graph_class_is_a_class_with_every_method_named() -> None:
    assert graph_class_with(Base, ["replay"]) is Base
    with pytest.raises(TypeError, match=r"graph_class must be a class, got 3"):
        graph_class_with(3, ["replay"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"graph_class Base lacks the methods \['reset'\]"):
        graph_class_with(Base, ["replay", "reset"])


def test_the_default_graph_class_is_torchs() -> None:
    import torch

    assert graph_class_with(None, ["capture_begin", "capture_end", "replay", "reset"]) is (
        torch.cuda.CUDAGraph
    )
