/* Runs the kiln/Sample layer alone (plugins/sample) on a backend: a
 * network of its seven inputs and its output, built, loaded and enqueued
 * through the public API. Shared by tests/unit/test_sampler.c (CPU) and
 * tests/ops/test_llm_cuda.c (CUDA against the CPU). */
#ifndef KILN_TEST_SAMPLE_RUN_H
#define KILN_TEST_SAMPLE_RUN_H

#include <kiln/kiln.h>
#include <string.h>

#include "sample/sample.h"
#include "core/error.h"

#define SAMPLE_RUN_MAX_T 64

typedef struct sample_runner {
    kiln_registry *reg;
    kiln_engine *engine;
    kiln_context *ctx;
    int32_t slots, vocab;
    int32_t top; /* the layer's logprobs field: 0, or its logprob outputs' alternatives */
} sample_runner;

/* One step's inputs: S rows; T fed tokens (query_start splits them among
 * the rows; all zero-length when NULL). */
typedef struct sample_step {
    int32_t S, T;
    const float *logits; /* [S, V] */
    const float *params; /* [S, SAMPLE_PARAMS], or [S, SAMPLE_PARAMS_LOGPROBS] with top */
    const int32_t *seq;  /* [S, SAMPLE_SEQ] */
    const int32_t *tokens, *positions, *qstart;
    /* With top: receive the logprob outputs ([S], [S, top], [S, top]). */
    float *logprob;
    int32_t *top_ids;
    float *top_logprobs;
} sample_step;

/* The layer with `top` > 0: its logprob outputs too. */
static kiln_status sample_runner_open_top(sample_runner *r, kiln_backend backend, int32_t max_s, int32_t vocab,
                                          int32_t top)
{
    memset(r, 0, sizeof *r);
    r->slots = max_s;
    r->vocab = vocab;
    r->top = top;
    KILN_TRY(kiln_registry_create(&r->reg));
    kiln_network *net = NULL;
    KILN_TRY(kiln_network_create(r->reg, &net));
    kiln_tensor in[7], out[4];
    int32_t prof, n_out = 0;
    const char *names[7] = {"logits",    "sample_params", "sample_seq",  "tokens",
                            "positions", "query_start",   "sample_state"};
    const kiln_dtype types[7] = {KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_I32, KILN_DTYPE_I32,
                                 KILN_DTYPE_I32, KILN_DTYPE_I32, KILN_DTYPE_I32};
    const int64_t cols[7] = {vocab, top > 0 ? SAMPLE_PARAMS_LOGPROBS : SAMPLE_PARAMS, SAMPLE_SEQ, 0, 0, 0, vocab};
    const int64_t lo[7] = {1, 1, 1, 1, 1, 2, max_s},
                  hi[7] = {max_s, max_s, max_s, SAMPLE_RUN_MAX_T, SAMPLE_RUN_MAX_T, max_s + 1, max_s};
    kiln_status s = kiln_network_add_profile(net, &prof);
    for (int i = 0; i < 7 && s == KILN_OK; i++) {
        int rank = cols[i] ? 2 : 1;
        kiln_dims d = {.rank = rank, .d = {i == 6 ? max_s : -1, cols[i]}};
        kiln_dims mn = {.rank = rank, .d = {lo[i], cols[i]}}, mx = {.rank = rank, .d = {hi[i], cols[i]}};
        s = kiln_network_add_input(net, names[i], types[i], &d, &in[i]);
        if (s == KILN_OK && i != 6)
            s = kiln_network_set_profile_shape(net, prof, names[i], &mn, &mn, &mx);
    }
    kiln_field f = {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "logprobs", KILN_FIELD_I32, 1, &r->top};
    if (s == KILN_OK)
        s = kiln_network_add_plugin(net, "sample", "Sample", "1", "kiln", top > 0 ? &f : NULL, top > 0, in, 7, out, 4,
                                    &n_out);
    static const char *const out_names[4] = {"next_token", "logprob", "top_ids", "top_logprobs"};
    for (int32_t o = 0; s == KILN_OK && o < n_out; o++)
        s = kiln_network_mark_output(net, out[o], out_names[o]);
    kiln_build_config bc;
    kiln_build_config_init(&bc);
    bc.backend = backend;
    kiln_buffer buf = {0};
    if (s == KILN_OK)
        s = kiln_build(net, &bc, &buf);
    kiln_network_destroy(net);
    if (s == KILN_OK)
        s = kiln_engine_load_memory(r->reg, buf.data, buf.size, &r->engine);
    kiln_buffer_free(&buf);
    if (s == KILN_OK)
        s = kiln_context_create(r->engine, &r->ctx);
    return s;
}

static kiln_status sample_runner_open(sample_runner *r, kiln_backend backend, int32_t max_s, int32_t vocab)
{
    return sample_runner_open_top(r, backend, max_s, vocab, 0);
}

static void sample_runner_close(sample_runner *r)
{
    kiln_context_destroy(r->ctx);
    kiln_engine_destroy(r->engine);
    kiln_registry_destroy(r->reg);
}

/* ids[s] for the step's rows; the state stays in the context between
 * calls. */
static kiln_status sample_runner_step(sample_runner *r, const sample_step *st, int32_t *ids)
{
    const int32_t S = st->S, V = r->vocab;
    int32_t T = st->T > 0 ? st->T : 1, zeros[SAMPLE_RUN_MAX_T + 1] = {0}, qs[SAMPLE_RUN_MAX_T + 1] = {0};
    const int32_t *qstart = st->qstart;
    if (!qstart) {
        /* one dummy token, fed by no row */
        for (int32_t s = 0; s <= S; s++)
            qs[s] = 0;
        qstart = qs;
    }
    const int64_t P = r->top > 0 ? SAMPLE_PARAMS_LOGPROBS : SAMPLE_PARAMS;
    kiln_dims dl = {.rank = 2, .d = {S, V}}, dp = {.rank = 2, .d = {S, P}}, dq = {.rank = 2, .d = {S, SAMPLE_SEQ}},
              dt = {.rank = 1, .d = {T}}, ds = {.rank = 1, .d = {S + 1}};
    KILN_TRY(kiln_context_set_input_shape(r->ctx, "logits", &dl));
    KILN_TRY(kiln_context_set_input_shape(r->ctx, "sample_params", &dp));
    KILN_TRY(kiln_context_set_input_shape(r->ctx, "sample_seq", &dq));
    KILN_TRY(kiln_context_set_input_shape(r->ctx, "tokens", &dt));
    KILN_TRY(kiln_context_set_input_shape(r->ctx, "positions", &dt));
    KILN_TRY(kiln_context_set_input_shape(r->ctx, "query_start", &ds));
    KILN_TRY(kiln_context_copy_input(r->ctx, "logits", st->logits, sizeof(float) * (size_t)S * (size_t)V));
    KILN_TRY(kiln_context_copy_input(r->ctx, "sample_params", st->params, sizeof(float) * (size_t)P * (size_t)S));
    KILN_TRY(kiln_context_copy_input(r->ctx, "sample_seq", st->seq, sizeof(int32_t) * SAMPLE_SEQ * (size_t)S));
    KILN_TRY(kiln_context_copy_input(r->ctx, "tokens", st->T > 0 ? st->tokens : zeros, sizeof(int32_t) * (size_t)T));
    KILN_TRY(
        kiln_context_copy_input(r->ctx, "positions", st->T > 0 ? st->positions : zeros, sizeof(int32_t) * (size_t)T));
    KILN_TRY(kiln_context_copy_input(r->ctx, "query_start", qstart, sizeof(int32_t) * ((size_t)S + 1)));
    KILN_TRY(kiln_context_enqueue(r->ctx, NULL));
    KILN_TRY(kiln_context_copy_output(r->ctx, "next_token", ids, sizeof *ids * (size_t)S));
    if (r->top > 0 && st->logprob) {
        size_t k = (size_t)r->top * (size_t)S;
        KILN_TRY(kiln_context_copy_output(r->ctx, "logprob", st->logprob, sizeof(float) * (size_t)S));
        KILN_TRY(kiln_context_copy_output(r->ctx, "top_ids", st->top_ids, sizeof(int32_t) * k));
        KILN_TRY(kiln_context_copy_output(r->ctx, "top_logprobs", st->top_logprobs, sizeof(float) * k));
    }
    return kiln_context_synchronize(r->ctx);
}

#endif
