/* One step of the LLM engine (llm_internal.h): the step inputs' shapes,
 * their copies in, the run, the sampled ids out, and the decode steps'
 * CUDA graphs. The scheduler (scheduler.c) fills llm->h and calls these. */
#include <kiln/kiln.h>

#include <string.h>
#include <time.h>

#include "core/error.h"
#include "sample/sample.h"
#include "llm/llm_internal.h"
#include "runtime/runtime_internal.h"

double kiln_llm_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

kiln_status kiln_llm_step_shapes(kiln_llm *llm, int32_t T, int32_t S)
{
    if (T == llm->cur_T && S == llm->cur_S)
        return KILN_OK;
    llm->cur_T = llm->cur_S = 0;
    kiln_dims d1 = {.rank = 1, .d = {T}};
    kiln_dims ds = {.rank = 1, .d = {S}};
    kiln_dims dq = {.rank = 1, .d = {S + 1}};
    kiln_dims db = {.rank = 2, .d = {S, llm->max_blocks}};
    KILN_TRY(kiln_context_set_input_shape(llm->ctx, "tokens", &d1));
    KILN_TRY(kiln_context_set_input_shape(llm->ctx, "positions", &d1));
    KILN_TRY(kiln_context_set_input_shape(llm->ctx, "block_table", &db));
    KILN_TRY(kiln_context_set_input_shape(llm->ctx, "seq_lens", &ds));
    KILN_TRY(kiln_context_set_input_shape(llm->ctx, "query_start", &dq));
    KILN_TRY(kiln_context_set_input_shape(llm->ctx, "last_token", &ds));
    if (llm->has_sampler) {
        kiln_dims dp = {.rank = 2, .d = {S, llm->n_params}};
        kiln_dims dr = {.rank = 2, .d = {S, SAMPLE_SEQ}};
        KILN_TRY(kiln_context_set_input_shape(llm->ctx, "sample_params", &dp));
        KILN_TRY(kiln_context_set_input_shape(llm->ctx, "sample_seq", &dr));
    }
    llm->cur_T = T;
    llm->cur_S = S;
    return KILN_OK;
}

void kiln_llm_step_pad(kiln_llm *llm, int32_t S, int32_t B)
{
    step_host *h = &llm->h;
    for (int32_t s = S; s < B; s++) {
        h->tokens[s] = 0;
        h->positions[s] = 0;
        h->block_table[(size_t)s * (size_t)llm->max_blocks] = llm->scratch_block;
        h->seq_lens[s] = 1;
        h->query_start[s + 1] = s + 1;
        h->last_token[s] = s;
        memset(h->params + (size_t)llm->n_params * (size_t)s, 0, (size_t)llm->n_params * sizeof *h->params);
        if (llm->n_params > SAMPLE_PARAMS)
            h->params[(size_t)llm->n_params * (size_t)s + SAMPLE_PARAMS] = -1.0f;
        h->seq[SAMPLE_SEQ * s + 2] = -1;
    }
}

int32_t kiln_llm_step_bucket(const kiln_llm *llm, int32_t S)
{
    for (int32_t i = 0; i < llm->n_buckets; i++)
        if (llm->buckets[i] >= S)
            return llm->buckets[i];
    return 0;
}

kiln_status kiln_llm_step_enqueue(kiln_llm *llm, int32_t T, int32_t S, int graph, int need_logits, int need_logprobs,
                                  int feed, int32_t *next)
{
    step_host *h = &llm->h;
    kiln_context *ctx = llm->ctx;
    const size_t i4 = sizeof(int32_t);
    KILN_TRY(kiln_llm_step_shapes(llm, T, S));
    /* One copy: every input up to the end of the step's block_table rows. */
    size_t bytes = llm->offset[IN_BLOCK_TABLE] + i4 * (size_t)S * (size_t)llm->max_blocks;
    KILN_TRY(kiln_context_copy_span(ctx, "tokens", llm->packed, bytes));
    if (feed)
        KILN_TRY(kiln_context_copy_between(ctx, "tokens", "next_token", i4 * (size_t)T));
    if (llm->n_buckets)
        KILN_TRY(kiln_context_set_cuda_graph(ctx, graph ? KILN_CUDA_GRAPH_ON : KILN_CUDA_GRAPH_PAUSED));
    KILN_TRY(kiln_context_enqueue(ctx, NULL));
    if (llm->has_sampler)
        KILN_TRY(kiln_context_copy_output(ctx, "next_token", next, i4 * (size_t)S));
    if (need_logprobs && llm->logprob_top > 0) {
        size_t k = (size_t)llm->logprob_top;
        KILN_TRY(kiln_context_copy_output(ctx, "logprob", h->logprob, sizeof *h->logprob * (size_t)S));
        KILN_TRY(kiln_context_copy_output(ctx, "top_ids", h->top_ids, i4 * (size_t)S * k));
        KILN_TRY(
            kiln_context_copy_output(ctx, "top_logprobs", h->top_logprobs, sizeof *h->top_logprobs * (size_t)S * k));
    }
    if (need_logits)
        KILN_TRY(kiln_context_copy_output(ctx, "logits", h->logits,
                                          sizeof *h->logits * (size_t)S * (size_t)llm->cfg.vocab_size));
    return KILN_OK;
}

kiln_status kiln_llm_step_run(kiln_llm *llm, int32_t T, int32_t S, int graph, int need_logits, int need_logprobs)
{
    KILN_TRY(kiln_llm_step_enqueue(llm, T, S, graph, need_logits, need_logprobs, 0, llm->h.next));
    return kiln_context_synchronize(llm->ctx);
}

kiln_status kiln_llm_capture_graphs(kiln_llm *llm)
{
    int32_t top = llm->max_batch < llm->max_tokens ? llm->max_batch : llm->max_tokens;
    double t0 = kiln_llm_now_ms();
    /* An engine with a plugin that cannot be captured still runs, kernel
     * by kernel. */
    kiln_status safe = kiln_context_set_cuda_graph(llm->ctx, KILN_CUDA_GRAPH_ON);
    if (safe == KILN_ERROR_UNSUPPORTED) {
        kiln_log(KILN_LOG_WARNING, "llm: decode steps run without CUDA graphs: %s", kiln_last_error());
        return KILN_OK;
    }
    KILN_TRY(safe);
    llm->h.query_start[0] = 0;
    for (int32_t b = 1;; b = b * 2 < top ? b * 2 : top) {
        kiln_llm_step_pad(llm, 0, b);
        llm->buckets[llm->n_buckets++] = b;
        kiln_status s = kiln_llm_step_run(llm, b, b, 1, 0, 0);
        if (s != KILN_OK)
            return kiln_fail_context(s, "capturing the decode step's CUDA graph for %d sequences", (int)b);
        KILN_TRY(kiln_context_graph_nodes(llm->ctx, &llm->graph_nodes));
        if (b == top || llm->n_buckets == (int32_t)(sizeof llm->buckets / sizeof llm->buckets[0]))
            break;
    }
    llm->capture_ms = kiln_llm_now_ms() - t0;
    kiln_log(KILN_LOG_INFO, "llm: captured %d decode graphs in %.1f ms, %zu launches per step at %d sequences",
             (int)llm->n_buckets, llm->capture_ms, llm->graph_nodes, (int)top);
    return kiln_context_set_cuda_graph(llm->ctx, KILN_CUDA_GRAPH_PAUSED);
}
