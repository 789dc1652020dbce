#!/usr/bin/env bash
# deploy.config_check — a config with ten different mistakes: `dspark-edge
# --check` exits non-zero and reports all ten in one run, each with
# file:line; and relative paths are resolved against the config's folder
# (a good config next to its model passes --check from another directory).
# A command-line mistake is one line and exit 2, for both daemons.
# Usage: config_check.sh BUILD_DIR MODELS_DIR
set -uo pipefail
build=$1 models=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/edge.ini" <<'INI'
[node]
name = bad/name
log_level = loud
bogus = 1
[mqtt]
keepalive_s = 1
[batch]
max_active = many
[overflow]
enabled = maybe
[frobnicate]
x = 1
[publish]
dirs = bundles
[model a]
path = missing.gguf
precision = int3
[model b]
path = stories260K.gguf
draft = nothere.bin
INI
cp "$models/stories260K.gguf" "$tmp/"
out=$("$build/edge-agent/dspark-edge" -c "$tmp/edge.ini" --check 2>&1)
rc=$?
echo "$out"
[ $rc -ne 0 ] || { echo "FAIL: --check exited 0"; exit 1; }
# the ten lines: 2 3 4 6 8 10 12 14 16 17 (19 is the 11th: model b's draft)
n=$(echo "$out" | grep -oE "edge\.ini:[0-9]+:" | sort -u | wc -l)
echo "distinct file:line locations reported: $n"
[ "$n" -ge 10 ] || { echo "FAIL: want at least 10 problems with file:line"; exit 1; }
printf '[model b]\npath = stories260K.gguf\n' > "$tmp/good.ini"
(cd / && "$build/edge-agent/dspark-edge" -c "$tmp/good.ini" --check) || { echo "FAIL: relative model path"; exit 1; }
# the daemons' command-line mistakes: one line each, exit 2
for d in edge-agent/dspark-edge center-node/dspark-center; do
  bin=${d#*/}
  for case in "--x|unknown option '--x' (see '$bin --help')" "-c|option '-c' needs a value (see '$bin --help')" \
              "--config|option '--config' needs a value (see '$bin --help')"; do
    arg=${case%%|*} want="$bin: ${case#*|}"
    err=$("$build/$d" "$arg" 2>&1 >/dev/null); rc=$?
    [ $rc -eq 2 ] || { echo "FAIL: $bin $arg exited $rc, want 2"; exit 1; }
    [ "$err" = "$want" ] || { echo "FAIL: $bin $arg said:"; echo "$err"; echo "want: $want"; exit 1; }
  done
done
echo PASS
