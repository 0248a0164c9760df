"""The ``pytest-cudagraph`` command, installed with the plugin.

pytest-cudagraph report results.json [--out report.md]   the Markdown report of a results file
pytest-cudagraph targets                                 the installed conformance targets
pytest-cudagraph checks                                  what each conformance check needs
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    commands = argparse.ArgumentParser(
        prog="pytest-cudagraph", description="Tools of the pytest-cudagraph plugin."
    )
    chosen = commands.add_subparsers(dest="command", required=True, metavar="COMMAND")
    report = chosen.add_parser(
        "report",
        help="render the Markdown report of a --cudagraph-json results file",
        description="Render the Markdown report of a results file written by --cudagraph-json.",
    )
    report.add_argument("results", type=Path, help="the results file (JSON)")
    report.add_argument("--out", type=Path, help="write the report here (default: stdout)")
    chosen.add_parser(
        "targets",
        help="list the installed conformance targets",
        description="List the installed conformance targets, one per line: name, then "
        "module:factory.",
    )
    chosen.add_parser(
        "checks",
        help="list what each conformance check needs of a target",
        description="What each conformance check needs of a target (it skips without it) and "
        "what makes it sharper, as a Markdown table.",
    )
    return commands


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status (2, with a one-line reason, for a results file that
    cannot be read or a report that cannot be written)."""
    args = parser().parse_args(argv)
    if args.command == "targets":
        from pytest_cudagraph.conformance.loading import installed_lines

        print("\n".join(installed_lines()))
        return 0
    if args.command == "checks":
        from pytest_cudagraph.conformance.catalog import check_needs, needs_table

        print("\n".join(needs_table(check_needs())))
        return 0
    from pytest_cudagraph import report_markdown, results

    try:
        document = results.read_document(args.results)
        results.check_document(document, args.results)
    except (OSError, ValueError) as error:
        print(f"pytest-cudagraph report: {error}", file=sys.stderr)
        return 2
    text = report_markdown.render(document)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    except OSError as error:  # a folder, a path under a file, no permission
        print(
            f"pytest-cudagraph report: --out {args.out}: cannot write the report there: "
            f"{error.strerror or error}; give a file path",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
