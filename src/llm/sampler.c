/* Sampling (sampler.h). */
#include "llm/sampler.h"

#include <math.h>
#include <string.h>

/* ---- PRNG ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kiln_rng_seed(kiln_rng *rng, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        rng->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kiln_rng_next(kiln_rng *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double kiln_rng_uniform(kiln_rng *rng) { return (double)(kiln_rng_next(rng) >> 11) * 0x1.0p-53; }

/* ---- penalties ------------------------------------------------------------------- */

void kiln_sampler_penalize(float *logits, int32_t vocab, const kiln_llm_sampling *p, const uint8_t *seen,
                           const int32_t *count)
{
    for (int32_t i = 0; i < vocab; i++)
        logits[i] = kiln_sampler_penalty(logits[i], seen ? seen[i] : 0, count ? count[i] : 0, p);
}

/* ---- filtering --------------------------------------------------------------------- */

/* Sixteen running (max, first index) pairs in vector registers (SSE on a
 * baseline x86-64) over interleaved elements, then the best of them: a
 * single running index would make every step wait on the load of
 * logits[best] (~9 cycles an element, 0.2 ms for a 49k vocabulary), and
 * four independent vectors hide the compare-and-select latency. Ties keep
 * the lower index and NaN never wins, as a strict `>` scan from element
 * 0 does. */
#define ARGMAX_VECS 4
typedef float argmax_f4 __attribute__((vector_size(16)));
typedef int32_t argmax_i4 __attribute__((vector_size(16)));

int32_t kiln_sampler_argmax(const float *logits, int32_t vocab)
{
    enum { W = 4 * ARGMAX_VECS };
    argmax_f4 best[ARGMAX_VECS], x;
    argmax_i4 at[ARGMAX_VECS], idx[ARGMAX_VECS], take;
    for (int v = 0; v < ARGMAX_VECS; v++) {
        best[v] = (argmax_f4){0} + logits[0];
        at[v] = (argmax_i4){0};
        idx[v] = (argmax_i4){0, 1, 2, 3} + 4 * v;
    }
    int32_t i = 0;
    for (; i + W <= vocab; i += W)
        for (int v = 0; v < ARGMAX_VECS; v++) {
            memcpy(&x, logits + i + 4 * v, sizeof x);
            take = x > best[v];
            best[v] = (argmax_f4)(((argmax_i4)x & take) | ((argmax_i4)best[v] & ~take));
            at[v] = (idx[v] & take) | (at[v] & ~take);
            idx[v] += W;
        }
    float b[W];
    int32_t a[W];
    memcpy(b, best, sizeof b);
    memcpy(a, at, sizeof a);
    for (int k = 0; i + k < vocab; k++)
        if (logits[i + k] > b[k])
            b[k] = logits[i + k], a[k] = i + k;
    int r = 0;
    for (int k = 1; k < W; k++)
        if (b[k] > b[r] || (b[k] == b[r] && a[k] < a[r]))
            r = k;
    return a[r];
}

/* Descending by logit, ties by id, so results do not depend on the sort. */
static int before(const kiln_candidate *a, const kiln_candidate *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static void swap(kiln_candidate *a, kiln_candidate *b)
{
    kiln_candidate t = *a;
    *a = *b;
    *b = t;
}

/* Hoare-style partition around the median of three; returns the pivot's
 * final index. Written out because libc qsort may allocate. */
static int32_t partition(kiln_candidate *c, int32_t lo, int32_t hi)
{
    int32_t mid = lo + (hi - lo) / 2;
    if (before(&c[mid], &c[lo]))
        swap(&c[mid], &c[lo]);
    if (before(&c[hi], &c[lo]))
        swap(&c[hi], &c[lo]);
    if (before(&c[hi], &c[mid]))
        swap(&c[hi], &c[mid]);
    swap(&c[mid], &c[hi]);
    kiln_candidate pivot = c[hi];
    int32_t store = lo;
    for (int32_t i = lo; i < hi; i++)
        if (before(&c[i], &pivot))
            swap(&c[i], &c[store++]);
    swap(&c[store], &c[hi]);
    return store;
}

/* Sorts c[lo..hi] so that c[0..k) are the k first in order, sorted. */
static void partial_sort(kiln_candidate *c, int32_t lo, int32_t hi, int32_t k)
{
    while (lo < hi) {
        if (hi - lo < 16) {
            for (int32_t i = lo + 1; i <= hi; i++)
                for (int32_t j = i; j > lo && before(&c[j], &c[j - 1]); j--)
                    swap(&c[j], &c[j - 1]);
            return;
        }
        int32_t p = partition(c, lo, hi);
        /* Recurse into the smaller side to bound the stack. */
        if (p - lo < hi - p) {
            partial_sort(c, lo, p - 1, k);
            if (p + 1 >= k)
                return;
            lo = p + 1;
        } else {
            if (p + 1 < k)
                partial_sort(c, p + 1, hi, k);
            hi = p - 1;
        }
    }
}

int32_t kiln_sampler_filter(const float *logits, int32_t vocab, const kiln_llm_sampling *p, kiln_candidate *c)
{
    float inv_t = 1.0f / p->temperature;
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++)
        if (logits[i] != -INFINITY)
            c[n++] = (kiln_candidate){logits[i] * inv_t, i};
    if (n == 0) {
        c[0] = (kiln_candidate){1.0f, kiln_sampler_argmax(logits, vocab)};
        return 1;
    }
    int32_t k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    int need_order = k < n || (p->top_p > 0.0f && p->top_p < 1.0f);
    if (need_order)
        partial_sort(c, 0, n - 1, k);
    else /* min-p and the draw need only the maximum first */
        for (int32_t i = 1; i < n; i++)
            if (before(&c[i], &c[0]))
                swap(&c[i], &c[0]);
    n = k;
    float max = c[0].logit;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        c[i].logit = expf(c[i].logit - max);
        sum += c[i].logit;
    }
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        /* Keep a token while the tokens before it hold less than top_p, as
         * HF's TopPLogitsWarper (which removes cum-from-below <= 1 - p). */
        double cum = 0.0;
        int32_t keep = 0;
        while (keep < n && cum < (double)p->top_p * sum)
            cum += c[keep++].logit;
        n = keep > 0 ? keep : 1;
        sum = cum;
    }
    if (p->min_p > 0.0f) {
        /* c[0] holds the largest probability, exp(0) = 1 before scaling. */
        float threshold = p->min_p * c[0].logit;
        int32_t keep = 0;
        double kept = 0.0;
        for (int32_t i = 0; i < n; i++)
            if (c[i].logit >= threshold) {
                c[keep] = c[i];
                kept += c[keep++].logit;
            }
        n = keep;
        sum = kept;
    }
    for (int32_t i = 0; i < n; i++)
        c[i].logit = (float)(c[i].logit / sum);
    return n;
}

int32_t kiln_sampler_draw(const kiln_candidate *c, int32_t n, double u)
{
    double cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += c[i].logit;
        if (u < cum)
            return c[i].id;
    }
    return c[n - 1].id;
}

int32_t kiln_sampler_sample(const float *logits, int32_t vocab, const kiln_llm_sampling *p, kiln_rng *rng,
                            kiln_candidate *scratch)
{
    if (!(p->temperature > 0.0f))
        return kiln_sampler_argmax(logits, vocab);
    int32_t n = kiln_sampler_filter(logits, vocab, p, scratch);
    return kiln_sampler_draw(scratch, n, kiln_rng_uniform(rng));
}

/* ---- the uniform as a step input ------------------------------------------------------ */

void kiln_sampler_uniform_bits(kiln_rng *rng, int32_t out[2])
{
    uint64_t r = kiln_rng_next(rng) >> 11;
    out[0] = (int32_t)(uint32_t)(r >> 32);
    out[1] = (int32_t)(uint32_t)r;
}

double kiln_sampler_uniform_from_bits(const int32_t bits[2])
{
    uint64_t r = (uint64_t)(uint32_t)bits[0] << 32 | (uint32_t)bits[1];
    return (double)r * 0x1.0p-53;
}
