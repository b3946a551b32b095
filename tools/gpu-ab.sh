#!/usr/bin/env bash
# Same-call A/B of kiln settings on the GPU machine: writes a random
# checkpoint of a real shape, builds the engine a benchmark needs (the
# recipes the issues' targets use), then runs the benchmark once per
# variant, the variants alternated for --runs rounds, and prints a table
# of its figure. Variants are environment settings read at run time (the
# KILN_* switches the plugins document), so one build serves them all;
# those the LLM build reads (KILN_LLM_FUSE, KILN_LLM_FUSE_FP8,
# KILN_LLM_FUSE_HEAD, KILN_LLM_FP8_INPUT, KILN_LLM_RESIDUAL) are set when
# that variant's own engine is built instead, as is KILN_AB_CALIBRATE=1's
# (an FP8 engine with static activation scales: kiln build --calibrate on
# tests/data/text/declaration_of_independence.txt). KILN_AB_INSTANCES=N
# runs the bench with --instances N (throughput and long: the engine opened
# N times, their schedulers stepping at once).
#
#   bash tools/gpu-ab.sh [--model 8b|1b] [--dtype fp8|bf16] [--runs N]
#                        BENCH[,BENCH...] VARIANT...
#
# Benches of one engine recipe (prefill2048 and decode; throughput and
# long) may be given together: they share the checkpoint and the engines,
# and each prints its own table.
#
# BENCH (figure; engine):
#   prefill2048   prefill tok/s of one 2,048-token prompt (--max-tokens 2048
#                 --max-seq-len 8448)
#   decode        decode tok/s and fraction of the floor, batch 1, 128 + 256
#                 (--max-tokens 2048 --max-seq-len 8448)
#   throughput    output tok/s of 1,024 requests of 128 in / 128 out (FP8:
#                 also --kv-dtype fp8; --max-batch 1024 --max-seq-len 2048
#                 --max-tokens 8192)
#   long          output tok/s of 1,000 requests of 1,000 in / 1,000 out (the
#                 throughput engine)
# VARIANT: `default`, or NAME=VALUE[,NAME=VALUE...] (e.g.
#   KILN_ATTENTION_DECODE=mma). The model is 8b by default, the dtype fp8.
# KILN_AB_WORK=DIR keeps the checkpoint and the engines in DIR (made if
#   missing) for the next call on a warm machine, which then skips writing
#   the checkpoint (2 min at 8B) and the builds it already made; engines of
#   another recipe are removed first (an 8B checkpoint and a few engines
#   fill most of the machine's disk). Without it, a temporary folder.
# Needs the build (tools/gpu-env.sh: a carried .gpu-build.tar.xz with
# kiln_cli, or a build here); logs and the JSON of every run go under
# $OUT (or build-gpu/logs). Exit 0 when every run gave its figure.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
model=8b dtype=fp8 runs=2
while [ $# -gt 0 ]; do
    case "$1" in
        --model) model=$2; shift 2 ;;
        --dtype) dtype=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) break ;;
    esac
done
bench=${1:-}
[ $# -gt 0 ] && shift
case "$model/$dtype/$runs" in
    1b/fp8/*|1b/bf16/*|8b/fp8/*|8b/bf16/*) ;;
    *) echo "gpu-ab: --model 1b|8b, --dtype fp8|bf16 (got $model, $dtype)" >&2; exit 2 ;;
esac
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "gpu-ab: --runs takes a positive count, not $runs" >&2; exit 2; }
# bench_setup BENCH: its engine_args, bench_args and figure
bench_setup() {
    engine_args=(--dtype "$dtype" --max-tokens 2048 --max-seq-len 8448)
    case "$1" in
        prefill2048) bench_args=(--prompt-len 2048 --gen-len 2 --reps 3); figure=prefill_tok_s ;;
        decode) bench_args=(--prompt-len 128 --gen-len 256 --reps 3); figure=decode_tok_s ;;
        throughput|long)
            engine_args=(--dtype "$dtype" --max-batch 1024 --max-seq-len 2048 --max-tokens 8192)
            [ "$dtype" = fp8 ] && engine_args+=(--kv-dtype fp8)
            if [ "$1" = throughput ]; then
                bench_args=(--throughput --requests 1024 --input-len 128 --output-len 128)
            else
                bench_args=(--throughput --requests 1000 --input-len 1000 --output-len 1000)
            fi
            figure=output_tok_s ;;
        *) echo "gpu-ab: BENCH is prefill2048, decode, throughput or long, not '$1' (--help)" >&2; return 2 ;;
    esac
}
# BENCH,BENCH...: benches of one engine recipe share the checkpoint and engines
IFS=, read -r -a benches <<<"$bench"
[ ${#benches[@]} -gt 0 ] || { bench_setup ""; exit 2; }
first_engine=""
for b in "${benches[@]}"; do
    bench_setup "$b" || exit 2
    [ -z "$first_engine" ] && first_engine="${engine_args[*]}"
    [ "$first_engine" = "${engine_args[*]}" ] ||
        { echo "gpu-ab: $bench: these benches need different engines (prefill2048 and decode share one, throughput and long another)" >&2; exit 2; }
done
[ $# -gt 0 ] || set -- default
for v in "$@"; do
    [ "$v" = default ] || [[ "$v" =~ ^[A-Z_][A-Z0-9_]*=[^,]*(,[A-Z_][A-Z0-9_]*=[^,]*)*$ ]] ||
        { echo "gpu-ab: a variant is 'default' or NAME=VALUE[,NAME=VALUE...], not '$v'" >&2; exit 2; }
done

# shellcheck source=tools/gpu-env.sh
. "$root/tools/gpu-env.sh" || exit 2
logs=$KILN_GPU_LOGS # gpu-env's: $OUT/logs, or build-gpu/logs
if [ -n "${KILN_AB_WORK:-}" ]; then
    top="$KILN_AB_WORK/$model"
    mkdir -p "$top" || exit 2
else
    top=$(mktemp -d)
    trap 'rm -rf "$top"' EXIT
fi
# the engines of this recipe in $work, beside the checkpoint in $top/ck
recipe=$(printf '%s_' "$dtype" "${engine_args[@]}" | tr -c 'A-Za-z0-9\n' '_')
work="$top/$recipe"
for d in "$top"/*/; do
    [ "$d" = "$top/ck/" ] || [ "$d" = "$work/" ] || rm -rf "$d"
done
mkdir -p "$work"
[ -f "$top/ck.done" ] || { rm -rf "$top/ck"; kiln_gpu_checkpoint "$model" "$top" || exit 2; }
kiln_gpu_build kiln_cli || exit 1
kiln=build-gpu/bin/kiln
kiln_gpu_checkpoint_wait "$model" || exit 1
touch "$top/ck.done"
[ -e "$work/ck" ] || ln -s "$top/ck" "$work/ck"
if [ -f "$work/e.engine" ]; then
    echo "gpu-ab: kept $work/e.engine"
    (exit 0) &
else
    echo "gpu-ab: kiln build ${engine_args[*]}"
    kiln_gpu_engine "$model" "$work" "${engine_args[@]}" >"$work/default-build.out" 2>&1 &
fi
default_pid=$!

# a variant's settings: those of the build (build_set), the bench's own
# options (run_args) and the rest (run_set)
split_settings() {
    build_set=() run_set=() run_args=()
    local all=() s
    [ "$1" = default ] || IFS=, read -r -a all <<<"$1"
    for s in "${all[@]}"; do
        if [[ "$s" =~ ^KILN_AB_INSTANCES=(.*)$ ]]; then
            run_args+=(--instances "${BASH_REMATCH[1]}")
        elif [[ "$s" =~ ^KILN_(LLM_(FUSE|FUSE_FP8|FUSE_HEAD|FP8_INPUT|RESIDUAL)|AB_CALIBRATE)= ]]; then
            build_set+=("$s")
        else
            run_set+=("$s")
        fi
    done
}
# the engine of a variant with build settings: built once, beside e.engine
# (a build that failed is not tried again)
engine_of() {
    split_settings "$1"
    [ ${#build_set[@]} -eq 0 ] && { echo "$work/e.engine"; return 0; }
    local e
    e="$work/e-$(printf '%s_' "${build_set[@]}" | tr -c 'A-Za-z0-9_\n' '_').engine"
    [ -f "$e.failed" ] && return 1
    if [ ! -f "$e" ]; then
        echo "gpu-ab: kiln build with ${build_set[*]}" >&2
        local calib=()
        [[ " ${build_set[*]} " == *" KILN_AB_CALIBRATE=1 "* ]] &&
            calib=(--calibrate "$root/tests/data/text/declaration_of_independence.txt")
        env "${build_set[@]}" "$kiln" build "$work/ck" --backend cuda "${engine_args[@]}" "${calib[@]}" -o "$e" \
            >"$logs/engine-$(basename "$e").log" 2>&1 ||
            { tail -n 5 "$logs/engine-$(basename "$e").log" >&2; touch "$e.failed"; return 1; }
    fi
    echo "$e"
}
# The first variant with build settings builds its engine while the
# default one builds in the background (both mostly host work: reading,
# converting, writing); the others build one at a time when first run, so
# that two calibrated builds never hold their unquantized calibration
# engines (16 GB each at 8B) on the disk at once.
for v in "$@"; do
    split_settings "$v"
    if [ ${#build_set[@]} -gt 0 ]; then
        engine_of "$v" >/dev/null
        break
    fi
done
if ! wait "$default_pid"; then
    cat "$work/default-build.out"
    exit 1
fi

# figure_line JSON FIGURE: the figure of one run, with its context
figure_line() {
    python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
f = sys.argv[2]
extra = ""
if "floor_fraction" in d and f == "decode_tok_s":
    extra = " (%.3f of the floor)" % d["floor_fraction"]
elif "itl_ms_p50" in d and f == "output_tok_s":
    extra = " (ITL p50 %.2f ms, TTFT p50 %.0f ms; decode steps %.2f s, with prompt tokens %.2f s)" % (
        d["itl_ms_p50"], d["ttft_ms_p50"], d.get("decode_step_s", 0), d.get("prompt_step_s", 0))
elif "ttft_ms" in d:
    extra = " (TTFT %.1f ms)" % d["ttft_ms"]
print("%.1f%s" % (d[f], extra))
PY
}

rc=0
for b in "${benches[@]}"; do
    bench_setup "$b"
    table=""
    for r in $(seq 1 "$runs"); do
        for v in "$@"; do
            engine=$(engine_of "$v") || { echo "gpu-ab: $v: its engine did not build"; rc=1; continue; }
            split_settings "$v"
            out="$logs/ab-$b-$(echo "$v" | tr -c 'A-Za-z0-9=_\n' '_')-$r.json"
            if ! env "${run_set[@]}" "$kiln" bench "$engine" "${bench_args[@]}" "${run_args[@]}" --json >"$out" 2>"$out.err"; then
                echo "gpu-ab: $b, $v, run $r FAILED"; tail -n 3 "$out.err"; rc=1; continue
            fi
            line=$(figure_line "$out" "$figure") || { echo "gpu-ab: $b, $v, run $r: no $figure in $out"; rc=1; continue; }
            table+="$(printf '%-48s %3d  %s' "$v" "$r" "$line")"$'\n'
            echo "gpu-ab: $b, $v, run $r: $line" # as it comes, for a call cut short
        done
    done
    echo
    dev=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("device", "?"))' "$out" 2>/dev/null)
    echo "$model $dtype $b ($figure), engine: ${engine_args[*]}; device: ${dev:-?}"
    printf '%-48s %3s  %s\n' variant run "$figure"
    printf '%s' "$table" | sort -s -k1,1
done
exit $rc
