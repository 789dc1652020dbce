#!/usr/bin/env bash
# run.sh — run every libFuzzer target for a set time and print one line per
# target (runs, executions per second, coverage, crashes), then the table
# row tests/README.md's fuzzing record uses. cpu_s is the CPU time the fuzzer
# used (user + system): on a shared machine it falls short of the wall time
# asked for, and it is what tests/README.md's table counts.
#
#   tests/fuzz/run.sh [--cpu] [SECONDS_PER_TARGET] [TARGET...]   (default 300 s, all)
#
# --cpu: SECONDS are CPU seconds, not wall seconds: each fuzzer runs until it
# has used that much CPU (checked every 5 s), however long it waits for it
# at nice 19 beside other work. What one CPU-hour per target means. A fuzzer
# stopped by someone else (kill -INT on its pid) prints its row, marked
# "stopped early", and the script goes on to the next target.
#
# Builds build-fuzz/ with clang and -DDS_FUZZ=ON if needed. Each target
# starts from its committed seeds (tests/fuzz/corpus/NAME) and keeps what it
# finds in build-fuzz/corpus/NAME, so later runs go on from there. A crash
# leaves its input in build-fuzz/crashes/ and makes the script exit 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
cpu_budget=0
if [ "${1:-}" = --cpu ]; then cpu_budget=1; shift; fi
case "${1:-300}" in
  ''|*[!0-9]*) echo "run.sh: SECONDS must be a whole number, not '$1' (usage: run.sh [--cpu] [SECONDS] [TARGET...])" >&2; exit 2;;
esac
secs=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf tok_load manifest dist request alert ini control edge spec intake http_keys openai)
bdir=${DS_FUZZ_BUILD:-build-fuzz}
if [ ! -f "$bdir/CMakeCache.txt" ]; then
  cmake -S . -B "$bdir" -DCMAKE_C_COMPILER=clang -DDS_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
fi
cmake --build "$bdir" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null
mkdir -p "$bdir/crashes"
status=0
pid=
trap '[ -n "$pid" ] && kill -INT "$pid" 2>/dev/null; exit 130' INT TERM
printf '%-14s %8s %8s %12s %10s %8s %8s %s\n' target wall_s cpu_s runs exec/s cov ft result
for t in "${targets[@]}"; do
  mkdir -p "$bdir/corpus/$t"
  log="$bdir/fuzz_$t.log"
  w0=$(date +%s)
  t0=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
  wall=$secs
  [ $cpu_budget = 1 ] && wall=$((secs * 1000))      # the CPU watch below ends it
  "$bdir/tests/fuzz/fuzz_$t" -max_total_time="$wall" -print_final_stats=1 -rss_limit_mb=2048 \
       -artifact_prefix="$bdir/crashes/$t-" "$bdir/corpus/$t" "tests/fuzz/corpus/fuzz_$t" >"$log" 2>&1 &
  pid=$!
  stopped=0
  if [ $cpu_budget = 1 ]; then
    # on SIGINT libFuzzer prints its final stats and exits 72 (clang 14 has
    # no -interrupted_exitcode)
    while kill -0 $pid 2>/dev/null; do
      used=$(awk '{print int(($14 + $15) / '"$(getconf CLK_TCK)"')}' /proc/$pid/stat 2>/dev/null || echo 0)
      if [ "$used" -ge "$secs" ]; then kill -INT $pid; stopped=1; break; fi
      sleep 5
    done
  fi
  rc=0
  wait $pid || rc=$?
  if [ $rc = 0 ] || { [ $stopped = 1 ] && [ $rc = 72 ]; }; then
    result="0 crashes"
  elif [ $rc = 72 ]; then           # someone else's SIGINT/SIGTERM: cut short, not a crash
    result="0 crashes (stopped early)"
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
  printf '%-14s %8s %8s %12s %10s %8s %8s %s\n' "fuzz_$t" "$(( $(date +%s) - w0 ))" "$cpu" "${runs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}" "$result"
done
exit $status
