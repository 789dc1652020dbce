#!/usr/bin/env bash
# mqtt5.sh — ctest cluster.mqtt5: start a 3-node ejabberd cluster
# (deploy/cluster/cluster.sh) in a temp dir, run deploy/cluster/probe.py
# against it (publisher and subscriber on different nodes), stop it and check
# that nothing of it is left running. Exit 77 where ejabberd is not installed.
#
# Usage: mqtt5.sh SOURCE_DIR [PYTHON3]
set -uo pipefail
src=${1:?usage: mqtt5.sh SOURCE_DIR [PYTHON3]}
py=${2:-/usr/bin/python3}
export DS_CLUSTER_DIR
DS_CLUSTER_DIR=$(mktemp -d /tmp/dspark-cluster-XXXXXX)
cs="$src/deploy/cluster/cluster.sh"
"$cs" start 3
rc=$?
if [ $rc -ne 0 ]; then
  [ $rc -eq 77 ] && { rm -rf "$DS_CLUSTER_DIR"; exit 77; }
  tail -n 20 "$DS_CLUSTER_DIR"/node*/logs/ejabberd.log 2>/dev/null
  "$cs" stop
  exit 1
fi
. "$DS_CLUSTER_DIR/cluster.env"
pids="$EPMD_PID $PID_1 $PID_2 $PID_3"
"$py" "$src/deploy/cluster/probe.py" "127.0.0.1:$PORT_1" "127.0.0.1:$PORT_2" "127.0.0.1:$PORT_3"
rc=$?
"$cs" stop
for p in $pids; do
  if kill -0 "$p" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ]; then
    echo "mqtt5.sh: process $p of the cluster still runs after stop" >&2
    rc=1
  fi
done
[ -d "$DS_CLUSTER_DIR" ] && { echo "mqtt5.sh: $DS_CLUSTER_DIR left behind" >&2; rc=1; }
exit $rc
