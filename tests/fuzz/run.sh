#!/usr/bin/env bash
# run.sh — run every libFuzzer target for a set time and print one line per
# target (runs, executions per second, coverage, crashes), then the table
# row the README's fuzzing record uses. cpu_s is the CPU time the fuzzer
# used (user + system): on a shared machine it falls short of the wall time
# asked for, and it is what the README's table counts.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default 300 s, all)
#
# Builds build-fuzz/ with clang and -DDS_FUZZ=ON if needed. Each target
# starts from its committed seeds (tests/fuzz/corpus/NAME) and keeps what it
# finds in build-fuzz/corpus/NAME, so later runs go on from there. A crash
# leaves its input in build-fuzz/crashes/ and makes the script exit 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf tok_load manifest dist request alert ini control edge spec intake)
bdir=${DS_FUZZ_BUILD:-build-fuzz}
if [ ! -f "$bdir/CMakeCache.txt" ]; then
  cmake -S . -B "$bdir" -DCMAKE_C_COMPILER=clang -DDS_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
fi
cmake --build "$bdir" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null
mkdir -p "$bdir/crashes"
status=0
printf '%-14s %8s %12s %10s %8s %8s %s\n' target cpu_s runs exec/s cov ft result
for t in "${targets[@]}"; do
  mkdir -p "$bdir/corpus/$t"
  log="$bdir/fuzz_$t.log"
  t0=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
  if "$bdir/tests/fuzz/fuzz_$t" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 \
       -artifact_prefix="$bdir/crashes/$t-" "$bdir/corpus/$t" "tests/fuzz/corpus/fuzz_$t" >"$log" 2>&1; then
    result="0 crashes"
  else
    result="CRASH (see $log and $bdir/crashes/)"
    status=1
  fi
  t1=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
  cpu=$(( (t1 - t0) / $(getconf CLK_TCK) ))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  printf '%-14s %8s %12s %10s %8s %8s %s\n' "fuzz_$t" "$cpu" "${runs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}" "$result"
done
exit $status
