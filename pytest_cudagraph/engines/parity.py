"""cuda_graph_parity: prove that a graphed callable computes what its eager twin computes.

Two forms share one comparison engine (``compare_outputs``):

- ``ParityChecker.check(eager, graphed, make_inputs, cases)``: for each case both sides get
  fresh inputs built from identically seeded generators and run under identical RNG
  (CPU and CUDA generators forked and seeded alike); every output is compared.
- ``ParityChecker.run_toggled(body, toggle)``: a whole test body runs with an environment
  toggle "0" and then "1" under identical RNG; what it ``record()``-ed is compared.

A graphed output must also own its memory (``storage_overlaps``): one that shares storage
with the call's inputs, the eager output or an earlier call's output is a mismatch.
The engine runs on any device, CPU included; requiring CUDA is the fixture's business.
torch is imported when the engine is used, so loading the plugin costs nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_cudagraph.engines import rng, trees
from pytest_cudagraph.engines.hostsync import host_syncs_allowed

if TYPE_CHECKING:
    import torch

# Case k is seeded with seed + k.
MAX_SEED = rng.MAX_SEED


@dataclass(frozen=True)
class Mismatch:
    """One output that differs. Value differences carry the index and size fields."""

    path: str
    detail: str = ""
    first_index: tuple[int, ...] | None = None
    max_abs_diff: float | None = None
    differing: int | None = None
    numel: int | None = None

    def describe(self) -> str:
        if self.first_index is None:
            return f"{self.path}: {self.detail}"
        return (
            f"{self.path} at index {self.first_index}: max |diff| {self.max_abs_diff:.4g} "
            f"over {self.differing} of {self.numel} elements"
        )


def compare_outputs(
    expected: object,
    actual: object,
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    path: str = "output",
    sides: tuple[str, str] = ("eager", "graphed"),
) -> list[Mismatch]:
    """Every difference between two outputs, walking tuples, lists and dicts.

    Tensors must agree in shape, dtype and values (``|a - b| <= atol + rtol * |b|``, NaN
    equal to NaN; exact when both tolerances are 0); other leaves are compared with ``==``.
    """
    pending = pending_comparison(expected, actual, rtol=rtol, atol=atol, path=path, sides=sides)
    return settle_comparison(pending)


def pending_comparison(
    expected: object,
    actual: object,
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    path: str = "output",
    sides: tuple[str, str] = ("eager", "graphed"),
) -> list[Mismatch | PendingValues]:
    """``compare_outputs`` without waiting for the device: the differences found on the host,
    and for each pair of tensors their value comparison still on the device
    (``settle_comparison`` reads them, with one synchronization for many cases)."""
    import torch

    first, second = sides
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        pending = _pending_tensors(expected, actual, rtol, atol, path, sides)
        return [] if pending is None else [pending]
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        found: list[Mismatch | PendingValues] = []
        if expected.keys() != actual.keys():
            only_first = sorted(expected.keys() - actual.keys(), key=repr)
            only_second = sorted(actual.keys() - expected.keys(), key=repr)
            found.append(
                Mismatch(path, f"keys {only_first} only in {first}, {only_second} only in {second}")
            )
        for key in expected.keys() & actual.keys():
            found += pending_comparison(
                expected[key],
                actual[key],
                rtol=rtol,
                atol=atol,
                path=f"{path}[{key!r}]",
                sides=sides,
            )
        return found
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        if len(expected) != len(actual):
            return [Mismatch(path, f"length {len(expected)} in {first}, {len(actual)} in {second}")]
        found = []
        for index, (one, other) in enumerate(zip(expected, actual, strict=True)):
            found += pending_comparison(
                one, other, rtol=rtol, atol=atol, path=f"{path}[{index}]", sides=sides
            )
        return found
    # Values compared by walking into them rather than with ==.
    structures = (torch.Tensor, Mapping, list, tuple)
    if isinstance(expected, structures) or isinstance(actual, structures):
        kinds = f"{type(expected).__name__} in {first}, {type(actual).__name__} in {second}"
        return [Mismatch(path, kinds)]
    if _leaves_equal(expected, actual, rtol, atol):
        return []
    return [Mismatch(path, f"{expected!r} in {first}, {actual!r} in {second}")]


@dataclass(frozen=True)
class PendingValues:
    """Two same-shaped tensors' value comparison, queued on their device: which elements
    differ and how many (nothing read until ``mismatch()``). A pair that differs gets its
    first index and largest difference when read; the tensors are kept until then, and the
    largest difference is taken from what they hold then (an output overwritten after its
    call breaks the storage rule, which reports it)."""

    path: str
    expected: torch.Tensor
    actual: torch.Tensor
    differs: torch.Tensor
    differing: torch.Tensor

    def mismatch(self) -> Mismatch | None:
        import torch

        differing = int(self.differing)
        if differing == 0:
            return None
        flat = int(self.differs.flatten().to(torch.uint8).argmax())  # the first True
        index = []
        for size in reversed(self.differs.shape):
            flat, position = divmod(flat, size)
            index.append(position)
        gaps = (_widen(self.expected) - _widen(self.actual)).abs()
        largest = float(torch.where(self.differs, gaps, 0).max())
        numel = self.differs.numel()
        return Mismatch(self.path, "", tuple(reversed(index)), largest, differing, numel)


def settle_comparison(found: Iterable[Mismatch | PendingValues]) -> list[Mismatch]:
    """The mismatches of a ``pending_comparison``, its device figures read."""
    settled = []
    for item in found:
        mismatch = item.mismatch() if isinstance(item, PendingValues) else item
        if mismatch is not None:
            settled.append(mismatch)
    return settled


def _pending_tensors(
    expected: torch.Tensor,
    actual: torch.Tensor,
    rtol: float,
    atol: float,
    path: str,
    sides: tuple[str, str],
) -> Mismatch | PendingValues | None:
    first, second = sides
    if expected.shape != actual.shape:
        return Mismatch(
            path, f"shape {tuple(expected.shape)} in {first}, {tuple(actual.shape)} in {second}"
        )
    if expected.dtype != actual.dtype:
        return Mismatch(path, f"dtype {expected.dtype} in {first}, {actual.dtype} in {second}")
    if expected.numel() == 0:
        return None
    expected, actual = expected.detach(), actual.detach().to(expected.device)
    differs = ~_close(expected, actual, rtol, atol)
    return PendingValues(path, expected, actual, differs, differs.sum())


def _close(expected: torch.Tensor, actual: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    import torch

    if rtol == 0 and atol == 0:
        same = expected == actual
        if expected.is_floating_point() or expected.is_complex():
            same |= expected.isnan() & actual.isnan()
        return same
    return torch.isclose(_widen(expected), _widen(actual), rtol=rtol, atol=atol, equal_nan=True)


def _widen(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    return tensor.to(torch.complex128 if tensor.is_complex() else torch.float64)


def _leaves_equal(expected: object, actual: object, rtol: float, atol: float) -> bool:
    if isinstance(expected, float) and isinstance(actual, float):
        both_nan = math.isnan(expected) and math.isnan(actual)
        return both_nan or math.isclose(expected, actual, rel_tol=rtol, abs_tol=atol)
    return bool(expected == actual)


@dataclass(frozen=True)
class CaseOutcome:
    """One case (or, in the toggle form, the pair of runs) and what differed in it."""

    title: str
    input_shapes: tuple[str, ...]
    mismatches: tuple[Mismatch, ...]

    @property
    def passed(self) -> bool:
        return not self.mismatches


@dataclass(frozen=True)
class ParityResult:
    """All cases of one ``check`` (form "cases") or one toggled run pair (form "toggle")."""

    form: str
    outcomes: tuple[CaseOutcome, ...]

    @property
    def checked(self) -> int:
        return len(self.outcomes)

    @property
    def passed(self) -> int:
        return sum(outcome.passed for outcome in self.outcomes)

    @property
    def failures(self) -> list[CaseOutcome]:
        return [outcome for outcome in self.outcomes if not outcome.passed]

    @property
    def ok(self) -> bool:
        return not self.failures

    def reason(self) -> str:
        """One line naming the first failing case and its first difference ("" when ok)."""
        if self.ok:
            return ""
        first = self.failures[0]
        verb = "differs" if self.form == "cases" else "differ"
        line = f"cuda_graph_parity: {first.title} {verb}: {first.mismatches[0].describe()}"
        if len(first.mismatches) > 1:
            line += f" (and {len(first.mismatches) - 1} more)"
        if first.input_shapes:
            line += "; input shapes: " + ", ".join(first.input_shapes)
        if len(self.failures) > 1:
            line += f"; {len(self.failures)} of {self.checked} cases differ"
        return line

    def details(self) -> str:
        """Every failing case and every difference in it (the "cudagraph parity" section)."""
        lines = []
        for outcome in self.failures:
            shapes = ", ".join(outcome.input_shapes)
            lines.append(
                f"{outcome.title} (input shapes: {shapes}):" if shapes else f"{outcome.title}:"
            )
            lines += [f"    {mismatch.describe()}" for mismatch in outcome.mismatches]
        lines.append(f"{self.passed} of {self.checked} match")
        return "\n".join(lines)


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
    extents = [extent for name, value in others.items() for extent in _storage_extents(value, name)]
    return _overlapping(output, extents, path=path)


_Extent = tuple[str, int, int]  # (device, first byte, end) of a tensor's whole storage


def _storage_extents(value: object, name: str) -> list[tuple[str, _Extent]]:
    """(path, extent) of each tensor in ``value`` that has storage; paths start at ``name``."""
    found = []
    for path, tensor in trees.tensors(value, name):
        extent = _storage_extent(tensor)
        if extent is not None:
            found.append((path, extent))
    return found


def _overlapping(
    output: object, extents: Iterable[tuple[str, _Extent]], *, path: str = "output"
) -> list[StorageOverlap]:
    """``storage_overlaps`` against extents taken earlier (``_storage_extents``)."""
    extents = list(extents)
    found = []
    for output_path, tensor in trees.tensors(output, path):
        mine = _storage_extent(tensor)
        if mine is None:
            continue
        for other_path, theirs in extents:
            if mine[0] == theirs[0] and mine[1] < theirs[2] and theirs[1] < mine[2]:
                found.append(StorageOverlap(output_path, other_path))
    return found


def _storage_extent(tensor: torch.Tensor) -> _Extent | None:
    """The tensor's storage extent; None when it has none."""
    import torch

    if tensor.layout != torch.strided or tensor.device.type == "meta":
        return None
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return str(tensor.device), storage.data_ptr(), storage.data_ptr() + storage.nbytes()


class ParityChecker:
    """The parity engine; ``on_result`` sees each result (the fixture fails the test there).

    ``seed`` seeds case k with ``seed + k``: the generator handed to ``make_inputs`` and the
    global CPU and CUDA generators while each side runs. ``comparisons`` counts the cases
    compared so far (a toggled run pair is one), so a caller can tell that nothing was.
    """

    def __init__(
        self,
        device: torch.device | str,
        seed: int = 0,
        on_result: Callable[[ParityResult], None] | None = None,
    ) -> None:
        import torch

        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        if not 0 <= seed <= MAX_SEED:
            raise ValueError(f"seed must be between 0 and 2**64 - 1, got {seed!r}")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.seed = seed
        self.comparisons = 0
        self._on_result = on_result
        self._recording: dict[str, list[object]] | None = None
        # What each toggled run recorded, uncopied (path -> value): kept alive until the
        # comparison, so that memory freed and handed out again never looks shared.
        self._recorded: dict[str, object] = {}

    def check(
        self,
        eager: Callable[..., object],
        graphed: Callable[..., object],
        make_inputs: Callable[[torch.Generator, object], object],
        cases: int | Iterable[object] = 8,
        *,
        rtol: float = 0.0,
        atol: float = 0.0,
    ) -> ParityResult:
        """Run both callables on every case and compare all outputs.

        ``make_inputs(generator, case)`` returns the inputs of one call: a dict (keyword
        arguments), a tuple or list (positional arguments) or a single value. ``cases`` is a
        count (cases 0..n-1) or the case values themselves, e.g. a list of shapes; it must
        name at least one case. A graphed output sharing storage with that call's inputs,
        the eager output or an earlier case's graphed output (all kept until the check
        ends) is a mismatch too.
        """
        case_values = self._case_values(cases)
        compared = []
        # Kept until the check ends, so that memory freed and handed out again never looks
        # shared; their extents are taken once.
        kept_outputs: list[object] = []
        kept_extents: list[tuple[str, _Extent]] = []
        with rng.restored(self.device):
            for index, case in enumerate(case_values):
                seed = self.seed + index
                # Only the graphed side is held to no_host_sync; the rest is the harness.
                with host_syncs_allowed(self.device):
                    eager_inputs = self._make_seeded(make_inputs, case, seed)
                    shapes = tuple(
                        f"{path} {tuple(tensor.shape)}"
                        for path, tensor in trees.tensors(eager_inputs, "")
                    )
                    expected = self._call_seeded(eager, eager_inputs, seed)
                    graphed_inputs = self._make_seeded(make_inputs, case, seed)
                actual = self._call_seeded(graphed, graphed_inputs, seed)
                with host_syncs_allowed(self.device):
                    others = [
                        *_storage_extents(graphed_inputs, "inputs"),
                        *_storage_extents(expected, "eager output"),
                        *kept_extents,
                    ]
                    found: list[Mismatch | PendingValues] = [
                        Mismatch(o.output, f"shares storage with {o.other}")
                        for o in _overlapping(actual, others)
                    ]
                    # Read after the last case: a read per case would make the host wait for
                    # the device every case, instead of preparing the next one while it works.
                    found += pending_comparison(expected, actual, rtol=rtol, atol=atol)
                kept_outputs.append(actual)
                kept_extents += _storage_extents(actual, f"case {index} output")
                title = f"case {index} of {len(case_values)}"
                if not isinstance(cases, int):
                    title += f" ({case!r})"
                compared.append((title, shapes, found))
        with host_syncs_allowed(self.device):
            outcomes = [
                CaseOutcome(title, shapes, tuple(settle_comparison(found)))
                for title, shapes, found in compared
            ]
        self.comparisons += len(outcomes)
        return self._finish(ParityResult("cases", tuple(outcomes)))

    def _case_values(self, cases: int | Iterable[object]) -> list[object]:
        if isinstance(cases, bool) or not isinstance(cases, (int, Iterable)):
            raise TypeError(f"cases must be a count or an iterable of case values, got {cases!r}")
        case_values = list(range(cases)) if isinstance(cases, int) else list(cases)
        if not case_values:
            raise ValueError(
                f"cases must name at least one case (a count >= 1 or a non-empty list), "
                f"got {cases!r}: a check of no cases proves nothing"
            )
        if self.seed + len(case_values) - 1 > MAX_SEED:
            raise ValueError(
                f"cases: {len(case_values)} cases from seed {self.seed} run past the largest "
                "seed, 2**64 - 1 (case k is seeded with seed + k)"
            )
        return case_values

    def run_toggled(self, body: Callable[[], object], toggle: str) -> ParityResult:
        """Run ``body`` with ``toggle`` set to "0" and then "1" and compare what it recorded.

        The variable is restored afterwards; under no_host_sync only the "1" run is held to it.
        """
        recordings, recorded = [], []
        for value in ("0", "1"):
            lifted = host_syncs_allowed(self.device) if value == "0" else nullcontext()
            with _environment(toggle, value), rng.seeded(self.device, self.seed), lifted:
                self._recording, self._recorded = {}, {}
                try:
                    body()
                    recordings.append(self._recording)
                    recorded.append(self._recorded)
                finally:
                    self._recording, self._recorded = None, {}
        off, on = recordings
        with host_syncs_allowed(self.device):
            mismatches = self._shared_storage(*recorded, toggle)
            mismatches += compare_outputs(
                off, on, path="recorded", sides=(f"{toggle}=0", f"{toggle}=1")
            )
        if not off and not on:
            nothing = "nothing was recorded; call graph_parity.record(name, value) in the body"
            mismatches = [Mismatch("recorded", nothing)]
        outcome = CaseOutcome(f"runs with {toggle}=0 and =1", (), tuple(mismatches))
        self.comparisons += 1
        return self._finish(ParityResult("toggle", (outcome,)))

    def record(self, name: str, value: object) -> None:
        """Record a value (tensor, number, or list/tuple/dict of them) from a toggled run."""
        if self._recording is None:
            raise RuntimeError(
                "graph_parity.record() works only in the body of a test marked "
                "cuda_graph_parity(toggle=...)"
            )
        values = self._recording.setdefault(name, [])
        self._recorded[f"recorded[{name!r}][{len(values)}]"] = value
        values.append(trees.snapshot(value))

    @staticmethod
    def _shared_storage(
        off: dict[str, object], on: dict[str, object], toggle: str
    ) -> list[Mismatch]:
        """The storage rule in the toggle form: a value the "1" run recorded must not share
        memory with one recorded earlier in that run (a graph handing out its static output
        buffer every time), unless the "0" run's values shared theirs alike (a body that
        records one tensor twice, or a fixture's tensor, does so in both runs)."""

        def within(run: dict[str, object]) -> set[tuple[str, str]]:
            paths = list(run)
            return {
                (overlap.output, overlap.other)
                for index, path in enumerate(paths)
                for overlap in storage_overlaps(
                    run[path], {earlier: run[earlier] for earlier in paths[:index]}, path=path
                )
            }

        shared = sorted(within(on) - within(off))
        return [
            Mismatch(path, f"shares storage with {other} in the run with {toggle}=1")
            for path, other in shared
        ]

    def _finish(self, result: ParityResult) -> ParityResult:
        if self._on_result is not None:
            self._on_result(result)
        return result

    def _make_seeded(
        self, make_inputs: Callable[[torch.Generator, object], object], case: object, seed: int
    ) -> object:
        import torch

        # Seeded globally too, so inputs drawn without the generator still match.
        rng.seed_all(self.device, seed)
        return make_inputs(torch.Generator(device=self.device).manual_seed(seed), case)

    def _call_seeded(self, function: Callable[..., object], inputs: object, seed: int) -> object:
        rng.seed_all(self.device, seed)
        if isinstance(inputs, Mapping):
            return function(**inputs)
        if isinstance(inputs, (tuple, list)):
            return function(*inputs)
        return function(inputs)


@contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous
