"""The checks that need a process of their own: a function run in a freshly spawned process
(no CUDA state inherited), and the device-binding probe that runs there."""

from __future__ import annotations

import functools
import multiprocessing
import os
import traceback
from collections.abc import Callable, Hashable, Sequence
from multiprocessing.connection import Connection
from typing import Any, TypeVar, cast

import torch

from pytest_cudagraph.conformance._judging import draw, judged, numbered
from pytest_cudagraph.conformance._loading import build_target
from pytest_cudagraph.engines import devices

T = TypeVar("T")


def run_in_fresh_process(function: Callable[..., T], *args: object, timeout: float) -> T:
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
    return cast("T", value)  # what ``function`` returned, through the pipe


def _child_main(
    sender: Connection, function: Callable[..., object], args: tuple[object, ...]
) -> None:
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
    for number in cases:
        case = numbered(target, number)
        for attempt, seed in (("capture", 0), ("replay", 1)):
            keys.add(case.key)
            try:
                found = judged(target, functools.partial(draw, target, case, seed), seed)
            except Exception as error:  # report it with what NVML saw, not instead of it
                found = [f"{type(error).__name__}: {error}"]
            problems += [f"case {number} ({attempt}): {difference}" for difference in found]
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
