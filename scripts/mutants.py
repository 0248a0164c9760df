"""Mutation testing: deliberate bugs, one at a time, against the CPU tests that must catch each.

    python scripts/mutants.py [--jobs N] [--only NAME ...] [--list]

The bugs are in scripts/mutants.toml, each keyed by where it lives: a function of a file
(``path::name``, ``path::Class.method``, ``path::outer.inner``, or a module-level name), a
piece of code in it and what replaces it. The piece must occur there exactly once; a space in it
matches any run of whitespace, so a rule that moves or is reformatted keeps its bug, and a rule
that is gone fails naming its function and piece. Each bug is applied in a scratch copy of the
tree and its own tests run there (first once unchanged: only tests that pass without it kill
it). Exit 1 when a bug survives, no longer matches, or its tests fail unchanged; the summary
gives the score (tests/README.md keeps the last one).
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency on 3.10
    import tomli as tomllib

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
TABLE = SCRIPTS / "mutants.toml"
FIELDS = {"pattern", "new", "tests"}  # and "equivalent", for an equivalent mutant
# What a scratch copy leaves out: version control, environments and caches, and the reports.
NOT_COPIED = {".git", ".venv", ".tox", "__pycache__", "reports", ".benchmarks"}
TIMEOUT_S = 300  # a mutant that hangs its tests this long counts as killed
# Imported once per scratch tree, before any run: the start-up every run would pay again.
PRELOAD = ("torch", "numpy")
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


@dataclass(frozen=True)
class Mutant:
    """A bug: ``pattern`` replaced by ``new`` inside ``where`` (``path::qualified name``, the
    path relative to the tree), caught by ``tests`` (pytest node ids, relative to the tree).
    ``new``'s second and later lines are written relative to the indentation of the line where
    the pattern starts. ``equivalent`` says why no behaviour can tell the bug from the code,
    for one kept to show that rule is covered elsewhere: it is matched, not run nor scored."""

    name: str
    where: str
    pattern: str
    new: str
    tests: tuple[str, ...]
    equivalent: str = ""

    @property
    def path(self) -> str:
        return self.where.partition("::")[0]

    def apply(self, source: str) -> str:
        """``source`` with the bug; ValueError naming the function and the pattern when the
        function is gone or the pattern does not occur in it exactly once."""
        start, end = span(source, self.where.partition("::")[2], self.name, self.path)
        regex = re.compile(r"\s+".join(re.escape(word) for word in self.pattern.split()))
        found = list(regex.finditer(source, start, end))
        if len(found) != 1:
            raise ValueError(
                f"{self.name}: {self.pattern!r} occurs {len(found)} times in {self.where}, not once"
            )
        match = found[0]
        line_start = source.rfind("\n", 0, match.start()) + 1
        indent = re.match(r"[ \t]*", source[line_start:]).group()
        new = self.new.replace("\n", "\n" + indent)
        mutated = source[: match.start()] + new + source[match.end() :]
        try:
            ast.parse(mutated)
        except SyntaxError as error:
            raise ValueError(
                f"{self.name}: the mutated {self.path} does not parse: {error}"
            ) from None
        return mutated


def span(source: str, qualified: str, name: str, path: str) -> tuple[int, int]:
    """Where the definition ``qualified`` (dotted: classes, functions, a module-level name)
    lies in ``source``, decorators included, as character offsets."""
    node: ast.AST = parsed(source)
    for part in qualified.split("."):
        found = [child for child in definitions(node) if part in defined_names(child)]
        if len(found) != 1:
            what = "no" if not found else f"{len(found)} definitions of"
            raise ValueError(f"{name}: {path} has {what} {qualified}")
        node = found[0]
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
    lines = source.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: first - 1])
    return start, start + sum(len(line) for line in lines[first - 1 : node.end_lineno])


@functools.lru_cache(maxsize=8)
def parsed(source: str) -> ast.Module:
    """``source`` parsed once for all the mutants of its file."""
    return ast.parse(source)


def definitions(node: ast.AST, in_function: bool = False) -> Iterable[ast.AST]:
    """The definitions in ``node``'s body, under if, with, try and loops too, not inside
    other definitions (a function's assignments are not definitions: its variables)."""
    in_function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Assign, ast.AnnAssign)) and in_function:
            continue
        if isinstance(child, DEFINITIONS):
            yield child
        elif isinstance(child, ast.stmt):
            yield from definitions(child, in_function)


def defined_names(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Assign):
        return {target.id for target in node.targets if isinstance(target, ast.Name)}
    if isinstance(node, ast.AnnAssign):
        return {node.target.id} if isinstance(node.target, ast.Name) else set()
    return {node.name}  # type: ignore[attr-defined]


def load(table: Path = TABLE) -> list[Mutant]:
    """The mutants of ``table``: ``["path::name"."what the bug does"]`` tables of ``pattern``,
    ``new``, ``tests`` and, for an equivalent mutant, ``equivalent`` (the reason)."""
    mutants = []
    for where, bugs in tomllib.loads(table.read_text()).items():
        for name, fields in bugs.items():
            if not FIELDS <= fields.keys() <= {*FIELDS, "equivalent"}:
                raise ValueError(f"{table.name}: {where} {name!r} has the fields {sorted(fields)}")
            mutants.append(Mutant(name, where, **{**fields, "tests": tuple(fields["tests"])}))
    return mutants


# Running them


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    verdict: str  # "killed", "survived", "error" or "equivalent"
    seconds: float
    detail: str = ""


def scratch_copy(root: Path, into: Path) -> Path:
    """The tree under ``root`` (all but NOT_COPIED and egg-info) copied to ``into``."""
    ignore = shutil.ignore_patterns(*NOT_COPIED, "*.egg-info")
    into.mkdir()
    for entry in root.iterdir():
        if entry.name in NOT_COPIED or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, into / entry.name, ignore=ignore)
        else:
            shutil.copy2(entry, into / entry.name)
    return into


class Zygote:
    """A Python process in ``tree`` that imports ``preload`` once and forks a fresh pytest run
    for each request, so that no run pays for those imports (most of pytest's start here).
    The tree's own code is imported in each run, never before it nor an installed copy's; no
    bytecode is written (a mutated file may keep its size and mtime second)."""

    def __init__(self, tree: Path, preload: Sequence[str]) -> None:
        self.tree = tree
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        env = {k: v for k, v in env.items() if not k.startswith("PYTEST_CUDAGRAPH_")}
        code = f"import sys; sys.path.append({str(SCRIPTS)!r}); import mutants; mutants.serve()"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, *preload],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run_tests(self, tests: Sequence[str]) -> tuple[int | None, str]:
        """pytest's exit status on ``tests`` (None: it ran past TIMEOUT_S) and its output."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(list(tests)) + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline()
        if not reply:
            raise RuntimeError(f"the zygote in {self.process.args} died")
        status, output = json.loads(reply)
        return status, output

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def serve() -> None:
    """The zygote's loop: the modules named on its command line imported, then for each line
    of stdin (a JSON list of tests) one forked pytest run, answered by a line of JSON."""
    for name in sys.argv[1:]:
        importlib.import_module(name)
    import pytest

    for line in sys.stdin:
        with tempfile.TemporaryFile() as log:
            child = os.fork()
            if child == 0:  # never returns: the zygote's loop is the parent's alone
                status = 3  # pytest's own status for an error it did not handle
                try:
                    os.setpgid(0, 0)  # its own group, so that a timeout ends its processes too
                    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                    os.dup2(log.fileno(), 1)
                    os.dup2(log.fileno(), 2)
                    status = pytest.main(["-x", "-q", "-p", "no:cacheprovider", *json.loads(line)])
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(status)
            status = waited(child)
            log.seek(0)
            output = log.read().decode(errors="replace")
        print(json.dumps([status, output[-4000:]]), flush=True)


def waited(child: int) -> int | None:
    """The exit status of process ``child``, or None after TIMEOUT_S (its group then killed)."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.killpg(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return None
        time.sleep(0.02)


def try_mutant(mutant: Mutant, zygote: Zygote) -> Outcome:
    """Apply ``mutant`` in the zygote's tree, run its tests, put the file back (an equivalent
    mutant is only matched against its function)."""
    path = zygote.tree / mutant.path
    if not path.is_file():
        return Outcome(mutant, "error", 0.0, f"{mutant.name}: there is no file {mutant.path}")
    original = path.read_text()
    try:
        mutated = mutant.apply(original)
    except ValueError as error:
        return Outcome(mutant, "error", 0.0, str(error))
    if mutant.equivalent:
        return Outcome(mutant, "equivalent", 0.0, mutant.equivalent)
    start = time.perf_counter()
    try:
        path.write_text(mutated)
        status, output = zygote.run_tests(mutant.tests)
    finally:
        path.write_text(original)
    seconds = time.perf_counter() - start
    if status is None:
        return Outcome(mutant, "killed", seconds, "timed out")
    if status == 0:
        return Outcome(mutant, "survived", seconds)
    if status in (1, 2, 3):  # tests failed, collection broke, or pytest crashed
        return Outcome(mutant, "killed", seconds)
    return Outcome(mutant, "error", seconds, f"pytest exit {status}: {tail(output)}")


def tail(output: str) -> str:
    return " | ".join(output.strip().splitlines()[-3:])


def run(
    mutants: Sequence[Mutant], root: Path = ROOT, jobs: int = 2, preload: Sequence[str] = PRELOAD
) -> list[Outcome]:
    """Every mutant tried in one of ``jobs`` scratch copies of ``root``; a mutant whose tests
    fail on the unchanged tree is an error, not a kill."""
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        zygotes: Queue[Zygote] = Queue()
        for number in range(max(1, jobs)):
            zygotes.put(Zygote(scratch_copy(root, Path(scratch) / str(number)), preload))
        try:
            first = zygotes.get()
            selected = sorted({t for m in mutants if not m.equivalent for t in m.tests})
            status, output = first.run_tests(selected) if selected else (0, "")
            zygotes.put(first)
            if status != 0:
                failed = "run past the timeout" if status is None else "fail"
                detail = f"the tests {failed} without any mutant: {tail(output)}"
                return [Outcome(mutant, "error", 0.0, detail) for mutant in mutants]

            def one(mutant: Mutant) -> Outcome:
                zygote = zygotes.get()
                try:
                    return try_mutant(mutant, zygote)
                finally:
                    zygotes.put(zygote)

            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                return list(pool.map(one, mutants))
        finally:
            while not zygotes.empty():
                zygotes.get().close()


def summary(outcomes: Iterable[Outcome]) -> tuple[list[str], bool]:
    """One line per mutant and the score over the mutants that are not equivalent; whether
    every one of those was killed."""
    outcomes = list(outcomes)
    lines = [
        f"{o.verdict:10} {o.seconds:5.1f}s  {o.mutant.where}: {o.mutant.name}"
        + (f" ({o.detail})" if o.detail else "")
        for o in outcomes
    ]
    scored = [o for o in outcomes if o.verdict != "equivalent"]
    killed = sum(o.verdict == "killed" for o in scored)
    score = 100.0 * killed / len(scored) if scored else 0.0
    line = f"{killed} of {len(scored)} mutants killed ({score:.1f}%)"
    if len(scored) < len(outcomes):
        line += f"; {len(outcomes) - len(scored)} equivalent, not run"
    lines.append(line)
    return lines, killed == len(scored)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="mutants tried at once (default 2)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="the mutants to try, by name")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    mutants = load()
    if args.only:
        unknown = set(args.only) - {m.name for m in mutants}
        if unknown:
            parser.error(f"--only: no mutant named {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.name in args.only]
    if args.list:
        for mutant in mutants:
            print(f"{mutant.where}: {mutant.name} -> {' '.join(mutant.tests)}")
        return 0
    start = time.perf_counter()
    lines, all_killed = summary(run(mutants, jobs=args.jobs))
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines.append(
        f"{time.perf_counter() - start:.0f} s of wall time, "
        f"{children.ru_utime + children.ru_stime:.0f} s of CPU time in the tests"
    )
    print("\n".join(lines))
    return 0 if all_killed else 1


if __name__ == "__main__":
    sys.exit(main())
