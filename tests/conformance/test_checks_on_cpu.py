"""The checks' logic on the CPU: each check called as a function on small CPU targets, right and
wrong in the way that check is about, with stand-ins where the check works through a GPU
(torch.cuda.CUDAGraph's shape for faults and capture counts, a memory probe whose readings the
target sets). What each check proves on a GPU, through real graphs, is the GPU runs' business
(test_own_graphs.py, test_broken_*.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cpu_checks import CPU, KEYS, StandInConclude, cpu_target, double, rows, run
from graph_stand_ins import StandInGraph, StandInGraphs
from torch import Tensor

from pytest_cudagraph.conformance import (
    NEXT_CALL,
    NEXT_CALL_OF_KEY,
    SERIAL,
    SINGLE,
    Cache,
    CaptureClean,
    Case,
    CudaGraphTarget,
    Guards,
    Sampling,
    Tolerance,
)
from pytest_cudagraph.conformance.checks import (
    test_00_target,
    test_01_parity,
    test_02_no_baked_inputs,
    test_03_owned_outputs,
    test_04_identical_sampling,
    test_05_capture_clean,
    test_06_device_binding,
    test_07_guards,
    test_08_lock_safety,
    test_09_bounded_memory,
    test_10_concurrency,
    test_15_side_isolation,
)
from pytest_cudagraph.engines.captures import CaptureCounter
from pytest_cudagraph.engines.faults import FaultInjector
from pytest_cudagraph.engines.graph_faults import GraphFaults
from pytest_cudagraph.engines.memory import MemorySample
from pytest_cudagraph.engines.parity import ParityChecker, ParityResult
from pytest_cudagraph.engines.units import MiB

Failed = pytest.fail.Exception  # how a check fails: its headline and problems, no traceback


def sample(inputs: dict[str, Tensor]) -> Tensor:
    """Code that samples: noise from torch's global generator."""
    return inputs["x"] + torch.rand(inputs["x"].shape)


# Dry run and contract


def test_the_dry_run_fails_a_target_whose_eager_side_raises_on_every_call() -> None:
    run(test_00_target.test_dry_run, cpu_target())
    with pytest.raises(Failed) as failure:
        run(test_00_target.test_dry_run, cpu_target(eager=lambda inputs: inputs["ids"]))
    lines = str(failure.value).splitlines()
    assert lines[:2] == [
        "the dry run failed on 3 of 3 keys:",
        "case 0: eager on case 0: key 2, repeat 0; inputs x float32[2, 4] raised KeyError: 'ids'",
    ]
    # Each key raised in the same frames: shown once.
    assert lines.count("Traceback (your code):") == 1
    assert lines[-1] == (
        "case 2: eager on case 2: key 4, repeat 0; inputs x float32[4, 4] raised KeyError: 'ids' "
        "(the same frames as above)"
    )


def test_the_dry_run_counts_keys_not_problems() -> None:
    """Two problems on one key (eager's answer changes with the call, and graphed differs)
    are one key of one that failed."""
    calls = []

    def counting(inputs: dict[str, Tensor]) -> Tensor:
        calls.append(1)
        return inputs["x"] * len(calls)

    with pytest.raises(Failed, match=r"^the dry run failed on 1 of 1 keys:\ncase 0: "):
        run(test_00_target.test_dry_run, cpu_target(eager=counting, keys=[2]))


def test_the_dry_run_fails_an_eager_side_that_returns_nothing() -> None:
    with pytest.raises(
        Failed,
        match=r"eager on case 0: key 2, repeat 0; .* returned NoneType, no tensor \(a forgotten return\?\)",
    ):
        run(test_00_target.test_dry_run, cpu_target(eager=lambda inputs: None))


def test_the_dry_run_fails_an_eager_side_whose_state_leaks_from_call_to_call() -> None:
    """Each call adds what the last call of another shape left: case 0 alone, twice in a row,
    agrees with itself; after the other keys it does not."""
    left = {"rows": 0}

    def leaking(inputs: dict[str, Tensor]) -> Tensor:
        rows = inputs["x"].shape[0]
        output = inputs["x"] * 2 + (left["rows"] if left["rows"] != rows else 0)
        left["rows"] = rows
        return output

    with pytest.raises(
        Failed,
        match=r"case 0: eager's answer on case 0: key 2, repeat 0 changed after calls of the other keys \(state carried",
    ):
        run(test_00_target.test_dry_run, cpu_target(eager=leaking, graphed=None))


def test_the_dry_run_calls_a_graphed_side_that_runs_on_the_cpu() -> None:
    figures = run(test_00_target.test_dry_run, cpu_target())
    assert figures == [
        "eager and graphed once on each of 3 keys (graphed runs without CUDA); 3 of your callables "
        "ran"
    ]
    with pytest.raises(
        Failed,
        match=r"case 1: graphed on case 1: key 3, repeat 0; inputs x float32\[3, 4\]: output at",
    ):
        run(test_00_target.test_dry_run, cpu_target(graphed=lambda inputs: inputs["x"] * 3))
    assert run(test_00_target.test_dry_run, cpu_target(graphed=None)) == [
        "eager once on each of 3 keys; 3 of your callables ran"
    ]


def test_the_dry_run_fails_an_eager_side_no_seed_reaches() -> None:
    own = torch.Generator().manual_seed(0)
    unseeded = cpu_target(eager=lambda inputs: inputs["x"] + torch.rand(1, generator=own))
    with pytest.raises(
        Failed,
        match=r"is not reproducible under one seed: it draws from a torch.Generator of its own "
        r"\(eager.own\), which the suite does not seed.*first eager call",
    ):
        run(test_00_target.test_dry_run, unseeded)
    run(test_00_target.test_dry_run, cpu_target(eager=sample, graphed=sample))  # seeded: alike


def test_the_dry_run_fails_a_contract_that_does_not_fit_the_outputs() -> None:
    with pytest.raises(Failed, match=r"tolerance names parts \['logits'\] of an output"):
        run(test_00_target.test_dry_run, cpu_target(tolerance={"logits": Tolerance(atol=1)}))
    pair = cpu_target(
        eager=lambda inputs: {"logits": inputs["x"]},
        graphed=lambda inputs: {"logits": inputs["x"]},
        real_part=lambda inputs: {"cache": slice(0, 1)},
    )
    with pytest.raises(Failed, match=r"real_part names part 'cache', not in the output"):
        run(test_00_target.test_dry_run, pair)
    too_many = replace(pair, real_part=lambda inputs: (0, 0, 0))
    with pytest.raises(Failed, match=r"real_part does not index the output"):
        run(test_00_target.test_dry_run, too_many)


def test_the_contract_check_takes_a_billion_keys_without_drawing_them_all() -> None:
    def keyed(generator: torch.Generator, case: Case) -> dict[str, object]:
        return {"x": torch.randn(2, generator=generator), "key": case.key}

    target = cpu_target(draw=keyed, key_of=lambda inputs: inputs["key"], keys=range(10**9))
    figures = run(test_00_target.test_target_contract, target)
    assert figures[0].startswith("64 of 1000000000 keys, each its draws' key;")
    assert run(test_00_target.test_dry_run, target) == [
        "eager and graphed once on each of 64 keys (graphed runs without CUDA); 3 of your "
        "callables ran"
    ]


def test_real_shapes_may_vary_inside_a_key_from_case_to_case_not_from_draw_to_draw() -> None:
    def rows_by_case(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"x": torch.randn(1 + case.repeat % 2, 4, generator=generator)}  # 1 or 2 rows

    by_case = cpu_target(draw=rows_by_case, key_of=lambda inputs: 0, keys=[0])
    figure = run(test_00_target.test_target_contract, by_case)[0]
    assert figure.endswith("over 4 draws of 1 cases; shapes vary inside 1 of them")

    def rows_by_draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        rows = int(torch.randint(1, 4, (), generator=generator))
        return {"x": torch.randn(rows, 4, generator=generator)}

    by_draw = replace(by_case, draw=rows_by_draw)
    with pytest.raises(Failed, match=r"changes shape or dtype between draws"):
        run(test_00_target.test_target_contract, by_draw)


def test_the_contract_fails_a_draw_that_ignores_its_generator() -> None:
    """Drawn from torch's global generator: each draw differs, under one seed too. The dry run
    must not blame eager for it."""

    def global_draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"x": torch.randn(case.key, 4)}

    with pytest.raises(
        Failed,
        match=r"draw ignores its generator: two draws of case 0: key 2, repeat 0 under one seed differ in x",
    ):
        run(test_00_target.test_target_contract, cpu_target(draw=global_draw))

    def constant(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"x": torch.randn(case.key, 4, generator=generator), "mask": torch.ones(case.key)}

    with pytest.raises(
        Failed, match=r"draw ignores its generator for input 'mask': the same values in 4 draws"
    ):
        run(test_00_target.test_target_contract, cpu_target(draw=constant))


def test_the_dry_run_blames_a_draw_that_ignores_its_generator_not_eager() -> None:
    def global_draw(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        return {"x": torch.randn(case.key, 4)}

    with pytest.raises(Failed) as failure:
        run(test_00_target.test_dry_run, cpu_target(draw=global_draw))
    assert str(failure.value).splitlines() == [
        "the dry run failed on 3 of 3 keys:",
        *(
            f"case {case}: draw ignores its generator: two draws of case {case}: key {key}, "
            "repeat 0 under one seed differ in x"
            for case, key in enumerate(KEYS)
        ),
    ]


def test_the_contract_fails_a_constant_all_nan_input() -> None:
    """NaN is not equal to NaN: compared naively, a constant NaN input "varies"."""

    def nan_input(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
        x = torch.randn(case.key, 4, generator=generator)
        return {"x": x, "junk": torch.full((case.key,), float("nan"))}

    with pytest.raises(Failed, match=r"input 'junk': the same values \(all NaN\) in 4 draws"):
        run(test_00_target.test_target_contract, cpu_target(draw=nan_input))


def test_colliding_keys_are_described_in_the_users_names() -> None:
    target = cpu_target(
        keys=[16, 32],
        draw=lambda g, case: {"x": torch.randn(case.key, generator=g)},
        key_of=lambda inputs: inputs["x"].shape[0] > 8,
    )
    with pytest.raises(Failed) as failure:
        run(test_00_target.test_target_contract, target)
    message = str(failure.value)
    assert message.splitlines()[1:] == [
        "key_of gives True for a draw of the key 16 (case 0: key 16, repeat 0): key_of must give "
        "each draw the key it was drawn for (the checks label every call with key_of and judge "
        "it against the target's keys)",
        "key_of gives True for a draw of the key 32 (case 1: key 32, repeat 0): key_of must give "
        "each draw the key it was drawn for (the checks label every call with key_of and judge "
        "it against the target's keys)",
    ]
    assert "num_keys" not in message and "keys[" not in message


@pytest.mark.parametrize(
    ("changes", "call", "error"),
    [
        (
            {
                "draw": lambda g, case: {
                    "x": torch.randn(case.key, generator=g) * (1 / (2 - case.number))
                }
            },
            "draw(generator, case 2: key 4, repeat 0)",
            "ZeroDivisionError",
        ),
        (
            {"key_of": lambda inputs: [2] if inputs["x"].shape[0] == 4 else 0},
            "key_of(inputs of case 2: key 4, repeat 0)",
            None,
        ),
        (
            {
                "draw": lambda g, case: (
                    {"x": torch.randn(case.key, generator=g)} if case.number < 2 else exit(3)
                )
            },
            "draw(generator, case 2: key 4, repeat 0)",
            "SystemExit: 3",
        ),
    ],
    ids=["draw divides by zero", "unhashable key", "draw exits"],
)
def test_a_field_that_fails_on_a_later_case_is_named_with_the_case_and_the_users_frame(
    changes: dict[str, object], call: str, error: str | None
) -> None:
    with pytest.raises(Failed) as failure:
        run(test_00_target.test_target_contract, cpu_target(**changes))
    headline, *lines = str(failure.value).splitlines()
    assert headline == "the target breaks the protocol:"
    if error is None:  # a value returned: no frame raised it
        assert lines == [
            f"{call} returned list [2], which cannot be a key: TypeError: unhashable type: 'list'"
        ]
        return
    assert lines[0].startswith(f"{call} raised {error}")
    assert lines[1] == "Traceback (your code):"
    assert lines[2].startswith(f'  File "{__file__}", line ')


# Comparing checks: one seed for both sides


def test_the_comparing_checks_seed_both_sides_alike_so_sampling_code_passes() -> None:
    sampler = cpu_target(eager=sample, graphed=StandInGraphs(sample, rows))
    run(test_02_no_baked_inputs.test_no_baked_inputs, sampler)
    run(test_15_side_isolation.test_side_isolation, sampler)
    figures = run(test_10_concurrency.test_concurrency, sampler)
    assert "one call at a time (its answers depend on torch's generators)" in figures[0]


# Owned outputs: what the target declares


class StaticOutputs:
    """A graphed side that hands out one static buffer per key (``per_key``) or one for all,
    behind stand-in graphs, one per key (captured on its first call, replayed by each)."""

    def __init__(self, per_key: bool) -> None:
        self.per_key = per_key
        self.buffers: dict[int, Tensor] = {}
        self.graphs = StandInGraphs(self.write, lambda inputs: inputs["x"].shape[0])

    def __call__(self, inputs: dict[str, Tensor]) -> object:
        return self.graphs(inputs)

    def write(self, inputs: dict[str, object]) -> Tensor:
        x = inputs["x"]
        assert isinstance(x, Tensor)
        slot = x.shape[0] if self.per_key else 0
        buffer = self.buffers.setdefault(slot, torch.empty(max(KEYS), 4))
        buffer[: x.shape[0]] = x * 2
        return buffer[: x.shape[0]]


@pytest.mark.parametrize(
    ("per_key", "lifetime", "passes"),
    [
        (True, "owned", False),  # its next replay overwrites it
        (True, NEXT_CALL_OF_KEY, True),
        (False, NEXT_CALL_OF_KEY, False),  # a call of another key overwrites it
        (False, NEXT_CALL, True),
    ],
)
def test_owned_outputs_checks_the_lifetime_the_target_declares(
    per_key: bool, lifetime: str, passes: bool
) -> None:
    target = cpu_target(graphed=StaticOutputs(per_key), output_lifetime=lifetime)
    if passes:
        figures = run(test_03_owned_outputs.test_owned_outputs, target)
        assert figures[0].startswith(f"outputs {lifetime}: kept over 4 ")
    else:
        with pytest.raises(Failed, match=r"kept output changed"):
            run(test_03_owned_outputs.test_owned_outputs, target)


def test_owned_outputs_keeps_the_first_output_a_graph_gave() -> None:
    """A graph built over several calls (cudagraph trees run a function's first call eagerly
    and capture on its second; two calls without a graph here, the most the check waits
    through): the output kept is the capturing call's, and the capture is this check's own;
    three calls without a graph, and no capture is had."""
    trees_like = StandInGraphs(double, rows, warm_up_calls=2)
    target = cpu_target(graphed=trees_like, output_lifetime=NEXT_CALL)
    figures = run(test_03_owned_outputs.test_owned_outputs, target)
    assert figures == [
        "outputs next call: kept over 4 eager calls (key 3, from the first case's call 3); "
        "1 capture(s) of its keys in this check"
    ]
    late = cpu_target(
        graphed=StandInGraphs(double, rows, warm_up_calls=3), output_lifetime=NEXT_CALL
    )
    with pytest.raises(pytest.fail.Exception, match=r"^not exercised: "):
        run(test_03_owned_outputs.test_owned_outputs, late)


def test_with_one_key_valid_until_its_next_call_means_valid_until_the_next_call() -> None:
    one_key = cpu_target(graphed=StaticOutputs(True), output_lifetime=NEXT_CALL_OF_KEY, keys=[2])
    figures = run(test_03_owned_outputs.test_owned_outputs, one_key)
    assert figures[0].startswith("outputs next call of its key: kept over 4 eager calls")


def test_parity_compares_each_part_within_its_tolerance_over_the_real_rows() -> None:
    def padded(noise: float) -> Callable[[dict[str, Tensor]], dict[str, Tensor]]:
        def call(inputs: dict[str, Tensor]) -> dict[str, Tensor]:
            x = inputs["x"]
            junk = torch.full((max(KEYS) - x.shape[0], 4), 99.0)
            return {"logits": torch.cat([x * 2 + noise, junk]), "cache": x.clone()}

        return call

    results: list[ParityResult] = []
    target = cpu_target(
        eager=lambda inputs: {"logits": inputs["x"] * 2, "cache": inputs["x"]},
        graphed=padded(1e-4),
        tolerance={"logits": Tolerance(atol=1e-3)},
        real_part=lambda inputs: {"logits": slice(0, inputs["x"].shape[0])},
    )
    checker = ParityChecker(CPU, on_result=results.append)
    run(test_01_parity.test_parity, target, graph_parity=checker)
    assert [result.ok for result in results] == [True]
    results.clear()
    run(test_01_parity.test_parity, replace(target, graphed=padded(1e-2)), graph_parity=checker)
    [logits_beyond] = results
    assert {m.path for o in logits_beyond.failures for m in o.mismatches} == {"output['logits']"}
    results.clear()

    def cache_off(inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        return {**padded(1e-4)(inputs), "cache": inputs["x"] + 1e-4}  # not named: exact

    run(test_01_parity.test_parity, replace(target, graphed=cache_off), graph_parity=checker)
    [cache_differs] = results
    assert {m.path for o in cache_differs.failures for m in o.mismatches} == {"output['cache']"}


# Guards: declared refusals


def assert_guard() -> None:
    assert False, "Caches must be initialized first"  # noqa: B011 (a guard written as an assert)


def test_an_assert_refuses_a_mode_where_the_target_declares_assertion_error() -> None:
    modes = {"no KV cache": (assert_guard, "Caches must")}
    declared = cpu_target(guards=Guards(modes, refusal_errors=(AssertionError,)))
    assert run(test_07_guards.test_guards, declared) == ["1 of 1 unsupported modes refused clearly"]
    with pytest.raises(
        Failed,
        match=r"AssertionError\('Caches must be initialized first.*'\) is not one of the target's refusal_errors \(ValueError, TypeError, RuntimeError\)",
    ):
        run(test_07_guards.test_guards, cpu_target(guards=Guards(modes)))


# Side isolation: state shared by both sides


def test_side_isolation_fails_a_graphed_side_that_reads_what_only_eager_writes() -> None:
    state = torch.zeros(max(KEYS), 4)

    def eager(inputs: dict[str, Tensor]) -> Tensor:
        state[: inputs["x"].shape[0]] = inputs["x"]
        return state[: inputs["x"].shape[0]] * 2

    def graphed(inputs: dict[str, Tensor]) -> Tensor:  # forgets to write x into the state
        return state[: inputs["x"].shape[0]] * 2

    shared = cpu_target(eager=eager, graphed=graphed)
    results: list[ParityResult] = []
    run(
        test_01_parity.test_parity,
        shared,
        graph_parity=ParityChecker(CPU, on_result=results.append),
    )
    assert results[0].ok  # eager, then graphed, on the same inputs: parity cannot tell
    with pytest.raises(Failed, match=r"key 2, graphed right after eager on other inputs"):
        run(test_15_side_isolation.test_side_isolation, shared)


# Concurrency: the declared threading model


def test_a_single_threaded_target_skips_concurrency_saying_so() -> None:
    with pytest.raises(pytest.skip.Exception, match=r"single-threaded \(threads='single'\)"):
        run(test_10_concurrency.test_concurrency, cpu_target(threads=SINGLE))


class ThreadBound:
    """Graphed code that works only on the thread it was built on (per-thread state)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        if threading.get_ident() != self.thread:
            raise RuntimeError("called from another thread than the one that built it")
        return double(inputs)


class Racy:
    """Graphed code with one static buffer and no lock: a call between another's write and read
    gives that one the wrong answer."""

    def __init__(self) -> None:
        self.buffer = torch.zeros(max(KEYS), 4)
        self.barrier = threading.Barrier(2, timeout=5)

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        x = inputs["x"]
        self.buffer[: x.shape[0]] = x
        try:
            self.barrier.wait()  # two threads in the call at once
        except threading.BrokenBarrierError:
            pass
        return self.buffer[: x.shape[0]] * 2


@pytest.mark.slow
def test_concurrency_holds_the_target_to_the_threads_it_declares() -> None:
    with pytest.raises(Failed, match=r"called from another thread"):
        run(test_10_concurrency.test_concurrency, cpu_target(graphed=ThreadBound(), threads=SERIAL))
    with pytest.raises(Failed, match=r"threaded results differ"):
        run(test_10_concurrency.test_concurrency, cpu_target(graphed=Racy()))
    figures = run(test_10_concurrency.test_concurrency, cpu_target(graphed=Racy(), threads=SERIAL))
    assert "one call at a time (threads='serial')" in figures[0]


# Lock safety at torch's graph API, with a stand-in of torch.cuda.CUDAGraph


class StandInCache:
    """A per-key graph cache on the stand-in graphs, under a lock; ``early`` caches the entry
    before its capture ends, ``leaky_lock`` releases the lock only when the call succeeds."""

    def __init__(self, early: bool = False, leaky_lock: bool = False) -> None:
        self.lock = threading.Lock()
        self.graphs: dict[int, StandInGraph] = {}
        self.early, self.leaky_lock = early, leaky_lock

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        key = inputs["x"].shape[0]
        if self.leaky_lock:
            self.lock.acquire()
            output = self.run(key, inputs)
            self.lock.release()
            return output
        with self.lock:
            return self.run(key, inputs)

    def run(self, key: int, inputs: dict[str, Tensor]) -> Tensor:
        if key not in self.graphs:
            graph = StandInGraph()
            if self.early:
                self.graphs[key] = graph
            graph.capture_begin()
            graph.capture_end()
            self.graphs[key] = graph
        self.graphs[key].replay()
        return double(inputs)


def cache_target(cache: StandInCache) -> CudaGraphTarget:
    return cpu_target(
        graphed=cache, cache=Cache(lock=cache.lock, cached_keys=lambda: list(cache.graphs))
    )


def lock_safety(target: CudaGraphTarget) -> list[str]:
    return run(
        test_08_lock_safety.test_lock_safety,
        target,
        fault_injector=FaultInjector(),
        torch_graph_faults=GraphFaults(StandInGraph),
    )


def test_lock_safety_injects_faults_at_torchs_graph_api_when_the_target_names_none() -> None:
    figures = lock_safety(cache_target(StandInCache()))
    assert figures == [
        "faults at capture_begin, capture_end, replay (torch's graph API): lock, entries, next "
        "call checked"
    ]
    with pytest.raises(Failed, match=r"capture_begin: the lock was still held"):
        lock_safety(cache_target(StandInCache(leaky_lock=True)))
    with pytest.raises(Failed) as early:
        lock_safety(cache_target(StandInCache(early=True)))
    for stage in ("capture_begin", "capture_end"):  # a key cached before its capture ended
        assert f"{stage}: the failed call left keys [" in str(early.value)
        assert f"{stage}: next call raised RuntimeError: replay without a preceding" in str(
            early.value
        )
    assert "replay: " not in str(early.value)


def test_lock_safety_reports_stages_no_call_reaches_and_fails_when_none_is() -> None:
    cache = StandInCache()
    for key in KEYS:  # captured up front, as a runner does at start-up
        cache({"x": torch.zeros(key, 4)})
    figures = lock_safety(cpu_target(graphed=cache))
    assert figures == [
        "faults at capture_begin, capture_end, replay (torch's graph API): next call checked; "
        "not reached: capture_begin, capture_end"
    ]
    with pytest.raises(Failed, match=r"no call reached torch's graph API"):
        lock_safety(cpu_target())


# Memory over a long run, with a probe whose readings the target sets


class CountedMemory:
    """Stands for the device memory probe: the process holds what the target says it does."""

    def __init__(self) -> None:
        self.bytes = 1024 * MiB

    def reading(self) -> MemorySample:
        return MemorySample(self.bytes, 0, 0)

    def sample(self) -> MemorySample:
        return self.reading()

    def young_sample(self) -> MemorySample:
        return self.reading()

    def sample_within(self, limit_bytes: int) -> MemorySample:
        return self.reading()


class MemoryCache:
    """An LRU of ``capacity`` stand-in graphs of 64 MiB each (``evicts``: or it keeps them all
    while saying so), and ``leak`` bytes left behind by every call."""

    def __init__(
        self, memory: CountedMemory, capacity: int, evicts: bool = True, leak: int = 0
    ) -> None:
        self.memory, self.capacity, self.evicts, self.leak = memory, capacity, evicts, leak
        self.graphs: dict[int, StandInGraph] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        key = inputs["x"].shape[0]
        if key not in self.graphs:
            graph = StandInGraph()
            graph.capture_begin()
            graph.capture_end()
            self.graphs[key] = graph
            self.memory.bytes += 64 * MiB
            if self.evicts and len(self.graphs) > self.capacity:
                del self.graphs[next(iter(self.graphs))]
                self.memory.bytes -= 64 * MiB
        self.graphs[key] = self.graphs.pop(key)
        self.graphs[key].replay()
        self.memory.bytes += self.leak
        return double(inputs)


def long_run(**cache: object) -> list[str]:
    memory = CountedMemory()
    capacity = cache["capacity"]
    assert isinstance(capacity, int)
    target = cpu_target(graphed=MemoryCache(memory, **cache), cache=Cache(capacity=capacity))
    return run(
        test_09_bounded_memory.test_memory_over_a_long_run,
        target,
        device_memory=memory,
        capture_counter=CaptureCounter(StandInGraph),
    )


def test_memory_over_a_long_run_needs_no_reset_and_judges_the_declared_capacity() -> None:
    figures = long_run(capacity=2)
    assert figures == [
        "2 rounds over 3 keys after 3 warm-up rounds (+128 MiB, not judged): peak +0 MiB of "
        "256 MiB; 3 captures per round, capacity 2"
    ]
    with pytest.raises(Failed, match=r"memory grew by 300 MiB over 2 more rounds"):
        long_run(capacity=3, leak=50 * MiB)
    with pytest.raises(Failed, match=r"captured 0 graphs per round, fewer than the 1"):
        long_run(capacity=2, evicts=False)


def test_the_docs_give_the_checks_own_numbers() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "conformance.md").read_text(encoding="utf-8")
    memory = test_09_bounded_memory
    threads = test_10_concurrency
    for phrase in (
        f"each key (up to {test_00_target.MAX_KEYS})",
        f"{test_01_parity.CASES} cases on up to {test_01_parity.MAX_KEYS} keys",
        f"{memory.SHAPES} calls (cases 0 to {memory.SHAPES - 1}",
        f"+ {memory.SLACK_MIB} MiB",
        f"graph_memory_bound({memory.RESET_BOUND_MIB})",
        f"after {memory.WARM_ROUNDS} warm-up rounds over up to {memory.LONG_RUN_KEYS} keys",
        f"{memory.JUDGED_ROUNDS} more rounds of the same keys",
        f"{threads.THREADS} threads x {threads.CALLS_PER_THREAD} calls on {threads.KEYS} keys",
        f"up to {test_08_lock_safety.KEYS} keys, {test_08_lock_safety.ROUNDS} rounds",
        f"on each of up to {test_15_side_isolation.KEYS} keys",
    ):
        assert phrase in docs, phrase


# Checks whose verdict comes from one assertion over what they gathered: each called on CPU
# targets right and wrong, so that a verdict turned into a no-op fails here.


def test_identical_sampling_fails_a_sampler_whose_tokens_change_with_graphs_on() -> None:
    def sampler(differs_at: int) -> Sampling:
        return Sampling(lambda seed, graphs: torch.tensor([seed, seed * graphs * differs_at]))

    figures = run(
        test_04_identical_sampling.test_identical_sampling, cpu_target(sampling=sampler(0))
    )
    assert figures == ["graphs off vs on, seeds 0, 1: 4 tokens per side"]
    with pytest.raises(Failed, match=r"sampled tokens differ:\n.*seed\[1\]"):
        run(test_04_identical_sampling.test_identical_sampling, cpu_target(sampling=sampler(1)))


def test_capture_clean_runs_the_forward_once_before_and_once_under_no_host_sync() -> None:
    calls: list[str] = []
    capture_clean = CaptureClean(lambda: calls.append("forward"))
    forward = test_05_capture_clean.forward.__wrapped__(capture_clean)  # type: ignore[attr-defined]
    assert calls == ["forward"], "first use is paid before the check"
    figures: list[str] = []
    test_05_capture_clean.test_capture_clean_forward(forward, StandInConclude(figures))
    assert calls == ["forward", "forward"]
    assert figures == ["one eager forward at the largest key, in sync debug mode 'error'"]
    marks = [mark.name for mark in test_05_capture_clean.test_capture_clean_forward.pytestmark]
    assert "no_host_sync" in marks, "the marker is what judges the forward"


def device_binding(monkeypatch: pytest.MonkeyPatch, **probed: object) -> list[str]:
    """The device-binding check on what its fresh-process probe found: a clean run, then
    ``probed``."""
    found = {
        "calls": 8,
        "keys": 4,
        "problems": [],
        "current_after": 0,
        "torch_reserved_on_current": 0,
        "nvml_on_current": (None, None),
        "nvml_on_target": 300 * MiB,
        **probed,
    }
    check = test_06_device_binding
    monkeypatch.setattr(check, "chosen_target_spec", lambda config: "mine:make")
    monkeypatch.setattr(check, "run_in_fresh_process", lambda probe, spec, cases, timeout: found)
    figures: list[str] = []
    check.test_device_binding(
        SimpleNamespace(config=None),  # type: ignore[arg-type]
        figures.append,
        StandInConclude(figures),
    )
    return figures


@pytest.mark.parametrize(
    ("probed", "problem"),
    [
        ({"problems": ["case 1 (replay): output differs"]}, "case 1 \\(replay\\): output differs"),
        ({"current_after": 1}, "cuda:1 was left current instead of cuda:0"),
        ({"torch_reserved_on_current": 2 * MiB}, "torch reserved 2.0 MiB on cuda:0"),
        ({"nvml_on_current": (None, 300 * MiB)}, "a CUDA context appeared on cuda:0"),
        ({"nvml_on_current": (100 * MiB, 101 * MiB)}, "memory on cuda:0 grew by 1 MiB"),
    ],
)
def test_device_binding_fails_each_trace_left_on_the_current_device(
    monkeypatch: pytest.MonkeyPatch, probed: dict[str, object], problem: str
) -> None:
    with pytest.raises(Failed, match=problem):
        device_binding(monkeypatch, **probed)


def test_device_binding_passes_a_clean_run_and_skips_where_nvml_cannot_see(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert device_binding(monkeypatch, nvml_on_current=(100 * MiB, 100 * MiB + MiB - 1)) == [
        "8 calls over 4 keys on cuda:1 with cuda:0 current",
        "8 calls over 4 keys on cuda:1 with cuda:0 current: max |diff| 0, no context on cuda:0",
    ]
    with pytest.raises(pytest.skip.Exception, match="NVML cannot see this process's contexts"):
        device_binding(monkeypatch, nvml_on_target="NVML unavailable: no driver")


class Unrecovered(StandInCache):
    """A cache that goes on after a failed capture and answers wrong from then on (``now``:
    the faulted call too, answered instead of raising); ``missing``: a key it fails on by
    itself, fault or none."""

    def __init__(self, now: bool = False, missing: int | None = None) -> None:
        super().__init__()
        self.broken, self.now, self.missing = False, now, missing

    def run(self, key: int, inputs: dict[str, Tensor]) -> Tensor:
        if key == self.missing:
            raise KeyError(f"no bucket for {key}")
        try:
            output = super().run(key, inputs)
        except test_08_lock_safety.InjectedFault:
            self.broken = True
            if not self.now:
                raise
            return inputs["x"] * 3
        return output * 3 if self.broken else output


@pytest.mark.parametrize(
    ("cache", "problem"),
    [
        (Unrecovered(), "capture_begin: next call: output at index"),
        (Unrecovered(now=True), "capture_begin: recovered call: output at index"),
        (Unrecovered(missing=KEYS[0]), "capture_begin: a call raised before the fault: KeyError"),
    ],
)
def test_lock_safety_fails_a_wrong_answer_after_the_fault(
    cache: StandInCache, problem: str
) -> None:
    with pytest.raises(Failed, match=problem):
        lock_safety(cache_target(cache))


class OwnStages:
    """Code with fault points of its own: ``warm_up`` and ``capture`` once per key, ``replay``
    on every call; ``skips`` names a stage it never calls."""

    def __init__(self, skips: str = "") -> None:
        self.built: set[int] = set()
        self.skips = skips

    def warm_up(self) -> None:
        pass

    def capture(self) -> None:
        pass

    def replay(self) -> None:
        pass

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        key = inputs["x"].shape[0]
        for stage in ("warm_up", "capture") if key not in self.built else ():
            if stage != self.skips:
                getattr(self, stage)()
        self.built.add(key)
        self.replay()
        return double(inputs)


def own_stages(code: OwnStages) -> list[str]:
    points = {stage: (code, stage) for stage in ("warm_up", "capture", "replay")}
    target = cpu_target(graphed=code, cache=Cache(fault_points=points, reset=code.built.clear))
    return lock_safety(target)


def test_lock_safety_injects_at_the_targets_own_stages_and_fails_one_never_reached() -> None:
    assert own_stages(OwnStages()) == ["faults at warm_up, capture, replay: next call checked"]
    with pytest.raises(Failed, match=r"capture: never called in 9 calls"):
        own_stages(OwnStages(skips="capture"))


class BoundedCache:
    """``capacity`` graphs of 300 MiB each on the counted memory, the oldest evicted when the
    next is built (so it holds ``capacity + 1`` until then); ``leak`` left per graph built and
    ``kept`` by each ``reset()``."""

    GRAPH = 300 * MiB

    def __init__(self, capacity: int, leak: int = 0, kept: int = 0) -> None:
        self.memory, self.capacity, self.leak, self.kept = CountedMemory(), capacity, leak, kept
        self.graphs: list[int] = []

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        key = inputs["x"].shape[0]
        if key not in self.graphs:
            if len(self.graphs) > self.capacity:
                self.graphs.pop(0)
                self.memory.bytes -= self.GRAPH
            self.graphs.append(key)
            self.memory.bytes += self.GRAPH + self.leak
        return double(inputs)

    def reset(self) -> None:
        self.memory.bytes -= self.GRAPH * len(self.graphs) - self.kept
        self.graphs.clear()


def bounded_memory(cache: BoundedCache) -> list[str]:
    """The check's figures."""
    target = cpu_target(
        graphed=cache,
        cache=Cache(reset=cache.reset, capacity=cache.capacity, largest_key=KEYS[-1]),
    )
    return run(test_09_bounded_memory.test_bounded_memory, target, device_memory=cache.memory)


def test_bounded_memory_allows_one_graph_past_the_capacity_and_no_more() -> None:
    figures = bounded_memory(BoundedCache(capacity=1))
    assert figures[0].startswith(
        "24 calls over 3 keys, capacity 1: peak +600 MiB of bound 856 MiB (largest graph 300 MiB)"
    )
    with pytest.raises(Failed, match=r"memory grew to .* past the bound of"):
        bounded_memory(BoundedCache(capacity=1, leak=50 * MiB))
    with pytest.raises(Failed, match=r"after reset\(\) the process still holds \+300 MiB"):
        bounded_memory(BoundedCache(capacity=1, kept=150 * MiB))


def test_memory_over_a_long_run_allows_the_slack_and_the_captures_the_capacity_needs() -> None:
    memory = CountedMemory()
    cache = MemoryCache(memory, capacity=3)

    def leaking(inputs: dict[str, Tensor]) -> Tensor:
        if inputs["x"].shape[0] == KEYS[0]:  # twice in the judged rounds: the whole slack
            memory.bytes += 128 * MiB
        return cache(inputs)

    figures = run(
        test_09_bounded_memory.test_memory_over_a_long_run,
        cpu_target(graphed=leaking),
        device_memory=memory,
    )
    assert "peak +256 MiB of 256 MiB" in figures[0]
    figures = run(
        test_09_bounded_memory.test_memory_over_a_long_run,
        cpu_target(graphed=PinnedCache(capacity=2), cache=Cache(capacity=2)),
        device_memory=CountedMemory(),
    )
    assert "1 captures per round, capacity 2" in figures[0]


class PinnedCache:
    """Keeps the graphs of its first ``capacity`` keys for good and captures any other key
    afresh at each call: the fewest captures a cache of that capacity can make."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.graphs: dict[int, StandInGraph] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        key = inputs["x"].shape[0]
        graph = self.graphs.get(key)
        if graph is None:
            graph = StandInGraph()
            graph.capture_begin()
            graph.capture_end()
            if len(self.graphs) < self.capacity:
                self.graphs[key] = graph
        graph.replay()
        return double(inputs)


def test_a_step_that_writes_its_inputs_in_place_alike_on_both_sides_is_right() -> None:
    """Each side gets inputs of its own, drawn or copied before any call may write them: the
    dry run compares draws as drawn, and no baked inputs gives the graphed side its copy before
    eager's call doubles eager's."""

    def doubling(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["x"].mul_(2) + 1

    graphs = StandInGraphs(doubling, rows)
    run(test_00_target.test_dry_run, cpu_target(eager=doubling, graphed=graphs))
    counter = CaptureCounter(StandInGraph)
    (figure,) = run(
        test_02_no_baked_inputs.test_no_baked_inputs,
        cpu_target(eager=doubling, graphed=StandInGraphs(doubling, rows)),
        capture_counter=counter,
    )
    assert figure == "key 3: changed x one at a time; 1 capture(s) of its keys in this check"
