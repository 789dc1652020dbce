#!/usr/bin/env bash
# deploy.units — systemd-analyze verify and security --offline on the shipped
# units (deploy/systemd/*.service), ExecStart pointed at the built binaries.
# Prints each exposure score; fails when verify complains or a score is
# above 2.0 ("OK" is below 4.0). Skips (77) without systemd-analyze.
# Usage: units.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
command -v systemd-analyze >/dev/null || { echo "no systemd-analyze: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
for role in edge center; do
  unit=dspark-$role.service
  bin=$build/${role}-agent/dspark-$role
  [ "$role" = center ] && bin=$build/center-node/dspark-center
  sed "s#/usr/bin/dspark-$role#$bin#" "$src/deploy/systemd/$unit" > "$tmp/$unit"
  if ! out=$(systemd-analyze verify --man=no "$tmp/$unit" 2>&1) || [ -n "$out" ]; then
    echo "$unit: systemd-analyze verify: $out"; fail=1
  fi
  line=$(systemd-analyze security --offline=true "$tmp/$unit" 2>&1 | grep 'Overall exposure level') || true
  score=$(echo "$line" | sed -n 's/.*: \([0-9.]*\) .*/\1/p')
  echo "$unit: exposure ${score:-?} (${line##*: })"
  if [ -z "$score" ] || awk -v s="$score" 'BEGIN { exit !(s > 2.0) }'; then fail=1; fi
done
exit $fail
