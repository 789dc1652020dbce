#!/usr/bin/env bash
# failover.sh — ctest cluster.failover: broker failover on a real 3-node
# ejabberd cluster, the same kills with and without it in one test. Runs
# chaos_run cluster-failover-single (the edge and center-0 on node 2 alone)
# and chaos_run cluster-failover ([mqtt] uri = node 2, node 3) with the same
# requests, kills and seed (tests/chaos/chaos.c "Broker failover"), prints
# both report lines, and checks: both pass (nothing lost or dropped; with the
# list, every kill finds the edge and center-0 connected again through the other
# node before the killed node is back), the edge is connected again sooner with
# the list, and more requests sent after a kill are answered before the node
# is back (per second of outage). Exit 77 where
# ejabberd is not installed.
#
# Usage: failover.sh CHAOS_RUN [requests [kills [seed]]]
set -uo pipefail
run=${1:?usage: failover.sh CHAOS_RUN [requests [kills [seed]]]}
n=${2:-300}
k=${3:-2}
seed=${4:-1}
out=$(mktemp -d /tmp/dspark-failover-XXXXXX)
trap 'rm -rf "$out"' EXIT
for sc in cluster-failover-single cluster-failover; do
  "$run" "$sc" "$n" "$k" "$seed" >"$out/$sc.log" 2>&1
  rc=$?
  [ $rc -eq 77 ] && { cat "$out/$sc.log"; exit 77; }
  grep '^chaos ' "$out/$sc.log"
  if [ $rc -ne 0 ]; then
    echo "failover.sh: $sc failed (exit $rc); its output:" >&2
    tail -n 80 "$out/$sc.log" >&2
    exit 1
  fi
done
# "... edge connected again in mean X s ... answered before the node was back A in S s (R/s) ..."
field() { grep -o "$2" "$out/$1.log" | tail -n 1 | grep -o '[0-9.]*' | head -n 1; }
e1=$(field cluster-failover-single 'edge connected again in mean [0-9.]*')
e2=$(field cluster-failover 'edge connected again in mean [0-9.]*')
r1=$(field cluster-failover-single '([0-9.]*/s)')
r2=$(field cluster-failover '([0-9.]*/s)')
echo "cluster.failover: the edge connected again after a kill in mean $e2 s with the list vs $e1 s with one URI;" \
     "requests sent after a kill and answered before the node was back $r2/s vs $r1/s"
if [ -z "$e1" ] || [ -z "$e2" ] || [ -z "$r1" ] || [ -z "$r2" ]; then
  echo "failover.sh: a report line is missing" >&2
  exit 1
fi
awk -v e1="$e1" -v e2="$e2" -v r1="$r1" -v r2="$r2" 'BEGIN { exit !(e2 < e1 && r2 > r1) }' || {
  echo "failover.sh: the list did not reconnect sooner or did not answer more during the outage" >&2
  exit 1
}
exit 0
