#!/usr/bin/env bash
# demo.sh — set up and run the main job: installs the Debian packages dspark
# needs, builds it, and generates text with the stories260K test model in FP32
# and in INT8, printing each answer and its speed.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${DS_MODELS_DIR:-../shared/models}

bash deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
echo "dspark built: $(./build/shared/dspark --version)"

for prec in fp32 int8; do
  echo
  echo "== dspark run, stories260K, $prec, greedy =="
  ./build/shared/dspark run -m "$M/stories260K.gguf" -p "Once upon a time" -n 120 --precision "$prec"
done
echo
echo "== dspark run, stories260K, int8, temperature 0.8, top-p 0.9, seed 42 =="
./build/shared/dspark run -m "$M/stories260K.bin" -z "$M/tok512.bin" -p "The little dog" -n 120 \
  --precision int8 --temp 0.8 --top-p 0.9 --seed 42
