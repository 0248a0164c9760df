"""The Markdown report of a results document (``--cudagraph-json``), for people.

It reads the document's fields, never the terminal's text: a header (date, plugin version,
commit, stack), how the session ended, then each section's data in the document's order, the
plugin's own sections as lists and tables and any other plugin's section as its JSON. A whole
report opens with ``MARK``, so that ``pytest-cudagraph report --out`` replaces an earlier
report and nothing else. Used by ``pytest-cudagraph report`` and scripts/gpu_report.py.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_cudagraph import reasons, results, sections, settings
from pytest_cudagraph.conformance._suite import TABLE
from pytest_cudagraph.engines.units import GiB
from pytest_cudagraph.markers.cuda_graph_parity import ParityMarker
from pytest_cudagraph.markers.graph_memory_bound import MemoryBoundMarker
from pytest_cudagraph.markers.pinned_stack import PinnedStackMarker

# Outcomes in the order the counts line gives them (passed, failed, skipped always).
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "rerun", "unfinished")
NOT_PASSING = ("failed", "error", "unfinished")
# The first line of every whole report: an HTML comment, which Markdown viewers do not show.
MARK = (
    "<!-- pytest-cudagraph report: rendered from a results file; replaced when rendered again -->"
)


def render(document: Mapping[str, Any], title: str = "cudagraph results") -> str:
    """The whole report: ``MARK``, a title, the header, then the body with sections one level
    down."""
    lines = [MARK, f"# {title}", "", *header_lines(document), "", *body_lines(document, level=2)]
    return "\n".join(lines).rstrip("\n") + "\n"


def header_lines(document: Mapping[str, Any], commit: str | None = None) -> list[str]:
    """What ran where: date, plugin version, commit (``commit`` where the caller knows it
    better than the document), stack, as a list."""
    lines = [
        f"- date: {document['date']}",
        f"- pytest-cudagraph {document['plugin_version']}",
        f"- commit: {commit or commit_text(document.get('commit'))}",
    ]
    stack = document.get("stack")
    if stack:
        gpus = ", ".join(
            f"{gpu['name']} ({gpu['total_bytes'] / GiB:.0f} GiB)" for gpu in stack["gpus"]
        )
        lines += [
            f"- GPUs: {gpus or 'none'}; driver {stack['driver'] or 'none'}",
            f"- python {stack['python']}, torch {stack['torch']}, "
            f"torch CUDA {stack['torch_cuda'] or 'none'}",
        ]
    return lines


def commit_text(commit: Mapping[str, Any] | None) -> str:
    if not commit:
        return "unknown"
    dirty = {True: " (dirty)", False: "", None: " (dirty: unknown)"}[commit["dirty"]]
    return f"{commit['sha']}{dirty}"


def body_lines(document: Mapping[str, Any], level: int) -> list[str]:
    """How the session ended, then every section, with headings of ``level``."""
    lines = [session_line(document.get("session")), ""]
    for name, data in document.items():
        if name in results.DOCUMENT_KEYS or data in (None, [], {}):
            continue
        title, section = SECTIONS.get(name, (name, other_section))
        body = section(data)
        if name == TABLE and ran_without_gpu(document):  # on a GPU, the rows are the account
            body += ["", *cpu_account(data.get("account"))]
        if body:
            lines += [f"{'#' * level} {title}", "", *body, ""]
    return lines


def session_line(session: Mapping[str, Any] | None) -> str:
    if session is None:
        return "Session end: not recorded."
    ended = "complete" if session["complete"] else f"PARTIAL ({session['stopped'] or 'stopped'})"
    return f"Session: {ended}; exit status {session['exit_status']} ({session['exit']})."


def cell(value: object) -> str:
    """A table cell: one line, no column breaks."""
    return " ".join(str(value).split()).replace("|", "\\|")


def reason_item(head: str, reason: str) -> list[str]:
    """A list item: ``head`` and the reason in one line; a reason of several lines follows
    whole, in a block of its own."""
    item = [f"- {head}: {cell(reasons.one_line(reason))}"]
    if not spans_lines(reason):
        return item
    fence = "`" * max(3, 1 + max(map(len, re.findall("`+", reason)), default=0))
    block = [fence + "text", *reason.strip().splitlines(), fence]
    return [*item, "", *(f"  {line}".rstrip() for line in block)]


def spans_lines(reason: str) -> bool:
    return len(reason.strip().splitlines()) > 1


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]


def tests_section(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    counts = Counter(run["outcome"] for run in runs)
    shown = [o for o in OUTCOMES if counts[o] or o in ("passed", "failed", "skipped")]
    others = sorted(set(counts) - set(OUTCOMES))
    lines = [", ".join(f"{counts[outcome]} {outcome}" for outcome in [*shown, *others]), ""]
    failing = [run for run in runs if run["outcome"] in NOT_PASSING]
    if failing:
        lines += ["Not passing:", ""]
        for run in failing:
            head = f"`{run['nodeid']}` {run['outcome']} at {run['when']}"
            lines += reason_item(head, run["reason"])
        lines.append("")
    properties = [(run["nodeid"], *pair) for run in runs for pair in run["properties"]]
    if properties:
        lines += ["Recorded properties:", "", *table(["test", "property", "value"], properties)]
    return lines


def parity_section(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    checked = sum(entry["checked"] for entry in entries)
    passed = sum(entry["passed"] for entry in entries)
    rows = [(f"`{e['nodeid']}`", e["form"], e["checked"], e["passed"]) for e in entries]
    lines = [f"{passed} of {checked} checked cases match.", ""]
    lines += table(["test", "form", "checked", "match"], rows)
    for entry in entries:
        for failure in entry.get("failures", ()):
            lines += ["", f"`{entry['nodeid']}`, {cell(failure['title'])}:", ""]
            lines += [f"- {mismatch_text(m)}" for m in failure["mismatches"]]
    return lines


def mismatch_text(mismatch: Mapping[str, Any]) -> str:
    """``path``, then every other field the engine gave, by name."""
    fields = ", ".join(f"{name} {value}" for name, value in mismatch.items() if name != "path")
    return cell(f"`{mismatch['path']}`: {fields}")


def memory_section(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    header = [
        "test",
        "device",
        "growth MiB",
        "bound MiB",
        "verdict",
        "peak MiB",
        "outside torch MiB",
    ]
    rows = [
        (
            f"`{e['nodeid']}`",
            e["device"],
            f"{e['growth_mib']:+.1f}",
            f"{e['bound_mib']:g}",
            "ok" if e["passed"] else "OVER",
            f"{e['peak_growth_mib']:+.1f}",
            f"{e['outside_torch_growth_mib']:+.1f}",
        )
        for e in entries
    ]
    warnings = [f"- `{e['nodeid']}`: {cell(e['warning'])}" for e in entries if e.get("warning")]
    return table(header, rows) + (["", "Warnings:", "", *warnings] if warnings else [])


def pinned_stack_section(data: Mapping[str, Any]) -> list[str]:
    """What the session pinned, whether the running stack matches it, and so which
    ``pinned_stack`` tests ran: a marker's own components take the place of the session's."""
    pinned = data.get("pinned") or {}
    wanted = ", ".join(f"{name}{specifiers}" for name, specifiers in pinned.items())
    mismatches = "; ".join(data.get("mismatches", []))
    if not wanted:
        ways = settings.PINNED_STACK
        stack = (
            f"No stack is pinned for the session (ini `{ways.ini}`, `{ways.option}` or "
            f"`{ways.env}`)"
        )
        held = (
            "so a `pinned_stack` test ran only where its marker pins components itself and the "
            "running stack matches them; one whose marker pins nothing skipped"
        )
    elif data.get("running_matches"):
        stack = f"The session pins {wanted}, and the running stack matches it"
        held = (
            "so `pinned_stack` tests ran, but where a component their marker pins itself does "
            "not match"
        )
    else:
        stack = f"The session pins {wanted}, and the running stack does not match it ({mismatches})"
        held = (
            "so `pinned_stack` tests skipped, but where the components their marker pins "
            "itself, in place of the session's, make a pin the running stack matches"
        )
    if data.get("stack_mode") == "any":
        held = (
            f"but the stack mode `any` (`{settings.STACK.option}`) ran every `pinned_stack` "
            "test whatever the stack"
        )
    return [f"{stack}, {held}."]


def conformance_section(data: Mapping[str, Any]) -> list[str]:
    """The table, each reason in one line, then every reason of several lines whole."""
    rows = [
        (
            row["check"],
            row["verdict"],
            f"{row['seconds']:.1f}" if row["seconds"] is not None else "-",
            "; ".join(text for text in (row["figure"], reasons.one_line(row["reason"])) if text),
        )
        for row in data["rows"]
    ]
    lines = [
        f"Target `{data['target']}`:",
        "",
        *table(["check", "verdict", "seconds", "figure"], rows),
    ]
    long = [row for row in data["rows"] if spans_lines(row["reason"])]
    if long:
        lines += ["", "Reasons in full:", ""]
        for row in long:
            lines += reason_item(f"{row['check']} ({row['verdict']})", row["reason"])
    return lines


def ran_without_gpu(document: Mapping[str, Any]) -> bool:
    """Whether the run saw no GPU (its stack lists none), so that its CUDA checks skipped."""
    stack = document.get("stack")
    return stack is not None and not stack["gpus"]


def cpu_account(account: Mapping[str, Any] | None) -> list[str]:
    """What a run without a GPU could not judge (``conformance.account``, the dry run's
    record): which of the user's code ran, and which checks would still skip on a GPU and for
    want of what."""
    lines = [
        "Without a GPU:",
        "",
        "- No graph was captured, replayed or judged: a passing row above says only that its "
        "check passed without one.",
    ]
    if account is None:
        return [*lines, "- The dry run did not run: none of your code was called."]
    ran = ", ".join(f"`{name}`" for name in account["ran"])
    not_run = "" if "graphed" in account["ran"] else "; your graphed side did not run"
    lines.append(f"- Of your code, {ran} ran (the dry run){not_run}.")
    gpu_skips = account["gpu_skips"]
    if not gpu_skips:
        return [*lines, "- The target made for the CPU gives what every check needs."]
    lines.append(
        f"- On a GPU, {len(gpu_skips)} check(s) would still skip unless the factory gives there "
        "what the target made for the CPU lacks:"
    )
    return lines + [
        f"  - {cell(check)}: needs {', '.join(f'`{need}`' for need in needs)}"
        for check, needs in gpu_skips.items()
    ]


def skips_section(data: Mapping[str, Any]) -> list[str]:
    if not data["total"]:
        return []
    return [f"- {entry['count']} x {cell(entry['reason'])}" for entry in data["by_reason"]]


def stray_contexts_section(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    strays = [f"- {check['process']}: {stray}" for check in checks for stray in check["strays"]]
    notes = [f"- {check['process']}: {check['note']}" for check in checks if check["note"]]
    found = "on a GPU other than the process's own:" if strays else "none."
    return [f"{len(checks)} process(es) checked; stray contexts {found}", "", *strays, *notes]


def other_section(data: object) -> list[str]:
    """A section this module does not know (another plugin's): its data as JSON."""
    return ["```json", json.dumps(data, indent=2), "```"]


# Section name -> its heading and its renderer.
SECTIONS: dict[str | None, tuple[str, Callable[[Any], list[str]]]] = {
    sections.TESTS.name: ("Tests", tests_section),
    ParityMarker.results_key: ("Parity", parity_section),
    MemoryBoundMarker.results_key: ("Memory growth (NVML, this process)", memory_section),
    PinnedStackMarker.results_key: ("Pinned stack", pinned_stack_section),
    TABLE: ("Conformance", conformance_section),
    sections.SKIPS.name: ("Skips by reason (tests that use the plugin)", skips_section),
    sections.STRAY_CONTEXTS: ("Stray CUDA contexts", stray_contexts_section),
}
