"""Loading the upstream-sized decoder's checkpoint (about 440 MiB of fp32 weights) on the CPU,
against a bare ``torch.load`` of the same file.

``load_checkpoint`` checks a file whole before it builds anything from it (the archive's CRCs,
the config, every weight's name, shape, dtype, layout and values); ``vs_bare_load`` is what all
of that and the build cost over reading the file at all. The two are timed in interleaved pairs
(``paired``), after a warm-up round has put the file in the page cache, so that both read it
from memory under the same clocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from bench_workloads import paired

from pytest_cudagraph.engines.units import MiB
from reasyn_ref import Decoder, DecoderConfig, load_checkpoint, save_checkpoint
from reasyn_ref.workloads import seeded_decoder


@pytest.fixture(scope="module")
def upstream_decoder() -> Decoder:
    return seeded_decoder(DecoderConfig(), 0)


@pytest.fixture(scope="module")
def upstream_checkpoint(
    upstream_decoder: Decoder, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("checkpoint") / "decoder.pt"
    save_checkpoint(path, upstream_decoder, upstream_decoder.config)
    return path


def host_ms(call: Callable[[], object]) -> float:
    """Milliseconds of one ``call`` on the host clock."""
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


@pytest.mark.slow
def test_checkpoint_load(benchmark, upstream_decoder, upstream_checkpoint):
    loaded = benchmark.pedantic(
        load_checkpoint, args=(upstream_checkpoint,), rounds=5, warmup_rounds=1
    )
    expected, state = upstream_decoder.state_dict(), loaded.state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(weight, expected[name]) for name, weight in state.items())
    benchmark.extra_info.update(
        bench="checkpoint_load",
        config="default",
        file_mib=upstream_checkpoint.stat().st_size / MiB,
    )
    if benchmark.stats is None:  # benchmarks disabled: the body ran once, untimed
        return
    pairs = paired(
        lambda: load_checkpoint(upstream_checkpoint),
        lambda: torch.load(upstream_checkpoint, weights_only=True),
        timer=host_ms,
    )
    benchmark.extra_info.update(
        vs_bare_load=pairs.speedup, bare_load_ms=pairs.fast_ms, pairs=pairs.pairs
    )
