"""Conformance targets for the usual kinds of CUDA-graph code, from a few lines of the user's.

- ``hand_written(...)``: your own per-key graph cache, from its eager and graphed calls.
- ``compiled(module, ...)``: a module under ``torch.compile(mode="reduce-overhead")`` (inductor's
  cudagraph trees), checked against the same module compiled without CUDA graphs.
- ``graphed_callables(module, ...)``: one ``torch.cuda.make_graphed_callables`` graph per input
  shape, checked against the module itself.

Each takes ``keys`` (the graph keys to exercise, at least 4: shapes, buckets) and
``draw(generator, key) -> inputs`` (one call's inputs for that key: a dict of name -> tensor,
values from the generator); case ``c`` of the suite is a draw for ``keys[c % len(keys)]``.
torch is imported only when a target is built.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pytest_cudagraph.conformance.target import BIT_IDENTICAL, CudaGraphTarget, Inputs, Tolerance
from pytest_cudagraph.engines import trees

if TYPE_CHECKING:
    import torch

Draw = Callable[["torch.Generator", Any], Inputs]
# Where inductor logs each CUDA graph it skips (an artifact logger: it does not propagate).
INDUCTOR_SKIP_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"


def input_shapes(inputs: Inputs) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """The default key: each input tensor's name, shape and dtype (what a graph is fixed to)."""
    import torch

    return tuple(
        (name, tuple(value.shape), str(value.dtype))
        for name, value in inputs.items()
        if isinstance(value, torch.Tensor)
    )


def hand_written(
    *,
    device: torch.device,
    eager: Callable[[Inputs], Any],
    graphed: Callable[[Inputs], Any],
    keys: Sequence[Hashable],
    draw: Draw,
    key_of: Callable[[Inputs], Hashable],
    largest_key: Hashable | None = None,
    **capabilities: Any,
) -> CudaGraphTarget:
    """A target for a hand-written per-key graph cache.

    ``key_of`` is the cache's own key for a call (it must tell the ``keys`` apart);
    ``largest_key`` the key whose graph is largest (for the memory check); ``capabilities`` are
    any other CudaGraphTarget fields the cache can give (reset, lock, cached_keys, capacity,
    fault_points, tolerance, ...).
    """
    make_inputs, num_keys = keyed_cases(keys, draw)
    if largest_key is not None:
        if largest_key not in keys:
            raise ValueError(f"largest_key {largest_key!r} is not one of the keys")
        capabilities["largest_case"] = list(keys).index(largest_key)
    return CudaGraphTarget(
        device=device,
        eager=eager,
        graphed=graphed,
        make_inputs=make_inputs,
        key_of=key_of,
        num_keys=num_keys,
        **capabilities,
    )


def keyed_cases(
    keys: Sequence[Hashable], draw: Draw
) -> tuple[Callable[[torch.Generator, int], Inputs], int]:
    """``make_inputs(generator, case)`` drawing case ``c`` for ``keys[c % len(keys)]``, and
    the number of keys."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"keys must be a sequence of graph keys, got {type(keys).__name__}")
    keys = list(keys)
    if len(set(keys)) < 4 or len(set(keys)) != len(keys):
        raise ValueError(f"keys must be at least 4 distinct graph keys, got {keys!r}")
    if not callable(draw):
        raise TypeError(f"draw must be callable as draw(generator, key), got {type(draw).__name__}")

    def make_inputs(generator: torch.Generator, case: int) -> Inputs:
        return draw(generator, keys[case % len(keys)])

    return make_inputs, len(keys)


def compiled(
    module: torch.nn.Module,
    *,
    device: torch.device,
    keys: Sequence[Hashable],
    draw: Draw,
    tolerance: Tolerance = BIT_IDENTICAL,
    copy_outputs: bool = True,
    rerecord_limit: int = 0,
) -> CudaGraphTarget:
    """A target for ``module`` run through ``torch.compile(mode="reduce-overhead")``, called as
    ``module(**inputs)``.

    Eager is the same module compiled without CUDA graphs (``mode="default"``): inductor emits
    the same kernels, so the graphs alone should change nothing. Both compile with
    ``dynamic=False``, one graph per input shape, and dynamo's recompile limit is raised to hold
    both per key. Outputs live in the graphs' memory pool until the next step; ``copy_outputs``
    clones them, as a caller keeping them across steps must. A graph re-recorded more than
    ``rerecord_limit`` times for the same function falls back to eager, which the
    graphs-not-skipped check reports, as it does every graph inductor skipped.
    """
    import torch
    import torch._dynamo

    _check_module(module)
    make_inputs, num_keys = keyed_cases(keys, draw)
    if (
        isinstance(rerecord_limit, bool)
        or not isinstance(rerecord_limit, int)
        or rerecord_limit < 0
    ):
        raise ValueError(f"rerecord_limit must be an int >= 0, got {rerecord_limit!r}")
    limit = 2 * num_keys + 2  # both compilations of every key, and a spare for each
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, limit)
    with_graphs = torch.compile(module, mode="reduce-overhead", dynamic=False)
    without_graphs = torch.compile(module, mode="default", dynamic=False)
    skips = InductorSkips()
    # Every call runs on one thread, one step at a time: cudagraph trees keep per-thread state,
    # and a step's outputs are valid only until the next step begins.
    one_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compiled-target")

    def run_eager(inputs: Inputs) -> Any:
        with _on(device):
            return without_graphs(**inputs)

    def run_graphed(inputs: Inputs) -> Any:
        with _on(device), _rerecord_limit(rerecord_limit):
            torch.compiler.cudagraph_mark_step_begin()
            outputs = with_graphs(**inputs)
            return trees.cloned(outputs) if copy_outputs else outputs

    def eager(inputs: Inputs) -> Any:
        return one_thread.submit(run_eager, inputs).result()

    def graphed(inputs: Inputs) -> Any:
        return one_thread.submit(run_graphed, inputs).result()

    return CudaGraphTarget(
        device=device,
        eager=eager,
        graphed=graphed,
        make_inputs=make_inputs,
        key_of=input_shapes,
        num_keys=num_keys,
        tolerance=tolerance,
        graph_skips=skips.reasons,
    )


def graphed_callables(
    module: torch.nn.Module,
    *,
    device: torch.device,
    keys: Sequence[Hashable],
    draw: Draw,
    tolerance: Tolerance = BIT_IDENTICAL,
    copy_outputs: bool = True,
    num_warmup_iters: int = 3,
) -> CudaGraphTarget:
    """A target for ``torch.cuda.make_graphed_callables(module, sample_args)``, one graphed
    callable per input shape, built on the first call of that shape; called as
    ``module(*inputs.values())`` with gradients off (inference).

    The graphed callable returns its static output buffers, which the next replay overwrites;
    ``copy_outputs`` clones them, as a caller keeping them must. ``reset()`` drops every graph.
    """
    import torch

    _check_module(module)
    make_inputs, num_keys = keyed_cases(keys, draw)
    graphs: dict[Hashable, Callable[..., Any]] = {}
    lock = threading.Lock()

    def eager(inputs: Inputs) -> Any:
        with torch.no_grad(), _on(device):
            return module(*inputs.values())

    def graphed(inputs: Inputs) -> Any:
        args = tuple(inputs.values())
        with lock, torch.no_grad(), _on(device):
            key = input_shapes(inputs)
            if key not in graphs:
                # A plain function, not the module: given a module, make_graphed_callables
                # replaces its forward, and eager would then run a graph too.
                graphs[key] = torch.cuda.make_graphed_callables(
                    lambda *args: module(*args), args, num_warmup_iters=num_warmup_iters
                )
            outputs = graphs[key](*args)
            return trees.cloned(outputs) if copy_outputs else outputs

    def reset() -> None:
        with lock:
            graphs.clear()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()

    return CudaGraphTarget(
        device=device,
        eager=eager,
        graphed=graphed,
        make_inputs=make_inputs,
        key_of=input_shapes,
        num_keys=num_keys,
        tolerance=tolerance,
        reset=reset,
        lock=lock,
        cached_keys=lambda: list(graphs),
    )


class InductorSkips:
    """The CUDA graphs inductor skipped since this object was made: its skip counter, with the
    reason of each skip as inductor logs it."""

    def __init__(self) -> None:
        from torch._dynamo.utils import counters

        self._counters = counters
        self._start = counters["inductor"]["cudagraph_skips"]
        self._logged: list[str] = []
        logging.getLogger(INDUCTOR_SKIP_LOGGER).addHandler(_Collect(self._logged))

    def reasons(self) -> list[str]:
        counted = self._counters["inductor"]["cudagraph_skips"] - self._start
        reasons = [" ".join(message.split())[:300] for message in self._logged]
        unlogged = counted - len(reasons)
        if unlogged > 0:
            reasons.append(f"{unlogged} more CUDA graph(s) skipped (inductor's counter)")
        return reasons


class _Collect(logging.Handler):
    """Keeps the message of every warning logged to it."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _check_module(module: object) -> None:
    if not callable(module):
        raise TypeError(f"module must be a callable torch.nn.Module, got {type(module).__name__}")


def _on(device: torch.device) -> Any:
    """The device as current while a call runs (a no-op on the CPU)."""
    import torch

    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _rerecord_limit(limit: int) -> Any:
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.triton, "cudagraph_unexpected_rerecord_limit"):
        return contextlib.nullcontext()  # torch without the limit: re-records are not bounded
    return inductor_config.patch({"triton.cudagraph_unexpected_rerecord_limit": limit})
