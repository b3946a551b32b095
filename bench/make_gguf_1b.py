"""Writes a Llama GGUF of a 1B shape with random weights in llama.cpp's
Q4_K_M mix, for bench/llm_cpu.sh: only the speed of a model of that size is
measured, so the weights need only be valid blocks of small values.

Shape (Llama 3.2 1B's layers with SmolLM2's tokenizer, which the GGUF takes
from TOKENIZER_GGUF so that kiln and llama.cpp both read it): hidden 2048,
16 layers, 32 heads of 64, 8 kv heads, intermediate 8192, vocab 49152,
untied output; 1.17 billion parameters.

Q4_K_M as llama.cpp's quantize assigns it: every matrix Q4_K except
output.weight, and attn_v / ffn_down of the layers llama.cpp gives more
bits (the first and last eighth, and every third one between), which are
Q6_K; the norms F32. Blocks are random bytes (quants, packed 6-bit scales)
with their f16 super-block scales set so weights stay small: the
bytes are the formats' as ggml defines them, read by both engines as
stored.

usage: make_gguf_1b.py TOKENIZER_GGUF OUT_GGUF   (needs numpy and gguf)
"""
import sys

import numpy as np
import gguf

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 2048, 16, 32, 8, 64, 8192

Q4_K, Q6_K = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
# bytes per 256-value block, and where its f16 scales start (and how many)
BLOCK = {Q4_K: (144, 0, 2), Q6_K: (210, 208, 1)}


def more_bits(i, n):
    # llama.cpp's use_more_bits(i_layer, n_layers)
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def random_blocks(rng, qtype, rows, cols):
    nbytes, scale_at, n_scales = BLOCK[qtype]
    blocks = rows * cols // 256
    b = rng.integers(0, 256, size=(blocks, nbytes), dtype=np.uint8)
    scales = rng.uniform(1e-5, 1e-4, size=(blocks, n_scales)).astype(np.float16)
    b[:, scale_at:scale_at + 2 * n_scales] = scales.view(np.uint8).reshape(blocks, 2 * n_scales)
    return b.reshape(rows, cols // 256 * nbytes)


def copy_tokenizer(src, w):
    r = gguf.GGUFReader(src)
    f = r.fields
    w.add_tokenizer_model(f["tokenizer.ggml.model"].contents())
    if "tokenizer.ggml.pre" in f:
        w.add_tokenizer_pre(f["tokenizer.ggml.pre"].contents())
    tokens = f["tokenizer.ggml.tokens"].contents()
    w.add_token_list(tokens)
    w.add_token_types(f["tokenizer.ggml.token_type"].contents())
    w.add_token_merges(f["tokenizer.ggml.merges"].contents())
    w.add_bos_token_id(f["tokenizer.ggml.bos_token_id"].contents())
    w.add_eos_token_id(f["tokenizer.ggml.eos_token_id"].contents())
    if "tokenizer.chat_template" in f:
        w.add_chat_template(f["tokenizer.chat_template"].contents())
    return len(tokens)


def main():
    src, out = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(1234)
    w = gguf.GGUFWriter(out, "llama")
    vocab = copy_tokenizer(src, w)
    w.add_name("random-1b-q4_k_m")
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)

    def mat(name, qtype, rows, cols):
        w.add_tensor(name, random_blocks(rng, qtype, rows, cols), raw_dtype=qtype)

    def norm(name):
        w.add_tensor(name, rng.uniform(0.9, 1.1, size=HIDDEN).astype(np.float32))

    mat("token_embd.weight", Q4_K, vocab, HIDDEN)
    for i in range(LAYERS):
        p = "blk.%d." % i
        norm(p + "attn_norm.weight")
        mat(p + "attn_q.weight", Q4_K, HEADS * HEAD_DIM, HIDDEN)
        mat(p + "attn_k.weight", Q4_K, KV_HEADS * HEAD_DIM, HIDDEN)
        mat(p + "attn_v.weight", Q6_K if more_bits(i, LAYERS) else Q4_K, KV_HEADS * HEAD_DIM, HIDDEN)
        mat(p + "attn_output.weight", Q4_K, HIDDEN, HEADS * HEAD_DIM)
        norm(p + "ffn_norm.weight")
        mat(p + "ffn_gate.weight", Q4_K, FFN, HIDDEN)
        mat(p + "ffn_up.weight", Q4_K, FFN, HIDDEN)
        mat(p + "ffn_down.weight", Q6_K if more_bits(i, LAYERS) else Q4_K, HIDDEN, FFN)
    norm("output_norm.weight")
    mat("output.weight", Q6_K, vocab, HIDDEN)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
