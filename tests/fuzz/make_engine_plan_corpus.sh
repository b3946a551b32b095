#!/usr/bin/env bash
# Writes the seed corpus of fuzz_engine_plan (tests/fuzz/corpus/fuzz_engine_plan/):
# valid engines for the structure-aware mutator to take apart: the MLP of
# tests/data/nets (every native op, with and without fusion) and a tiny
# llama2.c model (the built-in LLM plugins, LLMC and TOKN sections).
# The engines are named *.bin because the repository ignores *.engine.
# Run from the repository root after a build: bash tests/fuzz/make_engine_plan_corpus.sh [build-dir]
set -euo pipefail
KILN=${1:-build}/bin/kiln
OUT=tests/fuzz/corpus/fuzz_engine_plan
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT"
"$KILN" build tests/data/nets/mlp.json -o "$OUT/mlp_fused.bin" >/dev/null
"$KILN" build tests/data/nets/mlp.json -o "$OUT/mlp_unfused.bin" --no-fusion >/dev/null
python3 - "$TMP" <<'PY'
import random, struct, sys
out = sys.argv[1]
rnd = random.Random(3)
dim, hidden, layers, heads, kv_heads, vocab, seq_len = 8, 16, 1, 2, 1, 259, 16
head = dim // heads
kv = kv_heads * head
sizes = [vocab * dim, layers * dim, layers * dim * dim, layers * dim * kv, layers * dim * kv,
         layers * dim * dim, layers * dim, layers * dim * hidden, layers * hidden * dim,
         layers * dim * hidden, dim, seq_len * head // 2, seq_len * head // 2]
with open(out + "/tiny.bin", "wb") as f:
    f.write(struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq_len))
    for n in sizes:
        f.write(struct.pack("<%df" % n, *[rnd.uniform(-0.5, 0.5) for _ in range(n)]))
with open(out + "/tok.bin", "wb") as f:
    f.write(struct.pack("<i", 6))
    for t in [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % i for i in range(256)]:
        f.write(struct.pack("<fi", 0.0, len(t)) + t)
PY
"$KILN" build "$TMP/tiny.bin" --tokenizer "$TMP/tok.bin" -o "$OUT/tiny_llm.bin" \
  --max-seq-len 16 --max-batch 2 --block-size 4 >/dev/null
ls -l "$OUT"
