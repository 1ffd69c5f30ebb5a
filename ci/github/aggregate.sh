#!/usr/bin/env bash
# The aggregate job of .github/workflows/matrix.yml: merge the run jobs' stores, publish the table (merged
# into DOCS_DIR's published results: cells no job reached keep theirs).
#   bash ci/github/aggregate.sh STORES_DIR OUT.sqlite DOCS_DIR
# A job that failed or timed out still uploaded what it finished; a store that arrived twice (a re-run
# attempt) merges to the same rows.
set -euo pipefail
stores_dir=${1:?STORES_DIR} out=${2:?OUT.sqlite} docs=${3:?DOCS_DIR}

shopt -s nullglob
stores=("$stores_dir"/*.sqlite)
if [ "${#stores[@]}" -eq 0 ]; then
  echo "::error::no run job uploaded a store to merge"
  exit 1
fi
servematrix merge "$out" "${stores[@]}"
servematrix report --publish --store "$out" --out "$docs"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then cat "$docs/compatibility.md" >>"$GITHUB_STEP_SUMMARY"; fi
