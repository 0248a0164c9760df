"""The one home for calling a target's two sides and comparing them as its contract says.

Each call draws its own inputs (``draw``: a case under a seed), runs under one seed of torch's
generators, and keeps what it returned as long as the target's ``output_lifetime`` lets it (a
copy taken at once otherwise). A comparison takes the real part of both outputs (``real_part``)
and holds each part to its tolerance (the comparison engine applies a tolerance per part).
A target that keeps state between calls (``State``) is called in lockstep (``Lockstep``): one
call sequence on both sides, their states brought together where a check must call them
unevenly (the graphed side's copied into the eager side's, in place), compared after each pair
of calls, and judged by episodes where the calls accumulate (``state_model``).
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pytest_cudagraph.conformance.protocol import OWNED, CudaGraphTarget, Inputs, Part, RealIndex
from pytest_cudagraph.engines import rng, trees
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.compare import Mismatch, Tolerance, Tolerances
from pytest_cudagraph.engines.faults import lock_held, release_held
from pytest_cudagraph.engines.parity import compare_outputs
from pytest_cudagraph.engines.state import (
    load_state,
    module_state,
    shared_state,
    state_differences,
    state_view,
    tensor_addresses,
)


def draw(target: CudaGraphTarget, case: int, seed: int) -> Inputs:
    """One call's inputs for case number ``case``, their values drawn from ``seed``."""
    return target.make_inputs(torch.Generator(target.device).manual_seed(seed), case)


def case_in_key(target: CudaGraphTarget, key_index: int, repeat: int) -> int:
    """The ``repeat``-th case landing in key number ``key_index``."""
    return key_index + repeat * target.num_keys


def calls_over_keys(
    target: CudaGraphTarget, keys: int | Sequence[int], rounds: range
) -> Iterator[tuple[int, int]]:
    """``(call, case)`` for each round of ``rounds``, a case of each key in turn
    (``case_in_key``): the first ``keys`` keys, or the keys numbered ``keys``; ``call`` counts
    these calls from 0."""
    pairs = itertools.product(rounds, range(keys) if isinstance(keys, int) else keys)
    for call, (repeat, key_index) in enumerate(pairs):
        yield call, case_in_key(target, key_index, repeat)


def keys_held(target: CudaGraphTarget, most: int, capacity: int | None) -> int:
    """How many keys a check that calls each key again walks: at most ``most``, and no more
    than the cache holds (``capacity``, when the target gives it), so that a later call of a
    key replays its graph rather than capturing an evicted one afresh."""
    return min(most, target.num_keys, capacity or most)


def synchronize(device: torch.device) -> None:
    """Wait for the device's work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stream_kept(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """This thread's current stream on ``device`` as it was, after the block: a capture that
    fails inside ``torch.cuda.graph`` leaves its capture stream current."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.current_stream(device))


def lock_was_held(target: CudaGraphTarget) -> bool:
    """Whether the target's lock is held (probed from another thread); a held lock is then
    released (a re-entrant one level by level), so that one broken check does not hang the
    checks after it."""
    lock = target.cache.lock if target.cache is not None else None
    if lock is None or not lock_held(lock):
        return False
    release_held(lock)
    return True


# Calling each side: one seed for both, every output read while it is valid.


def graphed_path(target: CudaGraphTarget) -> Callable[[Inputs], Any]:
    """The target's graphed path, which only a target away from CUDA may leave out."""
    if target.graphed is None:
        raise ValueError(f"graphed is None on {target.device}; only CUDA needs it")
    return target.graphed


def eager_call(target: CudaGraphTarget, inputs: Inputs, seed: int | None) -> object:
    """The eager side on ``inputs`` with torch's generators seeded with ``seed`` (None: as the
    caller seeded them), copied: an eager output that is a view of state the graphed side
    writes must not change with it."""
    with seeded(target, seed):
        return trees.cloned(target.eager(inputs))


def graphed_call(target: CudaGraphTarget, inputs: Inputs, seed: int | None) -> object:
    """The graphed side on ``inputs`` under ``seed`` (None: as the caller seeded torch), as an
    output the caller may keep: copied right away unless the target's outputs are owned."""
    with seeded(target, seed):
        return kept(target, graphed_path(target)(inputs))


def seeded(target: CudaGraphTarget, seed: int | None) -> contextlib.AbstractContextManager[object]:
    """torch's generators seeded with ``seed`` for the block; None leaves them as they are."""
    return contextlib.nullcontext() if seed is None else rng.seeded(target.device, seed)


def kept(target: CudaGraphTarget, output: object) -> object:
    """``output`` as something to keep past the next call: itself when outputs are owned, else
    a copy taken now, before a later call may overwrite it."""
    return output if target.output_lifetime == OWNED else trees.cloned(output)


def draws_random_numbers(target: CudaGraphTarget, inputs: Inputs) -> bool:
    """Whether the eager answer on ``inputs`` changes with the seed (code that samples):
    then calls can only be compared with eager one at a time, each under its seed."""
    return bool(compare_outputs(eager_call(target, inputs, 0), eager_call(target, inputs, 1)))


def judged(target: CudaGraphTarget, make: Callable[[], Inputs], seed: int) -> list[str]:
    """Eager, then graphed, each on inputs of its own from ``make()`` (fresh, identical), under
    one seed: the differences of their outputs and, where the target gives ``State.sides``,
    of the states they leave."""
    inputs = make()
    expected = eager_call(target, inputs, seed)
    actual = graphed_call(target, make(), seed)
    sides = target.state.sides if target.state is not None else None
    found = differences(target, inputs, expected, actual)
    if sides is not None:
        found += [m.describe() for m in states_apart(target, checked_sides(sides))]
    return found


# Comparing, as the target's contract says.


def parts_of(output: object) -> dict[Part, object] | None:
    """An output's parts (a dict's entries, a tuple's or list's items); None for one tensor."""
    if isinstance(output, Mapping):
        return dict(output)
    if isinstance(output, (list, tuple)):
        return dict(enumerate(output))
    return None


def real(target: CudaGraphTarget, inputs: Inputs, output: object) -> object:
    """The real part of ``output`` (``real_part``): each tensor indexed by its part's index;
    the output itself when the target pads nothing."""
    if target.real_part is None:
        return output
    index = target.real_part(inputs)
    if not isinstance(index, Mapping):
        return _indexed(output, index)
    parts = parts_of(output)
    if parts is None:
        raise TypeError(
            f"real_part gives an index per part ({sorted(map(repr, index))}) but the output is "
            f"a {type(output).__name__}, which has no parts"
        )
    chosen = {
        part: _indexed(value, index[part]) if part in index else value
        for part, value in parts.items()
    }
    return chosen if isinstance(output, Mapping) else _like(output, chosen.values())


def _indexed(value: object, index: RealIndex) -> object:
    if isinstance(value, torch.Tensor):
        return value[index]
    if isinstance(value, Mapping):
        return {key: _indexed(item, index) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return _like(value, (_indexed(item, index) for item in value))
    return value


def _like(sequence: object, items: Iterable[object]) -> tuple[object, ...] | list[object]:
    """``items`` as a tuple where ``sequence`` is one (a named tuple too), else as a list."""
    return tuple(items) if isinstance(sequence, tuple) else list(items)


def differences(
    target: CudaGraphTarget, inputs: Inputs, expected: object, actual: object
) -> list[str]:
    """Each difference between the eager and the graphed output of ``inputs`` beyond the
    target's tolerance (per part where it gives one), over their real part, described."""
    return tolerated(real(target, inputs, expected), real(target, inputs, actual), target.tolerance)


def tolerated(
    expected: object, actual: object, tolerance: Tolerances, path: str = "output"
) -> list[str]:
    """Each difference between two values beyond ``tolerance``, described."""
    return [m.describe() for m in compare_outputs(expected, actual, tolerance=tolerance, path=path)]


def tensors_in(value: object) -> list[torch.Tensor]:
    """The tensors in an output: a tensor, or tuples, lists and dicts of them."""
    return [tensor for _, tensor in trees.tensors(value)]


def input_tensor_names(inputs: Inputs) -> list[str]:
    return [name for name, value in inputs.items() if isinstance(value, torch.Tensor)]


def input_tensor_paths(inputs: Inputs) -> list[str]:
    """The path of every input tensor, those in nested containers too (``extra[0]``)."""
    return [path for path, _ in trees.tensors(inputs)]


# State: what each side carries from one call to the next, kept in step.

# An episode of accumulating state: this many calls on both sides from State.reset.
EPISODE_CALLS = 8

Sides = tuple[object, object]


def checked_sides(sides: Callable[[], object]) -> Sides:
    """``State.sides()``: (eager's, graphed's), two roots of state of their own; AssertionError
    naming what is wrong (not a pair, the two sides holding the same modules or buffers)."""
    pair = sides()
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise AssertionError(
            f"State.sides() must return (eager's state, graphed's state), got {pair!r:.200}"
        )
    shared = shared_state(*pair)
    if shared:
        raise AssertionError(
            "State.sides() gives both sides the same state, so each would be compared with "
            f"itself: {'; '.join(shared[:3])}. Give each side its own (compiled and "
            "graphed_callables do, unless share_state=True)"
        )
    return pair


def state_tolerance(target: CudaGraphTarget) -> Tolerance:
    """How far the two sides' states may be apart: the target's tolerance for its whole
    output, or the loosest of its parts' where it gives one per part."""
    if isinstance(target.tolerance, Tolerance):
        return target.tolerance
    parts = list(target.tolerance.values())
    return Tolerance(max(t.atol for t in parts), max(t.rtol for t in parts))


def states_apart(target: CudaGraphTarget, sides: Sides) -> list[Mismatch]:
    """How the two sides' states differ now, beyond ``state_tolerance``."""
    tolerance = state_tolerance(target)
    eager_side, graphed_side = sides
    return state_differences(
        state_view(eager_side), state_view(graphed_side), atol=tolerance.atol, rtol=tolerance.rtol
    )


def transplant(sides: Sides) -> None:
    """The graphed side's state copied into the eager side's, in place (``copy_``: the tensors
    keep their storage), so that the next calls of both start from one state; AssertionError
    when it cannot be, when a tensor moved, or when the copy did not take (a tensor that is
    made anew each time it is read)."""
    eager_side, graphed_side = sides
    before = tensor_addresses(eager_side)
    try:
        load_state(eager_side, module_state(graphed_side))
    except ValueError as error:
        raise AssertionError(
            f"the graphed side's state cannot be copied into the eager side's: {error}"
        ) from None
    after = tensor_addresses(eager_side)
    moved = sorted(path for path in before.keys() & after.keys() if before[path] != after[path])
    if moved:
        raise AssertionError(f"copying the state in moved {', '.join(moved)} to new storage")
    left = state_differences(state_view(eager_side), state_view(graphed_side))
    if left:
        raise AssertionError(f"the state copied in did not take: {left[0].describe()}")


def in_step(target: CudaGraphTarget) -> None:
    """Both sides' states brought together before a check, where the target says what holds
    them (``State.sides``) and its graphed path runs: the graphed side's copied into eager's."""
    sides = target.state.sides if target.state is not None else None
    if sides is not None and target.graphed is not None:
        transplant(checked_sides(sides))


@dataclass(frozen=True)
class StateModel:
    """How a target's calls write their state, as a probe found it: ``accumulating`` (a
    repeated call changes it: appends, counters, running statistics) or position-addressed or
    pure writes (a repeated call on the same inputs leaves outputs and state as they were), and
    the first change a repeated call made (``evidence``; "" when none)."""

    accumulating: bool
    evidence: str

    def describe(self) -> str:
        if self.accumulating:
            return f"accumulating state (a repeated call changed {self.evidence})"
        return "position-addressed or pure writes (a repeated call changed nothing)"


_models: weakref.WeakKeyDictionary[CudaGraphTarget, StateModel] = weakref.WeakKeyDictionary()


def state_model(target: CudaGraphTarget) -> StateModel:
    """The target's state model, probed once per target (at the first check that asks): both
    sides called on case 0 in lockstep, once to build its graph, then twice more on the same
    inputs; a second call whose output or state (``State.sides``) differs from the first's,
    on either side, means accumulating state. The probe's graphs are dropped after it where
    the target can (``cache.reset``)."""
    found = _models.get(target)
    if found is None:
        found = _models[target] = _probed_model(target)
    return found


def _probed_model(target: CudaGraphTarget) -> StateModel:
    sides_given = target.state.sides if target.state is not None else None
    sides = checked_sides(sides_given) if sides_given is not None else None
    if sides is not None:
        transplant(sides)
    inputs = draw(target, 0, seed=0)
    eager_call(target, inputs, 0)
    graphed_call(target, draw(target, 0, seed=0), 0)  # builds case 0's graph
    calls: list[tuple[object, ...]] = []
    for _ in range(2):
        pieces: tuple[object, ...] = (
            eager_call(target, inputs, 0),
            graphed_call(target, draw(target, 0, seed=0), 0),
        )
        if sides is not None:
            pieces += (module_state(sides[0]), module_state(sides[1]))
        calls.append(pieces)
    if target.cache is not None and target.cache.reset is not None:
        target.cache.reset()  # the check that asked captures its keys itself
    names = ("the eager output", "the graphed output", "the eager side's", "the graphed side's")
    for name, first, second in reversed(list(zip(names, *calls, strict=False))):
        changed = compare_outputs(first, second, path="state" if "side" in name else "output")
        if changed:
            index = changed[0].first_index
            at = f" at index {index}" if index is not None else ""
            return StateModel(True, f"{name} {changed[0].path}{at}")
    return StateModel(False, "")


class Lockstep:
    """A target's two sides called with one call sequence, their states kept in step.

    Made at the start of a check, it brings the states together (``sync``: ``State.reset``
    for accumulating state, which is judged by episodes of ``EPISODE_CALLS`` calls, or else
    the graphed side's state copied into the eager side's, where the target gives it).
    ``eager`` and ``graphed`` call a side; after each graphed call the states are compared
    (``State.sides``): the first call
    after which they parted is kept, with the state's path, the element and whether that call
    captured or was the first replay after a capture (``counter``, where the check counts),
    and the states are brought together again, so that each later call is judged from one
    state. A target without ``State`` is called as it is."""

    def __init__(
        self,
        target: CudaGraphTarget,
        sides: Callable[[], object] | None,
        reset: Callable[[], object] | None,
        counter: CaptureCounter | None = None,
    ) -> None:
        self.target = target
        self.sides = checked_sides(sides) if sides is not None else None
        self.reset = reset
        self.counter = counter
        self.model = state_model(target) if reset is not None else None
        self.calls = 0
        self.partings = 0
        self.first_parting = ""
        self._in_episode = 0
        self._captured: set[Hashable] = set()  # keys whose last graphed call captured
        self.sync()

    @property
    def stateful(self) -> bool:
        return self.sides is not None or self.reset is not None

    @property
    def episodic(self) -> bool:
        return self.model is not None and self.model.accumulating

    def sync(self) -> None:
        """Both sides' states brought together: reset where the state accumulates (an episode
        begins), else the graphed side's copied into eager's (where ``State.sides`` says what
        holds it; a reset is not asked of state written by position: it may rebuild buffers)."""
        if self.reset is not None and self.episodic:
            self.reset()
            self._in_episode = 0
        elif self.sides is not None:
            transplant(self.sides)

    def eager(self, inputs: Inputs, seed: int | None) -> object:
        """The eager side's call under ``seed`` (None: as the caller seeded torch), copied (a
        new episode first, where one is due)."""
        if self.episodic and self._in_episode >= EPISODE_CALLS:
            self.sync()
        return eager_call(self.target, inputs, seed)

    def graphed(self, inputs: Inputs, seed: int | None, where: str, *, raw: bool = False) -> object:
        """The graphed side's call under ``seed`` (its output as it is with ``raw``, else as
        ``graphed_call`` keeps it), then the states compared."""
        captures = len(self.counter.captures) if self.counter is not None else 0
        with seeded(self.target, seed):
            output = graphed_path(self.target)(inputs)
        output = output if raw else kept(self.target, output)
        captured = self.counter is not None and len(self.counter.captures) > captures
        self.compare_state(f"after call {self.calls} ({where}{self._how(inputs, captured)})")
        self.calls += 1
        self._in_episode += 1
        return output

    def judge(self, make: Callable[[], Inputs], seed: int, where: str) -> list[str]:
        """Eager, then graphed, on inputs of their own from ``make()``: the differences of
        their outputs, each prefixed with ``where``."""
        inputs = make()
        expected = self.eager(inputs, seed)
        actual = self.graphed(make(), seed, where)
        return [f"{where}: {d}" for d in differences(self.target, inputs, expected, actual)]

    def compare_state(self, when: str) -> None:
        """The states compared now (``when``: "after call 3 (...)"); the first parting kept,
        and the states brought together again."""
        if self.sides is None:
            return
        found = states_apart(self.target, self.sides)
        if not found:
            return
        self.partings += 1
        if not self.first_parting:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            self.first_parting = f"{when}: {found[0].describe()}{more}"
        self.sync()

    def problems(self) -> list[str]:
        """The state's verdict: where the two sides' states first parted, and how often."""
        if not self.partings:
            return []
        again = (
            f"; they parted {self.partings} times in all (brought together again each time)"
            if self.partings > 1
            else ""
        )
        return [f"the two sides' states parted {self.first_parting}{again}"]

    def diagnose(self, make: Callable[[], Inputs], seed: int) -> str:
        """What a differing call of a stateful target says once both sides start from one
        state (the graphed side's, copied in): that call again on ``make()``'s inputs."""
        if self.sides is None:
            return ""
        transplant(self.sides)
        inputs = make()
        expected = eager_call(self.target, inputs, seed)
        again = differences(self.target, inputs, expected, graphed_call(self.target, make(), seed))
        transplant(self.sides)
        if again:
            return f"from one state the two still differ: {again[0]}"
        return (
            "from one state (the graphed side's, copied into the eager side's) the two agree: "
            "their states had parted through the calls before it, not by a fault of the graph"
        )

    def describe(self) -> str:
        """What the check did with the state, for its figure ("" for a target without)."""
        if not self.stateful:
            return ""
        how = "state compared after each call" if self.sides is not None else "state kept"
        if self.model is not None:
            how += f"; {self.model.describe()}"
        if self.episodic:
            how += f", judged by episodes of {EPISODE_CALLS} calls from state.reset"
        return how

    def _how(self, inputs: Inputs, captured: bool) -> str:
        """What the graphed call was: it captured, or the first replay after its capture."""
        if self.counter is None:
            return ""
        key = self.target.key_of(inputs)
        if captured:
            self._captured.add(key)
            return "; it captured its graph (warm-ups, capture, first replay)"
        if key in self._captured:
            self._captured.discard(key)
            return "; the first replay after its capture"
        return "; a replay"
