"""Tiny models, one encoded target and transfer spies, shared by the reference tests; and the
upstream-sized decoder on the GPU for the GPU test modules."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from cache_recorders import FakeCuda
from torch import Tensor

from reasyn_ref import ARSampler, Decoder, DecoderConfig, Encoder, EncoderConfig, save_checkpoint
from reasyn_ref.workloads import seeded_decoder, seeded_encoder


@pytest.fixture(scope="module")
def device() -> torch.device:
    """The current CUDA device, for the GPU test modules (they skip without CUDA)."""
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture(scope="module")
def decoder(device: torch.device) -> Decoder:
    """The default (upstream-sized) decoder with random weights on ``device``, one per GPU test
    module."""
    return seeded_decoder(DecoderConfig(), 0, device)


@pytest.fixture
def tiny_decoder() -> Decoder:
    return seeded_decoder(DecoderConfig.tiny(), 0)


@pytest.fixture
def tiny_encoder() -> Encoder:
    return seeded_encoder(EncoderConfig.tiny(), 1)


@pytest.fixture
def target(tiny_encoder: Encoder) -> tuple[Tensor, Tensor]:
    """One target's memory [1, 20, d] and padding mask [1, 20]; the last 4 positions are padding."""
    config = tiny_encoder.config
    smiles = torch.randint(
        1, config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(2)
    )
    smiles[:, 16:] = config.pad_token
    with torch.no_grad():
        return tiny_encoder(smiles)


@pytest.fixture
def transfers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Host/device copies made from Python, in order: "to" for each ``Tensor.to`` that names a
    device, "cpu" for each ``Tensor.cpu``."""
    events: list[str] = []
    to, cpu = torch.Tensor.to, torch.Tensor.cpu

    def to_spy(self: Tensor, *args, **kwargs) -> Tensor:
        if "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args):
            events.append("to")
        return to(self, *args, **kwargs)

    def cpu_spy(self: Tensor, *args, **kwargs) -> Tensor:
        events.append("cpu")
        return cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to_spy)
    monkeypatch.setattr(torch.Tensor, "cpu", cpu_spy)
    return events


@pytest.fixture
def watch_stages(
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[ARSampler], list[tuple[Tensor, Tensor, bool]]]:
    """watch(sampler) -> the list of (tokens, gather, pinned) host layouts it stages, per call."""

    def watch(sampler: ARSampler) -> list[tuple[Tensor, Tensor, bool]]:
        staged: list[tuple[Tensor, Tensor, bool]] = []
        stage = sampler.stage_inputs

        def spy(tokens: Tensor, gather: Tensor) -> tuple[Tensor, Tensor]:
            pinned = tokens.is_pinned() and gather.is_pinned()
            staged.append((tokens.clone(), gather.clone(), pinned))
            return stage(tokens, gather)

        monkeypatch.setattr(sampler, "stage_inputs", spy)
        return staged

    return watch


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    """The torch.cuda calls of a graph cache faked on the CPU (``cache_recorders.FakeCuda``), so
    that its orchestration runs here."""
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    return cuda


@pytest.fixture
def failing_inside_capture() -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """wrap(forward) -> a forward that runs ``forward``, then raises RuntimeError("injected
    failure inside the capture") when it ran inside a CUDA-graph capture (warm-ups pass)."""

    def wrap(forward: Callable[..., Tensor]) -> Callable[..., Tensor]:
        def failing(*args: object) -> Tensor:
            out = forward(*args)
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("injected failure inside the capture")
            return out

        return failing

    return wrap


@pytest.fixture
def no_toggles_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers inherit the environment: the caller's REASYN_* toggles must not leak in."""
    for name in ("REASYN_BATCHED_AR", "REASYN_BF16", "REASYN_BUCKET", "REASYN_CUDAGRAPH"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """A tiny decoder's checkpoint, shared by a module's worker pools."""
    decoder = seeded_decoder(DecoderConfig.tiny(), 0)
    path = tmp_path_factory.mktemp("workers") / "decoder.pt"
    save_checkpoint(path, decoder, decoder.config)
    return path
