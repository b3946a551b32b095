#!/usr/bin/env bash
# Quality of the quantized weight formats (issue 10): the default model
# built in each format beside its unquantized engine, teacher-forced over
# the fixed English text (tests/data/text), perplexity and argmax
# agreement against the unquantized engine, against the issue's bars:
#   int8 weight-only (per channel)     perplexity within 0.5%
#   (int8 in groups of 128, the same bar, for comparison)
#   int4 weight-only (groups of 128)   perplexity within 5%
#   fp8 W8A8 (--dtype fp8)             perplexity within 1%, argmax agreement >= 95%
#   (the same with static activation scales, --calibrate on docs/design.md:
#   another text than the scored one; the same bars)
#   fp8 KV cache (--kv-dtype fp8)      perplexity within 0.5% (the issue's "further
#                                      0.5%", here on the unquantized weights)
#
#   bash tests/gpu/quant_quality.sh KILN CHECKPOINT BACKEND WORK_DIR [TEXT]
#
# BACKEND cuda compares against the bf16 engine (activations bf16 in every
# engine); cpu against the f32 engine (activations f32). Prints one row per
# format, "name<TAB>result" (result starting pass or FAIL), the format
# tests/gpu/llm_gpu_check.sh collects; exit status 1 when a bar is missed
# or a step fails.
set -uo pipefail
kiln=$1 ckpt=$2 backend=$3 work=$4
root=$(cd "$(dirname "$0")/../.." && pwd)
text=${5:-$root/tests/data/text/declaration_of_independence.txt}
dtype=bf16
[ "$backend" = cpu ] && dtype=f32
mkdir -p "$work"
status=0
# max-batch 32: scoring feeds up to max_batch tokens per step
build() { "$kiln" build "$ckpt" --backend "$backend" --dtype "$dtype" --max-batch 32 "$@"; }
if ! build -o "$work/q-ref.engine" >&2; then
    printf 'quant quality: %s reference engine\tFAIL (kiln build)\n' "$dtype"
    exit 1
fi
# int8-g128: int8 with a scale per 128 inputs instead of per channel
for fmt in int8:0.005:0 int8-g128:0.005:0 int4:0.05:0 fp8:0.01:0.95 fp8-calib:0.01:0.95 kv-fp8:0.005:0; do
    IFS=: read -r w bar agree <<<"$fmt"
    name="quant quality: $w weight-only ($backend)"
    flags=(--weights "$w")
    if [ "$w" = int8-g128 ]; then
        flags=(--weights int8 --weights-group 128)
    elif [ "$w" = fp8 ]; then
        name="quant quality: fp8 W8A8 ($backend)"
        flags=(--dtype fp8)
    elif [ "$w" = fp8-calib ]; then
        name="quant quality: fp8 W8A8, static scales ($backend)"
        flags=(--dtype fp8 --calibrate "$root/docs/design.md")
    elif [ "$w" = kv-fp8 ]; then
        name="quant quality: fp8 KV cache ($backend)"
        flags=(--kv-dtype fp8)
    fi
    # fp8 replaces --dtype: its activations are bf16 on cuda, f32 on the cpu
    if "$kiln" build "$ckpt" --backend "$backend" --dtype "$dtype" --max-batch 32 "${flags[@]}" \
           -o "$work/q-$w.engine" >&2 &&
       "$kiln" perplexity "$work/q-$w.engine" "$text" --compare "$work/q-ref.engine" --json >"$work/q-$w.json"; then
        python3 - "$work/q-$w.json" "$bar" "$name" "$dtype" "$agree" <<'PY' || status=1
import json, sys
o = json.load(open(sys.argv[1]))
c = o["compare"]
bar, agree = float(sys.argv[2]), float(sys.argv[5])
ratio = o["perplexity"] / c["perplexity"]
ok = abs(ratio - 1) <= bar and c["argmax_agreement"] >= agree
print("%s\t%s (perplexity %.4f vs %s %.4f: %+.2f%%, bar %.1f%%; argmax agreement %.4f%s; mean KL %.5f nats; %d tokens)"
      % (sys.argv[3], "pass" if ok else "FAIL", o["perplexity"], sys.argv[4], c["perplexity"], (ratio - 1) * 100,
         bar * 100, c["argmax_agreement"], ", bar %.2f" % agree if agree > 0 else "", c["kl_mean"], o["tokens"]))
sys.exit(0 if ok else 1)
PY
    else
        printf '%s\tFAIL (build or kiln perplexity failed)\n' "$name"
        status=1
    fi
    rm -f "$work/q-$w.engine"
done
rm -f "$work/q-ref.engine"
exit $status
