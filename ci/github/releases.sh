#!/usr/bin/env bash
# The watch job of .github/workflows/releases.yml: the index's releases the matrix lacks written into it
# (`servematrix releases --add`), the CPU pre-flight of the new environments alone (every other cell keeps its
# published verdict), and the pull request's body: the releases table and the new cells' preview table.
#   added   true when the matrix changed (the pull request step runs only then)
#   title   the pull request's title
#   body    the file holding its body
#   cells   how many new cells were pre-flighted
# Env: MATRIX; SINCE (optional, e.g. sglang=0.5.10), STAGES (default resolve,probe), STORE (default
# releases.sqlite), OUT (default .releases: the table, the JSON, the preview report and the body).
# Writes to $GITHUB_OUTPUT (stdout when unset).
set -euo pipefail

matrix=${MATRIX:?}
out=${OUT:-.releases}
stages=${STAGES:-resolve,probe}
store=${STORE:-releases.sqlite}
mkdir -p "$out"

args=("$matrix")
if [ -n "${SINCE:-}" ]; then args+=(--since "$SINCE"); fi
# The listing before anything is written: the table the pull request shows.
servematrix releases "${args[@]}" >"$out/releases.txt"
servematrix releases "${args[@]}" --add --format json >"$out/releases.json"

read -r envs values < <(python3 - "$out/releases.json" <<'PY'
import json, sys
added = json.load(open(sys.argv[1]))["added"] or {"new_envs": [], "values": {}}
values = "; ".join(f"{axis} {', '.join(v)}" for axis, v in added["values"].items())
print("|".join(added["new_envs"]) or "-", values or "-")
PY
)

if [ "$envs" = "-" ]; then
  echo "added=false" >>"${GITHUB_OUTPUT:-/dev/stdout}"
  exit 0
fi

# Only the new environments: the cells the matrix had are decided already, and their ids did not change.
servematrix run "$matrix" --select "env=$envs" --stages "$stages" --store "$store"
servematrix report --store "$store" --out "$out/report"
cells=$(servematrix plan "$matrix" --select "env=$envs" --format json | python3 -c 'import json, sys; print(len(json.load(sys.stdin)))')

{
  echo "New releases on the index, written into \`$matrix\` by \`servematrix releases --add\`: $values."
  echo
  echo '```text'
  cat "$out/releases.txt"
  echo '```'
  echo
  echo "### CPU pre-flight ($stages) of the $cells new cell(s)"
  echo
  cat "$out/report/compatibility.md"
} >"$out/body.md"

{
  echo "added=true"
  echo "title=matrix: add $values (release watcher)"
  echo "body=$out/body.md"
  echo "cells=$cells"
} >>"${GITHUB_OUTPUT:-/dev/stdout}"
