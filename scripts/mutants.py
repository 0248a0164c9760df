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
    ``tests`` (pytest arguments, relative to the tree). ``equivalent`` says why no behaviour
    can tell the bug from the code, for one kept to show that rule is covered elsewhere: it is
    not run and not scored."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    equivalent: str = ""

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
TREES_TESTS = ("tests/engines/test_trees.py", *COMPARE_TESTS)
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
GRAPH_FAULT_TESTS = ("tests/engines/test_graph_faults.py",)
GRAPH_API_TESTS = ("tests/engines/test_graph_api.py",)
ARGUMENT_TESTS = ("tests/engines/test_arguments.py",)
UNCHANGED_TESTS = ("tests/engines/test_unchanged.py",)
STATE_TESTS = ("tests/engines/test_state.py",)
REACH_TESTS = ("tests/engines/test_reach.py",)
TRAJECTORY_TESTS = ("tests/engines/test_trajectory.py",)
DEVICE_TESTS = ("tests/engines/test_devices.py", "tests/plugin/test_xdist.py")
BENCH_TESTS = ("tests/plugin/test_bench.py",)
RESULTS_TESTS = ("tests/plugin/test_results.py",)
# The table's own tests: its unit tests, then the two runs of the suite that end in its rows.
TABLE_TESTS = (
    *(
        f"tests/conformance/test_suite_on_cpu.py::{test}"
        for test in (
            "test_the_table_aligns_columns_and_shows_the_figure_or_the_reason",
            "test_a_row_keeps_the_figure_and_the_first_failure",
            "test_a_later_pass_never_overwrites_a_failure",
            "test_an_error_at_set_up_is_an_error_row_with_its_reason",
            "test_a_pass_outranks_a_skip",
            "test_record_figure_takes_text_and_finite_numbers",
            "test_record_figure_refuses_an_infinity",
        )
    ),
)
TARGET_TESTS = ("tests/conformance/test_target.py", "tests/conformance/test_target_loading.py")
JUDGE_TESTS = ("tests/scripts/test_bench_report.py",)
PARITY_MARKER_TESTS = ("tests/plugin/test_cuda_graph_parity.py",)
MEMORY_MARKER_TESTS = ("tests/plugin/test_graph_memory_bound.py",)


def _mutants(path: str, tests: tuple[str, ...], *bugs: tuple[str, ...]) -> list[Mutant]:
    """The mutants of one file: each bug is (name, old, new), or (name, old, new, why it is
    equivalent)."""
    return [Mutant(name, path, old, new, tests, *why) for name, old, new, *why in bugs]


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
            "            pass\n",
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
    # The comparison: bools and integers exactly, the tolerance rule, what is walked.
    *_mutants(
        "pytest_cudagraph/engines/compare.py",
        COMPARE_TESTS,
        (
            "a Tolerance built unchecked",
            '            non_negative_number(f"Tolerance.{name}", getattr(self, name))\n',
            "            pass\n",
        ),
        (
            "a bool mismatch reports the tolerance it ignored",
            "    if expected.dtype == torch.bool:\n        rtol = atol = 0.0\n    close = _close(",
            "    close = _close(",
        ),
        (
            "integer tensors compared in float64",
            "    return _integers_close(expected, actual, rtol, atol)\n",
            "    return torch.isclose(_widen(actual), _widen(expected), rtol=rtol, atol=atol)\n",
        ),
        (
            "integer tensors ignore the tolerance",
            "    return _integers_close(expected, actual, rtol, atol)\n",
            "    return expected == actual\n",
        ),
        (
            "the integer bound rounded up",
            ".floor().to(torch.int64)",
            ".ceil().to(torch.int64)",
        ),
        (
            "an integer gap past int64 counts as within",
            "return (gap >= 0) & (unbounded | (gap <= allowed))",
            "return unbounded | (gap <= allowed)",
        ),
        (
            "uint64 values compared unshifted",
            "        return as_int64 ^ torch.iinfo(torch.int64).min\n",
            "        return as_int64\n",
        ),
        (
            "the integer bound taken relative to the graphed side",
            "bound = expected.to(torch.float64).abs() * rtol + atol",
            "bound = actual.to(torch.float64).abs() * rtol + atol",
        ),
        (
            "the float tolerance taken relative to the graphed side",
            "torch.isclose(_widen(actual), _widen(expected), rtol=rtol, atol=atol, equal_nan=True)",
            "torch.isclose(_widen(expected), _widen(actual), rtol=rtol, atol=atol, equal_nan=True)",
        ),
        (
            "NaN against NaN differs within a tolerance",
            "rtol=rtol, atol=atol, equal_nan=True)",
            "rtol=rtol, atol=atol, equal_nan=False)",
        ),
        (
            "complex NaN against NaN differs within a tolerance",
            "        return close | (expected.isnan() & actual.isnan())\n",
            "        return close\n",
        ),
        (
            "agreeing elements count in the largest difference",
            "gaps.masked_fill_(close, 0).max()",
            "gaps.max()",
        ),
        (
            "integer leaves judged in floats",
            "return gap <= Fraction(atol) + Fraction(rtol) * abs(expected)",
            "return gap <= atol + rtol * abs(expected)",
        ),
        (
            "an infinite leaf within the tolerance of a finite one",
            "    if not math.isfinite(gap):  # an infinity matches only itself; NaN only NaN\n"
            "        return False\n",
            "",
        ),
        (
            "a leaf gap equal to the bound differs",
            "return gap <= atol + rtol * abs(expected)  # type: ignore[arg-type]",
            "return gap < atol + rtol * abs(expected)  # type: ignore[arg-type]",
        ),
        (
            "two dataclass types with the same fields compared as one",
            "        or (mine.kind == trees.ATTRIBUTES and type(expected) is not type(actual))\n",
            "",
        ),
        (
            "keys on one side only not reported",
            "            found.append(Mismatch(path, detail, sides=sides))\n        pairs",
            "        pairs",
        ),
    ),
    # The parity engine: copies per side, shared inputs refused, nothing compared, the budget.
    *_mutants(
        "pytest_cudagraph/engines/parity.py",
        PARITY_TESTS,
        (
            "the eager output compared as it is later",
            'expected = trees.snapshot(returned, "eager output")',
            "expected = returned",
        ),
        (
            "inputs shared by both sides accepted",
            "                    _refuse_shared_inputs(eager_inputs, graphed_inputs, index)\n",
            "",
        ),
        (
            "a check that compared no element passes",
            "        if elements == 0:\n",
            "        if elements < 0:\n",
        ),
        (
            "the output budget ignored",
            "earlier = EarlierOutputs(self.output_budget_bytes)",
            "earlier = EarlierOutputs(DEFAULT_OUTPUT_BUDGET)",
        ),
        (
            "a negative output budget accepted",
            '        _check_count("output_budget_bytes", output_budget_bytes)\n',
            "",
        ),
        (
            "a rerun of the case past the last accepted",
            "if self.only_case >= count:",
            "if self.only_case > count:",
        ),
        (
            "the largest count of cases refused",
            "if cases > MAX_CASES:",
            "if cases >= MAX_CASES:",
        ),
        (
            "a last case seeded at the largest seed refused",
            "if self.seed + len(case_values) - 1 > MAX_SEED:",
            "if self.seed + len(case_values) > MAX_SEED:",
        ),
        (
            "a toggle name matched at its start only",
            "_TOGGLE_NAME.fullmatch(toggle)",
            "_TOGGLE_NAME.match(toggle)",
        ),
        (
            "a toggled run that recorded only empty values passes",
            "        elif trees.element_count(off) == 0:\n",
            "        elif trees.element_count(off) < 0:\n",
        ),
        (
            "a value recorded twice in both toggled runs counts as shared",
            "shared = sorted(within(on) - within(off))",
            "shared = sorted(within(on))",
        ),
        (
            "the toggle variable left set after the runs",
            "        if previous is None:\n            del os.environ[name]\n",
            "        if previous is None:\n            pass\n",
        ),
        (
            "a graphed output that is the eager output passes",
            '                        *storage_extents(returned, "eager output"),\n',
            "",
        ),
        (
            "a failing case reports the check's seed",
            "seed = self.seed + (index or 0)",
            "seed = self.seed",
        ),
        (
            "one differing case among matching ones passes",
            "return not self.failures",
            "return len(self.failures) < len(self.outcomes)",
        ),
    ),
    # The one walker: dataclasses and namespaces, and copies that later writes cannot reach.
    *_mutants(
        "pytest_cudagraph/engines/trees.py",
        TREES_TESTS,
        (
            "dataclasses are leaves",
            "    if dataclasses.is_dataclass(value) and not isinstance(value, type):\n",
            "    if False:\n",
        ),
        (
            "namespaces are leaves",
            "    if isinstance(value, types.SimpleNamespace):\n        return Node(",
            "    if False:\n        return Node(",
        ),
        (
            "a dataclass copy shares its tensors",
            "        object.__setattr__(rebuilt, name, item)\n",
            "        pass\n",
        ),
        (
            "a namespace copy shares its tensors",
            "        return types.SimpleNamespace(**items)\n",
            "        return copy.copy(value)\n",
        ),
        (
            "a named tuple copied as a plain tuple",
            "    if _is_named_tuple(value):\n        return type(value)(*items.values())\n",
            "",
        ),
        (
            "a list copied as a tuple",
            "return tuple(items.values()) if isinstance(value, tuple) else list(items.values())",
            "return tuple(items.values())",
        ),
        ("None counted as a compared value", "return int(value is not None)", "return 1"),
        (
            "a sparse tensor compared",
            "        if value.layout != torch.strided:\n",
            "        if False:\n",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/storage.py",
        STORAGE_TESTS,
        (
            "storages on two devices reported as shared",
            "return mine[0] == theirs[0] and mine[1]",
            "return mine[1]",
        ),
        (
            "a view's extent is its own elements, not its storage",
            "return str(tensor.device), storage.data_ptr(), storage.data_ptr() + storage.nbytes()",
            "return str(tensor.device), tensor.data_ptr(), tensor.data_ptr() + tensor.nbytes",
        ),
        (
            "outputs that fill the budget exactly let go",
            "while self.held_bytes > self.budget_bytes:",
            "while self.held_bytes >= self.budget_bytes:",
        ),
        (
            "outputs past the budget still held",
            "                entry.held = None\n",
            "                pass\n",
        ),
        (
            "views of one storage counted once each",
            "sizes[extent] = storage.nbytes()",
            "sizes[path] = storage.nbytes()",
        ),
        (
            "a freed earlier output still counts as shared",
            "if _overlap(mine, entry.extent) and entry.alive()",
            "if _overlap(mine, entry.extent)",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/captures.py",
        CAPTURE_TESTS,
        (
            "one key stack for every thread",
            "self._keys = threading.local()",
            'self._keys = type("Keys", (), {})()',
        ),
        (
            "replays of graphs captured before the scope not counted",
            "            self._all_replays += 1\n"
            "            index = self._latest.get(id(graph))\n"
            "            if index is not None:\n",
            "            index = self._latest.get(id(graph))\n"
            "            if index is not None:\n"
            "                self._all_replays += 1\n",
        ),
        (
            "an unhashable capture key accepted",
            "        hash(key)  # a TypeError",
            "        key  # a TypeError",
        ),
        (
            "a capture never replayed counts as served",
            "for capture in self.captures if capture.replays))",
            "for capture in self.captures))",
        ),
        (
            "a replay credited to the capture before",
            "self._latest[id(graph)] = len(self._captures)",
            "self._latest[id(graph)] = len(self._captures) - 1",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/graph_faults.py",
        GRAPH_FAULT_TESTS,
        (
            "a failed capture_end leaves a graph to replay",
            "graph.reset()  # what a failed capture leaves",
            "pass  # what a failed capture leaves",
        ),
        (
            "every call of the stage fails",
            "first, fault.fired = not fault.fired, True",
            "first, fault.fired = True, True",
        ),
        (
            "capture_end fails before the capture ends",
            '            if fault.stage == "capture_end":\n',
            '            if fault.stage == "replay":\n',
        ),
        ("reset accepted as a stage", "if stage not in STAGES:", "if stage not in _METHODS:"),
    ),
    # The one patching of torch's graph class, and the one number check.
    *_mutants(
        "pytest_cudagraph/engines/graph_api.py",
        GRAPH_API_TESTS,
        (
            "a block's end undoes a later patch",
            "if vars(graph_class).get(name) is wrapper:",
            "if True:",
        ),
        (
            "an inherited method copied onto the class",
            "                delattr(graph_class, name)\n",
            "                setattr(graph_class, name, original)\n",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/arguments.py",
        ARGUMENT_TESTS,
        ("an infinite tolerance accepted", "if not (finite and value >= 0):", "if not value >= 0:"),
        (
            "a bool tolerance accepted",
            "if isinstance(value, bool) or not isinstance(value, (int, float)):",
            "if not isinstance(value, (int, float)):",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/unchanged.py",
        UNCHANGED_TESTS,
        (
            "a change reported at every look",
            "looked = [held for held in self._held if not held.changed]",
            "looked = list(self._held)",
        ),
        (
            "a held value compared with itself",
            "_Held(name, value, trees.snapshot(value, name))",
            "_Held(name, value, value)",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/state.py",
        STATE_TESTS,
        (
            "number attributes left out of the state",
            "            elif isinstance(value, NUMBERS):\n",
            "            elif False:\n",
        ),
        (
            "tensor attributes left out of the state",
            "            if isinstance(value, torch.Tensor):\n                yield",
            "            if False:\n                yield",
        ),
        (
            "load_state rebinds a buffer instead of copying into it",
            "getattr(slot.owner, slot.name).copy_(state[path])",
            "getattr(slot.owner, slot.name).data = state[path].clone()",
        ),
        (
            "every number set, even to its own value",
            "            elif getattr(slot.owner, slot.name) != state[path]:\n",
            "            else:\n",
        ),
        ("a tensor of another shape written", "            or value.shape != there.shape\n", ""),
        ("a tensor of another dtype written", "            or value.dtype != there.dtype\n", ""),
        (
            "paths that are not the modules' accepted",
            "if slots.keys() != state.keys():",
            "if not slots.keys() <= state.keys():",
        ),
        (
            "states compared without the tolerance",
            "dict(expected), dict(actual), atol=atol, rtol=rtol,",
            "dict(expected), dict(actual),",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/reach.py",
        REACH_TESTS,
        ("closures not walked", "cells = value.__closure__ or ()", "cells = ()"),
        (
            "a bound method's object not walked",
            "yield path, value.__self__  # a bound method's",
            "return  # a bound method's",
        ),
        (
            "a partial's arguments not walked",
            '        yield from ((f"{path}.args[{index}]", item) for index, item in '
            "enumerate(value.args))\n",
            "",
        ),
        (
            "slots not walked",
            "        names += [slots] if isinstance(slots, str) else list(slots)\n",
            "        pass\n",
        ),
        (
            "tensors on another device kept",
            "if self.device is None or value.device == self.device:",
            "if True:",
        ),
        ("the depth bound one short", "depth > MAX_DEPTH", "depth >= MAX_DEPTH"),
        (
            "a user's module attributes not walked",
            "if not _foreign(type(value).__module__):  # a user's module",
            "if False:  # a user's module",
        ),
        (
            "a path missing from the second look counts as rebound",
            "if path in after and after[path] != address",
            "if after.get(path) != address",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/trajectory.py",
        TRAJECTORY_TESTS,
        (
            "teacher forcing follows the graphed side's output",
            "            graphed_inputs = copy(following)\n",
            "            graphed_inputs = next_inputs(graphed_inputs, actual)\n",
        ),
        (
            "teacher forcing hands the graphed side eager's own inputs",
            "            graphed_inputs = copy(following)\n",
            "            graphed_inputs = following\n",
        ),
        (
            "a free-running graphed side fed eager's output",
            "graphed_inputs = next_inputs(graphed_inputs, actual)",
            "graphed_inputs = next_inputs(graphed_inputs, expected)",
        ),
        ("zero steps accepted", "if steps < 1:", "if steps < 0:"),
        ("the last step not run", "for step in range(steps):", "for step in range(steps - 1):"),
        (
            "a divergence names the graphed side's inputs",
            "return Divergence(step, eager_inputs, tuple(found))",
            "return Divergence(step, graphed_inputs, tuple(found))",
        ),
    ),
    # The results: the envelope, each run's outcome, skips, how the session ended, the file.
    *_mutants(
        "pytest_cudagraph/results.py",
        RESULTS_TESTS,
        (
            "a user's value with our key and more read as ours",
            "and value.keys() == {ENVELOPE}",
            "and ENVELOPE in value",
        ),
        (
            "a phase record written by hand read as ours",
            "        and name != RECORD_PREFIX + PHASE  # never recorded by hand",
            "        # never recorded by hand",
        ),
        (
            "the skip total counts reasons",
            '"total": sum(reasons.values()),',
            '"total": len(reasons),',
        ),
        (
            "a user's own skips counted",
            'if phase["outcome"] == "skipped" and phase["uses_plugin"]',
            'if phase["outcome"] == "skipped"',
        ),
        (
            "a session stopped early counts as complete",
            "complete = exit_status in FINISHED and stopped is None",
            "complete = exit_status in FINISHED",
        ),
        (
            "an interrupted or crashed session counts as complete",
            "complete = exit_status in FINISHED and stopped is None",
            "complete = stopped is None",
        ),
        (
            "a failed write leaves its temporary file",
            "        Path(temporary).unlink(missing_ok=True)\n",
            "        pass\n",
        ),
        (
            "a later phase overwrites a failure",
            '        if self.outcome in ("failed", "error"):\n            return\n',
            "",
        ),
        (
            "a passing set-up or teardown decides the run",
            '        if phase["outcome"] == "passed" and phase["when"] != "call":\n            return\n',
            "",
        ),
        (
            "a test run twice is one entry",
            'if run is None or phase["when"] in ("setup", "collect"):',
            "if run is None:",
        ),
        (
            "a failure outside the call counted as failed, not error",
            '    if report.failed and report.when != "call":\n        return "error"\n',
            "",
        ),
        (
            "an infinity written as a bare number",
            "return value if math.isfinite(value) else str(value)",
            "return value",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/suite.py",
        TABLE_TESTS,
        (
            "a later pass overwrites a FAILED row",
            "        if self.verdict in FAILED:\n            return\n",
            "",
        ),
        (
            "an error at set-up shown as FAILED",
            'self.verdict = "FAILED" if report.when == "call" else "ERROR"',
            'self.verdict = "FAILED"',
        ),
        (
            "a skip overwrites a pass",
            'elif report.skipped and self.verdict != "passed":',
            "elif report.skipped:",
        ),
        (
            "an infinite figure recorded",
            "        if not math.isfinite(value):\n",
            "        if math.isnan(value):\n",
        ),
        (
            "ERROR rows left out of the failed tally",
            'Counter("failed" if row.verdict in FAILED else row.verdict for row in rows)',
            "Counter(row.verdict for row in rows)",
        ),
        (
            "a set-up's or teardown's seconds taken as the check's",
            '        if report.when == "call":\n            self.seconds = report.duration\n',
            "        self.seconds = report.duration\n",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/settings.py",
        SETTINGS_TESTS,
        (
            "the whole torch seed range left to the session's seed",
            "MAX_SEED = rng.MAX_SEED // 2",
            "MAX_SEED = rng.MAX_SEED",
        ),
        (
            "a negative seed accepted",
            "if not 0 <= value <= MAX_SEED:",
            "if not value <= MAX_SEED:",
        ),
        (
            "a results path that is a folder accepted",
            "    if path.is_dir():\n",
            "    if False:\n",
        ),
        ("a blank results path accepted", "if not text.strip():", "if not text:"),
        (
            "a results path under a file named as unwritable only",
            "    if not folder.is_dir():\n",
            "    if False:\n",
        ),
        ("case -1 accepted", "if case < 0:", "if case < -1:"),
    ),
    *_mutants(
        "pytest_cudagraph/settings.py",
        DEVICE_TESTS,
        (
            "a device index one past torch's accepted",
            "if index > devices.MAX_DEVICE_INDEX:",
            "if index > devices.MAX_DEVICE_INDEX + 1:",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/markers/cuda_graph_parity.py",
        PARITY_MARKER_TESTS,
        (
            "a caught failing check passes its test",
            "failed = [parity for parity in seen if not parity.ok]",
            "failed = []",
        ),
        (
            "a marked test that compared nothing passes",
            "        if self.mark_of(item) is not None and not sum(parity.checked for parity in seen):\n",
            "        if False:\n",
        ),
        (
            "a check still running when the body returns passes",
            "if checker is not None and checker.running:",
            "if False:",
        ),
        (
            "a test's checks summed as its last one",
            'entry["checked"] += value["checked"]',
            'entry["checked"] = value["checked"]',
        ),
        (
            "the marker's seed ignored",
            "seed = self.settings.value(settings.SEED, mark.seed if mark else None)",
            "seed = self.settings.value(settings.SEED)",
        ),
    ),
    *_mutants(
        "pytest_cudagraph/markers/graph_memory_bound.py",
        MEMORY_MARKER_TESTS,
        (
            "the command line's bound beats the marker's",
            "        if mark.mib is not None:\n            return mark\n",
            "",
        ),
    ),
    # The target's validation: each field checked where it enters, before any check runs.
    *_mutants(
        "pytest_cudagraph/conformance/target.py",
        TARGET_TESTS,
        ("a bad regex accepted", "            re.compile(mode[1])\n", "            pass\n"),
        (
            "an unhashable key_of result accepted",
            "        hash(key)\n    except TypeError:",
            "        key\n    except TypeError:",
        ),
        (
            "zero keys accepted",
            '_check_int(spec, "num_keys", target.num_keys, low=1)',
            '_check_int(spec, "num_keys", target.num_keys, low=0)',
        ),
        (
            "any output lifetime accepted",
            '    _check_choice(spec, "output_lifetime", target.output_lifetime, OUTPUT_LIFETIMES)\n',
            "",
        ),
        (
            "any thread model accepted",
            '    _check_choice(spec, "threads", target.threads, THREAD_MODELS)\n',
            "",
        ),
        (
            "True accepted as a count",
            "if isinstance(value, bool) or not isinstance(value, int) or value < low:",
            "if not isinstance(value, int) or value < low:",
        ),
        (
            "case 0 refused as the largest case",
            '_check_int(spec, "largest_case", target.largest_case, low=0)',
            '_check_int(spec, "largest_case", target.largest_case, low=1)',
        ),
        (
            "an empty tolerance mapping accepted",
            "    if not tolerance:\n        raise TargetError(",
            "    if False:\n        raise TargetError(",
        ),
        ("padding of no rows accepted", "if self.largest < 1:", "if self.largest < 0:"),
        (
            "the graphed side left out on CUDA",
            'if name != "graphed" or device.type == "cuda"',
            'if name != "graphed"',
        ),
    ),
    # The benchmark judge: every key measured, an empty or dirty run refused.
    *_mutants(
        "scripts/bench_report.py",
        JUDGE_TESTS,
        (
            "a key never measured leaves an every-key goal met",
            'return "incomplete" if self.unmeasured else "met"',
            'return "met"',
        ),
        (
            "an incomplete goal passes --check",
            '            problems.append(f"goal incomplete: {name}: not measured at {unmeasured}")\n',
            "            pass\n",
        ),
        (
            "a goal not measured passes --check",
            '            problems.append(f"goal not measured: {name}")\n',
            "            pass\n",
        ),
        (
            "a missed goal passes --check",
            '            problems.append(f"goal missed: {name}: {result.figure:g}{where}")\n',
            "            pass\n",
        ),
        (
            "an empty run judged",
            '        found.append("no benchmarks of tests/bench in this run")\n',
            "        pass\n",
        ),
        ("a dirty baseline accepted", '    elif commit.get("dirty"):\n', "    elif False:\n"),
        (
            "a run naming no commit accepted",
            '    if not commit.get("id"):\n        found.append',
            "    if False:\n        found.append",
        ),
        (
            "the best entry judged, not the worst",
            "pick = min if goal.at_least else max",
            "pick = max if goal.at_least else min",
        ),
        (
            "a figure on the threshold misses",
            "return value >= self.threshold if self.at_least else value <= self.threshold",
            "return value > self.threshold if self.at_least else value < self.threshold",
        ),
        (
            "an entry without the figure counts as measured",
            "if needed and not select(measured, **needed)",
            "if needed and not select(entries, **needed)",
        ),
    ),
)


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    verdict: str  # "killed", "survived", "error" or "equivalent"
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
    """Apply ``mutant`` in ``tree``, run its tests, put the file back (an equivalent mutant
    is only matched against its file)."""
    path = tree / mutant.path
    original = path.read_text()
    if mutant.equivalent:
        try:
            mutant.apply(original)
        except ValueError as error:
            return Outcome(mutant, "error", 0.0, str(error))
        return Outcome(mutant, "equivalent", 0.0, mutant.equivalent)
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
        selected = sorted({t for mutant in mutants if not mutant.equivalent for t in mutant.tests})
        baseline = run_tests(first, selected) if selected else None
        trees.put(first)
        if baseline is not None and baseline.returncode != 0:
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
    """One line per mutant and the score over the mutants that are not equivalent; whether
    every one of those was killed."""
    outcomes = list(outcomes)
    lines = [
        f"{o.verdict:10} {o.seconds:5.1f}s  {o.mutant.path}: {o.mutant.name}"
        + (f" ({o.detail})" if o.detail else "")
        for o in outcomes
    ]
    scored = [o for o in outcomes if o.verdict != "equivalent"]
    killed = sum(o.verdict == "killed" for o in scored)
    score = 100.0 * killed / len(scored) if scored else 0.0
    line = f"{killed} of {len(scored)} mutants killed ({score:.1f}%)"
    if len(scored) < len(outcomes):
        line += f"; {len(outcomes) - len(scored)} equivalent, not run"
    lines.append(line)
    return lines, killed == len(scored)


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
