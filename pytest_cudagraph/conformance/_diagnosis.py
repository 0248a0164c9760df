"""Where a graph went wrong: the first module whose output differs between the two sides.

After a comparing check failed, a diagnostic call of each side runs with a forward hook on every
module of that side's model (``State.sides``) that keeps a copy of the module's output. On the
graphed side the cache is reset first, so that the call captures afresh with the hooks in place:
the copies are recorded into the graph and replayed with it, so after the call they hold what
the graph computed, module by module. Compared with eager's in the order eager's modules
finished, the first that differs beyond the target's tolerance is named. A target whose modules
the suite cannot see (no ``State.sides``) or whose graphs it cannot capture again (no
``Cache.reset``) is told what to give.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import NoReturn

import pytest
import torch

from pytest_cudagraph.conformance._judging import (
    called,
    draw,
    eager_call,
    graphed_call,
    loosest_tolerance,
    sides_of,
)
from pytest_cudagraph.conformance._protocol import Case, CudaGraphTarget
from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.compare import Tolerance, compare_outputs

MAX_CASES = 4  # failing cases diagnosed at most, the first that shows a difference kept


@dataclass(frozen=True)
class Recorded:
    """Each module's output in one call, by the module's name in its model (``""`` for the
    model itself), in the order the modules finished."""

    outputs: dict[str, object]

    def order(self) -> list[str]:
        return list(self.outputs)


def models_of(side: object) -> dict[str, torch.nn.Module]:
    """The modules a side's state holds (a module, modules in a dict or a list, or the modules
    among the public attributes of an object that wraps them, such as a runner), by name."""
    if isinstance(side, torch.nn.Module):
        return {"": side}
    if isinstance(side, dict):
        items = list(side.items())
    elif isinstance(side, (list, tuple)):
        items = list(enumerate(side))
    else:
        items = [(name, value) for name, value in vars(side).items() if not name.startswith("_")]
    return {str(name): value for name, value in items if isinstance(value, torch.nn.Module)}


@contextmanager
def recording(models: dict[str, torch.nn.Module]) -> Iterator[dict[str, object]]:
    """While entered, each module of ``models`` keeps a copy of its last output under its
    name (``model.sub.layer``): taken inside a capture, the copy is part of the graph."""
    outputs: dict[str, object] = {}
    handles = []
    for prefix, model in models.items():
        for name, module in model.named_modules():
            path = ".".join(part for part in (prefix, name) if part) or "model"

            def keep(
                module: torch.nn.Module, args: object, output: object, path: str = path
            ) -> None:
                outputs.pop(path, None)  # in the order the modules last finished
                outputs[path] = trees.cloned(output)

            handles.append(module.register_forward_hook(keep))
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def recorded_call(models: dict[str, torch.nn.Module], call: Callable[[], object]) -> Recorded:
    """Each module's output in ``call()``: its copies read after the call returned (a graph the
    call captured and replayed has written them by then)."""
    with recording(models) as outputs:
        call()
    return Recorded(dict(outputs))


def first_difference(eager: Recorded, graphed: Recorded, tolerance: Tolerance) -> str | None:
    """The first module, in eager's order, whose output differs between the sides beyond
    ``tolerance``, described; None when every module both sides ran agrees. A module is matched
    by its name, or by the graphed name that ends with it (a graphed side that wraps the model
    names its modules under the wrapper's: ``inner.layers.0`` for eager's ``layers.0``)."""
    for name in eager.order():
        twin = name if name in graphed.outputs else wrapped_name(name, graphed.order())
        if twin is None:
            continue
        found = compare_outputs(
            eager.outputs[name], graphed.outputs[twin], tolerance=tolerance, path=name
        )
        if found:
            return f"the first module whose output differs is {name}: {found[0].describe()}"
    return None


def wrapped_name(name: str, names: Sequence[str]) -> str | None:
    """The one name of ``names`` that is ``name`` under a wrapper's prefix, if exactly one."""
    found = [other for other in names if other.endswith("." + name)]
    return found[0] if len(found) == 1 else None


def where_it_differs(target: CudaGraphTarget, cases: Sequence[Case], seed: int = 0) -> str:
    """A line naming the first module whose output differs on the first of ``cases`` (at most
    ``MAX_CASES``) that shows one, or saying why none could be named."""
    sides = sides_of(target)
    if sides is None:
        return "give State(sides=...) to have the first module whose output differs named"
    eager_models, graphed_models = models_of(sides.eager), models_of(sides.graphed)
    if not eager_models or not graphed_models:
        return "the target's State.sides holds no torch.nn.Module: no module to name"
    reset = target.cache.reset if target.cache is not None else None
    for case in cases[:MAX_CASES]:
        if reset is not None:
            called("Cache.reset", reset)  # captured afresh, with the hooks recorded into the graph
        inputs = draw(target, case, seed)
        graphed = recorded_call(graphed_models, partial(graphed_call, target, inputs, seed))
        if not graphed.outputs:
            return (
                "no module of the graphed side ran in Python during a diagnostic call (a graph "
                "replayed without a capture: give Cache(reset=...))"
            )
        inputs = draw(target, case, seed)
        eager = recorded_call(eager_models, partial(eager_call, target, inputs, seed))
        found = first_difference(eager, graphed, loosest_tolerance(target))
        if found is not None:
            return f"case {case.number}: {found}"
    return "every module's output agrees in the diagnostic calls: the difference is past them"


def fail_naming_the_module(
    target: CudaGraphTarget, cases: Sequence[Case], failure: BaseException
) -> NoReturn:
    """Fail again with ``failure``'s message and a line saying where the graph went wrong
    (``where_it_differs``); an error in the diagnostic calls is said instead."""
    try:
        where = where_it_differs(target, cases)
    except Exception as error:  # the user's code, called once more: the failure comes first
        where = f"the diagnostic calls raised {type(error).__name__}: {error}"
    pytest.fail(f"{failure}\nwhere the graph went wrong: {where}", pytrace=False)
