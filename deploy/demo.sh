#!/usr/bin/env bash
# demo.sh — set up and run the main job: installs the Debian packages dspark
# needs, builds it, starts a mosquitto broker and a dspark-edge agent serving
# stories260K (INT8 and FP32), sends requests of each priority as a device
# would, prints the answers, a latency summary and the edge's telemetry, then
# stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
M=$(realpath "${DS_MODELS_DIR:-../shared/models}")

bash deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
echo "built: $(./build/shared/dspark --version)"

work=$(mktemp -d /tmp/dspark-demo-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# A free loopback port for the broker.
port=""
for p in $(shuf -i 20000-60000 -n 50); do
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || { echo "demo: no free port found" >&2; exit 1; }
uri="tcp://127.0.0.1:$port"

cat > "$work/mosquitto.conf" <<CONF
listener $port 127.0.0.1
allow_anonymous true
set_tcp_nodelay true
max_inflight_messages 100
max_queued_messages 10000
CONF
/usr/sbin/mosquitto -c "$work/mosquitto.conf" > "$work/mosquitto.log" 2>&1 &
pids+=($!)

cat > "$work/edge.ini" <<CONF
[node]
name = demo-edge
log_level = warn
[mqtt]
uri = $uri
[batch]
max_active = 16
[telemetry]
interval_s = 1
[model stories]
path = $M/stories260K.gguf
precision = int8
version = 1
[model stories-fp32]
path = $M/stories260K.bin
tokenizer = $M/tok512.bin
precision = fp32
version = 1
CONF
sleep 0.3
./build/edge-agent/dspark-edge -c "$work/edge.ini" 2> "$work/edge.log" &
edge=$!
pids+=($edge)
echo "broker on $uri; edge 'demo-edge' serving stories (int8) and stories-fp32"
if ! timeout 15 mosquitto_sub -p "$port" -t dspark/v1/status/demo-edge -C 1 | grep -q '"online"'; then
  echo "demo: the edge did not come online; its log:" >&2; cat "$work/edge.log" >&2; exit 1
fi

echo
echo "== one streamed request (INT8, greedy) =="
./build/shared/dspark infer -H "$uri" -m stories -p "Once upon a time" -n 60 --stream
echo
echo "== the same prompt on the FP32 model =="
./build/shared/dspark infer -H "$uri" -m stories-fp32 -p "Once upon a time" -n 60

echo
echo "== 48 requests at once: 16 high, 16 normal, 16 low priority =="
for i in $(seq 1 48); do
  case $((i % 3)) in 0) t=high;; 1) t=normal;; *) t=low;; esac
  printf '{"prompt":"One day, a little %s","max_tokens":48,"priority":"%s","temperature":0.8,"seed":%d}\n' \
    "$(echo cat dog bird fox bear frog | cut -d' ' -f$(( i % 6 + 1 )))" "$t" "$i"
done > "$work/requests.jsonl"
./build/shared/dspark infer -H "$uri" -m stories --file "$work/requests.jsonl" --concurrency 48 > "$work/answers.txt"
head -n 5 "$work/answers.txt"
echo "... ($(wc -l < "$work/answers.txt") answers: id, finish, client ms, edge ms)"

echo
echo "== the edge's telemetry (retained on dspark/v1/telemetry/demo-edge) =="
sleep 1.2
timeout 5 mosquitto_sub -p "$port" -t dspark/v1/telemetry/demo-edge -C 1 | python3 -c '
import json, sys
t = json.load(sys.stdin)
lat = t.get("latency", {})
print("uptime %.1f s, kernel %s, models %s" % (t["uptime_s"], t.get("kernel"), ", ".join(m["name"] + " " + m["precision"] for m in t["models"])))
for k in ("queue_ms", "ttft_ms", "total_ms"):
    v = lat.get(k, {})
    print("  %-9s p50 %7.1f  p90 %7.1f  p99 %7.1f  (n=%d)" % (k, v.get("p50", 0), v.get("p90", 0), v.get("p99", 0), v.get("count", 0)))
print("  errors:", {k: v for k, v in t["errors"].items() if v} or "none")'

echo
echo "== stopping: SIGTERM drains the edge =="
kill -TERM "$edge"
wait "$edge" && echo "edge exited cleanly"
timeout 5 mosquitto_sub -p "$port" -t dspark/v1/status/demo-edge -C 1
