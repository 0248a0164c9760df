"""The recorder of what a capture reads, writes and allocates, in observe mode (the ops just run)
and in emulate mode (the region behaves as a capture that executes nothing)."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from pytest_cudagraph.engines.graph_recorder import (
    INVALIDATED,
    NOT_PERMITTED,
    CaptureRecord,
    GraphRecorder,
    RecordedStorage,
    TensorRef,
    holds_garbage,
)


def storage_of(record: CaptureRecord, tensor: torch.Tensor) -> list[RecordedStorage]:
    """The record's entries (reads, writes, allocations) on ``tensor``'s storage."""
    entries = [*record.reads, *record.writes, *record.allocates, *record.constants]
    return [entry for entry in entries if entry.storage() is tensor.untyped_storage()]


# Observe mode


def test_the_region_runs_and_its_reads_writes_and_allocations_are_recorded() -> None:
    weight, x = torch.randn(3, 4), torch.randn(2, 3)
    accumulator, destination = torch.zeros(2, 4), torch.zeros(2, 4)
    with GraphRecorder() as recorder:
        hidden = x @ weight
        accumulator.add_(hidden)  # read and written
        destination.copy_(hidden + 1)  # written, not read
    record = recorder.record
    assert record is not None and record.error == ""
    torch.testing.assert_close(destination, x @ weight + 1)  # observe mode: the ops ran
    assert [entry.storage() for entry in record.reads] == [
        t.untyped_storage() for t in (x, weight, accumulator)
    ]
    assert [entry.storage() for entry in record.writes] == [
        t.untyped_storage() for t in (accumulator, destination)
    ]
    assert record.reads_storage_of(accumulator) and record.writes_storage_of(accumulator)
    assert not record.reads_storage_of(destination) and record.writes_storage_of(destination)
    assert not record.reads_storage_of(hidden) and storage_of(record, hidden)[0].nbytes == 32
    assert len(record.allocates) == 2  # hidden, and hidden + 1
    assert record.pool_bytes == 2 * hidden.untyped_storage().nbytes()
    assert len(record.external) == 4


def test_views_of_one_storage_are_one_input_and_a_view_of_an_allocation_is_internal() -> None:
    buffer = torch.arange(12.0).reshape(3, 4)
    with GraphRecorder() as recorder:
        rows = buffer[0] + buffer[1] + buffer.t()[:, 2]
        scaled = rows * 2
        shifted = scaled[1:] + scaled[:1].sum()
    record = recorder.record
    assert record is not None
    assert len(record.reads) == 1 and record.reads[0].storage() is buffer.untyped_storage()
    assert not record.reads_storage_of(scaled)
    assert len(storage_of(record, scaled)) == len(storage_of(record, shifted)) == 1
    # Allocated: the first sum, rows, scaled, scaled[:1].sum() and shifted, in float32.
    assert len(record.allocates) == 5
    assert record.pool_bytes == (4 + 4 + 4 + 1 + 3) * torch.float32.itemsize
    assert record.pool_bytes == sum(entry.nbytes for entry in record.allocates)


def test_storages_freed_in_the_region_are_each_an_allocation_of_their_own() -> None:
    """Python may give a new storage the id of a freed one: it is still a new storage."""
    with GraphRecorder() as recorder:
        first = [torch.ones(1) for _ in range(300)]
        del first  # 300 storages freed: the next ones may take their ids
        second = [torch.zeros(1) for _ in range(300)]
    record = recorder.record
    assert record is not None and len(record.allocates) == 600
    assert all(len(op.fresh) == 1 for op in record.ops)
    assert all(
        entry.storage() is t.untyped_storage()
        for entry, t in zip(record.allocates[300:], second, strict=True)
    )


def test_ops_keep_their_tensors_by_storage_and_their_scalars_as_given() -> None:
    x = torch.ones(2)
    with GraphRecorder() as recorder:
        y = x + 3
        y.mul_(0.5)
        view = y.view(2, 1)
        empty = torch.empty(2)
    record = recorder.record
    assert record is not None
    ops = {str(op.func): op for op in record.ops}
    assert list(ops) == [
        "aten.add.Tensor",
        "aten.mul_.Tensor",
        "aten.view.default",
        "aten.empty.memory_format",
    ]
    add = ops["aten.add.Tensor"]
    assert isinstance(add.args[0], TensorRef) and add.args[1] == 3
    assert add.args[0].storage.storage() is x.untyped_storage()
    assert ops["aten.mul_.Tensor"].args[1] == 0.5
    assert [op.kernel for op in ops.values()] == [True, True, False, False]
    assert [index for index, _ in add.fresh] == [0]
    assert ops["aten.view.default"].fresh == ()
    rebuilt = add.fresh[0][1].tensor()
    assert rebuilt is not None and torch.equal(rebuilt, torch.full((2,), 2.0))
    del view, empty


def test_an_out_argument_is_written_not_read_and_a_python_constant_is_no_input() -> None:
    x, out = torch.ones(3), torch.empty(3)
    with GraphRecorder() as recorder:
        torch.add(x, 1, out=out)
        scaled = x * torch.tensor(2.0)
    record = recorder.record
    assert record is not None
    assert record.writes_storage_of(out) and not record.reads_storage_of(out)
    assert [entry.storage() for entry in record.reads] == [x.untyped_storage()]
    assert len(record.constants) == 1 and record.constants[0].held is not None
    assert torch.equal(scaled, torch.full((3,), 2.0))


def test_dead_inputs_are_the_external_storages_freed_or_emptied_since() -> None:
    kept, freed, emptied = torch.ones(3), torch.ones(3), torch.ones(4)
    with GraphRecorder() as recorder:
        kept + freed + emptied[:2].sum()
    record = recorder.record
    assert record is not None and record.dead_inputs() == []
    del freed
    gc.collect()
    emptied.untyped_storage().resize_(0)  # how FSDP frees a parameter's memory
    dead = record.dead_inputs()
    assert [entry.shape for entry in dead] == [(3,), (4,)]
    assert [entry.storage() for entry in dead] == [None, emptied.untyped_storage()]
    assert "torch.float32 tensor of shape (3)" in dead[0].describe()
    assert "test_graph_recorder.py" in dead[0].site


def test_a_device_filter_records_only_that_devices_ops() -> None:
    x = torch.ones(2)
    with GraphRecorder(device_type="cuda") as recorder:
        y = x + 1
    assert recorder.record is not None and recorder.record.ops == ()
    assert torch.equal(y, torch.full((2,), 2.0))


def test_a_device_filter_knows_what_factory_ops_make_on_that_device_as_allocated() -> None:
    # torch.zeros(..., device=...) takes no tensor: seen by its device alone, else a tensor the
    # region makes with it and then writes would be taken for an input it did not allocate.
    x = torch.ones(2, 4)
    with GraphRecorder(device_type="cpu") as recorder:
        mask = torch.zeros(2, 4, device="cpu")
        mask.masked_fill_(x > 0, float("-inf"))
        positions = torch.arange(4, device=torch.device("cpu"))
        y = x + mask + positions
    record = recorder.record
    assert record is not None
    assert [entry.shape for entry in record.external] == [(2, 4)]  # x alone
    assert storage_of(record, x) == list(record.reads)
    assert {id(entry) for entry in record.allocates} >= {
        id(storage_of(record, mask)[0]),
        id(storage_of(record, positions)[0]),
    }
    assert torch.isinf(y).all()


@pytest.mark.parametrize("collecting", [True, False])
def test_no_garbage_collection_runs_while_a_real_capture_records(collecting: bool) -> None:
    """A collection's finalizers may call CUDA, which invalidates a capture in torch's global
    mode: off from start to stop, then as it was. An emulated capture calls no CUDA."""
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        with GraphRecorder(device_type="cuda"):
            during = gc.isenabled()
        after = gc.isenabled()
        with GraphRecorder(emulate=True):
            emulated = gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
    assert (during, after, emulated) == (False, collecting, collecting)


def test_only_the_recording_thread_is_seen_and_only_it_may_stop() -> None:
    recorder = GraphRecorder()
    recorder.start()
    errors: list[str] = []

    def other() -> None:
        torch.ones(2) * 3
        try:
            recorder.stop()
        except RuntimeError as error:
            errors.append(str(error))

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    torch.ones(2) + 1
    record = recorder.stop()
    assert [str(op.func) for op in record.ops] == ["aten.ones.default", "aten.add.Tensor"]
    assert errors == ["a GraphRecorder is stopped by the thread that started it"]
    with pytest.raises(RuntimeError, match="not recording"):
        recorder.stop()


def test_a_recorder_records_one_region_at_a_time() -> None:
    with GraphRecorder() as recorder:
        with pytest.raises(RuntimeError, match="already recording"):
            recorder.start()
    assert not recorder.recording


# Emulate mode


def test_emulate_leaves_memory_and_generators_that_existed_as_they_were() -> None:
    state, generator = torch.zeros(3), torch.Generator().manual_seed(4)
    before, generator_before = torch.get_rng_state(), generator.get_state()
    with GraphRecorder(emulate=True) as recorder:
        state[1:].add_(5)
        torch.rand(2)
        torch.randn(2, generator=generator)
        out = state * 2
    assert torch.equal(state, torch.zeros(3))
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(generator.get_state(), generator_before)
    assert holds_garbage(out)
    assert recorder.record is not None and recorder.record.writes_storage_of(state)


def test_emulate_refuses_a_host_sync_and_everything_after_it() -> None:
    x, recorder = torch.ones(2), GraphRecorder(emulate=True)
    recorder.start()
    with pytest.raises(RuntimeError, match=f"{NOT_PERMITTED}.*_local_scalar_dense"):
        x.sum().item()
    with pytest.raises(RuntimeError, match=INVALIDATED):
        x * 2
    record = recorder.stop()
    assert "_local_scalar_dense" in record.error
    assert torch.equal(x + 1, torch.full((2,), 2.0))  # stopped: nothing is refused


def test_observe_mode_refuses_nothing() -> None:
    with GraphRecorder():
        assert torch.ones(2).sum().item() == 2.0


def test_garbage_is_recognised_per_dtype_and_real_values_are_not() -> None:
    for dtype in (torch.float16, torch.float32, torch.int32, torch.int64, torch.bool):
        with GraphRecorder(emulate=True) as recorder:
            block = torch.zeros(6, dtype=dtype)
        assert holds_garbage(block) and holds_garbage(block[3:]), dtype
        assert not holds_garbage(torch.zeros(6, dtype=dtype)), dtype
        assert recorder.record is not None
    assert block.tolist() == [True, False, True, False, True, False]
    assert not holds_garbage(torch.tensor([float("nan"), 1.0]))
