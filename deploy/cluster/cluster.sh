#!/usr/bin/env bash
# cluster.sh — a 3-node ejabberd (mod_mqtt) broker cluster on one machine, for
# tests and for trying dspark on a clustered broker (deploy/cluster/README.md).
#
# Owns: one state folder (DS_CLUSTER_DIR, default /tmp/dspark-cluster) with a
# private epmd on a free loopback port, one folder per node (ejabberd.yml,
# mnesia spool, logs) and cluster.env (ports, pids, the cookie). Nothing is
# written anywhere else and nothing of the system's ejabberd is used: no
# /etc/ejabberd, no /var/lib/ejabberd, no system epmd (port 4369), no port 1883.
#
# Usage: cluster.sh start [N]       start N nodes (default 3) and join them;
#                                   returns once every node answers an MQTT
#                                   CONNECT with CONNACK and lists all N nodes
#        cluster.sh stop            stop every node and the epmd, remove the folder
#                                   (DS_CLUSTER_KEEP=1 keeps it: logs)
#        cluster.sh kill I          SIGKILL node I (1..N): no goodbye to its peers
#        cluster.sh restart I       start node I again (after kill), wait until it
#                                   is back in the cluster and answers CONNECT
#        cluster.sh status          each node: pid, MQTT port, up/down, members seen
#        cluster.sh uri I           tcp://127.0.0.1:<MQTT port of node I>
#        cluster.sh ctl I CMD...    an ejabberd_ctl command on node I (list_cluster...)
#
# Node I is ejabberd's Erlang node dsI@127.0.0.1, MQTT on 127.0.0.1:<free port>.
# Environment: DS_CLUSTER_DIR (state folder), DS_CLUSTER_TIMEOUT_S (readiness
# wait per step, default 60), DS_CLUSTER_LOGLEVEL (ejabberd's, default warning).
# Exit status: 0 done; 1 failed (the reason on stderr); 2 usage; 77 ejabberd
# or erl not installed (tests count it as skipped).
set -euo pipefail

dir=${DS_CLUSTER_DIR:-/tmp/dspark-cluster}
timeout_s=${DS_CLUSTER_TIMEOUT_S:-60}
loglevel=${DS_CLUSTER_LOGLEVEL:-warning}
ej_lib=$(ls -d /usr/lib/*/ejabberd-[0-9]* 2>/dev/null | head -n 1 || true)
ej_libs=${ej_lib%/*}

die() { echo "cluster.sh: $*" >&2; exit 1; }
usage() { sed -n '2,27p' "$0"; exit 2; }

need_tools() {
  command -v erl >/dev/null && command -v epmd >/dev/null && [ -n "$ej_lib" ] || {
    echo "cluster.sh: ejabberd or erl not installed (deploy/install-deps.sh installs ejabberd)" >&2; exit 77; }
  command -v mosquitto_pub >/dev/null || { echo "cluster.sh: mosquitto_pub not installed" >&2; exit 77; }
}

# Free loopback TCP ports, one per argument count.
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

load_state() {
  [ -f "$dir/cluster.env" ] || die "no cluster in $dir (cluster.sh start first)"
  # shellcheck disable=SC1091
  . "$dir/cluster.env"
}

save_state() {
  local tmp="$dir/cluster.env.tmp" i
  {
    echo "N=$N"
    echo "COOKIE=$COOKIE"
    echo "EPMD_PORT=$EPMD_PORT"
    echo "EPMD_PID=$EPMD_PID"
    for ((i = 1; i <= N; i++)); do
      echo "PORT_$i=$(port_of "$i")"
      echo "PID_$i=$(pid_of "$i")"
    done
  } >"$tmp"
  mv "$tmp" "$dir/cluster.env"
}

port_of() { local v="PORT_$1"; echo "${!v:-}"; }
pid_of()  { local v="PID_$1"; echo "${!v:-0}"; }
# A zombie (killed, not yet reaped by whoever inherited it) counts as dead.
alive()   { [ "$1" -gt 0 ] 2>/dev/null && kill -0 "$1" 2>/dev/null &&
            [ "$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

erl_env() {
  env ERL_LIBS="$ej_libs" ERL_EPMD_PORT="$EPMD_PORT" ERL_CRASH_DUMP_BYTES=0 "$@"
}

# ejabberd_ctl on node I from a hidden, short-lived Erlang node.
ctl() {
  local i=$1; shift
  erl_env erl -name "ctl$$-$RANDOM@127.0.0.1" -setcookie "$COOKIE" -hidden -noinput \
    -start_epmd false -kernel inet_dist_use_interface '{127,0,0,1}' \
    -s ejabberd_ctl -extra "ds$i@127.0.0.1" "$@"
}

write_config() {
  local i=$1 nd="$dir/node$i"
  mkdir -p "$nd/spool" "$nd/logs"
  cat >"$nd/ejabberd.yml" <<EOF
# Node ds$i@127.0.0.1 of a dspark test cluster (deploy/cluster/cluster.sh).
loglevel: $loglevel
log_rotate_count: 0
hosts:
  - localhost
# Any username with any non-empty password is let in (mod_mqtt refuses a CONNECT
# without a password even under anonymous auth, CONNACK 135).
auth_method: [anonymous]
anonymous_protocol: login_anon
listen:
  -
    port: $(port_of "$i")
    ip: "127.0.0.1"
    module: mod_mqtt
    backlog: 1000
    # dspark's largest message (a model chunk) is under 1 MiB; 4 MiB as mosquitto's test config.
    max_payload_size: 4194304
modules:
  mod_mqtt:
    # Sessions held for a client that went away (dspark nodes ask 600 s).
    session_expiry: 600
    max_queue: 100000
    # Cluster-wide subscription and session tables (mnesia).
    db_type: mnesia
    ram_db_type: mnesia
EOF
}

start_node() {
  local i=$1 nd="$dir/node$i"
  alive "$(pid_of "$i")" && die "node $i already runs (pid $(pid_of "$i"))"
  (
    cd "$nd"
    exec env EJABBERD_CONFIG_PATH="$nd/ejabberd.yml" EJABBERD_LOG_PATH="$nd/logs/ejabberd.log" \
      ERL_LIBS="$ej_libs" ERL_EPMD_PORT="$EPMD_PORT" ERL_CRASH_DUMP_BYTES=0 \
      erl -name "ds$i@127.0.0.1" -setcookie "$COOKIE" -noinput -noshell -start_epmd false \
        -kernel inet_dist_use_interface '{127,0,0,1}' +K true +P 250000 \
        -mnesia dir "\"$nd/spool\"" -s ejabberd </dev/null >>"$nd/logs/console.log" 2>&1
  ) &
  printf -v "PID_$i" '%s' "$!"
  save_state
}

# 0 when node I answers an MQTT 5 CONNECT with a CONNACK (publishes one QoS 0 message).
connack() {
  timeout 5 mosquitto_pub -V mqttv5 -h 127.0.0.1 -p "$(port_of "$1")" -i "dsprobe-$1-$$" -u dsprobe -P dsprobe \
    -t "dspark-cluster/probe" -m x -q 0 >/dev/null 2>&1
}

# 0 when node I's ejabberd says it is started and lists every node of the cluster.
members_ok() {
  local out want=$2 n
  out=$(ctl "$1" list_cluster 2>/dev/null) || return 1
  n=$(grep -c "'ds[0-9]*@127.0.0.1'" <<<"$out" || true)
  [ "$n" -ge "$want" ]
}

# Wait until test "$@" holds, or timeout_s; node I must stay alive meanwhile.
wait_for() {
  local i=$1 what=$2; shift 2
  local end=$((SECONDS + timeout_s))
  while ! "$@"; do
    alive "$(pid_of "$i")" || die "node $i exited while waiting for $what (see $dir/node$i/logs)"
    [ $SECONDS -lt $end ] || die "node $i: no $what within ${timeout_s}s (see $dir/node$i/logs)"
    sleep 0.2
  done
}

started() { ctl "$1" status >/dev/null 2>&1; }

cmd_start() {
  N=${1:-3}
  [[ "$N" =~ ^[1-9]$ ]] || die "N must be 1..9"
  need_tools
  if [ -f "$dir/cluster.env" ]; then die "a cluster state is in $dir already (cluster.sh stop first)"; fi
  mkdir -p "$dir"
  COOKIE=ds$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
  local ports i
  read -r -a ports <<<"$(free_ports $((N + 1)))"
  EPMD_PORT=${ports[0]}
  for ((i = 1; i <= N; i++)); do printf -v "PORT_$i" '%s' "${ports[$i]}"; done
  epmd -port "$EPMD_PORT" -address 127.0.0.1 </dev/null >"$dir/epmd.log" 2>&1 &
  EPMD_PID=$!
  save_state
  for ((i = 1; i <= N; i++)); do write_config "$i"; start_node "$i"; done
  for ((i = 1; i <= N; i++)); do wait_for "$i" "ejabberd start" started "$i"; done
  for ((i = 2; i <= N; i++)); do
    ctl "$i" join_cluster ds1@127.0.0.1 >"$dir/node$i/logs/join.log" 2>&1 ||
      die "node $i could not join ds1@127.0.0.1: $(tail -n 3 "$dir/node$i/logs/join.log")"
  done
  for ((i = 1; i <= N; i++)); do
    wait_for "$i" "ejabberd start" started "$i"
    wait_for "$i" "membership of all $N nodes" members_ok "$i" "$N"
    wait_for "$i" "MQTT CONNACK" connack "$i"
  done
  cmd_status
}

cmd_kill() {
  load_state
  local i=$1 pid
  pid=$(pid_of "$i")
  [ -n "$(port_of "$i")" ] || die "no node $i"
  alive "$pid" || die "node $i is not running"
  kill -KILL "$pid"
  wait_gone "$pid" 10 || die "node $i (pid $pid) still runs after SIGKILL"
  printf -v "PID_$i" '%s' 0
  save_state
}

cmd_restart() {
  load_state
  local i=$1
  [ -n "$(port_of "$i")" ] || die "no node $i"
  start_node "$i"
  wait_for "$i" "ejabberd start" started "$i"
  wait_for "$i" "membership of all $N nodes" members_ok "$i" "$N"
  wait_for "$i" "MQTT CONNACK" connack "$i"
}

cmd_status() {
  load_state
  local i pid state members
  for ((i = 1; i <= N; i++)); do
    pid=$(pid_of "$i")
    if alive "$pid"; then
      state=up
      members=$(ctl "$i" list_cluster 2>/dev/null | tr -d "'" | tr '\n' ' ' || true)
    else
      state=down; members=""
    fi
    echo "node $i ds$i@127.0.0.1 pid $pid mqtt tcp://127.0.0.1:$(port_of "$i") $state${members:+ members: $members}"
  done
}

# Wait until pid is gone, at most $2 seconds; 0 when gone.
wait_gone() {
  local end=$((SECONDS + $2))
  while alive "$1"; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.05
  done
}

cmd_stop() {
  [ -f "$dir/cluster.env" ] || { echo "cluster.sh: no cluster in $dir"; return 0; }
  load_state
  local i pid left=""
  # SIGTERM is the VM's init:stop(); SIGCONT after it, should one be stopped
  # (a paused process would keep it pending). Then SIGKILL what is left.
  for ((i = 1; i <= N; i++)); do
    pid=$(pid_of "$i")
    alive "$pid" && { kill -TERM "$pid"; kill -CONT "$pid"; } 2>/dev/null || true
  done
  for ((i = 1; i <= N; i++)); do
    pid=$(pid_of "$i")
    wait_gone "$pid" 15 || { kill -KILL "$pid" 2>/dev/null; wait_gone "$pid" 5 || left+=" $pid"; }
  done
  if alive "$EPMD_PID"; then
    { kill -TERM "$EPMD_PID"; kill -CONT "$EPMD_PID"; } 2>/dev/null || true
    wait_gone "$EPMD_PID" 5 || { kill -KILL "$EPMD_PID" 2>/dev/null; wait_gone "$EPMD_PID" 5 || left+=" $EPMD_PID"; }
  fi
  [ -z "$left" ] || echo "cluster.sh: still running after SIGKILL:$left" >&2
  if [ "${DS_CLUSTER_KEEP:-0}" = 1 ]; then
    rm -f "$dir/cluster.env"
    echo "cluster.sh: stopped; logs kept in $dir"
  else
    rm -rf "$dir"
  fi
  [ -z "$left" ]
}

[ $# -ge 1 ] || usage
case $1 in
  start)   cmd_start "${2:-3}" ;;
  stop)    cmd_stop ;;
  kill)    [ $# -eq 2 ] || usage; cmd_kill "$2" ;;
  restart) [ $# -eq 2 ] || usage; cmd_restart "$2" ;;
  status)  cmd_status ;;
  uri)     [ $# -eq 2 ] || usage; load_state; [ -n "$(port_of "$2")" ] || die "no node $2"; echo "tcp://127.0.0.1:$(port_of "$2")" ;;
  ctl)     [ $# -ge 3 ] || usage; load_state; i=$2; shift 2; ctl "$i" "$@" ;;
  -h|--help) usage ;;
  *) usage ;;
esac
