"""cuda_graph_parity: prove that a graphed callable computes what its eager twin computes.

Two forms share one comparison engine (pytest_cudagraph.engines.compare):

- ``ParityChecker.check(eager, graphed, make_inputs, cases)``: for each case both sides get
  fresh inputs of their own built from identically seeded generators and run under identical
  RNG (CPU and CUDA generators forked and seeded alike); every output is compared, the eager
  one as it was when eager returned, the graphed one as it was when graphed returned.
- ``ParityChecker.run_toggled(body, toggle)``: a whole test body runs with an environment
  toggle "0" and then "1" under identical RNG; what it ``record()``-ed is compared.

A graphed output must also own its memory (pytest_cudagraph.engines.storage). The engine runs
on any device, CPU included; requiring CUDA is the fixture's business. torch is imported when
the engine is used, so loading the plugin costs nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_cudagraph.engines import rng, trees
from pytest_cudagraph.engines.compare import (
    Mismatch,
    PendingValues,
    Tolerances,
    checked_parts,
    checked_tolerance,
    compare_outputs,
    pending_comparison,
    settle_comparisons,
)
from pytest_cudagraph.engines.hostsync import host_syncs_allowed
from pytest_cudagraph.engines.storage import (
    EarlierOutputs,
    overlapping,
    storage_extents,
    storage_overlaps,
)
from pytest_cudagraph.engines.units import GiB

if TYPE_CHECKING:
    import torch

# Case k is seeded with seed + k.
MAX_SEED = rng.MAX_SEED
# A count past this is a typo or a loop bound: at a millisecond a case it would run for hours.
MAX_CASES = 1_000_000
# Earlier graphed outputs a check keeps alive for the storage rule, at most (bytes).
DEFAULT_OUTPUT_BUDGET = GiB
# Tensor comparisons queued on the device before a check reads them: past this many it reads
# those it holds (one synchronization), so a long check keeps a bounded number of them.
PENDING_LIMIT = 1024
# What counts as compared is trees.compared_elements's rule.
NOTHING_COMPARED = (
    "nothing compared: no case's eager output holds a compared element (a tensor's element, "
    "or a number in an output that holds no tensor; strings, None and numbers beside tensors "
    "do not count), so no value the graph computes was checked"
)
NOTHING_RECORDED = (
    "nothing compared: no value recorded holds a compared element (a tensor's element, or a "
    "number in a value that holds no tensor)"
)
_TOGGLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_toggle(toggle: object) -> str:
    """``toggle`` when it names an environment variable the way a shell writes one: letters,
    digits and underscores, not starting with a digit (so no space or newline around it)."""
    if not isinstance(toggle, str):
        raise TypeError(f"toggle must name an environment variable, got {toggle!r}")
    if _TOGGLE_NAME.fullmatch(toggle) is None:
        raise ValueError(
            "toggle must name an environment variable: letters, digits and underscores, not "
            f"starting with a digit, with no space or newline around it; got {toggle!r}"
        )
    return toggle


@dataclass(frozen=True)
class CaseOutcome:
    """One case (or, in the toggle form, the pair of runs) and what differed in it; ``seed``
    is the seed it ran under, ``rerun`` a command that runs it alone ("" when none is known)."""

    title: str
    input_shapes: tuple[str, ...]
    mismatches: tuple[Mismatch, ...]
    seed: int | None = None
    rerun: str = ""

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def data(self) -> dict[str, object]:
        """A failing case as plain data: its title and each mismatch with the seed."""
        mismatches = [{**mismatch.data(), "seed": self.seed} for mismatch in self.mismatches]
        return {"title": self.title, "mismatches": mismatches}


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
        """One line naming the first failing case, its first difference, its seed and how to
        rerun it ("" when ok)."""
        if self.ok:
            return ""
        first = self.failures[0]
        verb = "differs" if self.form == "cases" else "differ"
        line = f"cuda_graph_parity: {first.title} {verb}: {first.mismatches[0].describe()}"
        if len(first.mismatches) > 1:
            line += f" (and {len(first.mismatches) - 1} more)"
        if first.input_shapes:
            line += "; input shapes: " + ", ".join(first.input_shapes)
        if first.seed is not None:
            line += f"; seed {first.seed}"
        if len(self.failures) > 1:
            line += f"; {len(self.failures)} of {self.checked} cases differ"
        if first.rerun:
            line += f"; rerun: {first.rerun}"
        return line

    def details(self) -> str:
        """Every failing case and every difference in it (the "cudagraph parity" section)."""
        lines = []
        for outcome in self.failures:
            header = outcome.title
            if outcome.seed is not None:
                header += f", seed {outcome.seed}"
            if outcome.input_shapes:
                header += f" (input shapes: {', '.join(outcome.input_shapes)})"
            lines.append(f"{header}:")
            lines += [f"    {mismatch.describe()}" for mismatch in outcome.mismatches]
            if outcome.rerun:
                lines.append(f"    rerun: {outcome.rerun}")
        lines.append(f"{self.passed} of {self.checked} match")
        return "\n".join(lines)


class ParityChecker:
    """The parity engine; ``on_result`` sees each result (the fixture fails the test there).

    ``seed`` seeds case k with ``seed + k``: the generator handed to ``make_inputs`` and the
    global CPU and CUDA generators while each side runs. ``only_case`` runs case k of every
    check alone (what a failure's rerun command asks for); ``rerun(seed, case)`` makes that
    command (``case`` None for a toggled run pair). ``output_budget_bytes`` bounds the earlier
    outputs a check keeps alive for the storage rule. ``comparisons`` counts the cases compared
    so far (a toggled run pair is one) and ``running`` the checks in progress, so a caller can
    tell that nothing was compared, or that a check has not finished.
    """

    def __init__(
        self,
        device: torch.device | str,
        seed: int = 0,
        on_result: Callable[[ParityResult], None] | None = None,
        *,
        only_case: int | None = None,
        rerun: Callable[[int, int | None], str] | None = None,
        output_budget_bytes: int = DEFAULT_OUTPUT_BUDGET,
    ) -> None:
        import torch

        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        if not 0 <= seed <= MAX_SEED:
            raise ValueError(f"seed must be between 0 and 2**64 - 1, got {seed!r}")
        for name, function in (("on_result", on_result), ("rerun", rerun)):
            if function is not None and not callable(function):
                raise TypeError(f"{name} must be callable or None, got {function!r}")
        if only_case is not None:
            _check_count("only_case", only_case)
        _check_count("output_budget_bytes", output_budget_bytes)
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.seed = seed
        self.only_case = only_case
        self.output_budget_bytes = output_budget_bytes
        self.comparisons = 0
        self._on_result = on_result
        self._rerun = rerun
        self._running = 0
        self._lock = threading.Lock()
        self._recording: dict[str, list[object]] | None = None
        # What each toggled run recorded, uncopied (path -> value): kept alive until the
        # comparison, so that memory freed and handed out again never looks shared.
        self._recorded: dict[str, object] = {}

    @property
    def running(self) -> int:
        """How many checks (or toggled runs) have started and not finished."""
        return self._running

    def check(
        self,
        eager: Callable[..., object],
        graphed: Callable[..., object],
        make_inputs: Callable[[torch.Generator, Any], object],  # takes what ``cases`` names
        cases: int | Iterable[object] = 8,
        *,
        rtol: float = 0.0,
        atol: float = 0.0,
        tolerance: Tolerances | None = None,
        key_of: Callable[[object], Hashable] | None = None,
    ) -> ParityResult:
        """Run both callables on every case and compare all outputs.

        ``make_inputs(generator, case)`` returns the inputs of one call: a dict (keyword
        arguments), a tuple or list (positional arguments) or a single value; it is called
        once per side, and the two sides' tensors must not share memory. ``cases`` is a count
        (cases 0..n-1) or the case values themselves, e.g. a list of shapes; it must name at
        least one case. ``tolerance`` (a Tolerance, or one per top-level part of the output:
        see ``compare.pending_comparison``) stands for ``rtol`` and ``atol``; give one or the
        other. ``key_of(inputs)``, when given, names each case's key in the report.
        The eager output is copied when eager returns and the graphed one compared when it
        returns, so that neither side's later writes reach the comparison. A graphed output
        sharing storage with that call's inputs, the eager output or an earlier case's
        graphed output is a mismatch too. A check that compared nothing fails every case
        (``NOTHING_COMPARED``): no case's eager output held a compared element, which is a
        tensor's element, or a number in an output holding no tensor
        (``trees.compared_elements``). An output no walk can finish (one that holds itself or
        nests past ``trees.MAX_DEPTH``) is a ValueError naming where.
        """
        for name, function in (
            ("eager", eager),
            ("graphed", graphed),
            ("make_inputs", make_inputs),
        ):
            if not callable(function):
                raise TypeError(f"{name} must be callable, got {function!r}")
        if key_of is not None and not callable(key_of):
            raise TypeError(f"key_of must be callable or None, got {key_of!r}")
        if tolerance is None:
            tolerance = checked_tolerance(rtol=rtol, atol=atol)
        elif rtol or atol:
            raise TypeError("give rtol and atol, or tolerance, not both")
        else:
            checked_parts(tolerance)
        case_values = self._case_values(cases)
        indices = self._indices(len(case_values))
        earlier = EarlierOutputs(self.output_budget_bytes)
        unread: list[_Compared] = []
        outcomes: list[CaseOutcome] = []
        elements = 0
        with self._counted(), rng.restored(self.device):
            for index in indices:
                case, seed = case_values[index], self.seed + index
                # Only the graphed side is held to no_host_sync; the rest is the harness.
                with host_syncs_allowed(self.device):
                    eager_inputs = self._make_seeded(make_inputs, case, seed)
                    graphed_inputs = self._make_seeded(make_inputs, case, seed)
                    _refuse_shared_inputs(eager_inputs, graphed_inputs, index)
                    shapes = tuple(
                        f"{path} {tuple(tensor.shape)}"
                        for path, tensor in trees.tensors(eager_inputs, "")
                    )
                    title = f"case {index} of {len(case_values)}"
                    if not isinstance(cases, int):
                        title += f" ({case!r})"
                    if key_of is not None:
                        title += f", key {key_of(eager_inputs)!r}"
                    returned = self._call_seeded(eager, eager_inputs, seed)
                    expected = trees.snapshot(returned, "eager output")
                    elements += trees.compared_elements(expected, "eager output")
                actual = self._call_seeded(graphed, graphed_inputs, seed)
                with host_syncs_allowed(self.device):
                    others = [
                        *storage_extents(graphed_inputs, "inputs"),
                        *storage_extents(returned, "eager output"),
                    ]
                    shared = [*overlapping(actual, others), *earlier.overlaps(actual)]
                    found: list[Mismatch | PendingValues] = [
                        Mismatch(overlap.output, f"shares storage with {overlap.other}")
                        for overlap in shared
                    ]
                    # Read later, many cases at once: a read per case would make the host
                    # wait for the device every case instead of preparing the next one.
                    found += pending_comparison(expected, actual, tolerance)
                    earlier.keep(actual, f"case {index} output")
                # The next case's inputs are made without this one's held.
                del eager_inputs, graphed_inputs, returned, expected, actual
                unread.append(_Compared(index, title, shapes, found))
                if sum(len(compared.found) for compared in unread) > PENDING_LIMIT:
                    with host_syncs_allowed(self.device):
                        outcomes += self._outcomes(unread)
                    unread = []
            with host_syncs_allowed(self.device):
                outcomes += self._outcomes(unread)
        if elements == 0:
            nothing = (Mismatch("output", NOTHING_COMPARED),)
            outcomes = [dataclasses.replace(o, mismatches=nothing, rerun="") for o in outcomes]
        self.comparisons += len(outcomes)
        return self._finish(ParityResult("cases", tuple(outcomes)))

    def _outcomes(self, unread: list[_Compared]) -> list[CaseOutcome]:
        settled = settle_comparisons([compared.found for compared in unread])
        return [
            self._outcome(compared.title, compared.shapes, mismatches, compared.index)
            for compared, mismatches in zip(unread, settled, strict=True)
        ]

    def _outcome(
        self, title: str, shapes: tuple[str, ...], mismatches: list[Mismatch], index: int | None
    ) -> CaseOutcome:
        """A case's outcome (``index`` None for a toggled run pair)."""
        seed = self.seed + (index or 0)
        rerun = "" if not mismatches or self._rerun is None else self._rerun(self.seed, index)
        return CaseOutcome(title, shapes, tuple(mismatches), seed, rerun)

    def _case_values(self, cases: int | Iterable[object]) -> Sequence[object]:
        if isinstance(cases, (bool, str, bytes)) or not isinstance(cases, (int, Iterable)):
            raise TypeError(
                f"cases must be a count (an int) or an iterable of case values, got {cases!r}"
            )
        if isinstance(cases, int):
            if cases > MAX_CASES:
                raise ValueError(f"cases must be at most {MAX_CASES:,} a check, got {cases:,}")
            case_values: Sequence[object] = range(max(cases, 0))
        else:
            case_values = list(itertools.islice(cases, MAX_CASES + 1))
            if len(case_values) > MAX_CASES:
                raise ValueError(
                    f"cases must name at most {MAX_CASES:,} case values a check, got more "
                    "(an endless iterator?)"
                )
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

    def _indices(self, count: int) -> Sequence[int]:
        if self.only_case is None:
            return range(count)
        if self.only_case >= count:
            raise ValueError(
                f"only_case {self.only_case} names no case of this check, which has cases 0 "
                f"to {count - 1}"
            )
        return [self.only_case]

    def run_toggled(self, body: Callable[[], object], toggle: str) -> ParityResult:
        """Run ``body`` with ``toggle`` set to "0" and then "1" and compare what it recorded.

        The variable is restored afterwards; under no_host_sync only the "1" run is held to it.
        """
        if not callable(body):
            raise TypeError(f"body must be callable, got {body!r}")
        check_toggle(toggle)
        recordings, recorded = [], []
        with self._counted():
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
                recorded_off, recorded_on = recorded
                mismatches = self._shared_storage(recorded_off, recorded_on, toggle)
                mismatches += compare_outputs(
                    off, on, path="recorded", sides=(f"{toggle}=0", f"{toggle}=1")
                )
        if not off and not on:
            nothing = "nothing was recorded; call graph_parity.record(name, value) in the body"
            mismatches = [Mismatch("recorded", nothing)]
        elif not any(trees.compared_elements(value) for values in off.values() for value in values):
            mismatches.append(Mismatch("recorded", NOTHING_RECORDED))
        outcome = self._outcome(f"runs with {toggle}=0 and =1", (), mismatches, None)
        self.comparisons += 1
        return self._finish(ParityResult("toggle", (outcome,)))

    def record(self, name: str, value: object) -> None:
        """Record a value (tensors, numbers, and the containers of ``trees.node`` holding
        them) from a toggled run; it is copied now, so later writes cannot change it."""
        if self._recording is None:
            raise RuntimeError(
                "graph_parity.record() works only in the body of a test marked "
                "cuda_graph_parity(toggle=...)"
            )
        if not isinstance(name, str):
            raise TypeError(f"record: name must be a string, got {name!r}")
        path = f"recorded[{name!r}][{len(self._recording.get(name, ()))}]"
        copied = trees.snapshot(value, path)  # a TypeError here records nothing
        self._recording.setdefault(name, []).append(copied)
        self._recorded[path] = value

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

    @contextmanager
    def _counted(self) -> Iterator[None]:
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1

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


@dataclass(frozen=True)
class _Compared:
    """A case compared and not yet read."""

    index: int
    title: str
    shapes: tuple[str, ...]
    found: list[Mismatch | PendingValues]


def _check_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def _refuse_shared_inputs(eager_inputs: object, graphed_inputs: object, index: int) -> None:
    """ValueError when the two sides' inputs share memory (a cached or fixture-held tensor
    handed to both): an in-place eager call would change what the graphed call reads."""
    shared = overlapping(graphed_inputs, storage_extents(eager_inputs, ""), path="")
    if shared:
        pairs = "; ".join(
            f"{overlap.output} of the graphed call with {overlap.other} of the eager call"
            for overlap in shared
        )
        raise ValueError(
            f"make_inputs gave both sides of case {index} the same memory ({pairs}): each side "
            "needs inputs of its own, or an in-place eager call changes what the graphed call "
            "reads; build the tensors in make_inputs, or clone a cached one there"
        )


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
