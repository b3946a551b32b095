/* Regex matching into spans (shared with the pre-tokenizers) and the
 * normalizers: Prepend, Replace (literal or regex), NFC. */
#include <stdlib.h>
#include <string.h>

#include "llm/tokenizer_internal.h"

kiln_status tok_matcher_init(tok_matcher *m)
{
    m->md = pcre2_match_data_create(4, NULL);
    return m->md ? KILN_OK : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tokenizer: out of memory");
}

void tok_matcher_free(tok_matcher *m)
{
    pcre2_match_data_free(m->md);
    free(m->spans);
    free(m->norm[0].p);
    free(m->norm[1].p);
}

kiln_status tok_find_matches(tok_matcher *m, const pcre2_code *re, const char *s, size_t len)
{
    m->n_spans = 0;
    size_t prev = 0, at = 0;
    while (at <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, m->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            /* Match or depth limits of a pathological pattern, mostly. */
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kiln_fail(KILN_ERROR_LIMIT, "tokenizer: regex match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(m->md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms || me > len)
            return kiln_fail(KILN_ERROR_INTERNAL, "tokenizer: regex reported a bad match");
        if (ms != prev) {
            VEC_GROW(m->spans, m->n_spans, m->cap_spans, "splits");
            m->spans[m->n_spans++] = (tok_span){prev, ms, false};
        }
        VEC_GROW(m->spans, m->n_spans, m->cap_spans, "splits");
        m->spans[m->n_spans++] = (tok_span){ms, me, true};
        prev = me;
        if (me == ms) {
            /* An empty match: step over one character. */
            if (me >= len)
                break;
            size_t n;
            tok_utf8_decode((const unsigned char *)s + me, &n);
            at = me + n;
        } else {
            at = me;
        }
    }
    if (prev != len) {
        VEC_GROW(m->spans, m->n_spans, m->cap_spans, "splits");
        m->spans[m->n_spans++] = (tok_span){prev, len, false};
    }
    return KILN_OK;
}

static kiln_status run_normalizer(tok_matcher *m, const tok_normalizer *nm, const tok_buf *in, tok_buf *out)
{
    out->len = 0;
    if (nm->kind == TOK_NORM_NFC)
        return tok_nfc(in, out);
    if (nm->kind == TOK_NORM_PREPEND) {
        if (in->len)
            KILN_TRY(tok_buf_put(out, nm->a, nm->a_len));
        return tok_buf_put(out, in->p, in->len);
    }
    if (nm->re) {
        KILN_TRY(tok_find_matches(m, nm->re, in->p ? in->p : "", in->len));
        for (size_t i = 0; i < m->n_spans; i++) {
            if (m->spans[i].match)
                KILN_TRY(tok_buf_put(out, nm->b, nm->b_len));
            else
                KILN_TRY(tok_buf_put(out, in->p + m->spans[i].start, m->spans[i].end - m->spans[i].start));
        }
        return KILN_OK;
    }
    size_t i = 0;
    while (i < in->len) {
        if (in->len - i >= nm->a_len && memcmp(in->p + i, nm->a, nm->a_len) == 0) {
            KILN_TRY(tok_buf_put(out, nm->b, nm->b_len));
            i += nm->a_len;
        } else {
            KILN_TRY(tok_buf_put(out, in->p + i, 1));
            i++;
        }
    }
    return KILN_OK;
}

kiln_status tok_normalize(const kiln_tokenizer *t, tok_matcher *m, const char *s, size_t len, tok_buf **result)
{
    tok_buf *cur = &m->norm[0];
    cur->len = 0;
    KILN_TRY(tok_buf_put(cur, s, len));
    for (size_t i = 0; i < t->n_norms; i++) {
        tok_buf *next = cur == &m->norm[0] ? &m->norm[1] : &m->norm[0];
        KILN_TRY(run_normalizer(m, &t->norms[i], cur, next));
        cur = next;
    }
    *result = cur;
    return KILN_OK;
}
