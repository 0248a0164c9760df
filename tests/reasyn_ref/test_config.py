"""Configs refuse fields of the wrong type and sizes out of range, and round-trip through their
dict form."""

from __future__ import annotations

import pytest

from reasyn_ref import DecoderConfig, EncoderConfig
from reasyn_ref.config import MAX_LEN


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("end_token", 2.5, "int"),
        ("pad_token", True, "int"),
        ("start_token", "1", "int"),
        ("d_model", 32.0, "int"),
        ("num_layers", False, "int"),
        ("reaction_tokens", [157, 272], r"tuple\[int, int\]"),
        ("reaction_tokens", (157.0, 272), r"tuple\[int, int\]"),
        ("reaction_tokens", (1, 2, 3), r"tuple\[int, int\]"),
        ("norm_first", 1, "bool"),
    ],
)
def test_a_decoder_config_field_of_the_wrong_type_is_refused(field, value, expected):
    with pytest.raises(TypeError, match=rf"^DecoderConfig\.{field} must be {expected}, got"):
        DecoderConfig(**{field: value})


@pytest.mark.parametrize("token", [1, 2, 5])
def test_start_and_end_tokens_must_differ(token):
    with pytest.raises(
        ValueError,
        match=rf"^DecoderConfig\.start_token and end_token must differ: .*; both are {token}$",
    ):
        DecoderConfig(start_token=token, end_token=token)


def test_an_encoder_config_pad_token_must_be_an_int():
    with pytest.raises(TypeError, match=r"^EncoderConfig\.pad_token must be int, got True"):
        EncoderConfig(pad_token=True)


@pytest.mark.parametrize("config", [DecoderConfig(), DecoderConfig.tiny(), EncoderConfig()])
def test_a_config_round_trips_through_its_dict(config):
    assert type(config).from_dict(config.to_dict()) == config


@pytest.mark.parametrize("config_class", [DecoderConfig, EncoderConfig])
@pytest.mark.parametrize("field", ["d_model", "nhead", "dim_feedforward", "num_layers", "max_len"])
def test_a_size_must_be_at_least_one(config_class, field):
    with pytest.raises(ValueError, match=rf"^{config_class.__name__}\.{field} must be an int"):
        config_class(**{field: 0})


@pytest.mark.parametrize("config_class", [DecoderConfig, EncoderConfig])
def test_max_len_is_bounded_since_the_models_build_tables_of_it(config_class):
    assert config_class(max_len=MAX_LEN).max_len == MAX_LEN
    with pytest.raises(
        ValueError, match=rf"max_len must be an int in \[1, MAX_LEN={MAX_LEN}\], got {MAX_LEN + 1}"
    ):
        config_class(max_len=MAX_LEN + 1)
