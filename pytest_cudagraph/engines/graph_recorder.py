"""What a capture reads, writes and allocates: one recorder of the aten ops a region runs.

``GraphRecorder`` is a torch dispatch mode: between ``start`` and ``stop``, in the thread that
started it, it sees every aten op with its tensors and scalars and keeps a ``CaptureRecord``:
the ops in order, the storages the region reads or writes that existed before it (its external
inputs, held weakly, with what rebuilds a tensor of each while it lives), and the storages it
allocates (its pool). Storages are the unit, so that two views of one buffer are one input and
a view of a tensor the region allocated is internal. In observe mode the ops just run (around
a real capture, to learn what the graph reads); in emulate mode (``engines.emulation``) the
region also behaves as a capture that executes nothing: a host sync is refused, the memory and
the generators that existed keep their values, and what it allocated holds garbage at ``stop``.
Limits: ops that dispatch nothing are unseen (``.tolist()``, ``.numpy()``, printing), so are
other threads' ops; a CPU kernel that checks values on the host where CUDA's does not
(``one_hot``'s range check) is refused as a host sync. torch is imported when used.
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch._ops import OpOverload

# CUDA's words for a host sync in a capture, and for any later work in a capture it invalidated.
NOT_PERMITTED = "operation not permitted when stream is capturing"
INVALIDATED = "operation failed due to a previous error during capture"
# How torch's input-liveness check (2.13 and later) opens a replay's error, as the emulated replay
# does too: a graph reads memory freed since its capture.
DEAD_TENSOR = "CUDA graph replay detected"


@dataclass(eq=False)
class RecordedStorage:
    """One storage a capture used: ``ref`` holds it weakly (torch keeps one Python object per
    storage while it lives, so the reference dies with the memory); ``data_ptr`` and
    ``nbytes`` are as the capture left them; ``dtype``, ``shape``, ``stride`` and ``offset`` are
    those of the first tensor seen on it, ``site`` the first user line that used it. ``held``
    keeps it alive where the graph owns it (an emulated pool, a constant)."""

    ref: weakref.ref[torch.UntypedStorage]
    data_ptr: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    device: torch.device
    site: str
    held: torch.UntypedStorage | None = None

    def alive(self) -> bool:
        """Not freed, and still at the address the capture recorded (a storage resized to
        nothing, as FSDP frees one, is dead too)."""
        storage = self.storage()
        return storage is not None and storage.data_ptr() == self.data_ptr

    def storage(self) -> torch.UntypedStorage | None:
        """The storage itself, None once freed."""
        return self.held if self.held is not None else self.ref()

    def tensor(self) -> torch.Tensor | None:
        """The first tensor seen on it, rebuilt on the same memory; None once freed."""
        return _rebuilt(self, self.dtype, self.shape, self.stride, self.offset)

    def describe(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        where = f", first used at {self.site}" if self.site else ""
        return f"{self.dtype} tensor of shape ({shape}) at {self.data_ptr:#x}{where}"


@dataclass(frozen=True, eq=False)
class TensorRef:
    """A tensor an op took or gave, as its storage and the view of it."""

    storage: RecordedStorage
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    def tensor(self) -> torch.Tensor | None:
        """The tensor, rebuilt on the same memory (same values, writes reach it); None once
        its storage was freed."""
        return _rebuilt(self.storage, self.dtype, self.shape, self.stride, self.offset)


@dataclass(frozen=True)
class RecordedOp:
    """One aten op: ``args``, ``kwargs`` and ``outputs`` hold ``TensorRef``s where the op had
    tensors, scalars as given. ``fresh`` pairs each output the op allocated with its index among
    the leaves of ``outputs``. ``kernel`` is False for ops that launch no kernel (views, metadata
    changes, uninitialised allocations): a replay skips them."""

    func: OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: Any
    fresh: tuple[tuple[int, TensorRef], ...]
    kernel: bool


@dataclass(frozen=True)
class CaptureRecord:
    """What a region did. ``reads``: the storages that existed before it and that it reads;
    ``writes``: those it writes (in place, ``out=``); ``allocates``: those it allocated, its
    pool; ``constants``: tensors made from Python data inside it (``torch.tensor(...)``), held
    as a graph bakes them. ``error``: why an emulated capture was invalidated, "" if it was not.
    Each list is in order of first use."""

    ops: tuple[RecordedOp, ...]
    reads: tuple[RecordedStorage, ...]
    writes: tuple[RecordedStorage, ...]
    allocates: tuple[RecordedStorage, ...]
    constants: tuple[RecordedStorage, ...] = ()
    error: str = ""

    @property
    def external(self) -> tuple[RecordedStorage, ...]:
        """The storages it reads or writes that it did not allocate: its external inputs."""
        return self.reads + tuple(s for s in self.writes if s not in self.reads)

    @property
    def pool_bytes(self) -> int:
        """Bytes of the storages it allocated, each counted once (no reuse, no rounding)."""
        return sum(storage.nbytes for storage in self.allocates)

    def dead_inputs(self) -> list[RecordedStorage]:
        """The external inputs freed since (or moved): a replay would use freed memory."""
        return [storage for storage in self.external if not storage.alive()]

    def reads_storage_of(self, tensor: torch.Tensor) -> bool:
        """Whether the region reads memory of ``tensor``'s storage that existed before it."""
        return _holds(self.reads, tensor)

    def writes_storage_of(self, tensor: torch.Tensor) -> bool:
        """Whether the region writes ``tensor``'s storage, which existed before it."""
        return _holds(self.writes, tensor)


def _holds(storages: Iterable[RecordedStorage], tensor: torch.Tensor) -> bool:
    memory = tensor.untyped_storage()
    return any(storage.storage() is memory for storage in storages)


def _rebuilt(
    storage: RecordedStorage,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    offset: int,
) -> torch.Tensor | None:
    import torch

    memory = storage.storage()
    if memory is None:
        return None
    return torch.empty(0, dtype=dtype, device=storage.device).set_(memory, offset, shape, stride)


class GraphRecorder:
    """Records the aten ops of the calling thread between ``start`` and ``stop`` (or inside
    ``with``): ``stop`` returns the ``CaptureRecord``, also kept as ``record``.

    ``emulate`` makes the region behave as a CUDA graph capture, which launches nothing: an op
    that makes the host wait for the device raises ``RuntimeError`` (NOT_PERMITTED, naming the
    op) and invalidates the capture (each later op raises INVALIDATED; the record's ``error``
    says why); at ``stop`` the storages that existed get back the bytes the region wrote into
    them, the default CPU generator and each generator passed to an op get back their states,
    and every storage the region allocated is filled with garbage (``fill_with_garbage``). The ops
    still run, so that outputs get their shapes, dtypes and aliasing, and the record holds its
    allocations for a replay. ``device_type`` ("cuda"), when given, records only ops with a
    tensor on that kind of device, as a real capture records only its device's kernels.
    """

    def __init__(self, *, emulate: bool = False, device_type: str | None = None) -> None:
        self.emulate = emulate
        self.device_type = device_type
        self.record: CaptureRecord | None = None
        self._mode: Any = None  # the dispatch mode while recording
        self._clear()

    def _clear(self) -> None:
        self._thread = threading.get_ident()
        self._collecting = False  # whether garbage collection was on when recording began
        self._error = ""
        self._ops: list[RecordedOp] = []
        self._storages: dict[int, RecordedStorage] = {}  # by id of the live storage
        # By id of the RecordedStorage; insertion order is the order of first use.
        self._reads: dict[int, RecordedStorage] = {}
        self._writes: dict[int, RecordedStorage] = {}
        self._allocates: dict[int, RecordedStorage] = {}
        self._constants: dict[int, RecordedStorage] = {}
        # Emulation: the bytes of each storage that existed, before the region first wrote it,
        # and each generator's state before the region drew from it.
        self._written_before: dict[int, tuple[torch.UntypedStorage, torch.Tensor]] = {}
        self._generators: dict[int, tuple[torch.Generator, torch.Tensor]] = {}

    @property
    def recording(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        """Begin recording the calling thread's ops."""
        import torch

        if self._mode is not None:
            raise RuntimeError("this GraphRecorder is already recording")
        self._clear()
        if self.emulate:
            self._keep_generator(torch.default_generator)
        self._mode = _recording_mode()()
        self._mode.recorder = self
        self._mode.__enter__()
        if self.emulate:  # host reads of a CPU tensor dispatch nothing: seen as method calls
            _host_reads.enter(self)
        else:
            # The bookkeeping allocates Python objects, enough to start a garbage collection
            # inside a real capture, whose finalizers may call CUDA and so invalidate a capture
            # in torch's default "global" mode (seen on an H200: make_graphed_callables). torch
            # collects just before capture_begin; none runs until stop.
            self._collecting = gc.isenabled()
            gc.disable()

    def stop(self) -> CaptureRecord:
        """Stop recording (in the thread that started), and return the record."""
        if self._mode is None:
            raise RuntimeError("this GraphRecorder is not recording")
        if threading.get_ident() != self._thread:
            raise RuntimeError("a GraphRecorder is stopped by the thread that started it")
        mode, self._mode = self._mode, None
        if self.emulate:
            _host_reads.exit()
        elif self._collecting:
            gc.enable()
        mode.__exit__(None, None, None)
        storages = [*self._reads.values(), *self._writes.values(), *self._allocates.values()]
        for storage in storages:
            memory = storage.storage()
            if memory is not None:
                storage.data_ptr, storage.nbytes = memory.data_ptr(), memory.nbytes()
        if self.emulate:
            self._launch_nothing()
        self.record = CaptureRecord(
            ops=tuple(self._ops),
            reads=tuple(self._reads.values()),
            writes=tuple(self._writes.values()),
            allocates=tuple(self._allocates.values()),
            constants=tuple(self._constants.values()),
            error=self._error,
        )
        return self.record

    def invalidate(self, reason: str) -> RuntimeError:
        """Mark the capture failed because of ``reason`` (the first reason is kept), and return
        the error to raise: NOT_PERMITTED, naming what was done."""
        self._error = self._error or reason
        return RuntimeError(f"CUDA error: {NOT_PERMITTED} (emulated: {reason})")

    def __enter__(self) -> GraphRecorder:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self, func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One op, seen by the mode: refused, or run and recorded."""
        import torch
        from torch.utils._pytree import tree_leaves, tree_map_only

        if self.device_type is not None and not _on_device(self.device_type, args, kwargs):
            return func(*args, **kwargs)
        if self.emulate:
            if self._error:
                raise RuntimeError(f"CUDA error: {INVALIDATED} (emulated: {self._error})")
            sync = _host_sync(func, args, kwargs)
            if sync:
                raise self.invalidate(f"{func} {sync}")
        written = {id(t) for t in _written_tensors(func, args, kwargs)}
        unread = {id(t) for t in _unread_tensors(func, args, kwargs)}
        lift = func.overloadpacket in _lifts()
        inputs: dict[int, TensorRef] = {}
        for tensor in _tensors((args, kwargs)):
            ref = self._input_ref(tensor, constant=lift)
            inputs[id(tensor)] = ref
            if id(tensor) not in unread:
                self._note_read(ref.storage)
            if id(tensor) in written:
                self._note_write(ref.storage, tensor)
        for value in kwargs.values():
            if isinstance(value, torch.Generator) and self.emulate:
                self._keep_generator(value)
        result = func(*args, **kwargs)
        input_storages = {id(ref.storage) for ref in inputs.values()}
        fresh: list[tuple[int, TensorRef]] = []
        aliases = True
        for index, leaf in enumerate(tree_leaves(result)):
            if not isinstance(leaf, torch.Tensor):
                continue
            ref, new = self._output_ref(leaf)
            if new:
                fresh.append((index, ref))
            aliases = aliases and id(ref.storage) in input_storages

        def as_ref(tensor: torch.Tensor) -> TensorRef:
            return inputs.get(id(tensor)) or self._output_ref(tensor)[0]

        self._ops.append(
            RecordedOp(
                func=func,
                args=tree_map_only(torch.Tensor, as_ref, args),
                kwargs=tree_map_only(torch.Tensor, as_ref, kwargs),
                outputs=tree_map_only(torch.Tensor, as_ref, result),
                fresh=tuple(fresh),
                kernel=_launches_kernel(func, bool(written), aliases),
            )
        )
        return result

    def _input_ref(self, tensor: torch.Tensor, *, constant: bool) -> TensorRef:
        storage = self._known(tensor)
        if storage is None:
            storage = self._new_storage(tensor)
            if constant:
                storage.held = tensor.untyped_storage()
                self._constants[id(storage)] = storage
        return _ref(storage, tensor)

    def _output_ref(self, tensor: torch.Tensor) -> tuple[TensorRef, bool]:
        """The tensor's ref, and whether its storage is new (allocated by this op)."""
        storage = self._known(tensor)
        if storage is not None:
            return _ref(storage, tensor), False
        storage = self._new_storage(tensor)
        self._allocates[id(storage)] = storage
        if self.emulate:
            storage.held = tensor.untyped_storage()
        return _ref(storage, tensor), True

    def _known(self, tensor: torch.Tensor) -> RecordedStorage | None:
        """The record of the tensor's storage, if seen (an id of a freed one is not)."""
        memory = tensor.untyped_storage()
        storage = self._storages.get(id(memory))
        return storage if storage is not None and storage.ref() is memory else None

    def _new_storage(self, tensor: torch.Tensor) -> RecordedStorage:
        storage = tensor.untyped_storage()
        recorded = RecordedStorage(
            ref=weakref.ref(storage),
            data_ptr=storage.data_ptr(),
            nbytes=storage.nbytes(),
            dtype=tensor.dtype,
            shape=tuple(tensor.shape),
            stride=tuple(tensor.stride()),
            offset=int(tensor.storage_offset()),
            device=tensor.device,
            site=_user_site(),
        )
        self._storages[id(storage)] = recorded
        return recorded

    def _note_read(self, storage: RecordedStorage) -> None:
        key = id(storage)
        if key not in self._allocates and key not in self._constants:
            self._reads.setdefault(key, storage)

    def _note_write(self, storage: RecordedStorage, tensor: torch.Tensor) -> None:
        key = id(storage)
        if key in self._allocates or key in self._constants:
            return
        self._writes.setdefault(key, storage)
        if self.emulate and key not in self._written_before:
            memory = tensor.untyped_storage()
            self._written_before[key] = (memory, _bytes_of(memory).clone())

    def _keep_generator(self, generator: torch.Generator) -> None:
        self._generators.setdefault(id(generator), (generator, generator.get_state()))

    def _launch_nothing(self) -> None:
        """Leave memory and generators as a capture that executed nothing leaves them."""
        for memory, before in self._written_before.values():
            _bytes_of(memory).copy_(before)
        for generator, state in self._generators.values():
            generator.set_state(state)
        for storage in self._allocates.values():
            fill_with_garbage(storage)
        self._written_before.clear()
        self._generators.clear()


def _ref(storage: RecordedStorage, tensor: torch.Tensor) -> TensorRef:
    return TensorRef(
        storage,
        tensor.dtype,
        tuple(tensor.shape),
        tuple(tensor.stride()),
        int(tensor.storage_offset()),
    )


def _bytes_of(memory: torch.UntypedStorage) -> torch.Tensor:
    import torch

    return torch.empty(0, dtype=torch.uint8, device=memory.device).set_(memory)


def _on_device(device_type: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the op runs on ``device_type``: a tensor of its arguments is there, or it makes
    its tensor there (a factory op, ``zeros`` or ``arange``, takes no tensor, only ``device=``),
    so that what a capture allocates is known as its own, not taken for an input."""
    import torch

    if any(t.device.type == device_type for t in _tensors((args, kwargs))):
        return True
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == device_type


def _tensors(value: object) -> list[torch.Tensor]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _argument(
    func: OpOverload, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> object:
    argument = func._schema.arguments[index]
    if not argument.kwarg_only and index < len(args):
        return args[index]
    return kwargs.get(argument.name)


def _written_tensors(
    func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[torch.Tensor]:
    """The tensors the op's schema says it writes (``Tensor(a!)``: in place, ``out=``)."""
    found = []
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            found += _tensors(_argument(func, index, args, kwargs))
    return found


def _unread_tensors(
    func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[torch.Tensor]:
    """Written arguments the op does not read: ``out=`` and the destination of an overwrite."""
    found = []
    overwrite = func.overloadpacket in _overwrites()
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        if argument.kwarg_only or (overwrite and index == 0):
            found += _tensors(_argument(func, index, args, kwargs))
    return found


def _launches_kernel(func: OpOverload, writes: bool, aliases: bool) -> bool:
    import torch

    if torch.Tag.inplace_view in func.tags or func.overloadpacket in _uninitialised():
        return False
    return writes or not aliases


def _host_sync(func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """How the op makes the host wait for the device on CUDA, or "" if it does not."""
    import torch

    aten = torch.ops.aten
    packet = func.overloadpacket
    if torch.Tag.data_dependent_output in func.tags or packet in (aten.equal, aten.allclose):
        return "reads a tensor's values on the host"
    if packet in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        indices = _tensors(_argument(func, 1, args, kwargs))
        boolean = any(t.dtype in (torch.bool, torch.uint8) for t in indices)
        return "indexes with a boolean mask (a nonzero on the host)" if boolean else ""
    if torch.Tag.dynamic_output_shape not in func.tags:
        return ""
    if packet is aten.repeat_interleave and kwargs.get("output_size") is not None:
        return ""
    return "has an output whose shape depends on tensor values"


@cache
def _overwrites() -> frozenset[object]:
    """Ops that replace their first argument's values without reading them."""
    import torch

    aten = torch.ops.aten
    return frozenset({aten.copy_, aten.fill_, aten.zero_})


@cache
def _uninitialised() -> frozenset[object]:
    """Allocations that launch no kernel: their memory holds whatever was there."""
    import torch

    aten = torch.ops.aten
    return frozenset(
        {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided}
    )


@cache
def _lifts() -> frozenset[object]:
    """Ops that take a tensor made from Python data (``torch.tensor(...)``) into dispatch."""
    import torch

    aten = torch.ops.aten
    return frozenset({aten.lift_fresh, aten.lift_fresh_copy, aten.lift})


def _garbage_value(dtype: torch.dtype) -> float | complex | int:
    import torch

    if dtype.is_complex:
        return complex("nan+nanj")
    if dtype.is_floating_point:
        return float("nan")
    return int(torch.iinfo(dtype).max)


def fill_with_garbage(storage: RecordedStorage) -> None:
    """Fill the whole storage, read as its first tensor's dtype, with garbage: NaN for floating
    and complex types, the largest value for integer types, True and False alternating (from
    the storage's first byte) for bool."""
    import torch

    memory = storage.storage()
    if memory is None:
        return
    count = memory.nbytes() // storage.dtype.itemsize
    flat = torch.empty(0, dtype=storage.dtype, device=memory.device).set_(memory, 0, (count,), (1,))
    if storage.dtype == torch.bool:
        flat.copy_(torch.arange(count, device=memory.device) % 2 == 0)
    else:
        flat.fill_(_garbage_value(storage.dtype))


def holds_garbage(tensor: torch.Tensor) -> bool:
    """Whether every element of ``tensor`` is what ``fill_with_garbage`` wrote there: the values
    of memory a capture allocated, before a replay computed them."""
    import torch

    if tensor.numel() == 0:
        return False
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return bool(torch.isnan(tensor).all())
    if tensor.dtype != torch.bool:
        return bool((tensor == _garbage_value(tensor.dtype)).all())
    positions = torch.arange(tensor.untyped_storage().nbytes(), device=tensor.device)
    where = positions.as_strided(
        tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset()
    )
    return bool((tensor == (where % 2 == 0)).all())


@cache
def _not_the_users() -> tuple[str, ...]:
    """The folders whose frames are not the user's code: torch's and the engines'."""
    import torch

    return (str(Path(torch.__file__).resolve().parent), str(Path(__file__).resolve().parent))


def _user_site() -> str:
    """``file:line`` of the innermost frame outside torch and the engines."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_not_the_users()):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""


# Tensor methods that read a device tensor's values on the host: on an emulated device's (CPU)
# tensor they dispatch no op, so the recorder's dispatch mode would not see them. They are
# wrapped on torch.Tensor while an emulated capture records (a function mode would see them
# too, but would also turn modules' fast paths off, and a capture must run what eager runs).
HOST_READS = {"cpu": "copies it to the host", "numpy": "reads it on the host"}
HOST_READS |= {"tolist": "reads it on the host", "to": "copies it to the host"}


def _to_host(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the call of ``Tensor.<name>`` reads on the host: ``to`` only naming the CPU."""
    import torch

    if name != "to":
        return True
    wanted = [kwargs.get("device"), *args[:1]]
    return any(
        isinstance(value, (str, torch.device)) and torch.device(value).type == "cpu"
        for value in wanted
    )


class _HostReads:
    """The wrapped methods of ``HOST_READS``, installed while any thread records an emulated
    capture; a call refused only on a thread whose own capture is recording."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scopes = 0
        self.saved: dict[str, object] = {}
        self.local = threading.local()  # ``recorder``: this thread's recording one

    def enter(self, recorder: GraphRecorder) -> None:
        import torch

        self.local.recorder = recorder
        with self.lock:
            if self.scopes == 0:
                for name in HOST_READS:
                    self.saved[name] = vars(torch.Tensor).get(name, _INHERITED)
                    setattr(torch.Tensor, name, self._guarded(name, getattr(torch.Tensor, name)))
            self.scopes += 1

    def exit(self) -> None:
        import torch

        self.local.recorder = None
        with self.lock:
            self.scopes -= 1
            if self.scopes:
                return
            for name, own in self.saved.items():
                if own is _INHERITED:
                    delattr(torch.Tensor, name)
                else:
                    setattr(torch.Tensor, name, own)
            self.saved.clear()

    def _guarded(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        local = self.local

        def method(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            recorder = getattr(local, "recorder", None)
            if recorder is not None and _to_host(name, args, kwargs):
                raise recorder.invalidate(f"Tensor.{name}() {HOST_READS[name]}")
            return original(tensor, *args, **kwargs)

        return method


_INHERITED = object()  # what torch.Tensor held of a method it inherits: nothing of its own
_host_reads = _HostReads()


@cache
def _recording_mode() -> Any:
    """The dispatch mode class, made once torch is imported. Made with ``type()``: torch's
    TorchDispatchMode is untyped, so a class statement would call it in typed code."""
    from torch.utils._python_dispatch import TorchDispatchMode

    def dispatch(
        mode: Any,
        func: OpOverload,
        types: object,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return mode.recorder._run(func, args, kwargs or {})

    # torch wraps a mode's dispatch in dynamo's "disable", whose first call imports
    # torch._dynamo (about a second); nothing compiles inside this dispatch, so it need not.
    never_compiles = classmethod(lambda cls: False)
    return type(
        "RecordingMode",
        (TorchDispatchMode,),
        {"__torch_dispatch__": dispatch, "_should_skip_dynamo": never_compiles},
    )
