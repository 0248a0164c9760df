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
import gc
import logging
import sys
import threading
import types
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

from pytest_cudagraph.conformance import _validation as valid
from pytest_cudagraph.conformance._protocol import (
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
    graphs_on,
    spelled_names,
    translated,
)

if TYPE_CHECKING:
    import torch
    from typing_extensions import Unpack

__all__ = ["InductorSkips", "compiled", "graphed_callables", "hand_written"]

Draw = Callable[["torch.Generator", Case], Inputs]
# call(step, model, inputs) -> outputs: one call of the target through ``step``, fn graphed (or
# not) for one side; ``model`` is that side's model (None when fn takes none).
Call = Callable[[Callable[..., object], object, Inputs], object]
# Where inductor logs each CUDA graph it skips (an artifact logger: it does not propagate).
INDUCTOR_SKIP_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"
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
    key_of: Callable[[Inputs], Hashable] | None = None,
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

    _check_device("compiled", device)
    keys = valid.checked_keys(keys)
    valid.require_callable("compiled: draw", draw)
    valid.require_callable("compiled: key_of", key_of, optional=True)
    valid.require_count("compiled: rerecord_limit", rerecord_limit, low=0)
    valid.require_flag("compiled: fullgraph", fullgraph)
    if dynamic is not None:
        valid.require_flag("compiled: dynamic", dynamic)
    with_graphs, without_graphs = _compile_options(mode, options)
    original = _uncompiled(fn)
    sides = _sides("compiled", original, model, call, share_state, _default_call)
    graphed_step: Callable[..., object]
    if fn is not original and device.type == "cuda":
        graphed_step = fn  # the user's own compile line
    else:  # without CUDA graphs the graphed side runs the twin's options
        graphed_step = torch.compile(
            _with_code_of_its_own(sides.graphed_code),
            fullgraph=fullgraph,
            dynamic=dynamic,
            **(with_graphs if device.type == "cuda" else without_graphs),
        )
        if device.type != "cuda" and graphs_on(device):
            graphed_step = TreesEmulation(graphed_step)
    eager_step = torch.compile(
        sides.eager_code, fullgraph=fullgraph, dynamic=dynamic, **without_graphs
    )
    # Room for a variant of every key on each side, and a spare, on top of what earlier targets
    # compiled of the eager side's code, which every target of the same code shares.
    torch._dynamo.config.cache_size_limit += 2 * len(keys) + 2
    skips = InductorSkips()

    def run_eager(inputs: Inputs) -> object:
        with _on(device), pinned_kernel_choices():
            return sides.run(eager_step, sides.eager_model, inputs)

    def stepped(*args: object, **kwargs: object) -> object:
        # Each call of the step a step of its own, as a decode loop's calls are: cudagraph trees
        # then replay one graph per shape, whose outputs the next step may overwrite.
        if device.type == "cuda":
            cast("Callable[[], None]", torch.compiler.cudagraph_mark_step_begin)()  # unannotated
        return graphed_step(*args, **kwargs)

    def run_graphed(inputs: Inputs) -> object:
        with _on(device), _rerecord_limit(rerecord_limit), pinned_kernel_choices():
            return sides.run(stepped, sides.graphed_model, inputs)

    def eager(inputs: Inputs) -> object:
        return on_compiled_targets_thread(run_eager, inputs)

    def graphed(inputs: Inputs) -> object:
        return on_compiled_targets_thread(run_graphed, inputs)

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
    key = key_of or KeyByShapes(keys, draw, device, input_shapes)
    return _target("compiled", device, eager, graphed, keys, draw, key, own, fields)


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

    _check_device("graphed_callables", device)
    keys = valid.checked_keys(keys)
    valid.require_callable("graphed_callables: draw", draw)
    valid.require_callable("graphed_callables: key_of", key_of, optional=True)
    valid.require_count("graphed_callables: num_warmup_iters", num_warmup_iters, low=0)
    sides = _sides("graphed_callables", fn, model, call, share_state, _default_positional_call)
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
    key = key_of or KeyByShapes(keys, draw, device, input_argument_shapes)
    # The graphs are keyed by their arguments' shapes: the target's keys where the adapter keys
    # the calls itself.
    own_keys = None
    if isinstance(key, KeyByShapes) and call is None:
        by_shapes = key
        own_keys = lambda: [by_shapes.of_shapes(shapes) for shapes in graphs]  # noqa: E731
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
    side = graphed if graphs_on(device) else None
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


class KeyByShapes:
    """The adapters' default ``key_of``: the one of ``keys`` whose draw has these inputs' shapes
    and dtypes (``shapes(inputs)``, what a graph is fixed to), learned on first use by drawing
    each key once; inputs of shapes no key's draw has get their shapes as their key (which is
    none of the keys: the contract check names it)."""

    def __init__(
        self,
        keys: Sequence[Hashable],
        draw: Draw,
        device: torch.device,
        shapes: Callable[[Inputs], Hashable],
    ) -> None:
        self.keys, self.draw, self.device, self.shapes = keys, draw, device, shapes
        self._by_shapes: dict[Hashable, Hashable] | None = None

    def __call__(self, inputs: Inputs) -> Hashable:
        return self.of_shapes(self.shapes(inputs))

    def of_shapes(self, shapes: Hashable) -> Hashable:
        """The key whose draw has ``shapes`` (``shapes`` itself where none has)."""
        import torch

        if self._by_shapes is None:
            generator = torch.Generator(self.device)
            self._by_shapes = {
                self.shapes(self.draw(generator.manual_seed(0), Case(number, key, 0))): key
                for number, key in enumerate(self.keys)
            }
        return self._by_shapes.get(shapes, shapes)


class InductorSkips:
    """The CUDA graphs inductor skipped since this object was made: its skip counter, with the
    reason of each skip as inductor logs it. ``compiled()`` gives its ``reasons`` as the
    target's ``graph_skips``; code compiled outside it gives them the same way::

        skips = InductorSkips()  # before the first compiled call
        hand_written(..., fallbacks=Fallbacks(graph_skips=skips.reasons))
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
    and another release's spelling is translated where a layer on top accepts it."""
    known = set(TargetOptions.__annotations__)
    unknown = sorted(set(given) - known - spelled_names())
    if unknown:
        raise TypeError(
            f"{adapter}() got unknown field(s) {', '.join(unknown)}; it takes by name "
            f"{', '.join(sorted(known))}"
        )
    core = dict(device=device, eager=eager, graphed=graphed, keys=keys, draw=draw, key_of=key_of)
    fields: dict[str, object] = {**own}
    for name, value in translated(adapter, {**core, **given}).items():
        mine = fields.get(name)
        if isinstance(mine, Capability) and isinstance(value, type(mine)):
            value = dataclasses.replace(mine, **{f: getattr(value, f) for f in value.given()})
        fields[name] = value
    return CudaGraphTarget(**fields)  # type: ignore[arg-type]


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
    adapter: str,
    code: Callable[..., object],
    model: object,
    call: Call | None,
    share_state: bool,
    default: Call,
) -> _Sides:
    """Each side's code and model, checked before any is copied or built: each side's state of
    its own unless they share it. ``call`` None runs a call through ``default``."""
    valid.require_callable(f"{adapter}: fn", code)
    valid.require_callable(f"{adapter}: call (call(step, model, inputs))", call, optional=True)
    valid.require_flag(f"{adapter}: share_state", share_state)
    graphed_code, eager_code, graphed_model, eager_model = _separated(
        adapter, code, model, share_state
    )
    side_state = None
    if not share_state:
        side_state = _side_state(eager_code, graphed_code, eager_model, graphed_model)
    return _Sides(graphed_code, eager_code, graphed_model, eager_model, call or default, side_state)


def _separated(
    adapter: str, code: Callable[..., object], model: object, share_state: bool
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
            f"{adapter}: model must be a torch.nn.Module or a zero-arg callable building one, "
            f"got {type(model).__name__}"
        )
    built = _built(adapter, model)
    if share_state:
        return code, code, built, built
    other = _built(adapter, model)
    if other is built:
        raise ValueError(
            f"{adapter}: model() returned the same module twice: each side needs one of its "
            "own (build a new module on each call, or give share_state=True)"
        )
    return code, code, built, other


def _built(adapter: str, model: Callable[[], object]) -> object:
    """What the zero-arg builder ``model`` returns: a torch.nn.Module, else a TypeError."""
    import torch

    built = model()
    if not isinstance(built, torch.nn.Module):
        raise TypeError(
            f"{adapter}: model() must build a torch.nn.Module, got {type(built).__name__}"
        )
    return built


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
        return held_by_nobody
    return lambda: {**dict(module.named_parameters()), **dict(module.named_buffers())}


def held_by_nobody() -> dict[str, object]:
    """``Cache.static`` of code that holds no tensor its graphs read (cudagraph trees over a
    function of its arguments alone: they copy every argument into buffers of their own)."""
    return {}


def _compile_options(
    mode: str | None, options: Mapping[str, object] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """torch.compile's keywords with CUDA graphs and for the eager twin, without them."""
    if options is not None:
        if mode is not None:
            raise ValueError(
                "compiled: give mode or options, not both (torch.compile takes one); with "
                "options, triton.cudagraphs is set for you"
            )
        valid.require_string_keys("compiled: options", options)
        return (
            {"options": {**options, "triton.cudagraphs": True}},
            {"options": {**options, "triton.cudagraphs": False}},
        )
    if mode not in TWIN_MODES:
        raise ValueError(
            f"compiled: mode must be one with CUDA graphs ({', '.join(map(repr, TWIN_MODES))}), "
            f"or None with options, got {mode!r}"
        )
    return {"mode": mode}, {"mode": TWIN_MODES[mode]}


def pinned_kernel_choices() -> contextlib.AbstractContextManager[object]:
    """Inductor told to choose no kernel configuration by benchmarking it where the choice
    changes numbers (its ``deterministic`` mode, where torch has it): two compilations of the
    same code, one with CUDA graphs and one without, then run the same kernels whatever the
    machine's load, and their answers agree bit for bit. Compilation happens on a first call,
    so the calls of both sides run inside it."""
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config, "deterministic"):
        return contextlib.nullcontext()  # an older torch: a target pins its choices itself
    return _inductor_patch({"deterministic": True})


class TreesEmulation:
    """cudagraph trees' contract around a compiled step where CUDA graphs are emulated on the
    CPU (there torch.compile makes no graphs, and inductor's CPU kernels are out of an emulated
    capture's sight): per shape of the step's tensor arguments the first call is a warm-up,
    the second records a graph (an emulated capture, replayed by each call from then on) and
    every call runs the step; each call's outputs are garbage once the next call begins
    (valid until the next call, as outputs in trees' one pool are), but for those that share
    memory with an argument or a module's parameter or buffer."""

    def __init__(self, step: Callable[..., object]) -> None:
        self.step = step
        self.calls: dict[Hashable, int] = {}
        self.graphs: dict[Hashable, object] = {}
        self.last: list[torch.Tensor] = []

    def __call__(self, *args: object, **kwargs: object) -> object:
        import torch

        from pytest_cudagraph.engines import trees

        kept = _static_storages([*args, *kwargs.values()])
        for tensor in self.last:
            if tensor.untyped_storage().data_ptr() not in kept:
                tensor.fill_(_garbage(tensor))
        key = tuple(
            (path, tuple(tensor.shape), tensor.dtype)
            for path, tensor in trees.tensors([list(args), kwargs])
        )
        self.calls[key] = self.calls.get(key, 0) + 1
        if self.calls[key] == 2:  # trees record a shape's graph on its second call
            graph = self.graphs[key] = torch.cuda.CUDAGraph()
            graph.capture_begin()
            graph.capture_end()
        if key in self.graphs:
            self.graphs[key].replay()  # type: ignore[attr-defined]
        output = self.step(*args, **kwargs)
        self.last = [tensor for _, tensor in trees.tensors(output)]
        return output


def _static_storages(arguments: Sequence[object]) -> set[int]:
    """Where the tensors among ``arguments`` and their modules' parameters and buffers lie."""
    import torch

    from pytest_cudagraph.engines import trees

    found = []
    for argument in arguments:
        if isinstance(argument, torch.nn.Module):
            found += [*argument.parameters(), *argument.buffers()]
        elif not callable(argument):
            found += [tensor for _, tensor in trees.tensors(argument)]
    return {tensor.untyped_storage().data_ptr() for tensor in found}


def _garbage(tensor: torch.Tensor) -> float | int | bool:
    """What an output in trees' pool holds once the next call overwrote it: NaN, or the
    largest value of an integer type."""
    import torch

    if tensor.is_floating_point() or tensor.is_complex():
        return float("nan")
    if tensor.dtype == torch.bool:
        return True
    return torch.iinfo(tensor.dtype).max


# The one thread every compiled() target runs on, started at the first call. Cudagraph trees
# keep their state in the thread they were first used on, and on torch 2.11 a function first
# graphed on another thread fails an assertion there (get_obj in cudagraph_trees): a fresh
# target compiles new functions.
_compiled_targets_thread: list[ThreadPoolExecutor] = []
_thread_lock = threading.Lock()


def on_compiled_targets_thread(call: Callable[..., object], *args: object) -> object:
    """``call(*args)`` on the compiled targets' thread, its answer or its error."""
    with _thread_lock:
        if not _compiled_targets_thread:
            made = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compiled-targets")
            _compiled_targets_thread.append(made)
        thread = _compiled_targets_thread[0]
    return thread.submit(call, *args).result()


def release_compiled_targets() -> None:
    """The compiled targets' graphs let go on their own thread, then the thread ended: cudagraph
    trees keep their graphs in that thread's state, which only a reset on it clears, and graphs
    left to the interpreter's exit are destroyed after CUDA's teardown (a SIGSEGV at exit). A
    later compiled target starts the thread again."""
    with _thread_lock:
        if not _compiled_targets_thread:
            return
        thread = _compiled_targets_thread.pop()
    try:
        thread.submit(_reset_cudagraph_trees).result()
    finally:
        thread.shutdown(wait=True)
    gc.collect()


def _reset_cudagraph_trees() -> None:
    """This thread's cudagraph trees reset (where inductor was imported: nothing else made any),
    and what dynamo compiled dropped."""
    trees_module = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees_module is not None:
        trees_module.reset_cudagraph_trees()
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


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
        original: Callable[..., object] | None = getattr(fn, name, None)
        if original is not None:
            return original
    return fn


def _default_call(step: Callable[..., object], model: object, inputs: Inputs) -> object:
    return step(**inputs) if model is None else step(model, **inputs)


def _default_positional_call(step: Callable[..., object], model: object, inputs: Inputs) -> object:
    return step(*inputs.values()) if model is None else step(model, *inputs.values())


def _check_device(adapter: str, device: object) -> None:
    import torch

    if not isinstance(device, torch.device):
        spelled = f" (write torch.device({device!r}))" if isinstance(device, str) else ""
        raise TypeError(f"{adapter}: device must be a torch.device, got {device!r}{spelled}")


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
    return _inductor_patch({"triton.cudagraph_unexpected_rerecord_limit": limit})


def _inductor_patch(changes: dict[str, object]) -> contextlib.AbstractContextManager[object]:
    """inductor's config with ``changes`` made while the context is open: its
    ``config.patch``, whose result torch's stub leaves unannotated (a ContextDecorator)."""
    import torch._inductor.config as inductor_config

    return cast("contextlib.AbstractContextManager[object]", inductor_config.patch(changes))
