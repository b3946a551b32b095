/* The BPE model: one pre-tokenized word to ids, by merge rank (or by
 * merged-token score for SentencePiece vocabularies). */
#include <stdlib.h>
#include <string.h>

#include "llm/tokenizer_internal.h"

static bool cand_less(const tok_bpe_cand *a, const tok_bpe_cand *b)
{
    return a->prio < b->prio || (a->prio == b->prio && a->pos < b->pos);
}

/* A 4-ary min-heap: half the depth of a binary one, and the children of a
 * node share cache lines, which matters for one long word (SentencePiece
 * models without a pre-tokenizer see the whole text as one). */
static kiln_status heap_push(tok_bpe *c, tok_bpe_cand e)
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

static tok_bpe_cand heap_pop(tok_bpe *c)
{
    tok_bpe_cand top = c->heap[0], last = c->heap[--c->n_heap];
    size_t i = 0, n = c->n_heap;
    for (;;) {
        size_t first = 4 * i + 1, m = i;
        const tok_bpe_cand *best = &last;
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
static kiln_status queue_pair(tok_bpe *c, int32_t pos)
{
    const kiln_tokenizer *t = c->t;
    int32_t nx = c->syms[pos].next;
    if (nx < 0)
        return KILN_OK;
    int32_t a = c->syms[pos].id, b = c->syms[nx].id;
    if (t->use_scores) {
        const tok_entry *ea = &t->tokens[a], *eb = &t->tokens[b];
        c->tmp.len = 0;
        KILN_TRY(tok_buf_put(&c->tmp, t->arena + ea->off, ea->len));
        KILN_TRY(tok_buf_put(&c->tmp, t->arena + eb->off, eb->len));
        int32_t m = tok_map_get(t, &t->vocab, c->tmp.p, c->tmp.len);
        if (m < 0)
            return KILN_OK;
        return heap_push(c, (tok_bpe_cand){-(double)t->tokens[m].score, pos, a, b, m});
    }
    const tok_merge_slot *ms = tok_merge_get(&t->merges, a, b);
    if (!ms)
        return KILN_OK;
    return heap_push(c, (tok_bpe_cand){(double)ms->rank, pos, a, b, ms->merged});
}

static kiln_status add_sym(tok_bpe *c, int32_t id)
{
    VEC_GROW(c->syms, c->n_syms, c->cap_syms, "symbols");
    int32_t i = (int32_t)c->n_syms;
    c->syms[c->n_syms++] = (tok_bpe_sym){id, i - 1, -1, true};
    if (i > 0)
        c->syms[i - 1].next = i;
    return KILN_OK;
}

/* One pre-tokenized word through the BPE model, as HF's merge_word +
 * merge_all: characters (unknown ones as <0xXX> bytes or unk), then merges
 * by rank (or by score), lowest first and leftmost on ties. */
static kiln_status bpe_one(tok_bpe *c, const char *w, size_t len)
{
    const kiln_tokenizer *t = c->t;
    if (len == 0)
        return KILN_OK;
    if (t->ignore_merges) {
        int32_t id = tok_map_get(t, &t->vocab, w, len);
        if (id >= 0)
            return tok_ids_push(c->out, id);
    }
    c->n_syms = 0;
    c->n_heap = 0;
    bool pending_unk = false;
    for (size_t i = 0; i < len;) {
        size_t n;
        tok_utf8_decode((const unsigned char *)w + i, &n);
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
        tok_bpe_cand e = heap_pop(c);
        tok_bpe_sym *l = &c->syms[e.pos];
        if (!l->alive || l->id != e.left || l->next < 0 || c->syms[l->next].id != e.right)
            continue;
        tok_bpe_sym *r = &c->syms[l->next];
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
        KILN_TRY(tok_ids_push(c->out, c->syms[i].id));
    return KILN_OK;
}

static const char SPM_SPACE[] = "\xE2\x96\x81"; /* U+2581 */

static bool is_spm_space(const char *s) { return memcmp(s, SPM_SPACE, 3) == 0; }

kiln_status tok_bpe_word(tok_bpe *c, const char *w, size_t len)
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

void tok_bpe_free(tok_bpe *c)
{
    free(c->syms);
    free(c->heap);
    free(c->tmp.p);
}
