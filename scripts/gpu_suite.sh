#!/usr/bin/env bash
# The whole GPU run in one call: stack facts, the project's tests (GPU tests included), the
# conformance suite against reasyn_ref (xdist, one worker per GPU, when there are several),
# the benchmarks, and a markdown report built from all of it.
#
#   bash scripts/gpu_suite.sh OUTDIR [label]      e.g. on the device tool: bash scripts/gpu_suite.sh $OUT h200
#
# The reports are written under the names reports/ keeps, one per machine kind (label):
# OUTDIR/gpu-LABEL.md, and with the benchmarks OUTDIR/bench-LABEL.md and bench-LABEL.png.
# Copy them into reports/ as they are (reports/README.md).
#
# Knobs (environment): TEST_ARGS (the project's tests to run; default all but the benchmarks),
# SKIP_BENCH=1, BENCH_ARGS (extra pytest-benchmark arguments), STEP_TIMEOUT (seconds per step).
#
# Each step writes the plugin's results (--cudagraph-json) beside its JUnit XML and log.
# Steps may fail; the script goes on so the report shows every outcome, and exits non-zero if
# any step failed.
set -uo pipefail
out="${1:?usage: gpu_suite.sh OUTDIR [label]}"
label="${2:-gpu}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
status=0

python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 \
    || { echo "editable install failed; running from the tree" | tee -a "$out/install.log"; export PYTHONPATH="$PWD"; }

gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")

run() {  # name, then the pytest arguments
    local name=$1; shift
    echo "== $name: pytest $*"
    timeout "${STEP_TIMEOUT:-900}" python3 -m pytest "$@" --junitxml="$out/$name.xml" --cudagraph-json="$out/$name.json" -rfEs -p no:cacheprovider \
        >"$out/$name.log" 2>&1
    local rc=$?
    echo "$name exit $rc" | tee -a "$out/exits.txt"
    tail -n 25 "$out/$name.log"
    [[ $rc -eq 0 ]] || status=1
}

# shellcheck disable=SC2086  # TEST_ARGS is a list of arguments
run tests ${TEST_ARGS:-tests --ignore=tests/bench} -m "not slow"
run conformance --pyargs pytest_cudagraph.conformance --cudagraph-target reasyn
run conformance-kv --pyargs pytest_cudagraph.conformance --cudagraph-target reasyn-kv
run conformance-lean --pyargs pytest_cudagraph.conformance --cudagraph-target reasyn-lean
# The own-graphs examples (docs/own-graphs.md) and the foreign target live in tests/conformance.
PYTHONPATH=tests/conformance run conformance-compiled --pyargs pytest_cudagraph.conformance \
    --cudagraph-target examples.decode_step_target:make_target
PYTHONPATH=tests/conformance run conformance-graphed --pyargs pytest_cudagraph.conformance \
    --cudagraph-target examples.graphed_layer_target:make_target
PYTHONPATH=tests/conformance run conformance-runner --pyargs pytest_cudagraph.conformance \
    --cudagraph-target examples.bucket_runner_target:make_target
PYTHONPATH=tests/conformance run conformance-foreign --pyargs pytest_cudagraph.conformance \
    --cudagraph-target foreign:make_target
if [[ $gpus -ge 2 ]]; then  # one xdist worker per GPU
    run conformance-xdist --pyargs pytest_cudagraph.conformance --cudagraph-target reasyn -n "$gpus"
fi
if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
    run bench tests/bench --benchmark-enable --benchmark-only --benchmark-json="$out/benchmarks.json" ${BENCH_ARGS:-}
    # bench.md keeps its own name too: gpu_report.py includes it.
    if python3 scripts/bench_report.py "$out/benchmarks.json" --out "$out/bench.md" --plot "$out/bench-$label.png" \
        >>"$out/bench.log" 2>&1; then
        cp "$out/bench.md" "$out/bench-$label.md"
    else
        status=1
    fi
fi

python3 scripts/gpu_report.py "$out" --label "$label" --commit "${GIT_COMMIT:-unknown}" --out "$out/gpu-$label.md" || status=1
exit $status
