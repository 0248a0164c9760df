"""The committed baselines sit where the plugin's per-stack paths look for them (CPU, runs in CI)."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

import pytest

from pytest_cudagraph.bench import STACK_PLACEHOLDER, stack_id_of

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / "benchmarks" / "baseline"
BASELINE_PATH = f"benchmarks/baseline/{STACK_PLACEHOLDER}/baseline.json"


@pytest.mark.parametrize("folder", sorted(BASELINES.iterdir()), ids=lambda folder: folder.name)
def test_each_baseline_is_filed_under_the_stack_it_was_recorded_on(folder: Path) -> None:
    info = json.loads((folder / "baseline.json").read_text())["machine_info"]
    # gpus reads "NAME (MEMORY MiB)", one entry per visible GPU; the id names the first.
    gpu = info["gpus"][0].rsplit(" (", 1)[0] if info["gpus"] else None
    recorded_on = stack_id_of(info["python_version"], info["torch"], info["torch_cuda"], gpu)
    assert folder.name == recorded_on
    assert info.get("cudagraph_stack_id", recorded_on) == recorded_on


def test_tox_bench_compares_with_this_stack_baseline() -> None:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    # tox reads \{ \} as literal braces.
    command = " ".join(
        tox["testenv:bench"]["commands"].replace("\\{", "{").replace("\\}", "}").split()
    )
    assert f"--benchmark-compare={BASELINE_PATH}" in command
    assert "--benchmark-compare-fail=median:" in command
