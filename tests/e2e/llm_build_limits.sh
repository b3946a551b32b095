#!/usr/bin/env bash
# Checkpoints and build flags that used to build engines which then refused
# to run (or crashed under UBSan): numbers in a GGUF that are not what
# their key allows (token types of 1e30, NaN, 2^64-1; rope.freq_base 1e31),
# a vocabulary token with a NUL byte, a context of one token, KV-cache
# limits that hold no block or can never be allocated. The build must
# refuse each with exit 1 and one line naming the problem or the limit;
# whatever `kiln run` would refuse, the build refuses first.
set -u
source "$(dirname "$0")/common.bash"
EDIT="python3 $KILN_SOURCE_DIR/tests/tools/gguf_edit.py"
G="$KILN_SOURCE_DIR/tests/data/llm/llama/model-f32.gguf"
HF="$KILN_SOURCE_DIR/tests/data/llm/llama"

$EDIT "$G" "$TMP/same.gguf" tokenizer.ggml.token_type array:i32 old || fail "gguf_edit.py failed"
cmp -s "$G" "$TMP/same.gguf" || fail "gguf_edit.py does not rewrite an unchanged file byte for byte"
expect_ok "an unchanged GGUF builds" "$KILN" build "$TMP/same.gguf" -o "$TMP/same.engine"

# gguf CASE KEY TYPE VALUE KEYWORDS: rewrites KEY, expects the build to fail.
gguf() {
  $EDIT "$G" "$TMP/$1.gguf" "$2" "$3" "$4" || fail "gguf_edit.py failed on $1"
  expect_error 1 "GGUF $1" "$5" "$KILN" build "$TMP/$1.gguf" -o "$TMP/$1.engine"
  [ -e "$TMP/$1.engine" ] && fail "GGUF $1: an engine was written"
}
gguf types-1e30 tokenizer.ggml.token_type array:f64 '[1e30] * len(old)' 'token_type|expected integers'
gguf types-nan tokenizer.ggml.token_type array:f32 '[float("nan")] * len(old)' 'token_type|expected integers'
gguf types-inf tokenizer.ggml.token_type array:f64 '[float("inf")] * len(old)' 'token_type|expected integers'
gguf types-u64max tokenizer.ggml.token_type array:u64 '[2**64 - 1] * len(old)' 'token_type"[0] is outside 0..6'
gguf types-neg tokenizer.ggml.token_type array:i32 '[-5] * len(old)' 'token_type"[0] is outside 0..6'
gguf theta-1e31 llama.rope.freq_base f32 '1e31' 'LLM build: section LLMC|"theta" = 1e+31 is outside'
gguf theta-f64 llama.rope.freq_base f64 '1e300' 'freq_base|outside the f32 range'
gguf nul-token tokenizer.ggml.tokens array:string 'old[:5] + [b"a\0b"] + old[6:]' 'LLM build: section TOKN'
gguf context-1 llama.context_length u32 '1' 'max_seq_len 1|at least 2 tokens'

# ---- the same limits from a Hugging Face config and from flags ----------------------------------
mkdir "$TMP/hf1"
cp "$HF"/* "$TMP/hf1/"
python3 - "$TMP/hf1/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["max_position_embeddings"] = 1
json.dump(c, open(sys.argv[1], "w"))
PY
expect_error 1 "max_position_embeddings 1" 'max_seq_len 1|at least 2 tokens' \
  "$KILN" build "$TMP/hf1" -o "$TMP/x.engine"
expect_error 1 "--max-seq-len 1 --max-batch 1" 'max_seq_len 1|at least 2 tokens' \
  "$KILN" build "$HF" -o "$TMP/x.engine" --max-seq-len 1 --max-batch 1
expect_error 1 "--block-size 65536" 'block_size 65536 exceeds max_seq_len 256' \
  "$KILN" build "$HF" -o "$TMP/x.engine" --block-size 65536
$EDIT "$G" "$TMP/long.gguf" llama.context_length u32 '16777216' || fail "gguf_edit.py failed"
expect_error 1 "--max-seq-len 16777216 --max-batch 1048576" \
  'need 1099511627776 KV blocks|at most 16777216' \
  "$KILN" build "$TMP/long.gguf" -o "$TMP/x.engine" --max-seq-len 16777216 --max-batch 1048576

# ---- small but valid limits build engines whose default KV cache holds their sequences ----------
expect_ok "--max-seq-len 2 --block-size 2 --max-batch 1" \
  "$KILN" build "$HF" -o "$TMP/small.engine" --max-seq-len 2 --block-size 2 --max-batch 1
expect_ok "and it runs" "$KILN" run "$TMP/small.engine" -p "" -n 1
expect_ok "--block-size 256 (one block per sequence)" \
  "$KILN" build "$HF" -o "$TMP/big-block.engine" --block-size 256
expect_ok "and it runs" "$KILN" run "$TMP/big-block.engine" -p hi -n 2

finish
