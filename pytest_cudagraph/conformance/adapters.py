"""Conformance targets for the usual kinds of CUDA-graph code, from a few lines of the user's.

- ``compiled(fn, ...)``: code under ``torch.compile`` with CUDA graphs (``mode="reduce-overhead"``,
  inductor's cudagraph trees), checked against the same code compiled without them.
- ``graphed_callables(fn, ...)``: ``torch.cuda.make_graphed_callables`` graphs, one per input
  shape, checked against ``fn`` itself.
- ``hand_written(eager=..., graphed=..., ...)``: your own graph code, from its two calls.

All three take the same keywords for what they share: ``device``; ``keys``, the graph keys to
exercise (shapes, buckets: one is enough); ``draw(generator, case) -> inputs``, one call's inputs
for ``case.key`` (see ``Case``); ``key_of`` and ``largest_key``; and any other field of
``CudaGraphTarget`` by name: the contract the code keeps (``tolerance``, ``real_part``,
``output_lifetime``, ``threads``, ``refusal_errors``) and its capabilities (``reset_state``,
``sampler``, ``unsupported_modes``, ...). The two that graph ``fn`` for you also share ``model``
(``fn(model, ...)``, a function of a model), ``call`` (one call of the target made of calls of
the graphed step: an episode) and ``share_state``: each side runs on a model of its own (given
to the module-state check as ``side_state``) unless ``share_state=True``. torch is imported
only when a target is built.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from pytest_cudagraph.conformance.target import (
    NEXT_CALL,
    NEXT_CALL_OF_KEY,
    CudaGraphTarget,
    Inputs,
)

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Case:
    """What one draw is for: ``key``, one of the adapter's keys; ``repeat``, how many draws of
    that key came before it (shapes that vary inside a key, such as a real batch padded up to
    its bucket, come from it: two draws of one case must have the same shapes); ``number``, the
    suite's case number."""

    number: int
    key: Hashable
    repeat: int


Draw = Callable[["torch.Generator", Case], Inputs]
# call(step, model, inputs) -> outputs: one call of the target through ``step``, fn graphed (or
# not) for one side; ``model`` is that side's model (None when fn takes none).
Call = Callable[[Callable[..., Any], Any, Inputs], Any]
# Where inductor logs each CUDA graph it skips (an artifact logger: it does not propagate).
INDUCTOR_SKIP_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"
# Fields each adapter fills in itself; every other field of CudaGraphTarget may be given.
ADAPTER_FIELDS = ("device", "eager", "graphed", "make_inputs", "key_of", "num_keys", "largest_case")
# Each torch.compile mode with CUDA graphs, and the same mode without them (the eager twin).
TWIN_MODES = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}


def input_shapes(inputs: Inputs) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """The default key: each input tensor's name, shape and dtype (what a graph is fixed to)."""
    import torch

    return tuple(
        (name, tuple(value.shape), str(value.dtype))
        for name, value in inputs.items()
        if isinstance(value, torch.Tensor)
    )


def keyed_cases(
    keys: Sequence[Hashable], draw: Draw
) -> tuple[Callable[[torch.Generator, int], Inputs], int]:
    """``make_inputs(generator, number)`` drawing ``Case(number, keys[number % len(keys)],
    number // len(keys))``, and the number of keys."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"keys must be a sequence of graph keys, got {type(keys).__name__}")
    keys = list(keys)
    for index, key in enumerate(keys):
        if not isinstance(key, Hashable):
            raise TypeError(f"keys[{index}] must be hashable, got {type(key).__name__} {key!r}")
    if not keys or len(set(keys)) != len(keys):
        raise ValueError(f"keys must be at least one graph key, each once, got {keys!r}")
    if not callable(draw):
        raise TypeError(
            f"draw must be callable as draw(generator, case), got {type(draw).__name__}"
        )

    def make_inputs(generator: torch.Generator, number: int) -> Inputs:
        repeat, index = divmod(number, len(keys))
        return draw(generator, Case(number, keys[index], repeat))

    return make_inputs, len(keys)


def hand_written(
    *,
    device: torch.device,
    eager: Callable[[Inputs], Any],
    graphed: Callable[[Inputs], Any] | None,
    keys: Sequence[Hashable],
    draw: Draw,
    key_of: Callable[[Inputs], Hashable],
    largest_key: Hashable | None = None,
    **given: Any,
) -> CudaGraphTarget:
    """A target for your own graph code: ``eager(inputs)`` and ``graphed(inputs)`` (None where
    it cannot run: without CUDA). ``key_of`` is the code's own key for a call (it must tell the
    ``keys`` apart); ``largest_key`` the key whose graph is largest (for the memory check).
    Outputs are owned unless ``output_lifetime`` says otherwise."""
    cases = _cases(keys, draw, key_of, largest_key, given)
    return _target(device, eager, graphed, cases, key_of, {}, given)


def compiled(
    fn: Callable[..., Any],
    *,
    device: torch.device,
    keys: Sequence[Hashable],
    draw: Draw,
    model: Any = None,
    call: Call | None = None,
    share_state: bool = False,
    mode: str | None = "reduce-overhead",
    fullgraph: bool = False,
    dynamic: bool | None = False,
    options: Mapping[str, Any] | None = None,
    rerecord_limit: int = 0,
    key_of: Callable[[Inputs], Hashable] = input_shapes,
    largest_key: Hashable | None = None,
    **given: Any,
) -> CudaGraphTarget:
    """A target for ``fn`` under ``torch.compile`` with CUDA graphs, as your compile line has it:
    ``mode`` (or ``options``, with ``triton.cudagraphs`` set for you), ``fullgraph``,
    ``dynamic``. ``fn`` is what that line compiles (a module, a function, a function of
    ``model``), or what it returned.

    Eager is the same code compiled without CUDA graphs (``mode="default"`` for
    reduce-overhead): inductor emits the same kernels, so the graphs alone should change
    nothing. Without CUDA the graphed side is that compilation too, on its own model, so the dry
    run compiles and calls your code on the CPU. A call is ``fn(**inputs)``, ``fn(model,
    **inputs)``, or ``call(step, model, inputs)``. Outputs of cudagraph trees are valid until the
    next call (``output_lifetime="next call"``, the default here); an episode that copies them
    (``call``) may say ``owned``. A graph re-recorded more than ``rerecord_limit`` times falls
    back to eager, which the graphs-not-skipped check reports (``InductorSkips``), as it does
    every graph inductor skipped. Every call runs on one thread of the adapter, one at a time
    (cudagraph trees keep per-thread state), and each call of the graphed step (several in a
    ``call``) after ``torch.compiler.cudagraph_mark_step_begin()``.
    """
    import torch
    import torch._dynamo

    cases = _cases(keys, draw, key_of, largest_key, given)
    _check_count("rerecord_limit", rerecord_limit)
    _check_flag("fullgraph", fullgraph)
    if dynamic is not None:
        _check_flag("dynamic", dynamic)
    with_graphs, without_graphs = _compile_options(mode, options)
    original = _uncompiled(fn)
    sides = _sides(original, model, call, share_state, _default_call)
    if device.type != "cuda":  # no CUDA graphs here: the graphed side runs the twin's code
        graphed_step = torch.compile(
            sides.graphed_code, fullgraph=fullgraph, dynamic=dynamic, **without_graphs
        )
    elif fn is not original:
        graphed_step = fn  # the user's own compile line
    else:
        graphed_step = torch.compile(
            sides.graphed_code, fullgraph=fullgraph, dynamic=dynamic, **with_graphs
        )
    eager_step = torch.compile(
        sides.eager_code, fullgraph=fullgraph, dynamic=dynamic, **without_graphs
    )
    limit = 2 * len(keys) + 2  # both sides of every key, and a spare for each
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, limit)
    skips = InductorSkips()
    one_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compiled-target")

    def run_eager(inputs: Inputs) -> Any:
        with _on(device):
            return sides.run(eager_step, sides.eager_model, inputs)

    def stepped(*args: Any, **kwargs: Any) -> Any:
        # Each call of the step a step of its own, as a decode loop's calls are: cudagraph trees
        # then replay one graph per shape, whose outputs the next step may overwrite.
        if device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        return graphed_step(*args, **kwargs)

    def run_graphed(inputs: Inputs) -> Any:
        with _on(device), _rerecord_limit(rerecord_limit):
            return sides.run(stepped, sides.graphed_model, inputs)

    def eager(inputs: Inputs) -> Any:
        return one_thread.submit(run_eager, inputs).result()

    def graphed(inputs: Inputs) -> Any:
        return one_thread.submit(run_graphed, inputs).result()

    # Cudagraph trees keep every graph they record: capacity is every key.
    own = dict(
        graph_skips=skips.reasons,
        capacity=len(keys),
        output_lifetime=NEXT_CALL,
        side_state=sides.side_state,
    )
    return _target(device, eager, graphed, cases, key_of, own, given)


def graphed_callables(
    fn: Callable[..., Any],
    *,
    device: torch.device,
    keys: Sequence[Hashable],
    draw: Draw,
    model: Any = None,
    call: Call | None = None,
    share_state: bool = False,
    num_warmup_iters: int = 3,
    key_of: Callable[[Inputs], Hashable] | None = None,
    largest_key: Hashable | None = None,
    **given: Any,
) -> CudaGraphTarget:
    """A target for ``torch.cuda.make_graphed_callables`` around ``fn`` (a module or a function,
    of ``model`` when given), one graph per shape of the step's arguments, built on the first
    call of that shape from copies of its arguments, under ``torch.no_grad()``. A call is
    ``fn(*inputs.values())``, ``fn(model, *inputs.values())`` or ``call(step, model, inputs)``.

    The graphed step returns its static output buffers, which the next replay of its graph
    overwrites: ``output_lifetime="next call of its key"``, the default here. ``reset()`` drops
    every graph; without CUDA there is no graphed side (make_graphed_callables needs CUDA).
    """
    import torch

    cases = _cases(keys, draw, key_of or input_argument_shapes, largest_key, given)
    _check_count("num_warmup_iters", num_warmup_iters)
    sides = _sides(fn, model, call, share_state, _default_positional_call)
    graphs: dict[Hashable, Callable[..., Any]] = {}
    lock = threading.Lock()

    def eager_step(*args: Any) -> Any:
        return sides.eager_code(*args)

    def graphed_step(*args: Any) -> Any:
        key = argument_shapes(args)
        if key not in graphs:
            # A plain function, not the module: given a module, make_graphed_callables replaces
            # its forward. Copies of the arguments, not the caller's tensors, become the graph's
            # static inputs, which every later call of that shape copies its arguments into.
            sample = tuple(arg.clone() if isinstance(arg, torch.Tensor) else arg for arg in args)
            graphs[key] = torch.cuda.make_graphed_callables(
                lambda *args: sides.graphed_code(*args), sample, num_warmup_iters=num_warmup_iters
            )
        return graphs[key](*args)

    def eager(inputs: Inputs) -> Any:
        with torch.no_grad(), _on(device):
            return sides.run(eager_step, sides.eager_model, inputs)

    def graphed(inputs: Inputs) -> Any:
        with lock, torch.no_grad(), _on(device):
            return sides.run(graphed_step, sides.graphed_model, inputs)

    def reset() -> None:
        with lock:
            graphs.clear()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()

    # One graph per key, kept until reset.
    own: dict[str, Any] = dict(
        reset=reset,
        lock=lock,
        capacity=len(keys),
        output_lifetime=NEXT_CALL_OF_KEY,
        side_state=sides.side_state,
    )
    if call is None and key_of is None:  # the graphs' own keys are the target's keys
        own["cached_keys"] = lambda: list(graphs)
    side = graphed if device.type == "cuda" else None
    return _target(device, eager, side, cases, key_of or input_argument_shapes, own, given)


def argument_shapes(args: Sequence[Any]) -> tuple[tuple[tuple[int, ...], str], ...]:
    """Each tensor argument's shape and dtype: the key of a make_graphed_callables graph."""
    import torch

    return tuple(
        (tuple(arg.shape), str(arg.dtype)) for arg in args if isinstance(arg, torch.Tensor)
    )


def input_argument_shapes(inputs: Inputs) -> tuple[tuple[tuple[int, ...], str], ...]:
    """``argument_shapes`` of the inputs passed positionally: graphed_callables' default key."""
    return argument_shapes(tuple(inputs.values()))


class InductorSkips:
    """The CUDA graphs inductor skipped since this object was made: its skip counter, with the
    reason of each skip as inductor logs it. ``compiled()`` gives its ``reasons`` as the
    target's ``graph_skips``; code compiled outside it gives them the same way::

        skips = InductorSkips()  # before the first compiled call
        hand_written(..., graph_skips=skips.reasons)
    """

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


# What the adapters share


@dataclass(frozen=True)
class _Cases:
    make_inputs: Callable[[torch.Generator, int], Inputs]
    num_keys: int
    largest_case: int | None


def _cases(
    keys: Sequence[Hashable],
    draw: Draw,
    key_of: Callable[[Inputs], Hashable],
    largest_key: Hashable | None,
    given: Mapping[str, Any],
) -> _Cases:
    """The adapter's common keywords checked, before any work: the cases they give."""
    make_inputs, num_keys = keyed_cases(keys, draw)
    _check_callable("key_of", key_of)
    known = {field.name for field in fields(CudaGraphTarget)} - set(ADAPTER_FIELDS)
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(
            f"unknown target field(s) {', '.join(unknown)}; the fields an adapter takes by name "
            f"are {', '.join(sorted(known))}"
        )
    if largest_key is None:  # with one key, that key's graph is the largest
        return _Cases(make_inputs, num_keys, 0 if num_keys == 1 else None)
    if largest_key not in keys:
        raise ValueError(f"largest_key {largest_key!r} is not one of the keys")
    return _Cases(make_inputs, num_keys, list(keys).index(largest_key))


def _target(
    device: torch.device,
    eager: Callable[[Inputs], Any],
    graphed: Callable[[Inputs], Any] | None,
    cases: _Cases,
    key_of: Callable[[Inputs], Hashable],
    own: Mapping[str, Any],
    given: Mapping[str, Any],
) -> CudaGraphTarget:
    """The target: the adapter's fields (``own``) overridden by the user's (``given``)."""
    return CudaGraphTarget(
        device=device,
        eager=eager,
        graphed=graphed,
        make_inputs=cases.make_inputs,
        key_of=key_of,
        num_keys=cases.num_keys,
        largest_case=cases.largest_case,
        **{**own, **given},
    )


@dataclass(frozen=True)
class _Sides:
    """What the adapters that graph ``fn`` run each side on: its code and its model (None
    when fn takes none), one call through a step (the user's ``call`` or the adapter's own),
    and the modules the module-state check compares (None when the sides share them or hold
    none)."""

    graphed_code: Any
    eager_code: Any
    graphed_model: Any
    eager_model: Any
    run: Call
    side_state: Callable[[], tuple[Any, Any]] | None


def _sides(code: Any, model: Any, call: Call | None, share_state: bool, default: Call) -> _Sides:
    """Each side's code and model, checked before any is copied or built: each side's state of
    its own unless they share it. ``call`` None runs a call through ``default``."""
    _check_callable("fn", code)
    _check_call(call)
    _check_flag("share_state", share_state)
    graphed_code, eager_code, graphed_model, eager_model = _separated(code, model, share_state)
    side_state = None
    if not share_state:
        side_state = _side_state(eager_code, graphed_code, eager_model, graphed_model)
    return _Sides(graphed_code, eager_code, graphed_model, eager_model, call or default, side_state)


def _separated(code: Any, model: Any, share_state: bool) -> tuple[Any, Any, Any, Any]:
    """(graphed code, eager code, graphed model, eager model). A module ``code`` without
    ``model`` holds the state itself and is copied; with ``model``, the model is copied (a
    module) or built once per side (a zero-arg builder); a plain function without ``model`` has
    no state to separate."""
    import torch

    if model is None:
        if not isinstance(code, torch.nn.Module):
            return code, code, None, None
        return code, code if share_state else copy.deepcopy(code), None, None
    if isinstance(model, torch.nn.Module):
        return code, code, model, model if share_state else copy.deepcopy(model)
    if not callable(model):
        raise TypeError(
            f"model must be a torch.nn.Module or a zero-arg callable building one, got "
            f"{type(model).__name__}"
        )
    built = model()
    return code, code, built, built if share_state else model()


def _side_state(
    eager_code: Any, graphed_code: Any, eager_model: Any, graphed_model: Any
) -> Callable[[], tuple[Any, Any]] | None:
    """The modules each side runs on, for the module-state check: the models, or the code when
    it is a module itself; None when they hold none."""
    import torch

    if eager_model is not None:
        return lambda: (eager_model, graphed_model)
    if isinstance(eager_code, torch.nn.Module):
        return lambda: (eager_code, graphed_code)
    return None


def _compile_options(
    mode: str | None, options: Mapping[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """torch.compile's keywords with CUDA graphs and for the eager twin, without them."""
    if options is not None:
        if mode is not None:
            raise ValueError(
                "give mode or options, not both (torch.compile takes one); with options, "
                "triton.cudagraphs is set for you"
            )
        if not isinstance(options, Mapping):
            raise TypeError(f"options must be a mapping, got {type(options).__name__}")
        return (
            {"options": {**options, "triton.cudagraphs": True}},
            {"options": {**options, "triton.cudagraphs": False}},
        )
    if mode not in TWIN_MODES:
        raise ValueError(
            f"mode must be one with CUDA graphs ({', '.join(map(repr, TWIN_MODES))}), or None "
            f"with options, got {mode!r}"
        )
    return {"mode": mode}, {"mode": TWIN_MODES[mode]}


def _uncompiled(fn: Any) -> Any:
    """What a torch.compile line compiled (``fn`` itself when it is not such a result): the
    module of an OptimizedModule, the function of a compiled function."""
    for name in ("_orig_mod", "_torchdynamo_orig_callable"):
        original = getattr(fn, name, None)
        if original is not None:
            return original
    return fn


def _default_call(step: Callable[..., Any], model: Any, inputs: Inputs) -> Any:
    return step(**inputs) if model is None else step(model, **inputs)


def _default_positional_call(step: Callable[..., Any], model: Any, inputs: Inputs) -> Any:
    return step(*inputs.values()) if model is None else step(model, *inputs.values())


def _check_callable(name: str, value: object) -> None:
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")


def _check_call(call: object) -> None:
    if call is not None and not callable(call):
        raise TypeError(
            f"call must be callable as call(step, model, inputs), got {type(call).__name__}"
        )


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def _on(device: torch.device) -> Any:
    """The device as current while a call runs, and the thread's stream on it as it was after
    it (a capture that fails inside torch.cuda.graph leaves its stream current); a no-op on the
    CPU."""
    import torch

    if device.type != "cuda":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.cuda.device(device))
    stack.enter_context(torch.cuda.stream(torch.cuda.current_stream(device)))
    return stack


def _rerecord_limit(limit: int) -> Any:
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.triton, "cudagraph_unexpected_rerecord_limit"):
        return contextlib.nullcontext()  # torch without the limit: re-records are not bounded
    return inductor_config.patch({"triton.cudagraph_unexpected_rerecord_limit": limit})
