#!/usr/bin/env bash
# The H200 lane on a GPU node that reaches no package index (docs/gpu-runners.md): unpack an sglang package
# bundle (the packages of a release's lock that the node lacks; never torch, triton or torch's CUDA libraries) and write
# the interpreter wrappers that `servematrix run --backend existing --python WRAPPER` serves with.
#
#   bash ci/gpu/h200-bundle.sh 0.5.12 PARTS_DIR EXTRA_DIR   # PARTS_DIR: site.tar.xz.*; EXTRA_DIR: extra-wheels/
#                                                           # and override-kernels-0.14.1/
#   bash ci/gpu/h200-bundle.sh 0.5.15 PARTS_DIR             # one tarball holds everything (as
#                                                           # ci/gpu/make_bundle.py makes one)
#
# Writes /tmp/py-<release> (and /tmp/py-0.5.12-kernels-0.14.1) and prints the harness's PYTHONPATH line.
set -euo pipefail
release=$1
parts=$2
site=/tmp/site-$release
rm -rf "$site" && mkdir -p "$site"
cat "$parts"/site.tar.xz.* | xz -d -T0 | tar -x -C "$site"
path=$site
# A package's .pth file adds its directories to sys.path only in a site directory, which PYTHONPATH is not:
# nvidia-cutlass-dsl puts `cutlass` under nvidia_cutlass_dsl/python_packages that way, and without it sglang
# 0.5.15 skips the modules that import it and serves GLM-5's architecture through its Transformers fallback
# (seen on a device node, 2026-12-05). Its directory lines (not its `import` lines) join the path. Its last
# line may lack a newline (nvidia-cutlass-dsl 4.5.2's only line does), which `read` returns false on.
for pth in "$site"/*.pth; do
  [ -e "$pth" ] || continue
  while IFS= read -r line || [ -n "$line" ]; do
    case $line in ''|'#'*|import*) continue ;; esac
    path=$path:$site/$line
  done < "$pth"
done
if [ "$release" = "0.5.12" ]; then
  extra=$3
  python3 -m pip install -q --no-index --no-deps --target "$site-x" "$extra"/extra-wheels/*.whl
  python3 -m pip install -q --no-index --no-deps --target "$site-k014" "$extra"/override-kernels-0.14.1/*.whl
  path=$site-x:$path
  printf '#!/bin/sh\nPYTHONPATH=%s exec python3 "$@"\n' "$site-k014:$path" > "/tmp/py-$release-kernels-0.14.1"
  chmod +x "/tmp/py-$release-kernels-0.14.1"
fi
printf '#!/bin/sh\nPYTHONPATH=%s exec python3 "$@"\n' "$path" > "/tmp/py-$release"
chmod +x "/tmp/py-$release"
# 0.5.12's lock as resolved (kernels 0.17.2) dies at `import sglang` by design (the lane's import-conflict
# cell): check the wrapper that serves, or `set -e` stops here after the wrappers are written.
check=/tmp/py-$release
[ "$release" = "0.5.12" ] && check=/tmp/py-$release-kernels-0.14.1
"$check" -c "import sglang, transformers, torch; print('bundle', sglang.__version__, transformers.__version__, torch.__version__)"
# sglang skips a model module that fails to import ("Ignore import error when loading ...") and serves its
# architectures through its Transformers fallback, which cannot serve GLM-5's (signature transformers-fallback;
# a bundle without nvidia-cutlass-dsl did that, 2026-12-05). Check the lanes' architectures before any GPU time.
"$check" -c "
from sglang.srt.models.registry import ModelRegistry
lanes = ('LlamaForCausalLM', 'GlmMoeDsaForCausalLM')
missing = [arch for arch in lanes if arch not in ModelRegistry.models]
if missing:
    raise SystemExit(f'sglang has no class of its own for {missing}: a model module did not import (above)')
print('registry: sglang serves', ', '.join(lanes), 'with its own classes')
"
# The harness itself needs pydantic, which the bundle carries: its path goes after the project's src.
echo "HARNESS_PYTHONPATH=$PWD/src:$path"
