#!/usr/bin/env bash
# Where a decode step's time goes, on the GPU machine (it has ncu but no
# nsys): builds kiln with the kernel timeline (-DKILN_CUDA_TIMELINE=ON,
# src/backend/cuda/timeline.cuh), makes a random checkpoint of a real shape,
# runs `kiln bench` with KILN_TIMELINE and prints tools/timeline.py's
# summary: each kernel's share of a step, its handoff and its run after the
# wait, and the last launches of one step.
#
#   bash tools/gpu-timeline.sh [1b|8b] [VAR=VALUE ...]
#
# 1b (Llama-3.2-1B shape, the default) or 8b (Llama-3.1-8B; its checkpoint
# alone takes a minute or two to write); each VAR=VALUE runs the bench once
# more with that setting (e.g. KILN_ATTENTION_PIPE_CAP=8) after a run
# without. KILN_TIMELINE_BLOCKS=kat_pipe also lists that kernel's blocks
# with the ktl_mark points they reached. The instrumented build is slower by
# the stamps (4-7% of a step): compare runs of this script with
# each other, take speeds from an ordinary build. Summaries go under $OUT
# (the device tool brings them back) or build-gpu/logs; the traces
# themselves (tens of MB) are deleted.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
model=${1:-1b}
[ $# -gt 0 ] && shift
case "$model" in
    1b|8b) ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-timeline: the model is 1b or 8b, not $model" >&2; exit 2 ;;
esac
logs="${OUT:-$root/build-gpu}/logs"
mkdir -p "$logs"
export KILN_GPU_LOGS=$logs
# shellcheck source=tools/gpu-env.sh
. "$root/tools/gpu-env.sh" || exit 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

kiln_gpu_checkpoint "$model" "$work" || exit 2
KILN_GPU_CMAKE_ARGS=-DKILN_CUDA_TIMELINE=ON kiln_gpu_build kiln_cli || exit 1
kiln_gpu_engine "$model" "$work" || exit 1
kiln=build-gpu/bin/kiln

run=0
for setting in "" "$@"; do
    run=$((run + 1))
    name="$model-$run"
    env ${setting:+"$setting"} KILN_TIMELINE="$work/$name.txt" "$kiln" bench "$work/e.engine" --prompt-len 128 \
        --gen-len 32 --reps 1 --json >"$logs/bench-$name.json" 2>"$logs/bench-$name.err" ||
        { echo "gpu-timeline: kiln bench failed (${setting:-default})"; tail -n 3 "$logs/bench-$name.err"; continue; }
    python3 tools/timeline.py "$work/$name.txt" --steps 8 --launches 12 \
        ${KILN_TIMELINE_BLOCKS:+--blocks "$KILN_TIMELINE_BLOCKS"} >"$logs/timeline-$name.txt" 2>&1
    rm -f "$work/$name.txt"
    echo "=== $model, ${setting:-default}: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print('decode %.1f tok/s, ITL p50 %.3f ms (instrumented)' % (d['decode_tok_s'], d['itl_ms_p50']))" \
        "$logs/bench-$name.json")"
    grep -v '^$' "$logs/timeline-$name.txt"
done
