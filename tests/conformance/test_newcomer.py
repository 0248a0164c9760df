"""A newcomer's stateful decoder, first try: each mistake such a decoder's target makes, as a
file of its own, and the first message the suite must give for it on a laptop; the shipped
stateful example (``pytest_cudagraph.examples.stateful_decoder_target``) right, and its size."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import pytest_cudagraph
from pytest_cudagraph.conformance import CudaGraphTarget
from pytest_cudagraph.conformance._loading import UserCodeError, explained
from pytest_cudagraph.conformance.checks import test_00_target
from pytest_cudagraph.examples import stateful_decoder_target

CPU = torch.device("cpu")
Failed = pytest.fail.Exception


def failure_of(check: Callable[..., None], target: CudaGraphTarget, fresh: object) -> str:
    """What ``check`` (the dry run or the contract) says when it fails ``target`` on the CPU."""
    given: dict[str, object] = dict(
        target=target,
        conclude=lambda judgement, headline, also="": _verdict(judgement, headline),
        progress=lambda where: None,
        explain=explained,
    )
    if check is test_00_target.test_dry_run:
        given |= dict(record_account=lambda *account: None, target_factory=fresh)
    with pytest.raises(Failed) as failure:
        check(**given)
    return str(failure.value)


def first_message(check: Callable[..., None], target: CudaGraphTarget, fresh: object) -> str:
    """The first problem ``check`` names (the line after its headline)."""
    return failure_of(check, target, fresh).splitlines()[1]


def _verdict(judgement: object, headline: str) -> None:
    failure = judgement.failure(headline)  # type: ignore[attr-defined]
    if failure is not None:
        pytest.fail(failure, pytrace=False)


def mistake(tmp_path: Path, name: str, source: str) -> Callable[[torch.device], CudaGraphTarget]:
    """The factory ``make_target`` of a file of the newcomer's holding ``source``."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.make_target  # type: ignore[no-any-return]


EXAMPLE = "from pytest_cudagraph.examples.stateful_decoder_target import make_target as example\n"


def test_the_shipped_stateful_example_passes_the_dry_run_with_every_callable_of_its_run() -> None:
    target = stateful_decoder_target.make_target(CPU)
    figures: list[str] = []
    test_00_target.test_dry_run(
        target=target,
        conclude=lambda judgement, headline, also="": figures.append(judgement.figure),
        progress=lambda where: None,
        record_account=lambda *account: figures.append(repr(account)),
        target_factory=functools.partial(stateful_decoder_target.make_target, CPU),
        explain=explained,
    )
    assert figures[1].endswith("5 of your callables ran")
    assert "State.sides" in figures[0] and "State.reset" in figures[0]


def test_the_shipped_stateful_target_fits_in_30_lines() -> None:
    source = Path(stateful_decoder_target.__file__).read_text()
    lines = [line for line in source.splitlines() if line.strip()]
    assert len(lines) <= 30, len(lines)


def dry_run_without(tmp_path: Path, field: str) -> str:
    """The dry run's first message on the shipped example with ``field`` left out."""
    source = EXAMPLE + (
        "import dataclasses\n\n"
        "def make_target(device):\n"
        f"    return dataclasses.replace(example(device), {field}=None)\n"
    )
    factory = mistake(tmp_path, f"forgot_{field}", source)
    return first_message(test_00_target.test_dry_run, factory(CPU), functools.partial(factory, CPU))


def test_forgetting_state_is_named_as_state_and_shows_the_state_to_give(tmp_path: Path) -> None:
    message = dry_run_without(tmp_path, "state")
    assert message.startswith(
        "case 0: eager on case 0: key 1, repeat 0; inputs tokens int64[1, 1] is not reproducible "
        "under one seed, and a fresh target's first call gives the first answer again: the eager "
        "side carries state from call to call. Declare it: State(reset=...)"
    )
    assert "State(sides=lambda: (eager_model, graphed_model))" in message
    assert "generator" not in message  # its generators are given: not this cause


def test_a_decoder_held_generator_not_given_is_named_with_how_to_seed_it(tmp_path: Path) -> None:
    message = dry_run_without(tmp_path, "generators")
    assert (
        "is not reproducible under one seed: it draws from a torch.Generator of its own" in message
    )
    assert "eager.samplers[0].generator" in message
    assert "give CudaGraphTarget(generators=lambda: [...])" in message
    assert "output['token']" in message  # the tensor that differs


def test_randomness_the_suite_cannot_seed_is_named_as_such() -> None:
    noise = torch.Generator().manual_seed(7)
    shared = {"calls": 0}

    def eager(inputs: dict[str, torch.Tensor]) -> torch.Tensor:  # a generator out of sight
        shared["calls"] += 1
        return inputs["x"] + torch.rand(1, generator=noise)

    def factory() -> CudaGraphTarget:
        return CudaGraphTarget(
            device=CPU,
            eager=lambda inputs: eager(inputs),
            graphed=None,
            keys=[2],
            draw=lambda g, case: {"x": torch.randn(case.key, generator=g)},
            key_of=lambda inputs: inputs["x"].shape[0],
        )

    message = first_message(test_00_target.test_dry_run, factory(), factory)
    assert "draws from a torch.Generator of its own" in message  # found through the closure
    hidden = dataclasses.replace(
        factory(),
        eager=lambda inputs: inputs["x"] + random.random(),  # Python's own generator
    )
    message = first_message(test_00_target.test_dry_run, hidden, lambda: hidden)
    assert (
        "even from a fresh target: output draws random numbers the suite does not seed" in message
    )


@pytest.mark.parametrize(
    ("field", "given"),
    [
        ("Sampling.sample", "sampling=Sampling(lambda seed, graphs: undefined_name)"),
        ("State.reset", "state=State(reset=lambda: {}['typo'])"),
        ("State.sides", "state=State(sides=lambda: undefined_sides)"),
        ("Cache.cached_keys", "cache=Cache(cached_keys=lambda: cache_keys())"),
        ("Cache.reset", "cache=Cache(reset=lambda: 1 / 0)"),
    ],
)
def test_every_callable_a_capability_gives_runs_in_the_dry_run_and_is_named(
    tmp_path: Path, field: str, given: str
) -> None:
    source = (
        "import torch\n"
        "from pytest_cudagraph.conformance import Cache, Sampling, State, hand_written\n\n"
        "def make_target(device):\n"
        "    return hand_written(device=device, eager=lambda i: i['x'] * 2, graphed=None,\n"
        "        keys=[2], draw=lambda g, case: {'x': torch.randn(case.key, generator=g)},\n"
        f"        key_of=lambda i: i['x'].shape[0], {given})\n"
    )
    factory = mistake(tmp_path, f"broken_{field.replace('.', '_').lower()}", source)
    target = factory(CPU)
    with pytest.raises(UserCodeError) as failure:
        test_00_target.test_dry_run(
            target=target,
            conclude=lambda judgement, headline, also="": _verdict(judgement, headline),
            progress=lambda where: None,
            record_account=lambda *account: None,
            target_factory=None,
            explain=explained,
        )
    shown = explained(failure.value)
    assert shown.startswith(f"{field}() raised ")
    assert f'File "{tmp_path / target_file(field)}", line 7' in shown  # the user's line


def target_file(field: str) -> str:
    return f"broken_{field.replace('.', '_').lower()}.py"


def test_a_callable_that_needs_cuda_is_listed_as_not_run_without_cuda(tmp_path: Path) -> None:
    source = (
        "import torch\n"
        "from pytest_cudagraph.conformance import CaptureClean, hand_written\n\n"
        "def make_target(device):\n"
        "    return hand_written(device=device, eager=lambda i: i['x'] * 2, graphed=None,\n"
        "        keys=[2], draw=lambda g, case: {'x': torch.randn(case.key, generator=g)},\n"
        "        key_of=lambda i: i['x'].shape[0],\n"
        "        capture_clean=CaptureClean(lambda: torch.cuda.synchronize()))\n"
    )
    target = mistake(tmp_path, "needs_cuda_forward", source)(CPU)
    accounts: list[tuple[object, ...]] = []
    test_00_target.test_dry_run(
        target=target,
        conclude=lambda judgement, headline, also="": _verdict(judgement, headline),
        progress=lambda where: None,
        record_account=lambda *account: accounts.append(account),
        target_factory=None,
        explain=explained,
    )
    [(ran, _, could_not)] = accounts
    assert could_not == ["CaptureClean.forward"]
    assert "CaptureClean.forward" not in ran  # type: ignore[operator]


def test_a_key_of_that_does_not_give_the_cases_keys_fails_naming_both(tmp_path: Path) -> None:
    source = (
        "import torch\n"
        "from pytest_cudagraph.conformance import hand_written\n\n"
        "def make_target(device):\n"
        "    return hand_written(device=device, eager=lambda i: i['x'] * 2, graphed=None,\n"
        "        keys=[1, 2, 4, 8], draw=lambda g, case: {'x': torch.randn(case.key, 4, generator=g)},\n"
        "        key_of=lambda i: (i['x'].shape[0], 1))\n"
    )
    target = mistake(tmp_path, "key_of_its_own_way", source)(CPU)
    message = first_message(test_00_target.test_target_contract, target, None)
    assert message == (
        "key_of gives (1, 1) for a draw of the key 1 (case 0: key 1, repeat 0): key_of must give "
        "each draw the key it was drawn for (the checks label every call with key_of and judge "
        "it against the target's keys)"
    )


def test_a_graphed_side_that_touches_cuda_on_the_cpu_gets_the_hint(tmp_path: Path) -> None:
    source = (
        "import torch\n"
        "from pytest_cudagraph.conformance import hand_written\n\n"
        "def make_target(device):\n"
        "    return hand_written(device=device, eager=lambda i: i['x'] * 2,\n"
        "        graphed=lambda i: torch.cuda.CUDAGraph(),\n"
        "        keys=[2], draw=lambda g, case: {'x': torch.randn(case.key, generator=g)},\n"
        "        key_of=lambda i: i['x'].shape[0])\n"
    )
    target = mistake(tmp_path, "graphs_on_the_cpu", source)(CPU)
    message = failure_of(test_00_target.test_dry_run, target, None)
    assert message.splitlines()[1].startswith(
        "case 0: graphed on case 0: key 2, repeat 0; inputs x float32[2] raised RuntimeError"
    )
    assert message.splitlines()[-1] == (
        "The factory is called with the CPU (cpu) when CUDA is missing: build the graphs only "
        "where pytest_cudagraph.conformance.graphs_on(device) holds (CUDA, or graphs emulated) "
        "and give graphed=None otherwise (docs/own-graphs.md)"
    )


SUITE = ("--pyargs", "pytest_cudagraph.conformance", "--cudagraph-target", "reasyn")


def test_check_ids_leave_out_a_virtual_environment_inside_the_project(tmp_path: Path) -> None:
    """The README's layout: the plugin installed into ``.venv`` inside the project. The checks'
    ids start at the package, so that progress lines do not wrap."""
    site = tmp_path / ".venv" / "lib" / "python3" / "site-packages"
    shutil.copytree(Path(pytest_cudagraph.__file__).parent, site / "pytest_cudagraph")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", *SUITE],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site), "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        check=False,
    )
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert ids, run.stdout + run.stderr
    assert ids[0] == "pytest_cudagraph/conformance/checks/test_00_target.py::test_target_contract"
    assert not any("site-packages" in line for line in ids)


@pytest.mark.parametrize("field", ["state", "generators"])
def test_the_docs_quote_what_the_dry_run_says_of_a_field_left_out(
    tmp_path: Path, field: str
) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "own-graphs.md").read_text()
    quoted = [
        line.removeprefix("    ... ")
        for line in docs.splitlines()
        if line.startswith("    ... is not reproducible")
    ]
    said = dry_run_without(tmp_path, field).splitlines()[0]
    assert any(quote in said for quote in quoted), said
