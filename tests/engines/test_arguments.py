"""The argument checks the engines share."""

from __future__ import annotations

import math

import pytest

from pytest_cudagraph.engines.arguments import non_negative_number


@pytest.mark.parametrize(("value", "checked"), [(0, 0.0), (3, 3.0), (0.25, 0.25), (10**300, 1e300)])
def test_a_finite_number_at_or_above_zero_is_taken_as_a_float(
    value: object, checked: float
) -> None:
    result = non_negative_number("x", value)
    assert result == checked and type(result) is float


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (True, TypeError, "^x must be a number, got True$"),
        ("1", TypeError, "^x must be a number, got '1'$"),
        (None, TypeError, "^x must be a number, got None$"),
        (-1e-9, ValueError, r"^x must be a finite number >= 0, got -1e-09$"),
        (math.inf, ValueError, "^x must be a finite number >= 0, got inf$"),
        (math.nan, ValueError, "^x must be a finite number >= 0, got nan$"),
        (10**400, ValueError, "^x must be a finite number >= 0, got 1000"),
    ],
)
def test_anything_else_is_refused_naming_the_argument_and_the_rule(
    value: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        non_negative_number("x", value)


def test_the_type_error_says_what_kind_of_number_it_wants() -> None:
    with pytest.raises(TypeError, match=r"^bound must be a number of MiB, got '16MiB'$"):
        non_negative_number("bound", "16MiB", kind="a number of MiB")
