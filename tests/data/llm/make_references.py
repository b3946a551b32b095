#!/usr/bin/env python3
"""Reference logits and greedy tokens from transformers (PyTorch, CPU, f32)
for the tiny checkpoints of make_checkpoints.py: writes <family>/refs.json,
which tests/unit/test_llm_model.c compares kiln's engines against.

    python tests/data/llm/make_references.py [DATA_DIR]

Needs torch, transformers and tokenizers. For each family and each of the 8
prompts: the prompt's token ids (the family's tokenizer.json, special tokens
as its post-processor adds them), the f32 logits of the last prompt token,
and 32 greedy tokens (argmax each step, no EOS stop). The greedy loop is
written out (full forward each step) so that no generation_config default
(sampling, EOS, repetition penalty) can change it; model.generate with
do_sample=False is run as a cross-check and recorded.
"""
import json
import os
import sys

import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = sys.argv[1] if len(sys.argv) > 1 else HERE
FAMILIES = ["llama", "llama3", "mistral", "qwen2", "smollm", "tinyllama"]
PROMPTS = [
    "Hello",
    "The capital of France is",
    "Once upon a time, there was a little girl named Lily.",
    "def main():\n    print('hello')",
    "In 2024 the model answered 42 questions.",
    "Zürich and Montréal",
    "To be or not to be, that is the question.",
    "the quick brown fox",
]
NEW_TOKENS = 32


def load(d):
    try:
        return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    except TypeError:  # transformers 4.x spells it torch_dtype
        return AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)


@torch.no_grad()
def family_refs(name):
    d = os.path.join(DATA, name)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    model = load(d).to("cpu").eval()
    assert next(model.parameters()).dtype == torch.float32
    out = {"family": name, "transformers": transformers.__version__, "torch": torch.__version__, "prompts": []}
    for text in PROMPTS:
        ids = tok.encode(text).ids
        x = torch.tensor([ids], dtype=torch.long)
        last = model(x, use_cache=False).logits[0, -1].float()
        seq = list(ids)
        for _ in range(NEW_TOKENS):
            lg = model(torch.tensor([seq], dtype=torch.long), use_cache=False).logits[0, -1]
            seq.append(int(torch.argmax(lg)))
        greedy = seq[len(ids):]
        gen_ok = None
        try:
            g = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW_TOKENS,
                               min_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=0, temperature=None,
                               top_p=None, top_k=None)
            gen_ok = g[0, len(ids):].tolist() == greedy
        except Exception as e:  # recorded, not fatal: the written-out loop is the reference
            gen_ok = "generate failed: %s" % e
        out["prompts"].append({"text": text, "ids": ids, "last_logits": [float(v) for v in last],
                               "greedy": greedy, "generate_agrees": gen_ok})
    with open(os.path.join(d, "refs.json"), "w") as f:
        json.dump(out, f)
    print(name, "prompts", len(PROMPTS), "generate agrees:", [p["generate_agrees"] for p in out["prompts"]])


def main():
    torch.manual_seed(0)
    for name in FAMILIES:
        family_refs(name)


if __name__ == "__main__":
    main()
