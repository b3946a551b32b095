#!/usr/bin/env python3
"""Writes the tiny checkpoints of make_checkpoints.py in the other formats
kiln imports, the way their own converters do, for the cross-format tests:

- GGUF (gguf package), as llama.cpp's convert_hf_to_gguf.py writes it:
  "llama" architecture with the rows of Q and K permuted for adjacent-pair
  rotation, "qwen2" unpermuted; 1-D tensors stay F32; vocabulary in
  tokenizer.ggml.* from tokenizer.json.
    llama/model-f32.gguf     (untied, pre "gpt-2")
    smollm/model-f16.gguf    (tied, pre "smollm")
    smollm/model-q8_0.gguf
    qwen2/model-q8_0.gguf    (q/k/v biases, pre "qwen2")
    llama3/model-f16.gguf    (Llama 3.1 RoPE scaling as rope_freqs.weight)
- llama2.c (legacy format of its export.py, HF weights permuted as its
  permute_reverse does) with tokenizer.bin as its tokenizer.py writes it:
    tinyllama/model.bin, tinyllama/tokenizer.bin

    .venv/bin/python tests/data/llm/make_gguf.py [DATA_DIR]
"""
import json
import math
import os
import struct
import sys

import gguf
import numpy as np
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = sys.argv[1] if len(sys.argv) > 1 else HERE


def load_weights(d):
    """All tensors of a family as f32 (bf16 files are decoded by hand:
    safetensors.numpy cannot read BF16)."""
    w = {}
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    for f in files:
        path = os.path.join(d, f)
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
            base = 8 + n
            raw = fh.read()
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            buf = raw[a:b]
            if info["dtype"] == "BF16":
                u = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
                w[name] = u.view(np.float32).reshape(info["shape"])
            else:
                w[name] = np.frombuffer(buf, dtype=np.float32).reshape(info["shape"]).copy()
        del base
    return w


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute (= llama2.c's
    permute_reverse): HF's rotate-half row order to adjacent pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def vocab(d):
    """Tokens in id order, their GGUF types, merges and the special ids, from
    tokenizer.json (what llama.cpp's converter reads through transformers)."""
    tj = json.load(open(os.path.join(d, "tokenizer.json")))
    v = dict(tj["model"]["vocab"])
    added = {t["content"]: t for t in tj["added_tokens"]}
    for t in tj["added_tokens"]:
        v[t["content"]] = t["id"]
    n = max(v.values()) + 1
    tokens, types = [""] * n, [1] * n
    for s, i in v.items():
        tokens[i] = s
        if s in added:
            types[i] = 3 if added[s]["special"] else 4
        elif len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
            types[i] = 6
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    return tokens, types, merges


def spm_scores(tokens, merges):
    """Scores for an SPM vocabulary from BPE merges: a merged token scores
    -(its merge rank), so merging by score is merging by rank; others 0."""
    rank = {}
    for i, m in enumerate(merges):
        rank.setdefault(m.replace(" ", ""), i)
    return [-float(rank[t]) if t in rank else 0.0 for t in tokens]


def hf_config(d):
    """config.json as published (rope_theta / rope_scaling, head_dim often
    absent) or as transformers 5 writes it (rope_parameters): both as the
    latter."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    cfg["rope_parameters"] = rope
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return cfg


def write_gguf(name, out, qtype, pre):
    d = os.path.join(DATA, name)
    cfg = hf_config(d)
    tcfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
    w = load_weights(d)
    arch = "qwen2" if cfg["model_type"] == "qwen2" else "llama"
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    wr = gguf.GGUFWriter(os.path.join(d, out), arch)
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(nh)
    wr.add_head_count_kv(nkv)
    wr.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_rope_dimension_count(hd)
    wr.add_vocab_size(cfg["vocab_size"])
    wr.add_file_type({gguf.GGMLQuantizationType.F32: 0, gguf.GGMLQuantizationType.F16: 1,
                      gguf.GGMLQuantizationType.Q8_0: 7}[qtype])
    tokens, types, merges = vocab(d)
    # llama.cpp pads the vocabulary to vocab_size with unused tokens
    while len(tokens) < cfg["vocab_size"]:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(5)
    spm = "<0x41>" in tokens
    wr.add_tokenizer_model("llama" if spm else "gpt2")
    if not spm:
        wr.add_tokenizer_pre(pre)
    wr.add_token_list(tokens)
    wr.add_token_types(types)
    if spm:
        wr.add_token_scores(spm_scores(tokens, merges))
    else:
        wr.add_token_merges(merges)
    if tcfg.get("bos_token"):
        wr.add_bos_token_id(tokens.index(tcfg["bos_token"]))
    wr.add_eos_token_id(tokens.index(tcfg["eos_token"]))
    # BOS is added when the tokenizer's post-processor adds it (a template)
    post = json.load(open(os.path.join(d, "tokenizer.json")))["post_processor"]
    wr.add_add_bos_token(post["type"] == "TemplateProcessing")
    if tcfg.get("chat_template"):
        wr.add_chat_template(tcfg["chat_template"])

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
                 "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.weight": "attn_output.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                 "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for hf in sorted(w):
        a = w[hf]
        if hf.startswith("model.layers."):
            l, rest = hf[len("model.layers."):].split(".", 1)
            gn = f"blk.{l}.{per_layer[rest]}"
        else:
            gn = names[hf]
        if arch == "llama" and hf.endswith("q_proj.weight"):
            a = permute(a, nh)
        elif arch == "llama" and hf.endswith("k_proj.weight"):
            a = permute(a, nkv)
        if a.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            wr.add_tensor(gn, a.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            wr.add_tensor(gn, a.astype(np.float16))
        else:
            q = gguf.quants.quantize(a.astype(np.float32), qtype)
            wr.add_tensor(gn, q, raw_shape=q.shape, raw_dtype=qtype)
    rs = cfg.get("rope_parameters") or {}
    if rs.get("rope_type") == "llama3":
        # convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: Llama 3.1
        # scaling as one factor per frequency
        base, factor = rs["rope_theta"], rs["factor"]
        lo, hi, old = rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        freqs = 1.0 / (base ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
        factors = []
        for fr in freqs:
            wavelen = 2 * math.pi / fr
            if wavelen < old / hi:
                factors.append(1)
            elif wavelen > old / lo:
                factors.append(factor)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        wr.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    print("wrote", os.path.join(d, out))


def write_llama2c(name):
    d = os.path.join(DATA, name)
    cfg = hf_config(d)
    w = load_weights(d)
    L, nh, nkv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    dim, hid, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = dim // nh
    assert hd == cfg["head_dim"] and cfg["rms_norm_eps"] == 1e-5
    assert cfg["rope_parameters"]["rope_theta"] == 10000.0
    seq_len = cfg["max_position_embeddings"]
    shared = cfg["tie_word_embeddings"]
    lw = lambda k: [w[f"model.layers.{l}.{k}"] for l in range(L)]  # noqa: E731
    with open(os.path.join(d, "model.bin"), "wb") as f:
        f.write(struct.pack("7i", dim, hid, L, nh, nkv, V if shared else -V, seq_len))
        blocks = [[w["model.embed_tokens.weight"]], lw("input_layernorm.weight"),
                  [permute(a, nh) for a in lw("self_attn.q_proj.weight")],
                  [permute(a, nkv) for a in lw("self_attn.k_proj.weight")],
                  lw("self_attn.v_proj.weight"), lw("self_attn.o_proj.weight"),
                  lw("post_attention_layernorm.weight"), lw("mlp.gate_proj.weight"), lw("mlp.down_proj.weight"),
                  lw("mlp.up_proj.weight"), [w["model.norm.weight"]]]
        for b in blocks:
            for a in b:
                f.write(a.astype(np.float32).tobytes())
        # freq_cis_real / imag as llama2.c's export writes them (unused by run.c)
        freqs = 1.0 / (10000.0 ** (np.arange(0, hd, 2)[: hd // 2].astype(np.float32) / hd))
        ang = np.outer(np.arange(seq_len, dtype=np.float32), freqs)
        f.write(np.cos(ang).astype(np.float32).tobytes())
        f.write(np.sin(ang).astype(np.float32).tobytes())
        if not shared:
            f.write(w["lm_head.weight"].astype(np.float32).tobytes())
    # tokenizer.bin as llama2.c's tokenizer.py exports a sentencepiece model:
    # "▁" becomes " ", BOS/EOS are "\n<s>\n" and "\n</s>\n"
    tokens, _, merges = vocab(d)
    scores = spm_scores(tokens, merges)
    data = []
    for t, s in zip(tokens, scores):
        if t == "<s>":
            t = "\n<s>\n"
        elif t == "</s>":
            t = "\n</s>\n"
        data.append((t.replace("▁", " ").encode("utf-8"), s))
    with open(os.path.join(d, "tokenizer.bin"), "wb") as f:
        f.write(struct.pack("I", max(len(b) for b, _ in data)))
        for b, s in data:
            f.write(struct.pack("fI", s, len(b)))
            f.write(b)
    print("wrote", os.path.join(d, "model.bin"), "and tokenizer.bin")


def main():
    Q = gguf.GGMLQuantizationType
    write_gguf("llama", "model-f32.gguf", Q.F32, "gpt-2")
    write_gguf("smollm", "model-f16.gguf", Q.F16, "smollm")
    write_gguf("smollm", "model-q8_0.gguf", Q.Q8_0, "smollm")
    write_gguf("qwen2", "model-q8_0.gguf", Q.Q8_0, "qwen2")
    write_gguf("llama3", "model-f16.gguf", Q.F16, "gpt-2")
    write_llama2c("tinyllama")


if __name__ == "__main__":
    main()
