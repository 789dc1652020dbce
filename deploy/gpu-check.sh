#!/usr/bin/env bash
# gpu-check.sh — everything a session on a GPU machine runs in one go: shows
# the GPU (nvidia-smi), builds with CUDA (-DDS_CUDA=ON, only the targets the
# checks need), checks that dspark-center loads its CUDA module
# (dspark-cuda.so) and sees the GPU, runs the GPU tests (ctest -L gpu: kernels.cuda and
# shared.engine_cuda, CUDA against the CPU FP32 engine) and a short CUDA
# batched-decode benchmark (bench_batch --backend cuda, shapes 15m, 110m, 1b,
# streams 1..64; baselines: 110m with DSPARK_CUDA_GRAPHS=0, 110m and 1b with
# DSPARK_CUDA_GEMV=0) and speculative decoding with an FP16 CUDA target and the
# INT8 CPU draft (bench_spec --backend cuda, 110M shape). Budget: about 5 minutes on an H200
# box with 16 cores (the 1b model file, 2.2 GB of random F16 weights, is
# written once into $DS_BENCH_DIR and reused); a prebuilt run took 35 s.
#
# Output: everything (logs, ctest output, bench tables and JSON) goes to
# $OUT when set, else to build-gpu/gpu-check. Exit status: non-zero when the
# build, a GPU test or a benchmark fails, or when no GPU is visible (then the
# tests would only skip, which is not a check).
#
# Models: the tests read stories260K.bin, stories260K.gguf, tok512.bin and
# README.md (the reference text) from DS_MODELS_DIR, default ../shared/models
# beside the checkout, else build-gpu/models inside it. A remote GPU machine
# that gets only the working tree: copy them there first (4 MB) and carry
# that ignored folder along:
#   mkdir -p build-gpu/models && cp ../shared/models/{stories260K.*,tok512.bin,README.md} build-gpu/models
#
# Prebuilt: a GPU box without the build dependencies (no -dev packages, no
# network) runs a build made elsewhere: deploy/gpu-bundle.sh packs build-gpu
# (the test and bench programs, the CTest files, the shared libraries they
# need beyond libc and CUDA, and the test models) into one tarball; unpack it
# in the checkout on the GPU box and run this script with DS_GPU_CHECK_BUILD=0.
#
# Environment: DS_MODELS_DIR (see Models), DS_BENCH_DIR (default
#              /tmp/dspark-bench), DS_GPU_CHECK_SHAPES (default "15m 110m 1b"),
#              CUDAARCHS (default: native, i.e. the GPU present),
#              DS_GPU_CHECK_JOBS (build jobs, default: CPUs),
#              DS_GPU_CHECK_BUILD (default 1; 0: use build-gpu as it is).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-build-gpu/gpu-check}
mkdir -p "$out"
log() { echo "gpu-check: $*" | tee -a "$out/summary.txt"; }
fail=0

log "start $(date -u +%FT%TZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if ! nvidia-smi 2>&1 | tee "$out/nvidia-smi.txt"; then
  log "FAIL: nvidia-smi does not run: no GPU or no driver here"
  exit 1
fi

models=${DS_MODELS_DIR:-$PWD/../shared/models}
[ -n "${DS_MODELS_DIR:-}" ] || [ -d "$models" ] || models=$PWD/build-gpu/models
for f in stories260K.bin tok512.bin stories260K.gguf README.md; do
  if [ ! -f "$models/$f" ]; then
    log "FAIL: $models/$f is missing (set DS_MODELS_DIR to the test models)"
    exit 1
  fi
done
export PATH=$PATH:/usr/local/cuda/bin
build=${DS_GPU_CHECK_BUILD:-1}
tools="ctest"
[ "$build" = 0 ] || tools="cmake ctest nvcc"
for tool in $tools; do
  command -v "$tool" >/dev/null || { log "FAIL: $tool not found"; exit 1; }
done
export CUDAARCHS=${CUDAARCHS:-native}
# A bundle's own libraries (deploy/gpu-bundle.sh) come before the system's.
[ -d build-gpu/lib ] && export LD_LIBRARY_PATH=$PWD/build-gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

t0=$SECONDS
if [ "$build" = 0 ]; then
  log "build: skipped (DS_GPU_CHECK_BUILD=0), using build-gpu as it is"
elif ! { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DDS_CUDA=ON -DDS_FATAL_WARNINGS=ON \
         -DDS_MODELS_DIR="$models" &&
       cmake --build build-gpu -j "${DS_GPU_CHECK_JOBS:-$(nproc)}" --target test_kernels_cuda test_shared_engine_cuda bench_batch bench_spec dspark-center dspark-cuda
     } >"$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  log "FAIL: build (see build.log)"
  exit 1
else
  log "build: $((SECONDS - t0)) s"
fi
# The center's module, as a packaged center would load it: it must see the GPU.
v=$(build-gpu/center-node/dspark-center --version 2>&1)
log "$v"
if ! echo "$v" | grep -qE '\(cuda\): [1-9][0-9]* device'; then
  log "FAIL: dspark-center does not see the GPU through dspark-cuda.so"
  fail=1
fi

t0=$SECONDS
ctest --test-dir build-gpu -L gpu --output-on-failure -V >"$out/ctest-gpu.log" 2>&1
rc=$?
grep -E "cuda vs cpu|greedy on cuda|device 0|tests passed|Passed|Failed|Skipped|\*\*\*" "$out/ctest-gpu.log" |
  tee -a "$out/summary.txt"
if [ $rc -ne 0 ] || grep -q "Skipped" "$out/ctest-gpu.log"; then
  log "FAIL: GPU tests (rc $rc; a skip counts as a failure here; see ctest-gpu.log)"
  fail=1
fi
log "tests: $((SECONDS - t0)) s"

# bench NAME TIMEOUT ARGS...: build-gpu/bench/ARGS under a time limit, its
# table to the summary and $out/NAME.{txt,json,err}.
bench() {
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  if timeout "$limit" "build-gpu/bench/$1" "${@:2}" --dir "${DS_BENCH_DIR:-/tmp/dspark-bench}" \
       --json "$out/$name.json" >"$out/$name.txt" 2>"$out/$name.err"; then
    tee -a "$out/summary.txt" <"$out/$name.txt"
  else
    tail -5 "$out/$name.err"
    log "FAIL: $*"
    fail=1
  fi
  log "$name: $((SECONDS - t0)) s"
}

for shape in ${DS_GPU_CHECK_SHAPES:-15m 110m 1b}; do
  bench "bench-batch-cuda-$shape" 240 bench_batch --backend cuda --shape "$shape" --steps 32 --reps 3
done
# The same without CUDA graphs (each op launched as it comes): the baseline
# of the graphs' gain, measured in the same run.
export DSPARK_CUDA_GRAPHS=0
bench bench-batch-cuda-110m-nographs 240 bench_batch --backend cuda --shape 110m --steps 32 --reps 3
unset DSPARK_CUDA_GRAPHS
# And without our GEMV kernel (every product through cuBLAS), graphs on.
export DSPARK_CUDA_GEMV=0
for shape in 110m 1b; do
  bench "bench-batch-cuda-$shape-nogemv" 240 bench_batch --backend cuda --shape "$shape" --steps 32 --reps 3
done
unset DSPARK_CUDA_GEMV
# Speculative decoding with the target in FP16 on the GPU and the INT8 draft
# on the CPU (110M shape, random weights, k = 1..8 and adaptive).
bench bench-spec-cuda 300 bench_spec --backend cuda --models 110m --reps 2

log "done $(date -u +%FT%TZ): $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
