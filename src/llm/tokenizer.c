/* The tokenizer's vocabulary: the arena and maps, construction (what the
 * loaders call), and the vocabulary queries. The semantics follow Hugging
 * Face tokenizers (the reference the tests compare against, id for id). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "llm/tokenizer_internal.h"

const char tok_gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

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
static kiln_status map_put(kiln_tokenizer *t, tok_strmap *m, uint32_t off, uint32_t len, int32_t id, const char *what)
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

const tok_merge_slot *tok_merge_get(const tok_mergemap *m, int32_t a, int32_t b)
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
    tok_buf cat = {0};
    kiln_status st = tok_buf_put(&cat, left, llen);
    if (st == KILN_OK)
        st = tok_buf_put(&cat, right, rlen);
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

/* The normalized form of an added token's content, stored in the arena. */
static kiln_status normalize_content(kiln_tokenizer *t, const char *s, size_t len, uint32_t *off, uint32_t *out_len)
{
    tok_matcher m = {0};
    tok_buf *norm = NULL;
    kiln_status st = tok_matcher_init(&m);
    if (st == KILN_OK)
        st = tok_normalize(t, &m, s, len, &norm);
    if (st == KILN_OK && norm->len)
        st = arena_add(t, norm->p, norm->len, off);
    if (st == KILN_OK)
        *out_len = (uint32_t)norm->len;
    tok_matcher_free(&m);
    return st;
}
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
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "kiln_tokenizer_set_bos_eos: %s id %d is not in the vocabulary", i ? "eos" : "bos",
                             (int)v[i]);
    tok->bos_id = bos_id;
    tok->eos_id = eos_id;
    return KILN_OK;
}
