"""The comparison the parity engine and the checks share: two outputs, walked alike.

``compare_outputs(expected, actual)`` lists every difference: containers walked as
``trees.node`` sees them, tensors compared by shape, dtype and value under one tolerance rule
(``Tolerance``; bools exactly, integers in integer arithmetic), number leaves by the same rule,
other leaves with ``==``. Its two halves, ``pending_comparison`` and ``settle_comparison``, let
a caller queue many tensor comparisons on the device and read them with one synchronization.
torch is imported when used.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.arguments import non_negative_number

if TYPE_CHECKING:
    import torch


DEFAULT_SIDES = ("eager", "graphed")  # what a mismatch calls the first and the second value


@dataclass(frozen=True)
class Tolerance:
    """How far the second value may be from the first (graphed from eager): they agree where
    ``|second - first| <= atol + rtol * |first|``. Both finite numbers >= 0; both 0, the
    default, is exact (NaN agreeing with NaN)."""

    atol: float = 0.0
    rtol: float = 0.0

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            non_negative_number(f"Tolerance.{name}", getattr(self, name))

    def describe(self) -> str:
        if self.atol == 0 and self.rtol == 0:
            return "exact"
        return f"atol {self.atol:g}, rtol {self.rtol:g}"


EXACT = Tolerance()


def checked_tolerance(*, rtol: object, atol: object) -> Tolerance:
    """The tolerance of a caller's ``rtol`` and ``atol``, each checked under its own name."""
    return Tolerance(rtol=non_negative_number("rtol", rtol), atol=non_negative_number("atol", atol))


@dataclass(frozen=True)
class Mismatch:
    """One output that differs. A value difference names the first differing element
    (``first_index``), the two sides' values there (``eager``, ``graphed``: the first and the
    second side), their absolute and relative difference there (relative to the first side),
    the largest difference and how many of ``numel`` elements differ. A differing number
    (a leaf, not in a tensor) carries its values and differences too. ``atol`` and ``rtol``
    are the tolerance in force (0 for bools, which compare exactly)."""

    path: str
    detail: str = ""
    first_index: tuple[int, ...] | None = None
    max_abs_diff: float | None = None
    differing: int | None = None
    numel: int | None = None
    eager: object = None
    graphed: object = None
    abs_diff: float | None = None
    rel_diff: float | None = None
    atol: float = 0.0
    rtol: float = 0.0
    sides: tuple[str, str] = DEFAULT_SIDES

    def describe(self) -> str:
        first, second = self.sides
        if self.first_index is None:
            if self.abs_diff is None:
                return f"{self.path}: {self.detail}"
            return f"{self.path}: {self.detail} ({self._differences()})"
        return (
            f"{self.path} at index {self.first_index}: {first} {_shown(self.eager)}, "
            f"{second} {_shown(self.graphed)} ({self._differences()}); {self.differing} of "
            f"{self.numel} elements differ, largest |diff| {_figure(self.max_abs_diff)}"
        )

    def tolerance(self) -> str:
        return Tolerance(self.atol, self.rtol).describe()

    def data(self) -> dict[str, object]:
        """Plain data, as strict JSON holds it (it may travel from an xdist worker)."""
        return {
            "path": self.path,
            "detail": self.detail,
            "first_index": None if self.first_index is None else list(self.first_index),
            "eager": _plain(self.eager),
            "graphed": _plain(self.graphed),
            "abs_diff": _plain(self.abs_diff),
            "rel_diff": _plain(self.rel_diff),
            "tolerance": {"atol": self.atol, "rtol": self.rtol},
        }

    def _differences(self) -> str:
        return (
            f"|diff| {_figure(self.abs_diff)}, rel {_figure(self.rel_diff)}; "
            f"tolerance {self.tolerance()}"
        )


# A tolerance for the whole output, or one per top-level part (a dict's key, a sequence's
# index, a dataclass's attribute), parts not named exact.
Tolerances = Tolerance | Mapping[Hashable, Tolerance]


def compare_outputs(
    expected: object,
    actual: object,
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    tolerance: Tolerances | None = None,
    path: str = "output",
    sides: tuple[str, str] = DEFAULT_SIDES,
) -> list[Mismatch]:
    """Every difference between two outputs, walking the containers of ``trees.node``
    (mappings, sequences, dataclasses, namespaces).

    Tensors must agree in shape, dtype and values: equal when ``|actual - expected| <= atol +
    rtol * |expected|`` (exact when both tolerances are 0; NaN equal to NaN; an infinity only
    to itself), bools always exactly, integers in integer arithmetic. Number leaves follow the
    same rule; other leaves are compared with ``==``. A leaf that cannot be compared (see
    ``trees.unsupported``) is a TypeError naming its path. ``tolerance`` (a Tolerance, or one
    per top-level part) stands for ``rtol`` and ``atol``: give one or the other.
    """
    if tolerance is None:
        tolerance = checked_tolerance(rtol=rtol, atol=atol)
    elif rtol or atol:
        raise TypeError("give rtol and atol, or tolerance, not both")
    return settle_comparison(
        pending_comparison(expected, actual, tolerance, path=path, sides=sides)
    )


def pending_comparison(
    expected: object,
    actual: object,
    tolerance: Tolerances = EXACT,
    *,
    path: str = "output",
    sides: tuple[str, str] = DEFAULT_SIDES,
) -> list[Mismatch | PendingValues]:
    """``compare_outputs`` under ``tolerance`` without waiting for the device: the differences
    found on the host, and for each pair of tensors their comparison queued on the device, taken
    from what the two hold now (``settle_comparison`` reads them, with one synchronization for
    many). A tolerance per part applies to the output's top-level parts, whichever side has
    them; an output without parts compares exactly."""
    parts = checked_parts(tolerance)
    whole = EXACT if parts is not None else tolerance
    for value, side in zip((expected, actual), sides, strict=True):
        trees.check_bounds(value, f"{side} {path}")  # the walk below recurses
    assert isinstance(whole, Tolerance)
    found: list[Mismatch | PendingValues] = []
    _compare(expected, actual, float(whole.rtol), float(whole.atol), path, sides, found, parts)
    return found


def checked_parts(tolerance: object) -> dict[Hashable, Tolerance] | None:
    """A tolerance per part as a dict (None for one Tolerance); TypeError for anything else."""
    if isinstance(tolerance, Tolerance):
        return None
    if not isinstance(tolerance, Mapping):
        raise TypeError(
            f"tolerance must be a Tolerance or a mapping part -> Tolerance, got "
            f"{type(tolerance).__name__}"
        )
    for part, value in tolerance.items():
        if not isinstance(value, Tolerance):
            raise TypeError(f"tolerance[{part!r}] must be a Tolerance, got {type(value).__name__}")
    return dict(tolerance)


def _compare(
    expected: object,
    actual: object,
    rtol: float,
    atol: float,
    path: str,
    sides: tuple[str, str],
    found: list[Mismatch | PendingValues],
    parts: Mapping[Hashable, Tolerance] | None = None,
) -> None:
    """Appends each difference to ``found``; ``parts``, the tolerance of each child of this
    value (the top level of a per-part tolerance)."""
    import torch

    first, second = sides
    for value, side in ((expected, first), (actual, second)):
        why = trees.unsupported(value)
        if why:
            raise TypeError(f"{side} {path}: {why}")
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        compared = _pending_tensors(expected, actual, rtol, atol, path, sides)
        if compared is not None:
            found.append(compared)
        return
    mine, theirs = trees.node(expected), trees.node(actual)
    tensors = isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor)
    if mine is None and theirs is None and not tensors:
        if not _leaves_close(expected, actual, rtol, atol):
            found.append(_leaf_mismatch(expected, actual, rtol, atol, path, sides))
        return
    if (
        mine is None
        or theirs is None
        or mine.kind != theirs.kind
        or (mine.kind == trees.ATTRIBUTES and type(expected) is not type(actual))
    ):
        kinds = f"{type(expected).__name__} in {first}, {type(actual).__name__} in {second}"
        found.append(Mismatch(path, kinds, sides=sides))
        return
    if mine.kind == trees.SEQUENCE:
        if len(mine.items) != len(theirs.items):
            lengths = f"length {len(mine.items)} in {first}, {len(theirs.items)} in {second}"
            found.append(Mismatch(path, lengths, sides=sides))
            return
        pairs = [
            (key, one, other)
            for (key, one), (_, other) in zip(mine.items, theirs.items, strict=True)
        ]
    else:
        ours, others = dict(mine.items), dict(theirs.items)
        if ours.keys() != others.keys():
            names = "keys" if mine.kind == trees.MAPPING else "attributes"
            only_first = [key for key in ours if key not in others]
            only_second = [key for key in others if key not in ours]
            detail = f"{names} {only_first} only in {first}, {only_second} only in {second}"
            found.append(Mismatch(path, detail, sides=sides))
        pairs = [(key, value, others[key]) for key, value in ours.items() if key in others]
    for key, one, other in pairs:
        child = (rtol, atol) if parts is None else _floats(parts.get(key, EXACT))
        _compare(one, other, *child, trees.child_path(path, mine, key), sides, found)


def _floats(tolerance: Tolerance) -> tuple[float, float]:
    return float(tolerance.rtol), float(tolerance.atol)


@dataclass(frozen=True)
class PendingValues:
    """Two same-shaped tensors' value comparison, queued on their device when the pair was
    compared, so that what they held then is what is reported: how many elements differ, the
    flat index of the first that does, the two values there and the largest difference.
    Nothing is read until ``mismatch()``; the tensors compared are not kept."""

    path: str
    shape: tuple[int, ...]
    differing: torch.Tensor
    first: torch.Tensor
    eager: torch.Tensor
    graphed: torch.Tensor
    largest: torch.Tensor
    atol: float
    rtol: float
    sides: tuple[str, str]

    def mismatch(self, differing: int | None = None) -> Mismatch | None:
        """The mismatch, None when every element agrees; ``differing`` is the count when it
        was read already (``settle_comparison`` reads every count at once)."""
        differing = int(self.differing) if differing is None else differing
        if differing == 0:
            return None
        flat, index = int(self.first), []
        for size in reversed(self.shape):
            flat, position = divmod(flat, size)
            index.append(position)
        eager, graphed = self.eager.item(), self.graphed.item()
        abs_diff, rel_diff = _differences(eager, graphed)
        numel = math.prod(self.shape)
        return Mismatch(
            self.path,
            "",
            tuple(reversed(index)),
            float(self.largest),
            differing,
            numel,
            eager,
            graphed,
            abs_diff,
            rel_diff,
            self.atol,
            self.rtol,
            self.sides,
        )


def settle_comparison(found: Iterable[Mismatch | PendingValues]) -> list[Mismatch]:
    """The mismatches of a ``pending_comparison``, its device figures read (every count in one
    read per device)."""
    return settle_comparisons([list(found)])[0]


def settle_comparisons(groups: list[list[Mismatch | PendingValues]]) -> list[list[Mismatch]]:
    """``settle_comparison`` of several pending comparisons at once (one read per device)."""
    import torch

    pending = [item for group in groups for item in group if isinstance(item, PendingValues)]
    counts: dict[int, int] = {}
    by_device: dict[torch.device, list[PendingValues]] = {}
    for values in pending:
        by_device.setdefault(values.differing.device, []).append(values)
    for items in by_device.values():
        read = torch.stack([item.differing for item in items]).tolist()
        counts.update(zip(map(id, items), read, strict=True))
    settled = []
    for group in groups:
        mismatches = []
        for item in group:
            found = item.mismatch(counts[id(item)]) if isinstance(item, PendingValues) else item
            if found is not None:
                mismatches.append(found)
        settled.append(mismatches)
    return settled


def _pending_tensors(
    expected: torch.Tensor,
    actual: torch.Tensor,
    rtol: float,
    atol: float,
    path: str,
    sides: tuple[str, str],
) -> Mismatch | PendingValues | None:
    import torch

    first, second = sides
    if expected.shape != actual.shape:
        return Mismatch(
            path,
            f"shape {tuple(expected.shape)} in {first}, {tuple(actual.shape)} in {second}",
            sides=sides,
        )
    if expected.dtype != actual.dtype:
        detail = f"dtype {expected.dtype} in {first}, {actual.dtype} in {second}"
        return Mismatch(path, detail, sides=sides)
    if expected.numel() == 0:
        return None
    expected, actual = expected.detach(), actual.detach().to(expected.device)
    if expected.dtype == torch.bool:
        rtol = atol = 0.0
    close = _close(expected, actual, rtol, atol)
    flat = (~close).reshape(-1)
    first_index = flat.to(torch.uint8).argmax()  # the first that differs, or 0 when none does
    if expected.is_floating_point() or expected.is_complex():
        gaps = (expected - actual).abs()  # a figure for the report: its own precision will do
    else:  # integers could wrap around, and bools do not subtract
        gaps = (_widen(expected) - _widen(actual)).abs_()
    return PendingValues(
        path,
        tuple(expected.shape),
        flat.sum(),
        first_index,
        _element(expected, first_index),
        _element(actual, first_index),
        gaps.masked_fill_(close, 0).max(),
        atol,
        rtol,
        sides,
    )


def _close(expected: torch.Tensor, actual: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    import torch

    if expected.dtype == torch.bool or (rtol == 0 and atol == 0):
        same = expected == actual
        if expected.is_floating_point() or expected.is_complex():
            same |= expected.isnan() & actual.isnan()
        return same
    if expected.is_complex():  # torch 2.7's isclose takes no equal_nan for complex values
        close = torch.isclose(_widen(actual), _widen(expected), rtol=rtol, atol=atol)
        return close | (expected.isnan() & actual.isnan())
    if expected.is_floating_point():
        return torch.isclose(_widen(actual), _widen(expected), rtol=rtol, atol=atol, equal_nan=True)
    return _integers_close(expected, actual, rtol, atol)


def _element(tensor: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
    """A copy of the element at a flat index held on the device: indexing with it as an
    integer would make the host wait for the device."""
    import torch

    # torch.take has no kernel for the wider unsigned types: read their bits as signed ones.
    signed = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
    if tensor.dtype in signed:
        return torch.take(tensor.view(signed[tensor.dtype]), flat_index).view(tensor.dtype)
    return torch.take(tensor, flat_index)


def _integers_close(
    expected: torch.Tensor, actual: torch.Tensor, rtol: float, atol: float
) -> torch.Tensor:
    """The tolerance rule for integers, the gap taken exactly in 64-bit integers (float64
    holds integers exactly only up to 2**53) and judged against the floor of the bound."""
    import torch

    mine, theirs = _ordered_int64(expected), _ordered_int64(actual)
    gap = torch.maximum(mine, theirs) - torch.minimum(mine, theirs)  # < 0: past 2**63 - 1
    bound = expected.to(torch.float64).abs() * rtol + atol
    unbounded = bound >= 2.0**63  # every gap an int64 holds is within
    allowed = torch.where(unbounded, 0.0, bound).floor().to(torch.int64)
    return (gap >= 0) & (unbounded | (gap <= allowed))


def _ordered_int64(tensor: torch.Tensor) -> torch.Tensor:
    """The values as int64 in the same order (uint64 shifted by 2**63, keeping every gap)."""
    import torch

    as_int64 = tensor.to(torch.int64)
    if tensor.dtype == torch.uint64:
        return as_int64 ^ torch.iinfo(torch.int64).min
    return as_int64


def _widen(tensor: torch.Tensor) -> torch.Tensor:
    import torch

    return tensor.to(torch.complex128 if tensor.is_complex() else torch.float64)


def _leaves_close(expected: object, actual: object, rtol: float, atol: float) -> bool:
    """The tolerance rule for two leaves: bools and non-numbers exactly, numbers as tensors."""
    if isinstance(expected, bool) or isinstance(actual, bool) or not _is_number(expected):
        return type(expected) is type(actual) and bool(expected == actual)
    if not _is_number(actual):
        return False
    if expected == actual or (_is_nan(expected) and _is_nan(actual)):
        return True
    gap, _ = _differences(expected, actual)
    if isinstance(expected, int) and isinstance(actual, int):  # exactly, whatever their size
        return gap <= Fraction(atol) + Fraction(rtol) * abs(expected)
    if not math.isfinite(gap):  # an infinity matches only itself; NaN only NaN
        return False
    return gap <= atol + rtol * abs(expected)  # type: ignore[arg-type]


def _leaf_mismatch(
    expected: object, actual: object, rtol: float, atol: float, path: str, sides: tuple[str, str]
) -> Mismatch:
    first, second = sides
    detail = f"{expected!r} in {first}, {actual!r} in {second}"
    numbers = _is_number(expected) and _is_number(actual)
    abs_diff, rel_diff = _differences(expected, actual) if numbers else (None, None)
    if isinstance(expected, bool) or isinstance(actual, bool):
        rtol = atol = 0.0
    return Mismatch(
        path,
        detail,
        eager=expected,
        graphed=actual,
        abs_diff=abs_diff,
        rel_diff=rel_diff,
        atol=atol,
        rtol=rtol,
        sides=sides,
    )


def _differences(expected: Any, actual: Any) -> tuple[float | int, float]:
    """|actual - expected| (exact for integers) and that over |expected|, for two numbers."""
    try:
        gap = abs(actual - expected)
    except OverflowError:
        return math.inf, math.inf
    magnitude = abs(expected)
    if _is_nan(gap):
        return gap, math.nan
    if magnitude == 0:
        return gap, 0.0 if gap == 0 else math.inf
    try:
        return gap, gap / magnitude
    except OverflowError:
        return gap, math.inf


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float, complex)) and not isinstance(value, bool)


def _is_nan(value: object) -> bool:
    if isinstance(value, complex):
        return math.isnan(value.real) or math.isnan(value.imag)
    return isinstance(value, float) and math.isnan(value)


def _shown(value: object) -> str:
    return f"{value:.9g}" if isinstance(value, float) else repr(value)


def _figure(value: object) -> str:
    try:
        return f"{value:.4g}"
    except (OverflowError, ValueError):  # an integer past what a float holds
        return "more than 1e308"


def _plain(value: object) -> object:
    """``value`` as JSON holds it: an infinity, NaN, a complex number or any other value as
    text (strict JSON has no Infinity or NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
