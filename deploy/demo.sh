#!/usr/bin/env bash
# demo.sh — set up and run the main job: installs the Debian packages dspark
# needs, builds it, starts a mosquitto broker, a dspark-center (FP32) and a
# dspark-edge agent serving stories260K (INT8 and FP32), then, as devices and
# an operator would: streamed requests, a request routed to the center (the
# edge drafts, the center verifies), requests of each priority with a latency
# summary, a new model version packed, signed, encrypted, published over the
# broker, fetched, verified and promoted on the edge, and the edge's
# telemetry; then stops everything it started.
# The broker runs with TLS and the ACL (README "Security"): a lab PKI made by
# deploy/pki/mkpki.sh in the temp dir, every client by its certificate (mutual
# TLS, CN = username). DEMO_TLS=0 runs it on plain anonymous TCP instead.
set -euo pipefail
cd "$(dirname "$0")/.."
M=$(realpath "${DS_MODELS_DIR:-../shared/models}")

bash deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
echo "built: $(./build/shared/dspark --version)"

B=./build/shared/dspark
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
if [ "${DEMO_TLS:-1}" = 1 ]; then
  uri="ssl://127.0.0.1:$port"
  P=$work/pki
  sh deploy/pki/mkpki.sh "$P" demo-edge:edge demo-center:center demo-device:device ops:ops \
      publisher:publisher >/dev/null
  sh deploy/mosquitto/mkacl.sh demo-edge:edge demo-center:center demo-device:device ops:ops \
      publisher:publisher > "$work/dspark.acl"
  # client flags by identity (dspark CLI), and mosquitto_sub's as ops
  tls() { echo "--cafile $P/ca.crt --certfile $P/$1.crt --keyfile $P/$1.key"; }
  DEV=$(tls demo-device) PUBL=$(tls publisher)
  SUB="--cafile $P/ca.crt --cert $P/ops.crt --key $P/ops.key"
  node_tls() { printf 'cafile = %s\ncertfile = %s\nkeyfile = %s\n' "$P/ca.crt" "$P/$1.crt" "$P/$1.key"; }
  cat > "$work/mosquitto.conf" <<CONF
user $(id -un)
allow_anonymous false
acl_file $work/dspark.acl
listener $port 127.0.0.1
cafile $P/ca.crt
certfile $P/broker.crt
keyfile $P/broker.key
tls_version tlsv1.2
require_certificate true
use_identity_as_username true
set_tcp_nodelay true
max_inflight_messages 100
max_queued_messages 10000
CONF
else
  uri="tcp://127.0.0.1:$port"
  DEV="" PUBL="" SUB=""
  node_tls() { :; }
  cat > "$work/mosquitto.conf" <<CONF
listener $port 127.0.0.1
allow_anonymous true
set_tcp_nodelay true
max_inflight_messages 100
max_queued_messages 10000
CONF
fi
/usr/sbin/mosquitto -c "$work/mosquitto.conf" > "$work/mosquitto.log" 2>&1 &
pids+=($!)

# Keys: the publisher's signing key, the edge's key pair (bundles are sealed to it).
$B keygen --signer -o "$work/signer" >/dev/null
$B keygen --node -o "$work/edge" >/dev/null

cat > "$work/center.ini" <<CONF
[node]
name = demo-center
log_level = warn
[mqtt]
uri = $uri
$(node_tls demo-center)
[model stories]
path = $M/stories260K.gguf
precision = fp32
backend = cpu
version = 1.0.0
CONF
cat > "$work/edge.ini" <<CONF
[node]
name = demo-edge
log_level = warn
[mqtt]
uri = $uri
$(node_tls demo-edge)
[batch]
max_active = 16
[telemetry]
interval_s = 1
[overflow]
speculate = true
[registry]
path = $work/edge-registry.db
[keys]
signer_pub = $work/signer.pub
node_sec = $work/edge.sec
[models]
dir = $work/models
[model stories]
path = $M/stories260K.gguf
precision = int8
version = 1.0.0
[model stories-fp32]
path = $M/stories260K.bin
tokenizer = $M/tok512.bin
precision = fp32
version = 1
CONF
sleep 0.3
./build/center-node/dspark-center -c "$work/center.ini" 2> "$work/center.log" &
center=$!
pids+=($center)
./build/edge-agent/dspark-edge -c "$work/edge.ini" 2> "$work/edge.log" &
edge=$!
pids+=($edge)
for node in demo-center demo-edge; do
  if ! timeout 15 mosquitto_sub -p "$port" -h 127.0.0.1 $SUB -t "dspark/v1/status/$node" -C 1 | grep -q '"online"'; then
    echo "demo: $node did not come online; the logs:" >&2; cat "$work/center.log" "$work/edge.log" >&2; exit 1
  fi
done
echo "broker on $uri ($([ "${DEMO_TLS:-1}" = 1 ] && echo "mutual TLS, ACL" || echo "plain, anonymous")); center 'demo-center' serving stories (fp32);"
echo "edge 'demo-edge' serving stories (int8, version 1.0.0) and stories-fp32"

echo
echo "== one streamed request (INT8, greedy) =="
./build/shared/dspark infer -b "$uri" $DEV --model-name stories -p "Once upon a time" -n 60 --stream
echo
echo "== the same prompt on the FP32 model =="
./build/shared/dspark infer -b "$uri" $DEV --model-name stories-fp32 -p "Once upon a time" -n 60

echo
echo "== routed to the center: the edge drafts with INT8, the center verifies with FP32 =="
$B infer -b "$uri" $DEV --model-name stories -p "Once upon a time" -n 60 --route center --json 2>/dev/null | python3 -c '
import json, sys
f = json.loads(sys.stdin.readline())
u, s = f["usage"], f["served_by"]
print(f["text"])
print("served by %s (%s, %s); %d tokens in %d rounds, %d drafted, %d accepted (acceptance %.2f)" % (
    s["node"], s["tier"], s["precision"], u["completion_tokens"], u.get("rounds", 0), u.get("drafted", 0),
    u.get("accepted", 0), u.get("acceptance", 0)))'

echo
echo "== 48 requests at once: 16 high, 16 normal, 16 low priority =="
for i in $(seq 1 48); do
  case $((i % 3)) in 0) t=high;; 1) t=normal;; *) t=low;; esac
  printf '{"prompt":"One day, a little %s","max_tokens":48,"priority":"%s","temperature":0.8,"seed":%d}\n' \
    "$(echo cat dog bird fox bear frog | cut -d' ' -f$(( i % 6 + 1 )))" "$t" "$i"
done > "$work/requests.jsonl"
./build/shared/dspark infer -b "$uri" $DEV --model-name stories --file "$work/requests.jsonl" --concurrency 48 > "$work/answers.txt"
head -n 5 "$work/answers.txt"
echo "... ($(wc -l < "$work/answers.txt") answers: id, finish, client ms, edge ms)"

echo
echo "== a new version over the bus: pack (sign, encrypt, seal to the edge), publish, fetch, promote =="
$B model pack -m "$M/stories260K.gguf" --model-name stories --model-version 1.1.0 --signer "$work/signer.sec" \
    --to "$work/edge.pub" --chunk-kb 64 -o "$work/bundle" 2>/dev/null
$B model publish --dir "$work/bundle" --signer-pub "$work/signer.pub" --broker "$uri" $PUBL --quiet 2>/dev/null &
pids+=($!)
for _ in $(seq 1 150); do
  $B model list --registry "$work/edge-registry.db" --model-name stories 2>/dev/null | grep -q "1.1.0.*verified" && break
  sleep 0.2
done
$B model list --registry "$work/edge-registry.db" --model-name stories
$B model promote --broker "$uri" $PUBL --signer "$work/signer.sec" --model-name stories --model-version 1.1.0 --node demo-edge
$B infer -b "$uri" $DEV --model-name stories -p "Once upon a time" -n 20 --json | python3 -c '
import json, sys
s = json.loads(sys.stdin.readline())["served_by"]
print("next request served by %s, model %s version %s" % (s["node"], s["model"], s["version"]))'

echo
echo "== the edge's telemetry (retained on dspark/v1/telemetry/demo-edge) =="
sleep 1.2
timeout 5 mosquitto_sub -p "$port" -h 127.0.0.1 $SUB -t dspark/v1/telemetry/demo-edge -C 1 | python3 -c '
import json, sys
t = json.load(sys.stdin)
lat = t.get("latency", {})
print("uptime %.1f s, kernel %s, models %s" % (t["uptime_s"], t.get("kernel"), ", ".join(m["name"] + " " + m["precision"] for m in t["models"])))
for k in ("queue_ms", "ttft_ms", "total_ms"):
    v = lat.get(k, {})
    print("  %-9s p50 %7.1f  p90 %7.1f  p99 %7.1f  (n=%d)" % (k, v.get("p50", 0), v.get("p90", 0), v.get("p99", 0), v.get("count", 0)))
print("  errors:", {k: v for k, v in t["errors"].items() if v} or "none")'

echo
echo "== stopping: SIGTERM drains the edge and the center =="
kill -TERM "$edge" "$center"
wait "$edge" && echo "edge exited cleanly"
wait "$center" && echo "center exited cleanly"
timeout 5 mosquitto_sub -p "$port" -h 127.0.0.1 $SUB -t dspark/v1/status/demo-edge -C 1
