/* Unicode NFC (the normalizer Qwen2's tokenizer.json names) over the
 * tables of tokenizer_nfc_data.c, generated from the Unicode Character
 * Database by tools/gen_nfc_tables.py. */
#include <stdlib.h>
#include <string.h>

#include "llm/tokenizer_internal.h"

/* ---- lookups in the generated tables ---- */

static unsigned nfc_ccc(uint32_t cp)
{
    size_t lo = 0, hi = tok_nfc_n_ccc_runs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < tok_nfc_ccc_runs[mid][0])
            hi = mid;
        else if (cp > tok_nfc_ccc_runs[mid][1])
            lo = mid + 1;
        else
            return tok_nfc_ccc_runs[mid][2];
    }
    return 0;
}

/* The full canonical decomposition (Hangul excluded), NULL when none. */
static const uint32_t *nfc_decomp(uint32_t cp, size_t *n)
{
    size_t lo = 0, hi = tok_nfc_n_decomp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < tok_nfc_decomp_index[mid][0]) {
            hi = mid;
        } else if (cp > tok_nfc_decomp_index[mid][0]) {
            lo = mid + 1;
        } else {
            *n = tok_nfc_decomp_index[mid][2];
            return tok_nfc_decomp_pool + tok_nfc_decomp_index[mid][1];
        }
    }
    return NULL;
}

/* The primary composite of a + b (Hangul excluded), 0 when none. */
static uint32_t nfc_table_compose(uint32_t a, uint32_t b)
{
    uint64_t key = ((uint64_t)a << 21) | b;
    size_t lo = 0, hi = tok_nfc_n_comp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (key < tok_nfc_comp_keys[mid])
            hi = mid;
        else if (key > tok_nfc_comp_keys[mid])
            lo = mid + 1;
        else
            return tok_nfc_comp_values[mid];
    }
    return 0;
}

/* ---- the algorithm ---- */

/* Hangul syllables decompose and compose by arithmetic (Unicode 3.12). */
enum {
    HANGUL_S = 0xAC00,
    HANGUL_L = 0x1100,
    HANGUL_V = 0x1161,
    HANGUL_T = 0x11A7,
    HANGUL_NV = 21,
    HANGUL_NT = 28,
    HANGUL_COUNT = 11172
};

static uint32_t nfc_compose(uint32_t a, uint32_t b)
{
    if (a >= HANGUL_L && a < HANGUL_L + 19 && b >= HANGUL_V && b < HANGUL_V + HANGUL_NV)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_NV + (b - HANGUL_V)) * HANGUL_NT;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_COUNT && (a - HANGUL_S) % HANGUL_NT == 0 && b > HANGUL_T &&
        b < HANGUL_T + HANGUL_NT)
        return a + (b - HANGUL_T);
    return nfc_table_compose(a, b);
}

typedef struct nfc_char {
    uint32_t cp;
    unsigned ccc;
} nfc_char;

/* Unicode NFC: full canonical decomposition, canonical ordering, then
 * canonical composition. */
kiln_status tok_nfc(const tok_buf *in, tok_buf *out)
{
    /* Below U+0300 (lead bytes under 0xCC) nothing decomposes or combines. */
    bool simple = true;
    for (size_t i = 0; i < in->len && simple; i++)
        simple = (unsigned char)in->p[i] < 0xCC;
    if (simple)
        return tok_buf_put(out, in->p, in->len);
    size_t cap = 0, n = 0;
    nfc_char *v = NULL;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < in->len && st == KILN_OK;) {
        size_t k;
        uint32_t cp = tok_utf8_decode((const unsigned char *)in->p + i, &k);
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
            const uint32_t *dd = nfc_decomp(cp, &m);
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
            v[n++] = (nfc_char){d[j], nfc_ccc(d[j])};
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
        st = tok_buf_put(out, enc, tok_utf8_encode(v[i].cp, enc));
    }
    free(v);
    return st;
}
