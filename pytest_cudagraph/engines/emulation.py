"""CUDA graphs emulated on the CPU, so that graph code and its bugs are tested without a GPU.

``emulated_graphs()`` puts stand-ins on ``torch.cuda`` (and ``torch.cuda.graphs``) while open:
``CUDAGraph``, ``graph``, ``graph_pool_handle``, ``make_graphed_callables`` (torch's own, run
over the stand-ins) and what capture code calls around them (streams, events, ``synchronize``,
``device``, the generator's state: the CPU's). Code written for a GPU then runs on CPU tensors as under a graph: a capture
(``GraphRecorder``, emulate mode) executes nothing, refuses host syncs and leaves garbage in
what it allocated; a replay re-runs the recorded ops on the recorded memory with the captured
scalars, into the same output tensors, drawing from the generators' states at replay, and
refuses to run once an external input was freed.
Limits: no memory reuse between the graphs of one pool (out-of-order replay corruption lives
in the allocator); no real streams or concurrency; other threads' calls during a "global"
capture are unseen (the dispatch mode is per thread); torch.compile's "reduce-overhead" is out
of reach (inductor's CPU kernels bypass dispatch). torch is imported when used.
"""

from __future__ import annotations

import gc
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, cast

from pytest_cudagraph.engines.graph_recorder import (
    DEAD_TENSOR,
    INVALIDATED,
    NOT_PERMITTED,
    CaptureRecord,
    GraphRecorder,
    TensorRef,
)

if TYPE_CHECKING:
    import types

    import torch

    Device = int | str | torch.device | None

PoolHandle = tuple[int, int]
CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")


class _ThreadState(threading.local):
    """Per thread, as CUDA keeps them: the open capture, the current stream and device."""

    capture: CUDAGraph | None = None
    stream: Stream | None = None
    device_index: int = 0


_thread = _ThreadState()
_stream_ids = itertools.count(1)
_pool_ids = itertools.count(1)
_pools: dict[PoolHandle, weakref.WeakSet[CUDAGraph]] = {}
_lock = threading.Lock()


def _refuse_in_capture(what: str) -> None:
    """Raise as CUDA does when the host waits for the device during this thread's capture,
    invalidating the capture."""
    capture = _thread.capture
    if capture is not None and capture.recorder is not None:
        raise capture.recorder.invalidate(what)


class CUDAGraph:
    """Stand-in for ``torch.cuda.CUDAGraph``. After a capture, ``record`` is what it recorded
    and ``pool_bytes`` the bytes it allocated."""

    def __init__(self, keep_graph: bool = False) -> None:
        self.keep_graph = keep_graph
        self.record: CaptureRecord | None = None
        self.recorder: GraphRecorder | None = None  # while capturing
        self._pool: PoolHandle | None = None

    def capture_begin(
        self,
        pool: PoolHandle | None = None,
        capture_error_mode: str = "global",
        check_input_liveness: bool = False,
    ) -> None:
        """Begin capturing this thread's ops. Every mode is emulated alike, and input liveness
        is always checked (a freed input is what a real replay would read as garbage)."""
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise RuntimeError(
                f"Unknown capture_error_mode {capture_error_mode!r}: expected one of "
                f"{', '.join(CAPTURE_ERROR_MODES)}"
            )
        if self.record is not None:
            raise RuntimeError(
                "This CUDAGraph instance already owns a captured graph. To capture a new "
                "graph, create a new instance (or reset() this one)."
            )
        if _thread.capture is not None:
            raise RuntimeError(
                f"CUDA error: {NOT_PERMITTED} (emulated: a capture is already underway on "
                "this thread)"
            )
        self._pool = pool if pool is not None else (next(_pool_ids), 0)
        self.recorder = GraphRecorder(emulate=True)
        self.recorder.start()
        _thread.capture = self

    def capture_end(self) -> None:
        """End the capture; raises as CUDA does when the capture was invalidated (a host sync
        in it), leaving the graph uncaptured."""
        if _thread.capture is not self or self.recorder is None:
            raise RuntimeError("capture_end() without this graph's capture_begin() on this thread")
        recorder, self.recorder = self.recorder, None
        _thread.capture = None
        record = recorder.stop()
        if record.error:
            raise RuntimeError(f"CUDA error: {INVALIDATED} (emulated: {record.error})")
        self.record = record
        with _lock:
            for handle in [handle for handle, graphs in _pools.items() if not graphs]:
                del _pools[handle]  # pools whose graphs are all gone
            _pools.setdefault(self.pool(), weakref.WeakSet()).add(self)

    def replay(self) -> None:
        """Run the recorded kernels again on the recorded memory (see ``replay``)."""
        if self.record is None:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        replay(self.record)

    def instantiate(self) -> None:
        """Nothing to instantiate once captured."""
        if self.record is None:
            raise RuntimeError("instantiate() needs a successful capture first")

    def reset(self) -> None:
        """Drop the captured graph and its memory; the instance may capture again."""
        self.record = None

    def pool(self) -> PoolHandle:
        """The handle of this graph's memory pool, for another capture to share."""
        if self._pool is None:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding capture_begin.")
        return self._pool

    @property
    def pool_bytes(self) -> int:
        return self.record.pool_bytes if self.record is not None else 0


def replay(record: CaptureRecord) -> None:
    """Run ``record``'s kernels in order on the recorded memory: in-place and ``out=`` ops as
    recorded, ops that allocated their outputs again into those same outputs, views and
    uninitialised allocations not at all; scalars as captured, random ops from their
    generators' states now. RuntimeError naming each external input freed since the capture."""
    import torch
    from torch.utils._pytree import tree_leaves, tree_map_only

    dead = record.dead_inputs()
    if dead:
        raise RuntimeError(
            f"{DEAD_TENSOR} {len(dead)} dead tensor(s) (emulated: memory the graph "
            "reads or writes was freed since the capture): "
            + "; ".join(storage.describe() for storage in dead)
        )
    rebuilt: dict[int, torch.Tensor] = {}

    def tensor(ref: TensorRef) -> torch.Tensor:
        if id(ref) not in rebuilt:
            value = ref.tensor()
            if value is None:  # freed by a garbage collection since the check
                raise RuntimeError(f"dead tensor during replay: {ref.storage.describe()}")
            rebuilt[id(ref)] = value
        return rebuilt[id(ref)]

    # The recorded ops are below autocast already (a replay runs no Python, so no autocast
    # region around it counts); the rebuilt tensors require no grad, so autograd records none.
    with torch.autocast("cpu", enabled=False):
        for op in record.ops:
            if not op.kernel:
                continue
            args = tree_map_only(TensorRef, tensor, op.args)
            kwargs = tree_map_only(TensorRef, tensor, op.kwargs)
            leaves = tree_leaves(op.func(*args, **kwargs))
            for index, ref in op.fresh:
                tensor(ref).copy_(leaves[index])


def graph_pool_handle() -> PoolHandle:
    """A new memory pool's handle, for several captures to share."""
    return (0, next(_pool_ids))


def pool_bytes(pool: PoolHandle) -> int:
    """Bytes allocated by the captured graphs (not reset, still alive) of ``pool``."""
    with _lock:
        graphs = list(_pools.get(pool, ()))
    return sum(graph.pool_bytes for graph in graphs)


class graph:
    """Stand-in for ``torch.cuda.graph``: synchronize, collect garbage as the installed torch
    does, empty the cache, make the capture stream current and capture the block. Kernel
    annotations (``enable_annotations``) are accepted and ignored: no kernel is launched."""

    default_capture_stream: Stream | None = None

    def __init__(
        self,
        cuda_graph: CUDAGraph,
        pool: PoolHandle | None = None,
        stream: Stream | None = None,
        capture_error_mode: str = "global",
        enable_annotations: bool = False,
        check_input_liveness: bool = False,
    ) -> None:
        if stream is None and graph.default_capture_stream is None:
            graph.default_capture_stream = Stream()
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.capture_stream = stream or graph.default_capture_stream
        self.capture_error_mode = capture_error_mode
        self.check_input_liveness = check_input_liveness
        self._stream_context: AbstractContextManager[None] | None = None

    def __enter__(self) -> None:
        import torch

        synchronize()
        # torch 2.7 collects every time; later releases only when this option says so.
        if getattr(torch.compiler.config, "force_cudagraph_gc", True):
            gc.collect()
        empty_cache()
        self._stream_context = stream(self.capture_stream)
        self._stream_context.__enter__()
        try:
            self.cuda_graph.capture_begin(
                pool=self.pool,
                capture_error_mode=self.capture_error_mode,
                check_input_liveness=self.check_input_liveness,
            )
        except BaseException:
            self._stream_context.__exit__(None, None, None)
            raise

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.cuda_graph.capture_end()
        finally:
            if self._stream_context is not None:
                self._stream_context.__exit__(None, None, None)


def make_graphed_callables(
    callables: Any,
    sample_args: Any,
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool: PoolHandle | None = None,
) -> Any:
    """torch's own ``make_graphed_callables``, run over the stand-ins (it looks torch.cuda's
    names up when called): warm-ups on a side stream, one capture per callable with the sample
    args as static inputs, and callables that copy later arguments into them and replay."""
    with emulated_graphs():
        torch_own = cast(
            "Callable[..., Any]",
            _installation.saved[("torch.cuda.graphs", "make_graphed_callables")],
        )
        return torch_own(callables, sample_args, num_warmup_iters, allow_unused_input, pool)


def is_current_stream_capturing() -> bool:
    """Whether this thread has a capture open."""
    return _thread.capture is not None


class Event:
    """Stand-in for ``torch.cuda.Event``: work is done when launched, so an event is complete
    as soon as it is recorded; times are the host's."""

    def __init__(
        self,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        **kwargs: object,
    ) -> None:
        self.enable_timing = enable_timing
        self.recorded_at: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        self.recorded_at = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        """Make ``stream`` wait for this event: already so, as work runs when launched."""

    def query(self) -> bool:
        _refuse_in_capture("Event.query() asks the device")
        return True

    def synchronize(self) -> None:
        _refuse_in_capture("Event.synchronize() waits for the device")

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds from this event's record to ``end_event``'s."""
        _refuse_in_capture("Event.elapsed_time() waits for the device")
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.recorded_at is None or end_event.recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event.recorded_at - self.recorded_at) * 1000.0


class Stream:
    """Stand-in for ``torch.cuda.Stream``: one queue in program order on the CPU, so that
    waits between streams hold already."""

    def __init__(self, device: Device = None, priority: int = 0, **kwargs: object) -> None:
        import torch

        self.device = torch.device("cpu")
        self.priority = priority
        self.cuda_stream = next(_stream_ids)

    def wait_stream(self, stream: Stream) -> None:
        """Make this stream wait for ``stream``'s work so far: done already."""

    def wait_event(self, event: Event) -> None:
        """Make this stream wait for ``event``: done already."""

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def synchronize(self) -> None:
        _refuse_in_capture("Stream.synchronize() waits for the device")

    def query(self) -> bool:
        _refuse_in_capture("Stream.query() asks the device")
        return True

    def __repr__(self) -> str:
        return f"<emulated Stream {self.cuda_stream}>"


@contextmanager
def stream(stream: Stream | None) -> Iterator[None]:
    """Make ``stream`` this thread's current stream in the block (None: leave it)."""
    previous = _thread.stream
    if stream is not None:
        _thread.stream = stream
    try:
        yield
    finally:
        _thread.stream = previous


_default_streams: list[Stream] = []


def default_stream(device: Device = None) -> Stream:
    """The one default stream."""
    with _lock:
        if not _default_streams:
            _default_streams.append(Stream())
        return _default_streams[0]


def current_stream(device: Device = None) -> Stream:
    """This thread's current stream (the default stream unless ``stream`` set one)."""
    return _thread.stream or default_stream()


def synchronize(device: Device = None) -> None:
    """Wait for the device: nothing to wait for, but refused in a capture, as CUDA does."""
    _refuse_in_capture("torch.cuda.synchronize() waits for the device")


def empty_cache() -> None:
    """Release cached memory: the CPU allocator keeps none."""


def _device_index(device: Device) -> int | None:
    import torch

    if device is None or isinstance(device, int):
        return device
    return torch.device(device).index or 0


class device:
    """Stand-in for ``torch.cuda.device``: sets this thread's device index in the block."""

    def __init__(self, device: Device) -> None:
        self.index = _device_index(device)
        self.previous = 0

    def __enter__(self) -> None:
        self.previous = _thread.device_index
        if self.index is not None:
            _thread.device_index = self.index

    def __exit__(self, *exc_info: object) -> None:
        _thread.device_index = self.previous


# The "CUDA" generator: an emulated device's tensors are the CPU's, drawn from its default
# generator (seeded directly: torch.manual_seed calls torch.cuda.manual_seed_all itself).


def get_rng_state(device: Device = "cuda") -> torch.Tensor:
    import torch

    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: Device = "cuda") -> None:
    import torch

    torch.default_generator.set_state(new_state)


def manual_seed(seed: int) -> None:
    import torch

    torch.default_generator.manual_seed(seed)


manual_seed_all = manual_seed


def current_device() -> int:
    return _thread.device_index


def set_device(device: Device) -> None:
    index = _device_index(device)
    if index is not None:
        _thread.device_index = index


# The names each module gets: torch.cuda.graphs' own code looks these up in its module.
GRAPH_NAMES = (
    "CUDAGraph",
    "graph",
    "graph_pool_handle",
    "make_graphed_callables",
    "is_current_stream_capturing",
)
CUDA_NAMES = (
    *GRAPH_NAMES,
    "Stream",
    "Event",
    "stream",
    "current_stream",
    "default_stream",
    "synchronize",
    "empty_cache",
    "device",
    "current_device",
    "set_device",
    "get_rng_state",
    "set_rng_state",
    "manual_seed",
    "manual_seed_all",
)
_ABSENT = object()  # what a module held of a name it did not have


class _Installation:
    """The stand-ins on torch's modules: put there by the first open scope, from any thread,
    and put back by the last to close."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scopes = 0
        self.saved: dict[tuple[str, str], object] = {}

    def targets(self) -> list[tuple[types.ModuleType, tuple[str, ...]]]:
        import torch.cuda.graphs

        return [(torch.cuda, CUDA_NAMES), (torch.cuda.graphs, GRAPH_NAMES)]

    def enter(self) -> None:
        with self.lock:
            if self.scopes == 0:
                for module, names in self.targets():
                    for name in names:
                        self.saved[(module.__name__, name)] = vars(module).get(name, _ABSENT)
                        setattr(module, name, globals()[name])
            self.scopes += 1

    def exit(self) -> None:
        with self.lock:
            self.scopes -= 1
            if self.scopes:
                return
            for module, names in self.targets():
                for name in names:
                    original = self.saved.pop((module.__name__, name))
                    if vars(module).get(name) is not globals()[name]:
                        continue  # patched again since: the later patch undoes its own
                    if original is _ABSENT:
                        delattr(module, name)
                    else:
                        setattr(module, name, original)


_installation = _Installation()


@contextmanager
def emulated_graphs() -> Iterator[None]:
    """torch.cuda's graph API emulated in the block (see the module's docstring), and torch
    as it was after it, also when the block raises. Scopes nest, from any thread: the stand-ins
    stay until the last open scope closes. A capture is per thread: another thread's ops are
    neither recorded nor refused by it."""
    _installation.enter()
    try:
        yield
    finally:
        _installation.exit()


def active() -> bool:
    """Whether the stand-ins are installed now."""
    return _installation.scopes > 0
