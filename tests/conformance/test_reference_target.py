"""The bundled target (reasyn_ref.targets.reference) on the CPU: its cases land in the keys it
promises, in the sampler's bucketed layout, and the inputs it calls unsupported are exactly the
ones the graph cache's input check refuses, with the messages it expects."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from suite_runner import table_verdicts

from pytest_cudagraph.conformance._judging import draw, numbered
from reasyn_ref.bucketing import bucket_batch, bucket_seq
from reasyn_ref.graph_cache import GraphKey, check_graph_step
from reasyn_ref.targets.reference import (
    BAD_INPUTS,
    LARGEST_CASE,
    NUM_KEYS,
    ReferenceTarget,
    ar_step,
    key_for_case,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def reference() -> ReferenceTarget:
    return ReferenceTarget(CPU)


def test_cases_cycle_through_sixty_distinct_keys() -> None:
    assert NUM_KEYS == 60
    assert len({key_for_case(case) for case in range(NUM_KEYS)}) == NUM_KEYS
    assert key_for_case(7) == key_for_case(7 + NUM_KEYS) == GraphKey(4, 256, 128, True, True)
    assert key_for_case(LARGEST_CASE) == GraphKey(16, 256, 192, True, False)
    # A batch of one row holds its own memory: no key of one row is shared.
    assert key_for_case(10) == GraphKey(1, 192, 128, True, False)
    sizes = {
        case: key_for_case(case).batch * key_for_case(case).seq * key_for_case(case).memory_len
        for case in range(NUM_KEYS)
    }
    assert max(sizes, key=sizes.get) == LARGEST_CASE


def test_each_case_lands_in_its_key_as_the_graph_cache_computes_it(
    reference: ReferenceTarget,
) -> None:
    """key_of is the cache's own key of a step: every case of the target draws inputs whose
    key is the case's, as the suite's contract check demands."""
    target = reference.as_target()
    assert list(target.keys) == [key_for_case(case) for case in range(NUM_KEYS)]
    for number in range(NUM_KEYS):
        case = numbered(target, number)
        assert target.key_of(draw(target, case, seed=number)) == case.key, number


@pytest.mark.parametrize("case", [0, 1, 4, 7, 10, LARGEST_CASE])
def test_inputs_are_one_sampler_step_in_the_bucketed_layout(
    reference: ReferenceTarget, case: int
) -> None:
    key = key_for_case(case)
    batch, seq, memory_len, shared = key.batch, key.seq, key.memory_len, key.shared_memory
    for seed in range(3):
        inputs = reference.make_inputs(torch.Generator().manual_seed(seed), case)
        assert reference.key_of(inputs) == key
        if shared:  # one target's memory and mask viewed over the batch, as the sampler has it
            assert inputs["memory"].stride(0) == inputs["memory_padding_mask"].stride(0) == 0
        tokens, gather, rows = inputs["tokens"], inputs["gather"], inputs["rows"]
        assert tokens.shape == (batch, seq) and gather.shape == (batch,)
        assert inputs["memory"].shape == (batch, memory_len, reference.config.d_model)
        assert inputs["memory_padding_mask"].shape == (batch, memory_len)
        assert bucket_batch(rows) == batch
        assert bucket_seq(int(gather.max()) + 1, reference.config.max_len) == seq
        lengths = gather + 1
        positions = torch.arange(seq)
        real = positions < lengths[:, None]
        assert (tokens[:, 0] == reference.config.start_token).all()
        assert (tokens[~real] == reference.config.pad_token).all()
        assert (tokens[real][tokens[real] != reference.config.start_token] >= 3).all()
        assert (lengths[rows:] == 1).all(), "dummy rows are [start] + padding, gather 0"
        assert not inputs["memory_padding_mask"][:, 0].any(), "every row attends to something"


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_each_unsupported_input_is_refused_by_the_cache_as_the_target_expects(
    reference: ReferenceTarget, name: str
) -> None:
    change, message = BAD_INPUTS[name]
    inputs = change(reference.make_inputs(torch.Generator().manual_seed(0), LARGEST_CASE))
    # The cache is bound to a CUDA device; on the CPU only inputs moved off it differ from it.
    bound = torch.device("cuda", 0) if name == "inputs on the CPU" else CPU
    with pytest.raises(ValueError) as refused:
        check_graph_step(reference.config, bound, torch.float32, ar_step(inputs))
    assert re.search(message, str(refused.value))


def test_the_eager_step_is_the_samplers(reference: ReferenceTarget) -> None:
    inputs = reference.make_inputs(torch.Generator().manual_seed(0), 3)
    logits = reference.eager(inputs)
    assert logits.shape == (inputs["rows"], reference.config.vocab_size)
    assert logits.dtype == torch.float32
    with pytest.raises(RuntimeError, match="needs CUDA"):
        reference.graphed(inputs)


@pytest.mark.slow
def test_the_suite_dry_runs_the_lean_step_on_every_key_on_the_cpu(
    run_suite: Callable[..., pytest.RunResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """reasyn-lean's eager side (the lean step) through all 60 keys, with CUDA hidden (the
    reasyn target's own CPU run is test_suite_on_cpu.py's)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = run_suite("--cudagraph-target", "reasyn-lean", "-k", "target")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert table_verdicts(result) == {"dry run": "passed", "target contract": "passed"}
    # draw, key_of, eager, Cache.reset, Sampling.sample, Padding.make_inputs and
    # Trajectory.next_inputs
    result.stdout.fnmatch_lines(
        ["  dry run * passed * eager once on each of 60 keys; 7 of your callables ran"]
    )
