"""pytest_cudagraph.conformance._judging on the CPU: finding and freeing a held lock, walking
outputs, calling both sides under one seed and comparing them as the target's contract says
(real part, tolerance per part, output lifetime), the cases and keys a check walks, and keeping
a stateful target's two sides in step: their states checked, probed once, brought together from
the eager side (the reference, never written), compared after each call, judged in episodes
where they accumulate; the user's callables named when they raise."""

from __future__ import annotations

import copy
import dataclasses
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from graph_stand_ins import StandInGraph
from torch import nn

from pytest_cudagraph.conformance import (
    NEXT_CALL_OF_KEY,
    Cache,
    Case,
    CudaGraphTarget,
    State,
    Tolerance,
)
from pytest_cudagraph.conformance._judging import (
    MOST_FOUND_EPISODE_CALLS,
    UNDECLARED_CUDA_EPISODE_CALLS,
    Lockstep,
    bring_together,
    called,
    calls_over_keys,
    case_of,
    differences,
    draw,
    draws_random_numbers,
    eager_call,
    episode_length,
    first_keys,
    graphed_call,
    graphed_path,
    in_step,
    input_tensor_paths,
    judged,
    kept,
    lock_was_held,
    loosest_tolerance,
    numbered,
    parts_of,
    probe,
    real,
    sides_of,
    state_model,
    tensors_in,
)
from pytest_cudagraph.conformance._loading import UserCodeError
from pytest_cudagraph.engines.captures import CaptureCounter

# The calls the probe makes on each side of a stateful target before any check's own.
PROBE_CALLS = 3


def target_with_lock(lock: object, keys: int = 4) -> CudaGraphTarget:
    return CudaGraphTarget(
        device=torch.device("cpu"),
        eager=lambda inputs: None,
        graphed=lambda inputs: None,
        keys=range(keys),
        draw=lambda generator, case: {},
        key_of=lambda inputs: 0,
        cache=Cache(reset=lambda: None, lock=lock) if lock is not None else None,
    )


def test_a_held_lock_is_reported_and_released() -> None:
    lock = threading.Lock()
    target = target_with_lock(lock)
    assert not lock_was_held(target)
    lock.acquire()
    assert lock_was_held(target)
    assert lock.acquire(blocking=False), "lock_was_held must release the lock it found held"
    lock.release()
    assert not lock_was_held(target_with_lock(None))


def test_a_reentrant_lock_held_twice_by_this_thread_is_released_fully() -> None:
    """Graph pools in the wild guard themselves with an RLock."""
    lock = threading.RLock()
    target = target_with_lock(lock)
    assert not lock_was_held(target)
    lock.acquire()
    lock.acquire()
    assert lock_was_held(target)
    assert not lock_was_held(target)


def test_input_tensors_nested_in_containers_are_named_by_their_paths() -> None:
    inputs = {"x": torch.zeros(1), "extra": [torch.ones(1), 3], "rows": 2}
    assert input_tensor_paths(inputs) == ["x", "extra[0]"]


def test_the_input_tensors_are_named_and_plain_values_left_out() -> None:
    inputs = {"x": torch.zeros(1), "rows": 3, "mask": torch.ones(1)}
    assert input_tensor_paths(inputs) == ["x", "mask"]


def test_tensors_are_found_in_nested_outputs() -> None:
    a, b, c = torch.zeros(1), torch.ones(2), torch.arange(3)
    assert tensors_in({"x": a, "rest": [b, (c, "label")]}) == [a, b, c]
    assert tensors_in(3) == []


# Calling and comparing as the target's contract says.


def sampling_target(**changes: object) -> CudaGraphTarget:
    """Both sides draw from torch's global generator, as code sampling inside a graph does."""

    def sample(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["x"] + torch.rand(inputs["x"].shape)

    fields: dict[str, object] = dict(
        device=torch.device("cpu"),
        eager=sample,
        graphed=sample,
        keys=[0],
        draw=lambda generator, case: {"x": torch.randn(4, generator=generator)},
        key_of=lambda inputs: 0,
    )
    return CudaGraphTarget(**{**fields, **changes})


def test_both_sides_draw_alike_under_one_seed_and_the_callers_generator_is_untouched() -> None:
    target = sampling_target()
    inputs = {"x": torch.zeros(4)}
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    assert torch.equal(eager_call(target, inputs, 7), graphed_call(target, inputs, 7))
    assert not torch.equal(eager_call(target, inputs, 7), eager_call(target, inputs, 8))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert not judged(target, lambda: {"x": torch.zeros(4)}, 7)
    assert draws_random_numbers(target, inputs)
    assert not draws_random_numbers(sampling_target(eager=lambda inputs: inputs["x"]), inputs)


def test_only_the_seed_tells_code_that_samples_not_inputs_it_writes_or_state_it_keeps() -> None:
    """Concurrency makes its calls one at a time for code that samples: a step that writes
    its input in place, or keeps a running total, must not pass for one."""

    def writes_x(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["x"].mul_(2)

    inputs = {"x": torch.ones(4)}
    assert not draws_random_numbers(sampling_target(eager=writes_x), inputs)
    assert torch.equal(inputs["x"], torch.ones(4))
    for state in ("sides", "reset"):
        eager, graphed = Total(), Total()
        given = (
            State(sides=lambda: (eager, graphed))  # noqa: B023
            if state == "sides"
            else State(reset=eager.cache.zero_)
        )
        target = stateful_target(eager, graphed, state=given)
        assert not draws_random_numbers(target, slot_inputs(target)), state
    assert draws_random_numbers(sampling_target(), inputs)


def test_the_targets_own_generators_are_seeded_like_torchs_before_each_call() -> None:
    """A sampler holding a generator of its own: each side's, seeded with the call's seed."""
    eager_generator, graphed_generator = torch.Generator(), torch.Generator()

    def sampler(generator: torch.Generator) -> object:
        return lambda inputs: inputs["x"] + torch.rand(4, generator=generator)

    target = sampling_target(
        eager=sampler(eager_generator),
        graphed=sampler(graphed_generator),
        generators=lambda: [eager_generator, graphed_generator],
    )
    graphed_generator.manual_seed(99)  # left elsewhere by an earlier call
    assert not judged(target, lambda: {"x": torch.zeros(4)}, 7)
    unseeded = dataclasses.replace(target, generators=None)
    graphed_generator.manual_seed(99)
    assert judged(unseeded, lambda: {"x": torch.zeros(4)}, 7)


def test_an_output_that_is_not_owned_is_copied_when_the_call_returns() -> None:
    static = torch.zeros(4)
    owned = sampling_target(graphed=lambda inputs: static)
    borrowed = sampling_target(graphed=lambda inputs: static, output_lifetime=NEXT_CALL_OF_KEY)
    assert graphed_call(owned, {"x": static}, 0) is static
    copy_ = graphed_call(borrowed, {"x": static}, 0)
    static.add_(1)
    assert copy_ is not static and torch.equal(copy_, torch.zeros(4))
    assert kept(borrowed, (static,))[0] is not static


def test_only_the_real_part_of_each_output_is_compared() -> None:
    eager = {"logits": torch.ones(2, 3), "cache": torch.zeros(4, 2)}
    padded = {
        "logits": torch.cat([torch.ones(2, 3), torch.full((2, 3), 9.0)]),
        "cache": torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 5.0]]),
    }
    rows = {"logits": slice(0, 2), "cache": (slice(None), slice(0, 1))}
    target = sampling_target(real_part=lambda inputs: rows)
    assert differences(target, {}, eager, padded) == []
    assert sorted(differences(sampling_target(), {}, eager, padded)) == [
        "output['cache'] at index (3, 1): eager 0, graphed 5 (|diff| 5, rel inf; tolerance exact); "
        "1 of 8 elements differ, largest |diff| 5",
        "output['logits']: shape (2, 3) in eager, (4, 3) in graphed",
    ]
    every_tensor = sampling_target(real_part=lambda inputs: slice(0, 2))
    assert real(every_tensor, {}, padded)["cache"].shape == (2, 2)
    assert real(every_tensor, {}, [padded["logits"]])[0].shape == (2, 3)
    with pytest.raises(
        TypeError, match=r"real_part gives an index per part .* Tensor, which has no parts"
    ):
        real(target, {}, torch.zeros(3))


def test_a_real_part_holding_nothing_is_a_difference_not_a_pass() -> None:
    nothing = sampling_target(real_part=lambda inputs: slice(0, 0))
    assert differences(nothing, {}, torch.ones(4), torch.zeros(4)) == [
        "the real part real_part selects holds no element to compare: nothing was judged"
    ]
    assert differences(sampling_target(), {}, torch.ones(0), torch.ones(0)) == [
        "the output holds no element to compare: nothing was judged"
    ]


def test_each_part_is_compared_within_its_own_tolerance() -> None:
    target = sampling_target(tolerance={"logits": Tolerance(atol=0.1)})
    expected = {"logits": torch.zeros(2), "cache": torch.zeros(2)}
    close = {"logits": torch.full((2,), 0.05), "cache": torch.zeros(2)}
    assert differences(target, {}, expected, close) == []
    assert differences(target, {}, expected, {**close, "cache": torch.full((2,), 0.05)}) == [
        "output['cache'] at index (0,): eager 0, graphed 0.0500000007 (|diff| 0.05, rel inf; "
        "tolerance exact); 2 of 2 elements differ, largest |diff| 0.05"
    ]
    assert differences(target, {}, expected, {**close, "logits": torch.ones(2)}) == [
        "output['logits'] at index (0,): eager 0, graphed 1 (|diff| 1, rel inf; tolerance atol 0.1, "
        "rtol 0); 2 of 2 elements differ, largest |diff| 1"
    ]
    assert differences(target, {}, expected, {"logits": torch.zeros(2)}) == [
        "output: keys ['cache'] only in eager, [] only in graphed"
    ]
    assert parts_of((1, 2)) == {0: 1, 1: 2} and parts_of(torch.zeros(1)) is None


def test_an_eager_output_is_copied_so_the_graphed_side_cannot_change_it() -> None:
    """An eager output that is a view of a buffer the graphed side writes: x * 3 must not pass
    as x * 2."""
    shared = torch.zeros(4)

    def eager(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        shared.copy_(inputs["x"] * 2)
        return shared

    def graphed(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        shared.copy_(inputs["x"] * 3)
        return shared.clone()

    target = sampling_target(eager=eager, graphed=graphed)
    assert judged(target, lambda: {"x": torch.ones(4)}, 0) == [
        "output at index (0,): eager 2, graphed 3 (|diff| 1, rel 0.5; tolerance exact); 4 of 4 "
        "elements differ, largest |diff| 1"
    ]


def test_the_graphed_path_is_the_targets_and_one_left_out_is_an_error() -> None:
    def graphed(inputs: dict) -> None:
        return None

    target = dataclasses.replace(target_with_lock(threading.Lock()), graphed=graphed)
    assert graphed_path(target) is graphed
    with pytest.raises(ValueError, match="graphed is None on cpu"):
        graphed_path(dataclasses.replace(target, graphed=None))


@pytest.mark.parametrize(
    ("num_keys", "capacity", "held"),
    [(10, None, 4), (2, None, 2), (10, 3, 3), (10, 6, 4), (2, 3, 2)],
)
def test_a_check_walks_no_more_keys_than_the_cache_holds(
    num_keys: int, capacity: int | None, held: int
) -> None:
    target = target_with_lock(threading.Lock(), keys=num_keys)
    assert first_keys(target, 4, capacity) == list(range(held))


def test_a_case_lands_in_its_key_and_a_key_has_its_cases() -> None:
    target = target_with_lock(threading.Lock(), keys=4)
    assert numbered(target, 9) == Case(9, 1, 2)
    assert case_of(target, 1, repeat=2) == Case(9, 1, 2)
    assert case_of(target, 3) == Case(3, 3, 0)


def test_calls_over_keys_take_each_held_key_in_turn_round_after_round() -> None:
    target = target_with_lock(threading.Lock())  # four keys: case c lands in key c % 4
    calls = [(call, case.number) for call, case in calls_over_keys(target, [0, 1, 2], range(1, 3))]
    # Calls count from 0 at the first round given; a round's cases are its keys' next ones.
    assert calls == [(0, 4), (1, 5), (2, 6), (3, 8), (4, 9), (5, 10)]
    assert list(calls_over_keys(target, [0, 1], range(0))) == []
    # Or the last key alone, over two rounds: each round is the case's repeat.
    assert list(calls_over_keys(target, [3], range(2))) == [(0, Case(3, 3, 0)), (1, Case(7, 3, 1))]


def test_a_call_draws_its_case_from_its_seed() -> None:
    target = sampling_target(keys=[2, 3], draw=lambda g, case: {"x": torch.randn(case.key, generator=g)})  # fmt: skip
    case = numbered(target, 1)
    assert torch.equal(draw(target, case, seed=5)["x"], draw(target, case, seed=5)["x"])
    assert not torch.equal(draw(target, case, seed=5)["x"], draw(target, case, seed=6)["x"])
    assert draw(target, case, seed=5)["x"].shape == (3,)


def test_each_side_is_judged_on_fresh_inputs_of_its_own() -> None:
    """A call that doubles its input in place: the graphed side must not get what eager left."""

    def doubled(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["x"].mul_(2).clone()

    target = sampling_target(eager=doubled, graphed=doubled)
    assert judged(target, lambda: {"x": torch.ones(4)}, 0) == []


def test_the_real_part_of_a_tuple_is_a_tuple() -> None:
    target = sampling_target(real_part=lambda inputs: slice(0, 1))
    assert isinstance(real(target, {}, (torch.zeros(2), torch.ones(2))), tuple)


def test_the_states_tolerance_is_the_loosest_of_the_parts() -> None:
    target = sampling_target(tolerance={"a": Tolerance(atol=1e-3), "b": Tolerance(rtol=1e-2)})
    assert loosest_tolerance(target) == Tolerance(atol=1e-3, rtol=1e-2)
    assert loosest_tolerance(sampling_target()) == Tolerance()


# Keeping a stateful target's two sides in step


class Slots(nn.Module):
    """A cache written at a position each call, the answer read over every position: the shape
    of a static KV cache. ``skew`` is added to what this copy's call number ``skew_at`` writes
    (a graph that writes its state wrong once; private: not state)."""

    def __init__(self, skew: float = 0.0, skew_at: int = 0) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(4))
        self._skew, self._skew_at, self._calls = skew, skew_at, 0

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        wrong = self._skew if self._calls == self._skew_at else 0.0
        self._calls += 1
        self.cache[int(inputs["at"])] = inputs["x"] + wrong
        return self.cache.sum().reshape(1)


class Total(Slots):
    """The same cache, each call adding to it: accumulating state."""

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        self.cache[int(inputs["at"])] += inputs["x"]
        return self.cache.sum().reshape(1)


def draw_slot(generator: torch.Generator, case: Case) -> dict[str, torch.Tensor]:
    return {
        "x": torch.rand((), generator=generator),
        "at": torch.randint(4, (), generator=generator),
    }


def stateful_target(eager: object, graphed: object, **fields: object) -> CudaGraphTarget:
    return CudaGraphTarget(
        device=torch.device("cpu"),
        eager=eager,  # type: ignore[arg-type]
        graphed=graphed,  # type: ignore[arg-type]
        keys=[0],
        draw=draw_slot,
        key_of=lambda inputs: 0,
        **{"state": State(sides=lambda: (eager, graphed)), **fields},  # type: ignore[arg-type]
    )


def slot_inputs(target: CudaGraphTarget, seed: int = 0) -> dict[str, torch.Tensor]:
    return draw(target, numbered(target, 0), seed)


def test_state_sides_must_be_two_roots_of_their_own() -> None:
    one = Slots()
    with pytest.raises(
        AssertionError, match=r"State.sides\(\) must return \(eager's state, graphed"
    ):
        sides_of(stateful_target(one, one, state=State(sides=lambda: one)))  # type: ignore[arg-type, return-value]
    for same in ((one, one), ([one], [one]), ({"m": one}, {"m": one})):
        target = stateful_target(one, one, state=State(sides=lambda same=same: same))  # type: ignore[misc]
        with pytest.raises(AssertionError, match=r"gives both sides the same state"):
            sides_of(target)
    other = Slots()
    sides = sides_of(stateful_target(one, other, state=State(sides=lambda: ([one], [other]))))
    assert sides is not None and sides.eager == [one] and sides.graphed == [other]
    assert sides_of(sampling_target()) is None


@pytest.mark.parametrize(
    ("given", "side"),
    [
        (lambda: ({}, {"cache": torch.zeros(1)}), "eager"),
        (lambda: ([torch.zeros(1)], []), "graphed"),
        (lambda: (SimpleNamespace(), SimpleNamespace()), "eager"),
    ],
    ids=["empty dict", "empty list", "empty namespace"],
)
def test_state_sides_holding_nothing_are_refused(given: object, side: str) -> None:
    """Nothing under sides: every comparison of the states would pass on nothing."""
    target = stateful_target(Slots(), Slots(), state=State(sides=given))  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match=rf"gives the {side} side no state \(nothing a step"):
        sides_of(target)


def test_state_sides_giving_copies_are_refused() -> None:
    """A copy made on each call (clone(), a deep-copied state_dict) takes no write: the suite
    would bring copies together and the sides never."""
    eager, graphed = Slots(), Slots()
    for copies, side, piece in (
        (lambda: (eager.cache.clone(), graphed.cache.clone()), "eager", "tensor"),
        (lambda: (copy.deepcopy(eager.state_dict()), graphed.state_dict()), "eager", "cache"),
        (lambda: (eager, {"cache": graphed.cache.clone()}), "graphed", "cache"),
    ):
        target = stateful_target(eager, graphed, state=State(sides=copies))
        with pytest.raises(AssertionError) as refused:
            probe(target)
        assert str(refused.value).startswith(
            f"State.sides() gives the {side} side's state anew on each call ({piece} is another "
            "object each time): it returns copies, which no call writes"
        )
    # state_dict() without a copy holds the buffers themselves: the state, not a copy.
    views = stateful_target(
        eager, graphed, state=State(sides=lambda: (eager.state_dict(), graphed.state_dict()))
    )
    assert probe(views).written == frozenset({"cache"})


def test_accumulating_state_nothing_under_sides_holds_is_refused() -> None:
    """Sides naming tensors the step never writes: the accumulating state is elsewhere."""
    eager, graphed = Total(), Total()
    bystanders = (torch.zeros(2), torch.zeros(2))
    target = stateful_target(eager, graphed, state=State(sides=lambda: bystanders))
    with pytest.raises(AssertionError, match=r"State.sides\(\) holds none of what a call writes"):
        probe(target)


def test_the_suite_brings_the_graphed_side_to_the_eager_sides_state_never_the_reverse() -> None:
    eager, graphed = Slots(), Slots()
    target = stateful_target(eager, graphed)
    probe(target)
    eager.cache.fill_(3.0)  # written since the probe: a call's state
    eager.steps = 5  # a number attribute: state too
    graphed.steps = 0
    storage = graphed.cache.untyped_storage().data_ptr()
    sides = sides_of(target)
    assert sides is not None
    bring_together(target, sides)
    assert torch.equal(graphed.cache, torch.full((4,), 3.0)) and graphed.steps == 5
    assert torch.equal(eager.cache, torch.full((4,), 3.0)) and eager.steps == 5
    assert graphed.cache.untyped_storage().data_ptr() == storage
    graphed.register_buffer("cache", torch.zeros(5))
    with pytest.raises(AssertionError, match=r"cannot be copied into the graphed side's: cache: a"):
        bring_together(target, sides)


class Weighted(nn.Module):
    """A linear step writing a cache by position: weights and a mode no call writes."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.proj = nn.Linear(1, 1)
        self.norm = nn.Dropout(0.5)
        self.register_buffer("cache", torch.zeros(4))

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        self.cache[int(inputs["at"])] = self.norm(self.proj(inputs["x"].reshape(1, 1))).sum()
        return self.cache.clone()


@pytest.mark.parametrize(
    ("wrong", "kind", "path"),
    [
        (lambda graphed: graphed.proj.weight.data.add_(1.0), "a parameter", "proj.weight"),
        (lambda graphed: graphed.train(), "a mode", "training"),
        (lambda graphed: setattr(graphed, "use_cache", False), "a flag", "use_cache"),
    ],
    ids=["weights not loaded", "left in train()", "a flag"],
)
def test_what_no_call_writes_must_already_be_equal_and_is_named_by_its_kind(
    wrong: object, kind: str, path: str
) -> None:
    """The eager side is the reference: a graphed side with other weights or in another mode
    is wrong, not behind, and the eager side is never written to make the two agree."""
    eager, graphed = Weighted().eval(), Weighted().eval()
    eager.use_cache = graphed.use_cache = True
    wrong(graphed)  # type: ignore[operator]
    reference = copy.deepcopy(eager.state_dict())
    target = stateful_target(eager, graphed)
    with pytest.raises(AssertionError) as refused:
        in_step(target)
    message = str(refused.value)
    assert message.startswith(
        f"the two sides differ in what no call writes, {kind}: state[{path!r}]"
    )
    assert "build it from the same weights, in the same mode" in message
    with pytest.raises(AssertionError, match=rf"in what no call writes, {kind}: "):
        Lockstep(target)
    assert all(torch.equal(reference[name], eager.state_dict()[name]) for name in reference)
    assert eager.use_cache is True and not eager.training


def test_state_no_call_writes_that_differs_is_refused_and_written_state_is_copied() -> None:
    """A buffer no call changed (since the probe) is fixed like a parameter; the cache each
    call writes is copied from eager."""
    eager, graphed = Slots(), Slots()
    eager.register_buffer("table", torch.arange(4.0))
    graphed.register_buffer("table", torch.arange(4.0))
    target = stateful_target(eager, graphed)
    assert probe(target).written == frozenset({"cache"})
    graphed.cache.fill_(7.0)
    in_step(target)
    assert torch.equal(graphed.cache, eager.cache)
    other = Slots()
    other.register_buffer("table", torch.arange(4.0) + 1)  # built from another table
    apart = stateful_target(eager, other)
    with pytest.raises(
        AssertionError, match=r"differ in what no call writes, a buffer: state\['table'\] at"
    ):
        in_step(apart)
    assert torch.equal(eager.table, torch.arange(4.0))


def test_sides_of_another_shape_are_refused_naming_what_each_holds() -> None:
    """A graphed side that wraps the model names its pieces under the wrapper's attribute:
    no piece of one side is the other's, and each side's own are listed."""
    eager = Weighted().eval()
    wrapper = nn.Module()
    wrapper.inner = Weighted().eval()
    wrapper.inner.load_state_dict(eager.state_dict())
    target = stateful_target(eager, wrapper.inner, state=State(sides=lambda: (eager, wrapper)))
    with pytest.raises(AssertionError) as refused:
        in_step(target)
    message = str(refused.value)
    assert message.startswith(
        "the two sides differ in what no call writes, a piece of state: state: keys ['proj.weight'"
    )
    assert "only in eager, ['inner.training', 'inner.proj.weight', 'inner.proj.bias'" in message


class Runner:
    """Bookkeeping a serving runner keeps in Python: lengths in a list, a step counter, a
    namespace of totals, a histogram in a numpy array, next to a KV buffer; ``python_runs``
    False: a graph replayed, so the bookkeeping runs only when it captures."""

    def __init__(self, python_runs: bool = True) -> None:
        self.seq_lens = [0, 0]
        self.steps = 0
        self.totals = SimpleNamespace(tokens=0)
        self.histogram = np.zeros(5, dtype=np.int64)
        self.kv = torch.zeros(8)
        self._python_runs, self._captured = python_runs, False

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if self._python_runs or not self._captured:
            self._captured = True
            self.steps += 1
            self.seq_lens[0] += 1
            self.totals.tokens += 2
            self.histogram[int(inputs["at"])] += 1
        self.kv[int(inputs["at"])] = inputs["x"]
        return self.kv.sum().reshape(1)


def test_numbers_lists_arrays_and_namespaces_are_state_compared_and_copied() -> None:
    eager, graphed = Runner(), Runner()
    target = stateful_target(eager, graphed)
    assert probe(target).written == frozenset({"seq_lens", "steps", "totals", "histogram", "kv"})
    eager.steps, eager.seq_lens, eager.totals.tokens = 10, [10, 3], 20
    eager.histogram[2] = 9
    held = graphed.seq_lens, graphed.totals, graphed.histogram
    in_step(target)
    assert (graphed.steps, graphed.seq_lens, graphed.totals.tokens) == (10, [10, 3], 20)
    assert graphed.histogram[2] == 9
    assert (graphed.seq_lens, graphed.totals, graphed.histogram) == held  # written in place
    assert graphed.histogram is held[2]
    lockstep = Lockstep(target)
    assert not lockstep.judge(lambda: slot_inputs(target), 0, "in step")
    stale = stateful_target(eager := Runner(), graphed := Runner(python_runs=False))
    lockstep = Lockstep(stale)
    lockstep.judge(lambda: slot_inputs(stale, 1), 1, "a replay")
    assert lockstep.problems()[0].startswith(
        "the two sides' states parted after call 0 (a replay): state['seq_lens'][0]: "
    )
    assert lockstep.problems()[0].endswith("(and 3 more)")


def test_an_object_both_sides_hold_is_refused_only_where_a_call_writes_it() -> None:
    eager, graphed = Runner(), Runner()
    graphed.seq_lens = eager.seq_lens  # one list, which every call writes
    with pytest.raises(
        AssertionError,
        match=r"gives both sides the same object, which a call writes: "
        r"state\['seq_lens'\] is state\['seq_lens'\]",
    ):
        probe(stateful_target(eager, graphed))
    eager, graphed = Runner(), Runner()
    eager.limits = graphed.limits = [8, 16]  # a configuration no call writes: both may read it
    assert "limits" not in probe(stateful_target(eager, graphed)).written


def test_the_probe_puts_each_side_back_and_survives_a_piece_that_stops_being_state() -> None:
    """A cache's dict of graphs is no state: empty it holds none, and graphs are none."""
    eager, graphed = Runner(), Runner()
    graphed.graphs = {}
    eager.graphs = {}

    def graphed_call_(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        graphed.graphs.setdefault(0, StandInGraph())
        return graphed(inputs)

    target = stateful_target(eager, graphed_call_, state=State(sides=lambda: (eager, graphed)))
    found = probe(target)
    assert "graphs" not in found.written and graphed.graphs
    assert (eager.steps, graphed.steps) == (0, 0)  # put back from their own copies
    assert found.model.accumulating
    assert found.model.evidence == "the graphed side's state['seq_lens'][0]"


def test_a_copy_that_does_not_take_is_refused() -> None:
    """The graphed side's K and V are one tensor (a bug): eager's K and V cannot both land."""
    eager = SimpleNamespace(k=torch.zeros(2), v=torch.zeros(2))
    shared = torch.zeros(2)
    graphed = SimpleNamespace(k=shared, v=shared)

    def step(side: SimpleNamespace) -> object:
        def call(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            side.k[0], side.v[1] = inputs["x"], inputs["x"] + 1
            return side.k + side.v

        return call

    target = stateful_target(
        step(eager), step(graphed), state=State(sides=lambda: (eager, graphed))
    )
    probe(target)
    eager.k[1] = 5.0
    sides = sides_of(target)
    assert sides is not None
    with pytest.raises(AssertionError, match=r"the state copied in did not take: state\['k'\]"):
        bring_together(target, sides)


def test_judged_compares_the_states_the_two_calls_leave() -> None:
    target = stateful_target(Slots(), Slots(skew=1.0))
    found = judged(target, lambda: slot_inputs(target), seed=0)
    assert found[0].startswith("output at index (0,): eager")
    assert found[1].startswith("state['cache'] at index (")


def test_lockstep_names_the_first_call_whose_state_parted_and_goes_on_from_one_state() -> None:
    eager, graphed = Slots(), Slots(skew=0.5, skew_at=PROBE_CALLS + 2)
    target = stateful_target(eager, graphed)
    lockstep = Lockstep(target)
    problems = []
    for case in range(4):

        def make(case: int = case) -> dict[str, torch.Tensor]:
            return {"x": torch.tensor(float(case)), "at": torch.tensor(case)}  # slot by slot

        problems += lockstep.judge(make, case, f"case {case}")
    # Call 2 wrote its slot wrong; call 3, which reads it, starts from one state again.
    assert [problem.split(":")[0] for problem in problems] == ["case 2"]
    assert lockstep.problems() == [
        "the two sides' states parted after call 2 (case 2): state['cache'] at index (2,): eager "
        "2, graphed 2.5 (|diff| 0.5, rel 0.25; tolerance exact); 1 of 4 elements differ, "
        "largest |diff| 0.5"
    ]
    assert lockstep.describe() == (
        "state compared after each call; position-addressed or pure writes (a repeated call "
        "changed nothing)"
    )
    assert torch.equal(eager.cache, torch.tensor([0.0, 1.0, 2.0, 3.0]))  # eager never written


class Captured:
    """A graphed side on stand-in graphs: the first call captures, later ones replay;
    ``drop`` lets the graph go (the cache's reset)."""

    def __init__(self, step: nn.Module) -> None:
        self.step, self.graph = step, None

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.graph is None:
            graph = StandInGraph()
            graph.capture_begin()
            graph.capture_end()
            self.graph = graph
        self.graph.replay()
        return self.step(inputs)

    def drop(self) -> None:
        self.graph = None


def test_lockstep_says_whether_the_call_captured_or_was_the_first_replay_after_it() -> None:
    for skew_at, how in (
        (0, "it captured its graph (warm-ups, capture, first replay)"),
        (1, "the first replay after its capture"),
        (2, "a replay"),
    ):
        eager, graphed = Slots(), Slots(skew=1.0, skew_at=PROBE_CALLS + skew_at)
        captured = Captured(graphed)
        target = stateful_target(
            eager,
            captured,
            state=State(sides=lambda: (eager, graphed)),  # noqa: B023
            cache=Cache(reset=captured.drop),  # the probe's graph let go after it
        )
        probe(target)
        with CaptureCounter(StandInGraph) as counter:
            lockstep = Lockstep(target, counter)
            for case in range(3):
                inputs = draw(target, numbered(target, case), case)
                lockstep.eager(inputs, case)
                lockstep.graphed(dict(inputs), case, f"case {case}")
        assert lockstep.problems()[0].startswith(
            f"the two sides' states parted after call {skew_at} (case {skew_at}; {how}): "
        )


def accumulating(
    episode_calls: int | None = None, resets: list[int] | None = None
) -> CudaGraphTarget:
    eager, graphed = Total(), Total()

    def reset() -> None:
        if resets is not None:
            resets.append(1)
        for side in (eager, graphed):
            side.cache.zero_()

    return stateful_target(
        eager,
        graphed,
        state=State(sides=lambda: (eager, graphed), reset=reset, episode_calls=episode_calls),
    )


def test_an_accumulating_target_is_judged_in_episodes_of_its_declared_length() -> None:
    resets: list[int] = []
    target = accumulating(episode_calls=3, resets=resets)
    assert (
        state_model(target)
        .describe()
        .startswith(
            "accumulating state (a repeated call changed the graphed side's state['cache'] at index ("
        )
    )
    resets.clear()
    lockstep = Lockstep(target)
    assert len(resets) == 1  # an episode begins
    for case in range(2 * 3 + 1):
        assert not lockstep.judge(lambda: slot_inputs(target), case, "")
    assert len(resets) == 3  # before calls 0, 3 and 6
    assert lockstep.describe().endswith(
        "judged in episodes of 3 calls from State.reset (declared by State.episode_calls)"
    )
    assert not state_model(stateful_target(Slots(), Slots())).accumulating


class Filling(Total):
    """A cache of ``positions`` slots filled one a call (its position a Python int), which
    raises once full: an episode of ``positions`` calls."""

    def __init__(self, positions: int) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(positions))
        self.position = 0

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        self.cache[self.position] = inputs["x"]  # IndexError once every slot is taken
        self.position += 1
        return self.cache.sum().reshape(1)


def filling_target(positions: int) -> tuple[CudaGraphTarget, Filling, Filling]:
    """A stateful target whose two sides are ``Filling(positions)``, and the sides."""
    eager, graphed = Filling(positions), Filling(positions)

    def reset() -> None:
        for side in (eager, graphed):
            side.cache.zero_()
            side.position = 0

    state = State(sides=lambda: (eager, graphed), reset=reset)
    return stateful_target(eager, graphed, state=state), eager, graphed


@pytest.mark.parametrize("positions", [5, 16, MOST_FOUND_EPISODE_CALLS + 6])
def test_an_episodes_length_is_found_calling_the_eager_side_until_it_raises(
    positions: int,
) -> None:
    target, eager, graphed = filling_target(positions)
    found = probe(target)
    if positions > MOST_FOUND_EPISODE_CALLS:
        assert found.episode_calls == MOST_FOUND_EPISODE_CALLS
        assert found.episode_from == (
            "no call of 64 after State.reset() raised; give State(episode_calls=...) for "
            "longer episodes"
        )
    else:
        assert found.episode_calls == positions
        assert found.episode_from == (
            f"found: call {positions + 1} of case 0 after State.reset() raised"
        )
    assert (eager.position, graphed.position) == (0, 0)  # left reset
    lockstep = Lockstep(target)
    for call in range(2 * min(positions, MOST_FOUND_EPISODE_CALLS) + 1):
        assert not lockstep.judge(lambda: slot_inputs(target), call, f"call {call}")


def test_on_cuda_an_undeclared_episode_is_never_looked_for_past_the_states_end() -> None:
    """There the call past the end is a device-side assert, which no except can catch and which
    fails every later CUDA call: the probe takes 0.4.0's length and says how to give one."""
    on_cpu, eager, _ = filling_target(3)
    calls: list[int] = []
    forward = eager.forward

    def counted(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        calls.append(eager.position)
        return forward(inputs)

    eager.forward = counted  # type: ignore[method-assign]
    found = probe(on_cpu)
    assert found.episode_calls == 3  # where a call past the end raises, it is found
    calls.clear()
    on_cuda = dataclasses.replace(on_cpu, device=torch.device("cuda"))
    length, source = episode_length(on_cuda, found.model)
    assert length == UNDECLARED_CUDA_EPISODE_CALLS
    assert source.startswith("not found on CUDA")
    assert "State(episode_calls=...)" in source
    assert calls == []  # not one call: none can tell where the end is without passing it


def test_a_reset_that_ends_nothing_is_refused() -> None:
    """Both sides carry every episode into the next alike: no comparison of the two can see it;
    eager's first answer after a reset, which changes with the calls before it, does."""
    eager, graphed = Total(), Total()
    target = stateful_target(
        eager, graphed, state=State(sides=lambda: (eager, graphed), reset=lambda: None)
    )
    with pytest.raises(AssertionError) as refused:
        probe(target)
    assert str(refused.value).startswith(
        "State.reset() does not end the state: eager's first call of case 0 after a reset "
        "answers otherwise once more calls and another reset came before it: output at index (0,)"
    )
    eager, graphed = Total(), Total()
    only_graphed = State(sides=lambda: (eager, graphed), reset=graphed.cache.zero_)
    with pytest.raises(AssertionError, match=r"State.reset\(\) does not end the state"):
        probe(stateful_target(eager, graphed, state=only_graphed))
    assert probe(accumulating()).episode_calls == MOST_FOUND_EPISODE_CALLS


def test_a_difference_is_diagnosed_from_one_state() -> None:
    eager, graphed = Slots(), Slots()
    target = stateful_target(eager, graphed)
    lockstep = Lockstep(target)
    eager.cache.fill_(1.0)  # the sides called unevenly
    make = lambda: slot_inputs(target)  # noqa: E731
    assert lockstep.diagnose(make, 0) == (
        "from one state (the eager side's, copied into the graphed side) the two agree: their "
        "states had parted through the calls before it, not by a fault of the graph"
    )
    broken = stateful_target(Slots(), Slots(skew=1.0, skew_at=PROBE_CALLS))
    still = Lockstep(broken).diagnose(make, 0)
    assert still.startswith("from one state the two still differ: output at index (0,)")


# State no walk can finish, and the user's callables named when they raise


class Looping(Slots):
    """A history that holds itself, or lists nested 5,000 deep: a walk would not end, or would
    recurse past Python's limit."""

    def __init__(self, deep: bool) -> None:
        super().__init__()
        if deep:
            nested: list[object] = [0]
            for _ in range(5000):
                nested = [nested]
            self.history = nested
        else:
            self.history = [1.0]
            self.history.append(self.history)


@pytest.mark.parametrize(
    ("deep", "message"),
    [
        (False, r"^history\[1\]: holds itself \(it is history again\)"),
        (True, r"^history(\[0\]){100}: nested deeper than 100 containers \(trees.MAX_DEPTH\)"),
    ],
    ids=["holds itself", "5,000 deep"],
)
def test_state_no_walk_can_finish_is_refused_as_the_sides_naming_its_path(
    deep: bool, message: str
) -> None:
    target = stateful_target(Looping(deep), Looping(deep))
    named = r"^State.sides\(\) gives state the suite cannot walk: " + message.removeprefix("^")
    with pytest.raises(AssertionError, match=named):
        in_step(target)
    with pytest.raises(AssertionError, match=named):
        Lockstep(target)


def boom() -> None:
    raise RuntimeError("boom")


def test_the_users_callables_that_raise_are_named_by_their_field() -> None:
    with pytest.raises(UserCodeError, match=r"^State.sides\(\) raised RuntimeError: boom$"):
        sides_of(stateful_target(Slots(), Slots(), state=State(sides=boom)))  # type: ignore[arg-type]
    eager, graphed = Total(), Total()
    resets_badly = stateful_target(
        eager, graphed, state=State(sides=lambda: (eager, graphed), reset=boom)
    )
    with pytest.raises(UserCodeError, match=r"^State.reset\(\) raised RuntimeError: boom$"):
        probe(resets_badly)
    cached = stateful_target(Slots(), Slots(), cache=Cache(reset=boom))
    with pytest.raises(UserCodeError, match=r"^Cache.reset\(\) raised RuntimeError: boom$"):
        probe(cached)
    with pytest.raises(UserCodeError) as named:
        called("Cache.static", boom)
    assert str(named.value) == "Cache.static() raised RuntimeError: boom"
    assert isinstance(named.value.__cause__, RuntimeError)


@pytest.mark.parametrize("given", [[1, 2], None, torch.Generator(), [torch.Generator(), "g"]])
def test_generators_that_are_not_a_list_of_generators_are_named(given: object) -> None:
    target = dataclasses.replace(target_with_lock(None), generators=lambda: given)
    with pytest.raises(UserCodeError) as raised:
        eager_call(target, {"x": torch.ones(2, 4)}, seed=3)
    assert str(raised.value).startswith("CudaGraphTarget.generators() raised TypeError: returned ")
    assert "it must return a list of the torch.Generator objects" in str(raised.value)
    own = torch.Generator()
    seeded_target = dataclasses.replace(target_with_lock(None), generators=lambda: (own,))
    eager_call(seeded_target, {"x": torch.ones(2, 4)}, seed=3)
    assert own.initial_seed() == 3


def test_sides_the_walk_cannot_take_are_named_as_the_sides() -> None:
    """A dict holding itself, a list nested past the walk's depth: named as what the sides
    give, not a traceback of the walk."""
    looped: dict[str, object] = {"position": torch.zeros(1)}
    looped["self"] = looped
    deep: list[object] = [torch.zeros(1)]
    for _ in range(5000):
        deep = [deep]
    for eager in (looped, deep):
        target = dataclasses.replace(
            target_with_lock(None),
            state=State(sides=lambda eager=eager: (eager, {"p": torch.zeros(1)})),
        )
        with pytest.raises(
            AssertionError, match=r"^State.sides\(\) gives state the suite cannot walk: "
        ):
            sides_of(target)
