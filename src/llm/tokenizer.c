/* The tokenizer core: vocabulary maps, the encode pipeline (added-token
 * split, normalizers, pre-tokenizers, BPE, template) and decoding. The
 * semantics follow Hugging Face tokenizers (the reference the tests compare
 * against, id for id); the loaders fill the pipeline. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "llm/tokenizer_internal.h"
#include "core/file.h"

const char tok_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- UTF-8 -------------------------------------------------------------- */

/* Length of the longest valid-so-far prefix of the sequence at s (1..4)
 * and whether it is complete: returns the sequence length when complete and
 * valid, 0 when s[0..n) is a valid but incomplete prefix, or -k when the
 * first k bytes are a maximal invalid subpart (one U+FFFD). */
static int utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char b = s[0];
    if (b < 0x80)
        return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n)
            return 0;
        unsigned char lim_lo = k == 1 ? lo : 0x80, lim_hi = k == 1 ? hi : 0xBF;
        if (s[k] < lim_lo || s[k] > lim_hi)
            return -k;
    }
    return need;
}

size_t tok_utf8_valid_prefix(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        int r = utf8_seq(u + i, len - i);
        if (r <= 0)
            return i;
        i += (size_t)r;
    }
    return len;
}

/* Decodes one code point of valid UTF-8. */
static uint32_t utf8_decode(const unsigned char *s, size_t *n)
{
    if (s[0] < 0x80) { *n = 1; return s[0]; }
    if (s[0] < 0xE0) { *n = 2; return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); }
    if (s[0] < 0xF0) {
        *n = 3;
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *n = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}

static size_t utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Rust's char::is_whitespace (Unicode White_Space), which HF uses for the
 * lstrip/rstrip of added tokens. */
static bool is_unicode_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* ---- GPT-2's byte <-> unicode mapping ------------------------------------- */

/* Printable Latin-1 bytes map to themselves; the others, in order, to
 * U+0100 onwards, so every byte is a visible character. */
static uint16_t byte_to_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return (uint16_t)b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
            n++;
    return (uint16_t)(256 + n);
}

typedef struct byte_tables {
    char enc[256][2]; /* UTF-8 of each byte's character (all are 1 or 2 bytes) */
    uint8_t enc_len[256];
    int16_t dec[324];  /* code point -> byte, -1 for none */
} byte_tables;

static byte_tables g_bytes;
static pthread_once_t g_bytes_once = PTHREAD_ONCE_INIT;

static void byte_tables_init(void)
{
    for (unsigned i = 0; i < 324; i++)
        g_bytes.dec[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        uint16_t cp = byte_to_cp(b);
        g_bytes.enc_len[b] = (uint8_t)utf8_encode(cp, g_bytes.enc[b]);
        g_bytes.dec[cp] = (int16_t)b;
    }
}

static const byte_tables *bytes_tables(void)
{
    pthread_once(&g_bytes_once, byte_tables_init);
    return &g_bytes;
}

/* ---- growable buffers ------------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t len, cap;
} buf;

static kiln_status buf_reserve(buf *b, size_t extra)
{
    size_t need;
    if (kiln_add_overflow(b->len, extra, &need))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: buffer size overflows");
    if (need <= b->cap)
        return KILN_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (kiln_mul_overflow(cap, 2, &cap))
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: buffer size overflows");
    }
    char *p = realloc(b->p, cap);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory growing a buffer to %zu bytes", cap);
    b->p = p;
    b->cap = cap;
    return KILN_OK;
}

static kiln_status buf_put(buf *b, const void *s, size_t n)
{
    KILN_TRY(buf_reserve(b, n));
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    return KILN_OK;
}

#define VEC_GROW(ptr, n, cap, what)                                                                   \
    do {                                                                                              \
        if ((n) == (cap)) {                                                                           \
            size_t ncap_ = (cap) ? (cap) * 2 : 16;                                                     \
            void *np_ = (ncap_ > SIZE_MAX / sizeof *(ptr)) ? NULL : realloc((ptr), ncap_ * sizeof *(ptr)); \
            if (!np_)                                                                                 \
                return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory growing %s", what); \
            (ptr) = np_;                                                                              \
            (cap) = ncap_;                                                                            \
        }                                                                                             \
    } while (0)

kiln_status tok_push_id(int32_t **arr, size_t *n, int32_t id)
{
    int32_t *p = realloc(*arr, (*n + 1) * sizeof *p);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
    p[(*n)++] = id;
    *arr = p;
    return KILN_OK;
}

/* ---- the arena and maps ------------------------------------------------------ */

static kiln_status arena_add(kiln_tokenizer *t, const char *s, size_t len, uint32_t *off)
{
    size_t need;
    if (kiln_add_overflow(t->arena_len, len + 1, &need) || need > UINT32_MAX)
        return kiln_fail(KILN_ERROR_LIMIT, "tokenizer: vocabulary strings exceed 4 GiB");
    if (need > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 4096;
        while (cap < need)
            cap *= 2;
        char *p = realloc(t->arena, cap);
        if (!p)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory for vocabulary strings");
        t->arena = p;
        t->arena_cap = cap;
    }
    memcpy(t->arena + t->arena_len, s, len);
    t->arena[t->arena_len + len] = '\0';
    *off = (uint32_t)t->arena_len;
    t->arena_len = need;
    return KILN_OK;
}

static size_t str_hash(const char *s, size_t len) { return (size_t)XXH3_64bits(s, len); }

int32_t tok_map_get(const kiln_tokenizer *t, const tok_strmap *m, const char *s, size_t len)
{
    if (!m->slots)
        return -1;
    for (size_t i = str_hash(s, len) & m->mask;; i = (i + 1) & m->mask) {
        const tok_str_slot *sl = &m->slots[i];
        if (sl->id < 0)
            return -1;
        if (sl->len == len && memcmp(t->arena + sl->off, s, len) == 0)
            return sl->id;
    }
}

static kiln_status map_grow(kiln_tokenizer *t, tok_strmap *m)
{
    size_t cap = m->slots ? (m->mask + 1) * 2 : 1024;
    tok_str_slot *slots = malloc(cap * sizeof *slots);
    if (!slots)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory for the vocabulary map");
    for (size_t i = 0; i < cap; i++)
        slots[i].id = -1;
    if (m->slots) {
        for (size_t i = 0; i <= m->mask; i++) {
            tok_str_slot sl = m->slots[i];
            if (sl.id < 0)
                continue;
            size_t j = str_hash(t->arena + sl.off, sl.len) & (cap - 1);
            while (slots[j].id >= 0)
                j = (j + 1) & (cap - 1);
            slots[j] = sl;
        }
        free(m->slots);
    }
    m->slots = slots;
    m->mask = cap - 1;
    return KILN_OK;
}

/* Inserts string -> id; fails if the string is already there. */
static kiln_status map_put(kiln_tokenizer *t, tok_strmap *m, uint32_t off, uint32_t len, int32_t id,
                           const char *what)
{
    if (!m->slots || (m->count + 1) * 2 > m->mask + 1)
        KILN_TRY(map_grow(t, m));
    size_t i = str_hash(t->arena + off, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        tok_str_slot *sl = &m->slots[i];
        if (sl->id < 0)
            break;
        if (sl->len == len && memcmp(t->arena + sl->off, t->arena + off, len) == 0)
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer: %s \"%.*s\" appears twice (ids %d and %d)", what,
                             (int)(len > 64 ? 64 : len), t->arena + off, (int)sl->id, (int)id);
    }
    m->slots[i] = (tok_str_slot){off, len, id};
    m->count++;
    return KILN_OK;
}

static const tok_merge_slot *merge_get(const tok_mergemap *m, int32_t a, int32_t b)
{
    if (!m->slots)
        return NULL;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    for (size_t i = (size_t)XXH3_64bits(&key, sizeof key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == 0)
            return NULL;
        if (m->slots[i].key == key)
            return &m->slots[i];
    }
}

static kiln_status merge_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    if (!m->slots || (m->count + 1) * 2 > m->mask + 1) {
        size_t cap = m->slots ? (m->mask + 1) * 2 : 1024;
        tok_merge_slot *slots = calloc(cap, sizeof *slots);
        if (!slots)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory for the merge map");
        if (m->slots) {
            for (size_t i = 0; i <= m->mask; i++) {
                if (!m->slots[i].key)
                    continue;
                size_t j = (size_t)XXH3_64bits(&m->slots[i].key, sizeof(uint64_t)) & (cap - 1);
                while (slots[j].key)
                    j = (j + 1) & (cap - 1);
                slots[j] = m->slots[i];
            }
            free(m->slots);
        }
        m->slots = slots;
        m->mask = cap - 1;
    }
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = (size_t)XXH3_64bits(&key, sizeof key) & m->mask;
    while (m->slots[i].key && m->slots[i].key != key)
        i = (i + 1) & m->mask;
    if (!m->slots[i].key)
        m->count++;
    m->slots[i] = (tok_merge_slot){key, rank, merged};
    return KILN_OK;
}

/* ---- construction -------------------------------------------------------------- */

kiln_status tok_alloc(kiln_tokenizer **out)
{
    kiln_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
    t->unk_id = -1;
    t->bos_id = -1;
    t->eos_id = -1;
    for (int i = 0; i < 256; i++)
        t->byte_ids[i] = -1;
    *out = t;
    return KILN_OK;
}

static kiln_status ensure_token(kiln_tokenizer *t, int32_t id)
{
    if (id < 0)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer: negative token id %d", (int)id);
    if (id >= (1 << 26))
        return kiln_fail(KILN_ERROR_LIMIT, "tokenizer: token id %d exceeds the limit of %d", (int)id, 1 << 26);
    if (id < t->n_tokens)
        return KILN_OK;
    tok_entry *p = realloc(t->tokens, ((size_t)id + 1) * sizeof *p);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory for %d tokens", (int)id + 1);
    memset(p + t->n_tokens, 0, ((size_t)id + 1 - (size_t)t->n_tokens) * sizeof *p);
    t->tokens = p;
    t->n_tokens = id + 1;
    return KILN_OK;
}

kiln_status tok_add_vocab(kiln_tokenizer *t, const char *s, size_t len, int32_t id, float score)
{
    KILN_TRY(ensure_token(t, id));
    uint32_t off = 0;
    KILN_TRY(arena_add(t, s, len, &off));
    KILN_TRY(map_put(t, &t->vocab, off, (uint32_t)len, id, "vocabulary token"));
    tok_entry *e = &t->tokens[id];
    if (e->present && !(e->attr & TOK_ATTR_ADDED))
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer: token id %d is given to \"%.*s\" and \"%s\"", (int)id,
                         (int)(len > 64 ? 64 : len), s, t->arena + e->off);
    e->score = score;
    if (!e->present) {
        e->off = off;
        e->len = (uint32_t)len;
        e->present = true;
    }
    return KILN_OK;
}

kiln_status tok_add_added(kiln_tokenizer *t, const char *s, size_t len, int32_t id, uint8_t attr)
{
    if (len == 0)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer: added token %d has empty content", (int)id);
    KILN_TRY(ensure_token(t, id));
    uint32_t off;
    KILN_TRY(arena_add(t, s, len, &off));
    KILN_TRY(map_put(t, &t->added_map, off, (uint32_t)len, id, "added token"));
    tok_entry *e = &t->tokens[id];
    if (e->attr & TOK_ATTR_ADDED)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer: added token id %d appears twice", (int)id);
    /* The added token's content names the id, as HF's id_to_token looks in
     * the added vocabulary first. */
    e->off = off;
    e->len = (uint32_t)len;
    e->present = true;
    e->attr = (uint8_t)(attr | TOK_ATTR_ADDED);
    return KILN_OK;
}

kiln_status tok_add_merge(kiln_tokenizer *t, const char *left, size_t llen, const char *right, size_t rlen,
                          int32_t rank)
{
    int32_t a = tok_map_get(t, &t->vocab, left, llen), b = tok_map_get(t, &t->vocab, right, rlen);
    if (a < 0 || b < 0)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer: merge %d: \"%.*s\" is not in the vocabulary", (int)rank,
                         (int)(a < 0 ? (llen > 64 ? 64 : llen) : (rlen > 64 ? 64 : rlen)), a < 0 ? left : right);
    buf cat = {0};
    kiln_status st = buf_put(&cat, left, llen);
    if (st == KILN_OK)
        st = buf_put(&cat, right, rlen);
    int32_t m = st == KILN_OK ? tok_map_get(t, &t->vocab, cat.p, cat.len) : -1;
    free(cat.p);
    KILN_TRY(st);
    if (m < 0)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer: merge %d: \"%.*s%.*s\" is not in the vocabulary", (int)rank,
                         (int)(llen > 64 ? 64 : llen), left, (int)(rlen > 64 ? 64 : rlen), right);
    return merge_put(&t->merges, a, b, rank, m);
}

kiln_status tok_compile_regex(const char *pattern, size_t len, bool literal, pcre2_code **out, const char *what)
{
    int err;
    PCRE2_SIZE erroff;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer: %s regex does not compile at offset %zu: %s", what,
                         (size_t)erroff, (const char *)msg);
    }
    /* JIT is only a speed-up: without it matching is the same. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return KILN_OK;
}

static int cmp_added(const void *pa, const void *pb, void *ctx)
{
    const kiln_tokenizer *t = ctx;
    const tok_added *a = pa, *b = pb;
    unsigned char fa = (unsigned char)t->arena[a->off], fb = (unsigned char)t->arena[b->off];
    if (fa != fb)
        return fa < fb ? -1 : 1;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static kiln_status normalize_content(kiln_tokenizer *t, const char *s, size_t len, uint32_t *off, uint32_t *out_len);

static kiln_status build_added_set(kiln_tokenizer *t, tok_added_set *set, bool normalized)
{
    free(set->v);
    set->v = NULL;
    set->n = 0;
    for (int32_t i = 0; i < t->n_tokens; i++) {
        const tok_entry *e = &t->tokens[i];
        if (!(e->attr & TOK_ATTR_ADDED) || !(e->attr & TOK_ATTR_NORMALIZED) != !normalized)
            continue;
        tok_added a = {i, e->off, e->len};
        if (normalized && t->n_norms) {
            /* HF matches these in normalized text, by normalized content. */
            KILN_TRY(normalize_content(t, t->arena + e->off, e->len, &a.off, &a.len));
            if (a.len == 0)
                continue;
        }
        tok_added *p = realloc(set->v, (set->n + 1) * sizeof *p);
        if (!p)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
        set->v = p;
        set->v[set->n++] = a;
    }
    if (set->n)
        qsort_r(set->v, set->n, sizeof *set->v, cmp_added, t);
    size_t k = 0;
    for (unsigned b = 0; b <= 256; b++) {
        set->start[b] = (uint32_t)k;
        while (b < 256 && k < set->n && (unsigned char)t->arena[set->v[k].off] == b)
            k++;
    }
    return KILN_OK;
}

kiln_status tok_finish(kiln_tokenizer *t)
{
    KILN_TRY(build_added_set(t, &t->added_raw, false));
    KILN_TRY(build_added_set(t, &t->added_norm, true));
    t->split_before_spm_space = true;
    for (size_t i = 0; t->vocab.slots && i <= t->vocab.mask && t->split_before_spm_space; i++) {
        const tok_str_slot *sl = &t->vocab.slots[i];
        const char *p = t->arena + sl->off;
        for (size_t k = 1; sl->id >= 0 && k + 3 <= sl->len; k++)
            if (memcmp(p + k, "\xE2\x96\x81", 3) == 0 && !(k >= 3 && memcmp(p + k - 3, "\xE2\x96\x81", 3) == 0))
                t->split_before_spm_space = false;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = tok_map_get(t, &t->vocab, name, 6);
    }
    if (t->unk_id >= t->n_tokens)
        return kiln_fail(KILN_ERROR_FORMAT, "tokenizer: unk id %d is outside the vocabulary", (int)t->unk_id);
    for (size_t i = 0; i < t->n_post_prefix + t->n_post_suffix; i++) {
        int32_t id = i < t->n_post_prefix ? t->post_prefix[i] : t->post_suffix[i - t->n_post_prefix];
        if (id < 0 || id >= t->n_tokens || !t->tokens[id].present)
            return kiln_fail(KILN_ERROR_FORMAT, "tokenizer: post-processor token id %d is not in the vocabulary",
                             (int)id);
    }
    /* Decoders after Fuse see one string: a Strip there trims the text's
     * ends; the others act the same per token. */
    bool fused = false;
    for (size_t i = 0; i < t->n_decs; i++) {
        tok_decoder *d = &t->decs[i];
        if (d->kind == TOK_DEC_FUSE)
            fused = true;
        if (fused && d->kind == TOK_DEC_STRIP) {
            if (t->strip_content_len)
                return kiln_fail(KILN_ERROR_UNSUPPORTED, "tokenizer: more than one Strip decoder after Fuse");
            memcpy(t->strip_content, d->a, d->a_len);
            t->strip_content_len = d->a_len;
            t->strip_start = d->start;
            t->strip_stop = d->stop;
        }
    }
    return KILN_OK;
}

void tok_free_contents(kiln_tokenizer *t)
{
    free(t->tokens);
    free(t->arena);
    free(t->vocab.slots);
    free(t->added_map.slots);
    free(t->merges.slots);
    free(t->added_raw.v);
    free(t->added_norm.v);
    for (size_t i = 0; i < t->n_norms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
        pcre2_code_free(t->norms[i].re);
    }
    free(t->norms);
    for (size_t i = 0; i < t->n_pres; i++)
        pcre2_code_free(t->pres[i].re);
    free(t->pres);
    for (size_t i = 0; i < t->n_decs; i++) {
        free(t->decs[i].a);
        free(t->decs[i].b);
    }
    free(t->decs);
    free(t->post_prefix);
    free(t->post_suffix);
    free(t->source);
}

void kiln_tokenizer_free(kiln_tokenizer *tok)
{
    if (!tok)
        return;
    tok_free_contents(tok);
    free(tok);
}

/* ---- encoding ------------------------------------------------------------------ */

typedef struct piece {
    size_t off, len;
    bool at_start; /* begins at offset 0 of the original text (Metaspace "first") */
} piece;

typedef struct piece_list {
    buf text;
    piece *v;
    size_t n, cap;
} piece_list;

typedef struct span {
    size_t start, end;
    bool match;
} span;

typedef struct bpe_sym {
    int32_t id, prev, next;
    bool alive;
} bpe_sym;

typedef struct bpe_cand {
    double prio; /* lower merges first */
    int32_t pos, left, right, merged;
} bpe_cand;

typedef struct enc_ctx {
    const kiln_tokenizer *t;
    uint32_t flags;
    int32_t *ids;
    size_t n_ids, cap_ids;
    piece_list lists[2];
    buf norm[2];
    buf tmp;
    span *spans;
    size_t n_spans, cap_spans;
    bpe_sym *syms;
    size_t n_syms, cap_syms;
    bpe_cand *heap;
    size_t n_heap, cap_heap;
    pcre2_match_data *md;
} enc_ctx;

static kiln_status emit_id(enc_ctx *c, int32_t id)
{
    VEC_GROW(c->ids, c->n_ids, c->cap_ids, "token ids");
    c->ids[c->n_ids++] = id;
    return KILN_OK;
}

static kiln_status add_piece(piece_list *l, const char *s, size_t len, bool at_start)
{
    if (len == 0)
        return KILN_OK;
    VEC_GROW(l->v, l->n, l->cap, "pieces");
    l->v[l->n++] = (piece){l->text.len, len, at_start};
    return buf_put(&l->text, s, len);
}

/* Every match of `re` in s as spans covering all of s, as HF's find_matches. */
static kiln_status find_matches(enc_ctx *c, const pcre2_code *re, const char *s, size_t len)
{
    c->n_spans = 0;
    size_t prev = 0, at = 0;
    while (at <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            /* Match or depth limits of a pathological pattern, mostly. */
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kiln_fail(KILN_ERROR_LIMIT, "tokenizer: regex match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms || me > len)
            return kiln_fail(KILN_ERROR_INTERNAL, "tokenizer: regex reported a bad match");
        if (ms != prev) {
            VEC_GROW(c->spans, c->n_spans, c->cap_spans, "splits");
            c->spans[c->n_spans++] = (span){prev, ms, false};
        }
        VEC_GROW(c->spans, c->n_spans, c->cap_spans, "splits");
        c->spans[c->n_spans++] = (span){ms, me, true};
        prev = me;
        if (me == ms) {
            /* An empty match: step over one character. */
            if (me >= len)
                break;
            size_t n;
            utf8_decode((const unsigned char *)s + me, &n);
            at = me + n;
        } else {
            at = me;
        }
    }
    if (prev != len) {
        VEC_GROW(c->spans, c->n_spans, c->cap_spans, "splits");
        c->spans[c->n_spans++] = (span){prev, len, false};
    }
    return KILN_OK;
}

/* HF's SplitDelimiterBehavior over the spans, in place. */
static void apply_behavior(enc_ctx *c, tok_split_behavior bh, bool invert)
{
    span *sp = c->spans;
    size_t n = c->n_spans, k = 0;
    if (invert)
        for (size_t i = 0; i < n; i++)
            sp[i].match = !sp[i].match;
    switch (bh) {
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++)
            sp[i].match = false;
        break;
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!sp[i].match)
                sp[k++] = sp[i];
        c->n_spans = k;
        break;
    case TOK_SPLIT_MERGED_PREV: {
        bool prev_match = false;
        for (size_t i = 0; i < n; i++) {
            span s = sp[i];
            if (s.match && !prev_match && k > 0)
                sp[k - 1].end = s.end;
            else
                sp[k++] = (span){s.start, s.end, false};
            prev_match = s.match;
        }
        c->n_spans = k;
        break;
    }
    case TOK_SPLIT_MERGED_NEXT: {
        /* Walk backwards, then the kept spans are at the end in reverse. */
        bool prev_match = false;
        size_t w = n;
        for (size_t i = n; i-- > 0;) {
            span s = sp[i];
            if (s.match && !prev_match && w < n)
                sp[w].start = s.start;
            else
                sp[--w] = (span){s.start, s.end, false};
            prev_match = s.match;
        }
        memmove(sp, sp + w, (n - w) * sizeof *sp);
        c->n_spans = n - w;
        break;
    }
    case TOK_SPLIT_CONTIGUOUS: {
        bool prev_match = false;
        for (size_t i = 0; i < n; i++) {
            span s = sp[i];
            if (s.match == prev_match && k > 0)
                sp[k - 1].end = s.end;
            else
                sp[k++] = (span){s.start, s.end, false};
            prev_match = s.match;
        }
        c->n_spans = k;
        break;
    }
    }
}

static kiln_status split_piece(enc_ctx *c, piece_list *out, const char *s, size_t len, bool at_start,
                               const pcre2_code *re, tok_split_behavior bh, bool invert)
{
    KILN_TRY(find_matches(c, re, s, len));
    apply_behavior(c, bh, invert);
    for (size_t i = 0; i < c->n_spans; i++)
        KILN_TRY(add_piece(out, s + c->spans[i].start, c->spans[i].end - c->spans[i].start,
                           at_start && c->spans[i].start == 0));
    return KILN_OK;
}

static kiln_status run_pretokenizer(enc_ctx *c, const tok_pretokenizer *p, const piece_list *in, piece_list *out)
{
    out->n = 0;
    out->text.len = 0;
    const byte_tables *bt = bytes_tables();
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->text.p + in->v[i].off;
        size_t len = in->v[i].len;
        bool at_start = in->v[i].at_start;
        switch (p->kind) {
        case TOK_PRE_SPLIT:
            KILN_TRY(split_piece(c, out, s, len, at_start, p->re, p->behavior, p->invert));
            break;
        case TOK_PRE_BYTELEVEL: {
            c->tmp.len = 0;
            if (p->add_prefix_space && (len == 0 || s[0] != ' '))
                KILN_TRY(buf_put(&c->tmp, " ", 1));
            KILN_TRY(buf_put(&c->tmp, s, len));
            /* Split, then map every byte of each piece to its character. */
            if (p->re) {
                KILN_TRY(find_matches(c, p->re, c->tmp.p, c->tmp.len));
            } else {
                c->n_spans = 0;
                VEC_GROW(c->spans, c->n_spans, c->cap_spans, "splits");
                c->spans[c->n_spans++] = (span){0, c->tmp.len, false};
            }
            for (size_t k = 0; k < c->n_spans; k++) {
                size_t a = c->spans[k].start, b = c->spans[k].end;
                if (a == b)
                    continue;
                VEC_GROW(out->v, out->n, out->cap, "pieces");
                size_t off = out->text.len;
                KILN_TRY(buf_reserve(&out->text, (b - a) * 2));
                for (size_t j = a; j < b; j++) {
                    unsigned char ch = (unsigned char)c->tmp.p[j];
                    memcpy(out->text.p + out->text.len, bt->enc[ch], bt->enc_len[ch]);
                    out->text.len += bt->enc_len[ch];
                }
                out->v[out->n++] = (piece){off, out->text.len - off, at_start && a == 0};
            }
            break;
        }
        case TOK_PRE_METASPACE: {
            c->tmp.len = 0;
            bool starts = len >= p->replacement_len && memcmp(s, p->replacement, p->replacement_len) == 0;
            if (len > 0 && s[0] == ' ')
                starts = true; /* the space becomes the replacement */
            if (!starts && (p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && at_start)))
                KILN_TRY(buf_put(&c->tmp, p->replacement, p->replacement_len));
            for (size_t j = 0; j < len; j++) {
                if (s[j] == ' ')
                    KILN_TRY(buf_put(&c->tmp, p->replacement, p->replacement_len));
                else
                    KILN_TRY(buf_put(&c->tmp, s + j, 1));
            }
            if (!p->split) {
                KILN_TRY(add_piece(out, c->tmp.p, c->tmp.len, at_start));
                break;
            }
            /* Each piece starts at a replacement char (MergedWithNext). */
            size_t start = 0;
            for (size_t j = 1; j <= c->tmp.len; j++) {
                if (j == c->tmp.len ||
                    (c->tmp.len - j >= p->replacement_len &&
                     memcmp(c->tmp.p + j, p->replacement, p->replacement_len) == 0)) {
                    KILN_TRY(add_piece(out, c->tmp.p + start, j - start, at_start && start == 0));
                    start = j;
                }
            }
            break;
        }
        }
    }
    return KILN_OK;
}

/* Hangul syllables decompose and compose by arithmetic (Unicode 3.12). */
enum { HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7, HANGUL_NV = 21, HANGUL_NT = 28,
       HANGUL_COUNT = 11172 };

static uint32_t nfc_compose(uint32_t a, uint32_t b)
{
    if (a >= HANGUL_L && a < HANGUL_L + 19 && b >= HANGUL_V && b < HANGUL_V + HANGUL_NV)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_NV + (b - HANGUL_V)) * HANGUL_NT;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_COUNT && (a - HANGUL_S) % HANGUL_NT == 0 && b > HANGUL_T &&
        b < HANGUL_T + HANGUL_NT)
        return a + (b - HANGUL_T);
    return tok_nfc_compose(a, b);
}

typedef struct nfc_char {
    uint32_t cp;
    unsigned ccc;
} nfc_char;

/* Unicode NFC: full canonical decomposition, canonical ordering, then
 * canonical composition. */
static kiln_status run_nfc(const buf *in, buf *out)
{
    /* Below U+0300 (lead bytes under 0xCC) nothing decomposes or combines. */
    bool simple = true;
    for (size_t i = 0; i < in->len && simple; i++)
        simple = (unsigned char)in->p[i] < 0xCC;
    if (simple)
        return buf_put(out, in->p, in->len);
    size_t cap = 0, n = 0;
    nfc_char *v = NULL;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < in->len && st == KILN_OK;) {
        size_t k;
        uint32_t cp = utf8_decode((const unsigned char *)in->p + i, &k);
        i += k;
        uint32_t parts[4];
        const uint32_t *d = parts;
        size_t nd = 1;
        parts[0] = cp;
        if (cp >= HANGUL_S && cp < HANGUL_S + HANGUL_COUNT) {
            uint32_t si = cp - HANGUL_S;
            parts[0] = HANGUL_L + si / (HANGUL_NV * HANGUL_NT);
            parts[1] = HANGUL_V + (si % (HANGUL_NV * HANGUL_NT)) / HANGUL_NT;
            parts[2] = HANGUL_T + si % HANGUL_NT;
            nd = parts[2] == HANGUL_T ? 2 : 3;
        } else {
            size_t m;
            const uint32_t *dd = tok_nfc_decomp(cp, &m);
            if (dd) {
                d = dd;
                nd = m;
            }
        }
        for (size_t j = 0; j < nd; j++) {
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 64;
                nfc_char *p = realloc(v, ncap * sizeof *p);
                if (!p) {
                    st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory in NFC");
                    break;
                }
                v = p;
                cap = ncap;
            }
            v[n++] = (nfc_char){d[j], tok_nfc_ccc(d[j])};
        }
    }
    /* Canonical ordering: a stable sort of each run of non-starters. */
    for (size_t i = 1; st == KILN_OK && i < n; i++) {
        for (size_t j = i; j > 0 && v[j].ccc && v[j - 1].ccc > v[j].ccc; j--) {
            nfc_char tmp = v[j];
            v[j] = v[j - 1];
            v[j - 1] = tmp;
        }
    }
    /* Composition: each character joins the last starter unless blocked by
     * a character of the same or higher class in between. */
    size_t w = 0, starter = 0;
    unsigned last = 256;
    for (size_t i = 0; st == KILN_OK && i < n; i++) {
        if (i > 0 && v[starter].ccc == 0 && (last < v[i].ccc || last == 0)) {
            uint32_t comp = nfc_compose(v[starter].cp, v[i].cp);
            if (comp) {
                v[starter].cp = comp;
                continue;
            }
        }
        if (v[i].ccc == 0)
            starter = w;
        last = v[i].ccc;
        v[w++] = v[i];
        if (i == 0 && v[0].ccc)
            last = 256;
    }
    for (size_t i = 0; st == KILN_OK && i < w; i++) {
        char enc[4];
        st = buf_put(out, enc, utf8_encode(v[i].cp, enc));
    }
    free(v);
    return st;
}

static kiln_status run_normalizer(enc_ctx *c, const tok_normalizer *nm, const buf *in, buf *out)
{
    out->len = 0;
    if (nm->kind == TOK_NORM_NFC)
        return run_nfc(in, out);
    if (nm->kind == TOK_NORM_PREPEND) {
        if (in->len)
            KILN_TRY(buf_put(out, nm->a, nm->a_len));
        return buf_put(out, in->p, in->len);
    }
    if (nm->re) {
        KILN_TRY(find_matches(c, nm->re, in->p ? in->p : "", in->len));
        for (size_t i = 0; i < c->n_spans; i++) {
            if (c->spans[i].match)
                KILN_TRY(buf_put(out, nm->b, nm->b_len));
            else
                KILN_TRY(buf_put(out, in->p + c->spans[i].start, c->spans[i].end - c->spans[i].start));
        }
        return KILN_OK;
    }
    size_t i = 0;
    while (i < in->len) {
        if (in->len - i >= nm->a_len && memcmp(in->p + i, nm->a, nm->a_len) == 0) {
            KILN_TRY(buf_put(out, nm->b, nm->b_len));
            i += nm->a_len;
        } else {
            KILN_TRY(buf_put(out, in->p + i, 1));
            i++;
        }
    }
    return KILN_OK;
}

/* ---- BPE ---- */

static bool cand_less(const bpe_cand *a, const bpe_cand *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->pos < b->pos);
}

/* A 4-ary min-heap: half the depth of a binary one, and the children of a
 * node share cache lines, which matters for one long word (SentencePiece
 * models without a pre-tokenizer see the whole text as one). */
static kiln_status heap_push(enc_ctx *c, bpe_cand e)
{
    VEC_GROW(c->heap, c->n_heap, c->cap_heap, "the merge queue");
    size_t i = c->n_heap++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (!cand_less(&e, &c->heap[p]))
            break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = e;
    return KILN_OK;
}

static bpe_cand heap_pop(enc_ctx *c)
{
    bpe_cand top = c->heap[0], last = c->heap[--c->n_heap];
    size_t i = 0, n = c->n_heap;
    for (;;) {
        size_t first = 4 * i + 1, m = i;
        const bpe_cand *best = &last;
        for (size_t k = first; k < first + 4 && k < n; k++) {
            if (cand_less(&c->heap[k], best)) {
                m = k;
                best = &c->heap[k];
            }
        }
        if (m == i)
            break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n)
        c->heap[i] = last;
    return top;
}

/* Queues the merge of symbols pos and its next, if there is one. */
static kiln_status queue_pair(enc_ctx *c, int32_t pos)
{
    const kiln_tokenizer *t = c->t;
    int32_t nx = c->syms[pos].next;
    if (nx < 0)
        return KILN_OK;
    int32_t a = c->syms[pos].id, b = c->syms[nx].id;
    if (t->use_scores) {
        const tok_entry *ea = &t->tokens[a], *eb = &t->tokens[b];
        c->tmp.len = 0;
        KILN_TRY(buf_put(&c->tmp, t->arena + ea->off, ea->len));
        KILN_TRY(buf_put(&c->tmp, t->arena + eb->off, eb->len));
        int32_t m = tok_map_get(t, &t->vocab, c->tmp.p, c->tmp.len);
        if (m < 0)
            return KILN_OK;
        return heap_push(c, (bpe_cand){-(double)t->tokens[m].score, pos, a, b, m});
    }
    const tok_merge_slot *ms = merge_get(&t->merges, a, b);
    if (!ms)
        return KILN_OK;
    return heap_push(c, (bpe_cand){(double)ms->rank, pos, a, b, ms->merged});
}

static kiln_status add_sym(enc_ctx *c, int32_t id)
{
    VEC_GROW(c->syms, c->n_syms, c->cap_syms, "symbols");
    int32_t i = (int32_t)c->n_syms;
    c->syms[c->n_syms++] = (bpe_sym){id, i - 1, -1, true};
    if (i > 0)
        c->syms[i - 1].next = i;
    return KILN_OK;
}

/* One pre-tokenized word through the BPE model, as HF's merge_word +
 * merge_all: characters (unknown ones as <0xXX> bytes or unk), then merges
 * by rank (or by score), lowest first and leftmost on ties. */
static kiln_status bpe_one(enc_ctx *c, const char *w, size_t len)
{
    const kiln_tokenizer *t = c->t;
    if (len == 0)
        return KILN_OK;
    if (t->ignore_merges) {
        int32_t id = tok_map_get(t, &t->vocab, w, len);
        if (id >= 0)
            return emit_id(c, id);
    }
    c->n_syms = 0;
    c->n_heap = 0;
    bool pending_unk = false;
    for (size_t i = 0; i < len;) {
        size_t n;
        utf8_decode((const unsigned char *)w + i, &n);
        int32_t id = tok_map_get(t, &t->vocab, w + i, n);
        if (id >= 0) {
            if (pending_unk) {
                KILN_TRY(add_sym(c, t->unk_id));
                pending_unk = false;
            }
            KILN_TRY(add_sym(c, id));
        } else {
            bool fell_back = false;
            if (t->byte_fallback) {
                fell_back = true;
                for (size_t k = 0; k < n; k++)
                    if (t->byte_ids[(unsigned char)w[i + k]] < 0)
                        fell_back = false;
                if (fell_back) {
                    if (pending_unk) {
                        KILN_TRY(add_sym(c, t->unk_id));
                        pending_unk = false;
                    }
                    for (size_t k = 0; k < n; k++)
                        KILN_TRY(add_sym(c, t->byte_ids[(unsigned char)w[i + k]]));
                }
            }
            if (!fell_back && t->unk_id >= 0) {
                if (pending_unk && !t->fuse_unk)
                    KILN_TRY(add_sym(c, t->unk_id));
                pending_unk = true;
            }
        }
        i += n;
    }
    if (pending_unk)
        KILN_TRY(add_sym(c, t->unk_id));
    for (size_t i = 0; i + 1 < c->n_syms; i++)
        KILN_TRY(queue_pair(c, (int32_t)i));
    while (c->n_heap) {
        bpe_cand e = heap_pop(c);
        bpe_sym *l = &c->syms[e.pos];
        if (!l->alive || l->id != e.left || l->next < 0 || c->syms[l->next].id != e.right)
            continue;
        bpe_sym *r = &c->syms[l->next];
        r->alive = false;
        l->id = e.merged;
        l->next = r->next;
        if (r->next >= 0)
            c->syms[r->next].prev = e.pos;
        if (l->prev >= 0)
            KILN_TRY(queue_pair(c, l->prev));
        KILN_TRY(queue_pair(c, e.pos));
    }
    for (int32_t i = c->n_syms ? 0 : -1; i >= 0; i = c->syms[i].next)
        KILN_TRY(emit_id(c, c->syms[i].id));
    return KILN_OK;
}

static const char SPM_SPACE[] = "\xE2\x96\x81"; /* U+2581 */

static bool is_spm_space(const char *s) { return memcmp(s, SPM_SPACE, 3) == 0; }

static kiln_status bpe_word(enc_ctx *c, const char *w, size_t len)
{
    if (!c->t->split_before_spm_space)
        return bpe_one(c, w, len);
    size_t start = 0;
    for (size_t i = 1; i + 3 <= len; i++) {
        if (is_spm_space(w + i) && !(i >= 3 && is_spm_space(w + i - 3))) {
            KILN_TRY(bpe_one(c, w + start, i - start));
            start = i;
        }
    }
    return bpe_one(c, w + start, len - start);
}

/* Normalized text between added tokens: pre-tokenize, BPE. */
static kiln_status encode_words(enc_ctx *c, const char *s, size_t len, bool at_start)
{
    const kiln_tokenizer *t = c->t;
    piece_list *pl = &c->lists[0];
    pl->n = 0;
    pl->text.len = 0;
    KILN_TRY(add_piece(pl, s, len, at_start));
    for (size_t i = 0; i < t->n_pres; i++) {
        piece_list *next = pl == &c->lists[0] ? &c->lists[1] : &c->lists[0];
        KILN_TRY(run_pretokenizer(c, &t->pres[i], pl, next));
        pl = next;
    }
    for (size_t i = 0; i < pl->n; i++)
        KILN_TRY(bpe_word(c, pl->text.p + pl->v[i].off, pl->v[i].len));
    return KILN_OK;
}

/* Runs the normalizers over s; the result is in the returned buffer. */
static kiln_status normalize(enc_ctx *c, const char *s, size_t len, buf **result)
{
    const kiln_tokenizer *t = c->t;
    buf *cur = &c->norm[0];
    cur->len = 0;
    KILN_TRY(buf_put(cur, s, len));
    for (size_t i = 0; i < t->n_norms; i++) {
        buf *next = cur == &c->norm[0] ? &c->norm[1] : &c->norm[0];
        KILN_TRY(run_normalizer(c, &t->norms[i], cur, next));
        cur = next;
    }
    *result = cur;
    return KILN_OK;
}

/* The longest added token at s (leftmost-longest, as HF's Aho-Corasick). */
static const tok_added *match_added(const kiln_tokenizer *t, const tok_added_set *set, const char *s, size_t len,
                                    uint32_t flags)
{
    unsigned char b = (unsigned char)s[0];
    for (uint32_t k = set->start[b]; k < set->start[b + 1]; k++) {
        const tok_added *a = &set->v[k];
        if ((t->tokens[a->id].attr & TOK_ATTR_SPECIAL) && !(flags & KILN_TOKENIZE_PARSE_SPECIAL))
            continue;
        if (a->len <= len && memcmp(t->arena + a->off, s, a->len) == 0)
            return a;
    }
    return NULL;
}

static kiln_status encode_segment(enc_ctx *c, const char *s, size_t len, bool at_start);

/* Splits text on the set's added tokens; the stretches between go to
 * encode_segment (raw text) or encode_words (already normalized). */
static kiln_status split_added(enc_ctx *c, const tok_added_set *set, const char *text, size_t len, bool at_start,
                               bool normalized)
{
    const kiln_tokenizer *t = c->t;
    size_t seg = 0, pos = 0;
    while (pos < len) {
        const tok_added *a = set->n ? match_added(t, set, text + pos, len - pos, c->flags) : NULL;
        if (!a) {
            pos++;
            continue;
        }
        uint8_t attr = t->tokens[a->id].attr;
        size_t start = pos, end = pos + a->len;
        if (attr & TOK_ATTR_LSTRIP) {
            /* Back over whitespace characters to the stretch's start. */
            while (start > seg) {
                size_t p = start - 1;
                while (p > seg && ((unsigned char)text[p] & 0xC0) == 0x80)
                    p--;
                size_t n;
                if (!is_unicode_space(utf8_decode((const unsigned char *)text + p, &n)))
                    break;
                start = p;
            }
        }
        if (attr & TOK_ATTR_RSTRIP) {
            while (end < len) {
                size_t n;
                if (!is_unicode_space(utf8_decode((const unsigned char *)text + end, &n)))
                    break;
                end += n;
            }
        }
        if (start > seg)
            KILN_TRY(normalized ? encode_words(c, text + seg, start - seg, at_start && seg == 0)
                                : encode_segment(c, text + seg, start - seg, seg == 0));
        KILN_TRY(emit_id(c, a->id));
        seg = pos = end;
    }
    if (len > seg)
        KILN_TRY(normalized ? encode_words(c, text + seg, len - seg, at_start && seg == 0)
                            : encode_segment(c, text + seg, len - seg, seg == 0));
    return KILN_OK;
}

/* A stretch of raw text between added tokens: normalize, then split on the
 * normalized added tokens. */
static kiln_status encode_segment(enc_ctx *c, const char *s, size_t len, bool at_start)
{
    buf *norm;
    KILN_TRY(normalize(c, s, len, &norm));
    if (norm->len == 0)
        return KILN_OK;
    return split_added(c, &c->t->added_norm, norm->p, norm->len, at_start, true);
}

static void enc_ctx_free(enc_ctx *c)
{
    pcre2_match_data_free(c->md);
    for (int i = 0; i < 2; i++) {
        free(c->lists[i].text.p);
        free(c->lists[i].v);
        free(c->norm[i].p);
    }
    free(c->tmp.p);
    free(c->spans);
    free(c->syms);
    free(c->heap);
    free(c->ids);
}

static kiln_status normalize_content(kiln_tokenizer *t, const char *s, size_t len, uint32_t *off, uint32_t *out_len)
{
    enc_ctx c = {.t = t};
    c.md = pcre2_match_data_create(4, NULL);
    buf *norm = NULL;
    kiln_status st = c.md ? normalize(&c, s, len, &norm) : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
    if (st == KILN_OK && norm->len)
        st = arena_add(t, norm->p, norm->len, off);
    if (st == KILN_OK)
        *out_len = (uint32_t)norm->len;
    enc_ctx_free(&c);
    return st;
}

static kiln_status encode_all(enc_ctx *c, const char *text, size_t len)
{
    const kiln_tokenizer *t = c->t;
    if (c->flags & KILN_TOKENIZE_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_post_prefix; i++)
            KILN_TRY(emit_id(c, t->post_prefix[i]));
    KILN_TRY(split_added(c, &t->added_raw, text, len, true, false));
    if (c->flags & KILN_TOKENIZE_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_post_suffix; i++)
            KILN_TRY(emit_id(c, t->post_suffix[i]));
    return KILN_OK;
}

kiln_status kiln_tokenizer_encode(const kiln_tokenizer *tok, const char *text, size_t len, uint32_t flags,
                                  int32_t **ids, size_t *n_ids)
{
    if (!tok || !ids || !n_ids || (!text && len))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    size_t bad = tok_utf8_valid_prefix(text, len);
    if (bad != len)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_encode: text is not valid UTF-8 at byte %zu",
                         bad);
    enc_ctx c = {.t = tok, .flags = flags};
    c.md = pcre2_match_data_create(4, NULL);
    kiln_status st = c.md ? KILN_OK : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
    if (st == KILN_OK)
        st = emit_id(&c, 0); /* so *ids is never NULL */
    if (st == KILN_OK) {
        c.n_ids = 0;
        st = encode_all(&c, text ? text : "", len);
    }
    if (st == KILN_OK) {
        *ids = c.ids;
        *n_ids = c.n_ids;
        c.ids = NULL;
    }
    enc_ctx_free(&c);
    return st;
}

/* ---- decoding -------------------------------------------------------------------- */

struct kiln_tokenizer_stream {
    const kiln_tokenizer *t;
    uint32_t flags;
    size_t n_out;          /* tokens passed to the decoders so far */
    uint32_t strip_left;   /* leading strip-content chars still to drop */
    buf held;              /* trailing strip-content chars held for the final strip */
    uint32_t held_count;
    buf pending;           /* an incomplete UTF-8 sequence */
    buf out;
    buf tok;               /* scratch: one token's bytes */
    buf tmp;
};

static bool has_prefix(const char *s, size_t len, const char *p, size_t plen)
{
    return plen && len >= plen && memcmp(s, p, plen) == 0;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Runs the per-token decoders on the token in s->tok. */
static kiln_status decode_token(kiln_tokenizer_stream *s, bool first)
{
    const kiln_tokenizer *t = s->t;
    const byte_tables *bt = bytes_tables();
    bool fused = false;
    for (size_t i = 0; i < t->n_decs; i++) {
        const tok_decoder *d = &t->decs[i];
        buf *b = &s->tok;
        s->tmp.len = 0;
        switch (d->kind) {
        case TOK_DEC_FUSE:
            fused = true;
            continue;
        case TOK_DEC_BYTELEVEL: {
            /* All characters map back to bytes, or the token stays as is. */
            bool ok = true;
            for (size_t j = 0; j < b->len && ok;) {
                /* An earlier decoder (ByteFallback) may have left raw bytes. */
                int r = utf8_seq((const unsigned char *)b->p + j, b->len - j);
                size_t n;
                uint32_t cp = r > 0 ? utf8_decode((const unsigned char *)b->p + j, &n) : 0x110000;
                if (cp >= 324 || bt->dec[cp] < 0) {
                    ok = false;
                    break;
                }
                char byte = (char)bt->dec[cp];
                KILN_TRY(buf_put(&s->tmp, &byte, 1));
                j += n;
            }
            if (!ok)
                continue;
            break;
        }
        case TOK_DEC_REPLACE:
            for (size_t j = 0; j < b->len;) {
                if (has_prefix(b->p + j, b->len - j, d->a, d->a_len)) {
                    KILN_TRY(buf_put(&s->tmp, d->b, d->b_len));
                    j += d->a_len;
                } else {
                    KILN_TRY(buf_put(&s->tmp, b->p + j, 1));
                    j++;
                }
            }
            break;
        case TOK_DEC_BYTEFALLBACK:
            if (b->len == 6 && memcmp(b->p, "<0x", 3) == 0 && b->p[5] == '>' && hexval(b->p[3]) >= 0 &&
                hexval(b->p[4]) >= 0) {
                char byte = (char)(hexval(b->p[3]) * 16 + hexval(b->p[4]));
                KILN_TRY(buf_put(&s->tmp, &byte, 1));
                break;
            }
            continue;
        case TOK_DEC_STRIP: {
            if (fused)
                continue; /* the whole-text strip, done by the stream */
            size_t a = 0, e = b->len;
            for (uint32_t k = 0; k < d->start && has_prefix(b->p + a, e - a, d->a, d->a_len); k++)
                a += d->a_len;
            for (uint32_t k = 0; k < d->stop && e - a >= d->a_len && memcmp(b->p + e - d->a_len, d->a, d->a_len) == 0;
                 k++)
                e -= d->a_len;
            KILN_TRY(buf_put(&s->tmp, b->p + a, e - a));
            break;
        }
        case TOK_DEC_METASPACE: {
            /* HF drops every replacement char of the first token (after Fuse
             * all tokens are the first). */
            bool drop = (first || fused) && d->strip_first;
            for (size_t j = 0; j < b->len;) {
                if (has_prefix(b->p + j, b->len - j, d->a, d->a_len)) {
                    if (!drop)
                        KILN_TRY(buf_put(&s->tmp, " ", 1));
                    j += d->a_len;
                } else {
                    KILN_TRY(buf_put(&s->tmp, b->p + j, 1));
                    j++;
                }
            }
            break;
        }
        }
        buf swap = s->tok;
        s->tok = s->tmp;
        s->tmp = swap;
    }
    return KILN_OK;
}

static const char REPLACEMENT_CHAR[] = "\xEF\xBF\xBD";

/* Appends bytes to the output, repairing UTF-8: complete sequences pass,
 * maximal invalid subparts become U+FFFD, an incomplete tail waits (or, at
 * the end, becomes U+FFFD). */
static kiln_status emit_utf8(kiln_tokenizer_stream *s, const char *p, size_t n, bool final)
{
    KILN_TRY(buf_put(&s->pending, p, n));
    const unsigned char *u = (const unsigned char *)s->pending.p;
    size_t i = 0, len = s->pending.len;
    while (i < len) {
        int r = utf8_seq(u + i, len - i);
        if (r > 0) {
            KILN_TRY(buf_put(&s->out, u + i, (size_t)r));
            i += (size_t)r;
        } else if (r < 0) {
            KILN_TRY(buf_put(&s->out, REPLACEMENT_CHAR, 3));
            i += (size_t)-r;
        } else if (final) {
            KILN_TRY(buf_put(&s->out, REPLACEMENT_CHAR, 3));
            i = len;
        } else {
            break;
        }
    }
    if (i < len)
        memmove(s->pending.p, s->pending.p + i, len - i);
    s->pending.len = len - i;
    return KILN_OK;
}

/* The whole-text Strip (after Fuse): drop leading content chars, hold
 * trailing ones until more text shows they are not at the end. */
static kiln_status emit_bytes(kiln_tokenizer_stream *s, const char *p, size_t n)
{
    const kiln_tokenizer *t = s->t;
    const char *c = t->strip_content;
    size_t cl = t->strip_content_len;
    while (s->strip_left && n && has_prefix(p, n, c, cl)) {
        p += cl;
        n -= cl;
        s->strip_left--;
    }
    if (n)
        s->strip_left = 0;
    if (!t->strip_stop || !n)
        return emit_utf8(s, p, n, false);
    /* Trailing run of content in the new bytes. */
    size_t e = n;
    uint32_t run = 0;
    while (e >= cl && memcmp(p + e - cl, c, cl) == 0) {
        e -= cl;
        run++;
    }
    if (e > 0) {
        /* Non-content arrived: what was held is not at the end. */
        KILN_TRY(emit_utf8(s, s->held.p, s->held.len, false));
        s->held.len = 0;
        s->held_count = 0;
        KILN_TRY(emit_utf8(s, p, e, false));
    }
    for (uint32_t k = 0; k < run; k++) {
        if (s->held_count == t->strip_stop) {
            KILN_TRY(emit_utf8(s, c, cl, false));
            memmove(s->held.p, s->held.p + cl, s->held.len - cl);
            s->held.len -= cl;
            s->held_count--;
        }
        KILN_TRY(buf_put(&s->held, c, cl));
        s->held_count++;
    }
    return KILN_OK;
}

kiln_status kiln_tokenizer_stream_create(const kiln_tokenizer *tok, uint32_t flags, kiln_tokenizer_stream **out)
{
    if (!tok || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_stream_create: NULL argument");
    kiln_tokenizer_stream *s = calloc(1, sizeof *s);
    if (!s)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory for a stream");
    s->t = tok;
    s->flags = flags;
    s->strip_left = tok->strip_start;
    *out = s;
    return KILN_OK;
}

void kiln_tokenizer_stream_reset(kiln_tokenizer_stream *s)
{
    if (!s)
        return;
    s->n_out = 0;
    s->strip_left = s->t->strip_start;
    s->held.len = 0;
    s->held_count = 0;
    s->pending.len = 0;
    s->out.len = 0;
}

void kiln_tokenizer_stream_free(kiln_tokenizer_stream *s)
{
    if (!s)
        return;
    free(s->held.p);
    free(s->pending.p);
    free(s->out.p);
    free(s->tok.p);
    free(s->tmp.p);
    free(s);
}

/* Leaves the NUL-terminated text in s->out. */
static kiln_status out_text(kiln_tokenizer_stream *s, const char **text, size_t *len)
{
    KILN_TRY(buf_reserve(&s->out, 1));
    s->out.p[s->out.len] = '\0';
    if (text)
        *text = s->out.p;
    if (len)
        *len = s->out.len;
    return KILN_OK;
}

static kiln_status stream_token(kiln_tokenizer_stream *s, int32_t id)
{
    const kiln_tokenizer *t = s->t;
    if (id < 0 || id >= t->n_tokens || !t->tokens[id].present)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tokenizer: token id %d is not in the vocabulary (size %d)",
                         (int)id, (int)t->n_tokens);
    const tok_entry *e = &t->tokens[id];
    if ((s->flags & KILN_DETOKENIZE_SKIP_SPECIAL) && (e->attr & TOK_ATTR_SPECIAL))
        return KILN_OK;
    s->tok.len = 0;
    KILN_TRY(buf_put(&s->tok, t->arena + e->off, e->len));
    bool first = s->n_out == 0;
    s->n_out++;
    if (!t->has_decoder) {
        /* Without a decoder HF joins the tokens with spaces. */
        if (!first)
            KILN_TRY(emit_utf8(s, " ", 1, false));
        return emit_utf8(s, s->tok.p, s->tok.len, false);
    }
    KILN_TRY(decode_token(s, first));
    return emit_bytes(s, s->tok.p, s->tok.len);
}

kiln_status kiln_tokenizer_stream_push(kiln_tokenizer_stream *s, int32_t id, const char **text, size_t *len)
{
    if (!s)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_stream_push: NULL stream");
    s->out.len = 0;
    KILN_TRY(stream_token(s, id));
    return out_text(s, text, len);
}

kiln_status kiln_tokenizer_stream_finish(kiln_tokenizer_stream *s, const char **text, size_t *len)
{
    if (!s)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_stream_finish: NULL stream");
    s->out.len = 0;
    /* Held trailing strip chars are at the end: dropped. */
    s->held.len = 0;
    s->held_count = 0;
    KILN_TRY(emit_utf8(s, NULL, 0, true));
    KILN_TRY(out_text(s, text, len));
    s->n_out = 0;
    s->strip_left = s->t->strip_start;
    return KILN_OK;
}

kiln_status kiln_tokenizer_decode(const kiln_tokenizer *tok, const int32_t *ids, size_t n_ids, uint32_t flags,
                                  char **text, size_t *len)
{
    if (!tok || !text || (!ids && n_ids))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_decode: NULL argument");
    *text = NULL;
    kiln_tokenizer_stream *s = NULL;
    KILN_TRY(kiln_tokenizer_stream_create(tok, flags, &s));
    buf all = {0};
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n_ids && st == KILN_OK; i++) {
        s->out.len = 0;
        st = stream_token(s, ids[i]);
        if (st == KILN_OK)
            st = buf_put(&all, s->out.p, s->out.len);
    }
    const char *tail = NULL;
    size_t tail_len = 0;
    if (st == KILN_OK)
        st = kiln_tokenizer_stream_finish(s, &tail, &tail_len);
    if (st == KILN_OK)
        st = buf_put(&all, tail, tail_len + 1);
    kiln_tokenizer_stream_free(s);
    if (st != KILN_OK) {
        free(all.p);
        return st;
    }
    *text = all.p;
    if (len)
        *len = all.len - 1;
    return KILN_OK;
}

/* ---- vocabulary queries --------------------------------------------------------------- */

int32_t kiln_tokenizer_vocab_size(const kiln_tokenizer *tok) { return tok ? tok->n_tokens : 0; }

const char *kiln_tokenizer_token_to_piece(const kiln_tokenizer *tok, int32_t id, size_t *len)
{
    if (!tok || id < 0 || id >= tok->n_tokens || !tok->tokens[id].present)
        return NULL;
    if (len)
        *len = tok->tokens[id].len;
    return tok->arena + tok->tokens[id].off;
}

int32_t kiln_tokenizer_token_id(const kiln_tokenizer *tok, const char *piece, size_t len)
{
    if (!tok || (!piece && len))
        return -1;
    int32_t id = tok_map_get(tok, &tok->added_map, piece, len);
    return id >= 0 ? id : tok_map_get(tok, &tok->vocab, piece, len);
}

int kiln_tokenizer_is_special(const kiln_tokenizer *tok, int32_t id)
{
    return tok && id >= 0 && id < tok->n_tokens && (tok->tokens[id].attr & TOK_ATTR_SPECIAL);
}

int32_t kiln_tokenizer_bos_id(const kiln_tokenizer *tok) { return tok ? tok->bos_id : -1; }
int32_t kiln_tokenizer_eos_id(const kiln_tokenizer *tok) { return tok ? tok->eos_id : -1; }

kiln_status kiln_tokenizer_set_bos_eos(kiln_tokenizer *tok, int32_t bos_id, int32_t eos_id)
{
    if (!tok)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_set_bos_eos: NULL tokenizer");
    int32_t v[2] = {bos_id, eos_id};
    for (int i = 0; i < 2; i++)
        if (v[i] != -1 && (v[i] < 0 || v[i] >= tok->n_tokens || !tok->tokens[v[i]].present))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_set_bos_eos: %s id %d is not in the vocabulary",
                             i ? "eos" : "bos", (int)v[i]);
    tok->bos_id = bos_id;
    tok->eos_id = eos_id;
    return KILN_OK;
}

/* ---- serialization -------------------------------------------------------------------- */

/* "kiln-tokenizer 1 <hf|vocab> <bos> <eos>\n" then the JSON it was built from. */
kiln_status kiln_tokenizer_serialize(const kiln_tokenizer *tok, void **data, size_t *len)
{
    if (!tok || !data || !len)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_serialize: NULL argument");
    char head[96];
    int hn = snprintf(head, sizeof head, "kiln-tokenizer 1 %s %d %d\n", tok->source_is_vocab ? "vocab" : "hf",
                      (int)tok->bos_id, (int)tok->eos_id);
    size_t total = (size_t)hn + tok->source_len;
    char *p = malloc(total);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "kiln_tokenizer_serialize: out of memory for %zu bytes", total);
    memcpy(p, head, (size_t)hn);
    memcpy(p + hn, tok->source, tok->source_len);
    *data = p;
    *len = total;
    return KILN_OK;
}

static bool parse_int(const char **p, const char *end, long *out)
{
    const char *s = *p;
    bool neg = false;
    if (s < end && *s == '-') {
        neg = true;
        s++;
    }
    long v = 0;
    const char *digits = s;
    while (s < end && *s >= '0' && *s <= '9' && s - digits < 10)
        v = v * 10 + (*s++ - '0');
    if (s == digits)
        return false;
    *out = neg ? -v : v;
    *p = s;
    return true;
}

kiln_status kiln_tokenizer_deserialize(const void *data, size_t len, kiln_tokenizer **out)
{
    if (!data || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_deserialize: NULL argument");
    const char *p = data, *end = p + len;
    static const char magic[] = "kiln-tokenizer 1 ";
    if (len < sizeof magic - 1 || memcmp(p, magic, sizeof magic - 1) != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "serialized tokenizer: bad header (expected \"kiln-tokenizer 1\")");
    p += sizeof magic - 1;
    bool vocab;
    if (end - p >= 6 && memcmp(p, "vocab ", 6) == 0) {
        vocab = true;
        p += 6;
    } else if (end - p >= 3 && memcmp(p, "hf ", 3) == 0) {
        vocab = false;
        p += 3;
    } else {
        return kiln_fail(KILN_ERROR_FORMAT, "serialized tokenizer: unknown source kind");
    }
    long bos, eos;
    if (!parse_int(&p, end, &bos) || p >= end || *p++ != ' ' || !parse_int(&p, end, &eos) || p >= end ||
        *p++ != '\n')
        return kiln_fail(KILN_ERROR_FORMAT, "serialized tokenizer: bad bos/eos in the header");
    kiln_tokenizer *t;
    KILN_TRY(vocab ? tok_build_from_vocab_json(p, (size_t)(end - p), &t)
                   : tok_build_from_json_text(p, (size_t)(end - p), &t));
    if (bos < -1 || eos < -1 || bos > INT32_MAX || eos > INT32_MAX) {
        kiln_tokenizer_free(t);
        return kiln_fail(KILN_ERROR_FORMAT, "serialized tokenizer: bos/eos out of range");
    }
    kiln_status st = kiln_tokenizer_set_bos_eos(t, (int32_t)bos, (int32_t)eos);
    if (st != KILN_OK) {
        kiln_tokenizer_free(t);
        return kiln_fail_context(KILN_ERROR_FORMAT, "serialized tokenizer");
    }
    *out = t;
    return KILN_OK;
}

/* ---- loading files ------------------------------------------------------------------------ */

static kiln_status read_file(const char *path, char **data, size_t *len)
{
    FILE *f;
    size_t size;
    if (kiln_file_fopen_read(path, &f, &size) != KILN_OK)
        return kiln_fail_context(KILN_ERROR_IO, "tokenizer");
    buf b = {0};
    char chunk[65536];
    size_t n;
    kiln_status st = KILN_OK;
    while (st == KILN_OK && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        st = buf_put(&b, chunk, n);
    if (st == KILN_OK && ferror(f))
        st = kiln_fail(KILN_ERROR_IO, "tokenizer: cannot read \"%s\"", path);
    fclose(f);
    if (st == KILN_OK)
        st = buf_put(&b, "", 1);
    if (st != KILN_OK) {
        free(b.p);
        return st;
    }
    *data = b.p;
    *len = b.len - 1;
    return KILN_OK;
}

kiln_status kiln_tokenizer_load_json(const char *path, kiln_tokenizer **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_load_json: NULL argument");
    char *data;
    size_t len;
    KILN_TRY(read_file(path, &data, &len));
    kiln_status st = tok_build_from_json_text(data, len, out);
    free(data);
    if (st != KILN_OK)
        return kiln_fail_context(st, "%s", path);
    return KILN_OK;
}

kiln_status kiln_tokenizer_load_json_memory(const void *data, size_t len, kiln_tokenizer **out)
{
    if (!data || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_load_json_memory: NULL argument");
    return tok_build_from_json_text(data, len, out);
}

kiln_status kiln_tokenizer_load_llama2c(const char *path, int32_t vocab_size, kiln_tokenizer **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_tokenizer_load_llama2c: NULL argument");
    char *data;
    size_t len;
    KILN_TRY(read_file(path, &data, &len));
    kiln_status st = kiln_tokenizer_load_llama2c_memory(data, len, vocab_size, out);
    free(data);
    if (st != KILN_OK)
        return kiln_fail_context(st, "%s", path);
    return KILN_OK;
}
