"""Root conftest: pytester for the plugin's own tests, and benchmarks off unless asked for."""

import pytest

pytest_plugins = ["pytester"]


def pytest_configure(config: pytest.Config) -> None:
    # Benchmarks run only with --benchmark-enable (tox -e bench, scripts/gpu_suite.sh); as
    # plain tests otherwise. Set here rather than in addopts, where the option would be an
    # error for a checkout without the test extra (no pytest-benchmark).
    if config.pluginmanager.hasplugin("benchmark"):
        config.option.benchmark_disable = True
