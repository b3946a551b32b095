#!/usr/bin/env bash
# kiln's tokenizer against Hugging Face tokenizers/transformers and
# sentencepiece: builds tokenizer.json files from the real vocabularies in
# tests/data/tokenizer (GPT-2, a Llama-3-style regex variant, Llama 2 in three
# tokenizer.json forms), writes reference ids for a corpus of hard strings,
# then runs test_tokenizer against them (exact ids, decoded text, streaming).
set -euo pipefail

src=${KILN_SOURCE_DIR:?KILN_SOURCE_DIR is not set}
build=${KILN_BUILD_DIR:?KILN_BUILD_DIR is not set}
vocab=$src/tests/data/tokenizer
venv=$src/.venv
pins=(tokenizers==0.23.3 transformers==5.24.0 sentencepiece==0.2.3 protobuf==7.36.2)

have_pins() {
    "$venv/bin/python" - "${pins[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if all(version(p.split("==")[0]) == p.split("==")[1] for p in sys.argv[1:]) else 1)
PY
}

if ! have_pins; then
    if [[ ! -x $venv/bin/python ]] && ! python3 -m venv "$venv"; then
        echo "skipped: cannot create a Python venv at $venv"
        exit 77
    fi
    if ! "$venv/bin/pip" install --quiet "${pins[@]}"; then
        echo "skipped: pip could not install ${pins[*]} (no access to the package registry?)"
        exit 77
    fi
fi

out=$build/tokref
rm -rf "$out"
"$venv/bin/python" "$src/tests/data/tokenizer/make_reference.py" "$vocab" "$out" 2>&1 | grep -v "PyTorch was not found" || true
[[ -f $out/versions.txt ]] || { echo "make_reference.py did not finish"; exit 1; }
cat "$out/versions.txt"

bin=$build/tests/test_tokenizer
[[ -x $bin ]] || { echo "$bin is not built"; exit 1; }
KILN_TOKREF_DIR=$out "$bin"

# `kiln tokenize` and its two switches against Hugging Face tokenizers on
# the checkpoints of tests/data/llm (their tokenizer.json, which kiln reads):
# --no-add-special is add_special_tokens=False, --split-special is
# encode_special_tokens=True (transformers' split_special_tokens), each
# alone and together.
kiln=$build/bin/kiln
[[ -x $kiln ]] || { echo "$kiln is not built"; exit 1; }
"$venv/bin/python" - "$kiln" "$src/tests/data/llm" "$out" <<'PY'
import json, os, subprocess, sys
from tokenizers import Tokenizer

kiln, data, out = sys.argv[1:]
texts = ["Hello world", "<s>Hello</s> world", " <s> [INST] hi [/INST]", "a <|begin_of_text|>b<|eot_id|>",
         "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|> x <unk>"]
switches = {(): (True, False), ("--no-add-special",): (False, False), ("--split-special",): (True, True),
            ("--no-add-special", "--split-special"): (False, True)}
bad = checked = 0
for fam in ["llama", "llama3", "mistral", "qwen2", "smollm", "tinyllama"]:
    engine = os.path.join(out, fam + ".engine")
    subprocess.run([kiln, "build", os.path.join(data, fam), "-o", engine], check=True, capture_output=True)
    hf = Tokenizer.from_file(os.path.join(data, fam, "tokenizer.json"))
    for text in texts:
        for flags, (add_special, split_special) in switches.items():
            hf.encode_special_tokens = split_special
            ref = hf.encode(text, add_special_tokens=add_special).ids
            got = json.loads(subprocess.run([kiln, "tokenize", engine, text, *flags], check=True,
                                            capture_output=True, text=True).stdout)
            checked += 1
            if got != ref:
                bad += 1
                print(f"FAIL {fam} {text!r} {' '.join(flags)}: kiln {got}, tokenizers {ref}")
print(f"kiln tokenize vs tokenizers: {checked - bad} of {checked} identical")
sys.exit(1 if bad else 0)
PY
