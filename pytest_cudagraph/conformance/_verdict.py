"""What a check found, in one shape: its problems, the figure behind them and how much it judged,
so that every check ends alike (``_suite.Conclude``) and none passes having judged nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

# A failing check lists at most this many of its problems.
SHOWN_PROBLEMS = 10


@dataclass(frozen=True)
class Judgement:
    """What a check's calls found: its problems (none: it passes), the figure behind them, and
    how many things it judged (``judged`` of ``unit``: "calls compared", "input tensors held"):
    zero judged is not a pass."""

    problems: list[str]
    figure: str
    judged: int
    unit: str
    values: dict[str, float] = field(default_factory=dict)

    def failure(self, headline: str) -> str | None:
        """Why the check fails, for people ("" when it passes): its problems under
        ``headline``, or that it judged nothing."""
        if self.problems:
            shown = self.problems[:SHOWN_PROBLEMS]
            more = len(self.problems) - len(shown)
            return "\n".join([headline, *shown, *([f"... and {more} more"] if more else [])])
        if not self.judged:
            return (
                f"not exercised: this check judged 0 {self.unit} ({self.figure}); a check that "
                "judged nothing does not pass"
            )
        return None
