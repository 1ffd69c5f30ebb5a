#!/usr/bin/env bash
# The README's first command as a new user meets it, measured: a fresh clone of this checkout's HEAD, a new
# venv, an empty uv cache, then `pip install nox uv && nox -s matrix [ARGS...]`. Prints the wall time, how
# much uv's cache grew (what was downloaded), the workdir's size at the end, the verdict counts, and the ratio
# against a baseline: the figure issue 25 measured for the same command before reuse (20 min 17 s, 45 GB on a
# 2-core CPU host), or, with BASELINE_S and BASELINE_GB set, one measured earlier in the same session.
#
#   ci/bench/first-run.sh                 # the README job: reuses the published verdicts
#   ci/bench/first-run.sh --fresh         # decides every cell from nothing
#
# Needs about 50 GB free for --fresh (CUDA builds of torch in uv's cache); the README job needs about 2.
# Scratch space: $BENCH_DIR (default: a new folder under /tmp), removed at the end unless KEEP=1.
set -euo pipefail

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
scratch=${BENCH_DIR:-$(mktemp -d /tmp/servematrix-first-run.XXXXXX)}
baseline_s=${BASELINE_S:-1217}
baseline_gb=${BASELINE_GB:-45}
mkdir -p "$scratch"
cleanup() { [ "${KEEP:-0}" = 1 ] || rm -rf "$scratch"; }
trap cleanup EXIT

git clone --quiet "$repo" "$scratch/clone"
python3 -m venv "$scratch/venv"
mkdir -p "$scratch/uv-cache"
export UV_CACHE_DIR="$scratch/uv-cache" PATH="$scratch/venv/bin:$PATH" PYTHONUNBUFFERED=1

started=$(date +%s.%N)
(
  cd "$scratch/clone"
  pip install --quiet nox uv
  nox -s matrix -- "$@"
) 2>&1 | tee "$scratch/run.log"
ended=$(date +%s.%N)

seconds=$(python3 -c "print(f'{$ended - $started:.0f}')")
cache_gb=$(du -sb "$scratch/uv-cache" | python3 -c "import sys; print(f'{int(sys.stdin.read().split()[0]) / 1e9:.2f}')")
workdir_gb=$(du -sb "$scratch/clone/.servematrix" | python3 -c "import sys; print(f'{int(sys.stdin.read().split()[0]) / 1e9:.2f}')")
echo
echo "first-run: nox -s matrix -- $* on a fresh clone, empty uv cache: ${seconds} s, uv cache grew ${cache_gb} GB, workdir ${workdir_gb} GB at the end"
python3 - "$seconds" "$cache_gb" "$baseline_s" "$baseline_gb" <<'PY'
import sys

seconds, cache_gb, base_s, base_gb = map(float, sys.argv[1:])
print(f"first-run: against the baseline ({base_s:.0f} s, {base_gb:.0f} GB): time {seconds / base_s:.3f}x, download {cache_gb / base_gb:.3f}x")
PY
grep -E " reused \(|decided now|^[0-9]+ cell\(s\):" "$scratch/run.log" || true
