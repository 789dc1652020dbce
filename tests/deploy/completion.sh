#!/usr/bin/env bash
# deploy.completion — the bash completion (deploy/completion/dspark.bash)
# against the built programs, case by case: the words typed so far in
# COMP_WORDS, the completion function called as bash calls it, COMPREPLY
# compared with what must (and must not) be offered. The folder it runs in
# holds files named like the words, so a completion that falls back to file
# names where it should not is caught. zsh's _dspark where zsh is installed:
# syntax (zsh -n), and five cases with compsys's builtins stood in for. Usage: completion.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
PATH=$build/shared:$build/edge-agent:$build/center-node:$PATH
for p in dspark dspark-edge dspark-center; do
  command -v $p >/dev/null || { echo "FAIL: no built $p under $build"; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
touch pack-me.txt promote.txt model.gguf edge.ini fp32.txt text.log
mkdir sub
# shellcheck source=/dev/null
. "$src/deploy/completion/dspark.bash" || { echo "FAIL: sourcing the completion"; exit 1; }
n=0 bad=0
# check "LINE" FUNC WANT [NOT]: LINE's last word is being completed (a
# trailing space = a new empty word); WANT: words that must all be offered
# ("=" then a list: exactly those); NOT: words that must not be offered.
check() {
  local line=$1 fn=$2 want=$3 not=${4:-} w got
  read -ra COMP_WORDS <<<"$line"
  [ "${line: -1}" = " " ] && COMP_WORDS+=("")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMP_LINE=$line COMP_POINT=${#line}
  COMPREPLY=()
  $fn "${COMP_WORDS[0]}" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]:-}"
  got=$(printf '%s\n' "${COMPREPLY[@]}" | sort | tr '\n' ' ')
  n=$((n + 1))
  local ok=1
  if [ "${want:0:1}" = = ]; then
    [ "$got" = "$(printf '%s\n' ${want:1} | sort | tr '\n' ' ')" ] || ok=0
  else
    for w in $want; do printf '%s\n' "${COMPREPLY[@]}" | grep -qxF -- "$w" || ok=0; done
  fi
  for w in $not; do printf '%s\n' "${COMPREPLY[@]}" | grep -qxF -- "$w" && ok=0; done
  if [ $ok = 1 ]; then echo "ok   '$line' -> $got"
  else echo "FAIL '$line' -> $got (want $want${not:+; not $not})"; bad=$((bad + 1)); fi
}
check "dspark " _dspark "run infer model top keygen --help --version" "pack-me.txt model.gguf"
check "dspark mo" _dspark "=model"
check "dspark model " _dspark "pack verify list promote rollback" "pack-me.txt model.gguf"
check "dspark model p" _dspark "pack promote" "pack-me.txt promote.txt"
check "dspark run --precision " _dspark "=native fp32 int8"
check "dspark run --precision i" _dspark "=int8"
check "dspark run --pre" _dspark "=--precision"
check "dspark run -m " _dspark "model.gguf pack-me.txt sub"
check "dspark run -m mod" _dspark "=model.gguf"
check "dspark run -n " _dspark "=" "model.gguf"
check "dspark infer --priority " _dspark "=high normal low"
check "dspark infer --route " _dspark "=auto edge center"
check "dspark infer -f " _dspark "pack-me.txt model.gguf"
check "dspark infer --concurrency " _dspark "=" "edge.ini"
check "dspark --log-format " _dspark "=text json"
check "dspark --log-format json " _dspark "run infer model" "text.log"
check "dspark infer --log-level " _dspark "=error warn info debug"
check "dspark model pack --signer " _dspark "pack-me.txt" "--signer"
check "dspark-edge -c " _dspark_node "edge.ini model.gguf"
check "dspark-edge --ch" _dspark_node "=--check"
check "dspark-center --set node.na" _dspark_node "=node.name="
check "dspark-edge --log-level " _dspark_node "=error warn info debug"
# complete(1) registrations, as bash-completion's loader leaves them
complete -p dspark | grep -q -- '-F _dspark dspark' || { echo "FAIL: dspark not registered"; bad=$((bad + 1)); }
complete -p dspark-edge | grep -q -- '-F _dspark_node' || { echo "FAIL: dspark-edge not registered"; bad=$((bad + 1)); }
if command -v zsh >/dev/null; then
  zsh -n "$src/deploy/completion/_dspark" || { echo "FAIL: zsh -n _dspark"; bad=$((bad + 1)); }
  head -1 "$src/deploy/completion/_dspark" | grep -qx '#compdef dspark dspark-edge dspark-center' \
    || { echo "FAIL: _dspark's #compdef line"; bad=$((bad + 1)); }
  echo "zsh: _dspark parses"
  # zcheck "LINE" WANT: _dspark run as compsys would (words, CURRENT), with
  # compadd, _files and _message standing in: WANT = what it offers, in order
  zcheck() {
    local got
    got=$(zsh -fc 'compadd() { local a; for a in "$@"; do [[ $a == -S || $a == "" ]] && continue; print -rn -- "$a "; done }
      _files() { print -rn -- "<files> " }; _message() { print -rn -- "<hint $3> " }
      words=(${=1}); [[ $1 == *" " ]] && words+=("")
      CURRENT=${#words}; source "$2"' zsh "$1" "$src/deploy/completion/_dspark" 2>&1)
    n=$((n + 1))
    if [[ "$got" == *"$2"* ]]; then echo "ok   zsh '$1' -> $got"
    else echo "FAIL zsh '$1' -> $got (want $2)"; bad=$((bad + 1)); fi
  }
  zcheck "dspark run --precision " "native fp32 int8 "
  zcheck "dspark model p" "pack verify list promote"
  zcheck "dspark run -m " "<files> "
  zcheck "dspark infer -n " "<hint N> "
  zcheck "dspark-edge --set node.n" "node.name="
fi
echo "$n cases, $bad failed"
[ $bad = 0 ] && echo PASS
[ $bad = 0 ]
