"""pytest_cudagraph.conformance.catalog: a check asks for what it needs (``needed``: it skips,
naming what is missing) or uses what it can do without (``given``); the map of what each check
needs is read from the checks' own source, and docs/own-graphs.md shows it as it is."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_cudagraph.conformance import Cache, CudaGraphTarget, Sampling
from pytest_cudagraph.conformance.catalog import (
    CheckNeeds,
    check_needs,
    given,
    lacking,
    needed,
    needs_table,
)

ROOT = Path(__file__).resolve().parents[2]


def target_with(**capabilities: object) -> CudaGraphTarget:
    return CudaGraphTarget(
        device=torch.device("cpu"),
        eager=len,
        graphed=None,
        keys=[1],
        draw=lambda generator, case: {},
        key_of=len,
        **capabilities,  # type: ignore[arg-type]
    )


def test_a_needed_capability_is_given_back_and_its_absence_skips_naming_it() -> None:
    cache = Cache(capacity=3)
    target = target_with(cache=cache)
    assert needed(target, Cache, "capacity") is cache
    with pytest.raises(
        pytest.skip.Exception,
        match=r"^the target does not give cache.reset, cache.largest_key \(optional",
    ):
        needed(target, Cache, "reset", "capacity", "largest_key")
    with pytest.raises(pytest.skip.Exception, match=r"^the target does not give sampling \("):
        needed(target, Sampling)
    assert given(target, Cache, "capacity") == 3
    assert given(target, Cache, "lock") is None and given(target, Sampling, "sample") is None
    assert lacking(target, ["cache.capacity", "cache.lock", "sampling"]) == [
        "cache.lock",
        "sampling",
    ]


CHECK_MODULE = """
from pytest_cudagraph.conformance.catalog import given, needed
from pytest_cudagraph.conformance.protocol import Cache, Sampling, State
from pytest_cudagraph.skips import needs_cuda


@pytest.fixture
def sampler(target):
    return needed(target, Sampling).sample


def helper(target):
    return given(target, Cache, "lock")


@needs_cuda
def test_first_check(target, sampler):
    needed(target, Cache, "capacity", "reset")
    helper(target)


def test_second_check(target):
    given(target, State, "sides")
    needed(target, Unknown)
"""


def test_what_a_check_needs_is_read_from_its_calls_its_fixtures_and_its_helpers(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_05_made_up.py").write_text(CHECK_MODULE)
    (tmp_path / "not_a_check.py").write_text("needed(target, Cache)\n")
    assert check_needs(tmp_path) == [
        CheckNeeds(
            "first check", True, ("cache.capacity", "cache.reset", "sampling"), ("cache.lock",)
        ),
        CheckNeeds("second check", False, (), ("state.sides",)),
    ]


def test_the_suites_own_map_names_what_each_check_needs() -> None:
    checks = {row.check: row for row in check_needs()}
    assert len(checks) == 29 and list(checks)[:2] == ["target contract", "dry run"]
    assert checks["bounded memory"].needs == ("cache.reset", "cache.capacity", "cache.largest_key")
    assert checks["identical sampling"].needs == ("sampling",)
    assert checks["capture clean forward"].needs == ("capture_clean",)  # through its fixture
    assert set(checks["lock safety"].uses) == {
        "cache.fault_points",
        "cache.reset",
        "cache.cached_keys",
        "cache.lock",
        "state.sides",  # the comparing checks keep a stateful target's sides in step
        "state.reset",
    }
    assert checks["capture does not advance state"].needs == ("state.sides",)
    assert not checks["guards"].cuda and checks["parity"].cuda


def test_the_own_graphs_page_shows_what_each_check_needs_as_the_checks_say() -> None:
    page = (ROOT / "docs" / "own-graphs.md").read_text()
    table = needs_table(check_needs())
    assert "\n".join(table) in page, "regenerate it: pytest-cudagraph checks"
