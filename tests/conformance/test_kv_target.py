"""The stateful target reasyn-kv (reasyn_ref.targets.kv) and its broken twins
(broken_kv_targets.py) on the CPU: loading by name, the key table, the episodes' inputs, that an
episode is teacher-forced decoding as the full decoder computes it, that the state a kept set of
buffers carries from one episode to the next never shows (the property the stateful checks
judge on the GPU), that each twin's buffers break it in their own way, and the suite's CPU run."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import broken_kv_targets
import pytest
import torch
from suite_runner import table_verdicts
from torch import Tensor

from pytest_cudagraph.conformance import CudaGraphTarget, State
from pytest_cudagraph.conformance._judging import draw, numbered
from pytest_cudagraph.conformance._loading import build_target, installed_targets
from reasyn_ref.kv_decoder import KVDecoder, StepBuffers, StepKey
from reasyn_ref.model import expand_memory
from reasyn_ref.sampler import pad_rows
from reasyn_ref.targets.kv import (
    LARGEST_CASE,
    NUM_KEYS,
    STEPS,
    KVTarget,
    key_for_case,
)

# The KV target's checks run the suite on the CPU (the README's test command leaves it out).
pytestmark = pytest.mark.slow

CPU = torch.device("cpu")
TWINS = ("baked_position", "shared_position", "stale_position_counter", "reallocating_reset")


@pytest.fixture(scope="module")
def kv_target() -> KVTarget:
    return KVTarget(CPU)


def episode_inputs(kv_target: KVTarget, case: int, seed: int) -> dict[str, Tensor]:
    return kv_target.make_inputs(torch.Generator().manual_seed(seed), case)


class KeptBuffers:
    """Eager steps on one set of buffers per key, kept from one claim to the next as a graph
    cache keeps them: a CPU stand-in for the state the step graphs carry."""

    def __init__(self, kv: KVDecoder) -> None:
        self.kv = kv
        self.buffers: dict[StepKey, StepBuffers] = {}

    @contextlib.contextmanager
    def claim(self, key: StepKey) -> Iterator[KeptSlot]:
        if key not in self.buffers:
            self.buffers[key] = self.kv.new_buffers(key, torch.float32)
        yield KeptSlot(self.kv, self.buffers[key])


class KeptSlot:
    def __init__(self, kv: KVDecoder, buffers: StepBuffers) -> None:
        self.kv = kv
        self.buffers = buffers

    def step(self, rows: int) -> Tensor:
        with torch.no_grad():
            return self.kv.step(self.buffers)[:rows].clone()


def test_reasyn_kv_is_installed_and_builds_by_name_on_the_cpu() -> None:
    assert installed_targets()["reasyn-kv"] == "reasyn_ref.targets.kv:make_target"
    target = build_target("reasyn-kv", CPU)
    assert isinstance(target, CudaGraphTarget)
    assert len(target.keys) == NUM_KEYS == 40
    # No graphs on the CPU: the graphed side and the graph capabilities, reset_state among
    # them, are left out; the dry run calls the eager side alone.
    assert target.graphed is None
    assert target.state is None and target.cache is None
    with pytest.raises(RuntimeError, match="step graphs need CUDA"):
        KVTarget(CPU).graphed(draw(target, numbered(target, 0), seed=0))


def test_cases_cycle_through_forty_distinct_keys_the_last_one_the_largest() -> None:
    keys = [key_for_case(case) for case in range(NUM_KEYS)]
    assert len(set(keys)) == NUM_KEYS
    assert key_for_case(3) == key_for_case(3 + NUM_KEYS) == StepKey(8, 64, 64)
    assert max(keys, key=lambda key: key.batch * key.cache_len * key.memory_len) == key_for_case(
        LARGEST_CASE
    )
    assert key_for_case(LARGEST_CASE) == StepKey(16, 256, 128)


@pytest.mark.parametrize("case", [0, 1, 7, 26, LARGEST_CASE])
def test_an_episode_fits_its_key_and_its_rows_start_at_their_own_positions(
    kv_target: KVTarget, case: int
) -> None:
    batch, cache_len, memory_len = key_for_case(case)
    config = kv_target.config
    for seed in range(3):
        inputs = episode_inputs(kv_target, case, seed)
        assert kv_target.key_of(inputs) == key_for_case(case)
        tokens, lengths = inputs["tokens"], inputs["lengths"]
        assert tokens.shape == (batch, cache_len - STEPS)
        assert inputs["step_tokens"].shape == (STEPS, batch)
        assert inputs["memory"].shape == (1, memory_len, config.d_model)
        assert inputs["memory_padding_mask"].shape == (1, memory_len)
        assert not inputs["memory_padding_mask"][0, 0]  # at least one real memory position
        # The last step of every row stays inside the cache.
        assert 1 <= lengths.min() and lengths.max() + STEPS <= cache_len
        for row, length in zip(tokens, lengths.tolist(), strict=True):
            assert row[0] == config.start_token
            assert (row[1:length] >= 3).all() and (row[length:] == config.pad_token).all()


def test_an_episode_is_teacher_forced_decoding_as_the_full_decoder_computes_it(
    kv_target: KVTarget,
) -> None:
    inputs = episode_inputs(kv_target, case=2, seed=5)  # 4 rows of different lengths
    lengths = inputs["lengths"].tolist()
    assert len(set(lengths)) > 1
    prefixes = [
        row[:length].tolist() for row, length in zip(inputs["tokens"], lengths, strict=True)
    ]
    logits = kv_target.eager(inputs)["logits"]
    assert logits.shape == (STEPS, 4, kv_target.config.vocab_size)
    memory, padding = expand_memory(inputs["memory"], inputs["memory_padding_mask"], len(lengths))
    for step in range(STEPS):
        fed = inputs["step_tokens"][: step + 1].T.tolist()
        rows = [prefix + extra for prefix, extra in zip(prefixes, fed, strict=True)]
        tokens, gather = pad_rows(rows, kv_target.config, bucket=False)
        with torch.no_grad():
            full = kv_target.decoder(tokens, memory, padding, gather)
        torch.testing.assert_close(logits[step], full, rtol=1e-5, atol=1e-5)


def test_the_cache_returned_is_what_the_episode_wrote_and_zero_past_it(
    kv_target: KVTarget,
) -> None:
    inputs = episode_inputs(kv_target, case=1, seed=3)
    cache = kv_target.eager(inputs)["cache"]
    prefix_len = inputs["tokens"].shape[1]
    for row, length in enumerate(inputs["lengths"].tolist()):
        reach = max(prefix_len, length + STEPS)
        assert (cache[:, :, row, :reach].abs().sum(-1) > 0).all()
        assert (cache[:, :, row, reach:] == 0).all()


def test_kept_buffers_carry_no_state_from_one_episode_to_the_next(kv_target: KVTarget) -> None:
    kept = KeptBuffers(kv_target.kv)
    for case in (1, 3):  # 2 and 8 rows
        pair = [episode_inputs(kv_target, case, seed) for seed in (10, 11)]
        fresh = [kv_target.eager(inputs) for inputs in pair]
        for order in ((0, 1), (1, 0), (0, 1)):
            for index in order:
                answer = kv_target.episode(kept, pair[index])
                torch.testing.assert_close(answer, fresh[index], rtol=0, atol=0)


def twin_episodes(kv_target: KVTarget, decoder_class: type[KVDecoder]) -> list[bool]:
    """Episodes of case 1 (2 rows) through kept buffers of ``decoder_class``: for each of four
    draws, whether it matched the plain decoder's answer."""
    kept = KeptBuffers(decoder_class(kv_target.decoder))
    matches = []
    for seed in range(4):
        inputs = episode_inputs(kv_target, 1, seed)
        expected = kv_target.eager(inputs)["logits"]
        matches.append(torch.equal(kv_target.episode(kept, inputs)["logits"], expected))
    return matches


def test_baked_positions_break_every_episode(kv_target: KVTarget) -> None:
    assert twin_episodes(kv_target, broken_kv_targets.BakedPositionDecoder) == [False] * 4


def test_a_shared_position_breaks_rows_at_different_positions_only(kv_target: KVTarget) -> None:
    kept = KeptBuffers(broken_kv_targets.SharedPositionDecoder(kv_target.decoder))
    inputs = episode_inputs(kv_target, 1, seed=0)
    assert inputs["lengths"][0] != inputs["lengths"][1]
    logits = kv_target.episode(kept, inputs)["logits"]
    assert not torch.equal(logits, kv_target.eager(inputs)["logits"])
    same = {**inputs, "lengths": inputs["lengths"][:1].expand(2).clone()}
    torch.testing.assert_close(
        kv_target.episode(kept, same)["logits"], kv_target.eager(same)["logits"], rtol=0, atol=0
    )


def test_a_stale_position_counter_shows_only_after_a_longer_episode(kv_target: KVTarget) -> None:
    kept = KeptBuffers(broken_kv_targets.PositionCounterDecoder(kv_target.decoder))
    short = episode_inputs(kv_target, 0, seed=0)  # one row
    long = {**short, "lengths": short["lengths"] + 10}
    assert long["lengths"].item() + STEPS <= key_for_case(0).cache_len
    for inputs in (short, long):  # each further than the one before: right
        torch.testing.assert_close(
            kv_target.episode(kept, inputs), kv_target.eager(inputs), rtol=0, atol=0
        )
    # After the longer one, the counter is past every position of the shorter one.
    assert not torch.equal(
        kv_target.episode(kept, short)["logits"], kv_target.eager(short)["logits"]
    )


def test_reset_state_must_be_callable() -> None:
    with pytest.raises(TypeError, match=r"State.reset must be callable or None, got str"):
        State(reset="clear")  # type: ignore[arg-type]


@pytest.mark.parametrize("factory", TWINS)
def test_each_twin_builds_a_valid_target_on_the_cpu(factory: str) -> None:
    target = build_target(f"broken_kv_targets:{factory}", CPU)
    assert list(target.keys) == [key_for_case(case) for case in range(NUM_KEYS)]


def test_the_suite_runs_its_cpu_checks_on_reasyn_kv_and_skips_the_rest_saying_why(
    run_suite: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = run_suite("--cudagraph-target", "reasyn-kv", "--cudagraph-emulate=off")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    verdicts = table_verdicts(result)
    assert {check for check, verdict in verdicts.items() if verdict == "passed"} == {
        "target contract",
        "dry run",
        "guards",
    }
    assert set(verdicts.values()) == {"passed", "skipped"}
    result.stdout.fnmatch_lines(
        [
            "conformance of reasyn-kv (3 passed, *):",
            "  target contract * passed * 40 keys, each its draws' key; inputs memory, "
            "memory_padding_mask, tokens, lengths, step_tokens vary *",
            "  guards * passed * 7 of 7 unsupported modes refused clearly",
            "  worker refusal * skipped * the target does not give workers *",
            # The checks that need CUDA, the stateful ones among them, in the account's line.
            "  25 checks need CUDA and skipped (needs CUDA: torch.cuda.is_available() is False): "
            "* state isolation, state reset, *",
        ],
        consecutive=False,
    )
