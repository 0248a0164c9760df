"""The target keeps its side of the protocol, and its code runs: both checks run on the CPU too.

- target contract: ``key_of`` tells the ``keys`` apart, ``draw`` draws from its generator (one
  seed, one draw; another seed, other values of every input tensor, NaN counted equal to NaN)
  and two draws of one case are interchangeable input by input.
- dry run: each key's eager side (and the graphed side where it runs without CUDA), so that a
  plumbing error (a KeyError, a wrong shape, a forgotten return, an output the declared contract
  does not fit) fails on a laptop; eager on case 0 again under its seed, at once and after every
  other key: an answer that changes carries state from call to call.

An error in the user's code is named as the user wrote it (``draw``, ``key_of``, ``eager``),
with the case, the key, the inputs' shapes and the user's own frames: nothing of the suite's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

import pytest

from pytest_cudagraph.conformance import loading
from pytest_cudagraph.conformance.catalog import check_needs, lacking
from pytest_cudagraph.conformance.judging import (
    checked_sides,
    differences,
    draw,
    eager_call,
    graphed_call,
    input_tensor_names,
    parts_of,
    real,
    synchronize,
    tensors_in,
)
from pytest_cudagraph.conformance.loading import case_words, inputs_words, user_call
from pytest_cudagraph.conformance.progress import CheckProgress
from pytest_cudagraph.conformance.protocol import CudaGraphTarget, Inputs, key_problem
from pytest_cudagraph.conformance.suite import AccountRecorder, ErrorExplainer, FigureRecorder
from pytest_cudagraph.engines.compare import compare_outputs
from pytest_cudagraph.engines.state import load_state, module_state

DRAWS = 4  # draws of one case; each input tensor must take at least two values among them
VARIED_CASES = 4
MAX_KEYS = 64  # keys whose cases are checked (or called, in the dry run)
REPEATED = ("first eager call", "eager call again")


def test_target_contract(
    target: CudaGraphTarget,
    record_figure: FigureRecorder,
    progress: CheckProgress,
    explain: ErrorExplainer,
) -> None:
    checked = min(target.num_keys, MAX_KEYS)
    try:
        keys = [key_of_case(target, case, progress) for case in range(checked)]
        problems = collisions(target, keys)
        varied = min(VARIED_CASES, target.num_keys)
        names: list[str] = []
        varying = 0
        for case in range(varied):
            progress(f"draws of {case_words(target.case(case))}")
            found, names, shapes_vary = draw_problems(target, case, keys[case])
            problems += found
            varying += shapes_vary
    except loading.UserCodeError as error:
        problems = [explain(error)]
    except ReturnedWrong as error:
        problems = [str(error)]
    of_keys = f"{checked} of {target.num_keys}" if checked < target.num_keys else f"{checked}"
    if not problems:
        record_figure(
            f"{of_keys} key{'s' if target.num_keys > 1 else ''}; inputs {', '.join(names)} vary "
            f"over {DRAWS} draws of {varied} cases; shapes vary inside {varying} of them"
        )
    fail_on(problems)


def drawn(target: CudaGraphTarget, case: int, seed: int) -> Inputs:
    """Case ``case``'s inputs under ``seed``; an error in ``draw``, or a draw that returns
    something else than inputs, is a ``UserCodeError`` naming the case."""
    call = f"draw(generator, {case_words(target.case(case))})"
    with user_call(call):
        inputs = draw(target, case, seed)
    problem = loading.inputs_problem(inputs)
    if problem is not None:
        raise ReturnedWrong(f"{call} returned {problem}")
    return inputs


def key_of_case(target: CudaGraphTarget, case: int, progress: CheckProgress) -> Hashable:
    """The key ``key_of`` gives case ``case``: a plain value, the same for a second draw."""
    progress(f"key_of of {case_words(target.case(case))}")
    first, second = (drawn(target, case, seed) for seed in (case, case + 1))
    key, again = (loading.key_of(target, inputs, target.case(case)) for inputs in (first, second))
    problem = key_problem(key, lambda: again, "for two draws of one case")
    if problem:
        raise ReturnedWrong(f"key_of(inputs of {case_words(target.case(case))}) {problem}")
    return key


class ReturnedWrong(Exception):
    """A field of the user's returned what the protocol does not take (the message says what
    and where: no frame of the user's raised it)."""


def collisions(target: CudaGraphTarget, keys: list[Hashable]) -> list[str]:
    """The keys of ``target.keys`` that ``key_of`` does not tell apart, in the user's names."""
    first_with: dict[Hashable, int] = {}
    problems = []
    for index, key in enumerate(keys):
        earlier = first_with.setdefault(key, index)
        if earlier != index:
            problems.append(
                f"key_of gives {key!r} for a draw of keys[{earlier}] = {target.keys[earlier]!r} "
                f"and for one of keys[{index}] = {target.keys[index]!r}: key_of must tell the "
                "keys apart (each key a graph of its own)"
            )
    return problems


def draw_problems(
    target: CudaGraphTarget, case: int, key: Hashable
) -> tuple[list[str], list[str], bool]:
    """What is wrong with ``draw`` on case ``case``; the input tensors' names; whether the
    case's shapes differ from those of the next draw of its key (a real batch in a bucket)."""
    where = case_words(target.case(case))
    draws = [drawn(target, case, seed) for seed in range(DRAWS)]
    repeat = drawn(target, case + target.num_keys, seed=0)
    names = input_tensor_names(draws[0])
    if not names:
        return [f"draw(generator, {where}) returned no tensors"], names, False
    problems = []
    again = drawn(target, case, seed=0)
    if differing_inputs(draws[0], again):
        problems.append(
            f"draw ignores its generator: two draws of {where} under one seed differ in "
            f"{', '.join(differing_inputs(draws[0], again))} (drawn from torch's global "
            "generator?); draw every value from the generator it is given"
        )
    keys = {loading.key_of(target, inputs, target.case(case)) for inputs in [*draws, repeat]}
    if keys != {key}:
        problems.append(
            f"key_of gives {sorted(map(repr, keys))} for draws of {where} and of case "
            f"{case + target.num_keys}: every draw of a key must land in it ({key!r})"
        )
    for name in names:
        first = draws[0][name]
        if first.device != target.device:
            problems.append(
                f"draw: input {name!r} is on {first.device}, the target on {target.device}"
            )
        shapes = {(tuple(d[name].shape), d[name].dtype) for d in draws}
        if len(shapes) > 1:
            problems.append(
                f"draw: input {name!r} of {where} changes shape or dtype between draws "
                f"{sorted(map(str, shapes))}: two draws of one case must be interchangeable input "
                "by input (shapes come from the case, values from the generator)"
            )
        elif all(not differing_inputs(draws[0], d, [name]) for d in draws[1:]):
            nan = " (all NaN)" if first.is_floating_point() and first.isnan().all() else ""
            problems.append(
                f"draw ignores its generator for input {name!r}: the same values{nan} in "
                f"{DRAWS} draws of {where} under seeds 0 to {DRAWS - 1}; every input tensor "
                "must vary with the generator"
            )
    return problems, names, shapes_of(repeat) != shapes_of(draws[0])


def differing_inputs(first: Inputs, second: Inputs, names: list[str] | None = None) -> list[str]:
    """The input tensors (of ``names``, default all) whose values differ between two draws;
    NaN counts equal to NaN."""
    return [
        name
        for name in names or input_tensor_names(first)
        if name not in second or compare_outputs(first[name], second[name], path=name)
    ]


def shapes_of(inputs: Inputs) -> dict[str, tuple[int, ...]]:
    return {name: tuple(inputs[name].shape) for name in input_tensor_names(inputs)}


def test_dry_run(
    target: CudaGraphTarget,
    record_figure: FigureRecorder,
    progress: CheckProgress,
    explain: ErrorExplainer,
    record_account: AccountRecorder,
) -> None:
    called = min(target.num_keys, MAX_KEYS)
    graphed_too = target.graphed is not None and target.device.type != "cuda"
    sides = "eager and graphed" if graphed_too else "eager"
    failed: dict[int, list[str]] = {}
    first: object = None
    back_to_start = eager_state_kept(target)
    for case in range(called):
        progress(f"{sides} on {case_words(target.case(case))} ({case + 1} of {called} keys)")
        try:
            output, found = dry_call(target, case, graphed_too, back_to_start)
        except loading.UserCodeError as error:
            output, found = None, [explain(error)]
        except ReturnedWrong as error:
            output, found = None, [str(error)]
        if found:
            failed[case] = found
        elif case == 0:
            first = output
    if 0 not in failed and called > 1:
        progress(f"eager on {case_words(target.case(0))} again, after every other key")
        try:
            carried = carried_state(target, first, back_to_start)
        except loading.UserCodeError as error:
            carried = [explain(error)]
        except ReturnedWrong as error:
            carried = [str(error)]
        if carried:
            failed[0] = carried
    synchronize(target.device)
    ran = ["draw", "key_of", "eager", *(["graphed"] if graphed_too else [])]
    record_account(ran, gpu_skips(target) if target.device.type != "cuda" else {})
    where = " (graphed runs without CUDA)" if graphed_too else ""
    record_figure(f"{sides} once on each of {called} key{'s' if called > 1 else ''}{where}")
    if failed:
        problems = [f"case {case}: {p}" for case, found in failed.items() for p in found]
        fail_on([f"the dry run failed on {len(failed)} of {called} keys:", *once(problems[:10])])


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
    starts where the first did: its state copied back in place (``State.sides``), else a new
    episode (``State.reset``, begun now too); nothing where the target declares no state."""
    state = target.state
    if state is not None and state.sides is not None:
        eager_side = checked_sides(state.sides)[0]
        saved = module_state(eager_side)
        return lambda: load_state(eager_side, saved)
    if state is not None and state.reset is not None:
        state.reset()
        return state.reset
    return lambda: None


def dry_call(
    target: CudaGraphTarget, case: int, graphed_too: bool, back_to_start: Callable[[], object]
) -> tuple[object, list[str]]:
    """One case through eager (twice under one seed on case 0, from one state: the seed must
    decide its answer) and, when asked, graphed, each on a draw of its own (two draws under one
    seed must be alike): eager's output, and what does not fit the contract."""
    inputs = drawn(target, case, seed=case)
    loading.key_of(target, inputs, target.case(case))  # an error in it named here too
    where = f"{case_words(target.case(case))}; inputs {inputs_words(inputs)}"
    with user_call(f"eager on {where}"):
        expected = eager_call(target, inputs, seed=case)
    if not tensors_in(expected):
        return expected, [
            f"eager on {where} returned {type(expected).__name__}, no tensor"
            + (" (a forgotten return?)" if expected is None else "")
        ]
    problems = [f"eager on {where}: {p}" for p in fits_contract(target, inputs, expected)]
    if problems:  # nothing to compare by until the contract fits
        return expected, problems
    redrawn = drawn(target, case, seed=case)
    if differing_inputs(inputs, redrawn):  # no side is to blame when its inputs differ
        return expected, [
            f"draw ignores its generator: two draws of {case_words(target.case(case))} under "
            f"one seed differ in {', '.join(differing_inputs(inputs, redrawn))}"
        ]
    if case == 0:
        back_to_start()
        with user_call(f"eager on {where}, again"):
            again = eager_call(target, redrawn, seed=case)
        problems += [
            f"eager on {where} is not reproducible under one seed (is something drawn from a "
            f"generator the suite does not seed?): {m.describe()}"
            for m in compare_outputs(expected, again, sides=REPEATED)
        ]
    if graphed_too:
        with user_call(f"graphed on {where}"):
            actual = graphed_call(target, drawn(target, case, seed=case), seed=case)
        problems += [
            f"graphed on {where}: {d}" for d in differences(target, inputs, expected, actual)
        ]
    return expected, problems


def carried_state(
    target: CudaGraphTarget, first: object, back_to_start: Callable[[], object]
) -> list[str]:
    """Eager on case 0 once more under its seed, after every other key ran (from the state of
    its first call, where the target declares state): an answer that changed since its first
    call carries state from call to call."""
    back_to_start()
    inputs = drawn(target, 0, seed=0)
    where = f"{case_words(target.case(0))}; inputs {inputs_words(inputs)}"
    with user_call(f"eager on {where}, after the other keys"):
        again = eager_call(target, inputs, seed=0)
    return [
        f"eager's answer on {case_words(target.case(0))} changed after calls of the other "
        f"keys (state carried from call to call; a target whose calls are episodes gives "
        f"State(reset=...)): {m.describe()}"
        for m in compare_outputs(first, again, sides=REPEATED)
    ]


def gpu_skips(target: CudaGraphTarget) -> dict[str, list[str]]:
    """check -> what it needs that the target does not give: the checks that need CUDA and
    would still skip on a GPU."""
    found = {row.check: lacking(target, row.needs) for row in check_needs() if row.cuda}
    return {check: missing for check, missing in found.items() if missing}


def fits_contract(target: CudaGraphTarget, inputs: Inputs, output: object) -> list[str]:
    """The parts that ``tolerance`` and ``real_part`` name are parts of the output, and the
    real part can be taken."""
    parts = parts_of(output)
    named = {"tolerance": target.tolerance}
    if target.real_part is not None:
        with user_call("real_part(inputs)"):
            named["real_part"] = target.real_part(inputs)
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
            real(target, inputs, output)
        except (IndexError, TypeError) as error:
            problems.append(f"real_part does not index the output: {error}")
    return problems


def fail_on(problems: list[str]) -> None:
    """Fail with ``problems``, and nothing of the suite's source: they name the user's code."""
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
