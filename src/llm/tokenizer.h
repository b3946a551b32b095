/* Text <-> token ids for LLMs: byte-level BPE (GPT-2, Llama 3, Qwen2,
 * SmolLM) and SentencePiece-style BPE with byte fallback (Llama 2, TinyLlama,
 * Mistral), loaded from a Hugging Face tokenizer.json, a llama2.c
 * tokenizer.bin, or an in-memory vocabulary (for the GGUF importer).
 *
 * Internal for now (the public llm.h comes later). A loaded tokenizer is
 * immutable except through kiln_tokenizer_set_bos_eos, so encode/decode may
 * run from several threads at once; a stream belongs to one thread. */
#ifndef KILN_LLM_TOKENIZER_H
#define KILN_LLM_TOKENIZER_H

#include <kiln/status.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_tokenizer kiln_tokenizer;
typedef struct kiln_tokenizer_stream kiln_tokenizer_stream;

/* Encode flags. */
enum {
    /* Apply the post-processor: BOS/EOS as the tokenizer's template says. */
    KILN_TOKENIZE_ADD_SPECIAL = 1u << 0,
    /* Special tokens written in the text ("<|endoftext|>", "<s>") become their
     * ids; without it they are tokenized as plain text. Non-special added
     * tokens are always matched. */
    KILN_TOKENIZE_PARSE_SPECIAL = 1u << 1,
};
/* What Hugging Face's tokenizer.encode(text) does by default. */
#define KILN_TOKENIZE_DEFAULT (KILN_TOKENIZE_ADD_SPECIAL | KILN_TOKENIZE_PARSE_SPECIAL)

/* Decode flags. */
enum {
    /* Leave out special tokens (BOS, EOS, chat markers). */
    KILN_DETOKENIZE_SKIP_SPECIAL = 1u << 0,
};

/* ---- loading ------------------------------------------------------------ */

/* A Hugging Face tokenizer.json (model "BPE" only; anything it does not
 * implement fails with KILN_ERROR_UNSUPPORTED naming the feature). */
kiln_status kiln_tokenizer_load_json(const char *path, kiln_tokenizer **out);
kiln_status kiln_tokenizer_load_json_memory(const void *data, size_t len, kiln_tokenizer **out);

/* llama2.c's tokenizer.bin: int32 max_token_length, then per token float
 * score, int32 length, bytes. The file does not store the vocabulary size:
 * vocab_size > 0 reads exactly that many tokens, 0 reads to the end. Tokens
 * are merged by score like SentencePiece (dummy-prefix "▁", byte fallback,
 * BOS added by KILN_TOKENIZE_ADD_SPECIAL). */
kiln_status kiln_tokenizer_load_llama2c(const char *path, int32_t vocab_size, kiln_tokenizer **out);
kiln_status kiln_tokenizer_load_llama2c_memory(const void *data, size_t len, int32_t vocab_size, kiln_tokenizer **out);

/* An in-memory vocabulary, as GGUF's tokenizer.ggml.* keys describe one. */
typedef enum kiln_tokenizer_kind {
    /* SentencePiece BPE ("llama" in GGUF): "▁" prepended to each text
     * segment and for every space, merges by score (by rank instead when
     * `merges` are given), <0xXX> byte fallback, decoder undoes all that. */
    KILN_TOKENIZER_SPM = 0,
    /* Byte-level BPE ("gpt2" in GGUF): pre-tokenizer regexes, GPT-2's
     * byte->unicode mapping, merges by rank. */
    KILN_TOKENIZER_BYTE_BPE,
} kiln_tokenizer_kind;

/* Token types, numbered as GGUF's tokenizer.ggml.token_type. */
typedef enum kiln_token_type {
    KILN_TOKEN_NORMAL = 1,
    KILN_TOKEN_UNKNOWN = 2,
    KILN_TOKEN_CONTROL = 3,      /* special: matched from text only with PARSE_SPECIAL */
    KILN_TOKEN_USER_DEFINED = 4, /* added: always matched from text */
    KILN_TOKEN_UNUSED = 5,
    KILN_TOKEN_BYTE = 6, /* <0xXX> byte fallback */
} kiln_token_type;

typedef struct kiln_tokenizer_vocab {
    kiln_tokenizer_kind kind;
    int32_t n_tokens;
    const char *const *tokens;  /* n_tokens UTF-8 strings, as in the vocabulary */
    const uint32_t *token_lens; /* lengths, or NULL for NUL-terminated tokens */
    const float *scores;        /* n_tokens, or NULL; used for merging when there are no merges */
    const int32_t *types;       /* n_tokens kiln_token_type, or NULL (all normal) */
    int32_t n_merges;
    const char *const *merges; /* "left right", in rank order */
    /* BYTE_BPE pre-tokenizer: each regex splits the pieces of the previous one
     * (matches isolated), as llama.cpp does per tokenizer.ggml.pre. None: the
     * GPT-2 regex. */
    int32_t n_pre_regexes;
    const char *const *pre_regexes;
    int32_t bos_id, eos_id, unk_id; /* -1 when absent */
    int add_bos, add_eos;           /* what KILN_TOKENIZE_ADD_SPECIAL adds */
    int ignore_merges;              /* BYTE_BPE: a piece already in the vocab is one token (Llama 3) */
} kiln_tokenizer_vocab;

kiln_status kiln_tokenizer_create(const kiln_tokenizer_vocab *vocab, kiln_tokenizer **out);

void kiln_tokenizer_free(kiln_tokenizer *tok);

/* ---- serializing (the engine file carries the tokenizer) ------------------ */

/* A self-contained JSON text (*data malloc'd, caller frees) that
 * kiln_tokenizer_deserialize turns back into an identical tokenizer. */
kiln_status kiln_tokenizer_serialize(const kiln_tokenizer *tok, void **data, size_t *len);
kiln_status kiln_tokenizer_deserialize(const void *data, size_t len, kiln_tokenizer **out);

/* ---- encoding and decoding -------------------------------------------------- */

/* text: len bytes of UTF-8 (invalid UTF-8 fails). *ids is malloc'd (caller
 * frees; non-NULL even when *n_ids is 0). */
kiln_status kiln_tokenizer_encode(const kiln_tokenizer *tok, const char *text, size_t len, uint32_t flags,
                                  int32_t **ids, size_t *n_ids);

/* ids -> UTF-8 text, as Hugging Face's decode; byte sequences that are not
 * valid UTF-8 become U+FFFD. *text is malloc'd and NUL-terminated. An id
 * outside the vocabulary fails. */
kiln_status kiln_tokenizer_decode(const kiln_tokenizer *tok, const int32_t *ids, size_t n_ids, uint32_t flags,
                                  char **text, size_t *len);

/* Streaming decode: each push returns the text that became final, never a
 * partial UTF-8 sequence (an incomplete one is held back until the next
 * token completes it); finish flushes what is held (an incomplete sequence
 * becomes U+FFFD) and starts the stream over, as reset does without
 * flushing. The concatenation of all pieces equals kiln_tokenizer_decode of
 * all the ids. *text is NUL-terminated and points into the stream, valid
 * until its next call. */
kiln_status kiln_tokenizer_stream_create(const kiln_tokenizer *tok, uint32_t flags, kiln_tokenizer_stream **out);
kiln_status kiln_tokenizer_stream_push(kiln_tokenizer_stream *s, int32_t id, const char **text, size_t *len);
kiln_status kiln_tokenizer_stream_finish(kiln_tokenizer_stream *s, const char **text, size_t *len);
void kiln_tokenizer_stream_reset(kiln_tokenizer_stream *s);
void kiln_tokenizer_stream_free(kiln_tokenizer_stream *s);

/* ---- vocabulary ------------------------------------------------------------- */

int32_t kiln_tokenizer_vocab_size(const kiln_tokenizer *tok); /* max id + 1 */
/* The token's string as the vocabulary spells it ("Ġthe", "▁the", "<0x0A>"),
 * NUL-terminated, its length in *len when len is not NULL; NULL for an id
 * outside the vocabulary. Owned by the tokenizer. */
const char *kiln_tokenizer_token_to_piece(const kiln_tokenizer *tok, int32_t id, size_t *len);
/* The id of a vocabulary string (model or added token), -1 when absent. */
int32_t kiln_tokenizer_token_id(const kiln_tokenizer *tok, const char *piece, size_t len);
int kiln_tokenizer_is_special(const kiln_tokenizer *tok, int32_t id);
/* -1 when the tokenizer does not define one. tokenizer.json has no EOS
 * field: it is taken from the template's trailing special token, else the
 * first added special token named like one ("</s>", "<|endoftext|>", ...);
 * a model loader that knows better (generation_config.json) sets it. */
int32_t kiln_tokenizer_bos_id(const kiln_tokenizer *tok);
int32_t kiln_tokenizer_eos_id(const kiln_tokenizer *tok);
kiln_status kiln_tokenizer_set_bos_eos(kiln_tokenizer *tok, int32_t bos_id, int32_t eos_id);

#endif
