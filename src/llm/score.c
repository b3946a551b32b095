/* Teacher-forced scoring (kiln_llm_score), the engine and its weight bytes
 * (kiln_llm_engine, kiln_llm_weight_bytes), include/kiln/llm.h. Scoring
 * runs on a context of its own, through the backend-neutral copy calls, so
 * it works the same on CPU and CUDA engines and never touches generation's
 * state. */
#include <kiln/kiln.h>
#include <kiln/llm.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sample.h"
#include "core/error.h"
#include "runtime/runtime_internal.h"
#include "llm/llm_internal.h"

/* ---- scoring ------------------------------------------------------------------------------ */

typedef struct score_state {
    kiln_context *ctx;
    int32_t chunk;                      /* tokens (and logits rows) per step */
    int32_t n_blocks;                   /* KV blocks of the scored sequence */
    int32_t *tokens, *positions, *last; /* [chunk] */
    int32_t *block_table;               /* [max_blocks] */
    /* An engine that ends with the sampling layer samples every row too:
     * greedy, no penalty slot (kiln/Sample takes rows of one sequence
     * then), its next_token unread. */
    float *params; /* [chunk, n_params] zeros (no logprobs: -1) */
    int32_t *seq;  /* [chunk, SAMPLE_SEQ] */
    float *logits; /* [chunk, vocab] */
    void *zeros;   /* one layer's KV cache of zeros */
    /* a calibration engine's outputs "calib.<i>", i < n_probes ([chunk]
     * each, in probe), maxed into amax[i] (kiln_llm_score_probe) */
    int32_t n_probes;
    float *probe, *amax;
} score_state;

static void score_state_free(score_state *st)
{
    kiln_context_destroy(st->ctx);
    free(st->tokens);
    free(st->positions);
    free(st->last);
    free(st->block_table);
    free(st->params);
    free(st->seq);
    free(st->logits);
    free(st->zeros);
    free(st->probe);
}

/* The step's inputs (4-byte elements): shapes first (a copy needs every
 * input's shape), then the values. */
typedef struct step_io {
    const char *name;
    const void *v;
    int32_t rows, cols; /* cols 0: one-dimensional */
} step_io;

static kiln_status set_inputs(kiln_context *ctx, const step_io *io, int n)
{
    for (int i = 0; i < n; i++) {
        kiln_dims d = {.rank = io[i].cols ? 2 : 1, .d = {io[i].rows, io[i].cols}};
        KILN_TRY(kiln_context_set_input_shape(ctx, io[i].name, &d));
    }
    for (int i = 0; i < n; i++) {
        size_t count = (size_t)io[i].rows * (size_t)(io[i].cols ? io[i].cols : 1);
        KILN_TRY(kiln_context_copy_input(ctx, io[i].name, io[i].v, 4 * count));
    }
    return KILN_OK;
}

/* The context and its KV caches, owned by the context (device memory on
 * CUDA) and zeroed: a kernel that loads a whole block and masks the
 * positions past the sequence must not meet NaN bit patterns there. */
static kiln_status score_setup(kiln_llm *llm, size_t n, score_state *st)
{
    const kiln_llm_config *c = &llm->cfg;
    kiln_dims mn, opt, mx;
    KILN_TRY(kiln_engine_profile_shape(llm->engine, 0, "last_token", &mn, &opt, &mx));
    int64_t chunk = mx.d[0] < llm->max_tokens ? mx.d[0] : llm->max_tokens;
    if (llm->has_sampler) {
        KILN_TRY(kiln_engine_profile_shape(llm->engine, 0, "sample_params", &mn, &opt, &mx));
        if (mx.d[0] < chunk)
            chunk = mx.d[0];
    }
    if (chunk < 1)
        return kiln_fail(KILN_ERROR_FORMAT, "the engine's last_token input allows no rows");
    st->chunk = (int32_t)chunk;
    st->n_blocks = (int32_t)((n + (size_t)c->block_size - 1) / (size_t)c->block_size);
    size_t V = (size_t)c->vocab_size;
    size_t layer_bytes = (size_t)st->n_blocks * 2 * (size_t)c->n_kv_heads * (size_t)c->block_size *
                         (size_t)c->head_dim * kiln_dtype_size(llm->kv_dtype);
    st->tokens = calloc((size_t)chunk, sizeof *st->tokens);
    st->positions = calloc((size_t)chunk, sizeof *st->positions);
    st->last = calloc((size_t)chunk, sizeof *st->last);
    st->block_table = calloc((size_t)llm->max_blocks, sizeof *st->block_table);
    st->logits = malloc((size_t)chunk * V * sizeof *st->logits);
    st->zeros = calloc(1, layer_bytes);
    st->params = calloc((size_t)chunk * (size_t)llm->n_params, sizeof *st->params);
    st->seq = calloc((size_t)chunk * SAMPLE_SEQ, sizeof *st->seq);
    st->probe = st->n_probes ? malloc((size_t)chunk * sizeof *st->probe) : NULL;
    if (!st->tokens || !st->positions || !st->last || !st->block_table || !st->logits || !st->zeros || !st->params ||
        !st->seq || (st->n_probes && !st->probe))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory scoring %zu tokens", n);
    for (int64_t r = 0; r < chunk; r++) {
        st->seq[r * SAMPLE_SEQ + 2] = -1;
        if (llm->n_params > SAMPLE_PARAMS)
            st->params[r * llm->n_params + SAMPLE_PARAMS] = -1.0f;
    }
    for (int32_t b = 0; b < st->n_blocks; b++)
        st->block_table[b] = b;
    KILN_TRY(kiln_context_create(llm->engine, &st->ctx));
    if (llm->own_threads > 0)
        KILN_TRY(kiln_context_set_threads(st->ctx, llm->own_threads));
    kiln_dims kd = {.rank = 5, .d = {st->n_blocks, 2, c->n_kv_heads, c->block_size, c->head_dim}};
    char name[32];
    for (int32_t l = 0; l < c->n_layers; l++) {
        snprintf(name, sizeof name, "kv_cache.%d", (int)l);
        KILN_TRY(kiln_context_set_input_shape(st->ctx, name, &kd));
    }
    /* Copies need every input's shape: a one-token step's until the first. */
    int32_t zero = 0, query_start[2] = {0, 1};
    step_io io[] = {{"tokens", &zero, 1, 0},
                    {"positions", &zero, 1, 0},
                    {"block_table", st->block_table, 1, llm->max_blocks},
                    {"seq_lens", query_start + 1, 1, 0},
                    {"query_start", query_start, 2, 0},
                    {"last_token", &zero, 1, 0},
                    {"sample_params", st->params, 1, llm->n_params},
                    {"sample_seq", st->seq, 1, SAMPLE_SEQ}};
    KILN_TRY(set_inputs(st->ctx, io, (int)(sizeof io / sizeof io[0]) - (llm->has_sampler ? 0 : 2)));
    for (int32_t l = 0; l < c->n_layers; l++) {
        snprintf(name, sizeof name, "kv_cache.%d", (int)l);
        KILN_TRY(kiln_context_copy_input(st->ctx, name, st->zeros, layer_bytes));
    }
    return KILN_OK;
}

/* One step: tokens [from, from + c) of the sequence, every one's logits. */
static kiln_status score_step(kiln_llm *llm, score_state *st, const int32_t *ids, size_t from, int32_t c)
{
    for (int32_t j = 0; j < c; j++) {
        st->tokens[j] = ids[from + (size_t)j];
        st->positions[j] = (int32_t)from + j;
        st->last[j] = j;
    }
    int32_t seq_len = (int32_t)from + c, query_start[2] = {0, c};
    step_io io[] = {{"tokens", st->tokens, c, 0},
                    {"positions", st->positions, c, 0},
                    {"block_table", st->block_table, 1, llm->max_blocks},
                    {"seq_lens", &seq_len, 1, 0},
                    {"query_start", query_start, 2, 0},
                    {"last_token", st->last, c, 0},
                    {"sample_params", st->params, c, llm->n_params},
                    {"sample_seq", st->seq, c, SAMPLE_SEQ}};
    KILN_TRY(set_inputs(st->ctx, io, (int)(sizeof io / sizeof io[0]) - (llm->has_sampler ? 0 : 2)));
    KILN_TRY(kiln_context_enqueue(st->ctx, NULL));
    KILN_TRY(kiln_context_copy_output(st->ctx, "logits", st->logits,
                                      (size_t)c * (size_t)llm->cfg.vocab_size * sizeof *st->logits));
    KILN_TRY(kiln_context_synchronize(st->ctx));
    for (int32_t i = 0; i < st->n_probes; i++) {
        char name[32];
        snprintf(name, sizeof name, "calib.%d", (int)i);
        KILN_TRY(kiln_context_copy_output(st->ctx, name, st->probe, (size_t)c * sizeof *st->probe));
        KILN_TRY(kiln_context_synchronize(st->ctx));
        for (int32_t j = 0; j < c; j++)
            st->amax[i] = st->probe[j] > st->amax[i] ? st->probe[j] : st->amax[i];
    }
    return KILN_OK;
}

static kiln_status score_run(kiln_llm *llm, const int32_t *ids, size_t n, kiln_llm_logits_fn on_logits, void *user,
                             int32_t n_probes, float *amax)
{
    if (!llm || !ids || !on_logits || n == 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_llm_score: llm, ids (n >= 1) and on_logits are required");
    const kiln_llm_config *c = &llm->cfg;
    size_t cap = (size_t)llm->max_blocks * (size_t)c->block_size;
    if (cap > (size_t)c->max_seq_len)
        cap = (size_t)c->max_seq_len;
    if (n > cap)
        return kiln_fail(KILN_ERROR_LIMIT, "scoring %zu tokens exceeds the engine's max sequence length %zu", n, cap);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab_size)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "token %zu is id %d, outside the vocabulary of %d", i,
                             (int)ids[i], (int)c->vocab_size);
    score_state st;
    memset(&st, 0, sizeof st);
    st.n_probes = n_probes, st.amax = amax;
    kiln_status s = score_setup(llm, n, &st);
    for (size_t from = 0; s == KILN_OK && from < n; from += (size_t)st.chunk) {
        int32_t step = n - from < (size_t)st.chunk ? (int32_t)(n - from) : st.chunk;
        s = score_step(llm, &st, ids, from, step);
        for (int32_t j = 0; s == KILN_OK && j < step; j++)
            on_logits(user, from + (size_t)j, st.logits + (size_t)j * (size_t)c->vocab_size);
    }
    score_state_free(&st);
    return s;
}

kiln_status kiln_llm_score(kiln_llm *llm, const int32_t *ids, size_t n, kiln_llm_logits_fn on_logits, void *user)
{
    return score_run(llm, ids, n, on_logits, user, 0, NULL);
}

static void ignore_logits(void *user, size_t position, const float *logits) {}

kiln_status kiln_llm_score_probe(kiln_llm *llm, const int32_t *ids, size_t n, int32_t n_probes, float *amax)
{
    for (int32_t i = 0; i < n_probes; i++)
        amax[i] = 0.0f;
    return score_run(llm, ids, n, ignore_logits, NULL, n_probes, amax);
}

/* ---- the engine and its weights --------------------------------------------------------------------------- */

/* Whether layer L gathers rows of its input 0: a gather, or kiln's
 * QuantGather over a quantized table. */
static int is_gather(const kiln_graph *g, const kiln_layer *L)
{
    if (L->op == KILN_OP_GATHER)
        return 1;
    if (L->op != KILN_OP_PLUGIN || L->p.plugin.index < 0 || L->p.plugin.index >= g->n_plugins)
        return 0;
    const kiln_plugin_rec *r = &g->plugins[L->p.plugin.index];
    return !strcmp(r->name, "QuantGather") && !strcmp(r->plugin_namespace, "kiln");
}

/* Whether every reader of constant t gathers rows of it (a step reads one
 * row per token, not the table). */
static int gather_only(const kiln_graph *g, int32_t t)
{
    int readers = 0;
    for (int32_t l = 0; l < g->n_layers; l++) {
        const kiln_layer *L = &g->layers[l];
        for (int32_t i = 0; i < L->n_inputs; i++) {
            if (L->inputs[i] != t)
                continue;
            if (!is_gather(g, L) || i != 0)
                return 0;
            readers++;
        }
    }
    return readers > 0;
}

const kiln_engine *kiln_llm_engine(const kiln_llm *llm) { return llm->engine; }

void kiln_llm_weight_bytes(const kiln_llm *llm, size_t *total, size_t *per_token)
{
    const kiln_graph *g = &llm->engine->graph;
    size_t all = 0, step = 0;
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        if (!(r->flags & KILN_TENSOR_CONSTANT))
            continue;
        all += r->data_size;
        if (!gather_only(g, t))
            step += r->data_size;
    }
    if (total)
        *total = all;
    if (per_token)
        *per_token = step;
}
