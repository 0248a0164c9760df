"""pytest_cudagraph.target on the CPU: loading ``module:factory`` specs, validating what the
factory returns, and which spec is in force (option > env > ini > default)."""

from __future__ import annotations

import dataclasses
import sys
import threading
import types
from collections.abc import Callable

import pytest
import torch
from suite_runner import plugin_arguments

from pytest_cudagraph.target import (
    DEFAULT_TARGET,
    CudaGraphTarget,
    TargetError,
    build_target,
    load_factory,
    missing_field_reason,
    target_spec,
)

CPU = torch.device("cpu")


def minimal_target(**changes: object) -> CudaGraphTarget:
    """A valid target with only the required fields, then ``changes``."""
    fields = dict(
        device=CPU,
        eager=lambda inputs: inputs["x"] * 2,
        graphed=lambda inputs: inputs["x"] * 2,
        make_inputs=lambda generator, case: {"x": torch.randn(case % 4 + 1, generator=generator)},
        key_of=lambda inputs: inputs["x"].shape[0],
        num_keys=4,
        reset=lambda: None,
    )
    return CudaGraphTarget(**{**fields, **changes})


@pytest.fixture
def factories(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """An importable module ``fake_targets`` to point specs at."""
    module = types.ModuleType("fake_targets")
    module.NOT_CALLABLE = 3
    module.namespace = types.SimpleNamespace(make=lambda device: minimal_target())
    monkeypatch.setitem(sys.modules, "fake_targets", module)
    return module


def build_with(factories: types.ModuleType, factory: Callable[[torch.device], object]) -> None:
    factories.factory = factory
    build_target("fake_targets:factory", CPU)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("fake_targets", "must be 'module:factory'"),
        ("fake_targets:", "must be 'module:factory'"),
        (":factory", "must be 'module:factory'"),
        ("no_such_module_here:make", "cannot import module 'no_such_module_here'"),
        ("fake_targets:missing", "fake_targets has no attribute 'missing'"),
        ("fake_targets:namespace.missing", "fake_targets has no attribute 'namespace.missing'"),
        ("fake_targets:NOT_CALLABLE", "NOT_CALLABLE is a int, not a callable factory"),
    ],
)
def test_a_spec_that_cannot_be_loaded_is_a_usage_error_naming_it(
    factories: types.ModuleType, spec: str, problem: str
) -> None:
    with pytest.raises(TargetError) as error:
        load_factory(spec)
    assert str(error.value).startswith(f"conformance target {spec!r}: {problem}")
    assert isinstance(error.value, pytest.UsageError)


def test_a_dotted_factory_is_found(factories: types.ModuleType) -> None:
    assert load_factory("fake_targets:namespace.make") is factories.namespace.make
    assert build_target("fake_targets:namespace.make", CPU).num_keys == 4


def test_a_factory_that_raises_is_reported_with_its_error(factories: types.ModuleType) -> None:
    def factory(device: torch.device) -> CudaGraphTarget:
        raise RuntimeError("no GPU for you")

    with pytest.raises(
        TargetError, match=r"'fake_targets:factory': factory failed: RuntimeError: no GPU for you"
    ):
        build_with(factories, factory)


def test_a_factory_returning_something_else_is_refused(factories: types.ModuleType) -> None:
    with pytest.raises(
        TargetError,
        match=r"factory returned dict; expected a pytest_cudagraph\.target\.CudaGraphTarget",
    ):
        build_with(factories, lambda device: {"eager": None})


def test_a_required_field_left_out_is_named(factories: types.ModuleType) -> None:
    def factory(device: torch.device) -> CudaGraphTarget:
        fields = dataclasses.asdict(minimal_target())
        del fields["reset"]
        return CudaGraphTarget(**fields)

    with pytest.raises(TargetError, match=r"factory failed: TypeError: .*'reset'"):
        build_with(factories, factory)
    with pytest.raises(TargetError, match=r"required field\(s\) missing: graphed, reset"):
        build_with(factories, lambda device: minimal_target(graphed=None, reset=None))


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"device": torch.device("meta")},
            "device is device(type='meta'); the factory was asked for cpu",
        ),
        ({"eager": 3}, "eager must be callable, got int"),
        ({"sampler": "sample"}, "sampler must be callable, got str"),
        ({"num_keys": 3}, "num_keys must be an int >= 4, got 3"),
        ({"num_keys": True}, "num_keys must be an int >= 4, got True"),
        ({"capacity": 0}, "capacity must be an int >= 1, got 0"),
        ({"largest_case": -1}, "largest_case must be an int >= 0, got -1"),
        ({"lock": object()}, "lock must have acquire() and release()"),
        ({"sampler": lambda seed: [seed]}, "sampler and graphs_toggle must be given together"),
        ({"graphs_toggle": "X"}, "sampler and graphs_toggle must be given together"),
        (
            {"sampler": lambda seed: [seed], "graphs_toggle": ""},
            "graphs_toggle must be an environment variable name",
        ),
        ({"fault_points": [("warm_up", None)]}, "fault_points must be a mapping, got list"),
        (
            {"fault_points": {"warm_up": (threading.Lock(), "acquire")}},
            "fault_points lacks the stage(s) capture, replay",
        ),
        ({"unsupported_modes": {}}, "unsupported_modes must be a non-empty mapping"),
        (
            {"unsupported_modes": {"bf16 off": (lambda: None, "")}},
            "unsupported_modes['bf16 off'] must be (zero-arg callable, regex)",
        ),
    ],
)
def test_a_malformed_field_is_named(
    factories: types.ModuleType, changes: dict[str, object], problem: str
) -> None:
    with pytest.raises(TargetError) as error:
        build_with(factories, lambda device: minimal_target(**changes))
    assert problem in str(error.value)


def test_a_fault_point_must_name_an_existing_method(factories: types.ModuleType) -> None:
    lock = threading.Lock()
    points = {"warm_up": (lock, "acquire"), "capture": (lock, "release"), "replay": (lock, "nope")}
    with pytest.raises(TargetError, match=r"fault_points\['replay'\]: lock has no method 'nope'"):
        build_with(factories, lambda device: minimal_target(fault_points=points))
    points["replay"] = (lock, "locked")
    build_with(factories, lambda device: minimal_target(fault_points=points, lock=lock))


def test_the_bundled_target_is_valid_on_the_cpu() -> None:
    target = build_target(DEFAULT_TARGET, CPU)
    assert target.device == CPU
    # On the CPU there is no graph cache: the fields about it are left out.
    assert missing_field_reason(target, "lock", "capacity") == (
        "target does not provide lock, capacity (optional CudaGraphTarget field)"
    )
    assert missing_field_reason(target, "unsupported_modes", "run_workers") is None


def run_configured(pytester: pytest.Pytester, *args: str) -> pytest.Config:
    return pytester.parseconfigure(*plugin_arguments(), *args)


def test_the_spec_comes_from_option_then_env_then_ini_then_default(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, factories: types.ModuleType
) -> None:
    monkeypatch.delenv("PYTEST_CUDAGRAPH_TARGET", raising=False)
    assert target_spec(run_configured(pytester)) == DEFAULT_TARGET
    pytester.makeini("[pytest]\ncudagraph_target = fake_targets:namespace.make\n")
    assert target_spec(run_configured(pytester)) == "fake_targets:namespace.make"
    monkeypatch.setenv("PYTEST_CUDAGRAPH_TARGET", "fake_targets:NOT_CALLABLE")
    with pytest.raises(TargetError, match="NOT_CALLABLE is a int"):
        run_configured(pytester)
    option = ("--cudagraph-target", "reasyn_ref.conformance:make_target")
    assert target_spec(run_configured(pytester, *option)) == "reasyn_ref.conformance:make_target"
