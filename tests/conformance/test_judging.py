"""pytest_cudagraph.conformance.judging on the CPU: finding and freeing a held lock, walking
outputs, calling both sides under one seed and comparing them as the target's contract says
(real part, tolerance per part, output lifetime), the keys a check walks, and keeping a
stateful target's two sides in step (their states checked, brought together, compared after
each call, judged by episodes where they accumulate)."""

from __future__ import annotations

import dataclasses
import threading

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
from pytest_cudagraph.conformance.judging import (
    EPISODE_CALLS,
    Lockstep,
    calls_over_keys,
    checked_sides,
    differences,
    draw,
    draws_random_numbers,
    eager_call,
    graphed_call,
    graphed_path,
    in_step,
    input_tensor_names,
    input_tensor_paths,
    judged,
    kept,
    keys_held,
    lock_was_held,
    parts_of,
    real,
    state_model,
    state_tolerance,
    tensors_in,
    transplant,
)
from pytest_cudagraph.engines.captures import CaptureCounter


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


def test_an_output_that_is_not_owned_is_copied_when_the_call_returns() -> None:
    static = torch.zeros(4)
    owned = sampling_target(graphed=lambda inputs: static)
    borrowed = sampling_target(graphed=lambda inputs: static, output_lifetime=NEXT_CALL_OF_KEY)
    assert graphed_call(owned, {"x": static}, 0) is static
    copy = graphed_call(borrowed, {"x": static}, 0)
    static.add_(1)
    assert copy is not static and torch.equal(copy, torch.zeros(4))
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
    assert keys_held(target, 4, capacity) == held


def test_calls_over_keys_take_each_held_key_in_turn_round_after_round() -> None:
    target = target_with_lock(threading.Lock())  # four keys: case c lands in key c % 4
    calls = list(calls_over_keys(target, keys=3, rounds=range(1, 3)))
    # Calls count from 0 at the first round given; a round's cases are its keys' next ones.
    assert calls == [(0, 4), (1, 5), (2, 6), (3, 8), (4, 9), (5, 10)]
    assert list(calls_over_keys(target, keys=2, rounds=range(0))) == []
    # Or the keys by their numbers: the last key alone, over two rounds.
    assert list(calls_over_keys(target, keys=[3], rounds=range(2))) == [(0, 3), (1, 7)]


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


def stateful_target(eager: nn.Module, graphed: nn.Module, **fields: object) -> CudaGraphTarget:
    return CudaGraphTarget(
        device=torch.device("cpu"),
        eager=eager,
        graphed=graphed,
        keys=[0],
        draw=draw_slot,
        key_of=lambda inputs: 0,
        **{"state": State(sides=lambda: (eager, graphed)), **fields},  # type: ignore[arg-type]
    )


def test_state_sides_must_be_two_roots_of_their_own() -> None:
    one = Slots()
    with pytest.raises(
        AssertionError, match=r"State.sides\(\) must return \(eager's state, graphed"
    ):
        checked_sides(lambda: one)
    for same in ((one, one), ([one], [one]), ({"m": one}, {"m": one})):
        with pytest.raises(AssertionError, match=r"gives both sides the same state"):
            checked_sides(lambda same=same: same)
    assert checked_sides(lambda: ([one], [Slots()]))[0] == [one]


def test_transplant_copies_the_graphed_state_into_the_eager_side_in_place() -> None:
    eager, graphed = Slots(), Slots()
    graphed.cache.fill_(3.0)
    graphed.steps = 5  # a number attribute: state too
    eager.steps = 0
    storage = eager.cache.untyped_storage().data_ptr()
    transplant((eager, graphed))
    assert torch.equal(eager.cache, graphed.cache) and eager.steps == 5
    assert eager.cache.untyped_storage().data_ptr() == storage
    graphed.register_buffer("cache", torch.zeros(5))
    with pytest.raises(AssertionError, match=r"cannot be copied into the eager side's: cache: a"):
        transplant((eager, graphed))


def test_the_suite_brings_the_two_sides_together_before_a_check() -> None:
    eager, graphed = Slots(), Slots()
    target = stateful_target(eager, graphed)
    graphed(draw_slot(torch.Generator().manual_seed(0), target.case(0)))  # graphed alone
    in_step(target)
    assert torch.equal(eager.cache, graphed.cache)
    in_step(dataclasses.replace(target, state=State(reset=print)))  # nothing to bring together


def test_judged_compares_the_states_the_two_calls_leave() -> None:
    target = stateful_target(Slots(), Slots(skew=1.0))
    make = lambda: draw_slot(torch.Generator().manual_seed(0), target.case(0))  # noqa: E731
    found = judged(target, make, seed=0)
    assert found[0].startswith("output at index (0,): eager")
    assert found[1].startswith("state['cache'] at index (")


def test_lockstep_names_the_first_call_whose_state_parted_and_goes_on_from_one_state() -> None:
    eager, graphed = Slots(), Slots(skew=0.5, skew_at=2)
    target = stateful_target(eager, graphed)
    lockstep = Lockstep(target, target.state.sides, None)  # type: ignore[union-attr]
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
    assert lockstep.describe() == "state compared after each call"


class Captured:
    """A graphed side on stand-in graphs: the first call of a key captures, later ones replay."""

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


def test_lockstep_says_whether_the_call_captured_or_was_the_first_replay_after_it() -> None:
    for skew_at, how in (
        (0, "it captured its graph (warm-ups, capture, first replay)"),
        (1, "the first replay after its capture"),
        (2, "a replay"),
    ):
        eager, graphed = Slots(), Slots(skew=1.0, skew_at=skew_at)
        sides = (eager, graphed)
        target = stateful_target(eager, Captured(graphed), state=State(sides=lambda: sides))  # noqa: B023
        with CaptureCounter(StandInGraph) as counter:
            lockstep = Lockstep(target, target.state.sides, None, counter)  # type: ignore[union-attr]
            for case in range(3):
                inputs = draw_slot(torch.Generator().manual_seed(case), target.case(case))
                lockstep.eager(inputs, case)
                lockstep.graphed(dict(inputs), case, f"case {case}")
        assert lockstep.problems()[0].startswith(
            f"the two sides' states parted after call {skew_at} (case {skew_at}; {how}): "
        )


def test_an_accumulating_target_is_judged_by_episodes_from_its_reset() -> None:
    eager, graphed = Total(), Total()
    resets: list[int] = []

    def reset() -> None:
        resets.append(1)
        for side in (eager, graphed):
            side.cache.zero_()

    target = stateful_target(
        eager, graphed, state=State(sides=lambda: (eager, graphed), reset=reset)
    )
    assert (
        state_model(target)
        .describe()
        .startswith(
            "accumulating state (a repeated call changed the graphed side's state['cache'] at index"
        )
    )
    lockstep = Lockstep(target, eager and target.state.sides, reset)  # type: ignore[union-attr]
    assert len(resets) == 1  # an episode begins
    for case in range(2 * EPISODE_CALLS + 1):
        assert not lockstep.judge(
            lambda: draw_slot(torch.Generator().manual_seed(0), target.case(0)), case, ""
        )
    assert len(resets) == 3
    assert lockstep.describe().endswith(
        f"judged by episodes of {EPISODE_CALLS} calls from state.reset"
    )
    assert not state_model(stateful_target(Slots(), Slots())).accumulating


def test_a_difference_is_diagnosed_from_one_state() -> None:
    eager, graphed = Slots(), Slots()
    target = stateful_target(eager, graphed)
    lockstep = Lockstep(target, target.state.sides, None)  # type: ignore[union-attr]
    eager.cache.fill_(1.0)  # the sides called unevenly
    make = lambda: draw_slot(torch.Generator().manual_seed(0), target.case(0))  # noqa: E731
    assert "agree: their states had parted through the calls before it" in lockstep.diagnose(
        make, 0
    )
    broken = stateful_target(Slots(), Slots(skew=1.0))
    still = Lockstep(broken, broken.state.sides, None).diagnose(make, 0)  # type: ignore[union-attr]
    assert still.startswith("from one state the two still differ: output at index (0,)")


def test_the_states_tolerance_is_the_loosest_of_the_parts() -> None:
    target = stateful_target(
        Slots(), Slots(), tolerance={"a": Tolerance(atol=1e-3), "b": Tolerance(rtol=1e-2)}
    )
    assert state_tolerance(target) == Tolerance(atol=1e-3, rtol=1e-2)
    assert state_tolerance(stateful_target(Slots(), Slots())) == Tolerance()


def test_a_call_draws_its_case_from_its_seed() -> None:
    target = sampling_target(keys=[2, 3], draw=lambda g, case: {"x": torch.randn(case.key, generator=g)})  # fmt: skip
    assert torch.equal(draw(target, 1, seed=5)["x"], draw(target, 1, seed=5)["x"])
    assert not torch.equal(draw(target, 1, seed=5)["x"], draw(target, 1, seed=6)["x"])
    assert draw(target, 1, seed=5)["x"].shape == (3,)


def test_each_side_is_judged_on_fresh_inputs_of_its_own() -> None:
    """A call that doubles its input in place: the graphed side must not get what eager left."""

    def doubled(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["x"].mul_(2).clone()

    target = sampling_target(eager=doubled, graphed=doubled)
    assert judged(target, lambda: {"x": torch.ones(4)}, 0) == []


def test_the_real_part_of_a_tuple_is_a_tuple() -> None:
    target = sampling_target(real_part=lambda inputs: slice(0, 1))
    assert isinstance(real(target, {}, (torch.zeros(2), torch.ones(2))), tuple)


def test_the_input_tensors_are_named_and_plain_values_left_out() -> None:
    assert input_tensor_names({"x": torch.zeros(1), "rows": 3, "mask": torch.ones(1)}) == [
        "x",
        "mask",
    ]
