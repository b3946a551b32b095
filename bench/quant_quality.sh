#!/usr/bin/env bash
# The quality table of issue 10 on the CPU: the default model (or any GGUF)
# built in each quantized format, teacher-forced over the fixed English text,
# each beside the f32 engine (perplexity, delta, argmax agreement, mean KL),
# and beside it the same formats simulated from their definitions by
# bench/quant_reference.py (numpy, gguf, ml_dtypes: nobody's code here).
#
#   bash bench/quant_quality.sh KILN GGUF WORK_DIR [TEXT]
#
# PY (default .venv-ref/bin/python) runs the reference (python3 -m venv
# .venv-ref && .venv-ref/bin/pip install numpy==2.4.6 gguf==0.19.0
# ml_dtypes==0.6.0, the versions measured with); without them the
# reference columns stay empty and stderr says why. The CPU engines
# keep f32 activations, so the f32 engine is the reference here (a bf16
# engine's own distance from it is the bf16 row); tests/gpu/quant_quality.sh
# is the same table on the GPU against the bf16 engine. Takes about 20
# minutes on 2 idle cores (the FP8 CPU plugin is the slow reference kernel).
set -euo pipefail
kiln=$1 gguf=$2 work=$3
root=$(cd "$(dirname "$0")/.." && pwd)
text=${4:-$root/tests/data/text/declaration_of_independence.txt}
py=${PY:-$root/.venv-ref/bin/python}
mkdir -p "$work"
formats=(bf16 int8 int8-g128 int4 fp8 kv-fp8)
build() {
    local name=$1
    shift
    "$kiln" build "$gguf" --max-batch 32 -o "$work/$name.engine" "$@" >&2
}
build f32 --dtype f32
build bf16 --dtype bf16
build int8 --dtype f32 --weights int8
build int8-g128 --dtype f32 --weights int8 --weights-group 128
build int4 --dtype f32 --weights int4
build fp8 --dtype fp8
build kv-fp8 --dtype f32 --kv-dtype fp8
# the windows kiln perplexity cuts from the text, as token ids, so that
# both sides score exactly the same tokens
python3 - "$kiln" "$work/f32.engine" "$text" "$work/ids.txt" <<'PY'
import json, subprocess, sys
kiln, engine, text, out = sys.argv[1:]
t = open(text, encoding="utf-8").read()
ids = json.loads(subprocess.check_output([kiln, "tokenize", engine, t]))
bare = json.loads(subprocess.check_output([kiln, "tokenize", engine, t, "--no-add-special"]))
bos = len(ids) == len(bare) + 1 and ids[1:] == bare
window = 512
body = window - bos
with open(out, "w") as f:
    for at in range(int(bos), len(ids), body):
        w = ([ids[0]] if bos else []) + ids[at:at + body]
        if len(w) >= 2:
            f.write(" ".join(map(str, w)) + "\n")
PY
for f in "${formats[@]}"; do
    "$kiln" perplexity "$work/$f.engine" "$work/ids.txt" --ids --compare "$work/f32.engine" --json >"$work/$f.json"
done
if "$py" -c "import numpy, gguf, ml_dtypes" 2>/dev/null; then
    "$py" "$root/bench/quant_reference.py" "$gguf" "$work/ids.txt" --json \
        --formats "f32,$(IFS=,; echo "${formats[*]}")" >"$work/reference.jsonl"
else
    echo "quant quality: no reference ($py lacks numpy, gguf or ml_dtypes)" >&2
    : >"$work/reference.jsonl"
fi
python3 - "$work" "${formats[@]}" <<'PY'
import json, sys
work, formats = sys.argv[1], sys.argv[2:]
ref = {}
for line in open(f"{work}/reference.jsonl"):
    o = json.loads(line)
    ref[o["format"]] = o
# the issue's bars: perplexity within X of the unquantized engine, argmax agreement
bars = {"int8": (0.5, None), "int8-g128": (0.5, None), "int4": (5.0, None), "fp8": (1.0, 0.95), "kv-fp8": (0.5, None)}
print("| format | kiln ppl | delta | argmax | KL | reference ppl | delta | argmax | KL | bar | kiln |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
first = True
for f in formats:
    o = json.load(open(f"{work}/{f}.json"))
    c = o["compare"]
    if first:
        r = ref.get("f32")
        print(f"| f32 | {c['perplexity']:.4f} | | | | {r['perplexity']:.4f} | | | | | |" if r else
              f"| f32 | {c['perplexity']:.4f} | | | | | | | | | |")
        first = False
    d = (o["perplexity"] / c["perplexity"] - 1) * 100
    r = ref.get(f)
    rs = (f"{r['perplexity']:.4f} | {r['delta_pct']:+.2f}% | {r['argmax_agreement']:.4f} | {r['kl_mean']:.4f}"
          if r else " | | | ")
    bar, agree = bars.get(f, (None, None))
    if bar is None:
        verdict, bs = "", ""
    else:
        ok = abs(d) <= bar and (agree is None or c["argmax_agreement"] >= agree)
        verdict = "pass" if ok else "FAIL"
        bs = f"{bar}%" + (f", argmax >= {agree}" if agree else "")
    print(f"| {f} | {o['perplexity']:.4f} | {d:+.2f}% | {c['argmax_agreement']:.4f} | {c['kl_mean']:.4f} | {rs} |"
          f" {bs} | {verdict} |")
print(f"\n{o['tokens']} tokens predicted in {o['windows']} windows of up to {o['window']}")
PY
