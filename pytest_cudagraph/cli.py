"""The ``pytest-cudagraph`` command, installed with the plugin.

pytest-cudagraph report results.json [--out report.md]   the Markdown report of a results file
pytest-cudagraph targets                                 the installed conformance targets
pytest-cudagraph checks                                  what each conformance check needs
pytest-cudagraph --version                               the plugin's version

``report --out`` replaces nothing but an earlier report, told by its first line
(``report_markdown.MARK``): never the results file it renders, through a link or under
another name, for that file is the only record of a GPU run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_cudagraph import __version__


def parser() -> argparse.ArgumentParser:
    commands = argparse.ArgumentParser(
        prog="pytest-cudagraph", description="Tools of the pytest-cudagraph plugin."
    )
    commands.add_argument("--version", action="version", version=f"pytest-cudagraph {__version__}")
    chosen = commands.add_subparsers(dest="command", required=True, metavar="COMMAND")
    report = chosen.add_parser(
        "report",
        help="render the Markdown report of a --cudagraph-json results file",
        description="Render the Markdown report of a results file written by --cudagraph-json.",
    )
    report.add_argument("results", type=Path, help="the results file (JSON)")
    report.add_argument(
        "--out",
        type=Path,
        help="write the report here (default: stdout); an existing file is replaced only if "
        "it is an earlier report",
    )
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
    cannot be read, an ``--out`` the report may not replace, or a report that cannot be
    written)."""
    args = parser().parse_args(argv)
    if args.command == "targets":
        from pytest_cudagraph.conformance._loading import installed_lines

        print("\n".join(installed_lines()))
        return 0
    if args.command == "checks":
        from pytest_cudagraph.conformance._catalog import declared_checks, needs_table

        print("\n".join(needs_table(declared_checks())))
        return 0
    from pytest_cudagraph import report_markdown, results

    try:
        document = results.read_document(args.results)
        results.check_document(document, args.results)
    except (OSError, ValueError) as error:
        print(f"pytest-cudagraph report: {error}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write(report_markdown.render(document))
        return 0
    try:
        check_out(args.out, args.results)
        # Through a link, to the file its readers open.
        results.write_atomically(args.out.resolve(), report_markdown.render(document))
    except ValueError as error:
        print(f"pytest-cudagraph report: --out {args.out}: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a path under a file, no permission
        print(
            f"pytest-cudagraph report: --out {args.out}: cannot write the report there: "
            f"{error.strerror or error}; give a file path",
            file=sys.stderr,
        )
        return 2
    return 0


def check_out(out: Path, source: Path) -> None:
    """ValueError naming the rule unless ``out`` is free (under a folder, or none yet) or holds
    an earlier report (its first line ``report_markdown.MARK``): never ``source``, the results
    file rendered, by a link or another name, nor a file of the user's, a folder or a special
    file."""
    from pytest_cudagraph.report_markdown import MARK

    if out.resolve() == source.resolve() or (out.exists() and os.path.samefile(out, source)):
        raise ValueError(
            f"is the results file it renders ({source}), and the report never replaces its "
            "results: give another path, such as report.md"
        )
    if not out.exists():
        folder = next(parent for parent in out.absolute().parents if parent.exists())
        if not folder.is_dir():
            raise ValueError(f"is under {folder}, a file, not a folder: give a file path")
        return
    if out.is_dir():
        raise ValueError(f"is a folder: give a file path, such as {out / 'report.md'}")
    if not out.is_file():  # a FIFO would block the read below
        raise ValueError("is not a regular file: give the path of a new file")
    mark = MARK.encode() + b"\n"
    with out.open("rb") as file:
        opening = file.read(len(mark))
    if opening != mark:
        raise ValueError(
            "holds a file that is not a report of pytest-cudagraph (a report opens with the "
            f"line {MARK}), and only an earlier report is ever replaced: give the path of a "
            "new file, or move this one away"
        )


if __name__ == "__main__":
    sys.exit(main())
