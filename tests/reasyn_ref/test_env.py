"""The environment toggles take "0" or "1" only; an explicit setting wins."""

from __future__ import annotations

import pytest

from reasyn_ref.env import TOGGLES, resolve_toggle


@pytest.fixture(params=sorted(TOGGLES))
def toggle(request, monkeypatch) -> str:
    monkeypatch.delenv(request.param, raising=False)
    return request.param


@pytest.mark.parametrize(("raw", "expected"), [("0", False), ("1", True), (" 1\n", True)])
def test_0_and_1_set_a_toggle(toggle, monkeypatch, raw, expected):
    monkeypatch.setenv(toggle, raw)
    assert resolve_toggle(toggle, None) is expected


@pytest.mark.parametrize("raw", ["", " ", "\t\n"])
def test_empty_or_blank_means_the_default(toggle, monkeypatch, raw):
    monkeypatch.setenv(toggle, raw)
    assert resolve_toggle(toggle, None) is TOGGLES[toggle]


def test_unset_means_the_default(toggle):
    assert resolve_toggle(toggle, None) is TOGGLES[toggle]


@pytest.mark.parametrize("raw", ["yes", "no", "true", "False", "on", "2", "01", "1.0"])
def test_anything_else_is_refused_naming_the_variable(toggle, monkeypatch, raw):
    monkeypatch.setenv(toggle, raw)
    with pytest.raises(ValueError, match=rf"^environment variable {toggle}={raw!r} must be 0 or 1"):
        resolve_toggle(toggle, None)


@pytest.mark.parametrize("explicit", [True, False])
def test_an_explicit_setting_wins_over_the_environment(toggle, monkeypatch, explicit):
    monkeypatch.setenv(toggle, "yes")  # not even read
    assert resolve_toggle(toggle, explicit) is explicit


@pytest.mark.parametrize("explicit", [1, 0, "1", 1.0])
def test_an_explicit_setting_must_be_a_bool(toggle, explicit):
    with pytest.raises(TypeError, match=rf"^{toggle}: an explicit setting must be a bool or None"):
        resolve_toggle(toggle, explicit)


def test_an_unknown_toggle_is_refused():
    with pytest.raises(ValueError, match=r"^unknown toggle 'REASYN_FAST'"):
        resolve_toggle("REASYN_FAST", None)
