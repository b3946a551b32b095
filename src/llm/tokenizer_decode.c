/* Decoding ids to text: the per-token decoders, the strip after Fuse and
 * UTF-8 repair, one token at a time (streams) or all at once. */
#include <stdlib.h>
#include <string.h>

#include "llm/tokenizer_internal.h"

/* ---- decoding -------------------------------------------------------------------- */

struct kiln_tokenizer_stream {
    const kiln_tokenizer *t;
    uint32_t flags;
    size_t n_out;        /* tokens passed to the decoders so far */
    uint32_t strip_left; /* leading strip-content chars still to drop */
    tok_buf held;        /* trailing strip-content chars held for the final strip */
    uint32_t held_count;
    tok_buf pending; /* an incomplete UTF-8 sequence */
    tok_buf out;
    tok_buf tok; /* scratch: one token's bytes */
    tok_buf tmp;
};

static bool has_prefix(const char *s, size_t len, const char *p, size_t plen)
{
    return plen && len >= plen && memcmp(s, p, plen) == 0;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Runs the per-token decoders on the token in s->tok. */
static kiln_status decode_token(kiln_tokenizer_stream *s, bool first)
{
    const kiln_tokenizer *t = s->t;
    const tok_byte_tables *bt = tok_byte_tables_get();
    bool fused = false;
    for (size_t i = 0; i < t->n_decs; i++) {
        const tok_decoder *d = &t->decs[i];
        tok_buf *b = &s->tok;
        s->tmp.len = 0;
        switch (d->kind) {
        case TOK_DEC_FUSE: fused = true; continue;
        case TOK_DEC_BYTELEVEL: {
            /* All characters map back to bytes, or the token stays as is. */
            bool ok = true;
            for (size_t j = 0; j < b->len && ok;) {
                /* An earlier decoder (ByteFallback) may have left raw bytes. */
                int r = tok_utf8_seq((const unsigned char *)b->p + j, b->len - j);
                size_t n;
                uint32_t cp = r > 0 ? tok_utf8_decode((const unsigned char *)b->p + j, &n) : 0x110000;
                if (cp >= 324 || bt->dec[cp] < 0) {
                    ok = false;
                    break;
                }
                char byte = (char)bt->dec[cp];
                KILN_TRY(tok_buf_put(&s->tmp, &byte, 1));
                j += n;
            }
            if (!ok)
                continue;
            break;
        }
        case TOK_DEC_REPLACE:
            for (size_t j = 0; j < b->len;) {
                if (has_prefix(b->p + j, b->len - j, d->a, d->a_len)) {
                    KILN_TRY(tok_buf_put(&s->tmp, d->b, d->b_len));
                    j += d->a_len;
                } else {
                    KILN_TRY(tok_buf_put(&s->tmp, b->p + j, 1));
                    j++;
                }
            }
            break;
        case TOK_DEC_BYTEFALLBACK:
            if (b->len == 6 && memcmp(b->p, "<0x", 3) == 0 && b->p[5] == '>' && hexval(b->p[3]) >= 0 &&
                hexval(b->p[4]) >= 0) {
                char byte = (char)(hexval(b->p[3]) * 16 + hexval(b->p[4]));
                KILN_TRY(tok_buf_put(&s->tmp, &byte, 1));
                break;
            }
            continue;
        case TOK_DEC_STRIP: {
            if (fused)
                continue; /* the whole-text strip, done by the stream */
            if (!b->len)  /* an empty piece (its p may be NULL): nothing to strip */
                break;
            size_t a = 0, e = b->len;
            for (uint32_t k = 0; k < d->start && has_prefix(b->p + a, e - a, d->a, d->a_len); k++)
                a += d->a_len;
            for (uint32_t k = 0; k < d->stop && e - a >= d->a_len && memcmp(b->p + e - d->a_len, d->a, d->a_len) == 0;
                 k++)
                e -= d->a_len;
            KILN_TRY(tok_buf_put(&s->tmp, b->p + a, e - a));
            break;
        }
        case TOK_DEC_METASPACE: {
            /* HF drops every replacement char of the first token (after Fuse
             * all tokens are the first). */
            bool drop = (first || fused) && d->strip_first;
            for (size_t j = 0; j < b->len;) {
                if (has_prefix(b->p + j, b->len - j, d->a, d->a_len)) {
                    if (!drop)
                        KILN_TRY(tok_buf_put(&s->tmp, " ", 1));
                    j += d->a_len;
                } else {
                    KILN_TRY(tok_buf_put(&s->tmp, b->p + j, 1));
                    j++;
                }
            }
            break;
        }
        }
        tok_buf swap = s->tok;
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
    KILN_TRY(tok_buf_put(&s->pending, p, n));
    const unsigned char *u = (const unsigned char *)s->pending.p;
    size_t i = 0, len = s->pending.len;
    while (i < len) {
        int r = tok_utf8_seq(u + i, len - i);
        if (r > 0) {
            KILN_TRY(tok_buf_put(&s->out, u + i, (size_t)r));
            i += (size_t)r;
        } else if (r < 0) {
            KILN_TRY(tok_buf_put(&s->out, REPLACEMENT_CHAR, 3));
            i += (size_t)-r;
        } else if (final) {
            KILN_TRY(tok_buf_put(&s->out, REPLACEMENT_CHAR, 3));
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
        KILN_TRY(tok_buf_put(&s->held, c, cl));
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
    KILN_TRY(tok_buf_reserve(&s->out, 1));
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
    KILN_TRY(tok_buf_put(&s->tok, t->arena + e->off, e->len));
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
    tok_buf all = {0};
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n_ids && st == KILN_OK; i++) {
        s->out.len = 0;
        st = stream_token(s, ids[i]);
        if (st == KILN_OK)
            st = tok_buf_put(&all, s->out.p, s->out.len);
    }
    const char *tail = NULL;
    size_t tail_len = 0;
    if (st == KILN_OK)
        st = kiln_tokenizer_stream_finish(s, &tail, &tail_len);
    if (st == KILN_OK)
        st = tok_buf_put(&all, tail, tail_len + 1);
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
