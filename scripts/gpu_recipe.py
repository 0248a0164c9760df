"""The GPU recipe that scripts/gpu_suite.sh runs: its steps, each with the seconds it is planned
to take on one H200 host and the host cores it keeps busy; the schedule (the timed steps alone,
one after another; then the rest side by side within the host's cores, slowest first); and the
run, which cuts a step at its limit with SIGINT, so that pytest still writes the results it has.

    python scripts/gpu_recipe.py OUTDIR [LABEL]              install, run the plan, write the reports
    python scripts/gpu_recipe.py --dry-run OUTDIR [LABEL]    print it: commands, start times, total

Every step writes OUTDIR/STEP.log, and a pytest step its JUnit XML and --cudagraph-json results;
OUTDIR/steps.jsonl gets a line per finished step (exit, seconds, cut or not) and
OUTDIR/recipe.json what ran; scripts/gpu_report.py renders them. The knobs (KNOBS, environment)
are described in gpu_suite.sh.
"""

from __future__ import annotations

import contextlib
import heapq
import importlib.util
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from twins import twins

ROOT = Path(__file__).resolve().parents[1]
# The most the whole plan may take on one H200 host: 20 minutes leave a session of half an hour
# room for a re-run of what fails. Each of its parts (``parts``), with its install, fits in 10
# minutes, so that each runs as one command where commands are limited to that.
PLANNED_BUDGET_S = 1200
PART_BUDGET_S = 600
# How long a step cut at its limit gets to write its results (xdist workers included) before
# it is killed.
GRACE_S = 60
# Both distributions, editable, offline (a GPU host may have no network): setuptools 77 or later.
INSTALL = ("-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation")
INSTALL_TARGETS = ("-e", ".", "-e", "./reasyn_ref")
INSTALL_PLANNED_S = 20  # estimate: two editable installs without dependencies or isolation
# What changes what runs (the report names those set) and what changes only how it is recorded.
KNOBS = (
    "TEST_ARGS",
    "SKIP_BENCH",
    "BENCH_COMPARE",
    "BENCH_ARGS",
    "GPUS",
    "STEPS",
    "JOBS",
    "CORES",
    "BUDGET_S",
)
RECORDING_KNOBS = ("SKIP_INSTALL", "GIT_COMMIT", "WHEELS")


@dataclass(frozen=True)
class Step:
    """One step: ``args`` after ``python`` (a pytest run when they start with ``-m pytest``),
    the seconds planned on one H200 host (``planned_s``, where from: ``basis``), and whether it
    must have the machine to itself (``alone``: timings)."""

    name: str
    args: tuple[str, ...]
    planned_s: int
    basis: str
    alone: bool = False
    pythonpath: str | None = None
    # A module the step needs that the GPU host may lack: installed from WHEELS when missing.
    needs_module: str | None = None

    @property
    def limit_s(self) -> int:
        """Half again the plan, and a minute: room for a slow run, not for a hung one."""
        return self.planned_s * 3 // 2 + 60

    @property
    def cores(self) -> int:
        """The host cores it keeps busy: its xdist workers (``-n``) or processes (``--jobs``),
        as the last one given says (TEST_ARGS may give ``-n`` again)."""
        for option, value in reversed(list(itertools.pairwise(self.args))):
            if option in ("-n", "--jobs"):
                return int(value)
        return 1

    @property
    def is_pytest(self) -> bool:
        return self.args[:2] == ("-m", "pytest")

    def shown(self) -> str:
        """The command as one would type it (docs/ci.md gives each)."""
        words = ["pytest", *self.args[2:]] if self.is_pytest else ["python", *self.args]
        prefix = f"PYTHONPATH={self.pythonpath} " if self.pythonpath else ""
        return prefix + " ".join(f'"{word}"' if " " in word else word for word in words)

    def argv(self, out: Path) -> list[str]:
        """What runs: a pytest step also writes its JUnit XML and results into ``out``, and
        keeps pytest-randomly (where installed) from reordering it."""
        argv = [sys.executable, *self.args]
        if self.is_pytest:
            argv += [
                f"--junitxml={out / self.name}.xml",
                f"--cudagraph-json={out / self.name}.json",
                "-rfEs",
                *("-p", "no:cacheprovider", "-p", "no:randomly"),
            ]
        return argv


# The benchmarks in two steps, each alone on the machine: the host-bound ones and every other
# without compile, then those that compile (minutes of inductor; afterwards a process keeps its
# workers and objects, which slows host-bound timings). (name, -k selection, planned s, basis)
BENCH_STEPS = (
    (
        "bench",
        "not compile",
        299,
        "the last run",
    ),
    (
        "bench-compile",
        "compile",
        320,
        "the baseline run's compile seconds (10 to 14 s a key, 10 keys) with their rounds and "
        "pairs; the KV step and its blocks compiled at 3 batches, the blocks' sampler at one: "
        "estimate",
    ),
)
BENCH_JSON = {"bench": "benchmarks.json", "bench-compile": "benchmarks-compile.json"}
# The correct examples, every examples/*_target.py, and reasyn-ref's three targets.
EXAMPLES = tuple(
    f"pytest_cudagraph.examples.{path.stem}:make_target"
    for path in sorted((ROOT / "pytest_cudagraph" / "examples").glob("*_target.py"))
)
REASYN_TARGETS = ("reasyn", "reasyn-lean", "reasyn-kv")


def _example(name: str) -> str:
    return f"pytest_cudagraph.examples.{name}_target:make_target"


# One suite run on each target as the last run measured it (reports/gpu-h200.md, at 73b98cc:
# its conformance step, beside 15 other steps on the H200 host; the stateful decoder as its
# re-run took, the first having stopped at its first error): the conformance steps' plan.
RUN_S = {
    "reasyn": 77,
    "reasyn-kv": 46,
    "reasyn-lean": 61,
    _example("bucket_runner"): 11,
    _example("decode_step"): 35,
    _example("decode_token"): 32,
    _example("graphed_layer"): 14,
    _example("hf_static_cache"): 62,
    _example("piecewise_runner"): 12,
    _example("stateful_decoder"): 12,
    "foreign:make_target": 13,
    "my_graphs:make_target": 11,
}
# The twins the emulation step compares: every factory of tests/conformance/broken_*targets.py.
TWINS_DIR = "tests/conformance"
# The project's tests that need CUDA (pytest_cudagraph.skips.needs_cuda gives the marker): the
# CPU tests are CI's. The suite's own runs on targets are GPU work whole, and run as they are.
GPU_TESTS = ("-m", "cuda")
# The conformance steps: (name, target, PYTHONPATH, a module it may need from WHEELS).
SUITE_STEPS = (
    ("conformance", "reasyn", None, None),
    ("conformance-kv", "reasyn-kv", None, None),
    ("conformance-lean", "reasyn-lean", None, None),
    ("conformance-decode-step", _example("decode_step"), None, None),
    ("conformance-decode-token", _example("decode_token"), None, None),
    ("conformance-graphed-layer", _example("graphed_layer"), None, None),
    ("conformance-bucket-runner", _example("bucket_runner"), None, None),
    ("conformance-piecewise-runner", _example("piecewise_runner"), None, None),
    ("conformance-stateful-decoder", _example("stateful_decoder"), None, None),
    ("conformance-hf-static-cache", _example("hf_static_cache"), None, "transformers"),
    ("conformance-foreign", "foreign:make_target", TWINS_DIR, None),
    ("conformance-quickstart", "my_graphs:make_target", "tests/project/quickstart", None),
)
# Stability: the suite on reasyn-ref's targets and the examples (the compiled decode step,
# decode_token_target, among them), each target's runs side by side. It and emulation run as
# many suite processes as the H200 host has cores: every core busy.
STABILITY_TARGETS = (*REASYN_TARGETS, *EXAMPLES)
STABILITY_RUNS = 5
STABILITY_JOBS = 16
EMULATION_JOBS = 16
# Emulation: the same correct targets and every twin, on the GPU and emulated on the CPU.
EMULATION_TARGETS = STABILITY_TARGETS
# The worker-processes check runs with graphs off, so emulation cannot change its verdict.
NOT_WORKER_PROCESSES = ("-k", "not worker_processes")


def _pytest(*args: str) -> tuple[str, ...]:
    return ("-m", "pytest", *args)


def _suite(target: str) -> tuple[str, ...]:
    return _pytest("--pyargs", "pytest_cudagraph.conformance", "--cudagraph-target", target)


def plan(out: Path, gpus: int, knobs: Mapping[str, str]) -> list[Step]:
    """The recipe's steps for a host with ``gpus`` GPUs, given the knobs set (TEST_ARGS,
    SKIP_BENCH, BENCH_COMPARE, BENCH_ARGS)."""
    test_args = tuple(knobs.get("TEST_ARGS", "").split())
    twin_count = len(twins(ROOT / TWINS_DIR))
    steps = []
    if knobs.get("SKIP_BENCH") != "1":
        compare: tuple[str, ...] = ()
        if knobs.get("BENCH_COMPARE") == "1":
            compare = (
                "--benchmark-storage=file://./.benchmarks/{cudagraph_stack_id}",
                "--benchmark-compare=benchmarks/baseline/{cudagraph_stack_id}/baseline.json",
                "--benchmark-compare-fail=median:25%",
            )
        bench_args = tuple(knobs.get("BENCH_ARGS", "").split())
        for name, select, planned_s, basis in BENCH_STEPS:
            args = ("tests/bench", "--benchmark-enable", "--benchmark-only", "-k", select)
            json_path = f"--benchmark-json={out / BENCH_JSON[name]}"
            steps.append(
                Step(
                    name,
                    _pytest(*args, *compare, json_path, *bench_args),
                    planned_s,
                    basis,
                    alone=True,
                )
            )
    steps += [
        Step(
            "tests",
            _pytest(
                "tests",
                "--ignore=tests/bench",
                "--ignore=tests/reasyn_ref",
                "--ignore=tests/conformance",
                *GPU_TESTS,
                "-n",
                "2",
                *test_args,
            ),
            55,
            "the last run: 44 passed, 1 skipped",
        ),
        Step(
            "tests-reasyn-ref",
            _pytest("tests/reasyn_ref", *GPU_TESTS, "-n", "3", *test_args),
            59,
            "the last run: 56 passed, 3 skipped",
        ),
        Step(
            "tests-conformance",
            _pytest("tests/conformance", *GPU_TESTS, "-n", "8", "--dist", "worksteal", *test_args),
            282,
            "the last run: 60 tests, 29 of them failed (a failing suite run may end sooner than "
            "a passing one)",
        ),
        Step(
            "order-reasyn",
            (
                "scripts/order_independence.py",
                "reasyn",
                "--jobs",
                "4",
                "--out",
                str(out / "order-reasyn"),
                "--report",
                str(out / "order-reasyn.md"),
                "--",
                "-p",
                "randomly",
            ),
            181,
            "the last run: 29 of 29 checks alone and in the full suite",
            needs_module="pytest_randomly",
        ),
        Step(
            "stability",
            (
                "scripts/stability_report.py",
                "--runs",
                str(STABILITY_RUNS),
                "--jobs",
                str(STABILITY_JOBS),
                "--out",
                str(out / "stability"),
                "--report",
                str(out / "stability.md"),
                *STABILITY_TARGETS,
            ),
            192,
            f"the last run: {STABILITY_RUNS} runs of each of {len(STABILITY_TARGETS)} targets, "
            f"{STABILITY_JOBS} at a time",
            needs_module="transformers",
        ),
        Step(
            "emulation",
            (
                "scripts/emulation_report.py",
                "--jobs",
                str(EMULATION_JOBS),
                "--out",
                str(out / "emulation"),
                "--report",
                str(out / "emulation.md"),
                "--twins",
                TWINS_DIR,
                *EMULATION_TARGETS,
                "--",
                *NOT_WORKER_PROCESSES,
            ),
            209,
            f"the last run: {len(EMULATION_TARGETS)} correct targets and {twin_count} twins on the GPU and "
            f"emulated, {EMULATION_JOBS} at a time",
            pythonpath=TWINS_DIR,
            needs_module="transformers",
        ),
        *[
            Step(
                name,
                _suite(target),
                RUN_S[target],
                "the last run, beside 15 other steps",
                pythonpath=path,
                needs_module=module,
            )
            for name, target, path, module in SUITE_STEPS
        ],
    ]
    if gpus >= 2:  # one xdist worker per GPU
        steps.append(
            Step(
                "conformance-xdist",
                (*_suite("reasyn"), "-n", str(gpus)),
                90,
                "estimate: the reasyn run, spread over the GPUs",
            )
        )
    return steps


# Every step a run can have (two GPUs: the xdist step too), in the plan's order.
STEP_NAMES = tuple(step.name for step in plan(Path("OUTDIR"), 2, {}))


@dataclass(frozen=True)
class Slot:
    """A step's planned start and end, in seconds from the first step."""

    step: Step
    start_s: float
    end_s: float


def next_to_start(
    waiting: Sequence[Step], running: Sequence[Step], cores: int, jobs: int | None
) -> Step | None:
    """The step to start now, or None: a step that runs alone only once nothing runs, and
    nothing beside it; otherwise the first waiting step (slowest first) whose cores are free,
    while fewer than ``jobs`` run. A step wanting more cores than the host has starts alone."""
    if not waiting or any(step.alone for step in running):
        return None
    if jobs is not None and len(running) >= jobs:
        return None
    free = cores - sum(step.cores for step in running)
    for step in waiting:
        if step.alone:
            return None if running else step
        if step.cores <= free or not running:
            return step
    return None


def in_order(steps: Sequence[Step]) -> list[Step]:
    """The order steps are offered to ``next_to_start``: those that run alone, then the rest,
    each group slowest first."""
    return sorted(steps, key=lambda step: (not step.alone, -step.planned_s))


def schedule(steps: Sequence[Step], cores: int, jobs: int | None = None) -> list[Slot]:
    """When each step would start and end if it took its planned seconds."""
    waiting, slots = in_order(steps), []
    running: list[Step] = []
    ends: list[tuple[float, int, Step]] = []
    now = 0.0
    while waiting or running:
        step = next_to_start(waiting, running, cores, jobs)
        if step is not None:
            waiting.remove(step)
            running.append(step)
            slots.append(Slot(step, now, now + step.planned_s))
            heapq.heappush(ends, (now + step.planned_s, len(slots), step))
            continue
        now, _, done = heapq.heappop(ends)
        running.remove(done)
    return slots


def parts(steps: Sequence[Step], cores: int, jobs: int | None = None) -> list[list[Step]]:
    """``steps`` in runs that each fit PART_BUDGET_S with an install: the steps that run alone,
    in order, as many to a part as fit; then the others, slowest first, each into the first
    part whose schedule it keeps within that (a step longer than it gets a part of its own)."""
    room = PART_BUDGET_S - INSTALL_PLANNED_S
    alone: list[list[Step]] = []
    for step in in_order([step for step in steps if step.alone]):
        if alone and sum(s.planned_s for s in alone[-1]) + step.planned_s <= room:
            alone[-1].append(step)
        else:
            alone.append([step])
    shared: list[list[Step]] = []
    for step in in_order([step for step in steps if not step.alone]):
        for part in shared:
            if max(slot.end_s for slot in schedule([*part, step], cores, jobs)) <= room:
                part.append(step)
                break
        else:
            shared.append([step])
    return alone + shared


def selected(steps: Sequence[Step], names: str) -> list[Step]:
    """The steps STEPS names (all when it is empty); an unknown name is a usage error."""
    wanted = names.split()
    unknown = sorted(set(wanted) - set(STEP_NAMES))
    if unknown:
        raise SystemExit(
            f"STEPS names no step of the recipe: {', '.join(unknown)}; the steps "
            f"are {', '.join(STEP_NAMES)}"
        )
    return [step for step in steps if not wanted or step.name in wanted]


@dataclass
class Run:
    """A step's process, when it started, and when and why it must stop: at its limit, or
    at the end of BUDGET_S ("budget"). ``cut`` says which stopped it, if either did."""

    step: Step
    process: subprocess.Popen[bytes]
    started: float
    stop_at: float
    stop_reason: str = "limit"
    cut: str | None = None
    killed_at: float | None = None


@dataclass
class Recipe:
    """One run of the plan into ``out``."""

    out: Path
    label: str
    commit: str
    gpus: int
    cores: int
    jobs: int | None
    budget_s: int | None
    knobs: dict[str, str] = field(default_factory=dict)

    def command(self) -> str:
        """gpu_suite.sh's command line, with the knobs that changed what ran."""
        set_knobs = [
            f"{name}={shlex.quote(self.knobs[name])} " for name in KNOBS if self.knobs.get(name)
        ]
        return "".join(set_knobs) + f"bash scripts/gpu_suite.sh $OUT {self.label}"

    def steps(self) -> list[Step]:
        return selected(plan(self.out, self.gpus, self.knobs), self.knobs.get("STEPS", ""))

    def print_plan(self, steps: Sequence[Step], install: bool) -> None:
        offset = INSTALL_PLANNED_S if install else 0
        if install:
            print(f"install: python {shlex.join([*INSTALL, *INSTALL_TARGETS])}")
        for step in steps:
            print(f"== {step.name}: {step.shown()}")
        slots = schedule(steps, self.cores, self.jobs)
        print(f"\nplan on {self.cores} cores and {self.gpus} GPU(s), seconds from the start:")
        print(f"  {'step':27} {'starts':>6} {'planned':>7} {'limit':>5} {'cores':>5}  basis")
        if install:
            print(f"  {'install':27} {0:6d} {INSTALL_PLANNED_S:7d} {'-':>5} {1:5d}  estimate")
        for slot in sorted(slots, key=lambda slot: slot.start_s):
            step = slot.step
            late = ""
            if self.budget_s is not None and offset + slot.end_s > self.budget_s:
                late = " (past BUDGET_S)"
            print(
                f"  {step.name:27} {offset + slot.start_s:6.0f} {step.planned_s:7d} "
                f"{step.limit_s:5d} {step.cores:5d}  {step.basis}{late}"
            )
        total = offset + max((slot.end_s for slot in slots), default=0)
        print(f"planned total: {total:.0f} s ({total / 60:.1f} min); at most {PLANNED_BUDGET_S} s")
        if total > PLANNED_BUDGET_S:
            print(f"over by {total - PLANNED_BUDGET_S:.0f} s: the parts take more than one session")
        print(f"in parts of at most {PART_BUDGET_S} s, each with its install:")
        for part in parts(steps, self.cores, self.jobs):
            seconds = INSTALL_PLANNED_S + max(
                s.end_s for s in schedule(part, self.cores, self.jobs)
            )
            print(f"  STEPS='{' '.join(step.name for step in part)}': {seconds:.0f} s")

    def install(self) -> bool:
        """Both distributions, editable and offline, logged to OUTDIR/install.log."""
        self.out.mkdir(parents=True, exist_ok=True)
        log = self.out / "install.log"
        with log.open("w") as output:
            installed = subprocess.run(
                [sys.executable, *INSTALL, *INSTALL_TARGETS],
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if installed.returncode != 0:
            print(f"the editable install failed (it needs setuptools 77 or later; see {log}):")
            print("\n".join(log.read_text().splitlines()[-15:]))
        return installed.returncode == 0

    def run(self, steps: Sequence[Step]) -> int:
        """Run ``steps`` as ``schedule`` plans them, for real; the exit status: 1 if a step
        failed, was cut or did not start within BUDGET_S."""
        self.out.mkdir(parents=True, exist_ok=True)
        planned = plan(self.out, self.gpus, self.knobs)
        what_ran = {
            "command": self.command(),
            "commit": self.commit,
            "cores": self.cores,
            "gpus": self.gpus,
            "planned": {step.name: step.planned_s for step in planned},
            "steps": [step.name for step in steps],
        }
        (self.out / "recipe.json").write_text(json.dumps(what_ran, indent=1))
        deadline = None if self.budget_s is None else time.monotonic() + self.budget_s
        waiting, status = in_order(steps), 0
        running: list[Run] = []
        try:
            while waiting or running:
                for run in [run for run in running if run.process.poll() is not None]:
                    running.remove(run)
                    status |= self.finished(run)
                now = time.monotonic()
                if deadline is not None and now >= deadline and waiting:
                    for late in waiting:
                        print(f"{late.name}: not run, BUDGET_S ({self.budget_s} s) spent")
                    waiting, status = [], 1
                for run in running:
                    self.stop_if_due(run, now)
                step = next_to_start(waiting, [run.step for run in running], self.cores, self.jobs)
                if step is None:
                    time.sleep(0.5)
                    continue
                waiting.remove(step)
                run = Run(step, self.start(step), now, now + step.limit_s)
                if deadline is not None and deadline < run.stop_at:
                    run.stop_at, run.stop_reason = deadline, "budget"
                running.append(run)
        except KeyboardInterrupt:
            for run in running:
                run.stop_at, run.stop_reason = 0, "interrupt"
                self.stop_if_due(run, time.monotonic())
                run.process.wait()
                self.finished(run)
            raise
        return status

    def start(self, step: Step) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        paths = [step.pythonpath] if step.pythonpath else []
        if step.needs_module and importlib.util.find_spec(step.needs_module) is None:
            paths += self.from_wheel(step)
        if paths:
            env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(":")
        print(f"{step.name}: started (planned {step.planned_s} s, limit {step.limit_s} s)")
        with (self.out / f"{step.name}.log").open("ab") as log:
            return subprocess.Popen(
                step.argv(self.out),
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def from_wheel(self, step: Step) -> list[str]:
        """A folder holding ``step.needs_module`` installed from its wheel in WHEELS (for this
        step only: elsewhere it stays uninstalled), or nothing: the step then fails saying so."""
        wheels = ROOT / self.knobs.get("WHEELS", "wheels")
        distribution = str(step.needs_module)
        found = sorted(wheels.glob(f"{distribution}-*.whl"))
        log = self.out / f"{step.name}.log"
        if not found:
            log.write_text(
                f"{distribution} is not installed and {wheels} holds no {distribution}-*.whl: "
                f"on a machine with network, pip download --no-deps "
                f"{distribution.replace('_', '-')} -d {wheels.name}, and carry that folder\n"
            )
            return []
        target = self.out / f"site-{distribution}"
        with log.open("ab") as output:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    "--no-index",
                    "--target",
                    str(target),
                    str(found[-1]),
                ],
                stdout=output,
                stderr=subprocess.STDOUT,
                check=False,
            )
        return [str(target)]

    def stop_if_due(self, run: Run, now: float) -> None:
        """SIGINT to the step's process group at its stop time (pytest then writes what it
        has), SIGKILL GRACE_S later."""
        if now >= run.stop_at and run.cut is None:
            run.cut, run.killed_at = run.stop_reason, now + GRACE_S
            print(f"{run.step.name}: cut by its {run.cut} at {now - run.started:.0f} s")
            signalled = signal.SIGINT
        elif run.killed_at is not None and now >= run.killed_at:
            run.killed_at, signalled = None, signal.SIGKILL
        else:
            return
        with contextlib.suppress(ProcessLookupError):  # the group has ended meanwhile
            os.killpg(run.process.pid, signalled)

    def finished(self, run: Run) -> int:
        """Record a step that ended; 1 if it failed or was cut."""
        seconds = time.monotonic() - run.started
        code = run.process.returncode
        record = {
            "step": run.step.name,
            "exit": code,
            "seconds": round(seconds, 1),
            "planned_s": run.step.planned_s,
            "limit_s": run.step.limit_s,
            "cut": run.cut,
        }
        with (self.out / "steps.jsonl").open("a") as steps:
            steps.write(json.dumps(record) + "\n")
        how = f"cut by its {run.cut}, " if run.cut else ""
        print(
            f"{run.step.name}: {how}exit {code} in {seconds:.0f} s (planned {run.step.planned_s} s)"
        )
        if code != 0:
            lines = (self.out / f"{run.step.name}.log").read_text(errors="replace").splitlines()
            print("\n".join(f"  | {line}" for line in lines[-15:]))
        return int(code != 0 or run.cut is not None)

    def reports(self) -> int:
        """The benchmark report (when a benchmark step wrote its JSON) and the GPU report."""
        status = 0
        runs = [self.out / name for name in BENCH_JSON.values() if (self.out / name).exists()]
        if runs:
            bench = subprocess.run(
                [
                    sys.executable,
                    "scripts/bench_report.py",
                    *map(str, runs),
                    "--out",
                    str(self.out / f"bench-{self.label}.md"),
                    "--plot",
                    str(self.out / f"bench-{self.label}.png"),
                    "--check",
                ],
                cwd=ROOT,
                check=False,
            )
            status |= int(bench.returncode != 0)
        report = subprocess.run(
            [
                sys.executable,
                "scripts/gpu_report.py",
                str(self.out),
                "--label",
                self.label,
                "--out",
                str(self.out / f"gpu-{self.label}.md"),
            ],
            cwd=ROOT,
            check=False,
        )
        return status | int(report.returncode != 0)


def git_commit() -> str:
    """This clone's HEAD, with -dirty for uncommitted changes; "unknown" outside a clone."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT, check=False)
    return head.stdout.strip() + ("-dirty" if dirty.returncode != 0 else "")


def gpu_count(knobs: Mapping[str, str]) -> int:
    if knobs.get("GPUS"):
        return int(knobs["GPUS"])
    counted = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(counted.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    dry_run = args[:1] == ["--dry-run"]
    args = args[dry_run:]
    if not 1 <= len(args) <= 2:
        raise SystemExit("usage: gpu_recipe.py [--dry-run] OUTDIR [LABEL]")
    knobs = {name: os.environ[name] for name in (*KNOBS, *RECORDING_KNOBS) if os.environ.get(name)}
    recipe = Recipe(
        out=Path(args[0]).resolve(),
        label=args[1] if len(args) > 1 else "gpu",
        commit=knobs.get("GIT_COMMIT") or git_commit(),
        gpus=gpu_count(knobs),
        cores=int(knobs.get("CORES") or os.cpu_count() or 1),
        jobs=int(knobs["JOBS"]) if knobs.get("JOBS") else None,
        budget_s=int(knobs["BUDGET_S"]) if knobs.get("BUDGET_S") else None,
        knobs=knobs,
    )
    print(f"commit: {recipe.commit}")
    steps = recipe.steps()
    install = knobs.get("SKIP_INSTALL") != "1"
    if dry_run:
        recipe.print_plan(steps, install)
        return 0
    if install and not recipe.install():
        return 1
    return recipe.run(steps) | recipe.reports()


if __name__ == "__main__":
    sys.exit(main())
