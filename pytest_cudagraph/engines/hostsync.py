"""no_host_sync: fail a test whose body makes the host wait for the device.

Two detectors. torch's sync debug mode "error" (``host_syncs_fail``) turns the syncs torch
knows about (``.item()``, ``.cpu()``, a data-dependent ``bool(...)``) into exceptions, but
torch says it "does not yet detect all synchronizing operations". A trial capture
(``trial_capture``) runs the body once on a side stream and then captures it into a CUDA
graph that is thrown away: the capture fails on any host sync the driver sees
("operation not permitted when stream is capturing"). torch is imported when used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pytest_cudagraph.engines.devices import cuda_initialized

if TYPE_CHECKING:
    import torch

# The message of the RuntimeError torch raises in sync debug mode "error".
_TORCH_SYNC_ERROR = "called a synchronizing CUDA operation"


class HostSyncError(AssertionError):
    """The block made the host wait for the device; torch's own error is its ``__cause__``.
    An AssertionError, so that a block's ``except RuntimeError`` does not swallow it."""


@contextmanager
def host_syncs_fail(device: torch.device | None = None) -> Iterator[None]:
    """Run the block in sync debug mode "error", turning a synchronizing call into a
    ``HostSyncError``; the previous mode is restored, also on failure.

    On a non-CUDA ``device``, or where torch has no CUDA, there is no device to wait for and
    the block runs as it is.
    """
    import torch

    if (device is not None and device.type != "cuda") or not torch.cuda.is_available():
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    except RuntimeError as error:
        if _TORCH_SYNC_ERROR not in str(error):
            raise
        raise HostSyncError(
            "no_host_sync: the test body synchronized the host with the device, so this code "
            f"is not capture-clean (torch: {error})"
        ) from error
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@contextmanager
def host_syncs_allowed(device: torch.device) -> Iterator[None]:
    """Lift sync debug mode for the plugin's own work (comparing outputs, the eager side)."""
    import torch

    if device.type != "cuda" or not cuda_initialized():
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("default")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@dataclass(frozen=True)
class TrialCapture:
    """What a trial capture found: ``error`` is "" when the body captured cleanly."""

    error: str

    @property
    def clean(self) -> bool:
        return not self.error

    def reason(self) -> str:
        """One line for a failing test ("" when clean)."""
        if self.clean:
            return ""
        return (
            "no_host_sync: the test body cannot be captured in a CUDA graph (a trial capture "
            f"on a side stream failed, as it does on a host sync): {self.error}"
        )


def trial_capture(body: Callable[[], object], device: torch.device) -> TrialCapture:
    """Run ``body`` once eagerly on a side stream (lazy initialisation, library handles),
    then capture it into a CUDA graph that is discarded; report what failed in the capture.

    The body runs twice, so it must be repeatable; its captured kernels never run. The
    RNG state, the current stream and the caching allocator are as before afterwards:
    a failed capture's private memory pool is handed back (torch does not do it itself
    when ``capture_end`` fails). An error in the eager run propagates: that is the body's
    own failure, not a capture problem.
    """
    import torch

    from pytest_cudagraph.engines import emulation

    if not callable(body):
        raise TypeError(f"body must be callable, got {body!r}")
    device = torch.device(device)
    if device.type != "cuda":
        if not emulation.active():
            raise ValueError(f"device must be a CUDA device, or graphs emulated, got {device}")
        return _emulated_trial_capture(body)
    index = torch.cuda.current_device() if device.index is None else device.index
    caller = torch.cuda.current_stream(index)
    side = cast("Callable[[int], torch.cuda.Stream]", torch.cuda.Stream)(index)  # unannotated
    side.wait_stream(caller)
    error = ""
    with torch.random.fork_rng(devices=[index]), torch.cuda.device(index):
        with torch.cuda.stream(side):
            body()
            graph = torch.cuda.CUDAGraph()
            pool = torch.cuda.graph_pool_handle()
            # thread_local: only this thread's unsafe calls fail, not another thread's work.
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                body()
            except Exception as raised:  # the capture's failure, whatever the op raised
                error = f"{type(raised).__name__}: {raised}"
            finally:
                ended = _end_capture(graph, index, pool)
        caller.wait_stream(side)
    del graph
    torch.cuda.synchronize(index)
    return TrialCapture(error or ended)


def _emulated_trial_capture(body: Callable[[], object]) -> TrialCapture:
    """``trial_capture`` of emulated graphs on the CPU: nothing to put back but the RNG."""
    import torch

    with torch.random.fork_rng(devices=[]):
        body()
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(capture_error_mode="thread_local")
        error = ""
        try:
            body()
        except Exception as raised:
            error = f"{type(raised).__name__}: {raised}"
        try:
            graph.capture_end()
        except RuntimeError as raised:
            error = error or f"{type(raised).__name__}: {raised}"
    return TrialCapture(error)


def _end_capture(graph: torch.cuda.CUDAGraph, index: int, pool: tuple[int, int]) -> str:
    """End the capture (on the capture stream); on failure, put torch back as it was: stop
    routing allocations to the pool and release it (torch 2.7 skips the first when
    ``cudaStreamEndCapture`` fails, and no version releases a pool whose capture never
    ended), and take the RNG out of capture mode. The error text, or ""."""
    import torch

    try:
        graph.capture_end()
        return ""
    except RuntimeError as raised:
        error = f"{type(raised).__name__}: {raised}"
    # The newer name, then the older one: every supported torch has one of the two.
    names = ("_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool")
    stop_routing = next(getattr(torch._C, name) for name in names if hasattr(torch._C, name))
    try:
        stop_routing(index, pool)
    except RuntimeError:  # already stopped by capture_end (torch 2.8 and later)
        pass
    torch._C._cuda_releasePool(index, pool)
    # torch 2.7 leaves the device's default generator in capture mode after a failed
    # capture (its next eager random op raises); a capture that completes ends that mode.
    mending = torch.cuda.CUDAGraph()
    mending.capture_begin(capture_error_mode="thread_local")
    torch.zeros(1, device=index)
    mending.capture_end()
    return error
