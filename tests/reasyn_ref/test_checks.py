"""The argument checks every entry point shares: a TypeError for a wrong type, a ValueError for
a wrong value, each naming the input and the rule, at the very bounds of the rule."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pytest
import torch

from reasyn_ref.checks import (
    check_bool,
    check_choice,
    check_device,
    check_int,
    check_number,
    check_tensor,
    describe,
    token_id,
    token_rows,
)


def test_an_int_inside_its_bounds_is_returned_and_one_past_either_is_refused():
    assert check_int("n", 3, minimum=3, maximum=5) == 3
    assert check_int("n", 5, minimum=3, maximum=5) == 5
    assert check_int("n", 10**30, minimum=0) == 10**30  # no upper bound
    with pytest.raises(ValueError, match=r"^n must be an int in \[3, 5\], got 2$"):
        check_int("n", 2, minimum=3, maximum=5)
    with pytest.raises(ValueError, match=r"^n must be an int in \[3, 5\], got 6$"):
        check_int("n", 6, minimum=3, maximum=5)
    with pytest.raises(ValueError, match=r"^n must be an int >= 1, got 0$"):
        check_int("n", 0, minimum=1)


@pytest.mark.parametrize("value", [True, False, 2.0, "2", None, Fraction(2)])
def test_what_is_not_an_int_is_a_type_error_even_in_range(value):
    rule = re.escape(f"rows must be an int in [0, B=4], got {value!r}")
    with pytest.raises(TypeError, match=rf"^{rule}$"):
        check_int("rows", value, minimum=0, maximum=4, label="B")


def test_a_number_is_finite_and_at_or_above_its_minimum():
    assert check_number("t", 2, minimum=2) == 2.0 and type(check_number("t", 2, minimum=2)) is float
    assert check_number("t", Fraction(5, 2), minimum=0) == 2.5
    with pytest.raises(ValueError, match=r"^t must be a finite number >= 2, got 1.5$"):
        check_number("t", 1.5, minimum=2)
    with pytest.raises(ValueError, match=r"^s must be a number of seconds > 0, got 0$"):
        check_number("s", 0, minimum=0, inclusive=False, what="a number of seconds")
    for value in (math.inf, math.nan):
        with pytest.raises(ValueError, match=rf"^t must be a finite number >= 0, got {value}$"):
            check_number("t", value, minimum=0)
    for value in (True, "1", None, 1j):
        with pytest.raises(TypeError, match=r"^t must be a finite number >= 0, got "):
            check_number("t", value, minimum=0)


def test_a_bool_and_a_choice():
    assert check_bool("flag", False) is False
    with pytest.raises(TypeError, match=r"^flag must be a bool, got 1$"):
        check_bool("flag", 1)
    assert check_choice("kind", "cpu", ("cuda", "cpu")) == "cpu"
    with pytest.raises(ValueError, match=r"^kind must be 'cuda' or 'cpu', got 'tpu'$"):
        check_choice("kind", "tpu", ("cuda", "cpu"))
    with pytest.raises(TypeError, match=r"^kind must be 'cuda' or 'cpu', got 0$"):
        check_choice("kind", 0, ("cuda", "cpu"))


def test_a_tensor_of_a_dtype_or_of_any_floating_dtype():
    tokens = torch.zeros(2, 3, dtype=torch.long)
    assert check_tensor("tokens", tokens, torch.long) is tokens
    assert check_tensor("memory", torch.zeros(2, dtype=torch.bfloat16), None) is not None
    with pytest.raises(ValueError, match=r"^tokens must be a torch.long tensor, got torch.int32"):
        check_tensor("tokens", tokens.int(), torch.long)
    with pytest.raises(
        ValueError, match=r"^memory must be a floating-point tensor, got torch.int64"
    ):
        check_tensor("memory", tokens, None)
    with pytest.raises(TypeError, match=r"^mask must be a torch.bool tensor, got list$"):
        check_tensor("mask", [True], torch.bool)
    with pytest.raises(TypeError, match=r"^x must be a torch.float16 tensor, got ndarray$"):
        check_tensor("x", pytest.importorskip("numpy").zeros(2), torch.float16)


def test_a_device_is_a_device_a_device_string_or_an_index():
    assert check_device("device", "cuda:1") == torch.device("cuda", 1)
    assert check_device("device", torch.device("cpu")) == torch.device("cpu")
    for value, error in (
        (1.5, TypeError),
        (True, TypeError),
        ("gpu", ValueError),
        (-1, ValueError),
    ):
        with pytest.raises(error, match=rf"^device must be a torch.device, .* got {value!r}"):
            check_device("device", value)


def test_token_ids_are_ints_not_bools():
    assert token_id(7) == 7 and token_id(torch.tensor(7)) == 7
    for value in (True, 7.0, "7"):
        with pytest.raises(TypeError):
            token_id(value)
    with pytest.raises(TypeError, match="a token id must be an int, got float"):
        token_id(7.0)


def test_token_rows_are_tuples_of_int_ids_one_row_or_more():
    rows = token_rows("prefixes", [[1, 2], (3,), torch.tensor([4, 5])])
    assert rows == ((1, 2), (3,), (4, 5)) and all(type(t) is int for row in rows for t in row)


@pytest.mark.parametrize(
    ("rows", "error", "message"),
    [
        ("abc", TypeError, r"^p must be a sequence of token-id sequences, got str$"),
        (torch.ones(2, 2, dtype=torch.long), TypeError, r"^p must be a sequence of .* got torch"),
        (iter([[1]]), TypeError, r"^p must be a sequence of token-id sequences, got list_iter"),
        ([], ValueError, r"^p must hold at least one row$"),
        ([[1], 7], TypeError, r"^p\[1\] must be a sequence of int token ids, got int$"),
        ([[1], "ab"], TypeError, r"^p\[1\] must be a sequence of int token ids, got str$"),
        ([[1, 2.5]], TypeError, r"^p\[0\] must hold int token ids"),
        ([[True]], TypeError, r"^p\[0\] must hold int token ids: a bool is not a token id$"),
        ([[1], []], ValueError, r"^p\[1\] is empty; a prefix needs a token$"),
    ],
)
def test_token_rows_refuse_what_is_not_rows_of_ids(rows, error, message):
    with pytest.raises(error, match=message):
        token_rows("p", rows)


def test_describe_names_a_tensor_by_dtype_shape_and_device_and_anything_else_by_type():
    assert describe(torch.zeros(2, 3)) == "torch.float32 tensor of shape (2, 3) on cpu"
    assert describe([1]) == "list" and describe(None) == "NoneType"
