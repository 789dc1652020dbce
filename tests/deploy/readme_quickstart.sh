#!/usr/bin/env bash
# deploy.readme_quickstart — README.md's quick start, run as written: the
# shell block between <!-- quickstart:begin --> and <!-- quickstart:end -->
# is extracted and run with bash -euo pipefail (in its own session, PORT set
# to a free loopback port) from a folder where ./build and ./deploy are this
# build's and this checkout's. Passes when both requests were answered (the
# dspark infer summary and text; the mosquitto_rr final with done:true and
# text) and nothing the block started is left running. Also: README.md is at
# most 300 lines.
# Usage: readme_quickstart.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
readme=$src/README.md
fail() { echo "FAIL: $*"; exit 1; }

lines=$(wc -l < "$readme")
echo "README.md: $lines lines"
[ "$lines" -le 300 ] || fail "README.md has $lines lines (at most 300)"

command -v mosquitto_sub >/dev/null && command -v mosquitto_rr >/dev/null &&
  [ -x /usr/sbin/mosquitto ] || { echo "SKIP: mosquitto, mosquitto_sub or mosquitto_rr missing"; exit 77; }
# deploy/edge.example.ini names its model relative to deploy/: ../../shared/models
[ -f "$src/deploy/../../shared/models/stories260K.gguf" ] ||
  { echo "SKIP: no ../shared/models/stories260K.gguf beside the checkout"; exit 77; }

tmp=$(mktemp -d /tmp/ds-readme-qs-XXXXXX)
sid=""
cleanup() {
  if [ -n "$sid" ]; then pkill -KILL -s "$sid" 2>/dev/null; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# The block: the lines between the markers, less the ``` fences (exactly one
# ```sh block must be there).
awk '/<!-- quickstart:begin -->/{on=1; next} /<!-- quickstart:end -->/{on=0} on' "$readme" > "$tmp/between"
[ "$(grep -c '^```sh$' "$tmp/between")" = 1 ] && [ "$(grep -c '^```$' "$tmp/between")" = 1 ] ||
  fail "README.md: no single \`\`\`sh block between the quickstart markers"
sed -e '/^```/d' "$tmp/between" > "$tmp/block.sh"
[ "$(grep -cv '^\s*\(#.*\)\?$' "$tmp/block.sh")" -ge 5 ] || fail "the quick start block has almost no commands"
echo "--- the quick start block"
cat "$tmp/block.sh"

# A free loopback port.
port=""
for p in $(shuf -i 20000-60000 -n 50); do
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then port=$p; break; fi
done
[ -n "$port" ] || fail "no free port"

# Run it from a folder that looks like the checkout to the block.
mkdir "$tmp/run"
ln -s "$(realpath "$build")" "$tmp/run/build"
ln -s "$(realpath "$src/deploy")" "$tmp/run/deploy"
(cd "$tmp/run" && PORT=$port TMPDIR=$tmp exec setsid timeout -k 5 150 bash -euo pipefail "$tmp/block.sh" \
  > "$tmp/out" 2> "$tmp/err") &
sid=$!
wait "$sid"
rc=$?
echo "--- stdout"; cat "$tmp/out"
echo "--- stderr"; cat "$tmp/err"
[ "$rc" = 0 ] || fail "the quick start block exited $rc (124: it timed out)"

# dspark infer: the text on stdout and its summary line on stderr.
grep -qE '^finish: (length|stop); tokens: [0-9]+ prompt \+ [1-9][0-9]* completion; served by edge-1' "$tmp/err" ||
  fail "no 'finish: ... served by edge-1' line from dspark infer"
head -1 "$tmp/out" | grep -q '[[:alpha:]]' || fail "dspark infer printed no text"
# mosquitto_rr: the final, with the request's id, done and a text.
python3 - "$tmp/out" <<'PY' || fail "no final from mosquitto_rr"
import json, sys
finals = []
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith('{'):
        try: finals.append(json.loads(line))
        except ValueError: pass
ok = [f for f in finals if f.get('done') is True and f.get('id') == 'qs-1' and f.get('text')
      and f.get('served_by', {}).get('node') == 'edge-1']
print('mosquitto_rr final:', 'found' if ok else 'missing', '(%d JSON lines)' % len(finals))
sys.exit(0 if ok else 1)
PY

# Nothing the block started is left: no process in its session, the port free.
left=$(pgrep -s "$sid" | tr '\n' ' ')
[ -z "$left" ] || fail "processes left running after the block: $left"
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then fail "the broker's port $port still accepts connections"; fi
echo "PASS: both requests answered, everything stopped"
