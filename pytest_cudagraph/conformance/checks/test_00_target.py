"""The target keeps its side of the protocol, and its code runs: both checks run on the CPU too.

- target contract: ``key_of`` gives each case's key, and so tells the ``keys`` apart; ``draw``
  draws from its generator (one seed, one draw; another seed, other values of every input
  tensor, those nested in containers too, NaN counted equal to NaN) and two draws of one case
  are interchangeable input by input.
- dry run: each key's eager side (and the graphed side where it runs without CUDA), so that a
  plumbing error (a KeyError, a wrong shape, a forgotten return, an output the declared contract
  does not fit) fails on a laptop; eager on case 0 again under its seed, at once (a differing
  answer is told apart: a generator of the code's own, state carried between calls, or other
  randomness) and after every other key; then every callable the target's capabilities give,
  once, where it needs no CUDA. An error in the user's code is named as the user wrote it
  (``draw``, ``eager``, ``State.reset``), with the case, the key and the user's own frames.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from pytest_cudagraph.conformance import _loading
from pytest_cudagraph.conformance._catalog import check, declared_checks
from pytest_cudagraph.conformance._judging import (
    called,
    differences,
    draw,
    eager_call,
    graphed_call,
    input_tensor_paths,
    numbered,
    parts_of,
    real,
    sides_of,
    synchronize,
    target_generators,
    tensors_in,
)
from pytest_cudagraph.conformance._loading import case_words, inputs_words, user_call
from pytest_cudagraph.conformance._progress import CheckProgress
from pytest_cudagraph.conformance._protocol import Case, CudaGraphTarget, Inputs
from pytest_cudagraph.conformance._suite import AccountRecorder, Conclude, ErrorExplainer
from pytest_cudagraph.conformance._validation import key_problem
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.conformance._witness import Factory
from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.compare import compare_outputs
from pytest_cudagraph.engines.reach import reachable_generators
from pytest_cudagraph.engines.state import load_state, module_state

DRAWS = 4  # draws of one case; each input tensor must take at least two values among them
VARIED_CASES = 4
MAX_KEYS = 64  # keys whose cases are checked (or called, in the dry run)
REPEATED = ("first eager call", "eager call again")
FRESH = ("the session target's first call", "a fresh target's first call")


class ReturnedWrong(Exception):
    """A field of the user's returned what the protocol does not take (the message says what
    and where: no frame of the user's raised it)."""


@check("target contract", runs_on="cpu")
def test_target_contract(
    target: CudaGraphTarget, conclude: Conclude, progress: CheckProgress, explain: ErrorExplainer
) -> None:
    cases = [numbered(target, number) for number in range(min(len(target.keys), MAX_KEYS))]
    names: list[str] = []
    varying = 0
    try:
        problems = [p for case in cases for p in key_problems(target, case, progress)]
        varied = cases[:VARIED_CASES]
        for case in varied:
            progress(f"draws of {case_words(case)}")
            found, names, shapes_vary = draw_problems(target, case)
            problems += found
            varying += shapes_vary
    except _loading.UserCodeError as error:
        problems = [explain(error)]
    except ReturnedWrong as error:
        problems = [str(error)]
    of_keys = f"{len(cases)} of {len(target.keys)}" if len(cases) < len(target.keys) else ""
    figure = (
        f"{of_keys or len(cases)} key{'s' if len(target.keys) > 1 else ''}, each its draws' "
        f"key; inputs {', '.join(names)} vary over {DRAWS} draws of {len(cases[:VARIED_CASES])} "
        f"cases; shapes vary inside {varying} of them"
    )
    conclude(Judgement(problems, figure, len(cases), "keys"), "the target breaks the protocol:")


def drawn(target: CudaGraphTarget, case: Case, seed: int) -> Inputs:
    """``case``'s inputs under ``seed``; an error in ``draw``, or a draw that returns something
    else than inputs, is named with the case."""
    call = f"draw(generator, {case_words(case)})"
    with user_call(call):
        inputs = draw(target, case, seed)
    if not isinstance(inputs, dict) or not all(isinstance(name, str) for name in inputs):
        forgot = " (a forgotten return?)" if inputs is None else ""
        raise ReturnedWrong(
            f"{call} returned {type(inputs).__name__}{forgot}; it must return a dict of input "
            "name -> value"
        )
    return inputs


def key_problems(target: CudaGraphTarget, case: Case, progress: CheckProgress) -> list[str]:
    """What is wrong with the key ``key_of`` gives ``case``'s draws: a plain value, the same
    for a second draw, and the key the case was drawn for (``case.key``)."""
    progress(f"key_of of {case_words(case)}")
    first, second = (drawn(target, case, seed) for seed in (case.number, case.number + 1))
    key, again = (_loading.key_of(target, inputs, case) for inputs in (first, second))
    problem = key_problem(key, lambda: again, "for two draws of one case")
    if problem:
        raise ReturnedWrong(f"key_of(inputs of {case_words(case)}) {problem}")
    if key != case.key:
        return [
            f"key_of gives {key!r} for a draw of the key {case.key!r} ({case_words(case)}): "
            "key_of must give each draw the key it was drawn for (the checks label every call "
            "with key_of and judge it against the target's keys)"
        ]
    return []


def draw_problems(target: CudaGraphTarget, case: Case) -> tuple[list[str], list[str], bool]:
    """What is wrong with ``draw`` on ``case``; the input tensors' paths; whether the case's
    shapes differ from those of the next draw of its key (a real batch in a bucket)."""
    where = case_words(case)
    draws = [drawn(target, case, seed) for seed in range(DRAWS)]
    repeat = drawn(target, Case(case.number + len(target.keys), case.key, case.repeat + 1), 0)
    paths = input_tensor_paths(draws[0])
    if not paths:
        return [f"draw(generator, {where}) returned no tensors"], paths, False
    problems = []
    again = drawn(target, case, seed=0)
    if differing_inputs(draws[0], again):
        problems.append(
            f"draw ignores its generator: two draws of {where} under one seed differ in "
            f"{', '.join(differing_inputs(draws[0], again))} (drawn from torch's global "
            "generator?); draw every value from the generator it is given"
        )
    tensors = [dict(trees.tensors(inputs)) for inputs in draws]
    for path in paths:
        first = tensors[0][path]
        if first.device != target.device:
            problems.append(
                f"draw: input {path!r} is on {first.device}, the target on {target.device}"
            )
        shapes = {(tuple(t[path].shape), t[path].dtype) for t in tensors if path in t}
        if len(shapes) > 1:
            problems.append(
                f"draw: input {path!r} of {where} changes shape or dtype between draws "
                f"{sorted(map(str, shapes))}: two draws of one case must be interchangeable input "
                "by input (shapes come from the case, values from the generator)"
            )
        elif all(not differing_inputs(draws[0], d, [path]) for d in draws[1:]):
            nan = " (all NaN)" if first.is_floating_point() and first.isnan().all() else ""
            problems.append(
                f"draw ignores its generator for input {path!r}: the same values{nan} in "
                f"{DRAWS} draws of {where} under seeds 0 to {DRAWS - 1}; every input tensor "
                "must vary with the generator"
            )
    return problems, paths, shapes_of(repeat) != shapes_of(draws[0])


def differing_inputs(first: Inputs, second: Inputs, paths: list[str] | None = None) -> list[str]:
    """The input tensors (of ``paths``, default all) whose values differ between two draws;
    NaN counts equal to NaN."""
    found, other = dict(trees.tensors(first)), dict(trees.tensors(second))
    return [
        path
        for path in paths or list(found)
        if path not in other or compare_outputs(found[path], other[path], path=path)
    ]


def shapes_of(inputs: Inputs) -> dict[str, tuple[int, ...]]:
    return {path: tuple(tensor.shape) for path, tensor in trees.tensors(inputs)}


@check("dry run", sharper_with=("state.sides", "state.reset"), runs_on="cpu")
def test_dry_run(
    target: CudaGraphTarget,
    conclude: Conclude,
    progress: CheckProgress,
    record_account: AccountRecorder,
    target_factory: Factory | None,
    explain: ErrorExplainer,
) -> None:
    cases = [numbered(target, number) for number in range(min(len(target.keys), MAX_KEYS))]
    graphed_too = target.graphed is not None and target.device.type != "cuda"
    sides = "eager and graphed" if graphed_too else "eager"
    failed: dict[int, list[str]] = {}
    first: object = None
    back_to_start = eager_state_kept(target)
    for index, case in enumerate(cases):
        progress(f"{sides} on {case_words(case)} ({index + 1} of {len(cases)} keys)")
        try:
            output, found = dry_call(target, case, graphed_too, back_to_start, target_factory)
        except _loading.UserCodeError as error:
            output, found = None, [explain(error)]
        except ReturnedWrong as error:
            output, found = None, [str(error)]
        if found:
            failed[case.number] = found
        elif index == 0:
            first = output
    if 0 not in failed and len(cases) > 1:
        progress(f"eager on {case_words(cases[0])} again, after every other key")
        try:
            carried = carried_state(target, first, back_to_start)
        except _loading.UserCodeError as error:
            carried = [explain(error)]
        except ReturnedWrong as error:
            carried = [str(error)]
        if carried:
            failed[0] = carried
    ran, could_not = users_callables(target, first if 0 not in failed else None)
    synchronize(target.device)
    record_account([*ran, *(["graphed"] if graphed_too else [])], gpu_skips(target), could_not)
    where = " (graphed runs without CUDA)" if graphed_too else ""
    problems = [f"case {number}: {p}" for number, found in failed.items() for p in found]
    figure = (
        f"{sides} once on each of {len(cases)} key{'s' if len(cases) > 1 else ''}{where}; "
        f"{len(ran)} of your callables ran"
    )
    headline = f"the dry run failed on {len(failed)} of {len(cases)} keys:"
    conclude(Judgement(once(problems), figure, len(cases), "keys called"), headline)


def once(problems: list[str]) -> list[str]:
    """``problems`` with a traceback shown before (the same frames, another key) left out."""
    seen: set[str] = set()
    shown = []
    for problem in problems:
        first, _, frames = problem.partition("\n")
        shown.append(first + " (the same frames as above)" if frames in seen else problem)
        if frames:
            seen.add(frames)
    return shown


def eager_state_kept(target: CudaGraphTarget) -> Callable[[], object]:
    """What brings the eager side back to the state it holds now, so that a repeated call
    starts where the first did: its own state copied back in place (``State.sides``), else a
    new episode (``State.reset``, begun now too); nothing where the target declares no state."""
    sides = sides_of(target)
    if sides is not None:
        saved = module_state(sides.eager)
        return lambda: load_state(sides.eager, saved)
    reset = target.state.reset if target.state is not None else None
    if reset is not None:
        called("State.reset", reset)
        return lambda: called("State.reset", reset)
    return lambda: None


def dry_call(
    target: CudaGraphTarget,
    case: Case,
    graphed_too: bool,
    back_to_start: Callable[[], object],
    fresh: Factory | None,
) -> tuple[object, list[str]]:
    """One case through eager (twice under one seed on case 0, from one state: the seed must
    decide its answer) and, when asked, graphed, each on a draw of its own (two draws under one
    seed must be alike): eager's output, and what does not fit the contract."""
    inputs = drawn(target, case, seed=case.number)
    _loading.key_of(target, inputs, case)  # an error in it named here too
    where = f"{case_words(case)}; inputs {inputs_words(inputs)}"
    drawn_first = trees.cloned(inputs)  # as drawn: a step may write its inputs
    with user_call(f"eager on {where}"):
        expected = eager_call(target, inputs, seed=case.number)
    if not tensors_in(expected):
        return expected, [
            f"eager on {where} returned {type(expected).__name__}, no tensor"
            + (" (a forgotten return?)" if expected is None else "")
        ]
    problems = [f"eager on {where}: {p}" for p in fits_contract(target, inputs, expected)]
    if problems:  # nothing to compare by until the contract fits
        return expected, problems
    redrawn = drawn(target, case, seed=case.number)
    if differing_inputs(drawn_first, redrawn):  # no side is to blame when its inputs differ
        return expected, [
            f"draw ignores its generator: two draws of {case_words(case)} under one seed "
            f"differ in {', '.join(differing_inputs(drawn_first, redrawn))}"
        ]
    if case.number == 0:
        back_to_start()
        with user_call(f"eager on {where}, again"):
            again = eager_call(target, redrawn, seed=case.number)
        if compare_outputs(expected, again, sides=REPEATED):
            problems.append(f"eager on {where} {not_reproducible(target, expected, again, fresh)}")
    if graphed_too:
        try:
            with user_call(f"graphed on {where}"):
                actual = graphed_call(
                    target, drawn(target, case, seed=case.number), seed=case.number
                )
        except _loading.UserCodeError as error:
            hint = _loading.cuda_hint(error.__cause__ or error, target.device)
            if not hint:
                raise
            return expected, [f"{error}{hint}"]
        problems += [
            f"graphed on {where}: {d}" for d in differences(target, inputs, expected, actual)
        ]
    return expected, problems


def not_reproducible(
    target: CudaGraphTarget, first: object, again: object, fresh: Factory | None
) -> str:
    """Why eager's answer on case 0 differs when called again under one seed, told apart: where
    the target declares no state, a fresh target's first call gives the first answer again
    (state carried from call to call), else a generator of the code's own the suite does not
    seed, else other random numbers the suite does not seed."""
    differs = compare_outputs(first, again, sides=REPEATED)[0]
    held = undeclared_generators(target)
    generators = (
        f"a torch.Generator of its own ({', '.join(sorted(held)[:3])}), which the suite does not "
        "seed: give CudaGraphTarget(generators=lambda: [...]) with every generator either side "
        "draws from, and the suite seeds each with the call's seed before every call"
    )
    # Where the target declares its state, the repeat started from it: state is not the cause.
    fresh_first = _fresh_first_call(fresh) if target.state is None else None
    if fresh_first is not None and not compare_outputs(first, fresh_first, sides=FRESH):
        also = f"; it also draws from {generators}" if held else ""
        return (
            "is not reproducible under one seed, and a fresh target's first call gives the first "
            "answer again: the eager side carries state from call to call. Declare it: "
            "State(reset=...) that ends every side's state in place (calls are then episodes), "
            "or State(sides=lambda: (eager_model, graphed_model)) giving what holds each side's "
            f"state{also} ({differs.describe()})"
        )
    if held:
        return (
            f"is not reproducible under one seed: it draws from {generators} ({differs.describe()})"
        )
    return (
        "is not reproducible under one seed"
        + (" even from a fresh target" if fresh_first is not None else "")
        + f": {differs.path} draws random numbers the suite does not seed (torch's own "
        "generators are seeded; numpy's, Python's random module or a nondeterministic kernel "
        f"are not) ({differs.describe()})"
    )


def undeclared_generators(target: CudaGraphTarget) -> dict[str, torch.Generator]:
    """The torch.Generators the eager side holds that ``generators`` does not give, by path."""
    declared = {id(g) for g in target_generators(target)}
    return {
        path: generator
        for path, generator in reachable_generators(target.eager, "eager").items()
        if id(generator) not in declared
    }


def _fresh_first_call(fresh: Factory | None) -> object | None:
    """Eager's first answer on case 0 of a fresh target from the factory (None without one)."""
    if fresh is None:
        return None
    made = fresh()
    return eager_call(made, draw(made, numbered(made, 0), seed=0), seed=0)


def carried_state(
    target: CudaGraphTarget, first: object, back_to_start: Callable[[], object]
) -> list[str]:
    """Eager on case 0 once more under its seed, after every other key ran (from the state of
    its first call, where the target declares state): an answer that changed since its first
    call carries state from call to call."""
    back_to_start()
    case = numbered(target, 0)
    inputs = drawn(target, case, seed=0)
    where = f"{case_words(case)}; inputs {inputs_words(inputs)}"
    with user_call(f"eager on {where}, after the other keys"):
        again = eager_call(target, inputs, seed=0)
    return [
        f"eager's answer on {case_words(case)} changed after calls of the other keys (state "
        "carried from call to call; a target whose calls are episodes gives "
        f"State(reset=...)): {m.describe()}"
        for m in compare_outputs(first, again, sides=REPEATED)
    ]


def users_callables(target: CudaGraphTarget, output: object) -> tuple[list[str], list[str]]:
    """Every callable the target's capabilities give, called once (with case 0's inputs and
    eager's output where it takes them) after draw, key_of and eager, which the dry run called:
    the names of those that ran, and of those that could not without CUDA. Any other error is
    the user's, named (``UserCodeError``)."""
    inputs = drawn(target, numbered(target, 0), seed=0)
    ran, could_not = ["draw", "key_of", "eager"], []
    for field, function, arguments in capability_calls(target, inputs, output):
        try:
            called(field, function, *arguments)
        except _loading.UserCodeError as error:
            if not _loading.cuda_hint(error.__cause__ or error, target.device):
                raise
            could_not.append(field)
            continue
        ran.append(field)
    return ran, could_not


def capability_calls(
    target: CudaGraphTarget, inputs: Inputs, output: object
) -> list[tuple[str, Callable[..., object], tuple[object, ...]]]:
    """(field, callable, its arguments) of each callable a capability gives that needs no GPU
    by its nature (worker processes and guards' modes are checks of their own)."""
    generator = torch.Generator(target.device).manual_seed(0)
    cache, state, fallbacks = target.cache, target.state, target.fallbacks
    sampling, capture_clean = target.sampling, target.capture_clean
    padding, trajectory = target.padding, target.trajectory
    found: list[tuple[str, Callable[..., object] | None, tuple[object, ...]]] = [
        ("Cache.cached_keys", cache.cached_keys if cache else None, ()),
        ("Cache.static", cache.static if cache else None, ()),
        ("Cache.reset", cache.reset if cache else None, ()),
        ("State.sides", state.sides if state else None, ()),
        ("State.reset", state.reset if state else None, ()),
        ("Fallbacks.graph_skips", fallbacks.graph_skips if fallbacks else None, ()),
        ("Fallbacks.runs_eagerly", fallbacks.runs_eagerly if fallbacks else None, (inputs,)),
        ("Sampling.sample", sampling.sample if sampling else None, (0, False)),
        ("CaptureClean.forward", capture_clean.forward if capture_clean else None, ()),
        ("Padding.make_inputs", padding.make_inputs if padding else None, (generator, 1)),
    ]
    if trajectory is not None and output is not None:
        found.append(("Trajectory.next_inputs", trajectory.next_inputs, (inputs, output)))
    return [(field, function, args) for field, function, args in found if function is not None]


def gpu_skips(target: CudaGraphTarget) -> dict[str, list[str]]:
    """check -> what it needs that the target does not give: the checks that need CUDA and
    would still skip on a GPU."""
    found = {row.name: row.lacking(target) for row in declared_checks() if row.runs_on != "cpu"}
    return {name: missing for name, missing in found.items() if missing}


def fits_contract(target: CudaGraphTarget, inputs: Inputs, output: object) -> list[str]:
    """The parts that ``tolerance`` and ``real_part`` name are parts of the output, the real
    part can be taken, and it holds something to compare."""
    parts = parts_of(output)
    named: dict[str, object] = {"tolerance": target.tolerance}
    if target.real_part is not None:
        named["real_part"] = called("real_part", target.real_part, inputs)
    problems = []
    for field, value in named.items():
        if not isinstance(value, Mapping):
            continue
        if parts is None:
            problems.append(f"{field} names parts {list(value)} of an output without parts")
            continue
        problems += [
            f"{field} names part {p!r}, not in the output" for p in value if p not in parts
        ]
    if target.real_part is not None and not problems:
        try:
            chosen = real(target, inputs, output)
        except (IndexError, TypeError) as error:
            return [f"real_part does not index the output: {error}"]
        if not trees.compared_elements(chosen):
            problems.append(
                "real_part selects no element of the output: every comparison would judge nothing"
            )
    return problems
