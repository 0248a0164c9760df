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
    ``tests`` (pytest node ids, relative to the tree). ``equivalent`` says why no behaviour
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


Bug = tuple[str, str, str, tuple[str, ...]] | tuple[str, str, str, tuple[str, ...], str]


def _mutants(path: str, *bugs: Bug) -> list[Mutant]:
    """The mutants of one file: each bug is (name, old, new, tests), or (name, old, new, tests,
    why it is equivalent); its tests are the narrowest that kill it (node ids), so that each
    mutant pays little more than pytest's start."""
    return [Mutant(name, path, old, new, tests, *why) for name, old, new, tests, *why in bugs]


MUTANTS: tuple[Mutant, ...] = (
    *_mutants(
        "pytest_cudagraph/settings.py",
        (
            "environment before the command line",
            "        (config.getoption(setting.dest, None), setting.option),\n"
            "        (os.environ.get(setting.env) or None, setting.env),\n",
            "        (os.environ.get(setting.env) or None, setting.env),\n"
            "        (config.getoption(setting.dest, None), setting.option),\n",
            ("tests/plugin/test_settings.py::test_the_first_source_present_wins",),
        ),
        (
            "ini before the environment",
            "        (os.environ.get(setting.env) or None, setting.env),\n"
            '        (_ini_value(config, setting), f"ini {setting.ini}"),\n',
            '        (_ini_value(config, setting), f"ini {setting.ini}"),\n'
            "        (os.environ.get(setting.env) or None, setting.env),\n",
            ("tests/plugin/test_settings.py::test_the_first_source_present_wins",),
        ),
        (
            "an empty environment variable is a value",
            "(os.environ.get(setting.env) or None, setting.env)",
            "(os.environ.get(setting.env), setting.env)",
            ("tests/plugin/test_settings.py::test_an_empty_environment_variable_means_unset",),
        ),
        (
            "an empty ini value is a value",
            'return None if value in (None, "", []) else value',
            "return value",
            ("tests/plugin/test_settings.py::test_the_first_source_present_wins",),
        ),
        (
            "the largest seed refused",
            "if not 0 <= value <= MAX_SEED:",
            "if not 0 <= value < MAX_SEED:",
            ("tests/plugin/test_settings.py::test_seeds_from_text_or_numbers",),
        ),
        (
            "a size of zero accepted",
            "value > 0):",
            "value >= 0):",
            ("tests/plugin/test_settings.py::test_a_size_must_be_positive",),
        ),
        (
            "KiB read as 1000 bytes",
            '"KiB": 1 / 1024',
            '"KiB": 1 / 1000',
            ("tests/plugin/test_settings.py::test_sizes_are_mib_or_carry_a_binary_unit",),
        ),
        (
            "the marker's value loses to the session's",
            "return self[setting].value if marker_value is None else marker_value",
            "return self[setting].value if self[setting].value is not None else marker_value",
            ("tests/plugin/test_settings.py::test_a_marker_value_beats_the_session_value",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/stack.py",
        (
            "a pre-release misses its release's pin",
            "    return specifiers.contains(version, prereleases=True) or specifiers.contains(\n"
            "        Version(version.base_version)\n"
            "    )",
            "    return specifiers.contains(version, prereleases=True)",
            (
                "tests/plugin/test_pinned_stack.py::test_a_pre_release_torch_matches_a_pin_its_release_matches",
            ),
        ),
        (
            "an explicit pre-release pin refused",
            "specifiers.contains(version, prereleases=True)",
            "specifiers.contains(version, prereleases=False)",
            (
                "tests/plugin/test_pinned_stack.py::test_a_pre_release_torch_matches_a_pin_its_release_matches",
            ),
        ),
        (
            "torch's pre-release tag dropped",
            "torch=Version(torch.__version__).public",
            "torch=Version(torch.__version__).base_version",
            (
                "tests/plugin/test_pinned_stack.py::test_a_pre_release_torch_matches_a_pin_its_release_matches",
            ),
        ),
        (
            "a component pinned twice, the second wins",
            "        if component in pinned:\n",
            "        if component in pinned and not pinned:\n",
            ("tests/plugin/test_pinned_stack.py::test_a_component_pinned_twice_is_an_error",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/faults.py",
        (
            "patches undone oldest first",
            "fault = self.faults.pop()",
            "fault = self.faults.pop(0)",
            (
                "tests/engines/test_faults.py::test_one_attribute_patched_twice_is_restored_fully_newest_patch_first",
            ),
        ),
        (
            "every call from the N-th on fails",
            "if fault.calls == on_call:",
            "if fault.calls >= on_call:",
            (
                "tests/plugin/test_fault_injector.py::test_raises_on_the_nth_call_only_and_counts_calls",
            ),
        ),
        (
            "a restored fault still fails",
            "            if not fault.armed:\n                return original(*args, **kwargs)\n",
            "",
            (
                "tests/engines/test_faults.py::test_a_restored_fault_put_back_by_another_patcher_no_longer_fails",
            ),
        ),
        (
            "a restore overwrites a later patcher's value",
            "    if _own_value(target, name) is not replacement:\n        return\n",
            "",
            (
                "tests/engines/test_faults.py::test_fault_injector_and_monkeypatch_compose_in_any_order",
            ),
        ),
        (
            "a failing restore step is swallowed",
            "errors.append(error)",
            "pass",
            ("tests/engines/test_faults.py::test_a_failing_restore_step_does_not_stop_the_others",),
        ),
        (
            "the lock is tried from this thread",
            "    probe.start()\n    probe.join()\n",
            "    try_acquire()\n",
            (
                "tests/plugin/test_fault_injector.py::test_reentrant_lock_held_by_this_thread_counts_as_held",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/storage.py",
        (
            "adjacent storages reported as shared",
            "mine[1] < theirs[2] and theirs[1] < mine[2]",
            "mine[1] <= theirs[2] and theirs[1] <= mine[2]",
            (
                "tests/engines/test_storage.py::test_adjacent_storages_are_not_shared_and_overlapping_ones_are",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/compare.py",
        (
            "NaN against NaN differs",
            "            same |= expected.isnan() & actual.isnan()\n",
            "            pass\n",
            ("tests/engines/test_compare.py::test_nan_equals_nan_and_an_infinity_only_itself",),
        ),
        (
            "a dtype difference not reported",
            "    if expected.dtype != actual.dtype:\n",
            "    if expected.dtype != actual.dtype and False:\n",
            ("tests/engines/test_compare.py::test_shape_and_dtype_differences_are_named",),
        ),
        (
            "the first index reversed",
            "index.append(position)",
            "index.insert(0, position)",
            (
                "tests/engines/test_compare.py::test_a_value_mismatch_names_the_first_index_both_values_and_the_differences",
            ),
        ),
        (
            "tolerances ignored",
            "if expected.dtype == torch.bool or (rtol == 0 and atol == 0):",
            "if True:",
            ("tests/engines/test_compare.py::test_exact_by_default_and_tolerances_loosen_it",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/parity.py",
        (
            "every case under one seed",
            "case, seed = case_values[index], self.seed + index",
            "case, seed = case_values[index], self.seed",
            (
                "tests/engines/test_parity.py::test_cases_are_varied_by_seed_and_case_values_are_passed",
            ),
        ),
        (
            "an earlier case's output not kept",
            '                    earlier.keep(actual, f"case {index} output")\n',
            "",
            (
                "tests/engines/test_parity.py::test_the_graphed_output_is_read_when_the_graphed_call_returns",
            ),
        ),
        (
            "a check of no cases accepted",
            "        if not case_values:\n",
            "        if case_values is None:\n",
            ("tests/engines/test_parity.py::test_a_check_of_no_cases_is_a_value_error",),
        ),
        (
            "a graphed output that is its input passes",
            '                        *storage_extents(graphed_inputs, "inputs"),\n',
            "",
            ("tests/engines/test_parity.py::test_graphed_side_returning_its_input_fails_the_case",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/memory.py",
        (
            "growth equal to the bound fails",
            "passed = growth_mib <= bound_mib",
            "passed = growth_mib < bound_mib",
            ("tests/engines/test_memory.py::test_a_young_reading_within_the_bound_is_not_retaken",),
        ),
        (
            "no warning for live tensors over the bound",
            "if passed and allocated_mib > bound_mib:",
            "if passed and allocated_mib > bound_mib * 2:",
            (
                "tests/plugin/test_graph_memory_bound_warning.py::test_allocator_only_growth_passes_with_a_warning_in_section_summary_and_json",
            ),
        ),
        (
            "the block's end collects everything",
            "gc.collect(YOUNG_GENERATIONS)",
            "gc.collect()",
            (
                "tests/engines/test_memory_gc.py::test_the_young_reading_frees_a_cycle_made_in_the_block_collecting_young_generations",
            ),
        ),
        (
            "a young reading over the bound is not retaken",
            "if verdict.passed or self.report.after.full_collection or self.probe is None:",
            "if True:",
            (
                "tests/engines/test_memory.py::test_a_young_reading_over_the_bound_is_retaken_and_judged_on_the_full_one",
            ),
        ),
        (
            "outside torch measured against allocated",
            "return self.process_bytes - self.torch_reserved",
            "return self.process_bytes - self.torch_allocated",
            (
                "tests/plugin/test_graph_memory_bound.py::test_growth_over_the_bound_fails_and_splits_torch_from_the_rest",
            ),
        ),
        (
            "first use counted backwards",
            "first_use = before.process_bytes - cold.process_bytes",
            "first_use = cold.process_bytes - before.process_bytes",
            (
                "tests/engines/test_memory.py::test_warm_up_makes_the_growth_independent_of_what_ran_before",
            ),
        ),
        (
            "a moving NVML reading kept",
            "        if current == previous:\n            return current\n",
            "",
            ("tests/engines/test_memory.py::test_a_reading_waits_until_nvml_holds_still",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/captures.py",
        (
            "a key captured once counts as recaptured",
            "if key is not None and count > 1",
            "if key is not None and count >= 1",
            (
                "tests/engines/test_captures.py::test_a_cache_that_captures_a_held_key_again_is_seen",
            ),
        ),
        (
            "the outer key wins",
            "(stack[-1], None) if stack",
            "(stack[0], None) if stack",
            (
                "tests/engines/test_captures.py::test_nested_keys_label_a_capture_with_the_innermost",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/devices.py",
        (
            "workers past the GPU count not wrapped",
            "return entries[number % len(entries)]",
            "return entries[min(number, len(entries) - 1)]",
            (
                "tests/engines/test_devices.py::test_worker_n_gets_the_nth_visible_gpu_modulo_their_count",
            ),
        ),
        (
            "an empty entry does not end the list",
            'if not entry or entry.startswith("-"):',
            'if entry.startswith("-"):',
            (
                "tests/engines/test_devices.py::test_visible_gpus_honour_an_outer_cuda_visible_devices",
            ),
        ),
        (
            "memory of other processes counted",
            "if process.pid == pid and process.usedGpuMemory is not None",
            "if process.usedGpuMemory is not None",
            ("tests/engines/test_devices.py::test_process_memory_counts_only_this_pid",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/bench.py",
        (
            "a missing baseline compared anyway",
            "        if not compare_file.is_file():\n",
            "        if not compare_file.parent.exists():\n",
            (
                "tests/plugin/test_bench.py::test_a_stack_folder_without_its_baseline_file_is_still_missing",
            ),
        ),
        (
            "the storage filled for a run that neither saves nor compares",
            "STACK_PLACEHOLDER in storage and (storage_used or compare)",
            "STACK_PLACEHOLDER in storage",
            (
                "tests/plugin/test_bench.py::test_storage_is_filled_only_when_the_run_saves_or_compares",
            ),
        ),
    ),
    # The comparison: bools and integers exactly, the tolerance rule, what is walked.
    *_mutants(
        "pytest_cudagraph/engines/compare.py",
        (
            "a Tolerance built unchecked",
            '            non_negative_number(f"Tolerance.{name}", getattr(self, name))\n',
            "            pass\n",
            ("tests/engines/test_compare.py::test_a_tolerance_must_be_finite_and_not_negative",),
        ),
        (
            "a bool mismatch reports the tolerance it ignored",
            "    if expected.dtype == torch.bool:\n        rtol = atol = 0.0\n    close = _close(",
            "    close = _close(",
            ("tests/engines/test_compare.py::test_bools_compare_exactly_whatever_the_tolerance",),
        ),
        (
            "integer tensors compared in float64",
            "    return _integers_close(expected, actual, rtol, atol)\n",
            "    return torch.isclose(_widen(actual), _widen(expected), rtol=rtol, atol=atol)\n",
            ("tests/engines/test_compare.py::test_integers_compare_in_integer_arithmetic",),
        ),
        (
            "integer tensors ignore the tolerance",
            "    return _integers_close(expected, actual, rtol, atol)\n",
            "    return expected == actual\n",
            ("tests/engines/test_compare.py::test_integers_compare_in_integer_arithmetic",),
        ),
        (
            "the integer bound rounded up",
            ".floor().to(torch.int64)",
            ".ceil().to(torch.int64)",
            ("tests/engines/test_compare.py::test_integers_compare_in_integer_arithmetic",),
        ),
        (
            "an integer gap past int64 counts as within",
            "return (gap >= 0) & (unbounded | (gap <= allowed))",
            "return unbounded | (gap <= allowed)",
            (
                "tests/engines/test_compare.py::test_integer_gaps_past_what_int64_holds_are_never_within",
            ),
        ),
        (
            "uint64 values compared unshifted",
            "        return as_int64 ^ torch.iinfo(torch.int64).min\n",
            "        return as_int64\n",
            (
                "tests/engines/test_compare.py::test_uint64_gaps_are_taken_across_the_signed_boundary",
            ),
        ),
        (
            "the integer bound taken relative to the graphed side",
            "bound = expected.to(torch.float64).abs() * rtol + atol",
            "bound = actual.to(torch.float64).abs() * rtol + atol",
            ("tests/engines/test_compare.py::test_integer_tensors_honour_the_tolerance",),
        ),
        (
            "the float tolerance taken relative to the graphed side",
            "torch.isclose(_widen(actual), _widen(expected), rtol=rtol, atol=atol, equal_nan=True)",
            "torch.isclose(_widen(expected), _widen(actual), rtol=rtol, atol=atol, equal_nan=True)",
            (
                "tests/engines/test_compare.py::test_the_relative_tolerance_is_relative_to_the_eager_value",
            ),
        ),
        (
            "NaN against NaN differs within a tolerance",
            "rtol=rtol, atol=atol, equal_nan=True)",
            "rtol=rtol, atol=atol, equal_nan=False)",
            ("tests/engines/test_compare.py::test_nan_matches_nan_within_a_tolerance_too",),
        ),
        (
            "complex NaN against NaN differs within a tolerance",
            "        return close | (expected.isnan() & actual.isnan())\n",
            "        return close\n",
            ("tests/engines/test_compare.py::test_nan_matches_nan_within_a_tolerance_too",),
        ),
        (
            "agreeing elements count in the largest difference",
            "gaps.masked_fill_(close, 0).max()",
            "gaps.max()",
            (
                "tests/engines/test_compare.py::test_the_largest_difference_is_over_the_differing_elements_only",
            ),
        ),
        (
            "integer leaves judged in floats",
            "return gap <= Fraction(atol) + Fraction(rtol) * abs(expected)",
            "return gap <= atol + rtol * abs(expected)",
            (
                "tests/engines/test_compare.py::test_integer_and_complex_leaves_honour_the_tolerance",
            ),
        ),
        (
            "an infinite leaf within the tolerance of a finite one",
            "    if not math.isfinite(gap):  # an infinity matches only itself; NaN only NaN\n"
            "        return False\n",
            "",
            ("tests/engines/test_compare.py::test_nan_equals_nan_and_an_infinity_only_itself",),
        ),
        (
            "a leaf gap equal to the bound differs",
            "return gap <= atol + rtol * abs(expected)  # type: ignore[arg-type]",
            "return gap < atol + rtol * abs(expected)  # type: ignore[arg-type]",
            (
                "tests/engines/test_compare.py::test_a_pending_comparison_takes_its_tolerance_checked",
            ),
        ),
        (
            "two dataclass types with the same fields compared as one",
            "        or (mine.kind == trees.ATTRIBUTES and type(expected) is not type(actual))\n",
            "",
            ("tests/engines/test_compare.py::test_structure_differences_are_named",),
        ),
        (
            "keys on one side only not reported",
            "            found.append(Mismatch(path, detail, sides=sides))\n        pairs",
            "        pairs",
            ("tests/engines/test_compare.py::test_structure_differences_are_named",),
        ),
    ),
    # The parity engine: copies per side, shared inputs refused, nothing compared, the budget.
    *_mutants(
        "pytest_cudagraph/engines/parity.py",
        (
            "the eager output compared as it is later",
            'expected = trees.snapshot(returned, "eager output")',
            "expected = returned",
            (
                "tests/engines/test_parity.py::test_an_eager_output_that_is_state_the_graphed_call_writes_is_copied_first",
            ),
        ),
        (
            "inputs shared by both sides accepted",
            "                    _refuse_shared_inputs(eager_inputs, graphed_inputs, index)\n",
            "",
            (
                "tests/engines/test_parity.py::test_an_input_both_sides_are_handed_is_refused_before_either_runs",
            ),
        ),
        (
            "a check that compared no element passes",
            "        if elements == 0:\n",
            "        if elements < 0:\n",
            ("tests/engines/test_parity.py::test_outputs_that_hold_no_element_are_not_a_match",),
        ),
        (
            "the output budget ignored",
            "earlier = EarlierOutputs(self.output_budget_bytes)",
            "earlier = EarlierOutputs(DEFAULT_OUTPUT_BUDGET)",
            (
                "tests/engines/test_parity.py::test_memory_handed_out_again_after_an_output_was_let_go_is_not_shared",
            ),
        ),
        (
            "a negative output budget accepted",
            '        _check_count("output_budget_bytes", output_budget_bytes)\n',
            "",
            ("tests/engines/test_parity.py::test_checker_options_are_checked",),
        ),
        (
            "a rerun of the case past the last accepted",
            "if self.only_case >= count:",
            "if self.only_case > count:",
            (
                "tests/engines/test_parity.py::test_only_case_runs_that_case_alone_under_its_own_seed",
            ),
        ),
        (
            "the largest count of cases refused",
            "if cases > MAX_CASES:",
            "if cases >= MAX_CASES:",
            ("tests/engines/test_parity.py::test_the_largest_count_of_cases_is_accepted",),
        ),
        (
            "a last case seeded at the largest seed refused",
            "if self.seed + len(case_values) - 1 > MAX_SEED:",
            "if self.seed + len(case_values) > MAX_SEED:",
            (
                "tests/engines/test_parity.py::test_cases_that_run_past_the_largest_seed_are_refused_before_running",
            ),
        ),
        (
            "a toggle name matched at its start only",
            "_TOGGLE_NAME.fullmatch(toggle)",
            "_TOGGLE_NAME.match(toggle)",
            (
                "tests/engines/test_parity.py::test_a_toggle_that_is_not_a_plain_variable_name_is_refused",
            ),
        ),
        (
            "a toggled run that recorded only empty values passes",
            "        elif trees.element_count(off) == 0:\n",
            "        elif trees.element_count(off) < 0:\n",
            ("tests/engines/test_parity.py::test_recording_nothing_or_only_empty_values_fails",),
        ),
        (
            "a value recorded twice in both toggled runs counts as shared",
            "shared = sorted(within(on) - within(off))",
            "shared = sorted(within(on))",
            (
                "tests/plugin/test_cuda_graph_parity_storage.py::test_a_tensor_recorded_twice_in_both_runs_is_the_body_not_the_graph",
            ),
        ),
        (
            "the toggle variable left set after the runs",
            "        if previous is None:\n            del os.environ[name]\n",
            "        if previous is None:\n            pass\n",
            ("tests/engines/test_parity.py::test_toggle_variable_is_removed_when_it_was_unset",),
        ),
        (
            "a graphed output that is the eager output passes",
            '                        *storage_extents(returned, "eager output"),\n',
            "",
            (
                "tests/engines/test_parity.py::test_graphed_side_returning_the_eager_output_fails_the_case",
            ),
        ),
        (
            "a failing case reports the check's seed",
            "seed = self.seed + (index or 0)",
            "seed = self.seed",
            (
                "tests/engines/test_parity.py::test_mismatch_report_names_case_seed_shapes_values_and_count",
            ),
        ),
        (
            "one differing case among matching ones passes",
            "return not self.failures",
            "return len(self.failures) < len(self.outcomes)",
            (
                "tests/engines/test_parity.py::test_mismatch_report_names_case_seed_shapes_values_and_count",
            ),
        ),
    ),
    # The one walker: dataclasses and namespaces, and copies that later writes cannot reach.
    *_mutants(
        "pytest_cudagraph/engines/trees.py",
        (
            "dataclasses are leaves",
            "    if dataclasses.is_dataclass(value) and not isinstance(value, type):\n",
            "    if False:\n",
            ("tests/engines/test_trees.py::test_every_container_is_walked_and_each_tensor_named",),
        ),
        (
            "namespaces are leaves",
            "    if isinstance(value, types.SimpleNamespace):\n        return Node(",
            "    if False:\n        return Node(",
            ("tests/engines/test_trees.py::test_every_container_is_walked_and_each_tensor_named",),
        ),
        (
            "a dataclass copy shares its tensors",
            "        object.__setattr__(rebuilt, name, item)\n",
            "        pass\n",
            (
                "tests/engines/test_trees.py::test_a_snapshot_cannot_be_reached_by_later_writes_and_keeps_its_structure",
            ),
        ),
        (
            "a namespace copy shares its tensors",
            "        return types.SimpleNamespace(**items)\n",
            "        return copy.copy(value)\n",
            (
                "tests/engines/test_trees.py::test_a_snapshot_cannot_be_reached_by_later_writes_and_keeps_its_structure",
            ),
        ),
        (
            "a named tuple copied as a plain tuple",
            "    if _is_named_tuple(value):\n        return type(value)(*items.values())\n",
            "",
            (
                "tests/engines/test_trees.py::test_a_snapshot_cannot_be_reached_by_later_writes_and_keeps_its_structure",
            ),
        ),
        (
            "a list copied as a tuple",
            "return tuple(items.values()) if isinstance(value, tuple) else list(items.values())",
            "return tuple(items.values())",
            (
                "tests/engines/test_trees.py::test_a_snapshot_cannot_be_reached_by_later_writes_and_keeps_its_structure",
            ),
        ),
        (
            "None counted as a compared value",
            "return int(value is not None)",
            "return 1",
            (
                "tests/engines/test_trees.py::test_element_count_counts_tensor_elements_and_leaves_but_not_none",
            ),
        ),
        (
            "a sparse tensor compared",
            "        if value.layout != torch.strided:\n",
            "        if False:\n",
            (
                "tests/engines/test_trees.py::test_an_unsupported_leaf_is_refused_with_its_full_path",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/storage.py",
        (
            "storages on two devices reported as shared",
            "return mine[0] == theirs[0] and mine[1]",
            "return mine[1]",
            (
                "tests/engines/test_storage.py::test_storages_on_two_devices_never_overlap_whatever_their_addresses",
            ),
        ),
        (
            "a view's extent is its own elements, not its storage",
            "return str(tensor.device), storage.data_ptr(), storage.data_ptr() + storage.nbytes()",
            "return str(tensor.device), tensor.data_ptr(), tensor.data_ptr() + tensor.nbytes",
            (
                "tests/engines/test_storage.py::test_views_of_disjoint_parts_of_one_storage_still_share_it",
            ),
        ),
        (
            "outputs that fill the budget exactly let go",
            "while self.held_bytes > self.budget_bytes:",
            "while self.held_bytes >= self.budget_bytes:",
            ("tests/engines/test_storage.py::test_outputs_within_the_budget_are_kept_alive",),
        ),
        (
            "outputs past the budget still held",
            "                entry.held = None\n",
            "                pass\n",
            ("tests/engines/test_storage.py::test_past_the_budget_the_oldest_outputs_are_let_go",),
        ),
        (
            "views of one storage counted once each",
            "sizes[extent] = storage.nbytes()",
            "sizes[path] = storage.nbytes()",
            ("tests/engines/test_storage.py::test_views_of_one_storage_count_once",),
        ),
        (
            "a freed earlier output still counts as shared",
            "if _overlap(mine, entry.extent) and entry.alive()",
            "if _overlap(mine, entry.extent)",
            (
                "tests/engines/test_storage.py::test_memory_freed_and_handed_out_again_is_not_shared",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/captures.py",
        (
            "one key stack for every thread",
            "self._keys = threading.local()",
            'self._keys = type("Keys", (), {})()',
            ("tests/engines/test_captures.py::test_each_thread_labels_its_own_captures",),
        ),
        (
            "replays of graphs captured before the scope not counted",
            "            self._all_replays += 1\n"
            "            index = self._latest.get(id(graph))\n"
            "            if index is not None:\n",
            "            index = self._latest.get(id(graph))\n"
            "            if index is not None:\n"
            "                self._all_replays += 1\n",
            (
                "tests/engines/test_captures.py::test_all_replays_counts_graphs_captured_before_the_scope_too",
            ),
        ),
        (
            "an unhashable capture key accepted",
            "        hash(key)  # a TypeError",
            "        key  # a TypeError",
            ("tests/engines/test_captures.py::test_bad_arguments_are_refused",),
        ),
        (
            "a capture never replayed counts as served",
            "for capture in self.captures if capture.replays))",
            "for capture in self.captures))",
            ("tests/engines/test_captures.py::test_a_graph_never_replayed_is_not_a_recapture",),
        ),
        (
            "a replay credited to the capture before",
            "self._latest[id(graph)] = len(self._captures)",
            "self._latest[id(graph)] = len(self._captures) - 1",
            (
                "tests/engines/test_captures.py::test_a_cache_that_captures_a_held_key_again_is_seen",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/graph_faults.py",
        (
            "a failed capture_end leaves a graph to replay",
            "graph.reset()  # what a failed capture leaves",
            "pass  # what a failed capture leaves",
            (
                "tests/engines/test_graph_faults.py::test_each_stage_raises_once_where_a_real_fault_would_leave_the_graph",
            ),
        ),
        (
            "every call of the stage fails",
            "first, fault.fired = not fault.fired, True",
            "first, fault.fired = True, True",
            (
                "tests/engines/test_graph_faults.py::test_each_stage_raises_once_where_a_real_fault_would_leave_the_graph",
            ),
        ),
        (
            "capture_end fails before the capture ends",
            '            if fault.stage == "capture_end":\n',
            '            if fault.stage == "replay":\n',
            (
                "tests/engines/test_graph_faults.py::test_each_stage_raises_once_where_a_real_fault_would_leave_the_graph",
            ),
        ),
        (
            "reset accepted as a stage",
            "if stage not in STAGES:",
            "if stage not in _METHODS:",
            ("tests/engines/test_graph_faults.py::test_reset_is_not_a_stage_to_fail",),
        ),
    ),
    # The one patching of torch's graph class, and the one number check.
    *_mutants(
        "pytest_cudagraph/engines/graph_api.py",
        (
            "a block's end undoes a later patch",
            "if vars(graph_class).get(name) is wrapper:",
            "if True:",
            (
                "tests/engines/test_graph_api.py::test_a_block_left_before_a_later_patch_leaves_that_patch_in_place",
            ),
        ),
        (
            "an inherited method copied onto the class",
            "                delattr(graph_class, name)\n",
            "                setattr(graph_class, name, original)\n",
            (
                "tests/engines/test_graph_api.py::test_an_inherited_method_is_put_back_by_deleting_the_patch_even_after_an_error",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/arguments.py",
        (
            "an infinite tolerance accepted",
            "if not (finite and value >= 0):",
            "if not value >= 0:",
            (
                "tests/engines/test_arguments.py::test_anything_else_is_refused_naming_the_argument_and_the_rule",
            ),
        ),
        (
            "a bool tolerance accepted",
            "if isinstance(value, bool) or not isinstance(value, (int, float)):",
            "if not isinstance(value, (int, float)):",
            (
                "tests/engines/test_arguments.py::test_anything_else_is_refused_naming_the_argument_and_the_rule",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/unchanged.py",
        (
            "a change reported at every look",
            "looked = [held for held in self._held if not held.changed]",
            "looked = list(self._held)",
            (
                "tests/engines/test_unchanged.py::test_a_value_changed_in_place_is_reported_once_naming_what_ran_before",
            ),
        ),
        (
            "a held value compared with itself",
            "self._held.append(_Held(name, value, copy))",
            "self._held.append(_Held(name, value, value))",
            (
                "tests/engines/test_unchanged.py::test_a_value_changed_in_place_is_reported_once_naming_what_ran_before",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/state.py",
        (
            "number attributes left out of the state",
            "            elif isinstance(value, NUMBERS):\n",
            "            elif False:\n",
            (
                "tests/engines/test_state.py::test_the_state_is_every_parameter_buffer_tensor_and_number_by_path",
            ),
        ),
        (
            "tensor attributes left out of the state",
            "            if isinstance(value, torch.Tensor):\n                yield",
            "            if False:\n                yield",
            (
                "tests/engines/test_state.py::test_the_state_is_every_parameter_buffer_tensor_and_number_by_path",
            ),
        ),
        (
            "load_state rebinds a buffer instead of copying into it",
            "there.copy_(state[path])  # type: ignore[arg-type]",
            "there.data = state[path].clone()  # type: ignore[union-attr]",
            (
                "tests/engines/test_state.py::test_load_state_writes_in_place_keeping_every_tensors_storage",
            ),
        ),
        (
            "every number set, even to its own value",
            "            elif slot.owner is not None and there != state[path]:\n",
            "            elif slot.owner is not None:\n",
            ("tests/engines/test_state.py::test_load_state_sets_a_number_only_where_it_differs",),
        ),
        (
            "a tensor of another shape written",
            "            or value.shape != there.shape\n",
            "",
            (
                "tests/engines/test_state.py::test_a_state_that_does_not_fit_is_refused_before_anything_is_written",
            ),
        ),
        (
            "a tensor of another dtype written",
            "            or value.dtype != there.dtype\n",
            "",
            (
                "tests/engines/test_state.py::test_a_tensor_of_another_dtype_is_refused_and_nothing_written",
            ),
        ),
        (
            "paths that are not the modules' accepted",
            "if slots.keys() != state.keys():",
            "if not slots.keys() <= state.keys():",
            ("tests/engines/test_state.py::test_a_state_with_every_path_and_one_more_is_refused",),
        ),
        (
            "tensors kept in lists and dicts left out of the state",
            "            elif _holds_tensors(value):\n",
            "            elif False:\n",
            (
                "tests/engines/test_state.py::test_tensors_kept_in_lists_and_dicts_are_state_and_compared_by_index",
            ),
        ),
        (
            "a listed tensor replaced instead of copied into",
            "            item.copy_(given[key])  # type: ignore[arg-type]\n",
            "            _set(there, key, _copied(given[key]))\n",
            (
                "tests/engines/test_state.py::test_load_state_copies_into_listed_tensors_and_gives_a_list_the_states_length",
            ),
        ),
        (
            "a list kept at its own length",
            "        del there[len(value) :]\n",
            "",
            (
                "tests/engines/test_state.py::test_load_state_copies_into_listed_tensors_and_gives_a_list_the_states_length",
            ),
        ),
        (
            "two sides sharing a buffer taken for two of their own",
            "        if (address := tensor.untyped_storage().data_ptr()) in written\n",
            "        if (address := tensor.untyped_storage().data_ptr()) in written and False\n",
            (
                "tests/engines/test_state.py::test_two_sides_holding_the_same_module_or_buffer_are_named",
            ),
        ),
        (
            "states compared without the tolerance",
            "dict(expected), dict(actual), atol=atol, rtol=rtol,",
            "dict(expected), dict(actual),",
            ("tests/engines/test_state.py::test_states_are_compared_within_the_tolerance",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/reach.py",
        (
            "closures not walked",
            "cells = value.__closure__ or ()",
            "cells = ()",
            ("tests/engines/test_reach.py::test_a_closure_and_a_partial_reach_what_they_hold",),
        ),
        (
            "a bound method's object not walked",
            "yield path, value.__self__  # a bound method's",
            "return  # a bound method's",
            (
                "tests/engines/test_reach.py::test_a_bound_method_reaches_its_objects_attributes_modules_and_containers",
            ),
        ),
        (
            "a partial's arguments not walked",
            '        yield from ((f"{path}.args[{index}]", item) for index, item in '
            "enumerate(value.args))\n",
            "",
            (
                "tests/engines/test_reach.py::test_a_partials_arguments_are_walked_by_position_and_by_name",
            ),
        ),
        (
            "slots not walked",
            "        names += [slots] if isinstance(slots, str) else list(slots)\n",
            "        pass\n",
            (
                "tests/engines/test_reach.py::test_a_bound_method_reaches_its_objects_attributes_modules_and_containers",
            ),
        ),
        (
            "tensors on another device kept",
            "if self.device is None or value.device == self.device:",
            "if True:",
            (
                "tests/engines/test_reach.py::test_a_tensor_on_another_device_is_left_out_when_a_device_is_named",
            ),
        ),
        (
            "the depth bound one short",
            "depth > MAX_DEPTH",
            "depth >= MAX_DEPTH",
            (
                "tests/engines/test_reach.py::test_the_walk_enters_objects_down_to_max_depth_and_no_deeper",
            ),
        ),
        (
            "a user's module attributes not walked",
            "if not _foreign(type(value).__module__):  # a user's module",
            "if False:  # a user's module",
            ("tests/engines/test_reach.py::test_a_closure_and_a_partial_reach_what_they_hold",),
        ),
        (
            "a path missing from the second look counts as rebound",
            "if path in after and after[path] != address",
            "if after.get(path) != address",
            (
                "tests/engines/test_reach.py::test_a_path_gone_from_the_second_look_is_not_a_rebinding",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/trajectory.py",
        (
            "teacher forcing follows the graphed side's output",
            "            graphed_inputs = copy(following)\n",
            "            graphed_inputs = next_inputs(graphed_inputs, actual)\n",
            (
                "tests/engines/test_trajectory.py::test_a_token_flipped_within_the_tolerance_parts_free_running_sides_only",
            ),
        ),
        (
            "teacher forcing hands the graphed side eager's own inputs",
            "            graphed_inputs = copy(following)\n",
            "            graphed_inputs = following\n",
            (
                "tests/engines/test_trajectory.py::test_teacher_forced_the_graphed_side_takes_a_copy_of_eagers_inputs",
            ),
        ),
        (
            "a free-running graphed side fed eager's output",
            "graphed_inputs = next_inputs(graphed_inputs, actual)",
            "graphed_inputs = next_inputs(graphed_inputs, expected)",
            (
                "tests/engines/test_trajectory.py::test_a_token_flipped_within_the_tolerance_parts_free_running_sides_only",
            ),
        ),
        (
            "zero steps accepted",
            "if steps < 1:",
            "if steps < 0:",
            (
                "tests/engines/test_trajectory.py::test_a_count_of_steps_that_is_not_one_or_more_is_refused",
            ),
        ),
        (
            "the last step not run",
            "for step in range(steps):",
            "for step in range(steps - 1):",
            (
                "tests/engines/test_trajectory.py::test_teacher_forced_the_graphed_side_takes_a_copy_of_eagers_inputs",
            ),
        ),
        (
            "a divergence names the graphed side's inputs",
            "return Divergence(step, eager_inputs, tuple(found))",
            "return Divergence(step, graphed_inputs, tuple(found))",
            (
                "tests/engines/test_trajectory.py::test_a_token_flipped_within_the_tolerance_parts_free_running_sides_only",
            ),
        ),
    ),
    # The results: the envelope, each run's outcome, skips, how the session ended, the file.
    *_mutants(
        "pytest_cudagraph/results.py",
        (
            "a user's value with our key and more read as ours",
            "and value.keys() == {ENVELOPE}",
            "and ENVELOPE in value",
            ("tests/plugin/test_results.py::test_a_value_with_our_key_and_more_is_the_users",),
        ),
        (
            "a phase record written by hand read as ours",
            "        and name != RECORD_PREFIX + PHASE  # never recorded by hand",
            "        # never recorded by hand",
            ("tests/plugin/test_results.py::test_records_are_only_what_the_plugin_wrote",),
        ),
        (
            "the skip total counts reasons",
            '"total": sum(reasons.values()),',
            '"total": len(reasons),',
            ("tests/plugin/test_results.py::test_the_skip_total_counts_skips_not_reasons",),
        ),
        (
            "a user's own skips counted",
            'if phase["outcome"] == "skipped" and phase["uses_plugin"]',
            'if phase["outcome"] == "skipped"',
            ("tests/plugin/test_results.py::test_summary_lines_from_records",),
        ),
        (
            "a session stopped early counts as complete",
            "complete = exit_status in FINISHED and stopped is None",
            "complete = exit_status in FINISHED",
            ("tests/plugin/test_results.py::test_how_a_session_ended",),
        ),
        (
            "an interrupted or crashed session counts as complete",
            "complete = exit_status in FINISHED and stopped is None",
            "complete = stopped is None",
            ("tests/plugin/test_results.py::test_how_a_session_ended",),
        ),
        (
            "a failed write leaves its temporary file",
            "        Path(temporary).unlink(missing_ok=True)\n",
            "        pass\n",
            ("tests/plugin/test_results.py::test_a_failed_write_leaves_no_temporary_file",),
        ),
        (
            "a later phase overwrites a failure",
            '        if self.outcome in ("failed", "error"):\n            return\n',
            "",
            (
                "tests/plugin/test_results.py::test_each_run_of_a_test_is_one_entry_and_its_first_failure_stands",
            ),
        ),
        (
            "a passing set-up or teardown decides the run",
            '        if phase["outcome"] == "passed" and phase["when"] != "call":\n            return\n',
            "",
            (
                "tests/plugin/test_results.py::test_each_run_of_a_test_is_one_entry_and_its_first_failure_stands",
            ),
        ),
        (
            "a test run twice is one entry",
            'if run is None or phase["when"] in ("setup", "collect"):',
            "if run is None:",
            (
                "tests/plugin/test_results.py::test_each_run_of_a_test_is_one_entry_and_its_first_failure_stands",
            ),
        ),
        (
            "a failure outside the call counted as failed, not error",
            '    if report.failed and report.when != "call":\n        return "error"\n',
            "",
            ("tests/plugin/test_results.py::test_the_phase_that_decides_a_run",),
        ),
        (
            "an infinity written as a bare number",
            "return value if math.isfinite(value) else str(value)",
            "return value",
            ("tests/plugin/test_results.py::test_the_json_is_strict_whatever_the_values",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/suite.py",
        (
            "a later pass overwrites a FAILED row",
            "        if self.verdict in FAILED:\n            return\n",
            "",
            (
                "tests/conformance/test_suite_on_cpu.py::test_a_row_keeps_the_figure_and_the_first_failure",
            ),
        ),
        (
            "an error at set-up shown as FAILED",
            'self.verdict = "FAILED" if report.when == "call" else "ERROR"',
            'self.verdict = "FAILED"',
            (
                "tests/conformance/test_suite_on_cpu.py::test_an_error_at_set_up_is_an_error_row_with_its_reason",
            ),
        ),
        (
            "a skip overwrites a pass",
            'elif report.skipped and self.verdict != "passed":',
            "elif report.skipped:",
            ("tests/conformance/test_suite_on_cpu.py::test_a_pass_outranks_a_skip",),
        ),
        (
            "an infinite figure recorded",
            "        if not math.isfinite(value):\n",
            "        if math.isnan(value):\n",
            ("tests/conformance/test_suite_on_cpu.py::test_record_figure_refuses_an_infinity",),
        ),
        (
            "ERROR rows left out of the failed tally",
            'Counter("failed" if row.verdict in FAILED else row.verdict for row in rows)',
            "Counter(row.verdict for row in rows)",
            (
                "tests/conformance/test_suite_on_cpu.py::test_a_row_keeps_the_figure_and_the_first_failure",
            ),
        ),
        (
            "a set-up's or teardown's seconds taken as the check's",
            '        if report.when == "call":\n            self.seconds = report.duration\n',
            "        self.seconds = report.duration\n",
            (
                "tests/conformance/test_suite_on_cpu.py::test_an_error_at_set_up_is_an_error_row_with_its_reason",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/settings.py",
        (
            "the whole torch seed range left to the session's seed",
            "MAX_SEED = rng.MAX_SEED // 2",
            "MAX_SEED = rng.MAX_SEED",
            ("tests/plugin/test_settings.py::test_seeds_outside_what_torch_takes_are_refused",),
        ),
        (
            "a negative seed accepted",
            "if not 0 <= value <= MAX_SEED:",
            "if not value <= MAX_SEED:",
            ("tests/plugin/test_settings.py::test_seeds_outside_what_torch_takes_are_refused",),
        ),
        (
            "a results path that is a folder accepted",
            "    if path.is_dir():\n",
            "    if False:\n",
            (
                "tests/plugin/test_settings.py::test_a_results_path_must_be_a_file_that_can_be_written",
            ),
        ),
        (
            "a blank results path accepted",
            "if not text.strip():",
            "if not text:",
            (
                "tests/plugin/test_settings.py::test_a_results_path_must_be_a_file_that_can_be_written",
            ),
        ),
        (
            "a results path under a file named as unwritable only",
            "    if not folder.is_dir():\n",
            "    if False:\n",
            (
                "tests/plugin/test_settings.py::test_a_results_path_must_be_a_file_that_can_be_written",
            ),
        ),
        (
            "case -1 accepted",
            "if case < 0:",
            "if case < -1:",
            ("tests/plugin/test_settings.py::test_bad_cases_are_refused",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/settings.py",
        (
            "a device index one past torch's accepted",
            "if index > devices.MAX_DEVICE_INDEX:",
            "if index > devices.MAX_DEVICE_INDEX + 1:",
            ("tests/engines/test_devices.py::test_device_indices_torch_cannot_hold_are_refused",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/markers/cuda_graph_parity.py",
        (
            "a caught failing check passes its test",
            "failed = [parity for parity in seen if not parity.ok]",
            "failed = []",
            (
                "tests/plugin/test_cuda_graph_parity.py::test_a_failing_check_fails_its_test_whatever_the_body_did",
            ),
        ),
        (
            "a marked test that compared nothing passes",
            "        if self.mark_of(item) is not None and not sum(parity.checked for parity in seen):\n",
            "        if False:\n",
            (
                "tests/plugin/test_cuda_graph_parity.py::test_a_marked_test_that_compares_nothing_fails_saying_so",
            ),
        ),
        (
            "a check still running when the body returns passes",
            "if checker is not None and checker.running:",
            "if False:",
            (
                "tests/plugin/test_cuda_graph_parity.py::test_a_check_still_running_when_the_body_returns_fails_the_test",
            ),
        ),
        (
            "a test's checks summed as its last one",
            'entry["checked"] += value["checked"]',
            'entry["checked"] = value["checked"]',
            (
                "tests/plugin/test_cuda_graph_parity.py::test_a_failing_check_fails_its_test_whatever_the_body_did",
            ),
        ),
        (
            "the marker's seed ignored",
            "seed = self.settings.value(settings.SEED, mark.seed if mark else None)",
            "seed = self.settings.value(settings.SEED)",
            (
                "tests/plugin/test_cuda_graph_parity.py::test_seed_precedence_is_marker_option_env_ini",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/markers/graph_memory_bound.py",
        (
            "the command line's bound beats the marker's",
            "        if mark.mib is not None:\n            return mark\n",
            "",
            (
                "tests/plugin/test_graph_memory_bound.py::test_marker_passes_and_fails_on_the_probe_readings",
            ),
        ),
    ),
    # The target's validation: each field checked where it enters, before any check runs.
    *_mutants(
        "pytest_cudagraph/conformance/judging.py",
        (
            "both sides' same state taken for two of their own",
            "    shared = shared_state(*pair)\n",
            "    shared: list[str] = []\n",
            ("tests/conformance/test_judging.py::test_state_sides_must_be_two_roots_of_their_own",),
        ),
        (
            "a transplant that copies nothing",
            "        load_state(eager_side, module_state(graphed_side))\n",
            "        module_state(graphed_side)\n",
            (
                "tests/conformance/test_judging.py::test_transplant_copies_the_graphed_state_into_the_eager_side_in_place",
            ),
        ),
        (
            "the states compared after no call",
            '        self.compare_state(f"after call {self.calls}',
            '        (f"after call {self.calls}',
            (
                "tests/conformance/test_judging.py::test_lockstep_names_the_first_call_whose_state_parted_and_goes_on_from_one_state",
            ),
        ),
        (
            "states left apart once they parted",
            '            self.first_parting = f"{when}: {found[0].describe()}{more}"\n        self.sync()\n',
            '            self.first_parting = f"{when}: {found[0].describe()}{more}"\n',
            (
                "tests/conformance/test_judging.py::test_lockstep_names_the_first_call_whose_state_parted_and_goes_on_from_one_state",
            ),
        ),
        (
            "an accumulating target never given a new episode",
            "        if self.episodic and self._in_episode >= EPISODE_CALLS:\n",
            "        if False:\n",
            (
                "tests/conformance/test_judging.py::test_an_accumulating_target_is_judged_by_episodes_from_its_reset",
            ),
        ),
        (
            "a repeated call's change not seen",
            "        if changed:\n            index = changed[0].first_index\n",
            "        if False:\n            index = changed[0].first_index\n",
            (
                "tests/conformance/test_judging.py::test_an_accumulating_target_is_judged_by_episodes_from_its_reset",
            ),
        ),
        (
            "the first replay after a capture not told from a later one",
            "        if key in self._captured:\n",
            "        if False:\n",
            (
                "tests/conformance/test_judging.py::test_lockstep_says_whether_the_call_captured_or_was_the_first_replay_after_it",
            ),
        ),
        (
            "the diagnosis blind to the states",
            "        transplant(self.sides)\n        inputs = make()\n",
            "        inputs = make()\n",
            ("tests/conformance/test_judging.py::test_a_difference_is_diagnosed_from_one_state",),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/target.py",
        (
            "a bad regex accepted",
            "            re.compile(mode[1])\n",
            "            pass\n",
            ("tests/conformance/test_target.py::test_a_malformed_contract_field_is_named",),
        ),
        (
            "an unhashable key_of result accepted",
            "        hash(key)\n    except TypeError:",
            "        key\n    except TypeError:",
            (
                "tests/conformance/test_target.py::test_case_0_is_drawn_and_keyed_when_the_target_is_validated",
            ),
        ),
        (
            "zero keys accepted",
            '_check_int(spec, "num_keys", target.num_keys, low=1)',
            '_check_int(spec, "num_keys", target.num_keys, low=0)',
            ("tests/conformance/test_target.py::test_a_malformed_contract_field_is_named",),
        ),
        (
            "any output lifetime accepted",
            '    _check_choice(spec, "output_lifetime", target.output_lifetime, OUTPUT_LIFETIMES)\n',
            "",
            ("tests/conformance/test_target.py::test_a_malformed_contract_field_is_named",),
        ),
        (
            "any thread model accepted",
            '    _check_choice(spec, "threads", target.threads, THREAD_MODELS)\n',
            "",
            ("tests/conformance/test_target.py::test_a_malformed_contract_field_is_named",),
        ),
        (
            "True accepted as a count",
            "if isinstance(value, bool) or not isinstance(value, int) or value < low:",
            "if not isinstance(value, int) or value < low:",
            ("tests/conformance/test_target_loading.py::test_a_malformed_field_is_named",),
        ),
        (
            "case 0 refused as the largest case",
            '_check_int(spec, "largest_case", target.largest_case, low=0)',
            '_check_int(spec, "largest_case", target.largest_case, low=1)',
            ("tests/conformance/test_target_loading.py::test_a_malformed_field_is_named",),
        ),
        (
            "an empty tolerance mapping accepted",
            "    if not tolerance:\n        raise TargetError(",
            "    if False:\n        raise TargetError(",
            ("tests/conformance/test_target.py::test_a_malformed_contract_field_is_named",),
        ),
        (
            "padding of no rows accepted",
            "if self.largest < 1:",
            "if self.largest < 0:",
            (
                "tests/conformance/test_target.py::test_a_malformed_padding_or_trajectory_is_refused_naming_the_field",
            ),
        ),
        (
            "the graphed side left out on CUDA",
            'if name != "graphed" or device.type == "cuda"',
            'if name != "graphed"',
            ("tests/conformance/test_target.py::test_the_graphed_side_is_required_on_cuda",),
        ),
    ),
    # The benchmark judge: every key measured, an empty or dirty run refused.
    *_mutants(
        "scripts/bench_report.py",
        (
            "a key never measured leaves an every-key goal met",
            'return "incomplete" if self.unmeasured else "met"',
            'return "met"',
            (
                "tests/scripts/test_bench_report.py::test_a_key_or_step_never_measured_leaves_an_every_goal_incomplete",
            ),
        ),
        (
            "an incomplete goal passes --check",
            '            problems.append(f"goal incomplete: {name}: not measured at {unmeasured}")\n',
            "            pass\n",
            (
                "tests/scripts/test_bench_report.py::test_compile_of_the_lean_step_missing_at_one_key_fails_the_lean_graphs_goal",
            ),
        ),
        (
            "a goal not measured passes --check",
            '            problems.append(f"goal not measured: {name}")\n',
            "            pass\n",
            ("tests/scripts/test_bench_report.py::test_check_exits_1_on_a_partial_run",),
        ),
        (
            "a missed goal passes --check",
            '            problems.append(f"goal missed: {name}: {result.figure:g}{where}")\n',
            "            pass\n",
            (
                "tests/scripts/test_bench_report.py::test_check_exits_1_on_a_missed_goal_and_names_it",
            ),
        ),
        (
            "an empty run judged",
            '        found.append("no benchmarks of tests/bench in this run")\n',
            "        pass\n",
            ("tests/scripts/test_bench_report.py::test_nothing_measured_says_so",),
        ),
        (
            "a dirty baseline accepted",
            '    elif commit.get("dirty"):\n',
            "    elif False:\n",
            (
                "tests/scripts/test_bench_report.py::test_check_refuses_a_run_from_a_dirty_or_unknown_tree",
            ),
        ),
        (
            "a run naming no commit accepted",
            '    if not commit.get("id"):\n        found.append',
            "    if False:\n        found.append",
            (
                "tests/scripts/test_bench_report.py::test_check_refuses_a_run_from_a_dirty_or_unknown_tree",
            ),
        ),
        (
            "the best entry judged, not the worst",
            "pick = min if goal.at_least else max",
            "pick = max if goal.at_least else min",
            (
                "tests/scripts/test_bench_report.py::test_replay_efficiency_is_judged_at_every_key_of_both_steps",
            ),
        ),
        (
            "a figure on the threshold misses",
            "return value >= self.threshold if self.at_least else value <= self.threshold",
            "return value > self.threshold if self.at_least else value < self.threshold",
            ("tests/scripts/test_bench_report.py::test_goal_verdicts_follow_the_thresholds",),
        ),
        (
            "an entry without the figure counts as measured",
            "if needed and not select(measured, **needed)",
            "if needed and not select(entries, **needed)",
            (
                "tests/scripts/test_bench_report.py::test_compile_of_the_lean_step_missing_at_one_key_fails_the_lean_graphs_goal",
            ),
        ),
    ),
    # The checks' verdicts, each turned off, and what witnesses their captures.
    *_mutants(
        "pytest_cudagraph/conformance/test_02_no_baked_inputs.py",
        (
            "no baked inputs never fails",
            'assert not problems, "graphed answers after changing one input',
            'assert True or problems, "graphed answers after changing one input',
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_no_baked_inputs_fails_a_graph_that_keeps_one_inputs_first_value",
            ),
        ),
        (
            "nested inputs never changed",
            "for path in input_tensor_paths(base()):",
            "for path in list(base())[:1]:",
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_no_baked_inputs_fails_a_graph_that_keeps_one_inputs_first_value",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/test_04_identical_sampling.py",
        (
            "identical sampling never fails",
            "assert not mismatches,",
            "assert True or mismatches,",
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_identical_sampling_fails_tokens_that_differ_with_graphs_on",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/test_06_device_binding.py",
        (
            "device binding never fails",
            '    assert not problems, "\\n".join(problems)\n',
            '    assert True or problems, "\\n".join(problems)\n',
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_device_binding_fails_what_the_fresh_process_saw",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/test_07_guards.py",
        (
            "an empty refusal passes",
            "elif not str(error).strip():",
            "elif False:",
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_guards_fail_an_empty_refusal_and_a_mode_that_does_not_return",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/test_11_processes.py",
        (
            "worker processes never fail",
            'assert not problems, "worker results differ from eager',
            'assert True or problems, "worker results differ from eager',
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_worker_processes_fails_results_that_differ_from_eager",
            ),
        ),
        (
            "a process started and joined before the refusal goes unseen",
            "            started.append(how)\n",
            "            pass\n",
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_worker_refusal_fails_a_process_started_and_joined_before_the_refusal",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/test_12_graphs_not_skipped.py",
        (
            "graphs not skipped never fails",
            "assert not skips,",
            "assert True or skips,",
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_graphs_not_skipped_fails_any_skip_the_target_reports",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/test_13_output_storage.py",
        (
            "output storage never fails",
            'assert not problems, "graphed outputs that do not own their memory',
            'assert True or problems, "graphed outputs that do not own their memory',
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_output_storage_fails_outputs_in_a_graphs_static_buffer",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/test_14_captures.py",
        (
            "captures never fails",
            "assert not recaptured, (",
            "assert True or recaptured, (",
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_captures_fails_a_key_captured_again_in_a_later_round",
            ),
        ),
        (
            "each graph of a key counted as a capture of it",
            "again = counter.keys_captured_again()",
            "again = counter.recaptured_keys()",
            (
                "tests/conformance/test_broken_witness_targets.py::test_a_piecewise_runner_captures_each_key_once_with_a_graph_per_layer",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/test_16_inputs_unchanged.py",
        (
            "inputs held to what they were drawn as",
            "tensor, expected=left[path])",
            "tensor)",
            (
                "tests/conformance/test_check_verdicts_on_cpu.py::test_inputs_unchanged_holds_a_callers_tensors_to_what_eager_leaves_in_them",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/test_22_rebound_tensors.py",
        (
            "every tensor held judged, read by a graph or not",
            "if static is not None or t in alive}",
            "if True}",
            (
                "tests/conformance/test_broken_witness_targets.py::test_clones_no_graph_reads_may_be_replaced_at_will",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/witness.py",
        (
            "a check that saw no capture passes",
            "if judgement.problems or counter.replays:",
            "if True:",
            (
                "tests/conformance/test_broken_witness_targets.py::test_without_a_capture_to_be_had_it_is_not_exercised_and_does_not_pass",
            ),
        ),
        (
            "a capture on demand never looked for",
            "    for where, chance in chances(target, keys, fresh):\n",
            "    for where, chance in []:\n",
            (
                "tests/conformance/test_broken_witness_targets.py::test_it_fails_when_an_earlier_check_captured_its_graphs",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/conftest.py",
        (
            "a permanent fallback reported and the broken target kept",
            "        config.stash[suite.REBUILT] = suite.fresh_target(config, broken.device)\n",
            "        suite.fresh_target(config, broken.device)\n",
            (
                "tests/conformance/test_broken_witness_targets.py::test_a_permanent_fallback_is_reported_naming_the_check_and_the_target_rebuilt",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/reach.py",
        (
            "module globals not walked",
            "        yield from _globals_named(value)\n",
            "",
            (
                "tests/conformance/test_broken_witness_targets.py::test_a_static_buffer_rebound_fails_wherever_the_cache_keeps_it",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/engines/faults.py",
        (
            "a re-entrant lock released once",
            "    while lock_held(lock):\n",
            "    for _ in range(1):\n",
            (
                "tests/conformance/test_judging.py::test_a_reentrant_lock_held_twice_by_this_thread_is_released_fully",
            ),
        ),
    ),
    *_mutants(
        "pytest_cudagraph/conformance/protocol.py",
        (
            "a guard regex matching the empty message accepted",
            'says_nothing = re.search(mode[1], "") is not None',
            "says_nothing = re.compile(mode[1]) is None",
            (
                "tests/conformance/test_protocol.py::test_a_guard_regex_that_matches_the_empty_message_is_refused",
            ),
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
