#!/usr/bin/env python3
"""Hugging Face transformers on the GPU as the reference for kiln's CUDA LLM
engines (tests/gpu/llm_gpu_check.sh runs it on the lent GPU machine).

    hf_reference.py refs --data tests/data/llm --out DIR [--device cuda]
    hf_reference.py compare --refs DIR --family F --dtype f32|bf16 --kiln KILN --engine E
                            --rows ROWS.tsv [--run-prompts N]
    hf_reference.py peer --ckpt DIR [--prompt-len 128] [--gen-len 256] [--compile]

refs: for every tiny checkpoint of tests/data/llm (an HF folder with
config.json), loaded as a user loads it — from_pretrained(dir, dtype=f32 or
bf16), then moved to the GPU — and each prompt of its refs.json (ids made by
the HF tokenizer): 32 greedy tokens (argmax of a full forward of the
sequence so far, no KV cache, no generation_config), HF's top 5 at every
step, and the logits at every position of prompt + greedy tokens from one
forward pass. Writes per family and dtype: F-D.ids (one sequence per line,
the input of `kiln perplexity --ids`), F-D.hf.f32 (the logits, rows of
vocab_size little-endian f32, the layout of `kiln perplexity --logits`) and
F-D.json (prompts, greedy tokens, top 5s).

compare: runs `kiln perplexity E F-D.ids --ids --logits` (teacher forcing
through kiln_llm_score) and `kiln run --temperature 0 --ignore-eos --json`
on the first N prompts (generation), and judges them as issue 8 says:
  f32:  logits within 1e-4 relative (norm of the difference over norm of
        HF's, per prompt, over every position), greedy identical;
  bf16: logits within 2e-2 relative; greedy identical, or at the first
        divergence each side's token within the other's top 5.
Teacher forcing along HF's greedy sequence decides the greedy check
exactly: up to the first divergence both sides saw the same tokens, so
kiln's argmax there is the token its own greedy run would pick. The kiln
run check compares the tokens generate() produced with HF's the same way
(kiln's top 5 at a divergence from its teacher-forced logits). Appends one
row per check to ROWS.tsv ("name<TAB>result") and prints details.

peer: HF transformers' own decode speed on a checkpoint (bf16 on the GPU,
batch 1, random prompt ids with a fixed seed, greedy, EOS ignored): eager
by default, or with a static cache and torch.compile (--compile). Prints one
JSON line: mode, prefill_tok_s, decode_tok_s.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

NEW_TOKENS = 32
DTYPES = {"f32": "float32", "bf16": "bfloat16"}


def families(data):
    return sorted(d for d in os.listdir(data)
                  if os.path.isfile(os.path.join(data, d, "config.json"))
                  and os.path.isfile(os.path.join(data, d, "refs.json")))


def load(path, dtype, device):
    import torch
    from transformers import AutoModelForCausalLM
    dt = getattr(torch, DTYPES[dtype])
    try:
        m = AutoModelForCausalLM.from_pretrained(path, dtype=dt)
    except TypeError:  # transformers 4.x spells it torch_dtype
        m = AutoModelForCausalLM.from_pretrained(path, torch_dtype=dt)
    m = m.to(device).eval()
    assert next(m.parameters()).dtype == dt
    return m


# ---- refs -------------------------------------------------------------------------------

def cmd_refs(a):
    import numpy as np
    import torch
    import transformers
    os.makedirs(a.out, exist_ok=True)
    for fam in families(a.data):
        prompts = json.load(open(os.path.join(a.data, fam, "refs.json")))["prompts"]
        for dtype in DTYPES:
            t0 = time.time()
            model = load(os.path.join(a.data, fam), dtype, a.device)
            out, rows, lines = [], [], []
            with torch.no_grad():
                for p in prompts:
                    seq = list(p["ids"])
                    top5 = []
                    for _ in range(NEW_TOKENS):
                        lg = model(torch.tensor([seq], device=a.device), use_cache=False).logits[0, -1].float()
                        top5.append(torch.topk(lg, 5).indices.tolist())
                        seq.append(int(torch.argmax(lg)))
                    full = model(torch.tensor([seq], device=a.device), use_cache=False).logits[0].float()
                    rows.append(full.cpu().numpy().astype("<f4"))
                    out.append({"text": p["text"], "ids": p["ids"], "greedy": seq[len(p["ids"]):], "top5": top5})
                    lines.append(" ".join(str(i) for i in seq))
            base = os.path.join(a.out, "%s-%s" % (fam, dtype))
            np.concatenate(rows).tofile(base + ".hf.f32")
            with open(base + ".ids", "w") as f:
                f.write("\n".join(lines) + "\n")
            with open(base + ".json", "w") as f:
                json.dump({"family": fam, "dtype": dtype, "vocab": int(rows[0].shape[1]), "prompts": out,
                           "torch": torch.__version__, "transformers": transformers.__version__,
                           "device": str(a.device)}, f)
            print("refs %s %s: %d prompts in %.1f s" % (fam, dtype, len(out), time.time() - t0), flush=True)
            del model
            if a.device.startswith("cuda"):
                torch.cuda.empty_cache()


# ---- compare ------------------------------------------------------------------------------

def top5_of(row):
    import numpy as np
    idx = np.argpartition(-row, 5)[:5]
    return [int(i) for i in idx[np.argsort(-row[idx], kind="stable")]]


def judge_greedy(ref_tokens, ref_top5, got_tokens, got_top5_at, strict):
    """(ok, note) for a greedy run against HF's: identical, or (not strict)
    at the first divergence each side's token in the other's top 5."""
    for k, (want, got) in enumerate(zip(ref_tokens, got_tokens)):
        if want == got:
            continue
        if strict:
            return False, "differs at step %d (%d, HF %d)" % (k, got, want)
        mine = got_top5_at(k)
        ok = got in ref_top5[k] and want in mine
        return ok, "first divergence at step %d: kiln %d %s HF's top 5, HF %d %s kiln's" % (
            k, got, "in" if got in ref_top5[k] else "NOT in", want, "in" if want in mine else "NOT in")
    if len(got_tokens) < len(ref_tokens):
        return False, "%d tokens, expected %d" % (len(got_tokens), len(ref_tokens))
    return True, "identical"


def cmd_compare(a):
    import numpy as np
    base = os.path.join(a.refs, "%s-%s" % (a.family, a.dtype))
    ref = json.load(open(base + ".json"))
    V = ref["vocab"]
    hf = np.fromfile(base + ".hf.f32", dtype="<f4").reshape(-1, V)
    tol = 1e-4 if a.dtype == "f32" else 2e-2
    strict = a.dtype == "f32"
    name = "llm %s %s" % (a.family, a.dtype)
    rows = []
    kl = base + ".kiln.f32"
    cmd = [a.kiln, "perplexity", a.engine, base + ".ids", "--ids", "--logits", kl, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        rows.append((name + ": logits", "FAIL (kiln perplexity: %s)" % r.stderr.strip()[-200:]))
        rows.append((name + ": greedy", "FAIL (no logits)"))
    else:
        kiln = np.fromfile(kl, dtype="<f4").reshape(-1, V)
        at, worst, bad_greedy, notes = 0, 0.0, 0, []
        for i, p in enumerate(ref["prompts"]):
            n = len(p["ids"]) + len(p["greedy"])
            k, h = kiln[at:at + n].astype(np.float64), hf[at:at + n].astype(np.float64)
            err = float(np.linalg.norm(k - h) / np.linalg.norm(h))
            worst = max(worst, err)
            np_ = len(p["ids"])
            # kiln's teacher-forced argmax along HF's greedy sequence
            mine = [int(np.argmax(kiln[at + np_ - 1 + s])) for s in range(len(p["greedy"]))]
            ok, note = judge_greedy(p["greedy"], p["top5"], mine, lambda s: top5_of(kiln[at + np_ - 1 + s]), strict)
            if not ok:
                bad_greedy += 1
            notes.append("prompt %d: logits rel %.2e; teacher-forced greedy %s" % (i, err, note))
            at += n
        print("\n".join("%s: %s" % (name, x) for x in notes))
        rows.append((name + ": logits", "%s (worst rel %.2e, tol %.0e, 8 prompts)"
                     % ("pass" if worst <= tol else "FAIL", worst, tol)))
        rows.append((name + ": greedy (teacher-forced)", "%s (%d/%d prompts)"
                     % ("pass" if bad_greedy == 0 else "FAIL", len(ref["prompts"]) - bad_greedy, len(ref["prompts"]))))
        # generation: kiln run, greedy, EOS ignored
        bad, done = 0, 0
        at = 0
        for i, p in enumerate(ref["prompts"]):
            n = len(p["ids"]) + len(p["greedy"])
            if i < a.run_prompts:
                r = subprocess.run([a.kiln, "run", a.engine, "-p", p["text"], "-n", str(NEW_TOKENS),
                                    "--temperature", "0", "--ignore-eos", "--json"], capture_output=True, text=True)
                done += 1
                if r.returncode != 0:
                    bad += 1
                    print("%s: prompt %d: kiln run failed: %s" % (name, i, r.stderr.strip()[-300:]))
                else:
                    o = json.loads(r.stdout)
                    np_, start = len(p["ids"]), at
                    if o["prompt_ids"] != p["ids"]:
                        bad += 1
                        print("%s: prompt %d: kiln's prompt ids %s differ from HF's %s" % (name, i, o["prompt_ids"], p["ids"]))
                    else:
                        ok, note = judge_greedy(p["greedy"], p["top5"], o["generated_ids"],
                                                lambda s: top5_of(kiln[start + np_ - 1 + s]), strict)
                        bad += not ok
                        print("%s: prompt %d: kiln run greedy %s" % (name, i, note))
            at += n
        if done:
            rows.append((name + ": greedy (kiln run)", "%s (%d/%d prompts)" % ("pass" if bad == 0 else "FAIL",
                                                                              done - bad, done)))
    with open(a.rows, "a") as f:
        for n_, res in rows:
            f.write("%s\t%s\n" % (n_, res))
    for n_, res in rows:
        print("%-44s %s" % (n_, res))


# ---- peer ----------------------------------------------------------------------------------

def cmd_peer(a):
    import torch
    dev = "cuda"
    t0 = time.time()
    model = load(a.ckpt, "bf16", dev)
    t_load = time.time() - t0
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, model.config.vocab_size, (1, a.prompt_len), generator=g).to(dev)
    mode = "eager, dynamic cache"
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0, temperature=None, top_p=None, top_k=None)
    if a.compile:
        model.generation_config.cache_implementation = "static"
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        mode = "static cache + torch.compile(reduce-overhead)"

    def gen(n):
        torch.cuda.synchronize()
        t = time.time()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        assert out.shape[1] == a.prompt_len + n
        return time.time() - t

    with torch.no_grad():
        t_warm = time.time()
        gen(a.gen_len)  # warm-up (and compilation)
        t_warm = time.time() - t_warm
        t_pre = sorted(gen(1) for _ in range(3))[1]
        t_all = sorted(gen(a.gen_len) for _ in range(a.reps))[a.reps // 2]
    print(json.dumps({"mode": mode, "load_s": t_load, "warmup_s": t_warm, "prompt_len": a.prompt_len,
                      "gen_len": a.gen_len, "prefill_tok_s": a.prompt_len / t_pre,
                      "decode_tok_s": (a.gen_len - 1) / max(t_all - t_pre, 1e-9)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("refs")
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p = sub.add_parser("compare")
    for k in ["--refs", "--family", "--kiln", "--engine", "--rows"]:
        p.add_argument(k, required=True)
    p.add_argument("--dtype", choices=sorted(DTYPES), required=True)
    p.add_argument("--run-prompts", type=int, default=8)
    p = sub.add_parser("peer")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=256)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    {"refs": cmd_refs, "compare": cmd_compare, "peer": cmd_peer}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
