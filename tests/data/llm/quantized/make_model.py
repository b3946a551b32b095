#!/usr/bin/env python3
"""A tiny llama-shaped model that llama.cpp itself quantized to Q4_K_M,
Q5_K_M and Q5_1, and llama.cpp's greedy continuations of each, for
tests/e2e/llamacpp_quantized.sh and test_gguf.c. Run with the reference
venv (llama-cpp-python pinned as in ../smollm2/make_reference.py, plus
gguf, numpy and safetensors):

    .venv-ref/bin/python tests/data/llm/quantized/make_model.py

1. An F16 GGUF (not kept): random weights in a shape every K format can
   hold (each matmul's input a multiple of 256: hidden 256, intermediate
   512; 2 layers, 4 heads of 64, 2 KV heads; F32 norms), the tiny smollm
   vocabulary (tests/data/llm/smollm), written with the gguf package the
   way make_gguf.py writes its GGUFs. The output projection is large
   enough that the top logits stand apart (greedy decisions are not near
   ties).
2. model-q4_k_m.gguf, model-q5_k_m.gguf, model-q5_1.gguf:
   llama_model_quantize of it to those file types: llama.cpp's own mixes
   (Q4_K and Q6_K; Q5_K and Q6_K; Q5_1 and Q6_K).
3. refs.json: per file, make_reference.py's greedy runs (its prompts, 48
   tokens, top-2 logit gaps) on the file as stored and on llama.cpp's own
   F32 dequantization of it, and the type of every tensor.
4. <file>.<tensor>.npy for the first Q4_K, Q5_K, Q6_K and Q5_1 tensor met:
   the gguf package's dequantize of it (test_gguf.c compares kiln's bit for
   bit).
"""
import json
import os
import sys
import tempfile

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
LLM = os.path.dirname(HERE)
sys.path.insert(0, LLM)
sys.path.insert(0, os.path.join(LLM, "smollm2"))
import make_gguf  # noqa: E402  (vocab)
import make_reference as ref  # noqa: E402  (llama.cpp runs)
import llama_cpp  # noqa: E402

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB, CTX = 256, 512, 2, 4, 2, 320, 256

# This VM's CPU lists AMX, but the kernel does not grant the tile state:
# llama.cpp's AMX weight buffers (an "extra buffer type") then die on their
# first tile instruction. Without extra buffers llama.cpp runs its own
# AVX-512 VNNI dot products on the blocks as stored.
_default_model_params = llama_cpp.llama_cpp.llama_model_default_params


def _model_params_without_extra_buffers():
    p = _default_model_params()
    p.use_extra_bufts = False
    return p


llama_cpp.llama_cpp.llama_model_default_params = _model_params_without_extra_buffers

# An f32 KV cache (llama.cpp's default is f16), as kiln's f32 and native
# engines keep on the CPU: the two then differ only in their roundings of
# the same arithmetic.
_default_context_params = llama_cpp.llama_cpp.llama_context_default_params


def _context_params_f32_cache():
    p = _default_context_params()
    p.type_k = p.type_v = llama_cpp.GGML_TYPE_F32
    return p


llama_cpp.llama_cpp.llama_context_default_params = _context_params_f32_cache


def write_f16(path):
    rng = np.random.default_rng(20261201)
    d = os.path.join(LLM, "smollm")
    tcfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
    tokens, types, merges = make_gguf.vocab(d)
    while len(tokens) < VOCAB:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(5)
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_vocab_size(VOCAB)
    w.add_file_type(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index(tcfg["bos_token"]))
    w.add_eos_token_id(tokens.index(tcfg["eos_token"]))
    w.add_add_bos_token(False)

    def mat(rows, cols, std):
        return rng.normal(0.0, std, size=(rows, cols)).astype(np.float16)

    kv = HIDDEN // HEADS * KV_HEADS
    w.add_tensor("token_embd.weight", mat(VOCAB, HIDDEN, 1.0))
    for l in range(LAYERS):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", mat(HIDDEN, HIDDEN, HIDDEN ** -0.5))
        w.add_tensor(p + "attn_k.weight", mat(kv, HIDDEN, HIDDEN ** -0.5))
        w.add_tensor(p + "attn_v.weight", mat(kv, HIDDEN, HIDDEN ** -0.5))
        w.add_tensor(p + "attn_output.weight", mat(HIDDEN, HIDDEN, HIDDEN ** -0.5))
        w.add_tensor(p + "ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(FFN, HIDDEN, HIDDEN ** -0.5))
        w.add_tensor(p + "ffn_up.weight", mat(FFN, HIDDEN, HIDDEN ** -0.5))
        w.add_tensor(p + "ffn_down.weight", mat(HIDDEN, FFN, FFN ** -0.5))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output.weight", mat(VOCAB, HIDDEN, 0.5))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# llama.cpp's file types: Q4_K_M mixes Q4_K and Q6_K; Q5_K_M Q5_K and Q6_K;
# Q5_1 keeps Q6_K for the output projection.
FTYPES = [("q4_k_m", "LLAMA_FTYPE_MOSTLY_Q4_K_M"), ("q5_k_m", "LLAMA_FTYPE_MOSTLY_Q5_K_M"),
          ("q5_1", "LLAMA_FTYPE_MOSTLY_Q5_1")]
SAVED_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q5_1")


def quantize(src, dst, ftype):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, ftype)
    p.nthread = 2
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), p) != 0:
        sys.exit("llama_model_quantize to %s failed" % ftype)


def main():
    if llama_cpp.__version__ != ref.PIN:
        sys.exit("llama-cpp-python %s is installed; the references are made with %s" % (llama_cpp.__version__, ref.PIN))
    files, saved = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        f16 = os.path.join(tmp, "f16.gguf")
        write_f16(f16)
        for name, ftype in FTYPES:
            out = os.path.join(HERE, "model-%s.gguf" % name)
            quantize(f16, out, ftype)
            f32 = os.path.join(tmp, "f32.gguf")
            ref.dequantize_f32(out, f32)
            ref_f32 = ref.run(f32)
            reader = gguf.GGUFReader(out)
            types = {t.name: t.tensor_type.name for t in reader.tensors}
            for t in reader.tensors:
                kind = t.tensor_type.name
                if kind in SAVED_TYPES and kind not in saved.values():
                    deq = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
                    npy = "%s.%s.npy" % (name, t.name)
                    np.save(os.path.join(HERE, npy), deq.reshape(int(t.shape[1]), int(t.shape[0])))
                    saved[npy] = kind
            prompts = []
            for text, (ids, gen, gaps, _), (ids32, gen32, gaps32, _) in zip(ref.PROMPTS, ref.run(out), ref_f32):
                if ids32 != ids:
                    sys.exit("the F32 copy tokenizes %r differently" % text)
                prompts.append({"text": text, "prompt_ids": ids, "generated_ids": gen, "top2_logit_gaps": gaps,
                                "generated_ids_f32": gen32, "top2_logit_gaps_f32": gaps32})
                print("%s %r:\n  as stored %s\n  F32 %s\n  gaps %s" % (name, text, gen, gen32, gaps))
            files[os.path.basename(out)] = {"sha256": ref.sha256(out), "tensor_types": types, "prompts": prompts}
    if sorted(saved.values()) != sorted(SAVED_TYPES):
        sys.exit("not every type of %r was found: %r" % (SAVED_TYPES, saved))
    doc = {"llama_cpp_python": llama_cpp.__version__, "dequantized": saved, "files": files}
    with open(os.path.join(HERE, "refs.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
