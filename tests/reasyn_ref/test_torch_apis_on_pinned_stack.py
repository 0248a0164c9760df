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


def test_a_module_built_on_the_meta_device_takes_loaded_tensors_as_they_are():
    # load_checkpoint builds the model on the meta device and assigns the weights it loaded.
    with torch.device("meta"):
        layer = nn.Linear(2, 3)
    weight, bias = torch.ones(3, 2), torch.zeros(3)
    layer.load_state_dict({"weight": weight, "bias": bias}, assign=True)
    assert layer.weight.data_ptr() == weight.data_ptr() and layer.bias.data_ptr() == bias.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_aminmax_carries_nan_and_infinities_through(dtype):
    # A checkpoint's weights are finite when their minimum and maximum are.
    for bad in (float("nan"), float("inf"), float("-inf")):
        values = torch.arange(1000, dtype=dtype)
        values[517] = bad
        assert not all(torch.isfinite(v) for v in torch.aminmax(values))
