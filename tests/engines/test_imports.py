"""The engines import torch and NVML only when used, so a session that never touches the
plugin's features does not pay for them."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest_cudagraph.engines

ENGINES = [module.name for module in pkgutil.iter_modules(pytest_cudagraph.engines.__path__)]


def test_importing_the_engines_loads_neither_torch_nor_nvml() -> None:
    assert len(ENGINES) >= 8, ENGINES
    imports = "; ".join(f"import pytest_cudagraph.engines.{name}" for name in ENGINES)
    check = "import sys; print(sorted({'torch', 'pynvml'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", f"{imports}; {check}"], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_no_engine_imports_pytest() -> None:
    """The engines are pytest-free: the markers turn their verdicts into test failures."""
    found = []
    for name in ENGINES:
        source = Path(pytest_cudagraph.engines.__path__[0], f"{name}.py").read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            found += [f"{name}: {module}" for module in modules if module.split(".")[0] == "pytest"]
    assert found == []
