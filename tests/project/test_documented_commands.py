"""Every command the README and docs/*.md give in a code block is run, up to its argument
parsing at least, on the CPU, in a scratch copy of the tree (a command may write files).

The docs are read when the tests run, whatever commands they hold then. Each block's command
lines run as one bash script in which ``pytest``, ``python``, ``python3``, ``bash`` and ``tox``
are shell functions that record each call (shell expansion done: variables, globs, quotes),
and then every recorded call is checked in one Python process:

- ``pytest ARGS``: ``pytest.main(ARGS + --collect-only)``: options, paths, plugins' checks;
- ``python scripts/X.py ARGS``: the script runs up to its ``parse_args`` (its imports and its
  argument parsing), then stops; ``python -m MODULE``: the module exists; ``python -c CODE``
  runs for real (a command substitution may need its output);
- ``python -m pip install ARGS``: each requirement parses and the extras named exist;
- ``bash scripts/X.sh``: the script exists and parses (``bash -n``); ``tox -e ENV``: the env
  is in tox.ini.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_cudagraph.bench import stack_id

# Each documented command runs as written, in a subprocess (the README's test command leaves it out).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The words a documented command line starts with (a leading "$ " prompt is dropped).
COMMAND = re.compile(r"^(?:\$ )?(?:(?:pytest|python3?|bash|tox|mkdir)(?:\s|$)|[A-Za-z_]\w*=\$\()")
FENCE = re.compile(r"^\s*```(\w*)\s*$")
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
# Modules a command names that stand for the reader's own code; the copy gets a stand-in.
STAND_INS = ("mypkg.graphs", "decode_step_target")
# Modules a command names that need an optional extra -> the package that extra installs: where
# it is missing (the pinned env has no transformers) the command is left unchecked, with a warning.
NEEDS_EXTRA = {"pytest_cudagraph.examples.hf_static_cache_target": "transformers"}
# The README's quick start: the reader's files, as tests/project/quickstart holds them.
QUICKSTART = ROOT / "tests" / "project" / "quickstart"
# The folder docs/ci.md names the recipe's output by.
OUTDIR = "OUTDIR"
# The parts of the tree the commands read (a command writing into reports/ gets it made).
COPIED = ("pytest_cudagraph", "reasyn_ref", "tests", "scripts", "benchmarks")
COPIED_FILES = ("conftest.py", "pyproject.toml", "tox.ini")


@dataclass(frozen=True)
class Block:
    """A code block's command lines (continuations joined), and where it starts."""

    source: str
    line: int
    commands: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"


def command_blocks(text: str, source: str) -> list[Block]:
    """The shell code blocks of a markdown text (fenced with a shell language or none, or
    indented by four spaces after a blank line) that hold at least one command line."""
    blocks, lines, start, fenced, indented = [], [], 0, None, False
    previous_blank = True

    def close() -> None:
        commands = _command_lines(lines)
        if commands:
            blocks.append(Block(source, start, tuple(commands)))
        lines.clear()

    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fenced is not None:
            if fence:
                if fenced in SHELL_FENCES:
                    close()
                lines.clear()
                fenced = None
            else:
                lines.append(line)
            continue
        if fence:
            if indented:
                close()
                indented = False
            fenced, start = fence.group(1), number + 1
            continue
        is_code = line.startswith("    ") and line.strip()
        if indented and not (is_code or not line.strip()):
            close()
            indented = False
        if not indented and is_code and previous_blank:
            indented, start = True, number
        if indented:
            lines.append(line)
        previous_blank = not line.strip()
    if indented:
        close()
    return blocks


def _command_lines(lines: list[str]) -> list[str]:
    """The command lines among a block's lines, each with its backslash continuations."""
    commands, pending = [], ""
    for raw in lines:
        line = raw.strip()
        if pending:
            pending += " " + line
        elif COMMAND.match(line):
            pending = line.removeprefix("$ ")
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
        else:
            commands.append(pending)
            pending = ""
    if pending:
        commands.append(pending)
    return commands


def documented_blocks() -> list[Block]:
    return [
        block
        for path in DOCS
        for block in command_blocks(path.read_text(), str(path.relative_to(ROOT)))
    ]


# The shell functions each block runs under: each call is one line in $CALLS, its block and its
# arguments each ended by a unit separator. Inside a command substitution `python -c` also
# runs, for the output the substitution needs.
PRELUDE = r"""
record() { printf '%s\x1f' "$BLOCK" "$@" >> "$CALLS"; printf '\n' >> "$CALLS"; }
pytest() { record pytest "$@"; }
tox() { record tox "$@"; }
bash() { record bash "$@"; }
python() {
    record python "$@"
    if [[ "$1" == -c && $BASH_SUBSHELL -gt 0 ]]; then "$REAL_PYTHON" "$@"; fi
}
python3() { python "$@"; }
"""


def run_blocks(blocks: list[Block], tree: Path) -> list[dict]:
    """Each block's commands as a bash script in ``tree``; the calls they made."""
    calls = tree / "calls.txt"
    for block in blocks:
        script = PRELUDE + "\n".join(block.commands) + "\n"
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tree), "CALLS": str(calls)}
        env.update(REAL_PYTHON=sys.executable, BLOCK=block.id)
        subprocess.run(["bash", "-c", script], cwd=tree, env=env, check=False, timeout=120)
    if not calls.exists():
        return []
    found = []
    for line in calls.read_text().splitlines():
        block, *argv = line.split("\x1f")[:-1]
        found.append({"block": block, "argv": argv})
    return found


# Checks every recorded call in one process (so torch is imported once); prints one JSON line
# per call: {"index": i, "ok": bool, "detail": str}.
CHECKER = r"""
import argparse, contextlib, configparser, importlib.metadata, importlib.util, io, json, runpy
import subprocess, sys
from packaging.requirements import Requirement
import pytest

class Parsed(Exception):
    pass

def parsed_only(parse):
    def parse_and_stop(self, *args, **kwargs):
        parse(self, *args, **kwargs)
        raise Parsed
    return parse_and_stop

argparse.ArgumentParser.parse_args = parsed_only(argparse.ArgumentParser.parse_args)

def check(argv):
    tool, *args = argv
    if tool == "pytest" or args[:2] == ["-m", "pytest"]:
        args = args[2:] if tool != "pytest" else args
        # Each documented pytest is its own process for its reader: forget the test modules an
        # earlier call imported (two test_my_model.py, say, would clash in one process).
        for name in [name for name in sys.modules if name.startswith("test_")]:
            del sys.modules[name]
        code = pytest.main([*args, "--collect-only", "-q", "-p", "no:cacheprovider"])
        return code in (0, 5), f"pytest exit {int(code)}"
    if tool == "python" and args[:1] == ["-c"]:
        exec(compile(args[1], "<python -c>", "exec"), {"__name__": "__main__"})
        return True, "ran"
    if tool == "python" and args[:1] == ["-m"]:
        if args[1] == "pip":
            return check_pip(args[2:])
        found = importlib.util.find_spec(args[1]) is not None
        return found, f"module {args[1]} " + ("found" if found else "not found")
    if tool == "python" and args and args[0].endswith(".py"):
        sys.argv = list(args)
        try:
            runpy.run_path(args[0], run_name="__main__")
        except Parsed:
            return True, "parsed"
        except SystemExit as stop:
            return stop.code in (0, None), f"exit {stop.code}"
        return False, "never parsed arguments"
    if tool == "bash" and args and args[0].endswith(".sh"):
        done = subprocess.run(["bash", "-n", args[0]], capture_output=True, text=True)
        return done.returncode == 0, done.stderr.strip() or "parses"
    if tool == "tox":
        envs = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "-e"]
        tox = configparser.ConfigParser(interpolation=None)
        tox.read("tox.ini")
        missing = [env for env in envs if f"testenv:{env}" not in tox]
        return bool(envs) and not missing, f"envs {envs}, not in tox.ini: {missing}"
    return False, f"no check for {argv}"

def check_pip(args):
    if args[:1] != ["install"]:
        return False, f"pip {args[:1]}: only installs are documented"
    # The installed plugin's extras (no tomllib before Python 3.11): the tree's, installed editable.
    extras = set(importlib.metadata.metadata("pytest-cudagraph").get_all("Provides-Extra") or [])
    values = iter(args[1:])
    for arg in values:
        if arg in ("-e", "--editable"):
            named = next(values).partition("[")[2].rstrip("]")
            unknown = {e for e in named.split(",") if e} - extras
            if unknown:
                return False, f"no extras {sorted(unknown)} in the plugin's metadata"
        elif arg in ("--extra-index-url", "--index-url"):
            if not next(values).startswith("https://"):
                return False, f"{arg} is not an https URL"
        elif arg.startswith("-"):
            continue
        elif arg.startswith((".", "/")):  # a local folder or wheel: the reader's clone
            continue
        else:
            Requirement(arg)
    return True, "parses"

import time
seen = {}
for index, argv in enumerate(json.load(open(sys.argv[1]))):
    if repr(argv) not in seen:  # the docs repeat some commands: each is checked once
        out = io.StringIO()
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                ok, detail = check(argv)
        except Exception as error:
            ok, detail = False, repr(error)
        tail = out.getvalue().strip().splitlines()[-5:]
        seen[repr(argv)] = {"ok": ok, "detail": detail, "output": tail, "s": time.perf_counter() - start}
    print(json.dumps({"index": index, **seen[repr(argv)]}), flush=True)
"""


def check_calls(calls: list[dict], tree: Path) -> list[dict]:
    """Each call's check, run in ``tree``."""
    calls_file = tree / "argvs.json"
    calls_file.write_text(json.dumps([call["argv"] for call in calls]))
    done = subprocess.run(
        [sys.executable, "-c", CHECKER, str(calls_file)],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tree), "PYTHONPATH": str(tree)},
    )
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(calls), f"the checker stopped early:\n{done.stderr[-3000:]}"
    return results


def scratch_tree(root: Path, into: Path) -> Path:
    """A copy of the tree to run documented commands in, with stand-ins for the reader's own
    modules, the output folder docs/ci.md names, and a baseline for this stack (a copy of a
    committed one) where a command compares with the running stack's."""
    for name in COPIED:
        shutil.copytree(root / name, into / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in COPIED_FILES:
        shutil.copy2(root / name, into / name)
    (into / "reports").mkdir()
    (into / OUTDIR).mkdir()  # pytest-benchmark before 5.3 opens --benchmark-json when parsing
    for module in STAND_INS:
        path = into.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("from reasyn_ref.targets.reference import make_target  # a stand-in\n")
    for path in QUICKSTART.glob("*.py"):
        shutil.copy2(path, into / path.name)
    baselines = into / "benchmarks" / "baseline"
    own = baselines / stack_id() / "baseline.json"
    if not own.exists():  # on the committed baseline's own stack it is there already
        own.parent.mkdir(exist_ok=True)
        shutil.copy2(next(baselines.glob("*/baseline.json")), own)
    return into


def missing_extra(argv: list[str]) -> str | None:
    """The package an optional extra installs that ``argv`` needs and this env lacks, if any."""
    for module, package in NEEDS_EXTRA.items():
        named = any(module in arg for arg in argv)
        if named and importlib.util.find_spec(package) is None:
            return package
    return None


def checked(blocks: list[Block], tmp: Path) -> dict[str, list[str]]:
    """Per block id, one line for each call that failed its check (an empty list: all passed;
    a block whose commands made no call at all is a failure too)."""
    tree = scratch_tree(ROOT, tmp)
    calls = []
    for call in run_blocks(blocks, tree):
        missing = missing_extra(call["argv"])
        if missing:
            unchecked = f"{call['block']}: not checked, {missing} is not installed: {call['argv']}"
            warnings.warn(unchecked, stacklevel=2)
        else:
            calls.append(call)
    results = check_calls(calls, tree) if calls else []
    failures: dict[str, list[str]] = {block.id: [] for block in blocks}
    for call, result in zip(calls, results, strict=True):
        if not result["ok"]:
            output = " | ".join(result["output"])
            failures[call["block"]].append(
                f"{' '.join(call['argv'])}: {result['detail']}: {output}"
            )
    for block in blocks:
        if not any(call["block"] == block.id for call in calls):
            failures[block.id].append(f"no command ran: {block.commands}")
    return failures


def test_the_docs_hold_commands():
    blocks = documented_blocks()
    assert len(blocks) >= 5
    commands = [command for block in blocks for command in block.commands]
    assert any(c.startswith("pytest tests/bench") for c in commands)
    assert any(c.startswith("python scripts/bench_report.py") for c in commands)


def test_every_documented_command_parses(tmp_path):
    failures = checked(documented_blocks(), tmp_path)
    failed = {block: lines for block, lines in failures.items() if lines}
    assert not failed, "documented commands that fail:\n" + "\n".join(
        f"{block}: {line}" for block, lines in failed.items() for line in lines
    )


BROKEN_DOC = """\
Run the benchmarks:

    pytest tests/bench --benchmark-only
    python scripts/bench_report.py --no-such-option

and the rest:

```bash
python scripts/bench_report.py reports/bench.json --out reports/bench.md  # fine
pytest --no-such-option
```
"""


def test_a_broken_command_is_caught(tmp_path):
    """The two failures the docs once had (--benchmark-only without --benchmark-enable, which
    the project's conftest disables) and two unknown options; the good command passes."""
    blocks = command_blocks(BROKEN_DOC, "broken.md")
    assert [block.commands for block in blocks] == [
        ("pytest tests/bench --benchmark-only", "python scripts/bench_report.py --no-such-option"),
        (
            "python scripts/bench_report.py reports/bench.json --out reports/bench.md  # fine",
            "pytest --no-such-option",
        ),
    ]
    failures = checked(blocks, tmp_path)
    assert [len(lines) for lines in failures.values()] == [2, 1]
    assert "pytest tests/bench --benchmark-only: pytest exit 4" in failures["broken.md:3"][0]
    assert failures["broken.md:9"][0].startswith("pytest --no-such-option: pytest exit 4")


def test_blocks_join_continuations_and_skip_output_and_other_languages():
    text = textwrap.dedent(
        """\
        Intro.

            pytest tests/bench --benchmark-enable \\
                --benchmark-only
            cudagraph: benchmarks of stack py3.12

        ```python
        pytest = 1
        ```

        ```text
        pytest --not-a-command
        ```
        """
    )
    [block] = command_blocks(text, "x.md")
    assert block.commands == ("pytest tests/bench --benchmark-enable --benchmark-only",)
    assert block.id == "x.md:3"
