"""Benchmark storage kept per stack: one folder per (Python, torch, CUDA, GPU).

pytest-benchmark names its storage subfolder after the OS and Python only, so runs on other
GPUs or torch builds would be compared with each other. Here the default storage becomes
``.benchmarks/<stack-id>``, and the committed baseline of a stack lives in
``benchmarks/baseline/<stack-id>/``.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

import torch

# pytest-benchmark's default --benchmark-storage.
DEFAULT_STORAGE = "file://./.benchmarks"
BASELINE_ROOT = Path("benchmarks") / "baseline"


def stack_id() -> str:
    """e.g. ``py3.12-torch2.11.0+cu130-cuda13.0-NVIDIA-H200`` (the GPU is cuda:0's), or
    ``py3.11-torch2.13.0+cpu-nogpu`` without CUDA."""
    parts = ["py" + ".".join(platform.python_version_tuple()[:2]), f"torch{torch.__version__}"]
    if torch.cuda.is_available():
        parts += [f"cuda{torch.version.cuda}", torch.cuda.get_device_name(0)]
    else:
        parts.append("nogpu")
    return "-".join(re.sub(r"[^A-Za-z0-9.+_-]+", "-", part).strip("-") for part in parts)


def per_stack_storage(storage: str, stack: str) -> str:
    """The storage for this run: pytest-benchmark's default gets a per-stack folder; a
    storage given on the command line is the user's choice and is kept as it is."""
    return f"{DEFAULT_STORAGE}/{stack}" if storage == DEFAULT_STORAGE else storage


def baseline_file(rootdir: Path, stack: str) -> Path:
    """This stack's committed baseline JSON (the last by name if there are several);
    ValueError, saying how to record one, when there is none."""
    folder = rootdir / BASELINE_ROOT / stack
    found = sorted(folder.glob("*.json"), key=lambda path: path.name)
    if not found:
        relative = BASELINE_ROOT / stack
        raise ValueError(
            f"no benchmark baseline for stack {stack}: {folder} holds no JSON. Record one on "
            f"that stack with `mkdir -p {relative} && pytest tests/bench --benchmark-only "
            f"--benchmark-json={relative}/baseline.json` and commit it"
        )
    return found[-1]


if __name__ == "__main__":  # `python tests/bench/bench_storage.py` prints this stack's id
    print(stack_id())
