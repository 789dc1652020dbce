#!/usr/bin/env bash
# gen-doc.sh — the man pages dspark(1), dspark-edge(8), dspark-center(8) and
# dspark.ini(5), gzip -9n. Their prose is written by hand in deploy/man/*.in;
# what can drift from the code is generated from the programs' own --help
# (the help texts come from the parsers' tables): the OPTIONS of each daemon,
# each dspark command's (and model subcommand's) usage and options, and the
# configuration keys of dspark.ini(5).
# Usage: gen-doc.sh OUT_DIR DSPARK [DSPARK_EDGE] [DSPARK_CENTER]
set -euo pipefail
src=$(cd "$(dirname "$0")/man" && pwd)
out=$1; shift
mkdir -p "$out"
dspark=$1 edge="" center=""
for b in "${@:2}"; do
  case $(basename "$b") in dspark-edge) edge=$b ;; dspark-center) center=$b ;; esac
done
ver=$("$dspark" --version | awk '{print $2}')

# help2roff: a --help text as man(7): option lines ("  -x, --long ARG   text",
# continued on deeper-indented lines) become .TP items, usage lines and
# indented blocks stay as typed (.nf), the rest is running text.
help2roff() {
  awk '
  function esc(s) { gsub(/\\/, "\\e", s); gsub(/-/, "\\-", s); return s }
  function line(s) { s = esc(s); if (s ~ /^[.\047]/) s = "\\&" s; print s }
  function endnf() { if (nf) { print ".fi"; print ".RE"; nf = 0 } }
  /^[ \t]*$/ { endnf(); inopt = 0; para = 1; next }
  /^usage: / { endnf(); print ".PP"; print ".nf"; line(substr($0, 8)); print ".fi"; inopt = 0; next }
  /^ +-/ && match($0, /^ +/) && RLENGTH <= 6 {
    endnf()
    spec = $0; sub(/^ +/, "", spec); desc = ""
    if (match(spec, /  +/)) { desc = substr(spec, RSTART + RLENGTH); spec = substr(spec, 1, RSTART - 1) }
    print ".TP"
    n = split(spec, w, " "); s = ""
    for (i = 1; i <= n; i++) {
      t = w[i]
      if (t ~ /^-/) { c = ""; if (t ~ /,$/) { c = ","; sub(/,$/, "", t) } s = s (s == "" ? "" : " ") "\\fB" esc(t) "\\fR" c }
      else s = s " \\fI" esc(t) "\\fR"
    }
    print s
    if (desc != "") line(desc)
    inopt = 1; next
  }
  inopt && /^        / { t = $0; sub(/^ +/, "", t); line(t); next }
  /^ / { if (!nf) { if (para) print ".PP"; print ".RS"; print ".nf"; nf = 1 } para = 0; t = $0; sub(/^  /, "", t); line(t); next }
  { endnf(); if (para) print ".PP"; para = 0; inopt = 0; line($0) }
  END { endnf() }'
}

# fill TEMPLATE OUT KEY=VALUE...: @KEY@ replaced by VALUE (a file's text when VALUE is @file)
fill() {
  local tpl=$1 dst=$2; shift 2
  cp "$tpl" "$dst.tmp"
  local kv k v
  for kv in "$@"; do
    k=${kv%%=*} v=${kv#*=}
    if [ "${v:0:1}" = @ ]; then
      awk -v k="@$k@" -v f="${v:1}" '$0 == k { while ((getline l < f) > 0) print l; next } { print }' "$dst.tmp" > "$dst.tmp2"
    else
      K="@$k@" V="$v" awk 'BEGIN { k = ENVIRON["K"]; v = ENVIRON["V"] }
        { out = ""; while ((i = index($0, k)) > 0) { out = out substr($0, 1, i - 1) v; $0 = substr($0, i + length(k)) } print out $0 }' \
        "$dst.tmp" > "$dst.tmp2"
    fi
    mv "$dst.tmp2" "$dst.tmp"
  done
  if grep -v '^\.\\"' "$dst.tmp" | grep -n '@[A-Z_]*@'; then echo "gen-doc: $tpl: a placeholder left unfilled" >&2; exit 1; fi
  mv "$dst.tmp" "$dst"
  gzip -9nf "$dst"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# dspark(1): each command's --help; model's subcommands each their own.
help=$("$dspark" --help)
cmds=$(awk '/^commands:/ { f = 1; next } f && /^  [a-z]/ { print $1; next } { f = 0 }' <<<"$help")
[ -n "$cmds" ] || { echo "gen-doc: no commands in dspark --help" >&2; exit 1; }
: > "$tmp/commands"
for c in $cmds; do
  summary=$(awk -v c="$c" '$1 == c && !d { $1 = ""; sub(/^ +/, ""); print; d = 1 }' <<<"$help")
  { echo ".SS dspark $c"; echo "$summary" | help2roff; { "$dspark" "$c" --help 2>&1 || true; } | help2roff; } >> "$tmp/commands"
  if [ "$c" = model ]; then
    mh=$("$dspark" model --help 2>&1 || true)
    subs=$(awk '/^subcommands:/ { f = 1; next } f && /^  [a-z]/ { print $1; next } { f = 0 }' <<<"$mh")
    for s in $subs; do
      { echo ".SS dspark model $s"; { "$dspark" model "$s" --help 2>&1 || true; } | help2roff; } >> "$tmp/commands"
    done
  fi
done
fill "$src/dspark.1.in" "$out/dspark.1" "VERSION=$ver" "COMMANDS=@$tmp/commands"

# dspark-edge(8), dspark-center(8): OPTIONS from --help up to the configuration keys.
for bin in "$edge" "$center"; do
  [ -n "$bin" ] || continue
  name=$(basename "$bin") role=${name#dspark-}
  other=dspark-edge; [ $role = edge ] && other=dspark-center
  h=$("$bin" --help)
  awk '/^  *-/ { f = 1 } /^configuration keys:/ { e = 1 } f && !e' <<<"$h" | help2roff > "$tmp/$role.opts"
  # the paragraph after the usage line: what the program does
  awk 'NR > 2 && /^SIGTERM/ { e = 1 } NR > 2 && !e' <<<"$h" | help2roff | sed '/^\.PP$/d' > "$tmp/$role.desc"
  # NAME's one line (whatis, apropos): written here, not cut from --help
  summary="serve LLM inference to devices over MQTT with INT8 models on the CPU"
  [ $role = center ] && summary="serve the edges' overflow, verify their drafts and publish model bundles"
  env_extra=""
  [ $role = center ] && env_extra='.TP
.B DSPARK_GPU_MODULE
The CUDA backend module to load instead of the installed one (empty: none).'
  fill "$src/node.8.in" "$out/$name.8" "NAME=$name" "NAME_UC=${name^^}" "ROLE=$role" "OTHER=$other" \
       "VERSION=$ver" "SUMMARY=$(echo "$summary" | sed 's/\\/\\e/g; s/-/\\-/g')" "DESCRIPTION=@$tmp/$role.desc" \
       "OPTIONS=@$tmp/$role.opts" "ENV_EXTRA=$env_extra"
done

# dspark.ini(5): the keys of each role's --help ("  [section] key  type  default D  help").
keys2roff() {
  awk '
  function esc(s) { gsub(/\\/, "\\e", s); gsub(/-/, "\\-", s); return s }
  function pl(s) { if (s ~ /^[.\047]/) s = "\\&" s; print s }
  /^configuration keys:/ { f = 1; next }
  !f { next }
  /^  \[[a-z_]+\] / {
    sec = $1; key = $2; type = $3; def = $5
    rest = $0; sub(/^ *[^ ]+ +[^ ]+ +[^ ]+ +default +[^ ]+ */, "", rest)
    print ".TP"; print "\\fB" esc(sec) " " esc(key) "\\fR (" type ", default \\fB" esc(def) "\\fR)"
    pl(esc(rest)); next
  }
  /^  \[model NAME\]/ { m = 1; print ".TP"; print "\\fB[model \\fINAME\\fB]\\fR"; t = $0; sub(/^  \[model NAME\] +/, "", t); pl(esc(t)); next }
  m && /^ +/ { t = $0; sub(/^ +/, "", t); pl(esc(t)); next }'
}
if [ -n "$edge" ]; then "$edge" --help | keys2roff > "$tmp/keys.edge"; else : > "$tmp/keys.edge"; fi
if [ -n "$center" ]; then "$center" --help | keys2roff > "$tmp/keys.center"; else : > "$tmp/keys.center"; fi
fill "$src/dspark.ini.5.in" "$out/dspark.ini.5" "VERSION=$ver" "KEYS_EDGE=@$tmp/keys.edge" "KEYS_CENTER=@$tmp/keys.center"
