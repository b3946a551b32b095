#!/usr/bin/env python3
"""Builds tokenizer.json files from the real vocabularies in tests/data/tokenizer
with Hugging Face `tokenizers`/`transformers`, and writes reference encodings of a
corpus of hard strings, so the C tokenizer can be checked against code nobody here
wrote.

usage: make_reference.py VOCAB_DIR OUT_DIR   (VOCAB_DIR: tests/data/tokenizer)

OUT_DIR/<family>/tokenizer.json and OUT_DIR/<family>/reference.json, where the
reference is a list of {"text", "ids_special", "ids_plain", "ids_literal",
"decoded", "decoded_skip"}:
  ids_special  encode(text, add_special_tokens=True)   (special tokens in text parsed)
  ids_plain    encode(text, add_special_tokens=False)
  ids_literal  encode(text, add_special_tokens=False) with special tokens in the
               text treated as plain text (encode_special_tokens=True)
  decoded      decode(ids_special, skip_special_tokens=False)
  decoded_skip decode(ids_special, skip_special_tokens=True)
For llama2-sp, "ids_sp" also holds sentencepiece's own encode(text) (no BOS),
the reference for the llama2.c tokenizer.bin path.
"""
import json
import os
import shutil
import sys
import tempfile

import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "",
    "Hello world",
    "Hello, world! How are you?",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four\r\nwindows\r\n",
    "\n\n\n",
    " ",
    "  \t \n ",
    "mixed \t\n whitespace \u00a0 nbsp \u3000 ideographic",
    "digits 1 12 123 1234 12345 3.14159 1,000,000 0x1F",
    "9999999999999999999999",
    "I'm you're they've we'll he'd it's DON'T I'M",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe",
    "cafe\u0301 combining e\u0301\u0302 marks a\u0308",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3067\u3059\u3002\u4e2d\u6587\u6d4b\u8bd5\u3002\ud55c\uad6d\uc5b4",
    "emoji \U0001F600\U0001F44D\U0001F3FD \U0001F468\u200D\U0001F469\u200D\U0001F467 flags \U0001F1FA\U0001F1F8",
    "\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd \u0928\u092e\u0938\u094d\u0924\u0947 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "\u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439, \u043c\u0438\u0440! \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "math \u2211 \u222b \u221e \u2264 \u2260 \u00b1 \u00d7 \u00f7 \u221a",
    "symbols !@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "code: def f(x):\n    return x**2  # square\n\tif x > 0: pass",
    "URL https://example.com/path?q=1&r=two#frag email a.b@c.org",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
    "\u00bfQu\u00e9 tal? \u00a1Muy bien! \u2014 \u201cquoted\u201d \u2018single\u2019 \u2026",
    "control \x01\x02\x7f chars",
    "zero\u200bwidth\u200cjoiners\ufeffbom",
    "private use \ue000 and \U0010fffd high plane \U00020000",
    "special <s> inside </s> text",
    "<|endoftext|>start and end<|endoftext|>",
    "<|begin_of_text|>Hello<|end_of_text|> <|eot_id|>",
    "not special <|endoftext |> <s > <unk>",
    "  <s>  spaces around special  </s>  ",
    "\u2581already has sentencepiece space \u2581\u2581",
    "\u00a0\u00a0nbsp-led",
    "NFC: A\u030a \u212b \u2126 \u1e0b\u0323 q\u0307\u0323 \u0958 \u1100\u1161\u11a8 \uac00\u11a8 \u0344",
    "Tie\u0302\u0301ng Vie\u0323\u0302t \u1ea1\u0302 o\u031b\u0300 \u0065\u0327\u0306 \u0301leading mark",
    "added: 1999 YEAR x<tool>y  [MASK]  a[MASK]b <tool > [mask]",
    "\u0f73 \u0f75 \u0f81 \u2adc \U0001d15e \u0345\u0301 a\u0345\u0301\u0316",
]


def random_corpus(n, seed=1234):
    """Deterministic random strings over the characters that stress
    pre-tokenizers and merges: whitespace kinds, digits, contractions,
    punctuation, accents and combining marks, CJK, emoji, U+2581, special
    token fragments."""
    import random
    rng = random.Random(seed)
    atoms = (list("abcXYZ019 ") + [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2581", "'s", "'LL",
             "!", "...", "--", "\u00e9", "e\u0301", "\u00df", "\u65e5\u672c", "\ud55c", "\U0001F600",
             "\U0001F44D\U0001F3FD", "\u200d", "\u0645", "\u0928\u094d", "\u0301", "\u0323", "\u0302", "\u1100", "\u1161", "\u11a8", "A\u030a", "\u212b", "<s>", "</s>", "<|endoftext|>",
             "<|eot_id|>", "<", "|>", "[MASK]", "<tool>", "2024", "12345", "\u0661\u0662", "\u00bd", "\x00", "\x7f", "\u0085", "\u2028"])
    words = ["the", " the", "Hello", " world", "tokenizer", "ing", " un", "believable", "Qu\u00e9"]
    out = []
    for _ in range(n):
        parts = [rng.choice(atoms if rng.random() < 0.6 else words) for _ in range(rng.randint(1, 14))]
        out.append("".join(parts))
    return out


def reference(tok, text):
    enc_special = tok.encode(text, add_special_tokens=True).ids
    enc_plain = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = True
    enc_literal = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return {
        "text": text,
        "ids_special": enc_special,
        "ids_plain": enc_plain,
        "ids_literal": enc_literal,
        "decoded": tok.decode(enc_special, skip_special_tokens=False),
        "decoded_skip": tok.decode(enc_special, skip_special_tokens=True),
    }


def write_family(out_dir, name, tok, extra=None):
    """tok: a Tokenizer, or the text of a tokenizer.json to write as is."""
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    if isinstance(tok, str):
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(tok)
    else:
        tok.save(os.path.join(d, "tokenizer.json"))
    # Reload from the saved file so the reference is what the file says.
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    refs = []
    for text in CORPUS + random_corpus(300):
        r = reference(tok, text)
        if extra:
            r.update(extra(text))
        refs.append(r)
    with open(os.path.join(d, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(refs, f, ensure_ascii=False, indent=0)


def gpt2_base(vocab):
    bpe = models.BPE.from_file(os.path.join(vocab, "gpt2-bpe", "encoder.json"),
                               os.path.join(vocab, "gpt2-bpe", "vocab.bpe"))
    tok = Tokenizer(bpe)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def build_gpt2(vocab):
    tok = gpt2_base(vocab)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def build_llama3_style(vocab):
    # The GPT-2 vocabulary behind Llama 3's pre-tokenizer: a Split on the Llama 3
    # regex, then ByteLevel without its own regex, ignore_merges, and a BOS
    # template, as in Meta-Llama-3's tokenizer.json.
    bpe = models.BPE.from_file(os.path.join(vocab, "gpt2-bpe", "encoder.json"),
                               os.path.join(vocab, "gpt2-bpe", "vocab.bpe"),
                               ignore_merges=True)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))]),
    ])
    return tok


def build_gpt2_exotic(vocab):
    # Not a published tokenizer: every Split behavior, Digits, a regex
    # Replace normalizer and ByteLevel with add_prefix_space, checked against
    # the same pipeline in HF.
    tok = gpt2_base(vocab)
    tok.normalizer = normalizers.Sequence([
        normalizers.Replace(tokenizers.Regex(r"[0-9]{4}"), "YEAR"),
        normalizers.Replace("  ", " \u2581"),
    ])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(tokenizers.Regex(r"\s+"), behavior="merged_with_previous"),
        pre_tokenizers.Split("-", behavior="removed"),
        pre_tokenizers.Split(tokenizers.Regex(r"[aeiou]+"), behavior="contiguous", invert=True),
        pre_tokenizers.Split(tokenizers.Regex(r"[A-Z]"), behavior="merged_with_next"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
    ])
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A <|endoftext|>", special_tokens=[("<|endoftext|>", 50256)])
    # Added tokens of every kind: one matched after normalization ("1999"
    # normalizes to "YEAR"), one that swallows spaces, a plain one.
    tok.add_tokens([AddedToken("YEAR", normalized=True), AddedToken("<tool>", normalized=False)])
    tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, rstrip=True, normalized=False)])
    return tok


def llama2_metaspace_decoder(tok):
    # The Metaspace decoder (T5/ALBERT style) instead of Replace+Strip.
    d = json.loads(tok.to_str())
    d["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}]}
    d["pre_tokenizer"]["split"] = True
    return json.dumps(d, ensure_ascii=False)


QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def build_qwen2_style(vocab):
    # Qwen2's pipeline (NFC normalizer, its regex, ByteLevel without a regex,
    # no BOS) over the GPT-2 vocabulary.
    tok = gpt2_base(vocab)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def build_llama2(vocab, legacy):
    from transformers import AutoTokenizer
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(vocab, "llama2-sp", "tokenizer.model"), tmp)
        cfg = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
               "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
               "legacy": legacy}
        with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f)
        hf = AutoTokenizer.from_pretrained(tmp)
        return hf.backend_tokenizer if hasattr(hf, "backend_tokenizer") else hf._tokenizer


def legacy_llama2(tok):
    # The form of the published Llama 2 tokenizer.json (older transformers): a
    # Prepend + Replace normalizer instead of the Metaspace pre-tokenizer, and
    # merges as "a b" strings rather than [a, b] pairs.
    d = json.loads(tok.to_str())
    d["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    d["pre_tokenizer"] = None
    d["model"]["merges"] = [a + " " + b for a, b in d["model"]["merges"]]
    return json.dumps(d, ensure_ascii=False)


def main():
    vocab, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    write_family(out_dir, "gpt2", build_gpt2(vocab))
    write_family(out_dir, "llama3-style", build_llama3_style(vocab))
    write_family(out_dir, "gpt2-exotic", build_gpt2_exotic(vocab))
    write_family(out_dir, "qwen2-style", build_qwen2_style(vocab))

    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=os.path.join(vocab, "llama2-sp", "tokenizer.model"))
    llama = build_llama2(vocab, legacy=True)
    assert llama.encode("Hello world").ids == [1, 15043, 3186], llama.encode("Hello world").ids
    write_family(out_dir, "llama2", llama, extra=lambda t: {"ids_sp": sp.encode(t)})
    llama_first = build_llama2(vocab, legacy=False)
    write_family(out_dir, "llama2-first", llama_first)
    write_family(out_dir, "llama2-legacy", legacy_llama2(llama))
    write_family(out_dir, "llama2-metaspace-decoder", llama2_metaspace_decoder(llama))
    with open(os.path.join(out_dir, "versions.txt"), "w") as f:
        import transformers
        f.write(f"tokenizers {tokenizers.__version__}\ntransformers {transformers.__version__}\n"
                f"sentencepiece {spm.__version__}\n")


if __name__ == "__main__":
    main()
