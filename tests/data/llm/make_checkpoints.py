#!/usr/bin/env python3
"""Writes tiny random-weight Hugging Face checkpoints of each Llama-family
flavour kiln supports, for the importer and logits tests.

Needs numpy, safetensors, tokenizers and transformers (PyTorch is not
needed). Deterministic: rerunning it rewrites identical files.

    .venv/bin/python tests/data/llm/make_checkpoints.py [OUT_DIR]

Each family directory holds config.json, model.safetensors (or shards +
model.safetensors.index.json), tokenizer.json, tokenizer_config.json and
generation_config.json. The JSON files carry the keys and values of the
model each family stands for, as published (see write_json_files): llama3
Llama 3.1 8B Instruct, mistral Mistral 7B Instruct v0.2, qwen2 Qwen2.5 7B
Instruct, smollm SmolLM2 135M Instruct, tinyllama TinyLlama 1.1B Chat
(Llama 2's layout); llama is saved by transformers itself. Shapes: hidden 64, 2 layers, 4 heads / 2 kv heads
(GQA), head_dim 16, intermediate 96, vocab 320.
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else HERE

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 64, 2, 4, 2, 16, 96, 320

# Training text for the tiny tokenizers: fixed, mixed-case, digits, accents,
# so the merges cover common English pieces.
TEXT = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "In 2024 the model answered 42 questions about the weather in Zürich and Montréal.",
    "def main():\n    print('hello, world')\n    return 0\n",
    "The capital of France is Paris. The capital of Japan is Tokyo.",
    "I think, therefore I am. To be or not to be, that is the question.",
] * 20

# The prompts of make_references.py; listed here too so the tokenizers are
# trained on text close to them.
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
LLAMA2 = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
          "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}"
          "{% endif %}{% endfor %}")


def byte_bpe_tokenizer(specials, bos):
    """GPT-2 style byte-level BPE (Llama 3, Qwen2, SmolLM use this kind)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXT, trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def spm_tokenizer():
    """SentencePiece-style BPE with byte fallback, laid out like Llama 2's /
    TinyLlama's tokenizer.json."""
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 4, special_tokens=specials + byte_tokens, show_progress=False)
    tok.train_from_iterator(TEXT, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return tok


FAMILIES = {
    # name: (config class, extra config, tokenizer kind, template, storage)
    "llama": dict(cls="LlamaConfig", arch="LlamaForCausalLM", tied=False, theta=10000.0, tok="byte",
                  specials=["<|begin_of_text|>", "<|end_of_text|>"], bos="<|begin_of_text|>",
                  eos="<|end_of_text|>", template=None, storage="f32"),
    "llama3": dict(cls="LlamaConfig", arch="LlamaForCausalLM", tied=False, theta=500000.0, tok="byte",
                   specials=["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                             "<|eot_id|>"],
                   bos="<|begin_of_text|>", eos="<|end_of_text|>", template=LLAMA3, storage="f32",
                   rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=8192),
                   extra_eos=["<|eot_id|>"]),
    "mistral": dict(cls="MistralConfig", arch="MistralForCausalLM", tied=False, theta=1000000.0, tok="spm",
                    bos="<s>", eos="</s>", template=LLAMA2, storage="shards"),
    "qwen2": dict(cls="Qwen2Config", arch="Qwen2ForCausalLM", tied=False, theta=1000000.0, tok="byte",
                  specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>",
                  template=CHATML, storage="bf16", bias=True),
    "smollm": dict(cls="LlamaConfig", arch="LlamaForCausalLM", tied=True, theta=100000.0, tok="byte",
                   specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>",
                   template=CHATML, storage="f32", eps=1e-5),
    "tinyllama": dict(cls="LlamaConfig", arch="LlamaForCausalLM", tied=False, theta=10000.0, tok="spm",
                      bos="<s>", eos="</s>", template=LLAMA2, storage="f32", eps=1e-5),
}


def weights(rng, fam):
    """Random weights large enough that logits are far from ties (std 0.02
    would make greedy decoding hinge on 1e-6 differences)."""
    w = {}

    def mat(o, i, scale=1.0):
        return (rng.standard_normal((o, i)) * scale / np.sqrt(i)).astype(np.float32)

    w["model.embed_tokens.weight"] = (rng.standard_normal((VOCAB, HIDDEN))).astype(np.float32)
    for l in range(LAYERS):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = (1 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32)
        w[p + "post_attention_layernorm.weight"] = (1 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32)
        w[p + "self_attn.q_proj.weight"] = mat(HEADS * HEAD_DIM, HIDDEN, 2.0)
        w[p + "self_attn.k_proj.weight"] = mat(KV_HEADS * HEAD_DIM, HIDDEN, 2.0)
        w[p + "self_attn.v_proj.weight"] = mat(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = mat(HIDDEN, HEADS * HEAD_DIM)
        if fam.get("bias"):
            w[p + "self_attn.q_proj.bias"] = (0.5 * rng.standard_normal(HEADS * HEAD_DIM)).astype(np.float32)
            w[p + "self_attn.k_proj.bias"] = (0.5 * rng.standard_normal(KV_HEADS * HEAD_DIM)).astype(np.float32)
            w[p + "self_attn.v_proj.bias"] = (0.5 * rng.standard_normal(KV_HEADS * HEAD_DIM)).astype(np.float32)
        w[p + "mlp.gate_proj.weight"] = mat(INTER, HIDDEN)
        w[p + "mlp.up_proj.weight"] = mat(INTER, HIDDEN)
        w[p + "mlp.down_proj.weight"] = mat(HIDDEN, INTER)
    w["model.norm.weight"] = (1 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32)
    if not fam["tied"]:
        w["lm_head.weight"] = mat(VOCAB, HIDDEN, 4.0)
    return w


def to_bf16(a):
    """f32 -> bf16 bits, round to nearest even (numpy has no bfloat16)."""
    u = a.astype(np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return r


def save_bf16(tensors, path):
    """safetensors.numpy cannot write BF16, so the file is written by hand
    (8-byte header length, JSON header, data), as the format specifies."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = to_bf16(tensors[name]).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def dump(d, fname, obj):
    with open(os.path.join(d, fname), "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def added_tokens_decoder(tok, names):
    """tokenizer_config.json's "added_tokens_decoder", as transformers 4 writes it."""
    return {str(tok.token_to_id(n)): {"content": n, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True} for n in names}


def write_json_files(d, name, fam, tok):
    """config.json, generation_config.json and tokenizer_config.json with
    the keys and values the model each family stands for was published
    with, shrunk to the tiny sizes. What the weights and refs.json were made
    with stays: sizes, rms_norm_eps, rope_theta and rope scaling, tied
    embeddings, and the token ids of the tiny tokenizer. "llama" is saved
    by transformers itself (config.json, generation_config.json and its
    default tokenizer_config.json, whose model_max_length is int(1e30))."""
    import transformers

    bos_id = tok.token_to_id(fam["bos"]) if fam["bos"] else None
    eos_id = tok.token_to_id(fam["eos"])
    eos_ids = [eos_id] + [tok.token_to_id(t) for t in fam.get("extra_eos", [])]
    tid = tok.token_to_id
    sizes = {"hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
             "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "max_position_embeddings": 256,
             "vocab_size": VOCAB, "rms_norm_eps": fam.get("eps", 1e-6), "tie_word_embeddings": fam["tied"]}
    if name == "llama":
        kw = dict(sizes, head_dim=HEAD_DIM, bos_token_id=bos_id, eos_token_id=eos_id, architectures=[fam["arch"]],
                  dtype="float32", rope_parameters={"rope_type": "default", "rope_theta": fam["theta"]})
        transformers.LlamaConfig(**kw).save_pretrained(d)
        # transformers 4.x reads only rope_theta / rope_scaling: write them too
        # so a reference made with either major version sees the same model.
        with open(os.path.join(d, "config.json")) as f:
            j = json.load(f)
        j["rope_theta"], j["rope_scaling"] = fam["theta"], None
        dump(d, "config.json", j)
        transformers.GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, do_sample=True, temperature=0.7,
                                      top_p=0.9).save_pretrained(d)
        hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=fam["bos"], eos_token=fam["eos"])
        hf.save_pretrained(d)
        return
    if name == "llama3":
        # Llama 3.1 8B Instruct
        config = dict(sizes, architectures=["LlamaForCausalLM"], attention_bias=False, attention_dropout=0.0,
                      bos_token_id=bos_id, eos_token_id=eos_ids, hidden_act="silu", initializer_range=0.02,
                      mlp_bias=False, model_type="llama", pretraining_tp=1, rope_scaling=dict(fam["rope_scaling"]),
                      rope_theta=fam["theta"], torch_dtype="bfloat16", transformers_version="4.42.3",
                      use_cache=True)
        gen = {"bos_token_id": bos_id, "do_sample": True, "eos_token_id": eos_ids, "temperature": 0.6,
               "top_p": 0.9, "transformers_version": "4.42.3"}
        tc = {"added_tokens_decoder": added_tokens_decoder(tok, fam["specials"]), "bos_token": fam["bos"],
              "chat_template": fam["template"], "clean_up_tokenization_spaces": True, "eos_token": "<|eot_id|>",
              "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    elif name == "mistral":
        # Mistral 7B Instruct v0.2
        config = dict(sizes, architectures=["MistralForCausalLM"], attention_dropout=0.0, bos_token_id=bos_id,
                      eos_token_id=eos_id, hidden_act="silu", initializer_range=0.02, model_type="mistral",
                      rope_theta=fam["theta"], sliding_window=None, torch_dtype="bfloat16",
                      transformers_version="4.36.0", use_cache=True)
        gen = {"_from_model_config": True, "bos_token_id": bos_id, "eos_token_id": eos_id,
               "transformers_version": "4.36.0"}
        tc = {"add_bos_token": True, "add_eos_token": False,
              "added_tokens_decoder": added_tokens_decoder(tok, ["<unk>", "<s>", "</s>"]),
              "additional_special_tokens": [], "bos_token": "<s>", "chat_template": fam["template"],
              "clean_up_tokenization_spaces": False, "eos_token": "</s>", "legacy": True,
              "model_max_length": 1000000000000000019884624838656, "pad_token": None, "sp_model_kwargs": {},
              "spaces_between_special_tokens": False, "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>",
              "use_default_system_prompt": False}
    elif name == "qwen2":
        # Qwen2.5 7B Instruct: <|endoftext|> is both bos_token_id and pad,
        # never added to a prompt
        endoftext = tid("<|endoftext|>")
        config = dict(sizes, architectures=["Qwen2ForCausalLM"], attention_dropout=0.0, bos_token_id=endoftext,
                      eos_token_id=eos_id, hidden_act="silu", initializer_range=0.02, max_window_layers=28,
                      model_type="qwen2", rope_scaling=None, rope_theta=fam["theta"], sliding_window=131072,
                      torch_dtype="bfloat16", transformers_version="4.43.1", use_cache=True,
                      use_sliding_window=False)
        gen = {"bos_token_id": endoftext, "do_sample": True, "eos_token_id": [eos_id, endoftext],
               "pad_token_id": endoftext, "repetition_penalty": 1.05, "temperature": 0.7, "top_k": 20,
               "top_p": 0.8, "transformers_version": "4.37.0"}
        tc = {"add_bos_token": False, "add_prefix_space": False,
              "added_tokens_decoder": added_tokens_decoder(tok, fam["specials"]),
              "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
              "chat_template": fam["template"], "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
              "errors": "replace", "model_max_length": 131072, "pad_token": "<|endoftext|>",
              "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    elif name == "smollm":
        # SmolLM2 135M Instruct: bos_token_id names <|im_start|>, which no
        # prompt gets added
        im_start = tid("<|im_start|>")
        config = dict(sizes, architectures=["LlamaForCausalLM"], attention_bias=False, attention_dropout=0.0,
                      bos_token_id=im_start, eos_token_id=eos_id, head_dim=HEAD_DIM, hidden_act="silu",
                      initializer_range=0.041666666666666664, is_llama_config=True, mlp_bias=False,
                      model_type="llama", pad_token_id=eos_id, pretraining_tp=1, rope_interleaved=False,
                      rope_scaling=None, rope_theta=fam["theta"], torch_dtype="bfloat16",
                      transformers_version="4.42.3", use_cache=True,
                      **{"transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}}})
        gen = {"_from_model_config": True, "bos_token_id": im_start, "eos_token_id": eos_id, "pad_token_id": eos_id,
               "transformers_version": "4.42.3"}
        tc = {"add_prefix_space": False, "added_tokens_decoder": added_tokens_decoder(tok, fam["specials"]),
              "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": "<|im_start|>",
              "chat_template": fam["template"], "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
              "model_max_length": 8192, "pad_token": "<|im_end|>", "tokenizer_class": "GPT2Tokenizer",
              "unk_token": "<|endoftext|>", "vocab_size": VOCAB}
    else:
        # TinyLlama 1.1B Chat v1.0 (Llama 2's layout and tokenizer); its
        # Zephyr-style chat template is swapped for Llama 2's
        config = dict(sizes, architectures=["LlamaForCausalLM"], attention_bias=False, bos_token_id=bos_id,
                      eos_token_id=eos_id, hidden_act="silu", initializer_range=0.02, model_type="llama",
                      pretraining_tp=1, rope_scaling=None, rope_theta=fam["theta"], torch_dtype="bfloat16",
                      transformers_version="4.35.0", use_cache=True)
        gen = {"bos_token_id": bos_id, "eos_token_id": eos_id, "max_length": 2048, "pad_token_id": tid("<unk>"),
               "transformers_version": "4.35.0"}
        tc = {"add_bos_token": True, "add_eos_token": False,
              "added_tokens_decoder": added_tokens_decoder(tok, ["<unk>", "<s>", "</s>"]), "bos_token": "<s>",
              "chat_template": fam["template"], "clean_up_tokenization_spaces": False, "eos_token": "</s>",
              "legacy": False, "model_max_length": 2048, "pad_token": "</s>", "padding_side": "right",
              "sp_model_kwargs": {}, "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>",
              "use_default_system_prompt": False}
    dump(d, "config.json", config)
    dump(d, "generation_config.json", gen)
    dump(d, "tokenizer_config.json", tc)


def write_family(name, fam, seed):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tok = spm_tokenizer() if fam["tok"] == "spm" else byte_bpe_tokenizer(fam["specials"], fam["bos"])
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    tok.save(os.path.join(d, "tokenizer.json"))
    write_json_files(d, name, fam, tok)

    w = weights(np.random.default_rng(seed), fam)
    for f_ in ("model.safetensors", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors"):
        if os.path.exists(os.path.join(d, f_)):
            os.remove(os.path.join(d, f_))
    if fam["storage"] == "f32":
        save_file(w, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    elif fam["storage"] == "bf16":
        save_bf16(w, os.path.join(d, "model.safetensors"))
    else:
        names = sorted(w)
        half = [names[: len(names) // 2], names[len(names) // 2:]]
        wm = {}
        for i, part in enumerate(half):
            fn = f"model-{i + 1:05d}-of-00002.safetensors"
            save_file({n: w[n] for n in part}, os.path.join(d, fn), metadata={"format": "pt"})
            wm.update({n: fn for n in part})
        total = sum(a.nbytes for a in w.values())
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)


def main():
    for i, (name, fam) in enumerate(FAMILIES.items()):
        write_family(name, fam, 1000 + i)
        print("wrote", os.path.join(OUT, name))


if __name__ == "__main__":
    main()
