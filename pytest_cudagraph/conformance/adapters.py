"""Conformance targets for the usual kinds of CUDA-graph code, from a few lines of the user's.

- ``compiled(fn, ...)``: code under ``torch.compile`` with CUDA graphs (``mode="reduce-overhead"``,
  inductor's cudagraph trees), checked against the same code compiled without them.
- ``graphed_callables(fn, ...)``: ``torch.cuda.make_graphed_callables`` graphs, one per input
  shape, checked against ``fn`` itself.
- ``hand_written(eager=..., graphed=..., ...)``: your own graph code, from its two calls.

All three take the target's core by the same names (``device``, ``keys``, ``draw``, ``key_of``)
and, by name, its contract and its capabilities (``tolerance=...``, ``cache=Cache(...)``,
``sampling=Sampling(...)``: ``TargetOptions``); what an adapter knows itself (a capacity, the
graph skips, each side's modules) is merged under what you give. The two that graph ``fn`` for
you also take ``model``, ``call`` and ``share_state``. torch is imported when a target is made.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import threading
import types
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from pytest_cudagraph.conformance import legacy
from pytest_cudagraph.conformance.protocol import (
    CAPABILITIES,
    NEXT_CALL,
    NEXT_CALL_OF_KEY,
    Cache,
    Capability,
    Case,
    CudaGraphTarget,
    Fallbacks,
    Inputs,
    State,
    TargetOptions,
    checked_keys,
)

if TYPE_CHECKING:
    import torch
    from typing_extensions import Unpack

__all__ = [
    "Case",
    "InductorSkips",
    "argument_shapes",
    "compiled",
    "graphed_callables",
    "hand_written",
    "input_argument_shapes",
    "input_shapes",
]

Draw = Callable[["torch.Generator", Case], Inputs]
# call(step, model, inputs) -> outputs: one call of the target through ``step``, fn graphed (or
# not) for one side; ``model`` is that side's model (None when fn takes none).
Call = Callable[[Callable[..., object], object, Inputs], object]
# Where inductor logs each CUDA graph it skips (an artifact logger: it does not propagate).
INDUCTOR_SKIP_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"
# Each torch.compile mode with CUDA graphs, and the same mode without them (the eager twin).
TWIN_MODES = {"reduce-overhead": "default", "max-autotune": "max-autotune-no-cudagraphs"}
# 0.3.0's adapters took the largest key by itself; it is the cache's now.
OLD_ADAPTER_FIELDS = {**legacy.OLD_FIELDS, "largest_key": ("cache", "largest_key")}


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
    eager: Callable[[Inputs], object],
    graphed: Callable[[Inputs], object] | None,
    keys: Sequence[Hashable],
    draw: Draw,
    key_of: Callable[[Inputs], Hashable],
    **fields: Unpack[TargetOptions],
) -> CudaGraphTarget:
    """A target for your own graph code: ``eager(inputs)`` and ``graphed(inputs)`` (None where
    it cannot run: without CUDA). ``key_of`` is the code's own key for a call (it must tell the
    ``keys`` apart). Outputs are owned unless ``output_lifetime`` says otherwise."""
    return _target("hand_written", device, eager, graphed, keys, draw, key_of, {}, fields)


def compiled(
    fn: Callable[..., object],
    *,
    device: torch.device,
    keys: Sequence[Hashable],
    draw: Draw,
    model: object = None,
    call: Call | None = None,
    share_state: bool = False,
    mode: str | None = "reduce-overhead",
    fullgraph: bool = False,
    dynamic: bool | None = False,
    options: Mapping[str, object] | None = None,
    rerecord_limit: int = 0,
    key_of: Callable[[Inputs], Hashable] = input_shapes,
    **fields: Unpack[TargetOptions],
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
    every graph inductor skipped. Each target compiles its graphed side afresh, so that its graphs
    are its own to cudagraph trees. Every call of every target runs on one thread the adapter
    keeps, one at a time (cudagraph trees keep per-thread state), and each call of the graphed
    step (several in a ``call``) after ``torch.compiler.cudagraph_mark_step_begin()``.
    """
    import torch
    import torch._dynamo

    keys = checked_keys(keys)
    _check_callable("draw", draw)
    _check_callable("key_of", key_of)
    _check_count("rerecord_limit", rerecord_limit)
    _check_flag("fullgraph", fullgraph)
    if dynamic is not None:
        _check_flag("dynamic", dynamic)
    with_graphs, without_graphs = _compile_options(mode, options)
    original = _uncompiled(fn)
    sides = _sides(original, model, call, share_state, _default_call)
    if fn is not original and device.type == "cuda":
        graphed_step = fn  # the user's own compile line
    else:  # without CUDA graphs the graphed side runs the twin's options
        graphed_step = torch.compile(
            _with_code_of_its_own(sides.graphed_code),
            fullgraph=fullgraph,
            dynamic=dynamic,
            **(with_graphs if device.type == "cuda" else without_graphs),
        )
    eager_step = torch.compile(
        sides.eager_code, fullgraph=fullgraph, dynamic=dynamic, **without_graphs
    )
    # Room for a variant of every key on each side, and a spare, on top of what earlier targets
    # compiled of the eager side's code, which every target of the same code shares.
    torch._dynamo.config.cache_size_limit += 2 * len(keys) + 2
    skips = InductorSkips()

    def run_eager(inputs: Inputs) -> object:
        with _on(device):
            return sides.run(eager_step, sides.eager_model, inputs)

    def stepped(*args: object, **kwargs: object) -> object:
        # Each call of the step a step of its own, as a decode loop's calls are: cudagraph trees
        # then replay one graph per shape, whose outputs the next step may overwrite.
        if device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        return graphed_step(*args, **kwargs)

    def run_graphed(inputs: Inputs) -> object:
        with _on(device), _rerecord_limit(rerecord_limit):
            return sides.run(stepped, sides.graphed_model, inputs)

    def eager(inputs: Inputs) -> object:
        return _COMPILED_TARGETS_THREAD.submit(run_eager, inputs).result()

    def graphed(inputs: Inputs) -> object:
        return _COMPILED_TARGETS_THREAD.submit(run_graphed, inputs).result()

    # Cudagraph trees keep every graph they record: capacity is every key.
    own: TargetOptions = dict(
        output_lifetime=NEXT_CALL,
        cache=Cache(
            capacity=len(keys), largest_key=_only(keys), static=_trees_static_inputs(sides)
        ),
        fallbacks=Fallbacks(graph_skips=skips.reasons),
    )
    if sides.side_state is not None:
        own["state"] = State(sides=sides.side_state)
    return _target("compiled", device, eager, graphed, keys, draw, key_of, own, fields)


def graphed_callables(
    fn: Callable[..., object],
    *,
    device: torch.device,
    keys: Sequence[Hashable],
    draw: Draw,
    model: object = None,
    call: Call | None = None,
    share_state: bool = False,
    num_warmup_iters: int = 3,
    key_of: Callable[[Inputs], Hashable] | None = None,
    **fields: Unpack[TargetOptions],
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

    keys = checked_keys(keys)
    _check_callable("draw", draw)
    _check_callable("key_of", key_of or input_argument_shapes)
    _check_count("num_warmup_iters", num_warmup_iters)
    sides = _sides(fn, model, call, share_state, _default_positional_call)
    graphs: dict[Hashable, Callable[..., object]] = {}
    lock = threading.Lock()

    def eager_step(*args: object) -> object:
        return sides.eager_code(*args)

    def graphed_step(*args: object) -> object:
        key = argument_shapes(args)
        if key not in graphs:
            # A plain function, not the module: given a module, make_graphed_callables replaces
            # its forward. Copies of the arguments, not the caller's tensors, become the graph's
            # static inputs, which every later call of that shape copies its arguments into.
            sample = tuple(arg.clone() if isinstance(arg, torch.Tensor) else arg for arg in args)
            graphs[key] = torch.cuda.make_graphed_callables(
                lambda *args: sides.graphed_code(*args),
                cast("tuple[torch.Tensor, ...]", sample),  # its own check names a non-tensor
                num_warmup_iters=num_warmup_iters,
            )
        return graphs[key](*args)

    def eager(inputs: Inputs) -> object:
        with torch.no_grad(), _on(device):
            return sides.run(eager_step, sides.eager_model, inputs)

    def graphed(inputs: Inputs) -> object:
        with lock, torch.no_grad(), _on(device):
            return sides.run(graphed_step, sides.graphed_model, inputs)

    def reset() -> None:
        with lock:
            graphs.clear()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.empty_cache()

    # One graph per key, kept until reset; its keys are the target's when the adapter keys it.
    own_keys = (lambda: list(graphs)) if call is None and key_of is None else None
    own: TargetOptions = dict(
        output_lifetime=NEXT_CALL_OF_KEY,
        cache=Cache(
            reset=reset,
            lock=lock,
            capacity=len(keys),
            largest_key=_only(keys),
            cached_keys=own_keys,
        ),
    )
    if sides.side_state is not None:
        own["state"] = State(sides=sides.side_state)
    side = graphed if device.type == "cuda" else None
    key = key_of or input_argument_shapes
    return _target("graphed_callables", device, eager, side, keys, draw, key, own, fields)


def argument_shapes(args: Sequence[object]) -> tuple[tuple[tuple[int, ...], str], ...]:
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


def _target(
    adapter: str,
    device: torch.device,
    eager: Callable[[Inputs], object],
    graphed: Callable[[Inputs], object] | None,
    keys: Sequence[Hashable],
    draw: Draw,
    key_of: Callable[[Inputs], Hashable],
    own: TargetOptions,
    given: Mapping[str, object],
) -> CudaGraphTarget:
    """The target: the adapter's own fields (``own``) under the user's (``given``), each
    capability merged field by field; an unknown name is a TypeError listing the known ones,
    and 0.3.0's flat fields are translated (with a DeprecationWarning)."""
    known = set(TargetOptions.__annotations__)
    unknown = sorted(set(given) - known - OLD_ADAPTER_FIELDS.keys())
    if unknown:
        raise TypeError(
            f"{adapter}() got unknown field(s) {', '.join(unknown)}; it takes by name "
            f"{', '.join(sorted(known))}"
        )
    classes = {kind.SLOT: kind for kind in CAPABILITIES}
    if OLD_ADAPTER_FIELDS.keys() & given.keys():
        given = legacy.upgraded(adapter, given, classes, OLD_ADAPTER_FIELDS)
    fields = TargetOptions(**own)
    for name, value in given.items():
        mine = fields.get(name)
        if isinstance(mine, Capability) and isinstance(value, type(mine)):
            value = dataclasses.replace(  # type: ignore[type-var]
                mine, **{f: getattr(value, f) for f in value.given()}
            )
        fields[name] = value  # type: ignore[literal-required]
    return CudaGraphTarget(
        device=device, eager=eager, graphed=graphed, keys=keys, draw=draw, key_of=key_of, **fields
    )


@dataclasses.dataclass(frozen=True)
class _Sides:
    """What the adapters that graph ``fn`` run each side on: its code and its model (None
    when fn takes none), one call through a step (the user's ``call`` or the adapter's own),
    and what holds each side's state (None when the sides share it or hold none)."""

    graphed_code: Callable[..., object]
    eager_code: Callable[..., object]
    graphed_model: object
    eager_model: object
    run: Call
    side_state: Callable[[], tuple[object, object]] | None


def _sides(
    code: Callable[..., object], model: object, call: Call | None, share_state: bool, default: Call
) -> _Sides:
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


def _separated(
    code: Callable[..., object], model: object, share_state: bool
) -> tuple[Callable[..., object], Callable[..., object], object, object]:
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
    eager_code: object, graphed_code: object, eager_model: object, graphed_model: object
) -> Callable[[], tuple[object, object]] | None:
    """What holds each side's state (``State.sides``): the models, or the code when it is a
    module itself; None when they hold none. Their state is every buffer a call writes, and
    every tensor and number attribute, tensors in lists and dicts too (engines.state), so every
    check that compares the sides keeps them in step and compares them after each call."""
    import torch

    if eager_model is not None:
        return lambda: (eager_model, graphed_model)
    if isinstance(eager_code, torch.nn.Module):
        return lambda: (eager_code, graphed_code)
    return None


def _trees_static_inputs(sides: _Sides) -> Callable[[], dict[str, object]]:
    """What cudagraph trees read at the addresses they captured: the parameters and buffers of
    the graphed side's module (every other input they copy into buffers of their own)."""
    import torch

    module = next(
        (m for m in (sides.graphed_model, sides.graphed_code) if isinstance(m, torch.nn.Module)),
        None,
    )
    if module is None:
        return dict
    return lambda: {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _compile_options(
    mode: str | None, options: Mapping[str, object] | None
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


# The one thread every compiled() target runs on. Cudagraph trees keep their state in the thread
# they were first used on, and on torch 2.11 a function first graphed on another thread fails
# an assertion there (get_obj in cudagraph_trees): a fresh target compiles new functions.
_COMPILED_TARGETS_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compiled-targets")


def _only(keys: Sequence[Hashable]) -> Hashable | None:
    """The largest key where the user gives none: with one key, its graph is the largest."""
    return keys[0] if len(keys) == 1 else None


def _with_code_of_its_own(step: Callable[..., object]) -> Callable[..., object]:
    """``step`` called through a function whose code object is this target's alone. Dynamo keeps
    what it compiled on the code object, and cudagraph trees know a graph by the compilation it
    came from: a fresh target (the witness builds some) sharing an earlier target's code would
    replay that compilation on its own parameters, which trees record only as a re-record, past
    ``rerecord_limit`` a fall back to eager. Its own code compiles its own graphs."""

    def around(*args: object, **kwargs: object) -> object:  # for a module or another callable
        return step(*args, **kwargs)

    function = step if isinstance(step, types.FunctionType) else around
    copy = types.FunctionType(
        function.__code__.replace(),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy


def _uncompiled(fn: Callable[..., object]) -> Callable[..., object]:
    """What a torch.compile line compiled (``fn`` itself when it is not such a result): the
    module of an OptimizedModule, the function of a compiled function."""
    for name in ("_orig_mod", "_torchdynamo_orig_callable"):
        original = getattr(fn, name, None)
        if original is not None:
            return original
    return fn


def _default_call(step: Callable[..., object], model: object, inputs: Inputs) -> object:
    return step(**inputs) if model is None else step(model, **inputs)


def _default_positional_call(step: Callable[..., object], model: object, inputs: Inputs) -> object:
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


def _on(device: torch.device) -> contextlib.AbstractContextManager[object]:
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


def _rerecord_limit(limit: int) -> contextlib.AbstractContextManager[object]:
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config.triton, "cudagraph_unexpected_rerecord_limit"):
        return contextlib.nullcontext()  # torch without the limit: re-records are not bounded
    return inductor_config.patch({"triton.cudagraph_unexpected_rerecord_limit": limit})
