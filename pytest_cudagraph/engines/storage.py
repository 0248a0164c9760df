"""The storage rule: a graphed output must own its memory.

A graphed output that shares memory with its inputs, with the eager result or with an output
kept from an earlier call is overwritten by the next replay (or makes a parity check compare a
tensor with itself). ``storage_overlaps`` finds such pairs; ``EarlierOutputs`` remembers a
check's earlier outputs under a memory budget. Views count, as they share storage; storages
that are adjacent in memory but disjoint do not. torch is imported when used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pytest_cudagraph.engines import trees

if TYPE_CHECKING:
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef


@dataclass(frozen=True)
class StorageOverlap:
    """A graphed output tensor whose memory is also another tensor's."""

    output: str
    other: str

    def describe(self) -> str:
        return f"{self.output} shares storage with {self.other}"


def storage_overlaps(
    output: object, others: Mapping[str, object], *, path: str = "output"
) -> list[StorageOverlap]:
    """Each tensor in ``output`` whose storage overlaps the storage of a tensor in one of
    ``others`` (keys describe them, e.g. "eager output"); views count, as they share storage.

    A graphed output that shares memory with its inputs, with the eager result or with an
    output kept from an earlier call is overwritten by the next replay (or makes a parity
    check compare a tensor with itself), so the caller must get memory of its own.
    """
    extents = [extent for name, value in others.items() for extent in storage_extents(value, name)]
    return overlapping(output, extents, path=path)


Extent = tuple[str, int, int]  # (device, first byte, end) of a tensor's whole storage


def storage_extents(value: object, name: str) -> list[tuple[str, Extent]]:
    """(path, extent) of each tensor in ``value`` that has storage; paths start at ``name``."""
    found = []
    for path, tensor in trees.tensors(value, name):
        extent = _storage_extent(tensor)
        if extent is not None:
            found.append((path, extent))
    return found


def overlapping(
    output: object, extents: Iterable[tuple[str, Extent]], *, path: str = "output"
) -> list[StorageOverlap]:
    """``storage_overlaps`` against extents taken earlier (``storage_extents``)."""
    extents = list(extents)
    found = []
    for output_path, tensor in trees.tensors(output, path):
        mine = _storage_extent(tensor)
        if mine is None:
            continue
        for other_path, theirs in extents:
            if _overlap(mine, theirs):
                found.append(StorageOverlap(output_path, other_path))
    return found


def _overlap(mine: Extent, theirs: Extent) -> bool:
    return mine[0] == theirs[0] and mine[1] < theirs[2] and theirs[1] < mine[2]


def _storage_extent(tensor: torch.Tensor) -> Extent | None:
    """The tensor's storage extent; None when it has none."""
    import torch

    if tensor.layout != torch.strided or tensor.device.type == "meta":
        return None
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return str(tensor.device), storage.data_ptr(), storage.data_ptr() + storage.nbytes()


@dataclass
class _Earlier:
    """One tensor of an earlier case's output: its storage's extent and a weak reference to
    that storage, and the tensor itself while the budget keeps it alive."""

    path: str
    extent: Extent
    storage: StorageWeakRef
    held: torch.Tensor | None

    def alive(self) -> bool:
        # torch leaves StorageWeakRef unannotated
        return self.held is not None or not cast("Callable[[], bool]", self.storage.expired)()


class EarlierOutputs:
    """The graphed outputs of a check's earlier cases, for the storage rule.

    They are kept alive while together they fit ``budget_bytes``, so that memory freed and
    handed out again never looks shared; past the budget the oldest are let go, each still
    remembered by its storage's extent and a weak reference to that storage. A later output
    that overlaps one that is alive (a static buffer the graph holds, say) is caught either
    way; one lying where a freed output was is not, as nothing alive shares its memory.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.held_bytes = 0  # the storages of the outputs kept alive
        self._outputs: list[tuple[list[_Earlier], int]] = []  # each one's tensors and bytes
        self._released = 0  # the outputs before this index are no longer held

    def overlaps(self, output: object, path: str = "output") -> list[StorageOverlap]:
        """Each tensor of ``output`` whose storage overlaps an earlier output's, still alive."""
        found = []
        for output_path, tensor in trees.tensors(output, path):
            mine = _storage_extent(tensor)
            if mine is None:
                continue
            for entries, _ in self._outputs:
                found += [
                    StorageOverlap(output_path, entry.path)
                    for entry in entries
                    if _overlap(mine, entry.extent) and entry.alive()
                ]
        return found

    def keep(self, output: object, name: str) -> None:
        """Remember ``output`` (its paths start at ``name``); past the budget, let the oldest
        outputs go."""
        from torch.multiprocessing.reductions import StorageWeakRef

        entries, sizes = [], {}
        for path, tensor in trees.tensors(output, name):
            extent = _storage_extent(tensor)
            if extent is not None:
                storage = tensor.untyped_storage()
                weak = cast("Callable[[torch.UntypedStorage], StorageWeakRef]", StorageWeakRef)
                entries.append(_Earlier(path, extent, weak(storage), tensor))
                sizes[extent] = storage.nbytes()  # views of one storage count once
        self._outputs.append((entries, sum(sizes.values())))
        self.held_bytes += sum(sizes.values())
        while self.held_bytes > self.budget_bytes:
            released, size = self._outputs[self._released]
            for entry in released:
                entry.held = None
            self.held_bytes -= size
            self._released += 1
