#!/usr/bin/env bash
# bench/compare.sh — this checkout's bench_engine (or bench_batch) against a
# base commit's, measured in the same run: the base is checked out as a
# detached worktree outside the checkout and built there, then the two
# binaries run in turns (base, new, new, base, ...) on the same model files,
# and every figure is printed as the median over the rounds with new/base.
#
# Usage: bench/compare.sh [--base REV] [--rounds N] [--work DIR] [--new-build DIR]
#                         [--bench engine|batch] [-- BENCH ARGS...]
#   --base REV        commit to compare against (default 3c8d144, issue 19's start)
#   --rounds N        runs of each binary, interleaved (default 3)
#   --work DIR        base worktree, its build and the JSON files (default /tmp/dspark-compare)
#   --new-build DIR   build of this checkout to use (default: DIR/new, built here)
#   --bench NAME      engine (default) or batch
#   BENCH ARGS        passed to both binaries (default for engine:
#                     --models 110m --variants int8-q8 --threads 1,2 --prompt 120)
# The base worktree and its build stay under --work for the next run; remove
# them with `git worktree remove --force DIR/base-<rev>`.
# Needs: git, cmake, python3. Exit status non-zero only when something could
# not be built or run; nothing is asserted.
set -euo pipefail

base=3c8d144 rounds=3 work=/tmp/dspark-compare new_build= bench=engine
while [ $# -gt 0 ]; do
    case "$1" in
    --base) base=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --new-build) new_build=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
case "$bench" in engine|batch) ;; *) echo "compare.sh: --bench engine|batch" >&2; exit 2 ;; esac
case "$rounds" in ''|*[!0-9]*|0) echo "compare.sh: --rounds wants a positive number" >&2; exit 2 ;; esac
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
    if [ "$bench" = engine ]; then
        args=(--models 110m --variants int8-q8 --threads 1,2 --prompt 120)
    else
        args=(--shape 110m --streams 1,16 --threads 2)
    fi
fi

src=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
rev=$(git -C "$src" rev-parse --verify "$base^{commit}")
mkdir -p "$work"
base_tree="$work/base-${rev:0:12}"
if [ ! -d "$base_tree" ]; then
    git -C "$src" worktree add --detach "$base_tree" "$rev" >&2
fi
jobs=${JOBS:-2}
# The base's test models are this checkout's (its default path is relative to its source).
models=$(cd "$src/.." && pwd)/shared/models
echo "compare.sh: building base ${rev:0:12} in $work/build-${rev:0:12}" >&2
cmake -S "$base_tree" -B "$work/build-${rev:0:12}" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
    -DDS_MODELS_DIR="$models" >/dev/null
cmake --build "$work/build-${rev:0:12}" --target "bench_$bench" -j"$jobs" >/dev/null
if [ -z "$new_build" ]; then
    new_build="$work/new"
    echo "compare.sh: building this checkout in $new_build" >&2
    cmake -S "$src" -B "$new_build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
        -DDS_MODELS_DIR="$models" >/dev/null
    cmake --build "$new_build" --target "bench_$bench" -j"$jobs" >/dev/null
fi
old_bin="$work/build-${rev:0:12}/bench/bench_$bench"
new_bin="$new_build/bench/bench_$bench"
for b in "$old_bin" "$new_bin"; do [ -x "$b" ] || { echo "compare.sh: no $b" >&2; exit 1; }; done

# Same model files for both (bench_engine and bench_batch write them once into --dir).
dir_args=(--dir "$work/models")
out="$work/json"
rm -rf "$out"
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="base new"; else order="new base"; fi
    for who in $order; do
        bin=$old_bin; [ "$who" = new ] && bin=$new_bin
        echo "compare.sh: round $r/$rounds: $who" >&2
        "$bin" "${dir_args[@]}" "${args[@]}" --json "$out/$who-$r.json" >"$out/$who-$r.txt"
    done
done

python3 - "$out" "$rounds" "$bench" "${rev:0:12}" <<'EOF'
import json, statistics, sys
out, rounds, bench, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def figures(path):
    j = json.load(open(path))
    f = {}
    if bench == "engine":
        for r in j["results"]:
            key = f'{r["model"]} {r["variant"]} {r["threads"]}thr'
            f[key + " decode tok/s"] = r["decode_tok_s"]["median"]
            f[key + " prefill tok/s"] = r["prefill_tok_s"]["median"]
    else:
        for r in j["results"]:
            f[f'N={r["streams"]} total tok/s'] = r["total_tok_s"]["median"]
            f[f'N={r["streams"]} speedup vs N=1'] = r["speedup_vs_1"]
    return f
runs = {w: [figures(f"{out}/{w}-{i}.json") for i in range(1, rounds + 1)] for w in ("base", "new")}
print(f"\nbench_{bench}: base {rev} vs this checkout, median of {rounds} interleaved rounds each")
print(f'{"figure":<44} {"base":>10} {"new":>10} {"new/base":>9}')
for k in runs["new"][0]:
    vals = {w: [r[k] for r in runs[w] if r.get(k) is not None] for w in runs}
    if not vals["base"] or not vals["new"]:
        continue
    b, n = statistics.median(vals["base"]), statistics.median(vals["new"])
    print(f"{k:<44} {b:>10.1f} {n:>10.1f} {n / b if b else float('nan'):>8.2f}x")
print(f"\nfull tables: {out}/{{base,new}}-N.txt")
EOF
