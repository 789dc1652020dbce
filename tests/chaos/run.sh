#!/usr/bin/env bash
# run.sh — the chaos suite at full size (tests/README.md "Chaos suite"): 10,000 QoS 1
# requests per scenario while the broker, a center or the edge is SIGKILLed
# and restarted 20 times at random moments. Prints each scenario's report
# line and a summary table; exit status 0 only if every scenario lost and
# duplicated nothing. ctest runs the same program small (label chaos).
#
# Usage: tests/chaos/run.sh [build-dir [requests [kills [seed]]]]
#        (defaults: build, 10000, 20, the time). Scenarios: DS_CHAOS_SCENARIOS
#        (default "broker center edge"; cluster-broker, cluster-center and
#        cluster-edge run them on a 3-node ejabberd cluster, deploy/cluster/).
set -uo pipefail
build=${1:-build}
requests=${2:-10000}
kills=${3:-20}
seed=${4:-$(date +%s)}
bin="$build/tests/chaos_run"
if [ ! -x "$bin" ]; then
  echo "run.sh: $bin not built (cmake --build $build --target chaos_run)" >&2
  exit 2
fi
status=0
reports=()
for sc in ${DS_CHAOS_SCENARIOS:-broker center edge}; do
  log=$(mktemp /tmp/dspark-chaos-$sc-XXXXXX.log)
  "$bin" "$sc" "$requests" "$kills" "$seed" >"$log" 2>&1
  rc=$?
  line=$(grep "^chaos $sc: requests" "$log" | tail -n 1)
  [ -n "$line" ] || line="chaos $sc: no report (exit $rc), see $log"
  echo "$line"
  grep "^chaos $sc: node" "$log" || true
  reports+=("$line")
  if [ $rc -ne 0 ]; then
    status=1
    echo "  (exit $rc; log kept: $log)"
  else
    rm -f "$log"
  fi
done
echo
echo "seed $seed"
echo "| scenario | requests | kills | lost | duplicated | finals dropped | retried | finals sent again | duration |"
echo "|---|---|---|---|---|---|---|---|---|"
for line in "${reports[@]}"; do
  echo "$line" | sed -nE 's/^chaos ([a-z-]+): requests ([0-9]+), kills ([0-9]+),.* lost ([0-9]+), duplicated ([0-9]+), finals the broker dropped ([0-9]+), retried ([0-9]+), finals sent again ([0-9]+),.* ([0-9.]+) s$/| \1 | \2 | \3 | \4 | \5 | \6 | \7 | \8 | \9 s |/p'
done
exit $status
