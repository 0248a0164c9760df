"""Guards: every unsupported mode the target names is refused with a clear error: one of the
target's ``refusal_errors`` (ValueError, TypeError or RuntimeError unless it says otherwise, e.g.
AssertionError for guards written as asserts) whose message says what is unmet (an empty
message says nothing). Each mode runs on a thread of its own, on the target's device, and one
that has not returned in 60 s fails (a guard refuses at once). Runs on the CPU too."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

import torch

from pytest_cudagraph.conformance._catalog import check
from pytest_cudagraph.conformance._protocol import CudaGraphTarget, Guards
from pytest_cudagraph.conformance._suite import Conclude
from pytest_cudagraph.conformance._verdict import Judgement

MODE_SECONDS = 60  # how long a mode may run before it counts as hanging


@check("guards", needs=("guards",), runs_on="cpu")
def test_guards(target: CudaGraphTarget, guards: Guards, conclude: Conclude) -> None:
    modes, refusals = guards.modes, guards.refusal_errors
    problems = []
    for name, (call, pattern) in modes.items():
        finished, error = run_bounded(call, target.device)
        if not finished:
            problems.append(f"{name}: still running after {MODE_SECONDS} s (left running)")
        elif error is None:
            problems.append(f"{name}: accepted")
        elif not isinstance(error, refusals):
            declared = ", ".join(error.__name__ for error in refusals)
            problems.append(
                f"{name}: {type(error).__name__}({str(error)!r}) is not one of the target's "
                f"refusal_errors ({declared})"
            )
        elif not str(error).strip():
            problems.append(f"{name}: {type(error).__name__}() refused with an empty message")
        elif not re.search(pattern, str(error)):
            problems.append(
                f"{name}: {type(error).__name__}({str(error)!r}) does not say {pattern!r}"
            )
    figure = f"{len(modes) - len(problems)} of {len(modes)} unsupported modes refused clearly"
    conclude(Judgement(problems, figure, len(modes), "modes"), "unsupported modes not refused:")


def run_bounded(call: Callable[[], object], device: torch.device) -> tuple[bool, Exception | None]:
    """``call()`` on a thread of its own with ``device`` current: (whether it returned within
    ``MODE_SECONDS``, what it raised)."""
    raised: list[Exception] = []

    def run() -> None:
        try:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            call()
        except Exception as error:
            raised.append(error)

    worker = threading.Thread(target=run, name="cudagraph-guard-mode", daemon=True)
    worker.start()
    worker.join(MODE_SECONDS)
    return not worker.is_alive(), raised[0] if raised else None
