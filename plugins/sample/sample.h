/* What kiln/Sample's C side (sample.c) and its CUDA kernel (sample.cu)
 * share: the layout of its inputs and the penalty state's bookkeeping. */
#ifndef KILN_PLUGINS_SAMPLE_H
#define KILN_PLUGINS_SAMPLE_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define SAMPLE_HD __host__ __device__
#else
#define SAMPLE_HD
#endif

#define SAMPLE_PARAMS 7 /* temperature, top_k, top_p, min_p, repetition, presence, frequency */
#define SAMPLE_SEQ 4    /* random high, random low, state slot (-1: none), prompt length */
/* A layer with the logprob outputs takes one more params column: the
 * row's number of alternatives (-1: no logprobs for the row). */
#define SAMPLE_PARAMS_LOGPROBS 8
#define SAMPLE_MAX_TOP 20 /* alternatives a layer may return per row */
/* Workspace bytes per logit: a candidate (8) and a penalized logit (4). */
#define SAMPLE_WORKSPACE_PER_ENTRY 12

/* One enqueue's tensors. */
typedef struct sample_args {
    const float *logits;      /* [S, V] */
    const float *params;      /* [S, SAMPLE_PARAMS] */
    const int32_t *seq;       /* [S, SAMPLE_SEQ] */
    const int32_t *tokens;    /* [T] */
    const int32_t *positions; /* [T] */
    const int32_t *qstart;    /* [S + 1] */
    int32_t *state;           /* [slots, V] */
    int32_t *ids;             /* [S] */
    int32_t S, V, T, slots;
    void *workspace; /* S * V * SAMPLE_WORKSPACE_PER_ENTRY bytes */
    /* Entries of qstart: S + 1 in a generation step; scoring feeds the
     * logits of one sequence's every position as rows, with 2, and a row s
     * with s + 1 >= Q keeps no history (its slot must be -1). */
    int32_t Q;
    int32_t P;           /* params columns: SAMPLE_PARAMS, or SAMPLE_PARAMS_LOGPROBS with top > 0 */
    int32_t top;         /* alternatives per row of the logprob outputs; 0: none (NULL below) */
    float *logprob;      /* [S] */
    int32_t *top_ids;    /* [S, top] */
    float *top_logprobs; /* [S, top] */
} sample_args;

/* top_k as the params row holds it (a float) to the sampler's int: <= 0
 * or NaN is off, beyond the vocabulary is all of it. */
SAMPLE_HD static inline int32_t sample_top_k(float k, int32_t vocab)
{
    return k >= 1.0f ? (k < (float)vocab ? (int32_t)k : vocab) : 0;
}

/* Whether a params row asks for a penalty (kiln_sampler_penalty's tests). */
SAMPLE_HD static inline int sample_has_penalty(const float *pr)
{
    return (pr[4] > 0.0f && pr[4] != 1.0f) || pr[5] != 0.0f || pr[6] != 0.0f;
}

/* The CPU's bookkeeping of one row's state (the kernel does the same in
 * parallel): a step feeding position 0 starts the sequence over; every
 * token fed is seen, and generated when past the prompt. */
static inline void sample_track(int32_t *st, int32_t V, const int32_t *tokens, const int32_t *positions, int32_t t0,
                                int32_t t1, int32_t n_prompt)
{
    if (t1 > t0 && positions[t0] == 0)
        memset(st, 0, sizeof *st * (size_t)V);
    for (int32_t t = t0; t < t1; t++) {
        st[tokens[t]] |= 1;
        if (positions[t] >= n_prompt)
            st[tokens[t]] += 2;
    }
}

/* Launches the sampling of a->S rows on `stream` (a cudaStream_t).
 * Returns 0, or the CUDA error of the launch. */
int kiln_sample_cuda(const sample_args *a, void *stream);

#ifdef __cplusplus
}
#endif

#endif
