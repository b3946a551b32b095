#!/usr/bin/env python3
"""Writes a Hugging Face checkpoint of a real model's shape with random
weights, so that benchmarks need no download (issue 8, part 9).

    python3 tools/make_random_checkpoint.py OUT_DIR --model llama-3.1-8b|llama-3.2-1b
        [--device cuda] [--seed 0] [--layers N] [--tokenizer-dir DIR]

The shape is the published config.json of the model (written out below);
every weight matrix is drawn from normal(0, 0.02) in bf16 (torch.manual_seed
and a generator with --seed), every RMSNorm weight is 1. The model is built
with transformers on --device (cuda on the GPU machine, where an 8B one takes
about 30 s to build and save) and saved with save_pretrained as safetensors.
--layers N keeps only the first N layers (quick tries; the name says so).

The tokenizer is NOT the model's: the Llama 3 tokenizer is not public
domain, and random weights make any tokenizer as good as another for a
benchmark. It is GPT-2's byte-level BPE (50257 tokens, tests/data/tokenizer/
gpt2-bpe or --tokenizer-dir) built into a tokenizer.json with `tokenizers`;
the model's vocabulary stays 128256 (ids past the tokenizer's decode to
nothing), and BOS/EOS are GPT-2's <|endoftext|> (50256).

Needs torch, transformers, tokenizers and safetensors.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The published config.json values (meta-llama/Llama-3.1-8B and
# meta-llama/Llama-3.2-1B on Hugging Face).
LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_type": "llama3"}
MODELS = {
    "llama-3.1-8b": {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "head_dim": 128, "tie_word_embeddings": False},
    "llama-3.2-1b": {"vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
                     "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "head_dim": 64, "tie_word_embeddings": True},
}
ENDOFTEXT = 50256  # GPT-2's <|endoftext|>


def config_json(model, layers):
    c = dict(MODELS[model])
    if layers:
        c["num_hidden_layers"] = layers
    c.update({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": dict(LLAMA3_ROPE), "attention_bias": False, "attention_dropout": 0.0,
        "mlp_bias": False, "initializer_range": 0.02, "pretraining_tp": 1, "use_cache": True,
        "bos_token_id": ENDOFTEXT, "eos_token_id": ENDOFTEXT, "torch_dtype": "bfloat16",
    })
    return c


def gpt2_dir(arg):
    cands = [arg] if arg else []
    cands.append(os.path.join(ROOT, "tests", "data", "tokenizer", "gpt2-bpe"))
    for d in cands:
        if os.path.isfile(os.path.join(d, "encoder.json")) and os.path.isfile(os.path.join(d, "vocab.bpe")):
            return d
    return None


def write_tokenizer(out, tok_dir):
    d = gpt2_dir(tok_dir)
    if d is None:
        sys.exit("make_random_checkpoint: GPT-2 BPE files (encoder.json, vocab.bpe) not found in "
                 "tests/data/tokenizer/gpt2-bpe or --tokenizer-dir")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    tok = Tokenizer(models.BPE.from_file(os.path.join(d, "encoder.json"), os.path.join(d, "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(["<|endoftext|>"])
    assert tok.token_to_id("<|endoftext|>") == ENDOFTEXT
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
                   "eos_token": "<|endoftext|>", "add_bos_token": False,
                   "clean_up_tokenization_spaces": False}, f, indent=2)
    print("tokenizer: GPT-2 byte-level BPE from %s (%d tokens)" % (d, tok.get_vocab_size()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0, help="keep only the first N layers")
    ap.add_argument("--tokenizer-dir", default=None, help="folder with GPT-2's encoder.json and vocab.bpe")
    a = ap.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    # The published keys (rope_theta / rope_scaling) go through AutoConfig,
    # as a downloaded checkpoint's would.
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config_json(a.model, a.layers), f, indent=2)
    config = AutoConfig.from_pretrained(a.out)
    torch.manual_seed(a.seed)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(a.device):
        model = AutoModelForCausalLM.from_config(config)
    torch.set_default_dtype(torch.float32)
    model = model.to(dtype=torch.bfloat16)  # a no-op unless from_config ignored the default dtype
    gen = torch.Generator(device=a.device)
    gen.manual_seed(a.seed)
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied lm_head is the embedding: listed once
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
            n += p.numel()
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    if a.device.startswith("cuda"):
        torch.cuda.synchronize()
    t_build = time.time() - t0
    try:
        model.save_pretrained(a.out, safe_serialization=True, max_shard_size="5GB")
    except TypeError:  # transformers versions where safetensors is the only format
        model.save_pretrained(a.out, max_shard_size="5GB")
    write_tokenizer(a.out, a.tokenizer_dir)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out) if f.endswith(".safetensors"))
    print("%s%s: %.3f B parameters, %.2f GB of safetensors in %s (built in %.1f s, total %.1f s)"
          % (a.model, " (%d layers)" % a.layers if a.layers else "", n / 1e9, size / 1e9, a.out, t_build,
             time.time() - t0))


if __name__ == "__main__":
    sys.exit(main())
