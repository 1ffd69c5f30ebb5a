#!/usr/bin/env bash
# GLM-5's Hopper kernels on top of the unpacked sglang 0.5.12 bundle (run ci/gpu/h200-bundle.sh 0.5.12 first):
# FlashMLA's library (sgl_kernel/flashmla_ops.abi3.so, which the bundle leaves out; sparse attention) and DeepGEMM
# (sgl-deep-gemm 0.1.0, 0.5.12's pin; the DSA indexer's fp8_mqa_logits and fp8_paged_mqa_logits). FA3
# (sgl_kernel/flash_ops.abi3.so, 1.07 GB) stays out: matrix/h200-glm5.toml serves without it.
#
#   bash ci/gpu/h200-glm5.sh make KDIR WHEELDIR  # here: KDIR gets flashmla_ops.abi3.so.xz (1.1 MB) and the
#                                                # DeepGEMM wheel (4.5 MB), from the wheels in WHEELDIR
#                                                # (sglang_kernel-0.4.2.post2-*.whl, sgl_deep_gemm-0.1.0-*.whl)
#   bash ci/gpu/h200-glm5.sh add KDIR            # on the GPU node: adds them to /tmp/site-0.5.12(-x)
#
# DeepGEMM JIT-compiles its kernels with nvcc at run time: the server needs CUDA_HOME (printed at the end).
set -euo pipefail
verb=$1
kdir=$2
site=/tmp/site-0.5.12
case "$verb" in
make)
  wheels=$3
  mkdir -p "$kdir"
  tmp=$(mktemp -d)
  unzip -q -o "$wheels"/sglang_kernel-0.4.2.post2-*.whl 'sgl_kernel/flashmla_ops.abi3.so' -d "$tmp"
  xz -6 -c "$tmp/sgl_kernel/flashmla_ops.abi3.so" > "$kdir/flashmla_ops.abi3.so.xz"
  rm -rf "$tmp"
  cp "$wheels"/sgl_deep_gemm-0.1.0-*.whl "$kdir/"
  ls -l "$kdir"
  ;;
add)
  test -d "$site/sgl_kernel" || { echo "no $site: run ci/gpu/h200-bundle.sh 0.5.12 first" >&2; exit 2; }
  xz -dc "$kdir/flashmla_ops.abi3.so.xz" > "$site/sgl_kernel/flashmla_ops.abi3.so"
  # DeepGEMM needs apache-tvm-ffi 0.1.9, which the bundle's extra wheels already put in $site-x.
  python3 -m pip install -q --no-index --no-deps --target "$site-x" "$kdir"/sgl_deep_gemm-0.1.0-*.whl
  cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
  py=/tmp/py-0.5.12-kernels-0.14.1
  CUDA_HOME=$cuda_home "$py" -c "import sgl_kernel.flash_mla as f, deep_gemm
assert f._flashmla_import_error is None, f._flashmla_import_error
print('flashmla ok; deep_gemm ok, SMs:', deep_gemm.get_num_sms())"
  echo "export CUDA_HOME=$cuda_home"
  ;;
*)
  echo "usage: $0 make KDIR WHEELDIR | add KDIR" >&2
  exit 2
  ;;
esac
