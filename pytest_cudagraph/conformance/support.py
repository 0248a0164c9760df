"""What the conformance checks share: drawing a case's inputs, calling each side under one seed,
comparing outputs as the target's contract says (its real part, its tolerance per part, its
outputs' lifetime), telling graph memory from ordinary memory, and the device-binding probe
that runs in a fresh process."""

from __future__ import annotations

import contextlib
import functools
import itertools
import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import pytest
import torch

from pytest_cudagraph.conformance.target import (
    OWNED,
    CudaGraphTarget,
    Inputs,
    Part,
    RealIndex,
    TargetError,
    Tolerance,
    build_target,
    missing_field_reason,
    not_given_reason,
)
from pytest_cudagraph.engines import devices, rng, trees
from pytest_cudagraph.engines.faults import FaultInjector
from pytest_cudagraph.engines.parity import compare_outputs

DEFAULT_POOL = (0, 0)  # the caching allocator's own pool; graphs get private ones
T = TypeVar("T")


def skip_without(target: CudaGraphTarget, *fields: str) -> None:
    """Skip the check when the target leaves any of these optional fields out."""
    reason = missing_field_reason(target, *fields)
    if reason is not None:
        pytest.skip(reason)


def needed(value: T | None, field: str) -> T:
    """The target's optional ``field``, whose value is ``value``; the check skips without it."""
    if value is None:
        pytest.skip(not_given_reason([field]))
    return value


def graphed_path(target: CudaGraphTarget) -> Callable[[Inputs], Any]:
    """The target's graphed path, which only a target away from CUDA may leave out."""
    if target.graphed is None:
        raise TargetError(None, f"graphed is None on {target.device}; only CUDA needs it")
    return target.graphed


def lock_was_held(target: CudaGraphTarget) -> bool:
    """Whether the target's lock is held (probed from another thread); a held lock is then
    released, so that one broken check does not hang the checks after it."""
    if target.lock is None:
        return False
    try:
        FaultInjector().assert_lock_free(target.lock)
    except AssertionError:
        target.lock.release()
        return True
    return False


def forget_last_failure() -> None:
    """Drop what pytest keeps of the last failure for post-mortem debugging (``sys.last_exc``,
    ``sys.last_value``, ``sys.last_traceback``, ``sys.last_type``). Its frames hold what the
    failed check built (a sampler's graphs and their memory) until the next test's body
    starts, which is after a memory check's baseline: a failure would be charged to the next
    check."""
    for name in ("last_exc", "last_value", "last_traceback", "last_type"):
        if hasattr(sys, name):
            delattr(sys, name)


def draw(target: CudaGraphTarget, case: int, seed: int) -> Inputs:
    """One call's inputs for ``case``, their values drawn from ``seed``."""
    return target.make_inputs(torch.Generator(target.device).manual_seed(seed), case)


def case_in_key(target: CudaGraphTarget, key_index: int, repeat: int) -> int:
    """The ``repeat``-th case landing in key number ``key_index``."""
    return key_index + repeat * target.num_keys


def calls_over_keys(
    target: CudaGraphTarget, key_count: int, rounds: range
) -> Iterator[tuple[int, int]]:
    """``(call, case)`` for each round of ``rounds``, a case of each of the first ``key_count``
    keys in turn (``case_in_key``); ``call`` counts these calls from 0."""
    pairs = itertools.product(rounds, range(key_count))
    for call, (repeat, key_index) in enumerate(pairs):
        yield call, case_in_key(target, key_index, repeat)


def keys_held(target: CudaGraphTarget, most: int) -> int:
    """How many keys a check that calls each key again walks: at most ``most``, and no more
    than the target's cache holds (``capacity``), so that a later call of a key replays its
    graph rather than capturing an evicted one afresh."""
    return min(most, target.num_keys, target.capacity or most)


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


# Calling each side: one seed for both, every output read while it is valid.


def eager_call(target: CudaGraphTarget, inputs: Inputs, seed: int) -> Any:
    """The eager side on ``inputs`` with torch's generators seeded with ``seed``, copied: an
    eager output that is a view of state the graphed side writes must not change with it."""
    with rng.seeded(target.device, seed):
        return trees.cloned(target.eager(inputs))


def graphed_call(target: CudaGraphTarget, inputs: Inputs, seed: int) -> Any:
    """The graphed side on ``inputs`` under ``seed``, as an output the caller may keep: copied
    right away unless the target's outputs are owned."""
    with rng.seeded(target.device, seed):
        return kept(target, graphed_path(target)(inputs))


def kept(target: CudaGraphTarget, output: Any) -> Any:
    """``output`` as something to keep past the next call: itself when outputs are owned, else
    a copy taken now, before a later call may overwrite it."""
    return output if target.output_lifetime == OWNED else trees.cloned(output)


def draws_random_numbers(target: CudaGraphTarget, inputs: Inputs) -> bool:
    """Whether the eager answer on ``inputs`` changes with the seed (code that samples):
    then calls can only be compared with eager one at a time, each under its seed."""
    return bool(compare_outputs(eager_call(target, inputs, 0), eager_call(target, inputs, 1)))


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
    target's tolerance, over their real part, described."""
    expected, actual = real(target, inputs, expected), real(target, inputs, actual)
    if isinstance(target.tolerance, Tolerance):
        return tolerated(expected, actual, target.tolerance)
    want, got = parts_of(expected), parts_of(actual)
    if want is None or got is None or want.keys() != got.keys():
        return tolerated(expected, actual, target.tolerance_of(None))  # names the mismatch
    found = []
    for part in want:
        tolerance = target.tolerance_of(part)
        found += tolerated(want[part], got[part], tolerance, path=f"output[{part!r}]")
    return found


def tolerated(
    expected: object, actual: object, tolerance: Tolerance, path: str = "output"
) -> list[str]:
    """Each difference between two values beyond ``tolerance``, described."""
    found = compare_outputs(expected, actual, atol=tolerance.atol, rtol=tolerance.rtol, path=path)
    return [mismatch.describe() for mismatch in found]


def judged(target: CudaGraphTarget, make: Callable[[], Inputs], seed: int) -> list[str]:
    """Eager, then graphed, each on inputs of its own from ``make()`` (fresh, identical), under
    one seed: their differences."""
    inputs = make()
    expected = eager_call(target, inputs, seed)
    actual = graphed_call(target, make(), seed)
    return differences(target, inputs, expected, actual)


def tensors_in(value: object) -> list[torch.Tensor]:
    """The tensors in an output: a tensor, or tuples, lists and dicts of them."""
    return [tensor for _, tensor in trees.tensors(value)]


def input_tensor_names(inputs: Inputs) -> list[str]:
    return [name for name, value in inputs.items() if isinstance(value, torch.Tensor)]


def graph_pool_of(tensor: torch.Tensor) -> tuple[int, int] | None:
    """The private (graph) memory pool holding ``tensor``'s storage; None when the storage
    lies in the allocator's default pool, outside the allocator or off CUDA."""
    if tensor.device.type != "cuda":
        return None
    address = tensor.untyped_storage().data_ptr()
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device") != tensor.device.index:
            continue
        start = segment["address"]
        if start <= address < start + segment["total_size"]:
            pool = tuple(segment["segment_pool_id"])
            return None if pool == DEFAULT_POOL else pool
    return None


def run_in_fresh_process(function: Callable[..., Any], *args: object, timeout: float) -> Any:
    """``function(*args)`` in a newly spawned process (no CUDA state inherited); its return
    value, or RuntimeError with the child's traceback. A child past ``timeout`` is killed."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child_main, args=(sender, function, args), daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(timeout):
            raise RuntimeError(f"{function.__name__} gave no answer within {timeout:g} s")
        succeeded, value = receiver.recv()
    except EOFError:
        process.join(5)
        raise RuntimeError(
            f"{function.__name__}'s process died (exit code {process.exitcode})"
        ) from None
    finally:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
        receiver.close()
    if not succeeded:
        raise RuntimeError(f"{function.__name__} failed in its process:\n{value}")
    return value


def _child_main(sender: Any, function: Callable[..., Any], args: tuple[object, ...]) -> None:
    try:
        sender.send((True, function(*args)))
    except BaseException:
        sender.send((False, traceback.format_exc()))


def binding_probe(spec: str | None, cases: Sequence[int]) -> dict[str, Any]:
    """Run in a fresh process, where cuda:0 is current and nothing has touched it yet: build the
    target on cuda:1, call each case's graphed path twice (capture, then replay with new
    inputs) against eager, and report what happened on cuda:0 (NVML: is this process there?)."""
    current = torch.device("cuda", torch.cuda.current_device())
    other = torch.device("cuda", 1)
    watch = _nvml_watch(current)
    listed_before = watch()
    target = build_target(spec, other)
    problems: list[str] = []
    keys: set[Hashable] = set()
    for case in cases:
        for attempt, seed in (("capture", 0), ("replay", 1)):
            keys.add(target.key_of(draw(target, case, seed)))
            try:
                found = judged(target, functools.partial(draw, target, case, seed), seed)
            except Exception as error:  # report it with what NVML saw, not instead of it
                found = [f"{type(error).__name__}: {error}"]
            problems += [f"case {case} ({attempt}): {difference}" for difference in found]
    torch.cuda.synchronize(other)
    listed_after = watch()  # before any other query, so that only the target is judged
    return {
        "calls": 2 * len(cases),
        "keys": len(keys),
        "problems": problems,
        "current_after": torch.cuda.current_device(),
        "torch_reserved_on_current": torch.cuda.memory_reserved(current),
        "nvml_on_current": (listed_before, listed_after),
        "nvml_on_target": _nvml_watch(other)(),
    }


def _nvml_watch(device: torch.device) -> Callable[[], int | str | None]:
    """A reading of this process's memory on ``device`` as NVML sees it: bytes, None when
    NVML lists the process nowhere there, or a string saying why NVML cannot tell."""
    status = devices.nvml_status()
    if not status.available:
        return lambda: f"NVML unavailable: {status.detail}"
    handle = devices.nvml_handle(device)
    return lambda: devices.process_used_bytes(handle, os.getpid())
