"""The storage rule: which tensors share memory, and what a check keeps of earlier outputs
under its memory budget."""

from __future__ import annotations

import dataclasses
import gc

import torch

from pytest_cudagraph.engines.storage import (
    EarlierOutputs,
    StorageOverlap,
    overlapping,
    storage_extents,
    storage_overlaps,
)


@dataclasses.dataclass
class Step:
    logits: torch.Tensor


def at(buffer: bytearray, offset: int, count: int) -> torch.Tensor:
    """A float32 tensor over ``count`` elements of ``buffer`` from byte ``offset``: a storage
    of its own whose address is known, as the caching allocator's blocks are."""
    return torch.frombuffer(buffer, dtype=torch.float32, count=count, offset=offset)


def test_distinct_outputs_share_nothing() -> None:
    x = torch.randn(3)
    assert storage_overlaps((x + 1, {"y": x * 2}), {"inputs": (x,)}) == []


def test_an_output_that_is_an_input_or_a_view_of_one_is_named() -> None:
    x, y = torch.randn(4, 4), torch.randn(4)
    found = storage_overlaps((x[1:], y + 1, {"again": x.t()}), {"inputs": {"x": x, "y": y}})
    assert found == [
        StorageOverlap("output[0]", "inputs['x']"),
        StorageOverlap("output[2]['again']", "inputs['x']"),
    ]
    assert found[0].describe() == "output[0] shares storage with inputs['x']"


def test_the_rule_looks_inside_dataclasses_and_namespaces() -> None:
    x = torch.randn(4)
    assert storage_overlaps(Step(x[:2]), {"inputs": Step(x)}) == [
        StorageOverlap("output.logits", "inputs.logits")
    ]


def test_views_of_disjoint_parts_of_one_storage_still_share_it() -> None:
    base = torch.zeros(8)
    assert storage_overlaps(base[:4], {"kept": base[4:]}) == [StorageOverlap("output", "kept")]


def test_adjacent_storages_are_not_shared_and_overlapping_ones_are() -> None:
    buffer = bytearray(64)
    first, next_to_it = at(buffer, 0, 4), at(buffer, 16, 4)  # bytes [0, 16) and [16, 32)
    assert first.untyped_storage().data_ptr() + 16 == next_to_it.untyped_storage().data_ptr()
    assert storage_overlaps(next_to_it, {"kept": first}) == []
    assert storage_overlaps(at(buffer, 12, 4), {"kept": first}) == [
        StorageOverlap("output", "kept")
    ]


def test_empty_tensors_and_non_tensors_never_overlap() -> None:
    empty = torch.empty(0)
    assert storage_overlaps((empty, 3, "a"), {"inputs": (empty, 3)}) == []


# Earlier outputs under a budget


def test_outputs_within_the_budget_are_kept_alive() -> None:
    earlier = EarlierOutputs(budget_bytes=48)
    first = torch.zeros(4)
    seen = torch.multiprocessing.reductions.StorageWeakRef(first.untyped_storage())
    earlier.keep(first, "case 0 output")
    earlier.keep((torch.zeros(4), torch.zeros(4)[:2]), "case 1 output")  # two storages of 16
    del first
    gc.collect()
    assert not seen.expired()
    assert earlier.held_bytes == 48


def test_past_the_budget_the_oldest_outputs_are_let_go() -> None:
    earlier = EarlierOutputs(budget_bytes=40)
    refs = []
    for case in range(4):
        output = torch.zeros(4)  # 16 bytes
        refs.append(torch.multiprocessing.reductions.StorageWeakRef(output.untyped_storage()))
        earlier.keep(output, f"case {case} output")
        del output
    gc.collect()
    assert [ref.expired() for ref in refs] == [True, True, False, False]
    assert earlier.held_bytes == 32


def test_views_of_one_storage_count_once() -> None:
    earlier = EarlierOutputs(budget_bytes=16)
    base = torch.zeros(4)
    earlier.keep((base[:2], base[2:], base), "case 0 output")
    assert earlier.held_bytes == 16


def test_an_output_sharing_a_buffer_something_else_holds_is_caught_after_it_is_let_go() -> None:
    static = torch.zeros(4)  # a graph's static output buffer
    earlier = EarlierOutputs(budget_bytes=0)
    earlier.keep(static[:2], "case 0 output")
    assert earlier.held_bytes == 0  # let go at once
    assert earlier.overlaps(static[:2]) == [StorageOverlap("output", "case 0 output")]


def test_memory_freed_and_handed_out_again_is_not_shared() -> None:
    buffer = bytearray(16)
    earlier = EarlierOutputs(budget_bytes=0)
    earlier.keep(at(buffer, 0, 4), "case 0 output")  # nothing else holds it: freed
    gc.collect()
    assert earlier.overlaps(at(buffer, 0, 4)) == []


def test_memory_handed_out_again_while_an_earlier_output_is_held_is_shared() -> None:
    buffer = bytearray(16)
    earlier = EarlierOutputs(budget_bytes=1024)
    earlier.keep({"y": at(buffer, 0, 4)}, "case 0 output")
    assert earlier.overlaps(at(buffer, 8, 2), "out") == [
        StorageOverlap("out", "case 0 output['y']")
    ]


def test_storages_on_two_devices_never_overlap_whatever_their_addresses() -> None:
    tensor = torch.zeros(4)
    [(_, (device, start, end))] = storage_extents(tensor, "x")
    assert overlapping(tensor, [("other", (device, start, end))]) != []
    assert overlapping(tensor, [("other", ("cuda:0", start, end))]) == []
