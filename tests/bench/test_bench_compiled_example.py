"""The conformance suite on a compiled example against that example's own compile and capture.

``decode_token_target`` is gpt-fast's decode step under torch.compile "reduce-overhead": its own
code pays inductor and cudagraph trees before its graph first replays. ``vs_compile_and_capture``
is the suite's time as pytest counts it over the seconds that code takes to build the target,
compile and capture until a graph replays (compile_and_capture.py), each in a fresh process with
an empty inductor cache of its own, so that neither reuses the other's kernels. The GPU
benchmark needs CUDA; what it rests on (the two clocks start alike, the script replays) is
checked on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_workloads import run_suite

from pytest_cudagraph.skips import needs_cuda

COMPILED_EXAMPLE = "pytest_cudagraph.examples.decode_token_target:make_target"
SCRIPT = Path(__file__).with_name("compile_and_capture.py")


def fresh_compile_caches(folder: Path) -> dict[str, str]:
    """Inductor's and Triton's caches in ``folder``, empty: a process compiles from scratch."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
        "TRITON_CACHE_DIR": str(folder / "triton"),
    }


def compile_and_capture(target: str, *options: str, env: dict[str, str] | None = None) -> dict:
    """compile_and_capture.py's report on ``target``, run in a fresh process."""
    finished = subprocess.run(
        [sys.executable, str(SCRIPT), target, *options],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode == 0, f"{SCRIPT.name} failed:\n{finished.stderr[-3000:]}"
    return json.loads(finished.stdout.splitlines()[-1])


@needs_cuda
@pytest.mark.slow  # compiles, in both processes
def test_compiled_example_suite(benchmark, tmp_path):
    suite_caches = fresh_compile_caches(tmp_path / "suite")
    run = benchmark.pedantic(
        run_suite, args=(COMPILED_EXAMPLE, tmp_path / "suite.xml"), kwargs={"env": suite_caches}
    )
    own = compile_and_capture(COMPILED_EXAMPLE, env=fresh_compile_caches(tmp_path / "own"))
    benchmark.extra_info.update(
        bench="compiled_example",
        target=COMPILED_EXAMPLE,
        suite_s=run.suite_s,
        compile_and_capture_s=own["seconds"],
        vs_compile_and_capture=run.suite_s / own["seconds"],
        own_calls=own["calls"],
        passed=run.passed,
        skipped=run.skipped,
        failed=run.failed,
    )  # recorded before the verdict, so the report shows a failed suite too
    assert own["replays"] >= 1
    assert run.returncode == 0, f"the suite failed on the example:\n{run.output[-3000:]}"


# A plugin that writes, at the session's start (where pytest's count of the suite's time
# begins), which of the modules the baseline script imports before its clock are imported, and
# whether the factory was called; then ends the process.
PROBE = """
import json, os, sys

def pytest_sessionstart(session):
    found = {name: name in sys.modules for name in ("torch", "probe_target")}
    found["factory_called"] = bool(getattr(sys.modules.get("probe_target"), "CALLS", ()))
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump(found, out)
    os._exit(0)
"""
# The graphed-layer example behind a factory that notes its calls (no compile: seconds, not
# minutes, and the loading it probes is every target's).
PROBE_TARGET = """
from pytest_cudagraph.examples.graphed_layer_target import make_target as made

CALLS = []

def make_target(device):
    CALLS.append(device)
    return made(device)
"""


@pytest.mark.slow  # a pytest process
def test_the_suites_count_starts_where_the_scripts_clock_does(tmp_path):
    """pytest counts the suite's time from its session's start: torch and the target's module
    are imported by then, and the factory is not yet called; the script's clock starts at the
    same point, so that the ratio sets like against like."""
    (tmp_path / "probe_plugin.py").write_text(PROBE)
    (tmp_path / "probe_target.py").write_text(PROBE_TARGET)
    out = tmp_path / "probe.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]))
    env.update(PROBE_OUT=str(out), CUDA_VISIBLE_DEVICES="")
    command = [
        sys.executable, "-m", "pytest", "-p", "probe_plugin", "--pyargs",
        "pytest_cudagraph.conformance", "--cudagraph-target", "probe_target:make_target",
        "-p", "no:cacheprovider", "-q",
    ]  # fmt: skip
    finished = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.exists(), finished.stdout[-3000:] + finished.stderr[-3000:]
    assert json.loads(out.read_text()) == {
        "torch": True,
        "probe_target": True,
        "factory_called": False,
    }


@pytest.mark.slow  # compiles on the CPU
def test_the_script_compiles_and_replays_the_example_emulated(tmp_path):
    """The baseline's script on the CPU, the example's graphs emulated: it builds the target,
    captures its graph and stops at the first replay."""
    own = compile_and_capture(COMPILED_EXAMPLE, "--emulate", env={"CUDA_VISIBLE_DEVICES": ""})
    assert own["captures"] == 1 and own["replays"] == 1
