#!/usr/bin/env bash
# A run job of .github/workflows/matrix.yml: its group's cells, into its own store.
# Env: MATRIX; SELECT and STAGES from the dispatch (either may be empty); GROUP_SELECT and SHARD from the
# job's matrix entry; STORE, a file name unique to the job. Server logs go to .servematrix/logs.
set -euo pipefail

args=("${MATRIX:?}")
if [ -n "${SELECT:-}" ]; then args+=(--select "$SELECT"); fi
args+=(--select "${GROUP_SELECT:?}" --shard "${SHARD:?}")
if [ -n "${STAGES:-}" ]; then args+=(--stages "$STAGES"); fi
# Every job has its own store; the aggregate job writes the one table.
args+=(--store "${STORE:?}" --no-report)

echo "ci: nox -s matrix -- ${args[*]}" >&2
exec nox -s matrix -- "${args[@]}"
