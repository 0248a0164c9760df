"""pinned_stack: the marker, the collection-time skip and the header line.

The pinned stack is the session's ``--cudagraph-pinned-stack`` (ini ``cudagraph_pinned_stack``;
nothing by default); a marker's keywords override it per component. A test with nothing pinned
at all skips, saying how to pin it. Comparing versions is pytest_cudagraph.engines.stack's.
"""

from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet

from pytest_cudagraph import settings
from pytest_cudagraph.engines import stack
from pytest_cudagraph.markers import MarkerFeature

HOW_TO_PIN = (
    "name it in the ini (cudagraph_pinned_stack = python~=3.10.0 torch~=2.7.0), with "
    "--cudagraph-pinned-stack or PYTEST_CUDAGRAPH_PINNED_STACK, or on the marker "
    "(pinned_stack(torch='~=2.7.0'))"
)
NOTHING_PINNED = "pinned_stack: no pinned stack is configured; " + HOW_TO_PIN


def pinned_stack(
    *, python: str | None = None, torch: str | None = None, cuda: str | None = None
) -> dict[str, SpecifierSet]:
    """Skip unless the running stack matches the pinned one (ini cudagraph_pinned_stack);
    PEP 440 specifiers given here override it per component."""
    given = {"python": python, "torch": torch, "cuda": cuda}
    return {
        name: stack.parse_specifiers(name, text) for name, text in given.items() if text is not None
    }


class PinnedStackMarker(MarkerFeature[dict[str, SpecifierSet]]):
    function = staticmethod(pinned_stack)
    results_key = "pinned_stack"

    def __init__(self, config: pytest.Config) -> None:
        super().__init__(config)
        self.collected_count = 0
        self.skipped_count = 0
        self.own_pin_count = 0  # tests whose marker names a component itself

    def collected(self, item: pytest.Item, mark: dict[str, SpecifierSet]) -> None:
        self.collected_count += 1
        self.own_pin_count += bool(mark)
        if self.settings.value(settings.STACK) == "any":
            return
        pinned = self.settings.value(settings.PINNED_STACK) | mark
        if pinned:
            found = stack.mismatches(pinned, stack.running_stack())
            reason = stack.skip_reason(found) if found else None
        else:
            reason = NOTHING_PINNED
        if reason is not None:
            self.skipped_count += 1
            # A skip mark, so the skip is reported at the test's own location.
            item.add_marker(pytest.mark.skip(reason=reason))

    def header_lines(self) -> list[str]:
        """Said only where pinned_stack tests were collected: the session's pin, and how many
        of them run and skip."""
        if not self.collected_count:
            return []
        pinned = self.settings.value(settings.PINNED_STACK)
        tests = f"cudagraph: {self.collected_count} pinned_stack test(s)"
        if pinned:
            wanted = ", ".join(f"{name}{specifiers}" for name, specifiers in pinned.items())
            found = stack.mismatches(pinned, stack.running_stack())
            this = f"this is not it ({'; '.join(found)})" if found else "this is it"
            line = f"{tests} are meant for {wanted}; {this}"
        else:
            line = f"{tests}, but no pinned stack is configured ({HOW_TO_PIN})"
        if self.settings.value(settings.STACK) == "any":
            return [f"{line}; they run anyway (--cudagraph-stack any)"]
        ran = self.collected_count - self.skipped_count
        if not self.skipped_count:
            line += ", so they run"
        elif not ran:
            line += ", so they skip"
        else:
            line += f", so {ran} run and {self.skipped_count} skip"
        if self.own_pin_count:
            line += f" ({self.own_pin_count} with a pin of their own)"
        return [line]

    def section_data(self, records: object) -> dict[str, object]:
        """The session's pinned stack, whether the running stack matches it, and the stack
        mode (``any`` runs every pinned_stack test whatever the stack)."""
        pinned = self.settings.value(settings.PINNED_STACK)
        found = stack.mismatches(pinned, stack.running_stack())
        return {
            "pinned": {component: str(specifiers) for component, specifiers in pinned.items()},
            "running_matches": not found,
            "mismatches": found,
            "stack_mode": self.settings.value(settings.STACK),
        }
