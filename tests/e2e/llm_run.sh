#!/usr/bin/env bash
# The LLM commands on a tiny llama2.c checkpoint written here (random
# weights, a byte-fallback tokenizer.bin): build, tokenize/detokenize
# round trip, run (streaming and --json, greedy reproducibility, -n, stop
# strings), chat through a pipe, and the errors: a prompt longer than the
# engine's max sequence length, --chat without a template, usage errors.
set -u
source "$(dirname "$0")/common.bash"

python3 - "$TMP" <<'PY'
import random, struct, sys
out = sys.argv[1]
rnd = random.Random(7)
dim, hidden, layers, heads, kv_heads, vocab, seq_len = 32, 64, 2, 4, 2, 259, 64
head = dim // heads
kv = kv_heads * head
def mat(n, scale):
    return [rnd.uniform(-scale, scale) for _ in range(n)]
blocks = [
    mat(vocab * dim, 1.0),                 # token_embedding
    [1.0] * (layers * dim),                # rms_att
    mat(layers * dim * dim, 0.35),         # wq
    mat(layers * dim * kv, 0.35),          # wk
    mat(layers * dim * kv, 0.35),          # wv
    mat(layers * dim * dim, 0.35),         # wo
    [1.0] * (layers * dim),                # rms_ffn
    mat(layers * dim * hidden, 0.35),      # w1
    mat(layers * hidden * dim, 0.25),      # w2
    mat(layers * dim * hidden, 0.35),      # w3
    [1.0] * dim,                           # rms_final
    [0.0] * (seq_len * head // 2),         # freq_cis_real (unused)
    [0.0] * (seq_len * head // 2),         # freq_cis_imag (unused)
]
with open(out + "/tiny.bin", "wb") as f:
    f.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq_len))
    for b in blocks:
        f.write(struct.pack("<%df" % len(b), *b))
# llama2.c tokenizer.bin: <unk>, <s>, </s>, then the 256 byte tokens.
with open(out + "/tok.bin", "wb") as f:
    f.write(struct.pack("<i", 6))
    for t in [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % i for i in range(256)]:
        f.write(struct.pack("<fi", 0.0, len(t)) + t)
PY
E="$TMP/tiny.engine"

expect_ok "build a llama2.c checkpoint" "$KILN" build "$TMP/tiny.bin" --tokenizer "$TMP/tok.bin" -o "$E"

# Byte fallback: BOS (1), then 3 + each byte of "\u2581hi" (e2 96 81 68 69).
expect_ok "tokenize" "$KILN" tokenize "$E" "hi"
expect_stdout "BOS and the bytes of \\u2581hi" '^\[1, 229, 153, 132, 107, 108\]$'
expect_ok "tokenize --no-add-special --split-special" "$KILN" tokenize "$E" "hi" --no-add-special --split-special
expect_stdout "no BOS" '^\[229, 153, 132, 107, 108\]$'
expect_ok "detokenize" "$KILN" detokenize "$E" 107 108 35 3
expect_stdout "the bytes back" '^hi '

expect_ok "run greedy, 12 tokens, --json" "$KILN" run "$E" -p "hello" -n 12 --temperature 0 --json
cp "$OUT" "$TMP/a.json"
python3 - "$TMP/a.json" <<'PY' && PASSED=$((PASSED + 1)) || fail "--json object"
import json, sys
o = json.load(open(sys.argv[1]))
assert o["prompt_ids"][0] == 1 and len(o["prompt_ids"]) == 9, o["prompt_ids"]
assert len(o["generated_ids"]) == 12 and o["finish_reason"] == "length", o
assert isinstance(o["text"], str)
for k in ("prompt_tok_s", "generate_tok_s", "prompt_ms", "generate_ms"):
    assert o["timings"][k] >= 0, k
assert o["backend"] == "cpu" and "cuda_graphs" not in o, o
PY
# The GPU memory options are accepted (and change nothing) on a CPU engine.
expect_ok "--kv-cache-fraction and --no-cuda-graphs on the cpu" "$KILN" run "$E" -p "hello" -n 12 --temperature 0 \
  --kv-cache-fraction 0.5 --no-cuda-graphs --json
python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); sys.exit(a["generated_ids"] != b["generated_ids"] or a["kv_cache"] != b["kv_cache"])' \
  "$TMP/a.json" "$OUT" && PASSED=$((PASSED + 1)) || fail "memory options changed a cpu run"
expect_error 2 "--kv-cache-fraction out of range" "--kv-cache-fraction expects a number in (0, 1]" "$KILN" run "$E" -p "hello" --kv-cache-fraction 1.5
# --threads: one and three threads give the greedy tokens of the default
# pool (kernels split work without reordering sums), and say so.
for n in 1 3; do
  expect_ok "--threads $n" "$KILN" run "$E" -p "hello" -n 12 --temperature 0 --threads $n --json
  python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); sys.exit(a["generated_ids"] != b["generated_ids"] or b["threads"] != int(sys.argv[3]))' \
    "$TMP/a.json" "$OUT" $n && PASSED=$((PASSED + 1)) || fail "--threads $n changed the tokens or was not reported"
done
expect_error 2 "--threads out of range" "--threads" "$KILN" run "$E" -p "hello" --threads 0
# An FP8 KV cache: the same blocks in a quarter of the f32 cache's bytes
# (one byte a value), and greedy text from it.
expect_ok "build --kv-dtype fp8" "$KILN" build "$TMP/tiny.bin" --tokenizer "$TMP/tok.bin" --kv-dtype fp8 -o "$TMP/fp8kv.engine"
expect_ok "run an fp8-cache engine" "$KILN" run "$TMP/fp8kv.engine" -p "hello" -n 12 --temperature 0 --json
python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); ka, kb = a["kv_cache"], b["kv_cache"]; sys.exit(not (kb["blocks"] == ka["blocks"] and 4 * kb["bytes"] == ka["bytes"] and len(b["generated_ids"]) == 12))' \
  "$TMP/a.json" "$OUT" && PASSED=$((PASSED + 1)) || fail "fp8 cache: not a quarter of the f32 cache's bytes: $(cat "$OUT")"
expect_error 2 "--kv-dtype unknown" "unknown --kv-dtype \"fp4\" (auto, f32, f16, bf16 or fp8)" \
  "$KILN" build "$TMP/tiny.bin" --tokenizer "$TMP/tok.bin" --kv-dtype fp4 -o "$TMP/x.engine"
expect_ok "greedy again gives the same tokens" "$KILN" run "$E" -p "hello" -n 12 --temperature 0 --json
python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); sys.exit(a["generated_ids"] != b["generated_ids"])' \
  "$TMP/a.json" "$OUT" && PASSED=$((PASSED + 1)) || fail "greedy runs differ"
expect_ok "seeded sampling, twice" "$KILN" run "$E" -p "hello" -n 12 --temperature 1.2 --seed 9 --json
cp "$OUT" "$TMP/s.json"
expect_ok "seeded sampling, again" "$KILN" run "$E" -p "hello" -n 12 --temperature 1.2 --seed 9 --json
python3 -c 'import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); sys.exit(a["generated_ids"] != b["generated_ids"])' \
  "$TMP/s.json" "$OUT" && PASSED=$((PASSED + 1)) || fail "seeded runs differ"

expect_ok "run streams text and reports speed" "$KILN" run "$E" -p "hello" -n 12 --temperature 0
grep -q 'prompt: 9 tokens, [0-9.]* tok/s; generation: 12 tokens, [0-9.]* tok/s' "$ERR" \
  && PASSED=$((PASSED + 1)) || fail "speed line: $(cat "$ERR")"
python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["text"]; s=open(sys.argv[2],encoding="utf-8",errors="replace").read(); sys.exit(s != t + "\n")' \
  "$TMP/a.json" "$OUT" && PASSED=$((PASSED + 1)) || fail "streamed text differs from --json text"

# A stop string: the first character of the greedy text ends it at once.
first=$(python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["text"]; print(t[:1] if t else "")' "$TMP/a.json")
if [ -n "$first" ] && [ "$first" != "-" ]; then
  expect_ok "--stop" "$KILN" run "$E" -p "hello" -n 12 --temperature 0 --json --stop "$first"
  expect_stdout "stopped with empty text" '"text":"","finish_reason":"stop"'
fi

expect_error 1 "prompt longer than the max sequence length" \
  "prompt of 103 tokens exceeds the engine's max sequence length 64" \
  "$KILN" run "$E" -p "$(printf 'x%.0s' $(seq 99))" -n 4
expect_error 1 "--chat without a chat template" "no chat template" \
  "$KILN" run "$E" -p "hi" --chat
expect_error 1 "chat without a chat template" "no chat template" \
  "$KILN" chat "$E"
expect_error 2 "run without -p" "missing -p PROMPT" "$KILN" run "$E"
expect_error 2 "run with a bad --temperature" "--temperature expects a number" \
  "$KILN" run "$E" -p hi --temperature hot
expect_error 2 "detokenize a non-number" "token id expects an integer" "$KILN" detokenize "$E" abc
expect_error 1 "detokenize an id outside the vocabulary" "259" "$KILN" detokenize "$E" 259
if [ -f "$EXAMPLE_LIB" ] && "$KILN" build "$NET" -o "$TMP/sb.engine" --plugins "$EXAMPLE_LIB" >/dev/null 2>&1; then
  expect_error 1 "run a non-LLM engine" "not an LLM engine|no LLMC" \
    "$KILN" run "$TMP/sb.engine" -p hi --plugins "$EXAMPLE_LIB"
fi
expect_ok "run --help" "$KILN" run --help
expect_stdout "help names the options" "--temperature"
expect_ok "chat --help" "$KILN" chat --help
expect_ok "tokenize --help" "$KILN" tokenize --help

finish
