"""Unchanged: values held with their copies, each change reported once, naming what ran."""

from __future__ import annotations

import pytest
import torch

from pytest_cudagraph.engines.unchanged import Unchanged


def test_a_value_changed_in_place_is_reported_once_naming_what_ran_before() -> None:
    watch = Unchanged()
    x, y = torch.zeros(3), {"ids": torch.arange(4)}
    watch.keep("input 'x' of call 0", x)
    watch.keep("inputs of call 1", y)
    assert watch.changes(after="call 1") == []
    x[1] = 2.5
    (change,) = watch.changes(after="call 2 (key 3)")
    assert change.name == "input 'x' of call 0" and change.after == "call 2 (key 3)"
    assert change.describe() == (
        "input 'x' of call 0 at index (1,): was 0, now 2.5 (|diff| 2.5, rel inf; tolerance "
        "exact); 1 of 3 elements differ, largest |diff| 2.5; seen after call 2 (key 3)"
    )
    y["ids"].add_(1)
    x[0] = 1.0  # changed again: already reported
    (change,) = watch.changes(after="call 3")
    assert change.name == "inputs of call 1" and "inputs of call 1['ids'] at index (0,)" in (
        change.describe()
    )
    assert watch.changes(after="call 4") == []


def test_a_value_rebound_by_its_holder_is_not_a_change() -> None:
    """Only the tensors handed over count: a dict whose entry is replaced still holds them."""
    watch = Unchanged()
    inputs = {"x": torch.ones(2)}
    watch.keep("inputs", inputs)
    inputs = {"x": torch.zeros(2)}  # a new dict: the held one is untouched
    assert watch.changes(after="a call") == []


def test_every_difference_of_one_value_is_counted_in_its_report() -> None:
    watch = Unchanged()
    pair = (torch.zeros(2), torch.zeros(2, dtype=torch.long))
    watch.keep("pair", pair)
    pair[0].fill_(1)
    pair[1].fill_(7)
    (change,) = watch.changes(after="a call")
    assert len(change.mismatches) == 2
    assert change.describe().endswith("(and 1 more); seen after a call")


def test_bad_arguments_are_refused_before_anything_is_held() -> None:
    watch = Unchanged()
    with pytest.raises(TypeError, match=r"name must be text, got 3"):
        watch.keep(3, torch.zeros(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"held\['lock'\]: a .* is not compared"):
        watch.keep("held", {"lock": object()})
    assert len(watch) == 0
    with pytest.raises(TypeError, match=r"after must be text"):
        watch.changes(after=None)  # type: ignore[arg-type]


def test_a_value_held_to_what_it_must_hold_shows_both_under_the_given_sides() -> None:
    """An input a step writes in place, held to what the eager side left in a copy of it."""
    watch = Unchanged(sides=("eager left", "now"))
    x = torch.zeros(2)
    watch.keep("input 'x'", x, expected=torch.tensor([0.0, 5.0]))
    x[1] = 5.0  # the graphed step wrote what eager wrote
    assert watch.changes(after="call 0") == []
    x[0] = 7.0  # a later call wrote into it
    (change,) = watch.changes(after="call 1")
    assert change.describe().startswith("input 'x' at index (0,): eager left 0, now 7 ")
