#!/usr/bin/env bash
# Build this repository's two distributions, pytest-cudagraph and reasyn-ref (an sdist and a
# wheel each), into OUTDIR and check them with twine. Used by .ci/run and the release workflow.
#
#   bash scripts/build_dists.sh OUTDIR
#
# Needs `build` and `twine` (CI installs them; they are no extra of the project). Builds from a
# copy of the tree as git sees it (tracked and untracked files, none it ignores), since building
# an sdist writes its egg-info beside the sources, where importlib.metadata would then find a
# second pytest-cudagraph.
set -euo pipefail
out="${1:?usage: build_dists.sh OUTDIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
copy="$(mktemp -d)"
trap 'rm -rf "$copy"' EXIT
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$copy"
python -m build --outdir "$out" "$copy"
python -m build --outdir "$out" "$copy/reasyn_ref"
python -m twine check --strict "$out"/*
