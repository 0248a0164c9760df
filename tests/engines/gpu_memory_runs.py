"""GPU runs of the memory engine in a fresh process, for test_gpu_engines.py and by hand.

python tests/engines/gpu_memory_runs.py order --before none|other --warmup yes|no
    measures a small graph cache building three graphs, alone or after unrelated
    first-use work, with or without a warm-up before the baseline; prints the figures
    as one JSON line
python tests/engines/gpu_memory_runs.py timing
    times the parts of one settled reading (gc, synchronize, empty_cache, NVML), medians
    of 20, after importing what a compile-heavy session imports
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch

from pytest_cudagraph.engines.memory import DeviceMemoryProbe, stable_reading
from pytest_cudagraph.engines.units import MiB

KEYS = (8, 32, 128)
WIDTH, HIDDEN = 1024, 4096


class SmallGraphCache:
    """A graph per batch size for a bf16 MLP; one side stream, a private pool per graph."""

    def __init__(self, device: torch.device) -> None:
        generator = torch.Generator(device=device).manual_seed(0)
        self.device = device
        self.w1 = torch.randn(WIDTH, HIDDEN, device=device, generator=generator).bfloat16()
        self.w2 = torch.randn(HIDDEN, WIDTH, device=device, generator=generator).bfloat16()
        self.side = torch.cuda.Stream(device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w1) @ self.w2

    def build(self, batch: int) -> None:
        static_in = torch.zeros(batch, WIDTH, device=self.device, dtype=torch.bfloat16)
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.side):
            for _ in range(3):
                self.eager(static_in)
        torch.cuda.current_stream(self.device).wait_stream(self.side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.side):
            static_out = self.eager(static_in)
        self.graphs[batch] = (graph, static_in, static_out)

    def build_all(self) -> None:
        for batch in KEYS:
            self.build(batch)

    def reset(self) -> None:
        torch.cuda.synchronize(self.device)
        for graph, _, _ in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        torch.cuda.empty_cache()


def other_first_use_work(device: torch.device) -> None:
    """Unrelated work that pays one-off costs: other GEMM dtypes and shapes, cuDNN, another
    graph on another stream, a large allocation given back."""
    a = torch.randn(777, 333, device=device)
    (a @ a.T).sum()
    (a.half() @ a.T.half()).float().sum()
    image = torch.randn(4, 3, 64, 64, device=device)
    torch.nn.functional.conv2d(image, torch.randn(8, 3, 3, 3, device=device)).sum()
    other = SmallGraphCache(device)
    other.build(16)
    other.reset()
    block = torch.empty(512 * MiB, dtype=torch.uint8, device=device)
    del block
    torch.cuda.synchronize(device)


def measure_order(before: str, warmup: bool) -> dict[str, object]:
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    if before == "other":
        other_first_use_work(device)
    cache = SmallGraphCache(device)

    def build_and_drop() -> None:
        cache.build_all()
        cache.reset()

    probe = DeviceMemoryProbe(device)
    with probe.measure(build_and_drop if warmup else None) as measurement:
        cache.build_all()
    figures = measurement.report.figures()
    return {"before": before, "warmup": warmup, **figures}


def time_reading() -> dict[str, float]:
    # A compile-heavy session has these modules' objects for gc to scan.
    import torch._dynamo
    import torch._inductor.compile_fx

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    probe = DeviceMemoryProbe(device)
    parts: dict[str, list[float]] = {
        "gc_collect": [],
        "synchronize": [],
        "empty_cache": [],
        "nvml_stable": [],
        "sample": [],
    }
    steps = {
        "gc_collect": gc.collect,
        "synchronize": lambda: torch.cuda.synchronize(device),
        "empty_cache": torch.cuda.empty_cache,
        "nvml_stable": lambda: stable_reading(probe.process_bytes),
        "sample": probe.sample,
    }
    for _ in range(20):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            parts[name].append(time.perf_counter() - start)
    result = {f"{name}_ms": statistics.median(times) * 1000 for name, times in parts.items()}
    result["tracked_objects"] = len(gc.get_objects())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    order = commands.add_parser("order")
    order.add_argument("--before", choices=["none", "other"], required=True)
    order.add_argument("--warmup", choices=["yes", "no"], required=True)
    commands.add_parser("timing")
    arguments = parser.parse_args()
    if arguments.command == "order":
        print(json.dumps(measure_order(arguments.before, arguments.warmup == "yes")))
    else:
        print(json.dumps(time_reading()))


if __name__ == "__main__":
    main()
