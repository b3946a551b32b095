#!/usr/bin/env bash
# Weight-only quantized LLM engines (kiln/WeightOnlyMatMul) on the CPU:
#  - the tiny AWQ-format and GPTQ-format checkpoints of
#    tests/data/llm/quantized (written by tests/data/llm/make_quantized.py
#    following each format's packing) import with their int4 weights kept
#    as stored, and their logits at every position match the engine of the
#    dequantized f32 checkpoint beside them (the same weights s · (q − z)
#    in f32): argmax agreement 1, mean KL below 1e-6 nats, perplexity equal
#    to 1e-5 relative;
#  - kiln build --weights int8 / int4 (round-to-nearest at build) on the
#    tiny Llama: LLMC lists the formats, the engines are smaller, and their
#    logits stay close to the f32 engine's (mean KL below 0.01 nats for
#    int8, below 1 for int4 in groups of 32 on this random model);
#  - kiln build --dtype fp8 (E4M3 weights per channel, activations per
#    token): LLMC lists fp8, and the logits stay within a mean KL of 0.3
#    nats of the f32 engine's on this random model; with the activations
#    quantized by the norms and SwiGLU (the default) the logits are those
#    of each Fp8MatMul quantizing its own x (KILN_LLM_FP8_INPUT=matmul),
#    and so are those of the layers fused into FusedMatMul over E4M3
#    weights (KILN_LLM_FUSE=1 KILN_LLM_FUSE_FP8=1);
#  - kiln build --dtype fp8 --calibrate TEXT (static activation scales):
#    layer 0's scale recomputed from the checkpoint, logits near f32's;
#  - a checkpoint kiln cannot read as stored is refused with its reason.
set -u
source "$(dirname "$0")/common.bash"

D=$KILN_SOURCE_DIR/tests/data/llm
Q=$D/quantized
TEXT=$KILN_SOURCE_DIR/tests/data/text/declaration_of_independence.txt

# compare_json WHAT MAX_KL MIN_AGREE [MAX_REL_PPL]: checks the last
# `kiln perplexity --compare --json` output.
compare_json() {
  if python3 - "$OUT" "$2" "$3" "${4:-1e9}" <<'PY'; then
import json, sys
r = json.load(open(sys.argv[1]))
c = r["compare"]
rel = abs(r["perplexity"] - c["perplexity"]) / c["perplexity"]
print(f"  agreement {c['argmax_agreement']:.4f}, mean KL {c['kl_mean']:.3g}, perplexity {r['perplexity']:.6g} vs {c['perplexity']:.6g}")
ok = c["kl_mean"] <= float(sys.argv[2]) and c["argmax_agreement"] >= float(sys.argv[3]) and rel <= float(sys.argv[4])
sys.exit(0 if ok else 1)
PY
    PASSED=$((PASSED + 1))
  else
    fail "$1: outside the bounds (KL <= $2, agreement >= $3, relative perplexity <= ${4:-any})"
  fi
}

expect_ok "dequantized f32 reference builds" "$KILN" build "$Q/dequantized" -o "$TMP/ref.engine"
for fmt in awq gptq; do
  expect_ok "$fmt builds" "$KILN" build "$Q/$fmt" -o "$TMP/$fmt.engine"
  expect_stdout "$fmt keeps int4" "with matmul weights int4-g32"
  expect_ok "$fmt perplexity" "$KILN" perplexity "$TMP/$fmt.engine" "$TEXT" --window 128 --compare "$TMP/ref.engine" --json
  compare_json "$fmt against its dequantized f32 checkpoint" 1e-6 1.0 1e-5
done

expect_ok "f32 build" "$KILN" build "$D/llama" -o "$TMP/f32.engine"
expect_ok "int8 build" "$KILN" build "$D/llama" -o "$TMP/int8.engine" --weights int8
expect_stdout "int8 listed" "with matmul weights int8,"
expect_ok "int4 build" "$KILN" build "$D/llama" -o "$TMP/int4.engine" --weights int4 --weights-group 32
expect_stdout "int4 listed" "with matmul weights int4-g32,"
expect_ok "int4 with the output projection" "$KILN" build "$D/llama" -o "$TMP/int4lm.engine" --weights int4 \
  --weights-group 32 --quantize-lm-head
f32_size=$(stat -c %s "$TMP/f32.engine")
for e in int8 int4; do
  size=$(stat -c %s "$TMP/$e.engine")
  if [ "$size" -lt "$f32_size" ]; then PASSED=$((PASSED + 1)); else fail "$e engine is $size bytes, f32 $f32_size"; fi
done
if [ "$(stat -c %s "$TMP/int4lm.engine")" -lt "$(stat -c %s "$TMP/int4.engine")" ]; then
  PASSED=$((PASSED + 1))
else
  fail "--quantize-lm-head did not shrink the engine"
fi
expect_ok "int8 perplexity" "$KILN" perplexity "$TMP/int8.engine" "$TEXT" --window 128 --compare "$TMP/f32.engine" --json
compare_json "int8 against f32" 0.01 0.9
expect_ok "int4 perplexity" "$KILN" perplexity "$TMP/int4.engine" "$TEXT" --window 128 --compare "$TMP/f32.engine" --json
compare_json "int4 against f32" 1.0 0.4

expect_ok "fp8 build" "$KILN" build "$D/llama" -o "$TMP/fp8.engine" --dtype fp8
expect_stdout "fp8 listed" "f32 with matmul weights fp8,"
expect_ok "fp8 perplexity" "$KILN" perplexity "$TMP/fp8.engine" "$TEXT" --window 128 --compare "$TMP/f32.engine" --json
compare_json "fp8 against f32" 0.3 0.6
# the FP8 layers' x quantized by the norms and SwiGLU that write it (the
# default) against each Fp8MatMul quantizing its own: the same values
KILN_LLM_FP8_INPUT=matmul expect_ok "fp8 build, x quantized by the matmuls" "$KILN" build "$D/llama" \
  -o "$TMP/fp8m.engine" --dtype fp8
expect_ok "fp8 perplexity against it" "$KILN" perplexity "$TMP/fp8.engine" "$TEXT" --window 128 \
  --compare "$TMP/fp8m.engine" --json
compare_json "fp8, x quantized by the norms, against by the matmuls" 1e-6 1.0 1e-6
# the head fused after unfused layers (KILN_LLM_FUSE_HEAD=1, not the
# default): the last MLP output added to the last tokens' rows only, the
# final norm and the output projection one FusedMatMul writing f32 logits
KILN_LLM_FUSE_HEAD=1 expect_ok "fp8 build, the head fused" "$KILN" build "$D/llama" -o "$TMP/fp8f.engine" --dtype fp8
expect_ok "fp8 perplexity, the head fused" "$KILN" perplexity "$TMP/fp8f.engine" "$TEXT" --window 128 \
  --compare "$TMP/fp8.engine" --json
compare_json "fp8, the head fused, against unfused" 1e-6 1.0 1e-6

# the FP8 layers fused (KILN_LLM_FUSE_FP8=1, not yet the default; on the
# CPU with KILN_LLM_FUSE=1): each norm, RoPE, SwiGLU and residual add
# inside a FusedMatMul over E4M3 weights, the same values
KILN_LLM_FUSE=1 KILN_LLM_FUSE_FP8=1 expect_ok "fp8 build, the layers fused" "$KILN" build "$D/llama" \
  -o "$TMP/fp8fl.engine" --dtype fp8
expect_ok "fused fp8 engine has FusedMatMul layers" "$KILN" inspect "$TMP/fp8fl.engine"
expect_stdout "fused fp8 qkv layer" "self_attn.qkv_proj.norm_matmul_rope"
expect_ok "fp8 perplexity, the layers fused" "$KILN" perplexity "$TMP/fp8fl.engine" "$TEXT" --window 128 \
  --compare "$TMP/fp8.engine" --json
compare_json "fp8, the layers fused, against unfused" 1e-6 1.0 1e-6

# static activation scales from a calibration text (--calibrate): the
# summary says so; layer 0's qkv scale is the max |RMSNorm(embedding)|
# over the text's first 256 tokens, recomputed here from the safetensors
# file (in double, by Python) and compared with what the build logged; the
# logits stay as close to f32 as the per-token engine's
expect_ok "fp8 build, calibrated" "$KILN" build "$D/llama" -o "$TMP/fp8c.engine" --dtype fp8 --calibrate "$TEXT" \
  --verbose
expect_stdout "calibrated summary" "activation scales from 256 calibration tokens"
cp "$ERR" "$TMP/calib.log"
expect_ok "ids of the text" "$KILN" tokenize "$TMP/f32.engine" "$(cat "$TEXT")"
echo "case: layer 0's qkv scale is max |RMSNorm(embedding)| over the calibration tokens"
if python3 - "$D/llama" "$OUT" "$TMP/calib.log" <<'PY'; then PASSED=$((PASSED + 1)); else fail "calibrated qkv scale"; fi
import json, math, re, struct, sys
d, ids, log = sys.argv[1], json.load(open(sys.argv[2]))[:256], open(sys.argv[3]).read()
cfg = json.load(open(d + "/config.json"))
f = open(d + "/model.safetensors", "rb")
n = struct.unpack("<Q", f.read(8))[0]
head = json.loads(f.read(n))
def tensor(name):
    t = head[name]
    assert t["dtype"] == "F32"
    a, b = t["data_offsets"]
    f.seek(8 + n + a)
    return struct.unpack("<%df" % ((b - a) // 4), f.read(b - a))
emb, w, h = tensor("model.embed_tokens.weight"), tensor("model.layers.0.input_layernorm.weight"), cfg["hidden_size"]
want = 0.0
for t in ids:
    x = emb[t * h:(t + 1) * h]
    inv = 1.0 / math.sqrt(sum(v * v for v in x) / h + cfg["rms_norm_eps"])
    want = max(want, max(abs(v * inv * w[i]) for i, v in enumerate(x)))
got = float(re.search(r"layer 0, static max \|x\| of qkv ([0-9.e+-]+)", log).group(1))
print(f"  layer 0 qkv: kiln {got:.9g}, recomputed {want:.9g}")
sys.exit(0 if abs(got - want) <= 1e-5 * want else 1)
PY
expect_ok "fp8 calibrated perplexity" "$KILN" perplexity "$TMP/fp8c.engine" "$TEXT" --window 128 \
  --compare "$TMP/f32.engine" --json
compare_json "fp8 calibrated against f32" 0.3 0.6
KILN_LLM_FUSE=1 KILN_LLM_FUSE_FP8=1 expect_ok "fp8 build, calibrated, the layers fused" "$KILN" build "$D/llama" \
  -o "$TMP/fp8cf.engine" --dtype fp8 --calibrate "$TEXT"
expect_ok "fp8 perplexity, calibrated, fused against unfused" "$KILN" perplexity "$TMP/fp8cf.engine" "$TEXT" \
  --window 128 --compare "$TMP/fp8c.engine" --json
compare_json "fp8 calibrated, the layers fused, against unfused" 1e-6 1.0 1e-6
expect_error 2 "--calibrate without fp8" "--calibrate|--dtype fp8" "$KILN" build "$D/llama" -o "$TMP/x.engine" \
  --calibrate "$TEXT"
expect_error 1 "missing calibration text" "calibration text|no-such.txt" "$KILN" build "$D/llama" -o "$TMP/x.engine" \
  --dtype fp8 --calibrate "$TMP/no-such.txt"
: >"$TMP/empty.txt"
expect_error 1 "empty calibration text" "calibration text has" "$KILN" build "$D/llama" -o "$TMP/x.engine" \
  --dtype fp8 --calibrate "$TMP/empty.txt"

expect_error 2 "unknown --weights" "--weights|int3" "$KILN" build "$D/llama" -o "$TMP/x.engine" --weights int3
expect_error 1 "int4 group not a multiple of 32" "group size 48" "$KILN" build "$D/llama" -o "$TMP/x.engine" \
  --weights int4 --weights-group 48

# config.json variants kiln refuses, each naming what it does not support
bad() {
  rm -rf "$TMP/bad"
  cp -r "$Q/$1" "$TMP/bad"
  python3 - "$TMP/bad/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["quantization_config"].update(json.loads(sys.argv[2]))
json.dump(c, open(sys.argv[1], "w"))
PY
}
bad gptq '{"bits": 8}'
expect_error 1 "gptq 8 bits" "gptq with 8 bits" "$KILN" build "$TMP/bad" -o "$TMP/x.engine"
bad awq '{"quant_method": "bitsandbytes"}'
expect_error 1 "other methods" "bitsandbytes" "$KILN" build "$TMP/bad" -o "$TMP/x.engine"
bad awq '{"version": "gemv"}'
expect_error 1 "awq gemv" "gemv" "$KILN" build "$TMP/bad" -o "$TMP/x.engine"
bad gptq '{"group_size": 64}'
expect_error 1 "group size against the tensors" "qzeros" "$KILN" build "$TMP/bad" -o "$TMP/x.engine"
# act-order: a g_idx that does not follow input // group_size
rm -rf "$TMP/bad" && cp -r "$Q/gptq" "$TMP/bad"
python3 - "$TMP/bad/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
t = h["model.layers.0.self_attn.q_proj.g_idx"]
start = 8 + n + t["data_offsets"][0]
b[start:start + 4] = struct.pack("<i", 1)  # input 0 claims group 1
open(p, "wb").write(b)
PY
expect_error 1 "gptq act-order" "g_idx[0] = 1|desc_act" "$KILN" build "$TMP/bad" -o "$TMP/x.engine"
finish
