#!/usr/bin/env bash
# gpu-bundle.sh — packs a CUDA build made here (build-gpu) for a GPU box that
# has the NVIDIA driver and CUDA runtime but none of dspark's build
# dependencies (no -dev packages, no network): the GPU test and bench
# programs, dspark-center and dspark-cuda.so, the CTest files, every shared
# library they load except libc's family and CUDA's own (copied to
# build-gpu/lib, which deploy/gpu-check.sh puts first on LD_LIBRARY_PATH), and
# the test models deploy/gpu-check.sh needs (to build-gpu/models).
#
# Usage: deploy/gpu-bundle.sh OUT.tar.xz
#   Build first, with the models folder inside the build (the tests hold the
#   path compiled in) and the Hopper/Ampere targets you need:
#     cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DDS_CUDA=ON \
#           -DCMAKE_CUDA_ARCHITECTURES=90 -DDS_MODELS_DIR=$PWD/build-gpu/models
#     cmake --build build-gpu -j --target test_kernels_cuda \
#           test_shared_engine_cuda bench_batch bench_spec dspark-center dspark-cuda
#   On the GPU box, in a checkout at the same path (CTest files are absolute):
#     tar xf OUT.tar.xz && DS_GPU_CHECK_BUILD=0 deploy/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# = 1 ] || { echo "usage: $0 OUT.tar.xz (see the header of this script)" >&2; exit 2; }
out=$(realpath -m "$1")
b=build-gpu
progs="$b/tests/test_kernels_cuda $b/tests/test_shared_engine_cuda $b/bench/bench_batch
       $b/bench/bench_spec $b/center-node/dspark-center $b/center-node/dspark-cuda.so"
for p in $progs; do
  [ -x "$p" ] || { echo "gpu-bundle: $p is missing: build it first (see $0)" >&2; exit 1; }
done
models=$(sed -n 's/^DS_MODELS_DIR:[A-Z]*=//p' $b/CMakeCache.txt)
case "$models" in
  "$PWD/$b/models") ;;
  *) echo "gpu-bundle: build-gpu reads its models from '$models'; configure it with" \
          "-DDS_MODELS_DIR=$PWD/$b/models so the bundle carries them" >&2; exit 1 ;;
esac
mkdir -p "$b/models" "$b/lib"
src=${DS_SHARED_MODELS:-../shared/models}
cp "$src"/{stories260K.bin,stories260K.gguf,tok512.bin,README.md} "$b/models/"
# Libraries outside libc's family and CUDA's (the GPU box brings its own).
# shellcheck disable=SC2086
ldd $progs | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas(Lt)?)\.so' |
  while read -r l; do cp -L "$l" "$b/lib/"; done
# shellcheck disable=SC2086,SC2046
tar -cJf "$out" $progs $b/models $b/lib $(find $b -name CTestTestfile.cmake) $b/CMakeCache.txt
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1)): $(find $b/lib -type f | wc -l) libraries, models, 6 programs"
