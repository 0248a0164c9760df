#!/usr/bin/env bash
# The GPU recipe, written once (tox -e gpu and .github/workflows/gpu.yml call it too): stack
# facts, the project's tests (GPU tests included), the conformance suite against reasyn_ref's
# three targets (reasyn, reasyn-kv, reasyn-lean), the own-graphs examples and the README's quick
# start (and with two GPUs or more, once more under xdist, one worker per GPU), the benchmarks,
# and a markdown report built from all of it.
#
#   bash scripts/gpu_suite.sh OUTDIR [label]            e.g. on the device tool: bash scripts/gpu_suite.sh $OUT h200
#   bash scripts/gpu_suite.sh --dry-run OUTDIR [label]  the commit and each step's command; runs nothing
#
# The reports are written under the names reports/ keeps, one per machine kind (label):
# OUTDIR/gpu-LABEL.md, and with the benchmarks OUTDIR/bench-LABEL.md and bench-LABEL.png.
# Copy them into reports/ as they are (reports/README.md).
#
# Knobs (environment): SKIP_INSTALL=1 (the caller installed both distributions; otherwise an
# editable install of both, offline: --no-deps --no-build-isolation, which needs setuptools 77
# or later), TEST_ARGS (more pytest arguments for the three steps of the project's tests, words
# without spaces, e.g. "-n 8"),
# SKIP_BENCH=1, BENCH_COMPARE=1 (compare with the committed baseline of the running stack and
# fail on a median 25% slower), BENCH_ARGS (more pytest-benchmark arguments, words without
# spaces), STEP_TIMEOUT (seconds per step), GPUS (how many GPUs to plan for; default what torch
# sees), GIT_COMMIT (the commit the report names; default this clone's HEAD, with -dirty for
# uncommitted changes), STEPS (the names of the steps to run, separated by spaces; default every
# step), JOBS (how many steps may run at once; default 1: one after another, as timings want).
#
# Each step writes the plugin's results (--cudagraph-json) beside its JUnit XML and log.
# Steps may fail; the script goes on so the report shows every outcome, and exits non-zero if
# any step failed.
set -uo pipefail
dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then
    dry_run=1
    shift
fi
out="$(realpath -m "${1:?usage: gpu_suite.sh [--dry-run] OUTDIR [label]}")"
label="${2:-gpu}"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
status=0

commit="${GIT_COMMIT:-}"
if [[ -z "$commit" ]] && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    commit=$(git rev-parse --short HEAD)
    git diff --quiet HEAD -- || commit+="-dirty"
fi
commit="${commit:-unknown}"
echo "commit: $commit"

if [[ $dry_run -eq 0 ]]; then
    mkdir -p "$out"
    if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
        python3 -c "import setuptools; print('setuptools', setuptools.__version__)" >"$out/install.log" 2>&1
        if ! python3 -m pip install -q --no-deps --no-build-isolation -e . -e ./reasyn_ref \
            >>"$out/install.log" 2>&1; then
            echo "the editable install failed (it needs setuptools 77 or later; see $out/install.log):"
            tail -n 15 "$out/install.log"
            exit 1
        fi
    fi
fi
gpus="${GPUS:-$(python3 -c "import torch; print(torch.cuda.device_count())")}"

outer_pythonpath="${PYTHONPATH:-}"
shown() {  # the command as one would type it: a word with spaces in quotes
    local word words=()
    [[ "${PYTHONPATH:-}" != "$outer_pythonpath" ]] && words+=("PYTHONPATH=$PYTHONPATH")
    for word in "$@"; do
        [[ "$word" == *" "* ]] && word="\"$word\""
        words+=("$word")
    done
    echo "${words[*]}"
}

step() {  # name, then the pytest arguments: one step, its outcome appended to exits.txt
    local name=$1; shift
    timeout "${STEP_TIMEOUT:-900}" python3 -m pytest "$@" --junitxml="$out/$name.xml" --cudagraph-json="$out/$name.json" -rfEs -p no:cacheprovider \
        >"$out/$name.log" 2>&1
    local rc=$?
    echo "$name exit $rc" | tee -a "$out/exits.txt"
    tail -n 25 "$out/$name.log"
}

run() {  # name, then the pytest arguments; with JOBS > 1 the step runs beside the others
    local name=$1
    [[ -n "${STEPS:-}" && " $STEPS " != *" $name "* ]] && return
    echo "== $name: $(shown pytest "${@:2}")"
    [[ $dry_run -eq 1 ]] && return
    if [[ "${JOBS:-1}" -le 1 ]]; then
        step "$@"
        return
    fi
    while [[ $(jobs -rp | wc -l) -ge "$JOBS" ]]; do wait -n; done
    step "$@" &
}

# The project's tests (the benchmarks apart) in three steps, so that a step that dies loses only
# its own results: the reference's tests, the broken targets' and examples' runs of the suite,
# and the rest.
# shellcheck disable=SC2086  # TEST_ARGS is a list of arguments
run tests tests --ignore=tests/bench --ignore=tests/reasyn_ref --ignore=tests/conformance ${TEST_ARGS:-}
# shellcheck disable=SC2086
run tests-reasyn-ref tests/reasyn_ref ${TEST_ARGS:-}
# shellcheck disable=SC2086
run tests-conformance tests/conformance ${TEST_ARGS:-}
run conformance --pyargs pytest_cudagraph.conformance --cudagraph-target reasyn
run conformance-kv --pyargs pytest_cudagraph.conformance --cudagraph-target reasyn-kv
run conformance-lean --pyargs pytest_cudagraph.conformance --cudagraph-target reasyn-lean
# The own-graphs examples (docs/own-graphs.md) ship in the plugin (pytest_cudagraph.examples);
# the foreign target (the hand-written example) lives in tests/conformance, the README's quick
# start in tests/project/quickstart.
run conformance-decode-step --pyargs pytest_cudagraph.conformance \
    --cudagraph-target pytest_cudagraph.examples.decode_step_target:make_target
run conformance-decode-token --pyargs pytest_cudagraph.conformance \
    --cudagraph-target pytest_cudagraph.examples.decode_token_target:make_target
run conformance-graphed-layer --pyargs pytest_cudagraph.conformance \
    --cudagraph-target pytest_cudagraph.examples.graphed_layer_target:make_target
run conformance-bucket-runner --pyargs pytest_cudagraph.conformance \
    --cudagraph-target pytest_cudagraph.examples.bucket_runner_target:make_target
run conformance-piecewise-runner --pyargs pytest_cudagraph.conformance \
    --cudagraph-target pytest_cudagraph.examples.piecewise_runner_target:make_target
run conformance-hf-static-cache --pyargs pytest_cudagraph.conformance \
    --cudagraph-target pytest_cudagraph.examples.hf_static_cache_target:make_target
PYTHONPATH=tests/conformance run conformance-foreign --pyargs pytest_cudagraph.conformance \
    --cudagraph-target foreign:make_target
PYTHONPATH=tests/project/quickstart run conformance-quickstart --pyargs pytest_cudagraph.conformance \
    --cudagraph-target my_graphs:make_target
if [[ $gpus -ge 2 ]]; then  # one xdist worker per GPU
    run conformance-xdist --pyargs pytest_cudagraph.conformance --cudagraph-target reasyn -n "$gpus"
fi
if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
    compare=()
    if [[ "${BENCH_COMPARE:-0}" == 1 ]]; then
        compare=(--benchmark-storage="file://./.benchmarks/{cudagraph_stack_id}"
            --benchmark-compare="benchmarks/baseline/{cudagraph_stack_id}/baseline.json"
            --benchmark-compare-fail=median:25%)
    fi
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
    run bench tests/bench --benchmark-enable --benchmark-only "${compare[@]}" \
        --benchmark-json="$out/benchmarks.json" ${BENCH_ARGS:-}
    wait  # the report reads what every step wrote
    # bench.md keeps its own name too: gpu_report.py includes it.
    if [[ $dry_run -eq 0 && ( -z "${STEPS:-}" || " $STEPS " == *" bench "* ) ]]; then
        if python3 scripts/bench_report.py "$out/benchmarks.json" --out "$out/bench.md" --plot "$out/bench-$label.png" \
            >>"$out/bench.log" 2>&1; then
            cp "$out/bench.md" "$out/bench-$label.md"
        else
            status=1
        fi
    fi
fi

[[ $dry_run -eq 1 ]] && exit 0
wait
# A step that did not exit 0, whether it ran in the background or not, fails the run.
grep -qv " exit 0$" "$out/exits.txt" 2>/dev/null && status=1
python3 scripts/gpu_report.py "$out" --label "$label" --commit "$commit" --out "$out/gpu-$label.md" || status=1
exit $status
