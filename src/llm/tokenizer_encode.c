/* The encode pipeline, as Hugging Face tokenizers runs it: added-token
 * split, normalizers, pre-tokenizers, the BPE model, the template. */
#include <stdlib.h>
#include <string.h>

#include "llm/tokenizer_internal.h"

typedef struct piece {
    size_t off, len;
    bool at_start; /* begins at offset 0 of the original text (Metaspace "first") */
} piece;

typedef struct piece_list {
    tok_buf text;
    piece *v;
    size_t n, cap;
} piece_list;

typedef struct enc_ctx {
    const kiln_tokenizer *t;
    uint32_t flags;
    tok_ids ids;
    piece_list lists[2];
    tok_buf tmp;
    tok_matcher m;
    tok_bpe bpe;
} enc_ctx;

static kiln_status add_piece(piece_list *l, const char *s, size_t len, bool at_start)
{
    if (len == 0)
        return KILN_OK;
    VEC_GROW(l->v, l->n, l->cap, "pieces");
    l->v[l->n++] = (piece){l->text.len, len, at_start};
    return tok_buf_put(&l->text, s, len);
}

/* HF's SplitDelimiterBehavior over the spans, in place. */
static void apply_behavior(enc_ctx *c, tok_split_behavior bh, bool invert)
{
    tok_span *sp = c->m.spans;
    size_t n = c->m.n_spans, k = 0;
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
        c->m.n_spans = k;
        break;
    case TOK_SPLIT_MERGED_PREV: {
        bool prev_match = false;
        for (size_t i = 0; i < n; i++) {
            tok_span s = sp[i];
            if (s.match && !prev_match && k > 0)
                sp[k - 1].end = s.end;
            else
                sp[k++] = (tok_span){s.start, s.end, false};
            prev_match = s.match;
        }
        c->m.n_spans = k;
        break;
    }
    case TOK_SPLIT_MERGED_NEXT: {
        /* Walk backwards, then the kept spans are at the end in reverse. */
        bool prev_match = false;
        size_t w = n;
        for (size_t i = n; i-- > 0;) {
            tok_span s = sp[i];
            if (s.match && !prev_match && w < n)
                sp[w].start = s.start;
            else
                sp[--w] = (tok_span){s.start, s.end, false};
            prev_match = s.match;
        }
        memmove(sp, sp + w, (n - w) * sizeof *sp);
        c->m.n_spans = n - w;
        break;
    }
    case TOK_SPLIT_CONTIGUOUS: {
        bool prev_match = false;
        for (size_t i = 0; i < n; i++) {
            tok_span s = sp[i];
            if (s.match == prev_match && k > 0)
                sp[k - 1].end = s.end;
            else
                sp[k++] = (tok_span){s.start, s.end, false};
            prev_match = s.match;
        }
        c->m.n_spans = k;
        break;
    }
    }
}

static kiln_status split_piece(enc_ctx *c, piece_list *out, const char *s, size_t len, bool at_start,
                               const pcre2_code *re, tok_split_behavior bh, bool invert)
{
    KILN_TRY(tok_find_matches(&c->m, re, s, len));
    apply_behavior(c, bh, invert);
    for (size_t i = 0; i < c->m.n_spans; i++)
        KILN_TRY(add_piece(out, s + c->m.spans[i].start, c->m.spans[i].end - c->m.spans[i].start,
                           at_start && c->m.spans[i].start == 0));
    return KILN_OK;
}

static kiln_status run_pretokenizer(enc_ctx *c, const tok_pretokenizer *p, const piece_list *in, piece_list *out)
{
    out->n = 0;
    out->text.len = 0;
    const tok_byte_tables *bt = tok_byte_tables_get();
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->text.p + in->v[i].off;
        size_t len = in->v[i].len;
        bool at_start = in->v[i].at_start;
        switch (p->kind) {
        case TOK_PRE_SPLIT: KILN_TRY(split_piece(c, out, s, len, at_start, p->re, p->behavior, p->invert)); break;
        case TOK_PRE_BYTELEVEL: {
            c->tmp.len = 0;
            if (p->add_prefix_space && (len == 0 || s[0] != ' '))
                KILN_TRY(tok_buf_put(&c->tmp, " ", 1));
            KILN_TRY(tok_buf_put(&c->tmp, s, len));
            /* Split, then map every byte of each piece to its character. */
            if (p->re) {
                KILN_TRY(tok_find_matches(&c->m, p->re, c->tmp.p, c->tmp.len));
            } else {
                c->m.n_spans = 0;
                VEC_GROW(c->m.spans, c->m.n_spans, c->m.cap_spans, "splits");
                c->m.spans[c->m.n_spans++] = (tok_span){0, c->tmp.len, false};
            }
            for (size_t k = 0; k < c->m.n_spans; k++) {
                size_t a = c->m.spans[k].start, b = c->m.spans[k].end;
                if (a == b)
                    continue;
                VEC_GROW(out->v, out->n, out->cap, "pieces");
                size_t off = out->text.len;
                KILN_TRY(tok_buf_reserve(&out->text, (b - a) * 2));
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
                KILN_TRY(tok_buf_put(&c->tmp, p->replacement, p->replacement_len));
            for (size_t j = 0; j < len; j++) {
                if (s[j] == ' ')
                    KILN_TRY(tok_buf_put(&c->tmp, p->replacement, p->replacement_len));
                else
                    KILN_TRY(tok_buf_put(&c->tmp, s + j, 1));
            }
            if (!p->split) {
                KILN_TRY(add_piece(out, c->tmp.p, c->tmp.len, at_start));
                break;
            }
            /* Each piece starts at a replacement char (MergedWithNext). */
            size_t start = 0;
            for (size_t j = 1; j <= c->tmp.len; j++) {
                if (j == c->tmp.len || (c->tmp.len - j >= p->replacement_len &&
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
        KILN_TRY(tok_bpe_word(&c->bpe, pl->text.p + pl->v[i].off, pl->v[i].len));
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
                if (!tok_is_unicode_space(tok_utf8_decode((const unsigned char *)text + p, &n)))
                    break;
                start = p;
            }
        }
        if (attr & TOK_ATTR_RSTRIP) {
            while (end < len) {
                size_t n;
                if (!tok_is_unicode_space(tok_utf8_decode((const unsigned char *)text + end, &n)))
                    break;
                end += n;
            }
        }
        if (start > seg)
            KILN_TRY(normalized ? encode_words(c, text + seg, start - seg, at_start && seg == 0)
                                : encode_segment(c, text + seg, start - seg, seg == 0));
        KILN_TRY(tok_ids_push(&c->ids, a->id));
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
    tok_buf *norm;
    KILN_TRY(tok_normalize(c->t, &c->m, s, len, &norm));
    if (norm->len == 0)
        return KILN_OK;
    return split_added(c, &c->t->added_norm, norm->p, norm->len, at_start, true);
}

static void enc_ctx_free(enc_ctx *c)
{
    for (int i = 0; i < 2; i++) {
        free(c->lists[i].text.p);
        free(c->lists[i].v);
    }
    free(c->tmp.p);
    tok_matcher_free(&c->m);
    tok_bpe_free(&c->bpe);
    free(c->ids.v);
}

static kiln_status encode_all(enc_ctx *c, const char *text, size_t len)
{
    const kiln_tokenizer *t = c->t;
    if (c->flags & KILN_TOKENIZE_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_post_prefix; i++)
            KILN_TRY(tok_ids_push(&c->ids, t->post_prefix[i]));
    KILN_TRY(split_added(c, &t->added_raw, text, len, true, false));
    if (c->flags & KILN_TOKENIZE_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_post_suffix; i++)
            KILN_TRY(tok_ids_push(&c->ids, t->post_suffix[i]));
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
    c.bpe.t = tok;
    c.bpe.out = &c.ids;
    kiln_status st = tok_matcher_init(&c.m);
    if (st == KILN_OK)
        st = tok_ids_push(&c.ids, 0); /* so *ids is never NULL */
    if (st == KILN_OK) {
        c.ids.n = 0;
        st = encode_all(&c, text ? text : "", len);
    }
    if (st == KILN_OK) {
        *ids = c.ids.v;
        *n_ids = c.ids.n;
        c.ids.v = NULL;
    }
    enc_ctx_free(&c);
    return st;
}
