"""The bench folder's order (its conftest's collection hook), on CPU."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from bench_workloads import host_bound_first


def test_host_bound_benchmarks_move_first_and_other_tests_stay_put():
    here = Path(__file__).parent
    names = [
        here.parent / "plugin" / "test_a.py",
        here / "test_bench_ar_forward.py",
        here / "test_bench_plugin_overhead.py",
        here / "test_bench_sampler.py",
        here / "test_bench_replay_efficiency.py",
        here.parent / "plugin" / "test_z.py",
    ]
    items = [SimpleNamespace(path=path) for path in names]
    host_bound_first(items, here)
    assert [item.path.name for item in items] == [
        "test_a.py",
        "test_bench_plugin_overhead.py",
        "test_bench_replay_efficiency.py",
        "test_bench_ar_forward.py",
        "test_bench_sampler.py",
        "test_z.py",
    ]
