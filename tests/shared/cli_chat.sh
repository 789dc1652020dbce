#!/usr/bin/env bash
# shared.cli_chat — `dspark run -i` (the real binary): piped first (context
# full, a line too long, end of input), then in a detached tmux pane,
# driven by keystrokes as an operator would: two turns (the second must find
# the first turn and its reply in the KV cache: the info log counts the
# tokens reused), a long reply stopped by Ctrl-C mid-answer ("[interrupted]",
# the prompt back, the process alive and answering), then Ctrl-D: exit 0.
# Every wait polls the pane and is bounded; nothing waits a fixed time.
#
# usage: cli_chat.sh DSPARK MODELS_DIR
set -u
dspark=$1
models=$2
model=$models/llama-2-tiny-random.gguf    # never ends a reply by itself: -n / Ctrl-C do
command -v tmux >/dev/null || { echo "FAIL: tmux is not installed (deploy/install-deps.sh lists it)"; exit 1; }
[ -x "$dspark" ] || { echo "FAIL: no dspark at $dspark"; exit 1; }
[ -r "$model" ] || { echo "FAIL: no model at $model"; exit 1; }

dir=$(mktemp -d)
sock=dschat$$                              # a private tmux server: no other session is touched
T() { tmux -L "$sock" "$@"; }
cleanup() { T kill-server 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

# The whole pane, wrapped lines joined (-J keeps trailing blanks: dropped here).
pane() { T capture-pane -p -J -S - -t chat 2>/dev/null | sed 's/[[:space:]]*$//'; }
fail() {
    echo "FAIL: $*"
    echo "--- pane (last 30 lines):"; pane | sed '/^$/d' | tail -30 | cut -c1-160
    echo "--- stderr:"; tail -20 "$dir/err" 2>/dev/null
    exit 1
}
# wait_until WHAT SECONDS CMD...: run CMD every 50 ms until it succeeds.
wait_until() {
    local what=$1 limit=$2 end=$((SECONDS + $2))
    shift 2
    until "$@"; do
        ((SECONDS < end)) || fail "no $what within ${limit}s"
        sleep 0.05
    done
}
# At the prompt for the K-th time: K ">>>" lines, the last line the bare prompt.
at_prompt() {
    local p
    p=$(pane | sed '/^$/d')
    [ "$(grep -c '^>>>' <<<"$p")" -ge "$1" ] && [ "$(tail -n1 <<<"$p")" = ">>>" ]
}
pane_has() { pane | grep -qF -- "$1"; }
exited() { pane_has "CHAT-EXITED="; }
not_exited() { ! exited || fail "dspark exited: $(pane | grep -o 'CHAT-EXITED=[0-9]*')"; }
# The reply after the line typed at prompt K is at least N bytes long.
reply_longer() {
    local n
    n=$(pane | sed -n "/^>>> $1\$/,\$p" | sed 1d | tr -d '\n' | wc -c)
    [ "$n" -ge "$2" ]
}
say() { T send-keys -t chat -l "$1" && T send-keys -t chat Enter; }

# Piped, no terminal: a context that fills (96 tokens) starts a new
# conversation and says so; a line longer than the context is refused; the
# end of input quits with 0.
long=$(printf 'word %.0s' $(seq 200))
out=$(printf 'Hello\nMore please\n%s\nok\n' "$long" |
      "$dspark" run -i -m "$models/stories260K.gguf" -n 40 --ctx 96 --log-level info 2>"$dir/pipe.err")
st=$?
((st == 0)) || fail "piped chat: exit $st; $(cat "$dir/pipe.err")"
grep -qF "[context full (96 tokens): the next line starts a new conversation]" <<<"$out" ||
    fail "piped chat: no context-full note in: $out"
grep -qF "[this line does not fit in the context (96 tokens); try a shorter one or --ctx]" <<<"$out" ||
    fail "piped chat: the long line was not refused: $out"
grep -q "chat: turn 3: [0-9]* tokens laid out, 0 of them reused" "$dir/pipe.err" ||
    fail "piped chat: the turn after the context filled did not start afresh: $(cat "$dir/pipe.err")"
"$dspark" run -i -p hi -m "$models/stories260K.gguf" </dev/null 2>"$dir/p.err"
st=$?
if ((st != 2)) || ! grep -qF -- "-i takes its turns at the prompt" "$dir/p.err"; then
    fail "-i with -p: exit $st, $(cat "$dir/p.err")"
fi

T new-session -d -s chat -x 200 -y 50 \
    "'$dspark' run -i -m '$model' -n 200 -t 1 --log-level info 2>'$dir/err'; echo CHAT-EXITED=\$?; sleep 300" ||
    fail "tmux new-session"
wait_until "first prompt" 30 at_prompt 1

# Turn 1 and 2: replies of -n 200 tokens; turn 2 reuses turn 1 from the cache.
say "Hello there"
wait_until "reply to turn 1" 30 at_prompt 2
reply_longer "Hello there" 20 || fail "turn 1: no reply"
say "Tell me more"
wait_until "reply to turn 2" 30 at_prompt 3
reply_longer "Tell me more" 20 || fail "turn 2: no reply"
t1=$(sed -n 's/.*chat: turn 1: \([0-9]*\) tokens laid out.*/\1/p' "$dir/err")
read -r _ r2 e2 < <(sed -n 's/.*chat: turn 2: \([0-9]*\) tokens laid out, \([0-9]*\) of them reused from the KV cache, \([0-9]*\) evaluated.*/\1 \2 \3/p' "$dir/err")
if [ -z "$t1" ] || [ -z "${e2:-}" ]; then fail "no 'chat: turn N' info lines"; fi
# The cache held turn 1's layout and its 200 reply tokens; only the new turn is evaluated.
((r2 == t1 + 200)) || fail "turn 2 reused $r2 cached tokens, expected turn 1's $t1 + its 200 reply tokens"
((e2 < 20)) || fail "turn 2 evaluated $e2 tokens: more than its own line's"

# A long reply (up to the context), stopped by Ctrl-C once it is on the screen.
say "/n 100000"
wait_until "the /n answer" 10 pane_has "[replies stop after 100000 tokens]"
wait_until "prompt after /n" 10 at_prompt 4
say "Write a very long story"
wait_until "the long reply to start" 30 reply_longer "Write a very long story" 40
T send-keys -t chat C-c
wait_until "[interrupted] after Ctrl-C" 10 pane_has "[interrupted]"
wait_until "prompt after Ctrl-C" 10 at_prompt 5
not_exited
pane_has "context full" && fail "the long reply ran to the end of the context before Ctrl-C came"

# Still alive and answering.
say "/n 5"
wait_until "prompt after /n 5" 10 at_prompt 6
say "Short one"
wait_until "reply after the interrupted one" 10 at_prompt 7
not_exited
grep -q "chat: turn 4:" "$dir/err" || fail "turn 4 was not answered"

# Ctrl-D at the prompt quits with status 0.
T send-keys -t chat C-d
wait_until "exit after Ctrl-D" 10 exited
pane_has "CHAT-EXITED=0" || fail "dspark exited with $(pane | grep -o 'CHAT-EXITED=[0-9]*'), expected 0"
echo "PASS: piped (context full, long line, EOF); two turns (turn 2 reused $r2 cached tokens, evaluated $e2), Ctrl-C mid-answer, Ctrl-D exit 0"
