"""The tensors a callable holds, found through closures, bound methods, attributes, modules and
containers, by path; and a tensor replaced instead of copied into, named by its path."""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import threading

import torch
from torch import nn

from pytest_cudagraph.engines import reach
from pytest_cudagraph.engines.reach import Alive, reachable_tensors, rebound, storages


@dataclasses.dataclass
class Entry:
    x: torch.Tensor
    graph: object = None


class Runner:
    """A cache the way users write one: a model, static buffers in a dict, entries per key."""

    __slots__ = ("entries", "lock", "model", "static")

    def __init__(self) -> None:
        self.model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        self.static = {"ids": torch.zeros(4, dtype=torch.long)}
        self.entries = {(1, 2): Entry(torch.zeros(1, 2))}
        self.lock = threading.Lock()

    def run(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(inputs["x"])


class OwnModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 1, bias=False)
        self.cache = torch.zeros(3)  # a plain tensor attribute
        self._scratch = [torch.ones(1)]  # a user's private attribute is walked too


def test_a_bound_method_reaches_its_objects_attributes_modules_and_containers() -> None:
    runner = Runner()
    found = reachable_tensors(runner.run, "graphed").tensors
    assert sorted(found) == [
        "graphed.entries[(1, 2)].x",
        "graphed.model.0.bias",
        "graphed.model.0.weight",
        "graphed.model.1.bias",
        "graphed.model.1.num_batches_tracked",
        "graphed.model.1.running_mean",
        "graphed.model.1.running_var",
        "graphed.model.1.weight",
        "graphed.static['ids']",
    ]
    assert found["graphed.static['ids']"] is runner.static["ids"]


def test_a_closure_and_a_partial_reach_what_they_hold() -> None:
    model, buffers = OwnModule(), {"positions": torch.arange(3)}

    def graphed(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return model.inner(inputs["x"]) + buffers["positions"]

    found = reachable_tensors(functools.partial(graphed, {}), "graphed").tensors
    assert sorted(found) == [
        "graphed.func.buffers['positions']",
        "graphed.func.model._scratch[0]",
        "graphed.func.model.cache",
        "graphed.func.model.inner.weight",
    ]


def test_torchs_and_the_standard_librarys_objects_are_not_entered() -> None:
    hidden = torch.zeros(1)
    held = {
        "compiled": torch.nn.functional.relu,  # torch's code
        "lock": threading.Lock(),
        "class": Runner,
        "generator": torch.Generator(),
        "thread": threading.Thread(target=lambda: hidden),  # its target holds a tensor
    }
    assert reachable_tensors(held, "held").tensors == {}


def test_a_tensor_on_another_device_is_left_out_when_a_device_is_named() -> None:
    held = {"here": torch.zeros(1), "meta": torch.empty(1, device="meta")}
    found = reachable_tensors(held, "held", device=torch.device("cpu")).tensors
    assert list(found) == ["held['here']"]


def test_cycles_end_and_a_walk_past_its_bound_says_so(monkeypatch) -> None:
    runner = Runner()
    runner.entries[(1, 2)].graph = runner  # a cycle
    assert len(reachable_tensors(runner, "runner").tensors) == 9
    chain: list[object] = [torch.zeros(1)]
    for _ in range(50):
        chain = [chain]
    monkeypatch.setattr(reach, "MAX_OBJECTS", 10)
    assert reachable_tensors(chain, "chain").truncated
    monkeypatch.setattr(reach, "MAX_OBJECTS", 10**5)
    deep = reachable_tensors(chain, "chain")
    assert not deep.truncated and deep.tensors == {}  # past MAX_DEPTH


def test_a_tensor_replaced_instead_of_copied_into_is_named_by_its_path() -> None:
    runner = Runner()
    before = storages(reachable_tensors(runner.run, "graphed").tensors)
    runner.static["ids"].copy_(torch.ones(4, dtype=torch.long))  # copied into: kept
    runner.entries[(1, 2)].x = torch.ones(1, 2)  # replaced
    runner.entries[(3, 4)] = Entry(torch.zeros(3, 4))  # a new entry: not a rebinding
    after = storages(reachable_tensors(runner.run, "graphed").tensors)
    (moved,) = rebound(before, after)
    assert moved.path == "graphed.entries[(1, 2)].x"
    assert moved.describe().startswith("graphed.entries[(1, 2)].x was rebound: its storage moved")
    assert rebound(after, after) == []


def test_a_partials_arguments_are_walked_by_position_and_by_name() -> None:
    held, named = torch.zeros(1), torch.ones(1)
    found = reachable_tensors(functools.partial(torch.add, held, other=named), "p").tensors
    assert found == {"p.args[0]": held, "p.keywords['other']": named}


def test_the_walk_enters_objects_down_to_max_depth_and_no_deeper() -> None:
    tensor = torch.zeros(1)
    chain: list[object] = [tensor]  # the tensor one deeper than the innermost list
    for _ in range(reach.MAX_DEPTH):
        chain = [chain]
    assert list(reachable_tensors(chain, "c").tensors.values()) == [tensor]
    assert reachable_tensors([chain], "c").tensors == {}


def test_a_path_gone_from_the_second_look_is_not_a_rebinding() -> None:
    assert rebound({"a": 1, "b": 2}, {"b": 2}) == []


# Where a cache may keep its buffers beyond its own attributes

STATIC = {"buffer": torch.zeros(2)}  # a module global the code names
QUEUED = collections.deque([{"buffer": torch.zeros(2)}])


class Box:
    """An object that hashes by identity, as a cache's entry kept in a set does."""

    def __init__(self) -> None:
        self.x = torch.zeros(2)


FROZEN = frozenset({Box()})
PER_THREAD = threading.local()
UNNAMED = torch.zeros(2)  # a global no walked code names


@functools.cache
def cached_buffers() -> dict[str, torch.Tensor]:
    return {"buffer": torch.zeros(2)}


def reads_globals(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return STATIC["buffer"] + QUEUED[0]["buffer"] + cached_buffers()["buffer"] + PER_THREAD.x


class CallsGlobals:
    """A callable object whose call reads module globals."""

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return STATIC["buffer"] + next(iter(FROZEN)).x


class ReadsGlobal(nn.Module):
    """A user's module whose forward reads a module global."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + STATIC["buffer"]


def test_the_module_globals_the_code_names_are_walked_by_their_module_qualified_name() -> None:
    PER_THREAD.x = torch.ones(2)
    reads_globals({})  # fills the cache
    found = reachable_tensors(reads_globals, "graphed").tensors
    expected = {
        f"{__name__}.PER_THREAD[thread 0].x": PER_THREAD.x,
        f"{__name__}.QUEUED[0]['buffer']": QUEUED[0]["buffer"],
        f"{__name__}.STATIC['buffer']": STATIC["buffer"],
        f"{__name__}.cached_buffers(cached 0)['buffer']": cached_buffers()["buffer"],
    }
    assert sorted(found) == sorted(expected)
    assert all(found[path] is tensor for path, tensor in expected.items())
    assert set(reachable_tensors(CallsGlobals(), "graphed").tensors) == {
        f"{__name__}.FROZEN{{0}}.x",
        f"{__name__}.STATIC['buffer']",
    }
    assert set(reachable_tensors(ReadsGlobal(), "model").tensors) == {
        f"{__name__}.STATIC['buffer']"
    }


def test_each_threads_attributes_of_a_threading_local_are_walked() -> None:
    local = threading.local()
    local.mine = torch.zeros(1)
    started, done = threading.Event(), threading.Event()

    def other_thread() -> None:
        local.theirs = torch.ones(1)
        started.set()
        done.wait(5)

    worker = threading.Thread(target=other_thread)
    worker.start()
    started.wait(5)
    try:
        found = reachable_tensors(local, "local").tensors
    finally:
        done.set()
        worker.join(5)
    assert sorted(found) == ["local[thread 0].mine", "local[thread 1].theirs"]


def test_torchs_own_cached_functions_are_not_entered() -> None:
    cached = functools.lru_cache(torch.nn.functional.relu)  # its module is torch's
    cached(torch.zeros(1))
    assert reachable_tensors(cached, "cached").tensors == {}


def test_alive_holds_the_tensors_alive_when_it_recorded_and_no_later_ones() -> None:
    alive = Alive(torch.device("cpu"))
    before = torch.zeros(3)
    alive.record()
    after = torch.zeros(3)
    assert before in alive and after not in alive
    address = id(before)
    del before
    gc.collect()
    reused = [torch.zeros(3) for _ in range(100)]  # an id freed may be reused: not a recorded one
    assert not any(id(tensor) == address and tensor in alive for tensor in reused)
    assert UNNAMED in alive and len(alive) >= 1
