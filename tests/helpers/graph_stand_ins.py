"""A stand-in of torch.cuda.CUDAGraph for the CPU tests of the checks: the same method names,
so that the engines patching that class (CaptureCounter, GraphFaults) patch this one instead."""

from __future__ import annotations


class StandInGraph:
    """torch.cuda.CUDAGraph's shape: a replay needs a completed capture, reset drops it."""

    def __init__(self) -> None:
        self.captured = False

    def capture_begin(self, *args: object, **kwargs: object) -> None:
        pass

    def capture_end(self) -> None:
        self.captured = True

    def replay(self) -> None:
        if not self.captured:
            raise RuntimeError("replay without a preceding successful capture")

    def reset(self) -> None:
        self.captured = False
