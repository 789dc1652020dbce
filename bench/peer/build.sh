#!/usr/bin/env bash
# bench/peer/build.sh — build llama.cpp outside the checkout, and
# peer_llama (peer_llama.c) against it, for benchmarks side by side and
# reference logits (bench/README.md "llama.cpp side by side").
#
#   bench/peer/build.sh SRC [OUT]      (OUT default /tmp/dspark-peer)
#
# SRC is either a llama.cpp checkout (its CMakeLists.txt is used: CPU only,
# native) or a tree holding llama.cpp's and ggml's sources without a build
# system, as ollama vendors them (llama/llama.cpp and ml/backend/ggml/ggml
# below SRC): then bench/peer/Makefile compiles them. Prints the path of
# peer_llama. Needs gcc, g++, make (and cmake for a checkout).
# ARCH=-march=haswell (say) builds for that CPU instead of this one's
# (-march=native): llama.cpp's AVX2 code beside dspark's --kernel avx2.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${1:?usage: build.sh SRC [OUT]}
out=${2:-/tmp/dspark-peer}
mkdir -p "$out"
jobs=${JOBS:-$(nproc)}
arch=${ARCH:--march=native}
if [ -f "$src/CMakeLists.txt" ] && [ -d "$src/ggml" ]; then
    native=ON
    [ "$arch" = -march=native ] || native=OFF
    cmake -S "$src" -B "$out/cmake" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=$native \
          -DCMAKE_C_FLAGS="$arch" -DCMAKE_CXX_FLAGS="$arch" \
          -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
    cmake --build "$out/cmake" --target llama -j"$jobs" >/dev/null
    libs=$(find "$out/cmake" -name 'libllama.a' -o -name 'libggml*.a' | sort -r | tr '\n' ' ')
    gcc -O2 $arch -std=gnu11 -I"$src/include" -I"$src/ggml/include" "$here/peer_llama.c" \
        -Wl,--start-group $libs -Wl,--end-group -lstdc++ -lm -lgomp -pthread -o "$out/peer_llama"
elif [ -d "$src/llama/llama.cpp/src" ] && [ -d "$src/ml/backend/ggml/ggml/src" ]; then
    make -s -f "$here/Makefile" -j"$jobs" GGML="$src/ml/backend/ggml/ggml" LLAMA="$src/llama/llama.cpp" \
         O="$out" ARCH="$arch" "$out/peer_llama"
else
    echo "build.sh: $src is neither a llama.cpp checkout nor an ollama tree with llama.cpp vendored" >&2
    exit 2
fi
echo "$out/peer_llama"
