"""Where a long conformance check is: its name and the key (or shape) it is on.

A check over many keys (parity, bounded memory: a capture per key on a GPU, a compilation per
key under torch.compile) can run for tens of seconds; once it has run a few seconds it says where
it is, now and then, so that a slow run can be told from a hung one. Quiet under ``-q``, and in
xdist workers, whose output the controller does not show.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext

import pytest

from pytest_cudagraph import results
from pytest_cudagraph.conformance import _suite

QUIET_S = 3.0  # a check says nothing for its first seconds
EVERY_S = 5.0  # then at most once in this many seconds


class CheckProgress:
    """``progress(where)`` writes ``cudagraph: CHECK: WHERE (N s)`` once the check has run
    ``quiet_s`` seconds, then at most every ``every_s`` seconds; with ``write`` None, never."""

    def __init__(
        self,
        check: str,
        write: Callable[[str], None] | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        quiet_s: float = QUIET_S,
        every_s: float = EVERY_S,
    ) -> None:
        self.check = check
        self.write = write
        self.clock = clock
        self.started = clock()
        self.next_at = self.started + quiet_s
        self.every_s = every_s

    def __call__(self, where: str) -> None:
        if self.write is None:
            return
        now = self.clock()
        if now < self.next_at:
            return
        self.next_at = now + self.every_s
        self.write(f"cudagraph: {self.check}: {where} ({now - self.started:.0f} s)")


def check_progress(
    request: pytest.FixtureRequest, *, quiet_s: float = QUIET_S, every_s: float = EVERY_S
) -> CheckProgress:
    """The progress of the check that ``request`` runs, written to the terminal, under the
    check's name in the conformance table."""
    item = request.node
    check = str(dict(results.plugin_values(item.user_properties)).get(_suite.CHECK, item.name))
    return CheckProgress(
        check, terminal_line_writer(request.config), quiet_s=quiet_s, every_s=every_s
    )


def terminal_line_writer(config: pytest.Config) -> Callable[[str], None] | None:
    """Writes a line to the terminal while a test runs (past output capturing); None under
    ``-q``, in an xdist worker, or without a terminal reporter."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.getoption("verbose") < 0 or hasattr(config, "workerinput"):
        return None
    capture = config.pluginmanager.get_plugin("capturemanager")

    def write(line: str) -> None:
        with capture.global_and_fixture_disabled() if capture is not None else nullcontext():
            reporter.write_line(line)

    return write
