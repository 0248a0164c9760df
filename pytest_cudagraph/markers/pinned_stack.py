"""pinned_stack: the marker, the collection-time skip and the header line.

The pinned stack is the session's ``--cudagraph-pinned-stack`` (ini ``cudagraph_pinned_stack``);
a marker's keywords override it per component. Comparing versions is pytest_cudagraph.engines.stack's.
"""

from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet

from pytest_cudagraph import settings
from pytest_cudagraph.engines import stack
from pytest_cudagraph.markers import MarkerFeature


def pinned_stack(
    *, python: str | None = None, torch: str | None = None, cuda: str | None = None
) -> dict[str, SpecifierSet]:
    """Skip unless the running stack matches the pinned one (ini cudagraph_pinned_stack);
    PEP 440 specifiers given here override it per component."""
    given = {"python": python, "torch": torch, "cuda": cuda}
    return {
        name: stack.parse_specifiers(name, text) for name, text in given.items() if text is not None
    }


class PinnedStackMarker(MarkerFeature):
    function = staticmethod(pinned_stack)
    results_key = "pinned_stack"

    def __init__(self, config: pytest.Config) -> None:
        super().__init__(config)
        self.collected_count = 0

    def collected(self, item: pytest.Item, mark: dict[str, SpecifierSet]) -> None:
        self.collected_count += 1
        if self.settings.value(settings.STACK) == "any":
            return
        pinned = {**self.settings.value(settings.PINNED_STACK), **mark}
        found = stack.mismatches(pinned, stack.running_stack())
        if found:
            # A skip mark, so the skip is reported at the test's own location.
            item.add_marker(pytest.mark.skip(reason=stack.skip_reason(found)))

    def header_lines(self) -> list[str]:
        """Said only where pinned_stack tests were collected."""
        if not self.collected_count:
            return []
        pinned = self.settings.value(settings.PINNED_STACK)
        wanted = ", ".join(f"{name}{specifiers}" for name, specifiers in pinned.items())
        found = stack.mismatches(pinned, stack.running_stack())
        tests = f"{self.collected_count} pinned_stack test(s) are meant for {wanted}"
        if self.settings.value(settings.STACK) == "any":
            return [f"cudagraph: {tests}; they run anyway (--cudagraph-stack any)"]
        if found:
            return [f"cudagraph: {tests}; this is not it ({'; '.join(found)}), so they skip"]
        return [f"cudagraph: {tests}; this is it, so they run"]

    def section_data(self, records: object) -> dict[str, object]:
        """The session's pinned stack and whether the running stack matches it."""
        pinned = self.settings.value(settings.PINNED_STACK)
        found = stack.mismatches(pinned, stack.running_stack())
        return {
            "pinned": {component: str(specifiers) for component, specifiers in pinned.items()},
            "running_matches": not found,
            "mismatches": found,
        }
