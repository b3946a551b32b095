/* Sampling: greedy, the exact sets top-k / top-p / min-p keep on hand-made
 * distributions (by the definitions in Hugging Face's logits warpers), the
 * penalty formulas, seeded reproducibility and the distribution of draws. */
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/npy.h"
#include "llm/sampler.h"
#include "sample_run.h"

static kiln_llm_sampling neutral(float temperature)
{
    kiln_llm_sampling p = {0};
    p.temperature = temperature;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

/* Logits whose softmax is exactly probs (log of each). */
static void logits_of(const double *probs, int n, float *out)
{
    for (int i = 0; i < n; i++)
        out[i] = probs[i] > 0 ? (float)log(probs[i]) : -INFINITY;
}

/* Sorted kept ids as a bitmask, and the kept probabilities by id. */
static unsigned kept_mask(const kiln_candidate *c, int32_t n, double *prob_by_id)
{
    unsigned m = 0;
    for (int32_t i = 0; i < n; i++) {
        m |= 1u << c[i].id;
        if (prob_by_id)
            prob_by_id[c[i].id] = c[i].logit;
    }
    return m;
}

static void test_greedy(void)
{
    float l[6] = {0.1f, 2.5f, -1.0f, 2.5f, 2.4f, -INFINITY};
    /* Argmax, first index on a tie. */
    CHECK(kiln_sampler_argmax(l, 6) == 1);
    kiln_llm_sampling p = neutral(0.0f);
    kiln_rng rng;
    kiln_rng_seed(&rng, 1);
    kiln_candidate c[6];
    CHECK(kiln_sampler_sample(l, 6, &p, &rng, c) == 1);
    /* top-k etc. do not matter at temperature 0. */
    p.top_k = 1;
    p.top_p = 0.1f;
    CHECK(kiln_sampler_sample(l, 6, &p, &rng, c) == 1);
}

/* The first index of the largest value, NaN never taken (and a NaN at
 * index 0 kept, as nothing compares greater): the definition, one element
 * at a time. */
static int32_t argmax_scan(const float *l, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

/* The vectorized argmax against the scan: lengths around its 16-element
 * stride, values from a small set (many ties), NaN and infinities mixed
 * in, the max in the tail, and a NaN first. */
static void test_argmax_scan(void)
{
    static const float pool[8] = {-1.0f, 0.5f, 2.0f, 2.0f, -INFINITY, INFINITY, NAN, -0.0f};
    float l[80];
    uint32_t x = 12345;
    int same = 1;
    for (int32_t n = 1; n <= 80; n++)
        for (int rep = 0; rep < 40; rep++) {
            for (int32_t i = 0; i < n; i++) {
                x = x * 1664525u + 1013904223u;
                /* infinities and NaN only in some rounds, so finite maxima are tested too */
                l[i] = pool[(x >> 24) % (rep % 2 ? 8 : 4)];
            }
            if (rep % 5 == 4)
                l[n - 1] = 3.0f;
            if (rep % 7 == 6)
                l[0] = NAN;
            same &= kiln_sampler_argmax(l, n) == argmax_scan(l, n);
        }
    CHECK(same);
}

static void test_top_k(void)
{
    const double probs[6] = {0.05, 0.30, 0.10, 0.25, 0.20, 0.10};
    float l[6];
    logits_of(probs, 6, l);
    kiln_llm_sampling p = neutral(1.0f);
    kiln_candidate c[6];
    double got[6] = {0};
    p.top_k = 3;
    int32_t n = kiln_sampler_filter(l, 6, &p, c);
    /* The three largest: ids 1 (0.30), 3 (0.25), 4 (0.20), renormalized over 0.75. */
    CHECK(n == 3 && kept_mask(c, n, got) == ((1u << 1) | (1u << 3) | (1u << 4)));
    CHECK(c[0].id == 1 && c[1].id == 3 && c[2].id == 4);
    CHECK_NEAR(got[1], 0.30 / 0.75, 1e-6);
    CHECK_NEAR(got[3], 0.25 / 0.75, 1e-6);
    CHECK_NEAR(got[4], 0.20 / 0.75, 1e-6);
    p.top_k = 1;
    n = kiln_sampler_filter(l, 6, &p, c);
    CHECK(n == 1 && c[0].id == 1 && c[0].logit == 1.0f);
    /* k >= vocab keeps everything. */
    p.top_k = 10;
    n = kiln_sampler_filter(l, 6, &p, c);
    CHECK(n == 6);
}

static void test_top_k_large_vocab(void)
{
    /* A permutation of distinct logits: top-k must be exactly the k largest
     * whatever the partition steps do. */
    enum { V = 1000 };
    static float l[V];
    static kiln_candidate c[V];
    for (int i = 0; i < V; i++)
        l[i] = (float)((i * 7919) % V) / 100.0f; /* 7919 is prime, coprime with 1000 */
    kiln_llm_sampling p = neutral(1.0f);
    p.top_k = 37;
    int32_t n = kiln_sampler_filter(l, V, &p, c);
    CHECK(n == 37);
    for (int32_t i = 0; i < n; i++) {
        /* The i-th kept has logit (V - 1 - i) / 100. */
        CHECK(l[c[i].id] == (float)(V - 1 - i) / 100.0f);
    }
}

static void test_top_p(void)
{
    const double probs[5] = {0.4, 0.3, 0.15, 0.1, 0.05};
    float l[5];
    logits_of(probs, 5, l);
    kiln_llm_sampling p = neutral(1.0f);
    kiln_candidate c[5];
    double got[5] = {0};
    /* HF: a token is removed when the mass of it and all less likely ones
     * is <= 1 - top_p. Cumulative from below: id 4 0.05, id 3 0.15, id 2
     * 0.30, id 1 0.60, id 0 1.0. top_p 0.65 removes those <= 0.35: 4, 3, 2. */
    p.top_p = 0.65f;
    int32_t n = kiln_sampler_filter(l, 5, &p, c);
    CHECK(n == 2 && kept_mask(c, n, got) == 0x3u);
    CHECK_NEAR(got[0], 0.4 / 0.7, 1e-6);
    CHECK_NEAR(got[1], 0.3 / 0.7, 1e-6);
    /* top_p 0.75 removes those <= 0.25: ids 4 and 3. */
    p.top_p = 0.75f;
    n = kiln_sampler_filter(l, 5, &p, c);
    CHECK(n == 3 && kept_mask(c, n, NULL) == 0x7u);
    /* A tiny top_p keeps the most likely token only. */
    p.top_p = 0.01f;
    n = kiln_sampler_filter(l, 5, &p, c);
    CHECK(n == 1 && c[0].id == 0);
    /* After top-k 4 (renormalized over 0.95) from below: id 3 0.105, id 2
     * 0.263, id 1 0.579; top_p 0.8 removes those <= 0.2: id 3 only. */
    p.top_k = 4;
    p.top_p = 0.8f;
    n = kiln_sampler_filter(l, 5, &p, c);
    CHECK(n == 3 && kept_mask(c, n, NULL) == 0x7u);
}

static void test_min_p(void)
{
    const double probs[5] = {0.5, 0.2, 0.15, 0.1, 0.05};
    float l[5];
    logits_of(probs, 5, l);
    kiln_llm_sampling p = neutral(1.0f);
    kiln_candidate c[5];
    double got[5] = {0};
    /* Keep p >= 0.25 * 0.5 = 0.125: ids 0, 1, 2. */
    p.min_p = 0.25f;
    int32_t n = kiln_sampler_filter(l, 5, &p, c);
    CHECK(n == 3 && kept_mask(c, n, got) == 0x7u);
    CHECK_NEAR(got[2], 0.15 / 0.85, 1e-6);
    /* Threshold 0.095: id 3 (0.1) joins. */
    p.min_p = 0.19f;
    n = kiln_sampler_filter(l, 5, &p, c);
    CHECK(n == 4 && kept_mask(c, n, NULL) == 0xFu);
}

static void test_temperature(void)
{
    const double probs[3] = {0.5, 0.3, 0.2};
    float l[3];
    logits_of(probs, 3, l);
    kiln_llm_sampling p = neutral(2.0f);
    kiln_candidate c[3];
    double got[3] = {0};
    int32_t n = kiln_sampler_filter(l, 3, &p, c);
    /* softmax(log p / 2) = sqrt(p) / sum sqrt(p). */
    double z = sqrt(0.5) + sqrt(0.3) + sqrt(0.2);
    CHECK(n == 3);
    kept_mask(c, n, got);
    for (int i = 0; i < 3; i++)
        CHECK_NEAR(got[i], sqrt(probs[i]) / z, 1e-6);
    /* As temperature -> 0 the draw is the argmax. */
    p.temperature = 1e-3f;
    kiln_rng rng;
    kiln_rng_seed(&rng, 7);
    for (int i = 0; i < 100; i++)
        CHECK(kiln_sampler_sample(l, 3, &p, &rng, c) == 0);
}

static void test_penalties(void)
{
    float l[5] = {2.0f, -2.0f, 1.0f, -1.0f, 0.5f};
    uint8_t seen[5] = {1, 1, 0, 1, 0};
    int32_t count[5] = {0, 3, 1, 0, 2};
    kiln_llm_sampling p = neutral(1.0f);
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    kiln_sampler_penalize(l, 5, &p, seen, count);
    /* HF repetition: seen and > 0 -> / 2, seen and <= 0 -> * 2; then
     * OpenAI: -= 0.5 * (count > 0) + 0.25 * count. */
    CHECK_NEAR(l[0], 1.0, 1e-6);               /* seen, 2/2, count 0 */
    CHECK_NEAR(l[1], -4.0 - 0.5 - 0.75, 1e-6); /* seen, -2*2, count 3 */
    CHECK_NEAR(l[2], 1.0 - 0.5 - 0.25, 1e-6);  /* unseen, count 1 */
    CHECK_NEAR(l[3], -2.0, 1e-6);              /* seen, -1*2 */
    CHECK_NEAR(l[4], 0.5 - 0.5 - 0.5, 1e-6);   /* unseen, count 2 */
    /* Neutral parameters change nothing. */
    float m[3] = {1.0f, -1.0f, 0.0f};
    uint8_t all[3] = {1, 1, 1};
    int32_t many[3] = {4, 4, 4};
    kiln_llm_sampling q = neutral(1.0f);
    kiln_sampler_penalize(m, 3, &q, all, many);
    CHECK(m[0] == 1.0f && m[1] == -1.0f && m[2] == 0.0f);
}

static void test_seeded_draws(void)
{
    const double probs[4] = {0.1, 0.2, 0.3, 0.4};
    float l[4];
    logits_of(probs, 4, l);
    kiln_llm_sampling p = neutral(1.0f);
    kiln_candidate c[4];
    kiln_rng a, b;
    kiln_rng_seed(&a, 1234);
    kiln_rng_seed(&b, 1234);
    int same = 1, hist[4] = {0};
    enum { N = 40000 };
    for (int i = 0; i < N; i++) {
        int32_t x = kiln_sampler_sample(l, 4, &p, &a, c), y = kiln_sampler_sample(l, 4, &p, &b, c);
        same &= x == y;
        hist[x]++;
    }
    CHECK(same);
    /* Frequencies within 5 standard deviations of the probabilities. */
    for (int i = 0; i < 4; i++) {
        double sd = sqrt(probs[i] * (1 - probs[i]) / N);
        CHECK_NEAR((double)hist[i] / N, probs[i], 5 * sd);
    }
    /* Another seed gives another sequence. */
    kiln_rng_seed(&a, 1234);
    kiln_rng_seed(&b, 1235);
    int differ = 0;
    for (int i = 0; i < 64; i++)
        differ |= kiln_rng_next(&a) != kiln_rng_next(&b);
    CHECK(differ);
    /* uniform stays in [0, 1). */
    for (int i = 0; i < 1000; i++) {
        double u = kiln_rng_uniform(&a);
        CHECK(u >= 0.0 && u < 1.0);
    }
}

static void test_xoshiro_reference(void)
{
    /* splitmix64 from seed 0 gives 0xe220a8397b1dcdaf first (Vigna's
     * reference splitmix64.c); it is the generator's first state word. */
    kiln_rng r;
    kiln_rng_seed(&r, 0);
    CHECK(r.s[0] == 0xe220a8397b1dcdafull);
    /* xoshiro256** output = rotl(s1 * 5, 7) * 9. */
    uint64_t s1 = r.s[1];
    uint64_t x = s1 * 5;
    uint64_t want = ((x << 7) | (x >> 57)) * 9;
    CHECK(kiln_rng_next(&r) == want);
}

/* The uniform the sampling layer takes as two i32 is kiln_rng_uniform's,
 * and the PRNG advances the same. */
static void test_uniform_bits(void)
{
    kiln_rng a, b;
    kiln_rng_seed(&a, 77);
    kiln_rng_seed(&b, 77);
    int same = 1;
    for (int i = 0; i < 1000; i++) {
        int32_t bits[2];
        kiln_sampler_uniform_bits(&a, bits);
        same &= kiln_sampler_uniform_from_bits(bits) == kiln_rng_uniform(&b);
    }
    CHECK(same && a.s[0] == b.s[0] && a.s[3] == b.s[3]);
}

/* Pseudo-random logits with ties and -inf entries, as models produce
 * (bf16 logits tie often). */
static void noisy_logits(float *l, int32_t n, uint64_t seed)
{
    kiln_rng r;
    kiln_rng_seed(&r, seed);
    for (int32_t i = 0; i < n; i++) {
        double u = kiln_rng_uniform(&r);
        l[i] = (float)floor(u * 64.0) / 8.0f - 4.0f;
        if (u < 0.02)
            l[i] = -INFINITY;
    }
}

/* The sampling layer (kiln/Sample) on the CPU draws exactly what
 * kiln_sampler_sample draws from the same PRNG state, for every mix of
 * parameters, rows of a batch independent. */
static void test_sample_layer_matches_sampler(void)
{
    enum { S = 4, V = 700, ROUNDS = 40 };
    sample_runner r;
    CHECK_OK(sample_runner_open(&r, KILN_BACKEND_CPU, S, V));
    if (!r.ctx) {
        sample_runner_close(&r);
        return;
    }
    static const kiln_llm_sampling mixes[] = {
        {.temperature = 0.0f, .top_p = 1.0f},
        {.temperature = 1.0f, .top_p = 1.0f},
        {.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f},
        {.temperature = 1.3f, .top_p = 0.5f},
        {.temperature = 0.9f, .top_k = 3, .top_p = 1.0f},
        {.temperature = 2.0f, .top_p = 1.0f, .min_p = 0.2f},
        {.temperature = 1.0f, .top_k = 10000, .top_p = 0.95f},
    };
    static float logits[S * V];
    float params[S * SAMPLE_PARAMS];
    int32_t seq[S * SAMPLE_SEQ], got[S];
    kiln_candidate c[V];
    int same = 1, draws = 0;
    for (size_t m = 0; m < sizeof mixes / sizeof mixes[0]; m++) {
        kiln_rng layer_rng[S], ref_rng[S];
        for (int s = 0; s < S; s++) {
            kiln_rng_seed(&layer_rng[s], 1000 * m + (uint64_t)s);
            ref_rng[s] = layer_rng[s];
        }
        for (int round = 0; round < ROUNDS; round++) {
            memset(params, 0, sizeof params);
            for (int s = 0; s < S; s++) {
                const kiln_llm_sampling *p = &mixes[(m + (size_t)s) % (sizeof mixes / sizeof mixes[0])];
                noisy_logits(logits + s * V, V, 31 * m + 7 * (uint64_t)round + (uint64_t)s);
                params[SAMPLE_PARAMS * s] = p->temperature;
                params[SAMPLE_PARAMS * s + 1] = (float)p->top_k;
                params[SAMPLE_PARAMS * s + 2] = p->top_p;
                params[SAMPLE_PARAMS * s + 3] = p->min_p;
                int32_t *sq = seq + SAMPLE_SEQ * s;
                sq[0] = sq[1] = 0;
                sq[2] = -1;
                sq[3] = 0;
                if (p->temperature > 0.0f)
                    kiln_sampler_uniform_bits(&layer_rng[s], sq);
            }
            sample_step st = {.S = S, .logits = logits, .params = params, .seq = seq};
            CHECK_OK(sample_runner_step(&r, &st, got));
            for (int s = 0; s < S; s++) {
                const kiln_llm_sampling *p = &mixes[(m + (size_t)s) % (sizeof mixes / sizeof mixes[0])];
                same &= got[s] == kiln_sampler_sample(logits + s * V, V, p, &ref_rng[s], c);
                draws++;
            }
        }
    }
    CHECK(same && draws == 7 * ROUNDS * S);
    /* Greedy ties go to the lowest id, also through the layer. */
    for (int32_t i = 0; i < V; i++)
        logits[i] = i == 5 || i == 9 ? 3.0f : 0.0f;
    memset(params, 0, sizeof params);
    seq[2] = -1;
    sample_step st = {.S = 1, .logits = logits, .params = params, .seq = seq};
    CHECK_OK(sample_runner_step(&r, &st, got));
    CHECK(got[0] == 5);
    sample_runner_close(&r);
}

/* One sequence as generation feeds it to the layer, beside the host's
 * reference: its prompt, its generated ids (seen; count), its PRNG. */
typedef struct pen_seq {
    kiln_llm_sampling p;
    int32_t ids[48];
    int32_t n_prompt, n_ids, n_fed, slot;
    uint8_t seen[300];
    int32_t count[300];
    kiln_rng layer_rng, ref_rng;
} pen_seq;

/* Penalties in the layer: two sequences with different penalties decoded
 * together through a state slot each, the prompt fed in two chunks, then a
 * third sequence reusing a slot. Every sampled id equals what the host
 * path (kiln_sampler_penalize over the sequence's history, then
 * kiln_sampler_sample) chooses from the same logits and PRNG state. */
static void test_sample_layer_penalties(void)
{
    enum { V = 300, STEPS = 24 };
    sample_runner r;
    CHECK_OK(sample_runner_open(&r, KILN_BACKEND_CPU, 4, V));
    if (!r.ctx) {
        sample_runner_close(&r);
        return;
    }
    static pen_seq q[3];
    memset(q, 0, sizeof q);
    q[0].p = (kiln_llm_sampling){.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.5f};
    q[1].p = (kiln_llm_sampling){.temperature = 0.8f,
                                 .top_k = 20,
                                 .top_p = 0.9f,
                                 .repetition_penalty = 1.2f,
                                 .presence_penalty = 0.5f,
                                 .frequency_penalty = 0.3f};
    q[2].p = (kiln_llm_sampling){.temperature = 1.0f, .top_p = 1.0f, .frequency_penalty = 1.0f};
    q[0].slot = 2, q[1].slot = 0, q[2].slot = 2;
    for (int k = 0; k < 3; k++) {
        q[k].n_prompt = q[k].n_ids = 6;
        for (int i = 0; i < 6; i++) {
            q[k].ids[i] = (int32_t)((k * 37 + i * 11) % V);
            q[k].seen[q[k].ids[i]] = 1;
        }
        kiln_rng_seed(&q[k].layer_rng, 50 + (uint64_t)k);
        q[k].ref_rng = q[k].layer_rng;
    }
    static float logits[2 * V], ref[V];
    float params[2 * SAMPLE_PARAMS];
    int32_t seq[2 * SAMPLE_SEQ], tokens[16], positions[16], qs[3], got[2];
    kiln_candidate c[V];
    int same = 1, sampled = 0;
    /* sequences 0 and 1 together, then 2 alone in 0's slot */
    for (int phase = 0; phase < 2; phase++) {
        pen_seq *rows[2] = {phase ? &q[2] : &q[1], phase ? NULL : &q[0]};
        int S = phase ? 1 : 2;
        for (int step = 0; step < STEPS; step++) {
            int32_t T = 0;
            qs[0] = 0;
            for (int s = 0; s < S; s++) {
                pen_seq *x = rows[s];
                /* the prompt in chunks of 4 and 2, then one token a step */
                int32_t chunk = x->n_fed == 0 ? 4 : x->n_ids - x->n_fed;
                for (int32_t j = 0; j < chunk; j++, T++) {
                    tokens[T] = x->ids[x->n_fed + j];
                    positions[T] = x->n_fed + j;
                }
                x->n_fed += chunk;
                qs[s + 1] = T;
                int sample = x->n_fed == x->n_ids;
                float *p = params + SAMPLE_PARAMS * s;
                int32_t *sq = seq + SAMPLE_SEQ * s;
                memset(p, 0, sizeof *p * SAMPLE_PARAMS);
                sq[2] = x->slot;
                sq[3] = x->n_prompt;
                noisy_logits(logits + s * V, V, 1000 * (uint64_t)phase + 10 * (uint64_t)step + (uint64_t)s);
                if (sample) {
                    p[0] = x->p.temperature, p[1] = (float)x->p.top_k, p[2] = x->p.top_p, p[3] = x->p.min_p;
                    p[4] = x->p.repetition_penalty, p[5] = x->p.presence_penalty, p[6] = x->p.frequency_penalty;
                    if (x->p.temperature > 0.0f)
                        kiln_sampler_uniform_bits(&x->layer_rng, sq);
                }
            }
            sample_step st = {.S = S,
                              .T = T,
                              .logits = logits,
                              .params = params,
                              .seq = seq,
                              .tokens = tokens,
                              .positions = positions,
                              .qstart = qs};
            CHECK_OK(sample_runner_step(&r, &st, got));
            for (int s = 0; s < S; s++) {
                pen_seq *x = rows[s];
                if (x->n_fed != x->n_ids)
                    continue;
                memcpy(ref, logits + s * V, sizeof ref);
                kiln_sampler_penalize(ref, V, &x->p, x->seen, x->count);
                int32_t want = kiln_sampler_sample(ref, V, &x->p, &x->ref_rng, c);
                same &= got[s] == want;
                sampled++;
                x->ids[x->n_ids++] = want;
                x->seen[want] = 1;
                x->count[want]++;
            }
        }
    }
    CHECK(same);
    CHECK(sampled == 3 * (STEPS - 1));
    sample_runner_close(&r);
}

/* ---- logprob outputs against numpy ---------------------------------------------------------- */

static void *read_npy(const char *name, kiln_dtype want, int64_t rows, int64_t cols, void **file)
{
    char path[512];
    snprintf(path, sizeof path, "tests/data/sample/%s", name);
    FILE *f = fopen(path, "rb");
    *file = NULL;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    int ok = buf && n > 0 && fread(buf, 1, (size_t)n, f) == (size_t)n;
    fclose(f);
    kiln_dtype dt;
    kiln_dims d;
    const void *data = NULL;
    size_t size = 0;
    ok = ok && kiln_npy_parse(buf, (size_t)n, &dt, &d, &data, &size) == KILN_OK && dt == want && d.rank == 2 &&
         d.d[0] == rows && d.d[1] == cols;
    if (!ok) {
        free(buf);
        return NULL;
    }
    *file = buf;
    return (void *)data;
}

static int close_to(float got, float want)
{
    if (isinf(want))
        return got == want;
    return fabsf(got - want) <= 1e-6f + 1e-6f * fabsf(want);
}

/* The logprob outputs on the CPU (tests/data/sample/make_logprobs.py):
 * the log-softmax of the sampled id and of the top n ids, most likely
 * first, lower id first on ties, whatever the temperature; NaN and -1
 * where a row asked for nothing. */
static void test_logprobs_reference(void)
{
    enum { S = 6, V = 300, K = 20 };
    void *f1, *f2, *f3;
    const float *logits = read_npy("logits.npy", KILN_DTYPE_F32, S, V, &f1);
    const float *lsm = read_npy("logsoftmax.npy", KILN_DTYPE_F32, S, V, &f2);
    const int32_t *top = read_npy("top_ids.npy", KILN_DTYPE_I32, S, K, &f3);
    CHECK(logits && lsm && top);
    sample_runner r;
    memset(&r, 0, sizeof r);
    if (logits && lsm && top)
        CHECK_OK(sample_runner_open_top(&r, KILN_BACKEND_CPU, S, V, K));
    if (!r.ctx) {
        sample_runner_close(&r);
        free(f1), free(f2), free(f3);
        return;
    }
    /* temperature, top_k, logprobs per row */
    const float temp[S] = {0.0f, 1.0f, 0.7f, 0.0f, 1.5f, 1.0f};
    const int32_t topk[S] = {0, 5, 0, 0, 0, 50};
    const int32_t n_top[S] = {20, 5, 20, 3, 0, -1};
    float params[S * SAMPLE_PARAMS_LOGPROBS] = {0};
    int32_t seq[S * SAMPLE_SEQ] = {0};
    kiln_rng rng;
    kiln_rng_seed(&rng, 11);
    for (int s = 0; s < S; s++) {
        float *p = params + s * SAMPLE_PARAMS_LOGPROBS;
        p[0] = temp[s];
        p[1] = (float)topk[s];
        p[2] = 1.0f;
        p[SAMPLE_PARAMS] = (float)n_top[s];
        kiln_sampler_uniform_bits(&rng, seq + s * SAMPLE_SEQ);
        seq[s * SAMPLE_SEQ + 2] = -1;
    }
    int32_t ids[S], got_top[S * K];
    float lp[S], got_lp[S * K];
    sample_step st = {.S = S,
                      .logits = logits,
                      .params = params,
                      .seq = seq,
                      .logprob = lp,
                      .top_ids = got_top,
                      .top_logprobs = got_lp};
    CHECK_OK(sample_runner_step(&r, &st, ids));
    int sampled_elsewhere = 0;
    for (int s = 0; s < S; s++) {
        const float *ref = lsm + s * V;
        CHECK(ids[s] >= 0 && ids[s] < V);
        if (n_top[s] < 0) {
            CHECK(isnan(lp[s]));
        } else {
            CHECK(close_to(lp[s], ref[ids[s]]));
            if (!close_to(lp[s], ref[ids[s]]))
                fprintf(stderr, "row %d: logprob %.9g of id %d, numpy %.9g\n", s, (double)lp[s], ids[s],
                        (double)ref[ids[s]]);
        }
        sampled_elsewhere += temp[s] > 0 && ids[s] != top[s * K];
        for (int k = 0; k < K; k++) {
            int32_t id = got_top[s * K + k];
            if (k < n_top[s]) {
                CHECK(id == top[s * K + k] && close_to(got_lp[s * K + k], ref[top[s * K + k]]));
                if (id != top[s * K + k])
                    fprintf(stderr, "row %d: top %d is id %d, numpy's %d\n", s, k, id, top[s * K + k]);
            } else {
                CHECK(id == -1 && isnan(got_lp[s * K + k]));
            }
        }
        /* greedy rows take the most likely id */
        if (temp[s] == 0.0f)
            CHECK(ids[s] == top[s * K]);
    }
    /* A drawn row's logprob is its own id's, not the argmax's. */
    CHECK(sampled_elsewhere > 0);
    sample_runner_close(&r);
    free(f1), free(f2), free(f3);
}

static const test_case_ tests[] = {
    TEST(test_logprobs_reference),
    TEST(test_uniform_bits),
    TEST(test_sample_layer_matches_sampler),
    TEST(test_sample_layer_penalties),
    TEST(test_greedy),
    TEST(test_argmax_scan),
    TEST(test_top_k),
    TEST(test_top_k_large_vocab),
    TEST(test_top_p),
    TEST(test_min_p),
    TEST(test_temperature),
    TEST(test_penalties),
    TEST(test_seeded_draws),
    TEST(test_xoshiro_reference),
};

TEST_MAIN(tests)
