#!/usr/bin/env bash
# kiln bench and kiln perplexity on CPU engines of the tiny "llama" and
# "smollm" (tied embeddings) checkpoints of tests/data/llm:
#  - perplexity --ids --logits on the prompts + greedy tokens of refs.json
#    (transformers, tests/data/llm/make_references.py): logits at each
#    prompt's last position within 1e-4 relative of HF's, and the argmax at
#    every later position equal to HF's next greedy token; the reported
#    perplexity equal to exp(mean NLL) recomputed here from the dumped
#    logits; an engine compared with itself agrees everywhere with KL 0,
#    and the bf16 engine against the f32 one agrees on most positions;
#  - perplexity on a text (the Declaration of Independence): windows and
#    token counts add up with the engine's own tokenization;
#  - bench --json: every figure present and positive, exactly --gen-len
#    tokens timed, the weight bytes per token equal to the parameter count
#    of the safetensors headers times 4 (the untied embedding left out);
#  - the errors: a prompt + generation past the max sequence length, bad
#    options, ids outside the vocabulary.
set -u
source "$(dirname "$0")/common.bash"

DATA=$KILN_SOURCE_DIR/tests/data/llm
# The text without its final newline, so that `kiln tokenize ENGINE "$(cat
# FILE)"` (the shell drops trailing newlines) sees exactly what perplexity does.
TEXT=$TMP/declaration.txt
printf '%s' "$(cat "$KILN_SOURCE_DIR/tests/data/text/declaration_of_independence.txt")" >"$TEXT"

for cmd in bench perplexity; do
  expect_ok "kiln $cmd --help" "$KILN" $cmd --help
  expect_stdout "kiln $cmd --help prints usage" "^usage: kiln $cmd"
done

for fam in llama smollm; do
  expect_ok "build $fam f32" "$KILN" build "$DATA/$fam" -o "$TMP/$fam.engine" --max-seq-len 128
  expect_ok "build $fam bf16" "$KILN" build "$DATA/$fam" -o "$TMP/$fam-bf16.engine" --dtype bf16 --max-seq-len 128

  # ---- perplexity against transformers ----
  python3 - "$DATA/$fam/refs.json" "$TMP/$fam.ids" <<'PY'
import json, sys
refs = json.load(open(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    for p in refs["prompts"]:
        f.write(" ".join(str(i) for i in p["ids"] + p["greedy"]) + "\n")
PY
  expect_ok "$fam: perplexity --ids --logits" "$KILN" perplexity "$TMP/$fam.engine" "$TMP/$fam.ids" --ids \
    --logits "$TMP/$fam.logits" --json
  cp "$OUT" "$TMP/$fam-ppl.json"
  if python3 - "$DATA/$fam/refs.json" "$TMP/$fam.logits" "$TMP/$fam-ppl.json" <<'PY'
import array, json, math, sys
refs = json.load(open(sys.argv[1]))["prompts"]
raw = array.array("f")
with open(sys.argv[2], "rb") as f:
    raw.frombytes(f.read())
if sys.byteorder != "little":
    raw.byteswap()
out = json.load(open(sys.argv[3]))
V = len(refs[0]["last_logits"])
rows = sum(len(p["ids"]) + len(p["greedy"]) for p in refs)
assert len(raw) == rows * V, ("logits file holds", len(raw), "floats, expected", rows * V)
at, nll, count, bad = 0, 0.0, 0, 0
for i, p in enumerate(refs):
    seq = p["ids"] + p["greedy"]
    n, np_ = len(seq), len(p["ids"])
    row = lambda j: raw[(at + j) * V:(at + j + 1) * V]
    last = row(np_ - 1)
    ref = p["last_logits"]
    err = math.sqrt(sum((a - b) ** 2 for a, b in zip(last, ref)) / sum(b * b for b in ref))
    if not err <= 1e-4:
        print("prompt %d: last prompt logits relative error %g" % (i, err)); bad += 1
    for k, tok in enumerate(p["greedy"]):
        r = row(np_ - 1 + k)
        if max(range(V), key=lambda t: r[t]) != tok:
            print("prompt %d: argmax at greedy step %d differs from transformers" % (i, k)); bad += 1
            break
    for j in range(n - 1):
        r = row(j)
        m = max(r)
        lse = m + math.log(sum(math.exp(x - m) for x in r))
        nll += lse - r[seq[j + 1]]
        count += 1
    at += n
ppl = math.exp(nll / count)
if out["tokens"] != count or abs(out["perplexity"] - ppl) > 1e-4 * ppl:
    print("reported %d tokens, perplexity %r; recomputed %d, %r" % (out["tokens"], out["perplexity"], count, ppl)); bad += 1
print("%d sequences, %d predicted tokens, perplexity %.6g" % (len(refs), count, ppl))
sys.exit(1 if bad else 0)
PY
  then PASSED=$((PASSED + 1)); else fail "$fam: perplexity logits against transformers"; fi

  expect_ok "$fam: compared with itself" "$KILN" perplexity "$TMP/$fam.engine" "$TEXT" --compare "$TMP/$fam.engine" --json
  python3 - "$OUT" <<'PY' && PASSED=$((PASSED + 1)) || fail "$fam: an engine compared with itself"
import json, sys
o = json.load(open(sys.argv[1]))
c = o["compare"]
# identical logits: the same likelihood; KL 0 up to the f32 rounding of the log-probabilities kept
ok = c["argmax_agreement"] == 1.0 and abs(c["kl_mean"]) < 1e-6 and c["perplexity"] == o["perplexity"]
print(o)
sys.exit(0 if ok else 1)
PY
  expect_ok "$fam: bf16 against f32" "$KILN" perplexity "$TMP/$fam-bf16.engine" "$TEXT" --compare "$TMP/$fam.engine" \
    --window 64 --json
  python3 - "$OUT" <<'PY' && PASSED=$((PASSED + 1)) || fail "$fam: bf16 against f32"
import json, sys
o = json.load(open(sys.argv[1]))
c = o["compare"]
print(o)
# bf16 weights and activations against f32: close, not equal
ok = 0.8 <= c["argmax_agreement"] < 1.0 and 0 < c["kl_mean"] < 0.1 and abs(o["nll_mean"] / c["nll_mean"] - 1) < 0.05
sys.exit(0 if ok else 1)
PY

  # ---- perplexity on a text: windows of the engine's own tokens ----
  expect_ok "$fam: tokenize the text" "$KILN" tokenize "$TMP/$fam.engine" "$(cat "$TEXT")"
  cp "$OUT" "$TMP/$fam-text-ids.json"
  expect_ok "$fam: tokenize the text, nothing added" "$KILN" tokenize "$TMP/$fam.engine" "$(cat "$TEXT")" --no-add-special
  cp "$OUT" "$TMP/$fam-text-plain.json"
  expect_ok "$fam: perplexity on the text" "$KILN" perplexity "$TMP/$fam.engine" "$TEXT" --window 100 --json
  python3 - "$TMP/$fam-text-ids.json" "$TMP/$fam-text-plain.json" "$OUT" <<'PY' && PASSED=$((PASSED + 1)) || fail "$fam: text windows"
import json, math, sys
ids, plain = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
o = json.load(open(sys.argv[3]))
W = 100
# BOS (when prompts start with one) leads every window; the rest of the
# text is cut into windows of W - 1 (or W) tokens, each predicting all but
# its first token.
bos = len(ids) - len(plain)
assert bos in (0, 1) and ids[bos:] == plain
step = W - bos
sizes = [min(step, len(plain) - k) + bos for k in range(0, len(plain), step)]
sizes = [s for s in sizes if s >= 2]
print("text ids", len(ids), "bos", bos, "windows", len(sizes), "reported", o)
sys.exit(0 if o["windows"] == len(sizes) and o["tokens"] == sum(s - 1 for s in sizes) and o["perplexity"] > 1 else 1)
PY

  # ---- bench ----
  expect_ok "$fam: bench --json" "$KILN" bench "$TMP/$fam.engine" --prompt-len 24 --gen-len 12 --batch 2 --reps 2 \
    --copy-mb 16 --json
  python3 - "$OUT" "$DATA/$fam" <<'PY' && PASSED=$((PASSED + 1)) || fail "$fam: bench --json"
import json, os, struct, sys
o = json.load(open(sys.argv[1]))
d = sys.argv[2]
params = embed = 0
for name in os.listdir(d):
    if not name.endswith(".safetensors"):
        continue
    with open(os.path.join(d, name), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    for k, v in header.items():
        if k == "__metadata__":
            continue
        count = 1
        for s in v["shape"]:
            count *= s
        params += count
        if k == "model.embed_tokens.weight":
            embed = count
tied = json.load(open(os.path.join(d, "config.json"))).get("tie_word_embeddings", False)
want = 4 * (params if tied else params - embed)
print(o, "expected weight bytes per token", want)
ok = (o["weight_bytes"] == 4 * params and o["weight_bytes_per_token"] == want and o["batch"] == 2
      and o["gen_len"] == 12 and o["backend"] == "cpu" and o["dtype"] == "f32" and len(o["device"]) > 0)
for k in ["prefill_tok_s", "decode_tok_s", "ttft_ms", "itl_ms_p50", "itl_ms_p99", "copy_bandwidth_gb_s",
          "decode_floor_tok_s", "floor_fraction", "open_ms", "peak_rss_mb", "kv_bytes_per_token"]:
    ok = ok and o[k] > 0
ok = ok and o["itl_ms_p50"] <= o["itl_ms_p99"]
sys.exit(0 if ok else 1)
PY
done

expect_ok "bench, text output" "$KILN" bench "$TMP/llama.engine" --prompt-len 8 --gen-len 4 --reps 1 --copy-mb 16
expect_stdout "the floor line" "decode floor: .* of the floor"
expect_stdout "the device line" "^device: ."

# ---- errors ----
expect_error 1 "bench past the max sequence length" 'exceed the engine|max sequence length 128' \
  "$KILN" bench "$TMP/llama.engine" --prompt-len 100 --gen-len 29
expect_error 2 "bench --gen-len 1" '--gen-len >= 2' "$KILN" bench "$TMP/llama.engine" --gen-len 1
expect_error 2 "bench without an engine" 'expected one ENGINE' "$KILN" bench
expect_error 2 "bench --reps 0" '--reps must be in 1..1000' "$KILN" bench "$TMP/llama.engine" --reps 0
expect_error 2 "perplexity without a text" 'expected ENGINE and TEXTFILE' "$KILN" perplexity "$TMP/llama.engine"
expect_error 2 "perplexity --window 1" '--window must be >= 2' "$KILN" perplexity "$TMP/llama.engine" "$TEXT" --window 1
printf '1 2 3\n4 99999 5\n' >"$TMP/bad.ids"
expect_error 1 "an id outside the vocabulary" 'line 2|99999|not a token id' \
  "$KILN" perplexity "$TMP/llama.engine" "$TMP/bad.ids" --ids
expect_error 1 "a missing text file" 'cannot open|nothere.txt' "$KILN" perplexity "$TMP/llama.engine" "$TMP/nothere.txt"

finish
