"""What a target's own code takes to build, compile and capture its graph, timed in a fresh
process: the baseline test_bench_compiled_example.py sets the conformance suite against.

    python tests/bench/compile_and_capture.py MODULE:FACTORY [--emulate]

It builds the target on the GPU (``--emulate``: on the CPU, its graphs emulated there) and calls
its graphed side on its first key's first case until a graph has replayed, then prints one JSON
line: ``seconds`` (the factory's call to the end of the replaying call), ``calls``,
``captures``, ``replays``, and ``startup_s`` (the interpreter's start to the clock's).
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
from contextlib import ExitStack  # noqa: E402

import torch  # noqa: E402

from pytest_cudagraph.conformance import Case  # noqa: E402
from pytest_cudagraph.engines.captures import CaptureCounter  # noqa: E402

# cudagraph trees warm up on a shape's first call, record on its second and replay from its
# third; a few more calls than that before a target is taken never to replay.
MAX_CALLS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="MODULE:FACTORY, as --cudagraph-target takes it")
    parser.add_argument("--emulate", action="store_true", help="on the CPU, graphs emulated")
    args = parser.parse_args()
    module_name, _, factory_name = args.target.partition(":")
    factory = getattr(importlib.import_module(module_name), factory_name)
    with ExitStack() as stack:
        if args.emulate:
            from pytest_cudagraph.engines.emulation import emulated_graphs

            stack.enter_context(emulated_graphs())
        device = torch.device("cpu" if args.emulate else "cuda")
        # The suite's time as pytest counts it starts with torch and the target's module
        # imported and the factory not yet called (test_bench_compiled_example.py holds that):
        # so does this clock. CUDA's start, the build, inductor and the capture fall inside both.
        clock = time.perf_counter()
        with CaptureCounter() as counter:
            calls = make_and_call_until_replay(factory, device, counter)
        seconds = time.perf_counter() - clock
    report = {
        "seconds": seconds,
        "startup_s": clock - STARTED,
        "calls": calls,
        "captures": len(counter.captures),
        "replays": counter.all_replays,
    }
    print(json.dumps(report))


def make_and_call_until_replay(factory, device: torch.device, counter: CaptureCounter) -> int:
    """Build the target and call its graphed side until a graph replays; the number of calls.
    RuntimeError when none has replayed after MAX_CALLS calls."""
    target = factory(device)
    key = target.keys[0]
    inputs = target.draw(torch.Generator(device).manual_seed(0), Case(number=0, key=key, repeat=0))
    for call in range(1, MAX_CALLS + 1):
        target.graphed(inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the replay's device work, inside the clock
        if counter.all_replays:
            return call
    raise RuntimeError(f"{MAX_CALLS} calls of the graphed side and no graph replayed")


if __name__ == "__main__":
    main()
