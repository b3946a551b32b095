/* The tokenizer's internal representation. The files, each using only
 * those listed before it: tokenizer_text.c (UTF-8, buffers),
 * tokenizer_nfc_data.c and tokenizer_nfc.c (Unicode NFC),
 * tokenizer_normalize.c (regex spans, normalizers), tokenizer.c (the
 * vocabulary and its construction), tokenizer_bpe.c (the BPE model),
 * tokenizer_encode.c (the encode pipeline), tokenizer_decode.c, the loaders
 * tokenizer_vocab.c and tokenizer_json.c, and tokenizer_load.c (files and
 * the serialized form). Every
 * loader fills the same pipeline, modelled on Hugging Face tokenizers:
 * added-token split -> normalizers -> pre-tokenizers -> BPE -> template;
 * decode: per-token decoders -> post-Fuse strip -> UTF-8 repair. */
#ifndef KILN_LLM_TOKENIZER_INTERNAL_H
#define KILN_LLM_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "llm/tokenizer.h"

/* ---- tokenizer_text.c: UTF-8, GPT-2's byte mapping, growable buffers ---- */

/* The sequence at s[0..n): its length (1..4) when complete and valid, 0 when
 * a valid but incomplete prefix, -k when its first k bytes are a maximal
 * invalid subpart (one U+FFFD). */
int tok_utf8_seq(const unsigned char *s, size_t n);
/* The offset of the first byte that is not part of valid UTF-8, len when
 * all of it is valid. */
size_t tok_utf8_valid_prefix(const char *s, size_t len);
/* The code point at s (valid UTF-8), its length in *n. */
uint32_t tok_utf8_decode(const unsigned char *s, size_t *n);
/* Writes cp's UTF-8 (1..4 bytes) to out; returns the length. */
size_t tok_utf8_encode(uint32_t cp, char *out);
bool tok_is_unicode_space(uint32_t c);

/* GPT-2's byte-level mapping: every byte a visible character. */
typedef struct tok_byte_tables {
    char enc[256][2]; /* UTF-8 of each byte's character (all are 1 or 2 bytes) */
    uint8_t enc_len[256];
    int16_t dec[324]; /* code point -> byte, -1 for none */
} tok_byte_tables;
const tok_byte_tables *tok_byte_tables_get(void);

typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf;
kiln_status tok_buf_reserve(tok_buf *b, size_t extra);
kiln_status tok_buf_put(tok_buf *b, const void *s, size_t n);
kiln_status tok_push_id(int32_t **arr, size_t *n, int32_t id);

/* Grows the array ptr of n used / cap allocated elements by doubling when
 * full; returns KILN_ERROR_OUT_OF_MEMORY from the calling function. */
#define VEC_GROW(ptr, n, cap, what) \
    do { \
        if ((n) == (cap)) { \
            size_t ncap_ = (cap) ? (cap)*2 : 16; \
            void *np_ = (ncap_ > SIZE_MAX / sizeof *(ptr)) ? NULL : realloc((ptr), ncap_ * sizeof *(ptr)); \
            if (!np_) \
                return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory growing %s", what); \
            (ptr) = np_; \
            (cap) = ncap_; \
        } \
    } while (0)

/* A growing list of token ids. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
kiln_status tok_ids_push(tok_ids *ids, int32_t id);

enum {
    TOK_ATTR_SPECIAL = 1 << 0, /* skipped by SKIP_SPECIAL; matched only with PARSE_SPECIAL */
    TOK_ATTR_ADDED = 1 << 1,   /* matched in the text before normalization */
    TOK_ATTR_LSTRIP = 1 << 2,  /* an added token that swallows whitespace on its left */
    TOK_ATTR_RSTRIP = 1 << 3,
    TOK_ATTR_NORMALIZED = 1 << 4, /* an added token matched after normalization, in normalized form */
};

/* Added tokens to match, grouped by the first byte of their content. */
typedef struct tok_added {
    int32_t id;
    uint32_t off, len; /* the content to match (normalized for TOK_ATTR_NORMALIZED) */
} tok_added;

typedef struct tok_added_set {
    tok_added *v; /* by first byte, longest first within a byte */
    size_t n;
    uint32_t start[257]; /* entries starting with byte b: start[b] .. start[b + 1] */
} tok_added_set;

typedef struct tok_entry {
    uint32_t off, len; /* into kiln_tokenizer.arena; len 0 and off 0: no token */
    float score;
    uint8_t attr;
    bool present;
} tok_entry;

/* Open-addressing map from a string (in the arena) to an id. */
typedef struct tok_str_slot {
    uint32_t off, len;
    int32_t id; /* -1 empty */
} tok_str_slot;

typedef struct tok_strmap {
    tok_str_slot *slots;
    size_t mask, count;
} tok_strmap;

/* Open-addressing map from an id pair to its merge. */
typedef struct tok_merge_slot {
    uint64_t key; /* (left << 32 | right) + 1; 0 empty */
    int32_t rank, merged;
} tok_merge_slot;

typedef struct tok_mergemap {
    tok_merge_slot *slots;
    size_t mask, count;
} tok_mergemap;

typedef enum tok_norm_kind { TOK_NORM_PREPEND, TOK_NORM_REPLACE, TOK_NORM_NFC } tok_norm_kind;

typedef struct tok_normalizer {
    tok_norm_kind kind;
    char *a;
    size_t a_len; /* PREPEND: the prefix; REPLACE: the literal pattern */
    char *b;
    size_t b_len;   /* REPLACE: the replacement */
    pcre2_code *re; /* REPLACE with a regex pattern (else NULL) */
} tok_normalizer;

typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS
} tok_split_behavior;

typedef enum tok_pre_kind { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE } tok_pre_kind;

typedef enum tok_prepend_scheme { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend_scheme;

typedef struct tok_pretokenizer {
    tok_pre_kind kind;
    pcre2_code *re; /* SPLIT (literal patterns compiled as PCRE2_LITERAL); BYTELEVEL with use_regex */
    tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space; /* BYTELEVEL */
    char replacement[8];   /* METASPACE: UTF-8 of the replacement char */
    size_t replacement_len;
    tok_prepend_scheme prepend;
    bool split; /* METASPACE: split before each replacement char */
} tok_pretokenizer;

typedef enum tok_dec_kind {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_REPLACE,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_METASPACE
} tok_dec_kind;

typedef struct tok_decoder {
    tok_dec_kind kind;
    char *a;
    size_t a_len; /* REPLACE: pattern; STRIP: content char; METASPACE: replacement */
    char *b;
    size_t b_len;         /* REPLACE: replacement */
    uint32_t start, stop; /* STRIP */
    bool strip_first;     /* METASPACE: prepend scheme is not "never" */
} tok_decoder;

struct kiln_tokenizer {
    int32_t n_tokens; /* max id + 1 */
    tok_entry *tokens;
    char *arena;
    size_t arena_len, arena_cap;
    tok_strmap vocab;     /* model vocabulary (not the added tokens) */
    tok_strmap added_map; /* added tokens' content */

    /* BPE model */
    bool use_scores; /* merge the pair whose merged token scores highest (SentencePiece) */
    tok_mergemap merges;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    int32_t byte_ids[256]; /* <0xXX> ids for byte fallback, -1 absent */
    /* No token has "▁" after another character: a word splits before each
     * such "▁" without changing the result (SentencePiece vocabularies), so
     * a long text that is one word costs no more than its words. */
    bool split_before_spm_space;

    /* As HF: tokens with normalized false split the raw text first; the
     * others split each normalized stretch between those. */
    tok_added_set added_raw, added_norm;

    tok_normalizer *norms;
    size_t n_norms;
    tok_pretokenizer *pres;
    size_t n_pres;
    tok_decoder *decs;
    size_t n_decs;
    bool has_decoder; /* without one HF joins tokens with spaces */
    /* a Strip after Fuse acts on the whole text: its start at the beginning,
     * its stop at the end */
    char strip_content[8];
    size_t strip_content_len;
    uint32_t strip_start, strip_stop;

    /* post-processor, single sequence: prefix ids, $A, suffix ids */
    int32_t *post_prefix, *post_suffix;
    size_t n_post_prefix, n_post_suffix;

    int32_t bos_id, eos_id;

    /* serialized form: the JSON text this was built from, tagged */
    char *source;
    size_t source_len;
    bool source_is_vocab; /* source is kiln's vocab JSON, not a tokenizer.json */
};

/* ---- tokenizer_nfc.c: Unicode NFC ---- */
kiln_status tok_nfc(const tok_buf *in, tok_buf *out);

/* ---- tokenizer_nfc_data.c (generated by tools/gen_nfc_tables.py) ---- */
extern const uint32_t tok_nfc_ccc_runs[][3]; /* first, last, canonical combining class */
extern const size_t tok_nfc_n_ccc_runs;
extern const uint32_t tok_nfc_decomp_index[][3]; /* code point, offset into the pool, length */
extern const size_t tok_nfc_n_decomp;
extern const uint32_t tok_nfc_decomp_pool[];
extern const uint64_t tok_nfc_comp_keys[]; /* first << 21 | second, ascending */
extern const size_t tok_nfc_n_comp;
extern const uint32_t tok_nfc_comp_values[]; /* the primary composite of each key */

/* ---- tokenizer_normalize.c: regex spans and the normalizers ---- */
typedef struct tok_span {
    size_t start, end;
    bool match;
} tok_span;

/* Scratch for matching and normalizing: the spans of the last match, PCRE2
 * match data, the normalizers' two buffers. Zero it, then
 * tok_matcher_init; tok_matcher_free when done. */
typedef struct tok_matcher {
    tok_span *spans;
    size_t n_spans, cap_spans;
    pcre2_match_data *md;
    tok_buf norm[2];
} tok_matcher;
kiln_status tok_matcher_init(tok_matcher *m);
void tok_matcher_free(tok_matcher *m);
/* Every match of re in s as spans covering all of s, as HF's find_matches. */
kiln_status tok_find_matches(tok_matcher *m, const pcre2_code *re, const char *s, size_t len);
/* Runs t's normalizers over s; *result is the buffer (of m) holding the result. */
kiln_status tok_normalize(const kiln_tokenizer *t, tok_matcher *m, const char *s, size_t len, tok_buf **result);

/* ---- tokenizer.c: the vocabulary and construction (what the loaders call) ---- */
kiln_status tok_alloc(kiln_tokenizer **out);
/* Adds a model vocabulary entry: string -> id, and id -> string unless an
 * added token already holds the id. A repeated string or id fails. */
kiln_status tok_add_vocab(kiln_tokenizer *t, const char *s, size_t len, int32_t id, float score);
/* Adds an added token (TOK_ATTR_*); it names its id for decoding. */
kiln_status tok_add_added(kiln_tokenizer *t, const char *s, size_t len, int32_t id, uint8_t attr);
/* Builds the added-token groups, byte_ids and the post-Fuse strip; call once
 * after all tokens and decoders are set. */
kiln_status tok_finish(kiln_tokenizer *t);
int32_t tok_map_get(const kiln_tokenizer *t, const tok_strmap *m, const char *s, size_t len);
/* The merge of ids (a, b), NULL when none. */
const tok_merge_slot *tok_merge_get(const tok_mergemap *m, int32_t a, int32_t b);
/* Adds merge (left, right) at `rank` (a later duplicate replaces an earlier,
 * as Hugging Face's map does). Both sides and their concatenation must be in
 * the vocabulary. */
kiln_status tok_add_merge(kiln_tokenizer *t, const char *left, size_t llen, const char *right, size_t rlen,
                          int32_t rank);
kiln_status tok_compile_regex(const char *pattern, size_t len, bool literal, pcre2_code **out, const char *what);
void tok_free_contents(kiln_tokenizer *t);
extern const char tok_gpt2_regex[];

/* ---- tokenizer_bpe.c: the BPE model ---- */
typedef struct tok_bpe_sym {
    int32_t id, prev, next;
    bool alive;
} tok_bpe_sym;

typedef struct tok_bpe_cand {
    double prio; /* lower merges first */
    int32_t pos, left, right, merged;
} tok_bpe_cand;

/* Scratch for the model; set t and out (where ids go), zero the rest. */
typedef struct tok_bpe {
    const kiln_tokenizer *t;
    tok_ids *out;
    tok_bpe_sym *syms;
    size_t n_syms, cap_syms;
    tok_bpe_cand *heap;
    size_t n_heap, cap_heap;
    tok_buf tmp;
} tok_bpe;
/* One pre-tokenized word through the model: its ids appended to *b->out. */
kiln_status tok_bpe_word(tok_bpe *b, const char *w, size_t len);
void tok_bpe_free(tok_bpe *b);

/* ---- loaders: tokenizer_vocab.c (kiln_tokenizer_vocab, its JSON form,
 * llama2.c) and tokenizer_json.c (tokenizer.json); tokenizer_load.c reads
 * files and the serialized form through them ---- */
kiln_status tok_build_from_vocab(const kiln_tokenizer_vocab *v, kiln_tokenizer **out);
kiln_status tok_build_from_json_text(const char *text, size_t len, kiln_tokenizer **out);
kiln_status tok_build_from_vocab_json(const char *text, size_t len, kiln_tokenizer **out);

#endif
