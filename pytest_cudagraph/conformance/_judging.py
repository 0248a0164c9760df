"""The one home for calling a target's two sides and comparing them as its contract says.

Each call draws its own inputs (``draw``: a case under a seed), runs with torch's generators and
the target's own (``generators``) seeded alike, and keeps what it returned as long as the
target's ``output_lifetime`` lets it. A comparison takes the real part of both outputs
(``real_part``; one that selects nothing compares nothing, a problem) and holds each part to its
tolerance. A target that keeps state (``State``) is called in lockstep (``Lockstep``): one call
sequence on both sides from one state, compared after each pair of calls, and judged in whole
episodes where the calls accumulate. The eager side is the reference and is never written from
the graphed side: the sides are brought together by copying what a step writes from eager into
graphed, in place, after checking that what no step writes (parameters, modes, flags, the
other buffers) is already equal.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from pytest_cudagraph.conformance._loading import UserCodeError, user_call
from pytest_cudagraph.conformance._protocol import (
    EXACT,
    OWNED,
    Case,
    CudaGraphTarget,
    Inputs,
    Part,
    RealIndex,
)
from pytest_cudagraph.engines import rng, state, trees
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.compare import Mismatch, Tolerance, Tolerances, compare_outputs
from pytest_cudagraph.engines.faults import lock_held, release_held

# Cases and calls


def case_of(target: CudaGraphTarget, key: Hashable, repeat: int = 0) -> Case:
    """The ``repeat``-th case of ``key`` (its number: the key's index, plus ``repeat`` times
    the number of keys)."""
    keys = list(target.keys)
    return Case(keys.index(key) + repeat * len(keys), key, repeat)


def numbered(target: CudaGraphTarget, number: int) -> Case:
    """Case ``number``: key ``keys[number % len(keys)]``, its ``number // len(keys)``-th draw."""
    repeat, index = divmod(number, len(target.keys))
    return Case(number, target.keys[index], repeat)


def draw(target: CudaGraphTarget, case: Case, seed: int) -> Inputs:
    """One call's inputs for ``case``, their values drawn from ``seed``."""
    return target.draw(torch.Generator(target.device).manual_seed(seed), case)


def first_keys(target: CudaGraphTarget, most: int, capacity: int | None = None) -> list[Hashable]:
    """The first keys a check that calls each key again walks: at most ``most``, and no more
    than the cache holds (``capacity``, when the target gives it), so that a later call of a
    key replays its graph rather than capturing an evicted one afresh."""
    return list(target.keys[: min(most, len(target.keys), capacity or most)])


def calls_over_keys(
    target: CudaGraphTarget, keys: Sequence[Hashable], rounds: range
) -> Iterator[tuple[int, Case]]:
    """``(call, case)`` for each round of ``rounds``, a case of each key in turn (the round is
    the case's repeat); ``call`` counts these calls from 0."""
    for call, (repeat, key) in enumerate(itertools.product(rounds, keys)):
        yield call, case_of(target, key, repeat)


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


def called(field: str, function: Callable[..., Any], *args: object) -> Any:
    """``function(*args)``, a callable the target gives in ``field`` (``Cache.reset``, say): an
    error it raises is a ``UserCodeError`` naming the field."""
    with user_call(f"{field}()"):
        return function(*args)


# Calling each side: one seed for both, every output read while it is valid.


def graphed_path(target: CudaGraphTarget) -> Callable[[Inputs], Any]:
    """The target's graphed path, which only a target away from CUDA may leave out."""
    if target.graphed is None:
        raise ValueError(f"graphed is None on {target.device}; only CUDA needs it")
    return target.graphed


def eager_call(target: CudaGraphTarget, inputs: Inputs, seed: int | None) -> object:
    """The eager side on ``inputs`` with the generators seeded with ``seed`` (None: as the
    caller seeded them), copied: an eager output that is a view of state the graphed side
    writes must not change with it."""
    with seeded(target, seed):
        return trees.cloned(target.eager(inputs))


def graphed_call(target: CudaGraphTarget, inputs: Inputs, seed: int | None) -> object:
    """The graphed side on ``inputs`` under ``seed`` (None: as the caller seeded them), as an
    output the caller may keep: copied right away unless the target's outputs are owned."""
    with seeded(target, seed):
        return kept(target, graphed_path(target)(inputs))


@contextlib.contextmanager
def seeded(target: CudaGraphTarget, seed: int | None) -> Iterator[None]:
    """torch's generators and the target's own (``generators``) seeded with ``seed`` for the
    block (torch's put back afterwards); None leaves them as they are."""
    if seed is None:
        yield
        return
    with rng.seeded(target.device, seed):
        for generator in target_generators(target):
            generator.manual_seed(seed)
        yield


def seeded_as_torch(target: CudaGraphTarget) -> None:
    """The target's own generators (``generators``) seeded with the seed torch's default
    generator was last seeded with: for a caller that seeds torch itself (the parity engine)."""
    seed = torch.initial_seed()
    for generator in target_generators(target):
        generator.manual_seed(seed)


def target_generators(target: CudaGraphTarget) -> list[torch.Generator]:
    """The generators the target gives (``generators``), none where it gives none; what is not
    a list of torch.Generator is a ``UserCodeError`` naming the field."""
    if target.generators is None:
        return []
    found = called("CudaGraphTarget.generators", target.generators)
    listed = list(found) if isinstance(found, (list, tuple)) else None
    if listed is None or not all(isinstance(g, torch.Generator) for g in listed):
        raise UserCodeError(
            "CudaGraphTarget.generators()",
            TypeError(
                f"returned {found!r:.80}; it must return a list of the torch.Generator objects "
                "either side draws from"
            ),
        )
    return listed


def kept(target: CudaGraphTarget, output: object) -> object:
    """``output`` as something to keep past the next call: itself when outputs are owned, else
    a copy taken now, before a later call may overwrite it."""
    return output if target.output_lifetime == OWNED else trees.cloned(output)


def draws_random_numbers(target: CudaGraphTarget, inputs: Inputs) -> bool:
    """Whether the eager answer on ``inputs`` changes with the seed (code that samples):
    then calls can only be compared with eager one at a time, each under its seed. Each call
    gets a copy of ``inputs`` (a step may write them) and, where the target keeps state, starts
    from the state the first started from (the eager side's own copy put back, or a reset where
    the target gives only that), so that only the seed differs."""
    sides = sides_of(target)
    saved = state.module_state(sides.eager) if sides is not None else None
    reset = target.state.reset if target.state is not None and sides is None else None
    answers = []
    for seed in (0, 1):
        if reset is not None:
            called("State.reset", reset)
        answers.append(eager_call(target, trees.cloned(inputs), seed))
        if sides is not None and saved is not None:
            state.load_state(sides.eager, saved)
    return bool(compare_outputs(*answers))


def judged(target: CudaGraphTarget, make: Callable[[], Inputs], seed: int) -> list[str]:
    """Eager, then graphed, each on inputs of its own from ``make()`` (fresh, identical), under
    one seed: the differences of their outputs and, where the target gives ``State.sides``,
    of the states they leave."""
    inputs = make()
    expected = eager_call(target, inputs, seed)
    actual = graphed_call(target, make(), seed)
    found = differences(target, inputs, expected, actual)
    sides = sides_of(target)
    if sides is not None:
        found += [m.describe() for m in states_apart(target, sides)]
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
    index = called("real_part", target.real_part, inputs)
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
    target's tolerance (per part where it gives one), over their real part, described; a real
    part holding nothing to compare is a difference too (a pass on nothing is no pass)."""
    expected, actual = real(target, inputs, expected), real(target, inputs, actual)
    if not trees.compared_elements(expected) and not trees.compared_elements(actual):
        chosen = "the real part real_part selects" if target.real_part else "the output"
        return [f"{chosen} holds no element to compare: nothing was judged"]
    return tolerated(expected, actual, target.tolerance)


def tolerated(
    expected: object, actual: object, tolerance: Tolerances, path: str = "output"
) -> list[str]:
    """Each difference between two values beyond ``tolerance``, described."""
    return [m.describe() for m in compare_outputs(expected, actual, tolerance=tolerance, path=path)]


def describe_tolerance(target: CudaGraphTarget) -> str:
    if isinstance(target.tolerance, Tolerance):
        return target.tolerance.describe()
    named = [f"{part!r} {tolerance.describe()}" for part, tolerance in target.tolerance.items()]
    return "; ".join([*named, f"other parts {EXACT.describe()}"])


def loosest_tolerance(target: CudaGraphTarget) -> Tolerance:
    """What a whole state, or a module's output, is held to: the target's tolerance for its
    whole output, or the loosest of its parts' where it gives one per part."""
    if isinstance(target.tolerance, Tolerance):
        return target.tolerance
    parts = list(target.tolerance.values()) or [EXACT]
    return Tolerance(max(t.atol for t in parts), max(t.rtol for t in parts))


def tensors_in(value: object) -> list[torch.Tensor]:
    """The tensors in an output: a tensor, or tuples, lists and dicts of them."""
    return [tensor for _, tensor in trees.tensors(value)]


def input_tensor_paths(inputs: Inputs) -> list[str]:
    """The path of every input tensor, those in nested containers too (``extra[0]``)."""
    return [path for path, _ in trees.tensors(inputs)]


# State: what each side carries from one call to the next, kept in step from the eager side.

# Kinds of state the suite never copies from one side to the other: it compares them first.
NEVER_COPIED = frozenset({"parameter", "mode", "flag"})
# The longest episode found by calling the eager side until a call raises, where the target
# declares no length (``State.episode_calls``).
MOST_FOUND_EPISODE_CALLS = 64
# The episode on a CUDA device where the target declares none: there a call past the state's
# end (an index out of range) is a device-side assert, which fails every later CUDA call of
# the process, so the suite never calls until one raises. 0.4.0's episodes were as long.
UNDECLARED_CUDA_EPISODE_CALLS = 8


@dataclass(frozen=True)
class Sides:
    """What holds each side's state (``State.sides()``): eager's, the reference, and graphed's."""

    eager: object
    graphed: object


def sides_of(target: CudaGraphTarget) -> Sides | None:
    """The two sides' state, where the target gives ``State.sides``, checked: a pair of roots
    of state of their own (no module, storage or memory in common: a list, dict or namespace in
    common is refused by the probe where a call writes it, a read-only configuration is not),
    holding some state (AssertionError naming what is wrong)."""
    given = target.state.sides if target.state is not None else None
    if given is None:
        return None
    pair = called("State.sides", given)
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise AssertionError(
            f"State.sides() must return (eager's state, graphed's state), got {pair!r:.200}"
        )
    try:
        shared = state.shared_state(*pair, objects=False)
    except (TypeError, ValueError) as error:  # a loop, a walk too deep, a value not state
        raise AssertionError(f"State.sides() gives state the suite cannot walk: {error}") from error
    if shared:
        raise AssertionError(
            "State.sides() gives both sides the same state, so each would be compared with "
            f"itself: {'; '.join(shared[:3])}. Give each side its own (compiled and "
            "graphed_callables do, unless share_state=True)"
        )
    for side, root in zip(("eager", "graphed"), pair, strict=True):
        if not state.state_kinds(root):
            raise AssertionError(
                f"State.sides() gives the {side} side no state (nothing a step could write): "
                "give the modules, runners or tensors the step writes"
            )
    return Sides(*pair)


def states_apart(target: CudaGraphTarget, sides: Sides) -> list[Mismatch]:
    """How the two sides' states differ now, beyond ``loosest_tolerance``."""
    tolerance = loosest_tolerance(target)
    return state.state_differences(
        state.state_view(sides.eager),
        state.state_view(sides.graphed),
        atol=tolerance.atol,
        rtol=tolerance.rtol,
    )


def bring_together(target: CudaGraphTarget, sides: Sides) -> None:
    """The graphed side given the eager side's state, where a step writes it: what no step
    writes (parameters, modes and flags always; any other piece neither side has changed since
    the target was first probed) must already be equal, else AssertionError naming it (a
    graphed side with other weights or in training mode is wrong, not behind); then what a step
    writes is copied from eager into graphed, in place, and must take."""
    found = probe(target)
    kinds = state.state_kinds(sides.graphed)
    every = {**state.state_kinds(sides.eager), **kinds}  # a piece one side lacks is named too
    views = state.state_view(sides.eager), state.state_view(sides.graphed)
    written = set(found.written)
    for view, start in zip(views, found.start, strict=True):
        written |= state.written_paths(start, view)
    fixed = {path for path, kind in every.items() if kind in NEVER_COPIED or path not in written}
    apart = state.state_differences(
        {path: value for path, value in views[0].items() if path in fixed},
        {path: value for path, value in views[1].items() if path in fixed},
    )
    if apart:
        path = piece_of(apart[0], fixed)
        kind = every.get(path, "piece of state") if path is not None else "piece of state"
        more = f" (and {len(apart) - 1} more)" if len(apart) > 1 else ""
        raise AssertionError(
            f"the two sides differ in what no call writes, {'an' if kind[0] in 'aeiou' else 'a'} "
            f"{kind}: "
            f"{apart[0].describe()}{more}. The eager side is the reference, and the suite never "
            "copies parameters, modes, flags or state no call writes into the graphed side: "
            "build it from the same weights, in the same mode"
        )
    copied = sorted(set(kinds) - fixed)
    if not copied:
        return
    before = state.tensor_addresses(sides.graphed)
    try:
        state.load_state(sides.graphed, state.module_state(sides.eager), paths=copied)
    except ValueError as error:
        raise AssertionError(
            f"the eager side's state cannot be copied into the graphed side's: {error}"
        ) from None
    after = state.tensor_addresses(sides.graphed)
    moved = sorted(path for path in before.keys() & after.keys() if before[path] != after[path])
    if moved:
        raise AssertionError(f"copying the state in moved {', '.join(moved)} to new storage")
    left = [m for m in states_apart(target, sides) if piece_of(m, copied) is not None]
    if left:
        raise AssertionError(f"the state copied in did not take: {left[0].describe()}")


def piece_of(mismatch: Mismatch, paths: Iterable[str]) -> str | None:
    """Which of ``paths`` (state paths) a difference of ``state_differences`` lies in: its path
    is ``state['<path>']``, then the index or attribute inside that piece, if any."""
    for path in paths:
        head = f"state[{path!r}]"
        if mismatch.path == head or mismatch.path.startswith((f"{head}[", f"{head}.")):
            return path
    return None


def in_step(target: CudaGraphTarget) -> None:
    """Both sides' states brought together before a check, where the target says what holds
    them (``State.sides``) and its graphed path runs."""
    sides = sides_of(target) if target.graphed is not None else None
    if sides is not None:
        bring_together(target, sides)


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


@dataclass(frozen=True)
class Probe:
    """What the suite learned once of a target's state: the paths a call writes on either side
    (``written``: state copied from eager into graphed), its state model, each side's state
    before any call but its parameters (``start``: a piece that changed since was written by
    some call), and for accumulating state judged in episodes, how many calls an episode takes
    (and how that was learned)."""

    written: frozenset[str]
    model: StateModel
    start: tuple[dict[str, object], ...] = ()
    episode_calls: int | None = None
    episode_from: str = ""


_probes: weakref.WeakKeyDictionary[CudaGraphTarget, Probe] = weakref.WeakKeyDictionary()


def probe(target: CudaGraphTarget) -> Probe:
    """The target's ``Probe``, made once per target (at the first check that asks): both sides
    called on case 0, once to build its graph, then twice more on the same inputs; what changed
    under ``State.sides`` on either side is what a call writes, and a second call whose output
    or state differs from the first's means accumulating state. Each side is then put back as
    it was (from its own copy), and the probe's graphs dropped where the target can."""
    found = _probes.get(target)
    if found is None:
        found = _probes[target] = _probed(target)
    return found


def probed_like(made: CudaGraphTarget, like: CudaGraphTarget) -> None:
    """``made``, a fresh target of ``like``'s factory, takes ``like``'s probe (its code's: what
    a call writes, its state model, its episodes) with its own start, so that no probe call
    on it captures a graph before the check that built it can count the capture."""
    learned = probe(like)
    roots = _roots(made)
    start = tuple(
        {path: value for path, value in state.module_state(root).items() if path in saved}
        for root, saved in zip(roots, learned.start, strict=True)
    )
    _probes[made] = replace(learned, start=start)


def state_model(target: CudaGraphTarget) -> StateModel:
    return probe(target).model


def _probed(target: CudaGraphTarget) -> Probe:
    sides = sides_of(target)
    if sides is not None:
        _require_the_same_objects(target, sides)
    roots = _roots(target)
    start = [state.module_state(root) for root in roots]
    unfixed = [
        {path: value for path, value in saved.items() if kinds.get(path) != "parameter"}
        for saved, kinds in zip(start, map(state.state_kinds, roots), strict=True)
    ]
    inputs = draw(target, numbered(target, 0), seed=0)
    graphed_runs = target.graphed is not None
    calls: list[tuple[object, ...]] = []
    snapshots: list[list[dict[str, object]]] = [start]
    for _ in range(3):  # the first builds case 0's graph
        pieces: tuple[object, ...] = (eager_call(target, inputs, 0),)
        if graphed_runs:
            pieces += (graphed_call(target, draw(target, numbered(target, 0), 0), 0),)
        snapshots.append([state.module_state(root) for root in roots])
        calls.append(pieces + tuple(snapshots[-1]))
    written: set[str] = set()
    for before, after in itertools.pairwise(snapshots):
        for first, second in zip(before, after, strict=True):
            written |= state.written_paths(first, second)
    for root, saved in zip(roots, start, strict=True):  # each side from its own copy
        # What the calls wrote, where the root still holds it: a cache's empty dict of graphs,
        # once it holds graphs, is no state any more.
        paths = written & saved.keys() & state.state_kinds(root).keys()
        state.load_state(root, saved, paths=sorted(paths))
    if target.cache is not None and target.cache.reset is not None:
        called("Cache.reset", target.cache.reset)  # the check that asked captures its keys
    if sides is not None:
        _refuse_shared_written(sides, written)
    model = _model(calls[1], calls[2], graphed_runs)
    if sides is not None and model.accumulating and not written:
        raise AssertionError(
            "State.sides() holds none of what a call writes: a repeated call changed "
            f"{model.evidence}, and nothing under State.sides() changed. Give the objects the "
            "step writes (its modules, runner or tensors), not copies"
        )
    _require_a_reset_that_ends_state(target, model)
    episode_calls, episode_from = episode_length(target, model)
    return Probe(frozenset(written), model, tuple(unfixed), episode_calls, episode_from)


def _roots(target: CudaGraphTarget) -> tuple[object, ...]:
    """The sides' state roots, eager's first; none without ``State.sides``."""
    sides = sides_of(target)
    return (sides.eager, sides.graphed) if sides is not None else ()


def _refuse_shared_written(sides: Sides, written: set[str]) -> None:
    """A list, dict or namespace both sides hold that a call writes is state they share, which
    each would be compared with (AssertionError naming it); one no call writes is configuration
    both may read."""
    for eager_path, graphed_path in state.shared_objects(sides.eager, sides.graphed):
        slot = eager_path.removeprefix("state[").partition("]")[0].strip("'\"")
        if slot in written:
            raise AssertionError(
                f"State.sides() gives both sides the same object, which a call writes: "
                f"{eager_path} is {graphed_path}, so each side would be compared with itself. "
                "Give each side its own (compiled and graphed_callables do, unless "
                "share_state=True)"
            )


def _require_the_same_objects(target: CudaGraphTarget, sides: Sides) -> None:
    """``State.sides()`` must give the objects that hold the state, not copies made anew on
    each call (``clone()``, a deep-copied ``state_dict()``): a copy takes no write."""
    again = sides_of(target)
    assert again is not None
    for side in ("eager", "graphed"):
        first = state.state_identity(getattr(sides, side))
        second = state.state_identity(getattr(again, side))
        anew = sorted(path for path in first.keys() & second.keys() if first[path] != second[path])
        if anew:
            raise AssertionError(
                f"State.sides() gives the {side} side's state anew on each call ({anew[0]} is "
                "another object each time): it returns copies, which no call writes. Give the "
                "objects themselves (the modules, runner or tensors the step writes)"
            )


def _model(first: tuple[object, ...], second: tuple[object, ...], graphed: bool) -> StateModel:
    """The state model from two repeated calls' outputs and states (eager's output, graphed's
    output where it runs, then each side's state)."""
    outputs = ["the eager", *(["the graphed"] if graphed else [])]
    names = [*outputs, "the eager side's", "the graphed side's"]
    pieces = list(zip(names, first, second, strict=False))
    for index, (name, before, after) in reversed(list(enumerate(pieces))):
        if index >= len(outputs):  # numbers, arrays and containers of them, compared as state
            changed = state.state_differences(before, after)  # type: ignore[arg-type]
        else:
            changed = compare_outputs(before, after, path="output")
        if changed:
            where = changed[0].first_index
            at = f" at index {where}" if where is not None else ""
            return StateModel(True, f"{name} {changed[0].path}{at}")
    return StateModel(False, "")


def _require_a_reset_that_ends_state(target: CudaGraphTarget, model: StateModel) -> None:
    """For accumulating state with ``State.reset``: eager's first call of case 0 after a reset
    answers the same after more calls and another reset, else AssertionError (a reset that
    ends nothing makes every episode start where the last ended, on both sides alike, which
    no comparison of the two sides can see). The state is left reset."""
    given = target.state
    if given is None or given.reset is None or not model.accumulating:
        return
    answers = []
    for _ in range(2):
        called("State.reset", given.reset)
        answers.append(eager_call(target, draw(target, numbered(target, 0), seed=0), 0))
        eager_call(target, draw(target, numbered(target, 0), seed=0), 0)  # the state moves on
    called("State.reset", given.reset)
    found = compare_outputs(*answers, sides=("after a reset", "after more calls and a reset"))
    if found:
        raise AssertionError(
            "State.reset() does not end the state: eager's first call of case 0 after a reset "
            f"answers otherwise once more calls and another reset came before it: "
            f"{found[0].describe()}. Give a reset that puts both sides' state back in place, "
            "as between two requests (the state accumulates: a repeated call changed "
            f"{model.evidence})"
        )


def episode_length(target: CudaGraphTarget, model: StateModel) -> tuple[int | None, str]:
    """How many calls an episode of accumulating state takes: the declared
    ``State.episode_calls``, or the calls of case 0 the eager side makes from a reset before
    one raises (at most ``MOST_FOUND_EPISODE_CALLS``), the state reset again after; on a CUDA
    device, undeclared, ``UNDECLARED_CUDA_EPISODE_CALLS``."""
    given = target.state
    if given is None or given.reset is None or not model.accumulating:
        return None, ""
    if given.episode_calls is not None:
        return given.episode_calls, "declared by State.episode_calls"
    if target.device.type == "cuda":
        return UNDECLARED_CUDA_EPISODE_CALLS, (
            "not found on CUDA, where a call past the state's end is a device-side assert "
            "that fails every later CUDA call; give State(episode_calls=...) to judge whole "
            "episodes"
        )
    inputs = draw(target, numbered(target, 0), seed=0)
    called("State.reset", given.reset)
    calls = 0
    try:
        while calls < MOST_FOUND_EPISODE_CALLS:
            target.eager(inputs)
            calls += 1
    except Exception as error:
        if not calls:
            raise AssertionError(
                f"eager's first call of case 0 after State.reset() raised {type(error).__name__}: "
                f"{error}"
            ) from error
        how = f"found: call {calls + 1} of case 0 after State.reset() raised"
    else:
        how = (
            f"no call of {MOST_FOUND_EPISODE_CALLS} after State.reset() raised; give "
            "State(episode_calls=...) for longer episodes"
        )
    called("State.reset", given.reset)
    return calls, how


class Episodes:
    """The calls of a check that makes no lockstep (graphed calls alone, or pairs of calls, one
    per side) kept inside whole episodes, where the state accumulates and ``State.reset`` is
    given: ``begin()`` before each call, or pair of calls, resets the state at the first and
    whenever the episode in hand cannot take ``calls`` more (a KV cache of N positions takes N
    calls, the next one raises); it says whether it reset. Any other target: nothing."""

    def __init__(self, target: CudaGraphTarget) -> None:
        given = target.state.reset if target.state is not None else None
        found = probe(target) if given is not None else None
        accumulating = found is not None and found.model.accumulating
        self.reset = given if accumulating else None
        self.length = (found.episode_calls if found is not None else None) or 1
        self.made: int | None = None  # calls since the last reset; None: none yet

    def begin(self, calls: int = 1) -> bool:
        if self.reset is None:
            return False
        if self.made is not None and self.made + calls <= self.length:
            self.made += calls
            return False
        called("State.reset", self.reset)
        self.made = calls
        return True


class Lockstep:
    """A target's two sides called with one call sequence, their states kept in step.

    Made at the start of a check, it brings the states together (``sync``: ``State.reset``
    where the state accumulates, judged in episodes of the probe's length, else the eager side's
    written state copied into the graphed side, where the target gives ``State.sides``; with
    ``episodes=False`` never a reset: one trajectory is one episode). ``eager`` and ``graphed``
    call a side; after each graphed call the states are compared: the first call after which
    they parted is kept, with the state's path, the element and whether that call captured or
    was the first replay after a capture (``counter``, where the check counts), and the states
    are brought together again, so that each later call is judged from one state. A target
    without ``State`` is called as it is."""

    def __init__(
        self,
        target: CudaGraphTarget,
        counter: CaptureCounter | None = None,
        *,
        episodes: bool = True,
    ) -> None:
        self.target = target
        self.sides = sides_of(target)
        given = target.state
        self.reset = given.reset if given is not None and episodes else None
        self.counter = counter
        self.probe = probe(target) if given is not None else None
        self.calls = 0
        self.partings = 0
        self.first_parting = ""
        self._in_episode = 0
        self._captured: set[Hashable] = set()  # keys whose last graphed call captured
        self.sync()

    @property
    def stateful(self) -> bool:
        return self.target.state is not None

    @property
    def episodic(self) -> bool:
        return self.reset is not None and self.probe is not None and self.probe.model.accumulating

    def sync(self) -> None:
        """Both sides' states brought together: reset where the state accumulates (an episode
        begins), else the eager side's written state copied into the graphed side (a reset is
        not asked of state written by position: it may rebuild buffers)."""
        if self.episodic and self.reset is not None:
            called("State.reset", self.reset)
            self._in_episode = 0
        elif self.sides is not None and self.target.graphed is not None:
            bring_together(self.target, self.sides)

    def eager(self, inputs: Inputs, seed: int | None) -> object:
        """The eager side's call under ``seed`` (None: as the caller seeded torch), copied (a
        new episode first, where one is due)."""
        if self.episodic and self.probe is not None:
            if self._in_episode >= (self.probe.episode_calls or MOST_FOUND_EPISODE_CALLS):
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
        state (the eager side's, copied into the graphed side): that call again on
        ``make()``'s inputs."""
        if self.sides is None:
            return ""
        bring_together(self.target, self.sides)
        inputs = make()
        expected = eager_call(self.target, inputs, seed)
        again = differences(self.target, inputs, expected, graphed_call(self.target, make(), seed))
        bring_together(self.target, self.sides)
        if again:
            return f"from one state the two still differ: {again[0]}"
        return (
            "from one state (the eager side's, copied into the graphed side) the two agree: "
            "their states had parted through the calls before it, not by a fault of the graph"
        )

    def describe(self) -> str:
        """What the check did with the state, for its figure ("" for a target without)."""
        if not self.stateful or self.probe is None:
            return ""
        how = "state compared after each call" if self.sides is not None else "state kept"
        how += f"; {self.probe.model.describe()}"
        if self.episodic:
            how += (
                f", judged in episodes of {self.probe.episode_calls} calls from State.reset "
                f"({self.probe.episode_from})"
            )
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
