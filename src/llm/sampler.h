/* Next-token sampling: penalties, temperature, top-k, top-p, min-p and a
 * seeded draw, in the order Hugging Face's generate applies them
 * (include/kiln/llm.h documents each parameter). Works in caller-provided
 * scratch, so a decode step allocates nothing. */
#ifndef KILN_LLM_SAMPLER_H
#define KILN_LLM_SAMPLER_H

#include <kiln/llm.h>
#include <stddef.h>
#include <stdint.h>

/* xoshiro256** seeded through splitmix64 (Blackman & Vigna). */
typedef struct kiln_rng {
    uint64_t s[4];
} kiln_rng;

void kiln_rng_seed(kiln_rng *rng, uint64_t seed);
uint64_t kiln_rng_next(kiln_rng *rng);
/* Uniform in [0, 1) with 53 random bits. */
double kiln_rng_uniform(kiln_rng *rng);

/* Applies the repetition penalty to every id with seen[id] != 0 and the
 * presence/frequency penalties to every id with count[id] > 0, in place.
 * seen/count may be NULL when the matching penalty is off. */
void kiln_sampler_penalize(float *logits, int32_t vocab, const kiln_llm_sampling *p, const uint8_t *seen,
                           const int32_t *count);

/* One logit under the penalties: the repetition penalty when seen, then
 * presence and frequency when count > 0. kiln_sampler_penalize applies it
 * to a row; the sampling layer to each logit it reads. */
static inline float kiln_sampler_penalty(float x, int seen, int32_t count, const kiln_llm_sampling *p)
{
    float rep = p->repetition_penalty;
    if (seen && rep > 0.0f && rep != 1.0f)
        x = x > 0.0f ? x / rep : x * rep;
    if (count > 0 && (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f))
        x -= p->presence_penalty + p->frequency_penalty * (float)count;
    return x;
}

/* One candidate token. */
typedef struct kiln_candidate {
    float logit; /* after temperature; then the probability */
    int32_t id;
} kiln_candidate;

/* The candidates that survive temperature, top-k, top-p and min-p, most
 * likely first, with .logit replaced by their renormalized probability.
 * scratch holds vocab entries. Returns the number kept (>= 1). Requires
 * temperature > 0. */
int32_t kiln_sampler_filter(const float *logits, int32_t vocab, const kiln_llm_sampling *p, kiln_candidate *scratch);

/* Index of the largest logit (the first on ties). */
int32_t kiln_sampler_argmax(const float *logits, int32_t vocab);

/* The candidate a uniform u in [0, 1) picks from kiln_sampler_filter's n
 * candidates: the first whose cumulative probability exceeds u (the last
 * when rounding leaves u beyond them all). */
int32_t kiln_sampler_draw(const kiln_candidate *c, int32_t n, double u);

/* The next token: penalties must already be applied; greedy when
 * temperature <= 0, else a draw from kiln_sampler_filter's set. */
int32_t kiln_sampler_sample(const float *logits, int32_t vocab, const kiln_llm_sampling *p, kiln_rng *rng,
                            kiln_candidate *scratch);

/* The sampling layer (kiln/Sample, docs/llm.md) takes each sequence's
 * uniform as two i32 (the high 21 and low 32 of 53 random bits), so its
 * draws are the ones kiln_sampler_sample makes from the same PRNG state:
 * uniform_bits advances rng exactly as kiln_rng_uniform does, and
 * uniform_from_bits returns the same double. */
void kiln_sampler_uniform_bits(kiln_rng *rng, int32_t out[2]);
double kiln_sampler_uniform_from_bits(const int32_t bits[2]);

#endif
