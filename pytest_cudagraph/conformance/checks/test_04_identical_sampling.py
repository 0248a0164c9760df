"""Identical sampling: the target's sampler draws the same tokens with graphs off and on, seed
for seed (``sampling.sample(seed, graphs)``)."""

from __future__ import annotations

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._judging import called
from pytest_cudagraph.conformance._protocol import Sampling
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement
from pytest_cudagraph.engines import trees
from pytest_cudagraph.engines.compare import compare_outputs

SEEDS = (0, 1)


@check("identical sampling", needs=("sampling",))
def test_identical_sampling(sampling: Sampling, conclude: Conclude) -> None:
    off = {seed: called("Sampling.sample", sampling.sample, seed, False) for seed in SEEDS}
    on = {seed: called("Sampling.sample", sampling.sample, seed, True) for seed in SEEDS}
    tokens = trees.compared_elements(off)
    mismatches = compare_outputs(off, on, path="seed", sides=("graphs off", "graphs on"))
    figure = f"graphs off vs on, seeds {', '.join(map(str, SEEDS))}: {tokens} tokens per side"
    problems = [mismatch.describe() for mismatch in mismatches]
    conclude(Judgement(problems, figure, tokens, "tokens"), "sampled tokens differ:")
