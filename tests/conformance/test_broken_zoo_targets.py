"""The checks of the bugs seen in the wild can fail, and only where they should.

On the CPU (in CI): each check called as a function on small CPU targets right and wrong in its
way, with stand-ins where the check works through a GPU (a class of torch.cuda.CUDAGraph's shape
for capture and replay counts, a stand-in of make_graphed_callables' warm-ups), each twin of
broken_zoo_targets.py built and validated, and the twins' faults shown without graphs where they
can be. On a GPU: each twin fails the check meant for its class and no other, its control
passes, and the reference passes every new check it does not skip for a stated reason."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from broken_zoo_targets import batch_scaled
from cpu_checks import CPU, KEYS, cpu_target, double, run
from graph_stand_ins import StandInGraph
from suite_runner import table_verdicts
from torch import Tensor, nn

from pytest_cudagraph.conformance import (
    Cache,
    Case,
    CudaGraphTarget,
    Fallbacks,
    Padding,
    State,
    Tolerance,
    Trajectory,
    validate_target,
)
from pytest_cudagraph.conformance._catalog import declaration_of, declared_checks, lacking_reason
from pytest_cudagraph.conformance._judging import draw, numbered
from pytest_cudagraph.conformance.checks import (
    test_16_inputs_unchanged,
    test_17_padded_batches,
    test_18_replay_order,
    test_19_graphs_used,
    test_21_module_state,
    test_22_rebound_tensors,
    test_23_trajectory,
)
from pytest_cudagraph.engines.units import KiB, MiB
from pytest_cudagraph.skips import needs_cuda


def reported(failure: pytest.ExceptionInfo[BaseException]) -> list[str]:
    """The lines of a check's failure message (pytest's rewrite of the check's assert indents
    them and appends the assertion itself)."""
    lines = []
    for line in str(failure.value).splitlines():
        if line.startswith("assert "):
            break
        lines.append(line.removeprefix("  "))
    return lines


def declared_names() -> set[str]:
    """The names of the suite's checks, as their declarations give them (the table's rows)."""
    return {declaration.name for declaration in declared_checks()}


def skip_reason(check: Callable[..., None], target: CudaGraphTarget) -> str | None:
    """Why the suite skips ``check`` on ``target`` for what its declaration needs (the suite's
    conftest skips it so, before the check runs), or None when it runs."""
    declaration = declaration_of(check)
    assert declaration is not None, f"{check.__name__} declares nothing"
    missing = declaration.lacking(target)
    return lacking_reason(missing) if missing else None


def captured() -> StandInGraph:
    graph = StandInGraph()
    graph.capture_begin()
    graph.capture_end()
    return graph


# Inputs unchanged


class StaticArguments:
    """make_graphed_callables' way with its arguments: the first tensors of each shape become
    the graph's static inputs (its stand-in graph captured then, and replayed by every call of
    the shape) and later calls are copied into them; ``clone`` keeps copies of them instead (as
    the graphed_callables adapter does)."""

    def __init__(self, clone: bool) -> None:
        self.clone = clone
        self.static: dict[torch.Size, Tensor] = {}
        self.graphs: dict[torch.Size, StandInGraph] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        x = inputs["x"]
        static = self.static.get(x.shape)
        if static is None:
            static = self.static[x.shape] = x.clone() if self.clone else x
            self.graphs[x.shape] = captured()
        elif static.data_ptr() != x.data_ptr():
            static.copy_(x)
        self.graphs[x.shape].replay()
        return static * 2


def test_inputs_unchanged_fails_a_graph_that_keeps_the_callers_first_tensors() -> None:
    check = test_16_inputs_unchanged.test_inputs_unchanged
    assert run(check, cpu_target(graphed=StaticArguments(clone=True))) == [
        "9 calls over 3 keys: 9 input tensors held to eager's effect after each later call; "
        "3 capture(s) of its keys in this check"
    ]
    with pytest.raises(pytest.fail.Exception) as failure:
        run(check, cpu_target(graphed=StaticArguments(clone=False)))
    lines = reported(failure)
    assert lines[0] == "graphed calls left the caller's inputs other than eager leaves them:"
    assert re.fullmatch(
        r"input 'x' of call 0 \(case 0, key 2\) at index \(0, 0\): eager left \S+, now \S+ "
        r".*; seen after call 3 \(case 3, key 2\)",
        lines[1],
    ), lines[1]
    assert len(lines) == 1 + 3  # each key's first tensors, rewritten by the next round


# Padded batches


def padded_inputs(generator: torch.Generator, rows: int) -> dict[str, object]:
    """``rows`` real rows of x in the smallest of the buckets 1, 2, 4, the rest padding."""
    bucket = next(bucket for bucket in (1, 2, 4) if bucket >= rows)
    return {"x": torch.randn(bucket, 4, generator=generator), "rows": rows}


def nan_padding(inputs: dict[str, object]) -> dict[str, object]:
    x = inputs["x"].clone()
    x[inputs["rows"] :] = float("nan")
    return {**inputs, "x": x}


def real_rows_doubled(inputs: dict[str, object]) -> Tensor:
    return inputs["x"][: inputs["rows"]] * 2


def padded_target(
    graphed: Callable[[dict[str, object]], Tensor], **padding: object
) -> CudaGraphTarget:
    return cpu_target(
        eager=real_rows_doubled,
        graphed=graphed,
        keys=[1, 2, 4],
        draw=lambda generator, case: padded_inputs(generator, case.key),
        padding=Padding(4, padded_inputs, **{"junk": nan_padding, **padding}),
    )


def test_padded_batches_calls_every_size_and_fails_padding_that_reaches_real_rows() -> None:
    check = test_17_padded_batches.test_padded_batches
    assert run(check, padded_target(real_rows_doubled)) == [
        "real batches of 1 to 4 rows over 3 keys against eager; junk in the padded part of 1"
    ]

    def scaled_over_the_bucket(inputs: dict[str, object]) -> Tensor:
        return batch_scaled(inputs["x"])[: inputs["rows"]] * 2

    with pytest.raises(pytest.fail.Exception) as failure:
        run(check, padded_target(scaled_over_the_bucket))
    (line,) = reported(failure)[1:]
    assert line.startswith(
        "3 real rows (key 4, seed 3), junk in its padded part: output at index (0, 0): eager "
    )
    assert ", graphed nan " in line


@pytest.mark.parametrize(("rows", "key"), [(1, 1), (3, 4), (4, 4)])
def test_padded_batches_fails_a_graph_wrong_at_one_size_the_first_and_last_too(
    rows: int, key: int
) -> None:
    def wrong_at_one_size(inputs: dict[str, object]) -> Tensor:
        return real_rows_doubled(inputs) + (inputs["rows"] == rows)

    with pytest.raises(pytest.fail.Exception) as failure:
        run(test_17_padded_batches.test_padded_batches, padded_target(wrong_at_one_size, junk=None))
    (line,) = reported(failure)[1:]
    assert line.startswith(f"{rows} real rows (key {key}, seed {rows}): output at index (0, 0): ")


def test_padded_batches_fails_junk_that_poisons_nothing_and_needs_padding() -> None:
    check = test_17_padded_batches.test_padded_batches
    with pytest.raises(
        pytest.fail.Exception, match=r"padding.junk changed no call of 1 to 4 real rows"
    ):
        run(check, padded_target(real_rows_doubled, junk=lambda inputs: dict(inputs)))
    assert skip_reason(check, cpu_target()) == lacking_reason(["padding"])


def test_the_padding_twins_batch_scale_is_exact_on_finite_rows_and_spreads_nan() -> None:
    memory = torch.randn(4, 64, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(batch_scaled(memory), memory)
    memory[3] = float("nan")  # a padded row holding junk
    assert batch_scaled(memory)[:3].isnan().all()


# Replay order


class SharedPool:
    """Per-key graphs sharing one pool: the first key's replays write their temporaries to
    ``pool``, where every later key's capture took its calibration (ones, written once)."""

    def __init__(self) -> None:
        self.pool = torch.zeros(4)
        self.first: int | None = None
        self.calibration: dict[int, Tensor] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        x, key = inputs["x"], inputs["x"].shape[0]
        if self.first is None:
            self.first = key
        elif key not in self.calibration and key != self.first:
            self.calibration[key] = self.pool
            self.pool.fill_(1.0)
        if key == self.first:
            self.pool.copy_(x[0])  # a temporary, over memory another key holds data in
            return x * 2
        return x * 2 * self.calibration[key]


@pytest.mark.slow
def test_replay_order_fails_graphs_whose_replays_overwrite_anothers_memory() -> None:
    check = test_18_replay_order.test_replay_order
    assert run(check, cpu_target()) == [
        "12 calls over 3 keys (key order, reversed, A-B-A); 12 canaries"
    ]
    with pytest.raises(pytest.fail.Exception) as failure:
        run(check, cpu_target(graphed=SharedPool()))
    first = reported(failure)[1]
    assert first.startswith(
        "call 7 (A-B-A of keys 0 and 1: case 22, seed 7, key 3): output at index"
    )
    assert test_18_replay_order.replay_orders(3) == [
        ("in key order", [0, 1, 2]),
        ("reversed", [2, 1, 0]),
        ("A-B-A of keys 0 and 1", [0, 1, 0]),
        ("A-B-A of keys 1 and 2", [1, 2, 1]),
    ]


@pytest.mark.slow
def test_replay_order_fails_a_write_into_a_canary_and_needs_two_keys(monkeypatch) -> None:
    """A graphed side that writes memory it does not own: here the test hands it the canaries
    as the check lays them."""
    laid: list[Tensor] = []
    rand = torch.rand

    def laying(*args: object, **kwargs: object) -> Tensor:
        laid.append(rand(*args, **kwargs))
        return laid[-1]

    monkeypatch.setattr(torch, "rand", laying)
    calls: list[None] = []

    def stray(inputs: dict[str, Tensor]) -> Tensor:
        calls.append(None)
        if len(calls) == 5:
            laid[0].zero_()
        return double(inputs)

    check = test_18_replay_order.test_replay_order
    with pytest.raises(pytest.fail.Exception) as failure:
        run(check, cpu_target(graphed=stray))
    (line,) = reported(failure)[1:]
    assert line.startswith("a canary of 512 bytes laid before the first call at index (0,): was")
    assert line.endswith("seen after call 4 (reversed: case 13, seed 4, key 3)")
    with pytest.raises(pytest.skip.Exception, match=r"the target has 1 key it can hold"):
        run(check, cpu_target(cache=Cache(capacity=1)))


# Graphs used


class UpFrontRunner:
    """Captures a stand-in graph per key up front, as a runner does at start-up; a call of a key
    in ``eager_keys`` runs without its graph."""

    def __init__(self, eager_keys: frozenset[int] = frozenset()) -> None:
        self.graphs = {rows: captured() for rows in KEYS}
        self.eager_keys = eager_keys

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        rows = inputs["x"].shape[0]
        if rows not in self.eager_keys:
            self.graphs[rows].replay()
        return double(inputs)


def test_graphs_used_counts_replays_of_graphs_captured_before_and_fails_a_bypass() -> None:
    check = test_19_graphs_used.test_graphs_used
    # The replays counted are the warm-up rounds' and the judged rounds'.
    assert run(check, cpu_target(graphed=UpFrontRunner())) == [
        "6 calls over 3 keys after 2 warm-up rounds: 12 replays, 0 calls without their graphs"
    ]
    bypassing = cpu_target(graphed=UpFrontRunner(frozenset({3})))
    with pytest.raises(pytest.fail.Exception) as failure:
        run(check, bypassing)
    assert reported(failure) == [
        "2 of 6 calls of cached keys ran without their graphs (none declared in runs_eagerly):",
        "call 7 (case 7, key 3) replayed 0 graph(s), where a call of its key replayed 0 in the "
        "warm-up rounds: the graphed path ran without them",
        "call 10 (case 10, key 3) replayed 0 graph(s), where a call of its key replayed 0 in the "
        "warm-up rounds: the graphed path ran without them",
    ]
    declared = cpu_target(
        graphed=UpFrontRunner(frozenset({3})),
        fallbacks=Fallbacks(runs_eagerly=lambda inputs: len(inputs["x"]) == 3),
    )
    assert run(check, declared) == [
        "6 calls over 3 keys after 2 warm-up rounds: 8 replays, 0 calls without their graphs; 2 "
        "eager, as the target declares"
    ]


# Module state


class WarmedUp:
    """A stand-in of make_graphed_callables' graph of ``module``: its build runs the forward
    three times (warm-ups) and once more as the capture, whose tensor writes a real capture
    does not make (undone here); each replay makes the forward's tensor writes, not its
    Python ones (undone here)."""

    WARM_UPS = 3

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.graphs: dict[int, StandInGraph] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        x = inputs["x"]
        if x.shape[0] not in self.graphs:
            for _ in range(self.WARM_UPS):
                self.module(x)
            graph = self.graphs[x.shape[0]] = StandInGraph()
            graph.capture_begin()
            saved = [buffer.clone() for buffer in self.module.buffers()]
            self.module(x)
            for buffer, value in zip(self.module.buffers(), saved, strict=True):
                buffer.copy_(value)
            graph.capture_end()
        numbers = [(m, name, v) for m in self.module.modules() for name, v in vars(m).items()]
        output = self.module(x)
        for module, name, value in numbers:
            if isinstance(value, int):
                setattr(module, name, value)
        self.graphs[x.shape[0]].replay()
        return output


class Counted(nn.Module):
    """A linear layer counting its calls in Python."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        return self.linear(x)


def stateful_target(module: nn.Module) -> CudaGraphTarget:
    """Eager on ``module``, graphed on a copy of it through ``WarmedUp``, whose graphs the
    cache's reset drops (the suite's probe of the state builds case 0's first)."""
    eager_side, graphed_side = module, copy.deepcopy(module)
    warmed = WarmedUp(graphed_side)
    return cpu_target(
        eager=lambda inputs: eager_side(inputs["x"]).detach(),
        graphed=lambda inputs: warmed(inputs).detach(),
        state=State(sides=lambda: (eager_side, graphed_side)),
        cache=Cache(reset=warmed.graphs.clear),
    )


@torch.no_grad()
def test_module_state_fails_warm_ups_that_update_a_batch_norm_once_per_build() -> None:
    check = test_21_module_state.test_module_state
    assert run(check, stateful_target(nn.BatchNorm1d(4).eval())) == [
        "4 call pairs over 2 keys (2 built a graph): 11 pieces of state compared"
    ]
    with pytest.raises(pytest.fail.Exception) as failure:
        run(check, stateful_target(nn.BatchNorm1d(4).train()))
    lines = reported(failure)[1:]
    assert [line.partition(": state")[0] for line in lines] == [
        "case 0 (key 2), building its graph (warm-ups, capture, replay)"
    ] * 3 + ["case 1 (key 3), building its graph (warm-ups, capture, replay)"] * 3
    paths = [re.search(r"state\['(\w+)'\]", line)[1] for line in lines]
    assert paths == ["running_mean", "running_var", "num_batches_tracked"] * 2
    assert lines[2].endswith(
        "state['num_batches_tracked'] at index (): eager 1, graphed 4 (|diff| 3, rel 3; "
        "tolerance exact); 1 of 1 elements differ, largest |diff| 3"
    )


@torch.no_grad()
def test_module_state_fails_a_python_counter_that_replays_do_not_move() -> None:
    with pytest.raises(pytest.fail.Exception) as failure:
        run(test_21_module_state.test_module_state, stateful_target(Counted()))
    assert reported(failure)[1:] == [
        "case 0 (key 2), building its graph (warm-ups, capture, replay): state['calls']: 1 in "
        "eager, 4 in graphed (|diff| 3, rel 3; tolerance exact)",
        "case 3 (key 2), a replay: state['calls']: 2 in eager, 1 in graphed (|diff| 1, rel 0.5; "
        "tolerance exact)",
        "case 1 (key 3), building its graph (warm-ups, capture, replay): state['calls']: 3 in "
        "eager, 6 in graphed (|diff| 3, rel 1; tolerance exact)",
        "case 4 (key 3), a replay: state['calls']: 4 in eager, 3 in graphed (|diff| 1, rel "
        "0.25; tolerance exact)",
    ]


def test_module_state_needs_two_sides_of_their_own() -> None:
    check = test_21_module_state.test_module_state
    shared = nn.Linear(4, 4)
    for same in ((shared, shared), ([shared], [shared]), ({"model": shared}, {"model": shared})):
        with pytest.raises(pytest.fail.Exception, match=r"gives both sides the same state"):
            run(check, cpu_target(state=State(sides=lambda same=same: same)))
    assert skip_reason(check, cpu_target()) == lacking_reason(["state.sides"])


# No rebound tensors


class StaticBuffers:
    """A stand-in graph and a static buffer per key, made when the graph is captured and filled
    before each replay. ``rebind`` replaces the buffer on every call instead of copying into
    it; ``recapture`` captures the key again on the calls of it numbered so (from 0), with a
    new buffer (a new graph's)."""

    def __init__(self, rebind: bool = False, recapture: frozenset[int] = frozenset()) -> None:
        self.rebind, self.recapture = rebind, recapture
        self.graphs: dict[int, StandInGraph] = {}
        self.static: dict[int, Tensor] = {}
        self.calls: dict[int, int] = {}

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        x = inputs["x"]
        key = x.shape[0]
        call = self.calls[key] = self.calls.get(key, -1) + 1
        if key not in self.graphs or call in self.recapture:
            graph = self.graphs[key] = StandInGraph()
            graph.capture_begin()
            static = torch.zeros_like(x)  # alive at the capture's end, held from after it
            graph.capture_end()
            self.static[key] = static
        elif self.rebind:
            self.static[key] = torch.zeros_like(x)  # replaced, where copy_ was meant
        self.static[key].copy_(x)
        self.graphs[key].replay()
        return self.static[key] * 2


def test_no_rebound_tensors_names_a_buffer_replaced_between_replays() -> None:
    check = test_22_rebound_tensors.test_no_rebound_tensors
    assert run(check, cpu_target(graphed=StaticBuffers())) == [
        "9 calls over 3 keys: no read recorded at capture, so the graphed side walked: 18 tensors "
        "judged over the calls; 3 capture(s) of its keys in this check"
    ]
    # A key captured again with a new buffer is no rebinding: the new graph reads the new one.
    assert run(check, cpu_target(graphed=StaticBuffers(recapture=frozenset({1})))) == [
        "9 calls over 3 keys: no read recorded at capture, so the graphed side walked: 9 tensors "
        "judged over the calls; 3 capture(s) of its keys in this check"
    ]
    # Captured afresh on every call, no graph serves a later call: nothing is witnessed.
    with pytest.raises(pytest.fail.Exception, match=r"^not exercised: no capture of a key"):
        run(check, cpu_target(graphed=StaticBuffers(recapture=frozenset({0, 1, 2}))))
    with pytest.raises(pytest.fail.Exception) as failure:
        run(check, cpu_target(graphed=StaticBuffers(rebind=True)))
    lines = reported(failure)
    assert len(lines) == 1 + 3  # each buffer a graph read; its replacements no graph reads
    assert re.fullmatch(
        r"call 3 \(case 3, key 2\): graphed.static\[2\] was rebound: its storage moved from 0x"
        r"[0-9a-f]+ to 0x[0-9a-f]+ \(a graph captured on the old storage keeps reading it\)",
        lines[1],
    ), lines[1]


# Trajectory


VOCAB = 7
WIDTH = 8  # sequence buckets are multiples of it


def prefixes(generator: torch.Generator, case: Case) -> dict[str, Tensor]:
    """Two rows of up to 8 tokens in a bucket of 8, 16 or 24 (the key), and a per-row offset
    (the step's "memory")."""
    width = case.key
    lengths = torch.randint(1, WIDTH + 1, (2,), generator=generator)
    tokens = torch.randint(VOCAB, (2, width), generator=generator)
    tokens[torch.arange(width) >= lengths[:, None]] = 0
    return {
        "tokens": tokens,
        "lengths": lengths,
        "memory": torch.randint(VOCAB, (2,), generator=generator),
    }


def next_token(inputs: dict[str, Tensor]) -> Tensor:
    """One-hot logits of the next token: the prefix's sum plus the memory, modulo the vocab."""
    total = (inputs["tokens"].sum(dim=1) + inputs["memory"]) % VOCAB
    return nn.functional.one_hot(total, VOCAB).float()


def appended(inputs: dict[str, Tensor], logits: Tensor) -> dict[str, Tensor]:
    tokens, lengths = inputs["tokens"], inputs["lengths"]
    width = max(tokens.shape[1], -(-(int(lengths.max()) + 1) // WIDTH) * WIDTH)
    grown = torch.zeros(2, width, dtype=tokens.dtype)
    grown[:, : tokens.shape[1]] = tokens
    grown[torch.arange(2), lengths] = logits.argmax(dim=-1)
    return {**inputs, "tokens": grown, "lengths": lengths + 1}


class Continued:
    """A static prefix per bucket; a step with the same memory as the last one copies only the
    newest token, the last step remembered for every bucket at once (the trajectory twin's
    fault)."""

    def __init__(self) -> None:
        self.static: dict[int, Tensor] = {}
        self.last_memory: Tensor | None = None

    def __call__(self, inputs: dict[str, Tensor]) -> Tensor:
        tokens, lengths = inputs["tokens"], inputs["lengths"]
        static = self.static.setdefault(tokens.shape[1], torch.zeros_like(tokens))
        if inputs["memory"] is self.last_memory:
            newest = lengths - 1
            static[torch.arange(2), newest] = tokens[torch.arange(2), newest]
        else:
            static.copy_(tokens)
        self.last_memory = inputs["memory"]
        return next_token({**inputs, "tokens": static})


def stepping_target(
    graphed: Callable[[dict[str, Tensor]], Tensor], **trajectory: object
) -> CudaGraphTarget:
    return cpu_target(
        eager=next_token,
        graphed=graphed,
        keys=[WIDTH, 2 * WIDTH, 3 * WIDTH],
        draw=prefixes,
        key_of=lambda inputs: inputs["tokens"].shape[1],
        trajectory=Trajectory(appended, **trajectory),
    )


def test_trajectory_reports_the_first_step_where_a_decode_parts_from_eager() -> None:
    check = test_23_trajectory.test_trajectory
    assert run(check, stepping_target(next_token)) == [
        "64 of 64 steps equal from case 0 (free running), over 9 keys in turn"
    ]
    with pytest.raises(pytest.fail.Exception) as failure:
        run(check, stepping_target(Continued()))
    lines = reported(failure)
    assert re.fullmatch(
        r"step (\d) of a free running trajectory from case 0 \(key 16, seed \1\) differs after \1 "
        r"equal steps:",
        lines[0],
    ), lines[0]
    assert lines[1].startswith("output at index (")
    assert skip_reason(check, cpu_target()) == lacking_reason(["trajectory"])


def test_a_token_flipped_within_the_tolerance_passes_only_teacher_forced() -> None:
    check = test_23_trajectory.test_trajectory
    calls: list[None] = []

    def flips_once(inputs: dict[str, Tensor]) -> Tensor:
        calls.append(None)
        logits = next_token(inputs)
        if len(calls) == 3:  # within 0.6 of eager's logits, and another token on top
            token = int(logits[0].argmax())
            logits[0, token] -= 0.55
            logits[0, (token + 1) % VOCAB] += 0.55
        return logits

    within = {"tolerance": Tolerance(atol=0.6)}
    target = stepping_target(flips_once, teacher_forced=True)
    assert run(check, CudaGraphTarget(**{**vars(target), **within}))[0].startswith(
        "64 of 64 steps equal from case 0 (teacher-forced)"
    )
    calls.clear()
    free = stepping_target(flips_once)
    with pytest.raises(pytest.fail.Exception, match=r"step 3 of a free running trajectory"):
        run(check, CudaGraphTarget(**{**vars(free), **within}))


# The twins themselves, on the CPU

TWINS = {
    # factory -> the one check that fails it on a GPU
    "caller_tensors_as_static_inputs": "inputs unchanged",
    "padding_in_a_batch_scale": "padded batches",
    "shared_pool_calibration": "replay order",
    "lookup_by_real_size": "graphs used",
    "warm_up_updates_batch_norm": "module state",
    "weights_reloaded_by_assignment": "no rebound tensors",
    "stale_slot_after_a_bucket_switch": "trajectory",
}
# A twin whose fault moves state each side holds: every check that compares the sides' states
# after a capture sees the state part too, and names it.
SEEN_TOO = {
    "warm_up_updates_batch_norm": {
        "parity",
        "owned outputs",
        "lock safety",
        "concurrency",
        "capture does not advance state",
    },
}
CONTROLS = {"lookup_by_real_size_declared": "graphs used"}  # factory -> the check it passes


@pytest.mark.parametrize("factory", [*TWINS, *CONTROLS])
def test_each_twin_keeps_the_protocol_on_the_cpu(factory: str) -> None:
    import broken_zoo_targets

    target = getattr(broken_zoo_targets, factory)(CPU)
    validate_target(factory, target, CPU)
    case = numbered(target, 0)
    inputs = draw(target, case, seed=0)
    assert target.key_of(inputs) == case.key
    target.eager(inputs)  # its eager side runs without CUDA


def test_the_twins_verdicts_name_declared_checks() -> None:
    """Every check the GPU tests expect a verdict of is one the suite declares (the table's
    rows are the declared names)."""
    named = {*TWINS.values(), *CONTROLS.values()} | set().union(*SEEN_TOO.values())
    assert named <= declared_names(), named - declared_names()


def shown(size: int) -> str:
    """A size in bytes as the docs write it."""
    for unit, scale in (("MiB", MiB), ("KiB", KiB)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def test_the_docs_give_the_checks_own_numbers() -> None:
    canaries = test_18_replay_order.CANARY_BYTES
    docs = (Path(__file__).parents[2] / "docs" / "conformance.md").read_text(encoding="utf-8")
    for phrase in (
        f"| inputs unchanged | over {test_16_inputs_unchanged.ROUNDS} rounds on up to "
        f"{test_16_inputs_unchanged.MAX_KEYS} keys",
        f"| replay order | on up to {test_18_replay_order.MAX_KEYS} keys",
        f"a canary changing: tensors of {', '.join(map(shown, canaries[:-1]))} and "
        f"{shown(canaries[-1])}",
        f"| graphs used | after {test_19_graphs_used.WARM_ROUNDS} warm-up rounds, "
        f"{test_19_graphs_used.JUDGED_ROUNDS} judged rounds on up to "
        f"{test_19_graphs_used.MAX_KEYS} keys",
        f"| module state | needs `state.sides`: on each of up to {test_21_module_state.MAX_KEYS} "
        "keys",
        f"| no rebound tensors | over {test_22_rebound_tensors.ROUNDS} rounds on up to "
        f"{test_22_rebound_tensors.MAX_KEYS} keys",
        f"| trajectory | needs `trajectory`: {test_23_trajectory.STEPS} steps",
    ):
        assert phrase in docs, phrase


# GPU: each twin fails the check meant for its class and no other


def failed(result: pytest.RunResult) -> set[str]:
    return {
        check for check, verdict in table_verdicts(result).items() if verdict in ("FAILED", "ERROR")
    }


NEW_CHECKS = (
    "inputs_unchanged or padded_batches or replay_order or graphs_used or module_state or "
    "rebound_tensors or trajectory"
)


@needs_cuda
@pytest.mark.parametrize("factory", list(TWINS))
def test_each_twin_fails_the_check_meant_for_its_class_and_no_other(
    run_suite: Callable[..., pytest.RunResult], factory: str
) -> None:
    result = run_suite(
        "--cudagraph-target", f"broken_zoo_targets:{factory}", "-k", "not worker_processes"
    )
    assert failed(result) == {TWINS[factory], *SEEN_TOO.get(factory, ())}, result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED


@needs_cuda
def test_calls_declared_eager_are_counted_and_pass(
    run_suite: Callable[..., pytest.RunResult],
) -> None:
    result = run_suite(
        "--cudagraph-target", "broken_zoo_targets:lookup_by_real_size_declared", "-k", "graphs_used"
    )
    assert table_verdicts(result) == {"graphs used": "passed"}, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["  graphs used * 0 calls without their graphs; * eager, as the target declares"]
    )


@needs_cuda
@pytest.mark.parametrize("spec", ["reasyn", "reasyn-lean"])
def test_the_reference_passes_the_checks_of_the_bugs_seen_in_the_wild(
    run_suite: Callable[..., pytest.RunResult], spec: str
) -> None:
    result = run_suite("--cudagraph-target", spec, "-k", NEW_CHECKS)
    verdicts = table_verdicts(result)
    assert verdicts == {
        "inputs unchanged": "passed",
        "padded batches": "passed",
        "replay order": "passed",
        "graphs used": "passed",
        "module state": "passed",
        "no rebound tensors": "passed",
        "trajectory": "passed",
    }, result.stdout.str()
