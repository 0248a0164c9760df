"""Mutation testing of the plugin's core: deliberate bugs, one at a time, against the CPU tests
that must catch each.

    python scripts/mutants.py [--jobs N] [--only NAME ...] [--list]

Each mutant replaces one snippet of one file (it must occur there exactly once) in a scratch
copy of the tree and runs the mutant's own tests there; a failing run kills it. The selected
tests first run once on the unchanged copy: a mutant is only killed by tests that pass without
it. Exit 1 when a mutant survives, a snippet no longer matches its file, or the tests fail
unchanged; the summary gives the score (tests/README.md keeps the last one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

ROOT = Path(__file__).resolve().parents[1]
# What a scratch copy leaves out: version control, environments and caches, and the reports.
NOT_COPIED = {".git", ".venv", ".tox", "__pycache__", "reports", ".benchmarks"}
TIMEOUT_S = 300  # a mutant that hangs its tests this long counts as killed


@dataclass(frozen=True)
class Mutant:
    """A bug: ``old`` replaced by ``new`` in ``path`` (relative to the tree), caught by
    ``tests`` (pytest arguments, relative to the tree)."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]

    def apply(self, source: str) -> str:
        """``source`` with the bug; ValueError when ``old`` is not in it exactly once."""
        count = source.count(self.old)
        if count != 1:
            raise ValueError(f"{self.name}: its snippet occurs {count} times in {self.path}")
        return source.replace(self.old, self.new)


SETTINGS_TESTS = ("tests/plugin/test_settings.py", "tests/plugin/test_markers.py")
STACK_TESTS = ("tests/plugin/test_pinned_stack.py",)
FAULT_TESTS = ("tests/engines/test_faults.py", "tests/plugin/test_fault_injector.py")
STORAGE_TESTS = ("tests/engines/test_storage.py", "tests/engines/test_parity.py")
COMPARE_TESTS = ("tests/engines/test_compare.py", "tests/engines/test_parity.py")
PARITY_TESTS = (
    "tests/engines/test_parity.py",
    "tests/plugin/test_cuda_graph_parity.py",
    "tests/plugin/test_cuda_graph_parity_storage.py",
)
MEMORY_TESTS = (
    "tests/engines/test_memory.py",
    "tests/engines/test_memory_gc.py",
    "tests/plugin/test_graph_memory_bound.py",
    "tests/plugin/test_graph_memory_bound_retake.py",
    "tests/plugin/test_graph_memory_bound_warning.py",
)
CAPTURE_TESTS = ("tests/engines/test_captures.py",)
DEVICE_TESTS = ("tests/engines/test_devices.py", "tests/plugin/test_xdist.py")
BENCH_TESTS = ("tests/plugin/test_bench.py",)


def _mutants(path: str, tests: tuple[str, ...], *bugs: tuple[str, str, str]) -> list[Mutant]:
    return [Mutant(name, path, old, new, tests) for name, old, new in bugs]


MUTANTS: tuple[Mutant, ...] = (
    *_mutants(
        "pytest_cudagraph/settings.py",
        SETTINGS_TESTS,
        (
            "environment before the command line",
            "        (config.getoption(setting.dest, None), setting.option),\n"
            "        (os.environ.get(setting.env) or None, setting.env),\n",
            "        (os.environ.get(setting.env) or None, setting.env),\n"
            "        (config.getoption(setting.dest, None), setting.option),\n",
        ),
        (
            "ini before the environment",
            "        (os.environ.get(setting.env) or None, setting.env),\n"
            '        (_ini_value(config, setting), f"ini {setting.ini}"),\n',
            '        (_ini_value(config, setting), f"ini {setting.ini}"),\n'
            "        (os.environ.get(setting.env) or None, setting.env),\n",
        ),
        (
            "an empty environment variable is a value",
            "(os.environ.get(setting.env) or None, setting.env)",
            "(os.environ.get(setting.env), setting.env)",
        ),
        (
            "an empty ini value is a value",
            'return None if value in (None, "", []) else value',
            "return value",
        ),
        (
            "the largest seed refused",
            "if not 0 <= value <= MAX_SEED:",
            "if not 0 <= value < MAX_SEED:",
        ),
        ("a size of zero accepted", "value > 0):", "value >= 0):"),
        ("KiB read as 1000 bytes", '"KiB": 1 / 1024', '"KiB": 1 / 1000'),
        (
            "the marker's value loses to the session's",
            "return self[setting].value if marker_value is None else marker_value",
            "return self[setting].value if self[setting].value is not None else marker_value",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/stack.py",
        STACK_TESTS,
        (
            "a pre-release misses its release's pin",
            "    return specifiers.contains(version, prereleases=True) or specifiers.contains(\n"
            "        Version(version.base_version)\n"
            "    )",
            "    return specifiers.contains(version, prereleases=True)",
        ),
        (
            "an explicit pre-release pin refused",
            "specifiers.contains(version, prereleases=True)",
            "specifiers.contains(version, prereleases=False)",
        ),
        (
            "torch's pre-release tag dropped",
            "torch=Version(torch.__version__).public",
            "torch=Version(torch.__version__).base_version",
        ),
        (
            "a component pinned twice, the second wins",
            "        if component in pinned:\n",
            "        if component in pinned and not pinned:\n",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/faults.py",
        FAULT_TESTS,
        ("patches undone oldest first", "fault = self.faults.pop()", "fault = self.faults.pop(0)"),
        (
            "every call from the N-th on fails",
            "if fault.calls == on_call:",
            "if fault.calls >= on_call:",
        ),
        (
            "a restored fault still fails",
            "            if not fault.armed:\n                return original(*args, **kwargs)\n",
            "",
        ),
        (
            "a restore overwrites a later patcher's value",
            "    if _own_value(target, name) is not replacement:\n        return\n",
            "",
        ),
        ("a failing restore step is swallowed", "errors.append(error)", "pass"),
        (
            "the lock is tried from this thread",
            "        probe.start()\n        probe.join()\n",
            "        try_acquire()\n",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/storage.py",
        STORAGE_TESTS,
        (
            "adjacent storages reported as shared",
            "mine[1] < theirs[2] and theirs[1] < mine[2]",
            "mine[1] <= theirs[2] and theirs[1] <= mine[2]",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/compare.py",
        COMPARE_TESTS,
        (
            "NaN against NaN differs",
            "            same |= expected.isnan() & actual.isnan()\n",
            "",
        ),
        (
            "a dtype difference not reported",
            "    if expected.dtype != actual.dtype:\n",
            "    if expected.dtype != actual.dtype and False:\n",
        ),
        ("the first index reversed", "index.append(position)", "index.insert(0, position)"),
        (
            "tolerances ignored",
            "if expected.dtype == torch.bool or (rtol == 0 and atol == 0):",
            "if True:",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/parity.py",
        PARITY_TESTS,
        (
            "every case under one seed",
            "case, seed = case_values[index], self.seed + index",
            "case, seed = case_values[index], self.seed",
        ),
        (
            "an earlier case's output not kept",
            '                    earlier.keep(actual, f"case {index} output")\n',
            "",
        ),
        (
            "a check of no cases accepted",
            "        if not case_values:\n",
            "        if case_values is None:\n",
        ),
        (
            "a graphed output that is its input passes",
            '                        *storage_extents(graphed_inputs, "inputs"),\n',
            "",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/memory.py",
        MEMORY_TESTS,
        (
            "growth equal to the bound fails",
            "passed = growth_mib <= bound_mib",
            "passed = growth_mib < bound_mib",
        ),
        (
            "no warning for live tensors over the bound",
            "if passed and allocated_mib > bound_mib:",
            "if passed and allocated_mib > bound_mib * 2:",
        ),
        ("the block's end collects everything", "gc.collect(YOUNG_GENERATIONS)", "gc.collect()"),
        (
            "a young reading over the bound is not retaken",
            "if verdict.passed or self.report.after.full_collection or self.probe is None:",
            "if True:",
        ),
        (
            "outside torch measured against allocated",
            "return self.process_bytes - self.torch_reserved",
            "return self.process_bytes - self.torch_allocated",
        ),
        (
            "first use counted backwards",
            "first_use = before.process_bytes - cold.process_bytes",
            "first_use = cold.process_bytes - before.process_bytes",
        ),
        (
            "a moving NVML reading kept",
            "        if current == previous:\n            return current\n",
            "",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/captures.py",
        CAPTURE_TESTS,
        (
            "a key captured once counts as recaptured",
            "if key is not None and count > 1",
            "if key is not None and count >= 1",
        ),
        (
            "the outer key wins",
            "key = stack[-1] if stack else None",
            "key = stack[0] if stack else None",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/devices.py",
        DEVICE_TESTS,
        (
            "workers past the GPU count not wrapped",
            "return entries[number % len(entries)]",
            "return entries[min(number, len(entries) - 1)]",
        ),
        (
            "an empty entry does not end the list",
            'if not entry or entry.startswith("-"):',
            'if entry.startswith("-"):',
        ),
        (
            "memory of other processes counted",
            "if process.pid == pid and process.usedGpuMemory is not None",
            "if process.usedGpuMemory is not None",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/bench.py",
        BENCH_TESTS,
        (
            "a missing baseline compared anyway",
            "        if not compare_file.is_file():\n",
            "        if not compare_file.parent.exists():\n",
        ),
        (
            "the storage filled for a run that neither saves nor compares",
            "STACK_PLACEHOLDER in storage and (storage_used or compare)",
            "STACK_PLACEHOLDER in storage",
        ),
    ),
)


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    verdict: str  # "killed", "survived" or "error"
    seconds: float
    detail: str = ""


def scratch_copy(root: Path, into: Path) -> Path:
    """The tree under ``root`` (all but NOT_COPIED and egg-info) copied to ``into``."""
    ignore = shutil.ignore_patterns(*NOT_COPIED, "*.egg-info")
    for entry in root.iterdir():
        if entry.name in NOT_COPIED or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, into / entry.name, ignore=ignore)
        else:
            shutil.copy2(entry, into / entry.name)
    return into


def run_tests(tree: Path, tests: Sequence[str]) -> subprocess.CompletedProcess:
    """pytest on ``tests`` in ``tree``, the tree's own code imported (never an installed copy's),
    no bytecode written (a mutated file may keep its size and mtime second)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env = {k: v for k, v in env.items() if not k.startswith("PYTEST_CUDAGRAPH_")}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    return subprocess.run(
        command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def try_mutant(mutant: Mutant, tree: Path) -> Outcome:
    """Apply ``mutant`` in ``tree``, run its tests, put the file back."""
    path = tree / mutant.path
    original = path.read_text()
    start = time.perf_counter()
    try:
        path.write_text(mutant.apply(original))
        done = run_tests(tree, mutant.tests)
    except ValueError as error:
        return Outcome(mutant, "error", 0.0, str(error))
    except subprocess.TimeoutExpired:
        return Outcome(mutant, "killed", time.perf_counter() - start, "timed out")
    finally:
        path.write_text(original)
    seconds = time.perf_counter() - start
    if done.returncode == 0:
        return Outcome(mutant, "survived", seconds)
    if done.returncode in (1, 2, 3):  # tests failed, collection broke, or pytest crashed
        return Outcome(mutant, "killed", seconds)
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return Outcome(mutant, "error", seconds, f"pytest exit {done.returncode}: {' | '.join(tail)}")


def run(mutants: Sequence[Mutant], root: Path = ROOT, jobs: int = 2) -> list[Outcome]:
    """Every mutant tried in one of ``jobs`` scratch copies of ``root``; a mutant whose tests
    fail on the unchanged tree is an error, not a kill."""
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        trees: Queue[Path] = Queue()
        for number in range(max(1, jobs)):
            (Path(scratch) / str(number)).mkdir()
            trees.put(scratch_copy(root, Path(scratch) / str(number)))
        first = trees.get()
        selected = sorted({test for mutant in mutants for test in mutant.tests})
        baseline = run_tests(first, selected)
        trees.put(first)
        if baseline.returncode != 0:
            tail = " | ".join((baseline.stdout + baseline.stderr).strip().splitlines()[-3:])
            detail = f"the tests fail without any mutant: {tail}"
            return [Outcome(mutant, "error", 0.0, detail) for mutant in mutants]

        def one(mutant: Mutant) -> Outcome:
            tree = trees.get()
            try:
                return try_mutant(mutant, tree)
            finally:
                trees.put(tree)

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            return list(pool.map(one, mutants))


def summary(outcomes: Iterable[Outcome]) -> tuple[list[str], bool]:
    """One line per mutant and the score; whether every mutant was killed."""
    outcomes = list(outcomes)
    lines = [
        f"{o.verdict:9} {o.seconds:5.1f}s  {o.mutant.path}: {o.mutant.name}"
        + (f" ({o.detail})" if o.detail else "")
        for o in outcomes
    ]
    killed = sum(o.verdict == "killed" for o in outcomes)
    score = 100.0 * killed / len(outcomes) if outcomes else 0.0
    lines.append(f"{killed} of {len(outcomes)} mutants killed ({score:.1f}%)")
    return lines, killed == len(outcomes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="mutants tried at once (default 2)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="the mutants to try, by name")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    mutants = list(MUTANTS)
    if args.only:
        unknown = set(args.only) - {m.name for m in mutants}
        if unknown:
            parser.error(f"--only: no mutant named {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.name in args.only]
    if args.list:
        for mutant in mutants:
            print(f"{mutant.path}: {mutant.name} -> {' '.join(mutant.tests)}")
        return 0
    lines, all_killed = summary(run(mutants, jobs=args.jobs))
    print("\n".join(lines))
    return 0 if all_killed else 1


if __name__ == "__main__":
    sys.exit(main())
