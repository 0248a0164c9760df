"""The engines import torch and NVML only when used, so a session that never touches the
plugin's features does not pay for them."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

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
