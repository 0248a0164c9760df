"""Guards: every unsupported mode the target names is refused with a clear error: one of the
target's ``refusal_errors`` (ValueError, TypeError or RuntimeError unless it says otherwise, e.g.
AssertionError for guards written as asserts) whose message says what is unmet. Runs on the CPU
too."""

from __future__ import annotations

import re

from pytest_cudagraph.conformance.catalog import needed
from pytest_cudagraph.conformance.protocol import CudaGraphTarget, Guards
from pytest_cudagraph.conformance.suite import FigureRecorder


def test_guards(target: CudaGraphTarget, record_figure: FigureRecorder) -> None:
    guards = needed(target, Guards)
    modes, refusals = guards.modes, guards.refusal_errors
    problems = []
    for name, (call, pattern) in modes.items():
        try:
            call()
        except refusals as error:
            if not re.search(pattern, str(error)):
                problems.append(
                    f"{name}: {type(error).__name__}({str(error)!r}) does not say {pattern!r}"
                )
        except Exception as error:
            declared = ", ".join(error.__name__ for error in refusals)
            problems.append(
                f"{name}: {type(error).__name__}({str(error)!r}) is not one of the target's "
                f"refusal_errors ({declared})"
            )
        else:
            problems.append(f"{name}: accepted")
    record_figure(f"{len(modes) - len(problems)} of {len(modes)} unsupported modes refused clearly")
    assert not problems, "\n".join(problems)
