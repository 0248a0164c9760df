#!/usr/bin/env bash
# The GPU recipe, written once (tox -e gpu and .github/workflows/gpu.yml call it too): the
# benchmarks with their goals judged, alone on the machine; then side by side within the host's
# cores, slowest first: the project's GPU tests (-m cuda: every broken and correct twin
# included; the CPU tests are CI's), order independence of the suite's checks under
# pytest-randomly, the stability of its verdicts (five runs of each target side by side), its
# verdicts on emulated graphs against real ones, and the conformance suite against reasyn_ref's
# three targets, the own-graphs examples and the README's quick start (with two GPUs or more,
# once more under xdist); then a markdown report. The steps, their planned seconds, the schedule
# and the parts are scripts/gpu_recipe.py's.
#
#   bash scripts/gpu_suite.sh OUTDIR [label]            e.g. on the device tool: bash scripts/gpu_suite.sh $OUT h200
#   bash scripts/gpu_suite.sh --dry-run OUTDIR [label]  the plan: each step's command, start and seconds, the total
#
# The reports are written under the names reports/ keeps, one per machine kind (label):
# OUTDIR/gpu-LABEL.md, and with the benchmarks OUTDIR/bench-LABEL.md and bench-LABEL.png.
# Copy them into reports/ as they are (reports/README.md).
#
# Knobs (environment): STEPS (the steps to run, names separated by spaces; default all),
# BUDGET_S (the run's seconds: a step still running then is interrupted and keeps its partial
# results, one not started is not run), CORES (host cores to plan for; default all), JOBS (at
# most this many steps at once), GPUS (GPUs to plan for; default what torch sees), TEST_ARGS
# (more pytest arguments for the three steps of the project's tests), SKIP_BENCH=1,
# BENCH_COMPARE=1 (compare with the committed baseline of the running stack and fail on a
# median 25% slower), BENCH_ARGS (more pytest-benchmark arguments), SKIP_INSTALL=1 (the caller
# installed both distributions; otherwise an editable install of both, offline:
# --no-deps --no-build-isolation, which needs setuptools 77 or later), WHEELS (the folder of
# wheels a step may need and the host may lack, pytest-randomly's; default wheels/, git-ignored:
# `pip download --no-deps pytest-randomly -d wheels` where there is network, and carry it),
# GIT_COMMIT (the commit the report names; default this clone's HEAD, -dirty when changed).
#
# Each step is cut at its limit (half again its planned seconds, and a minute) with SIGINT, so
# that pytest writes the results it has. Steps may fail; the run goes on so the report shows
# every outcome, and exits non-zero if any step failed, was cut or did not run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
exec python3 scripts/gpu_recipe.py "$@"
