"""Where a graph-cache call's time goes: its kernels by name, and the idle time before each.

    python scripts/replay_profile.py [--keys 1x64 8x64] [--calls 5]

On the current GPU, builds the benchmarks' workload (reasyn_ref.workloads) and a GraphCache,
makes ``--calls`` back-to-back calls at each key under torch.profiler, and prints per key:
device operations per call, their summed time, the span from the first start to the last end
and the ratio of the two; then a row per kernel name (launches per call, mean duration, idle
time before its launches), most idle first. The benchmarks hold the judged figures; this is for
finding what to change. Read the idle times inside the graph: the profiler slows the host, so
the idle time before a call's first operations belongs to the profiled host."""

from __future__ import annotations

import argparse
import sys

from device_profile import Profile, profile_device_ops, summarize


def parse_key(text: str) -> tuple[int, int]:
    """'8x64' -> (8, 64): a (batch, sequence) bucket."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(f"key {text!r} must be BATCHxSEQ with positive integers, e.g. 8x64")
    return int(parts[0]), int(parts[1])


def render(key: tuple[int, int], profile: Profile, name_width: int = 100) -> str:
    lines = [
        f"key {key}: {profile.ops_per_call:.0f} device ops per call, "
        f"{profile.device_us_per_call:.1f} us busy in a span of {profile.span_us_per_call:.1f} us "
        f"(busy/span under the profiler {profile.efficiency:.3f})",
        f"{'per call':>8} {'mean us':>8} {'idle before, us per call':>25}  kernel",
    ]
    for row in profile.rows:
        lines.append(
            f"{row.per_call:8.1f} {row.mean_us:8.2f} {row.idle_before_us_per_call:25.1f}  "
            f"{row.name[:name_width]}"
        )
    return "\n".join(lines)


def profile_key(key: tuple[int, int], calls: int) -> Profile:
    import torch

    from reasyn_ref.graph_cache import GraphCache
    from reasyn_ref.workloads import forward_inputs, make_decoder, warm_up

    device = torch.device("cuda", torch.cuda.current_device())
    decoder = make_decoder(device)
    cache = GraphCache(decoder, device)
    inputs = forward_inputs(decoder.config, key, device)

    def step() -> None:
        cache(inputs)

    warm_up(step)  # the first call captures
    ops = profile_device_ops(step, calls)
    cache.clear()
    return summarize(ops, calls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", nargs="+", default=["1x64", "8x64"], help="BATCHxSEQ buckets")
    parser.add_argument("--calls", type=int, default=5, help="back-to-back calls profiled")
    args = parser.parse_args(argv)
    try:
        keys = [parse_key(text) for text in args.keys]
    except ValueError as error:
        parser.error(str(error))
    if args.calls < 1:
        parser.error(f"--calls must be >= 1, got {args.calls}")
    import torch

    if not torch.cuda.is_available():
        print("replay_profile: needs CUDA (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    for key in keys:
        print(render(key, profile_key(key, args.calls)), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
