"""ARStep: the key of its shapes and layout, its move to another device, and the malformed steps
it refuses, naming the rule each breaks."""

from __future__ import annotations

import pytest
import torch
from step_inputs import KEYED_SHAPES, replaced, step_inputs

from reasyn_ref import ARStep, GraphKey


@pytest.mark.parametrize(
    ("shape", "expected"),
    KEYED_SHAPES,
)
def test_the_key_holds_every_shape_and_layout_the_forward_depends_on(shape, expected):
    assert ARStep(**step_inputs(**shape)).key == expected


def test_a_memory_is_shared_only_when_one_row_is_viewed_over_the_batch():
    inputs = step_inputs(batch=4)
    assert ARStep(**inputs).key.shared_memory
    inputs["memory"] = inputs["memory"].contiguous()  # the same values, one row each
    assert not ARStep(**inputs).key.shared_memory
    assert GraphKey(4, 64, 64, True) == GraphKey(4, 64, 64, True, False)


def test_a_step_moved_to_another_device_keeps_its_layout():
    step = ARStep(**step_inputs())
    moved = step.to("meta")
    assert moved.device == torch.device("meta") and moved.rows == step.rows
    assert moved.key == step.key  # the expanded memory is still one target's


# A malformed step, whatever it runs on: ARStep refuses it.
@pytest.mark.parametrize(
    ("inputs", "error", "message"),
    [
        (replaced("gather", None), TypeError, r"gather must be a torch.long tensor \[B\]"),
        (
            replaced("tokens", lambda i: i["tokens"].int()),
            ValueError,
            r"tokens must be a torch.long tensor",
        ),
        (replaced("tokens", [[1, 2]]), TypeError, r"tokens must be a torch.long tensor, got list"),
        (
            replaced("gather", lambda i: i["gather"].int()),
            ValueError,
            r"gather must be a torch.long tensor",
        ),
        (
            replaced("memory_padding_mask", lambda i: i["memory_padding_mask"].float()),
            ValueError,
            r"memory_padding_mask must be a torch.bool tensor",
        ),
        (
            replaced("memory_padding_mask", [[False] * 64] * 4),
            TypeError,
            r"memory_padding_mask must be a torch.bool tensor, got list",
        ),
        (replaced("memory", 0.5), TypeError, r"memory must be a floating-point tensor, got float"),
        (
            replaced("memory", lambda i: i["memory"].to("meta")),
            ValueError,
            r"memory is on meta but tokens are on cpu",
        ),
        (
            replaced("gather", lambda i: i["gather"].to("meta")),
            ValueError,
            r"gather is on meta but tokens are on cpu",
        ),
        (
            replaced("memory", lambda i: i["memory"][:2]),
            ValueError,
            r"memory must be \[B=4, M >= 1, d\]",
        ),
        (
            replaced("memory", lambda i: i["memory"][:, :0]),
            ValueError,
            r"memory must be \[B=4, M >= 1, d\]",
        ),
        (replaced("rows", 0), ValueError, r"rows must be an int in \[1, B=4\], got 0"),
        (replaced("rows", 5), ValueError, r"rows must be an int in \[1, B=4\], got 5"),
        (replaced("rows", True), TypeError, r"rows must be an int in \[1, B=4\], got True"),
        (replaced("rows", 2.0), TypeError, r"rows must be an int in \[1, B=4\], got 2.0"),
    ],
)
def test_a_malformed_step_is_refused_with_the_rule_it_breaks(inputs, error, message):
    with pytest.raises(error, match=message):
        ARStep(**inputs)
