"""On the upstream repo's pinned stack, the torch APIs the reference relies on are there.

Marked ``pinned_stack``: they run where the running stack matches the pinned one (tox -e
pinned, Python 3.10 + torch 2.7) and skip elsewhere, where the rest of the suite covers them.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.pinned_stack


def parameters(function: object) -> set[str]:
    return set(inspect.signature(function).parameters)


def test_decoder_forward_takes_the_causal_flags_that_skip_the_mask_comparison():
    # The capture-clean forward passes tgt_is_causal=True and memory_is_causal=False.
    for forward in (nn.TransformerDecoder.forward, nn.TransformerDecoderLayer.forward):
        assert {"tgt_is_causal", "memory_is_causal"} <= parameters(forward)


def test_autocast_is_queried_per_device_type():
    # The step asks whether autocast is on for its device and in which dtype.
    assert torch.is_autocast_enabled("cpu") is False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_graph_capture_takes_a_pool_a_stream_and_a_capture_error_mode():
    assert {"pool", "stream", "capture_error_mode"} <= parameters(torch.cuda.graph.__init__)
    assert callable(torch.cuda.graph_pool_handle)
    assert callable(torch.cuda.is_current_stream_capturing)


def test_cudnn_attention_can_be_switched_and_read():
    enabled = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(not enabled)
        assert torch.backends.cuda.cudnn_sdp_enabled() is (not enabled)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(enabled)


def test_checkpoints_load_with_weights_only(tmp_path):
    path = tmp_path / "state.pt"
    torch.save({"weight": torch.ones(2)}, path)
    assert torch.equal(torch.load(path, weights_only=True)["weight"], torch.ones(2))
