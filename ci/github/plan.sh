#!/usr/bin/env bash
# The plan job of .github/workflows/matrix.yml: the grouped matrix for the run jobs, as step outputs.
#   matrix  `servematrix plan --format github`: {"include": [{name, gpu, runs-on, select, shard, cells,
#           environments, timeout-minutes}, ...]}, at most 256 jobs, both modes of an environment in one job
#   jobs    how many run jobs (0: the run and aggregate jobs are skipped)
#   python  the matrix's Python, which the run jobs install beside the harness's
# Env: MATRIX, SELECT (may be empty). Writes to $GITHUB_OUTPUT (stdout when unset).
set -euo pipefail

args=("${MATRIX:?}")
if [ -n "${SELECT:-}" ]; then args+=(--select "$SELECT"); fi
matrix=$(servematrix plan "${args[@]}" --format github)
jobs=$(python3 -c 'import json, sys; print(len(json.load(sys.stdin)["include"]))' <<<"$matrix")
python=$(python3 -c 'import sys; from servematrix.config.spec import load_spec; print(load_spec(sys.argv[1]).file.python)' "$MATRIX")

{
  echo "matrix=$matrix"
  echo "jobs=$jobs"
  echo "python=$python"
} >>"${GITHUB_OUTPUT:-/dev/stdout}"

if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  python3 - "$MATRIX" "$matrix" >>"$GITHUB_STEP_SUMMARY" <<'PY'
import json, sys
jobs = json.loads(sys.argv[2])["include"]
print(f"### {sys.argv[1]}: {sum(j['cells'] for j in jobs)} cells in {len(jobs)} job(s)\n")
print("| job | select | shard | cells | runner labels | timeout |\n|---|---|---|---|---|---|")
for j in jobs:
    labels = ", ".join(j["runs-on"])
    print(f"| {j['name']} | `{j['select']}` | {j['shard']} | {j['cells']} | {labels} | {j['timeout-minutes']} min |")
PY
fi
