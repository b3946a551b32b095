/* Runs the kiln/Sample layer alone (plugins/sample) on a backend: a
 * network of its three inputs and its output, built, loaded and enqueued
 * through the public API. Shared by tests/unit/test_sampler.c (CPU) and
 * tests/ops/test_llm_cuda.c (CUDA against the CPU). */
#ifndef KILN_TEST_SAMPLE_RUN_H
#define KILN_TEST_SAMPLE_RUN_H

#include <kiln/kiln.h>
#include <string.h>

#include "core/error.h"

typedef struct sample_runner {
    kiln_registry *reg;
    kiln_engine *engine;
    kiln_context *ctx;
} sample_runner;

static kiln_status sample_runner_open(sample_runner *r, kiln_backend backend, int32_t max_s, int32_t vocab)
{
    memset(r, 0, sizeof *r);
    KILN_TRY(kiln_registry_create(&r->reg));
    kiln_network *net = NULL;
    KILN_TRY(kiln_network_create(r->reg, &net));
    kiln_tensor in[3], out;
    int32_t prof, n_out = 0;
    const char *names[3] = {"logits", "sample_params", "sample_random"};
    const kiln_dtype types[3] = {KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_I32};
    const int64_t cols[3] = {vocab, 4, 2};
    kiln_status s = kiln_network_add_profile(net, &prof);
    for (int i = 0; i < 3 && s == KILN_OK; i++) {
        kiln_dims d = {.rank = 2, .d = {-1, cols[i]}}, mn = {.rank = 2, .d = {1, cols[i]}},
                  mx = {.rank = 2, .d = {max_s, cols[i]}};
        s = kiln_network_add_input(net, names[i], types[i], &d, &in[i]);
        if (s == KILN_OK)
            s = kiln_network_set_profile_shape(net, prof, names[i], &mn, &mn, &mx);
    }
    if (s == KILN_OK)
        s = kiln_network_add_plugin(net, "sample", "Sample", "1", "kiln", NULL, 0, in, 3, &out, 1, &n_out);
    if (s == KILN_OK)
        s = kiln_network_mark_output(net, out, "next_token");
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

static void sample_runner_close(sample_runner *r)
{
    kiln_context_destroy(r->ctx);
    kiln_engine_destroy(r->engine);
    kiln_registry_destroy(r->reg);
}

/* ids[s] for S rows: logits [S, vocab], params [S, 4], random [S, 2]. */
static kiln_status sample_runner_run(sample_runner *r, int32_t S, int32_t vocab, const float *logits,
                                     const float *params, const int32_t *random, int32_t *ids)
{
    kiln_dims dl = {.rank = 2, .d = {S, vocab}}, dp = {.rank = 2, .d = {S, 4}}, dr = {.rank = 2, .d = {S, 2}};
    KILN_TRY(kiln_context_set_input_shape(r->ctx, "logits", &dl));
    KILN_TRY(kiln_context_set_input_shape(r->ctx, "sample_params", &dp));
    KILN_TRY(kiln_context_set_input_shape(r->ctx, "sample_random", &dr));
    KILN_TRY(kiln_context_copy_input(r->ctx, "logits", logits, sizeof *logits * (size_t)S * (size_t)vocab));
    KILN_TRY(kiln_context_copy_input(r->ctx, "sample_params", params, sizeof *params * 4 * (size_t)S));
    KILN_TRY(kiln_context_copy_input(r->ctx, "sample_random", random, sizeof *random * 2 * (size_t)S));
    KILN_TRY(kiln_context_enqueue(r->ctx, NULL));
    KILN_TRY(kiln_context_copy_output(r->ctx, "next_token", ids, sizeof *ids * (size_t)S));
    return kiln_context_synchronize(r->ctx);
}

#endif
