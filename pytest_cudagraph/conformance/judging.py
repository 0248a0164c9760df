"""The one home for calling a target's two sides and comparing them as its contract says.

Each call draws its own inputs (``draw``: a case under a seed), runs under one seed of torch's
generators, and keeps what it returned as long as the target's ``output_lifetime`` lets it (a
copy taken at once otherwise). A comparison takes the real part of both outputs (``real_part``)
and holds each part to its tolerance (the comparison engine applies a tolerance per part).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from pytest_cudagraph.conformance.protocol import OWNED, CudaGraphTarget, Inputs, Part, RealIndex
from pytest_cudagraph.engines import rng, trees
from pytest_cudagraph.engines.compare import Tolerances
from pytest_cudagraph.engines.faults import lock_held, release_held
from pytest_cudagraph.engines.parity import compare_outputs


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


def eager_call(target: CudaGraphTarget, inputs: Inputs, seed: int) -> object:
    """The eager side on ``inputs`` with torch's generators seeded with ``seed``, copied: an
    eager output that is a view of state the graphed side writes must not change with it."""
    with rng.seeded(target.device, seed):
        return trees.cloned(target.eager(inputs))


def graphed_call(target: CudaGraphTarget, inputs: Inputs, seed: int) -> object:
    """The graphed side on ``inputs`` under ``seed``, as an output the caller may keep: copied
    right away unless the target's outputs are owned."""
    with rng.seeded(target.device, seed):
        return kept(target, graphed_path(target)(inputs))


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
    one seed: their differences."""
    inputs = make()
    expected = eager_call(target, inputs, seed)
    actual = graphed_call(target, make(), seed)
    return differences(target, inputs, expected, actual)


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
