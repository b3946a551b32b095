/* Text generation over an LLM engine (include/kiln/llm.h): opening the
 * engine with its KV cache and step buffers, the continuous-batching
 * scheduler, sampling, streaming and stop strings. */
#include <kiln/kiln.h>
#include <kiln/llm.h>

#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/api_struct.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "sample/sample.h"
#include "llm/chat_template.h"
#include "llm/kv_cache.h"
#include "llm/llm_config.h"
#include "llm/llm_internal.h"
#include "llm/sampler.h"
#include "llm/tokenizer.h"

static const char *const step_input_names[N_STEP_INPUTS] = {"tokens",      "positions",  "block_table",   "seq_lens",
                                                            "query_start", "last_token", "sample_params", "sample_seq"};

/* ---- small helpers ---------------------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the versioned structs ------------------------------------------------------------- */

void kiln_llm_options_init(kiln_llm_options *options)
{
    if (!options)
        return;
    memset(options, 0, sizeof *options);
    options->struct_size = (uint32_t)sizeof *options;
    options->abi_version = KILN_API_VERSION;
    options->kv_cache_fraction = 0.9f;
}

void kiln_llm_sampling_init(kiln_llm_sampling *s)
{
    if (!s)
        return;
    memset(s, 0, sizeof *s);
    s->struct_size = (uint32_t)sizeof *s;
    s->abi_version = KILN_API_VERSION;
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
}

void kiln_llm_request_init(kiln_llm_request *req)
{
    if (!req)
        return;
    memset(req, 0, sizeof *req);
    req->struct_size = (uint32_t)sizeof *req;
    req->abi_version = KILN_API_VERSION;
    req->max_tokens = 128;
    req->logprobs = -1;
}

void kiln_llm_message_init(kiln_llm_message *m)
{
    if (!m)
        return;
    memset(m, 0, sizeof *m);
    m->struct_size = (uint32_t)sizeof *m;
    m->abi_version = KILN_API_VERSION;
}

const char *kiln_llm_finish_name(kiln_llm_finish f)
{
    switch (f) {
    case KILN_LLM_FINISH_LENGTH: return "length";
    case KILN_LLM_FINISH_EOS: return "eos";
    case KILN_LLM_FINISH_STOP: return "stop";
    case KILN_LLM_FINISH_CANCELLED: return "cancelled";
    case KILN_LLM_FINISH_ERROR: return "error";
    default: return "?";
    }
}

void kiln_llm_result_free(kiln_llm_result *r)
{
    if (!r)
        return;
    free(r->prompt_ids);
    free(r->ids);
    free(r->text);
    free(r->error);
    free(r->logprobs);
    free(r);
}

/* ---- open / close -------------------------------------------------------------------- */

void kiln_llm_close(kiln_llm *llm)
{
    if (!llm)
        return;
    kiln_context_destroy(llm->ctx);
    kiln_engine_destroy(llm->engine);
    kiln_tokenizer_free(llm->tok);
    kiln_kv_pool_free(&llm->pool);
    free(llm->default_system);
    kiln_jinja_free(llm->chat);
    free(llm->chat_bos);
    free(llm->chat_eos);
    step_host *h = &llm->h;
    free(h->tokens);
    free(h->positions);
    free(h->block_table);
    free(h->seq_lens);
    free(h->last_token);
    free(h->query_start);
    free(h->params);
    free(h->seq);
    free(llm->free_slots);
    free(h->next);
    free(h->logits);
    for (int i = 0; i < N_STEP_INPUTS; i++)
        free(llm->shadow[i]);
    free(llm->cand);
    free(llm);
}

/* The optional "default_system" string of LLMC: the system prompt the
 * model's own chat template inserts when a conversation has none. */
static kiln_status read_default_system(kiln_llm *llm, const void *data, size_t size)
{
    json_t *root = json_loadb(data, size, 0, NULL);
    const char *s = root ? json_string_value(json_object_get(root, "default_system")) : NULL;
    if (s && !(llm->default_system = strdup(s))) {
        json_decref(root);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory reading LLMC");
    }
    json_decref(root);
    return KILN_OK;
}

/* The optional CHAT section: the checkpoint's own chat template, parsed
 * once here, and the token texts it is rendered with. */
static kiln_status read_chat_section(kiln_llm *llm, const char *path)
{
    const void *data = NULL;
    size_t size = 0;
    if (kiln_engine_find_section(llm->engine, KILN_FOURCC('C', 'H', 'A', 'T'), &data, &size) != KILN_OK)
        return KILN_OK;
    json_error_t e;
    json_t *root = json_loadb(data, size, 0, &e);
    json_t *t = json_object_get(root, "template"), *b = json_object_get(root, "bos_token"),
           *eos = json_object_get(root, "eos_token");
    kiln_status s = KILN_OK;
    if (!json_is_string(t) || !(json_is_string(b) || json_is_null(b)) || !(json_is_string(eos) || json_is_null(eos)))
        s = kiln_fail(KILN_ERROR_FORMAT,
                      "%s: section CHAT: expected {\"template\": string, \"bos_token\", "
                      "\"eos_token\": string or null}",
                      path);
    else if ((s = kiln_jinja_parse(json_string_value(t), json_string_length(t), &llm->chat)) != KILN_OK)
        kiln_fail_context(s, "%s: section CHAT", path);
    else if ((json_is_string(b) && !(llm->chat_bos = strdup(json_string_value(b)))) ||
             (json_is_string(eos) && !(llm->chat_eos = strdup(json_string_value(eos)))))
        s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory reading section CHAT");
    json_decref(root);
    return s;
}

/* An input the step network must have, with its profile's max. */
static kiln_status io_max(const kiln_llm *llm, const char *name, kiln_dtype want, kiln_dims *max)
{
    kiln_dtype dt;
    int32_t is_input;
    kiln_dims dims, mn, opt;
    if (kiln_engine_io_tensor_info(llm->engine, name, &dt, &is_input, &dims) != KILN_OK)
        return kiln_fail(KILN_ERROR_FORMAT, "LLM engine has no I/O tensor \"%s\" (docs/llm.md)", name);
    if (dt != want)
        return kiln_fail(KILN_ERROR_FORMAT, "LLM engine tensor \"%s\" is %s, expected %s", name, kiln_dtype_name(dt),
                         kiln_dtype_name(want));
    if (!is_input) {
        *max = dims;
        return KILN_OK;
    }
    if (kiln_engine_num_profiles(llm->engine) < 1 ||
        kiln_engine_profile_shape(llm->engine, 0, name, &mn, &opt, max) != KILN_OK)
        *max = dims;
    return KILN_OK;
}

/* What a chat needs: one sequence at max_seq_len, in whole blocks, capped
 * at a quarter of the memory. Batches of several long sequences ask for
 * more (kv_cache_mb); requests that do not fit together wait or fail
 * with KILN_ERROR_LIMIT rather than every CPU process reserving
 * max_batch full contexts. */
static size_t default_cache_bytes(const kiln_llm *llm, size_t block_bytes)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t quarter = pages > 0 && page > 0 ? (size_t)pages / 4 * (size_t)page : (size_t)1 << 30;
    const kiln_llm_config *c = &llm->cfg;
    size_t per_seq = ((size_t)c->max_seq_len + (size_t)c->block_size - 1) / (size_t)c->block_size;
    size_t want;
    if (kiln_mul_overflow(per_seq, block_bytes, &want))
        return quarter;
    return want < quarter ? want : quarter;
}

static int on_gpu(const kiln_llm *llm) { return kiln_engine_backend(llm->engine) != KILN_BACKEND_CPU; }

static kiln_status set_cache_shapes(kiln_llm *llm, int64_t n_blocks)
{
    const kiln_llm_config *c = &llm->cfg;
    char name[32];
    kiln_dims kd = {.rank = 5, .d = {n_blocks, 2, c->n_kv_heads, c->block_size, c->head_dim}};
    for (int32_t l = 0; l < c->n_layers; l++) {
        snprintf(name, sizeof name, "kv_cache.%d", (int)l);
        KILN_TRY(kiln_context_set_input_shape(llm->ctx, name, &kd));
    }
    return KILN_OK;
}

/* Blocks of a GPU cache: a fraction of the memory free now that the
 * weights, the activations and the step's buffers (at their max shapes,
 * with a one-block cache) are allocated, but no more than max_batch
 * sequences of max_seq_len tokens can hold at once. */
static kiln_status gpu_cache_blocks(kiln_llm *llm, const kiln_llm_options *opt, size_t *n)
{
    float fraction = opt->kv_cache_fraction;
    if (!(fraction > 0.0f && fraction <= 1.0f))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kv_cache_fraction %g is not in (0, 1]", (double)fraction);
    size_t free_b = 0, total = 0;
    KILN_TRY(kiln_engine_memory_info(llm->engine, &free_b, &total));
    size_t budget = (size_t)((double)free_b * (double)fraction);
    size_t cap = (size_t)llm->max_batch * (size_t)llm->max_blocks;
    *n = budget / llm->block_bytes;
    if (*n > cap)
        *n = cap;
    kiln_log(KILN_LOG_INFO, "llm: %zu of %zu MB of GPU memory free; %.2f of it allows %zu KV blocks, %zu used",
             free_b >> 20, total >> 20, (double)fraction, budget / llm->block_bytes, *n);
    return KILN_OK;
}

static kiln_status setup_cache(kiln_llm *llm, const kiln_llm_options *opt)
{
    const kiln_llm_config *c = &llm->cfg;
    kiln_dims kv_max, dims;
    kiln_dtype dt;
    int32_t is_input;
    if (kiln_engine_io_tensor_info(llm->engine, "kv_cache.0", &dt, &is_input, &dims) != KILN_OK)
        return kiln_fail(KILN_ERROR_FORMAT, "LLM engine has no I/O tensor \"kv_cache.0\" (docs/llm.md)");
    llm->kv_dtype = dt;
    KILN_TRY(io_max(llm, "kv_cache.0", dt, &kv_max));
    if (dims.rank != 5 || dims.d[1] != 2 || dims.d[2] != c->n_kv_heads || dims.d[3] != c->block_size ||
        dims.d[4] != c->head_dim)
        return kiln_fail(KILN_ERROR_FORMAT,
                         "kv_cache.0 is not [n_blocks, 2, n_kv_heads %d, block_size %d, head_dim %d]",
                         (int)c->n_kv_heads, (int)c->block_size, (int)c->head_dim);
    llm->block_bytes = 2 * (size_t)c->n_kv_heads * (size_t)c->block_size * (size_t)c->head_dim * kiln_dtype_size(dt) *
                       (size_t)c->n_layers;
    /* Every other input is set at its max already: this allocates the
     * step's buffers, so what is left is what the cache may take. */
    KILN_TRY(set_cache_shapes(llm, 1));
    size_t n = 0;
    if (opt->kv_cache_blocks > 0)
        n = (size_t)opt->kv_cache_blocks;
    else if (opt->kv_cache_mb)
        n = (opt->kv_cache_mb << 20) / llm->block_bytes;
    else if (on_gpu(llm))
        KILN_TRY(gpu_cache_blocks(llm, opt, &n));
    else
        n = default_cache_bytes(llm, llm->block_bytes) / llm->block_bytes;
    if (n < 1)
        return kiln_fail(KILN_ERROR_LIMIT,
                         "the KV cache's memory holds no block: one block of %d tokens takes %zu bytes over %d layers",
                         (int)c->block_size, llm->block_bytes, (int)c->n_layers);
    int graphs = on_gpu(llm) && !opt->no_cuda_graphs;
    int64_t limit = kv_max.rank == 5 ? kv_max.d[0] - graphs : INT32_MAX;
    if ((int64_t)n > limit)
        n = (size_t)limit;
    if (n > INT32_MAX - 1)
        n = INT32_MAX - 1;
    KILN_TRY(kiln_kv_pool_init(&llm->pool, (int32_t)n, c->block_size));
    llm->scratch_block = graphs ? (int32_t)n : -1;
    kiln_status s = set_cache_shapes(llm, (int64_t)n + graphs);
    if (s != KILN_OK)
        return kiln_fail_context(s, "a KV cache of %zu blocks (%zu MB)", n + (size_t)graphs,
                                 ((n + (size_t)graphs) * llm->block_bytes) >> 20);
    return KILN_OK;
}

/* Sets the step inputs' shapes for T tokens of S sequences (skipped when
 * they are those of the last step). */
static kiln_status set_step_shapes(kiln_llm *llm, int32_t T, int32_t S)
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
        kiln_dims dp = {.rank = 2, .d = {S, SAMPLE_PARAMS}};
        kiln_dims dr = {.rank = 2, .d = {S, SAMPLE_SEQ}};
        KILN_TRY(kiln_context_set_input_shape(llm->ctx, "sample_params", &dp));
        KILN_TRY(kiln_context_set_input_shape(llm->ctx, "sample_seq", &dr));
    }
    llm->cur_T = T;
    llm->cur_S = S;
    return KILN_OK;
}

static kiln_status setup_buffers(kiln_llm *llm)
{
    const kiln_llm_config *c = &llm->cfg;
    kiln_dims m;
    KILN_TRY(io_max(llm, "tokens", KILN_DTYPE_I32, &m));
    llm->max_tokens = m.rank == 1 && m.d[0] > 0 && m.d[0] < c->max_tokens ? (int32_t)m.d[0] : c->max_tokens;
    KILN_TRY(io_max(llm, "positions", KILN_DTYPE_I32, &m));
    KILN_TRY(io_max(llm, "block_table", KILN_DTYPE_I32, &m));
    if (m.rank != 2 || m.d[1] < 1)
        return kiln_fail(KILN_ERROR_FORMAT, "block_table must be [S, max_blocks] with a static max_blocks");
    llm->max_batch = m.d[0] > 0 && m.d[0] < c->max_batch ? (int32_t)m.d[0] : c->max_batch;
    llm->max_blocks = (int32_t)m.d[1];
    KILN_TRY(io_max(llm, "seq_lens", KILN_DTYPE_I32, &m));
    KILN_TRY(io_max(llm, "query_start", KILN_DTYPE_I32, &m));
    KILN_TRY(io_max(llm, "last_token", KILN_DTYPE_I32, &m));
    KILN_TRY(io_max(llm, "logits", KILN_DTYPE_F32, &m));
    if (m.rank != 2 || m.d[1] != c->vocab_size)
        return kiln_fail(KILN_ERROR_FORMAT, "logits must be [S, vocab_size %d]", (int)c->vocab_size);
    llm->has_sampler =
        kiln_engine_io_tensor_info(llm->engine, "next_token", &(kiln_dtype){0}, &(int32_t){0}, &m) == KILN_OK;
    if (llm->has_sampler) {
        KILN_TRY(io_max(llm, "next_token", KILN_DTYPE_I32, &m));
        KILN_TRY(io_max(llm, "sample_params", KILN_DTYPE_F32, &m));
        KILN_TRY(io_max(llm, "sample_seq", KILN_DTYPE_I32, &m));
        KILN_TRY(io_max(llm, "sample_state", KILN_DTYPE_I32, &m));
        if (m.rank != 2 || m.d[0] < llm->max_batch || m.d[1] != c->vocab_size)
            return kiln_fail(KILN_ERROR_FORMAT, "sample_state must be [max_batch %d, vocab_size %d]",
                             (int)llm->max_batch, (int)c->vocab_size);
    }
    size_t T = (size_t)llm->max_tokens, S = (size_t)llm->max_batch, V = (size_t)c->vocab_size;
    step_host *h = &llm->h;
    h->tokens = calloc(T, sizeof *h->tokens);
    h->positions = calloc(T, sizeof *h->positions);
    h->block_table = calloc(S * (size_t)llm->max_blocks, sizeof *h->block_table);
    h->seq_lens = calloc(S, sizeof *h->seq_lens);
    h->last_token = calloc(S, sizeof *h->last_token);
    h->query_start = calloc(S + 1, sizeof *h->query_start);
    h->params = calloc(S * SAMPLE_PARAMS, sizeof *h->params);
    h->seq = calloc(S * SAMPLE_SEQ, sizeof *h->seq);
    llm->free_slots = calloc(S, sizeof *llm->free_slots);
    h->next = calloc(S, sizeof *h->next);
    /* Host sampling only for engines without the sampling layer. */
    h->logits = calloc(llm->has_sampler ? 1 : S * V, sizeof *h->logits);
    llm->cand = calloc(llm->has_sampler ? 1 : V, sizeof *llm->cand);
    const size_t max_bytes[N_STEP_INPUTS] = {4 * T,       4 * T, 4 * S * (size_t)llm->max_blocks, 4 * S,
                                             4 * (S + 1), 4 * S, 4 * SAMPLE_PARAMS * S,           4 * SAMPLE_SEQ * S};
    for (size_t i = 0; i < S; i++)
        llm->free_slots[i] = (int32_t)(S - 1 - i);
    llm->n_free_slots = (int32_t)S;
    for (int i = 0; i < N_STEP_INPUTS; i++)
        if (!(llm->shadow[i] = malloc(max_bytes[i])))
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for the generation buffers");
    if (!h->tokens || !h->positions || !h->block_table || !h->seq_lens || !h->last_token || !h->query_start ||
        !h->params || !h->seq || !h->next || !h->logits || !llm->cand || !llm->free_slots)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for the generation buffers");
    /* The context's own buffers, allocated once at the max shapes: later
     * steps' smaller shapes reuse them, so their addresses (which a
     * captured graph holds) never change. */
    KILN_TRY(set_step_shapes(llm, llm->max_tokens, llm->max_batch));
    for (int32_t id = 0; id < c->vocab_size; id++) {
        size_t len = 0;
        if (kiln_tokenizer_token_to_piece(llm->tok, id, &len) && len > llm->max_piece)
            llm->max_piece = len;
    }
    return KILN_OK;
}

static void pad_rows(kiln_llm *llm, int32_t S, int32_t B);
static kiln_status run_step(kiln_llm *llm, int32_t T, int32_t S, int graph, int need_logits);

/* Captures one CUDA graph per decode batch size bucket (1, 2, 4, ...,
 * max_batch) by running a step of padding rows at each, so that decode
 * steps only replay. Nothing else is captured: prefill steps vary in T and
 * launch directly (PAUSED). */
static kiln_status capture_graphs(kiln_llm *llm)
{
    int32_t top = llm->max_batch < llm->max_tokens ? llm->max_batch : llm->max_tokens;
    double t0 = now_ms();
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
        pad_rows(llm, 0, b);
        llm->buckets[llm->n_buckets++] = b;
        kiln_status s = run_step(llm, b, b, 1, 0);
        if (s != KILN_OK)
            return kiln_fail_context(s, "capturing the decode step's CUDA graph for %d sequences", (int)b);
        KILN_TRY(kiln_context_graph_nodes(llm->ctx, &llm->graph_nodes));
        if (b == top || llm->n_buckets == (int32_t)(sizeof llm->buckets / sizeof llm->buckets[0]))
            break;
    }
    llm->capture_ms = now_ms() - t0;
    kiln_log(KILN_LOG_INFO, "llm: captured %d decode graphs in %.1f ms, %zu launches per step at %d sequences",
             (int)llm->n_buckets, llm->capture_ms, llm->graph_nodes, (int)top);
    return kiln_context_set_cuda_graph(llm->ctx, KILN_CUDA_GRAPH_PAUSED);
}

const kiln_llm_info *kiln_llm_info_get(const kiln_llm *llm) { return llm ? &llm->info : NULL; }

static void fill_info(kiln_llm *llm)
{
    const kiln_llm_config *c = &llm->cfg;
    kiln_llm_info *info = &llm->info;
    info->struct_size = (uint32_t)sizeof *info;
    info->abi_version = KILN_API_VERSION;
    info->architecture = c->architecture;
    info->chat_template = llm->chat ? "jinja" : kiln_llm_chat_template_name(c->chat_template);
    info->dtype = llm->kv_dtype;
    info->vocab_size = c->vocab_size;
    info->n_layers = c->n_layers;
    info->max_seq_len = c->max_seq_len;
    info->max_batch = llm->max_batch;
    info->max_tokens = llm->max_tokens;
    info->block_size = c->block_size;
    info->n_blocks = llm->pool.n_blocks;
    info->cache_tokens = (int64_t)llm->pool.n_blocks * c->block_size;
    info->cache_bytes = (size_t)llm->pool.n_blocks * llm->block_bytes;
    info->bos_id = c->bos_id;
    info->n_eos = c->n_eos;
    info->eos_ids = c->eos_ids;
    info->backend = kiln_engine_backend(llm->engine);
    info->n_graphs = llm->n_buckets;
    info->graph_capture_ms = llm->capture_ms;
    info->graph_nodes = llm->graph_nodes;
    info->n_threads = llm->n_threads;
}

static kiln_status open_engine(kiln_llm *llm, kiln_registry *reg, const char *path, const kiln_llm_options *opt)
{
    KILN_TRY(kiln_engine_load(reg, path, &llm->engine));
    const void *cfg = NULL, *tok = NULL;
    size_t cfg_size = 0, tok_size = 0;
    int has_cfg = kiln_engine_find_section(llm->engine, KILN_FOURCC('L', 'L', 'M', 'C'), &cfg, &cfg_size) == KILN_OK;
    int has_tok = kiln_engine_find_section(llm->engine, KILN_FOURCC('T', 'O', 'K', 'N'), &tok, &tok_size) == KILN_OK;
    if (!has_cfg || !has_tok)
        return kiln_fail(KILN_ERROR_FORMAT, "%s is not an LLM engine: it has no %s section", path,
                         has_cfg ? "TOKN (tokenizer)" : "LLMC (model config)");
    kiln_status s = kiln_llm_config_from_json(cfg, cfg_size, &llm->cfg);
    if (s != KILN_OK)
        return kiln_fail_context(s, "%s: section LLMC", path);
    KILN_TRY(read_default_system(llm, cfg, cfg_size));
    KILN_TRY(read_chat_section(llm, path));
    s = kiln_tokenizer_deserialize(tok, tok_size, &llm->tok);
    if (s != KILN_OK)
        return kiln_fail_context(s, "%s: section TOKN", path);
    KILN_TRY(kiln_context_create(llm->engine, &llm->ctx));
    if (!on_gpu(llm)) {
        if (opt->n_threads < 0 || opt->n_threads > 1024)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "n_threads %d is outside 0..1024", (int)opt->n_threads);
        llm->own_threads = opt->n_threads;
        if (opt->n_threads > 0)
            KILN_TRY(kiln_context_set_threads(llm->ctx, opt->n_threads));
        llm->n_threads = opt->n_threads > 0 ? opt->n_threads : kiln_threadpool_size(kiln_threadpool_global());
    }
    KILN_TRY(setup_buffers(llm));
    KILN_TRY(setup_cache(llm, opt));
    if (llm->scratch_block >= 0)
        KILN_TRY(capture_graphs(llm));
    fill_info(llm);
    return KILN_OK;
}

kiln_status kiln_llm_open(kiln_registry *reg, const char *path, const kiln_llm_options *opt, kiln_llm **out)
{
    if (!reg || !path || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_llm_open: registry, path and out are required");
    kiln_llm_options o;
    kiln_llm_options_init(&o);
    if (opt)
        KILN_TRY(kiln_api_struct_read(&o, sizeof o, opt, "LLM options"));
    kiln_llm *llm = calloc(1, sizeof *llm);
    if (!llm)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory opening %s", path);
    kiln_status s = open_engine(llm, reg, path, &o);
    if (s != KILN_OK) {
        kiln_llm_close(llm);
        return s;
    }
    *out = llm;
    return KILN_OK;
}

void kiln_llm_cancel(kiln_llm *llm) { atomic_store(&llm->cancel, 1); }

/* ---- tokens and text ------------------------------------------------------------------ */

kiln_status kiln_llm_tokenize(const kiln_llm *llm, const char *text, size_t len, uint32_t flags, int32_t **ids,
                              size_t *n_ids)
{
    uint32_t f = 0;
    if (flags & KILN_LLM_TOKENIZE_ADD_SPECIAL)
        f |= KILN_TOKENIZE_ADD_SPECIAL;
    if (flags & KILN_LLM_TOKENIZE_PARSE_SPECIAL)
        f |= KILN_TOKENIZE_PARSE_SPECIAL;
    return kiln_tokenizer_encode(llm->tok, text, len, f, ids, n_ids);
}

kiln_status kiln_llm_detokenize(const kiln_llm *llm, const int32_t *ids, size_t n_ids, char **text, size_t *len)
{
    return kiln_tokenizer_decode(llm->tok, ids, n_ids, 0, text, len);
}

static const char *piece_text(const kiln_llm *llm, int32_t id, char *buf, size_t cap)
{
    size_t len = 0;
    const char *p = id >= 0 ? kiln_tokenizer_token_to_piece(llm->tok, id, &len) : NULL;
    if (!p || len + 1 > cap)
        return NULL;
    memcpy(buf, p, len);
    buf[len] = '\0';
    return buf;
}

static kiln_status chat_render_tokenize(const kiln_llm *llm, const kiln_chat_message *messages, size_t n, int32_t **ids,
                                        size_t *n_ids)
{
    char bos[64], eos[64];
    kiln_chat_tokens t = {
        piece_text(llm, llm->cfg.bos_id, bos, sizeof bos),
        piece_text(llm, llm->cfg.n_eos > 0 ? llm->cfg.eos_ids[0] : -1, eos, sizeof eos),
    };
    char *text = NULL;
    size_t len = 0;
    if (llm->chat) {
        kiln_chat_tokens own = {llm->chat_bos, llm->chat_eos};
        KILN_TRY(kiln_chat_render_jinja(llm->chat, messages, n, 1, &own, &text, &len));
    } else {
        KILN_TRY(kiln_chat_render(llm->cfg.chat_template, messages, n, 1, llm->default_system, &t, &text, &len));
    }
    kiln_status s = kiln_tokenizer_encode(llm->tok, text, len, KILN_TOKENIZE_PARSE_SPECIAL, ids, n_ids);
    free(text);
    return s;
}

kiln_status kiln_llm_chat_tokenize(const kiln_llm *llm, const kiln_llm_message *const *messages, size_t n,
                                   int32_t **ids, size_t *n_ids)
{
    if (!llm || (n && !messages) || !ids || !n_ids)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "kiln_llm_chat_tokenize: llm, messages, ids and n_ids are required");
    kiln_chat_message *turns = malloc(sizeof *turns * (n ? n : 1));
    if (!turns)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for %zu chat messages", n);
    for (size_t i = 0; i < n; i++) {
        kiln_llm_message m;
        kiln_llm_message_init(&m);
        char what[32];
        snprintf(what, sizeof what, "message %zu", i);
        kiln_status s = messages[i] ? kiln_api_struct_read(&m, sizeof m, messages[i], what)
                                    : kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s is NULL", what);
        if (s != KILN_OK) {
            free(turns);
            return s;
        }
        turns[i].role = m.role;
        turns[i].content = m.content;
    }
    kiln_status s = chat_render_tokenize(llm, turns, n, ids, n_ids);
    free(turns);
    return s;
}

/* ---- per-request state -------------------------------------------------------------------- */

enum { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE };

typedef struct gen_seq {
    const kiln_llm_request *req; /* &req_copy */
    kiln_llm_request req_copy;   /* the caller's, read as far as its struct_size reaches */
    kiln_llm_sampling sampling;  /* req_copy.sampling points here */
    kiln_llm_result *res;        /* allocated by fill_result */
    int32_t *ids;                /* prompt then generated, cap n_prompt + max_tokens */
    size_t n_prompt, n_ids;
    size_t n_cached; /* ids whose keys and values are in the cache */
    int32_t *blocks; /* max_blocks */
    kiln_kv_seq kv;
    int32_t reserve; /* blocks it may need in all */
    uint8_t *seen;   /* [vocab] id occurs in prompt or output */
    int32_t *count;  /* [vocab] times generated */
    kiln_rng rng;
    kiln_tokenizer_stream *stream;
    char *text;
    size_t text_len, text_cap, emitted;
    size_t max_stop; /* longest stop string */
    int state;
    int32_t slot; /* row of sample_state, -1: none */
    kiln_llm_finish finish;
    double t_first, t_last;
} gen_seq;

static void seq_free(gen_seq *q)
{
    free(q->ids);
    free(q->blocks);
    free(q->seen);
    free(q->count);
    free(q->text);
    kiln_tokenizer_stream_free(q->stream);
}

static kiln_status prompt_ids(const kiln_llm *llm, const kiln_llm_request *r, int32_t **ids, size_t *n)
{
    if (!r->prompt) {
        int32_t *p = malloc(sizeof *p * (r->n_prompt_ids ? r->n_prompt_ids : 1));
        if (!p)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a prompt");
        for (size_t i = 0; i < r->n_prompt_ids; i++) {
            if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= llm->cfg.vocab_size) {
                free(p);
                return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "prompt id %d at %zu is outside the vocabulary [0, %d)",
                                 (int)r->prompt_ids[i], i, (int)llm->cfg.vocab_size);
            }
            p[i] = r->prompt_ids[i];
        }
        *ids = p;
        *n = r->n_prompt_ids;
        return KILN_OK;
    }
    return kiln_llm_prompt_ids(llm, r->prompt, r->prompt_len, ids, n);
}

kiln_status kiln_llm_prompt_ids(const kiln_llm *llm, const char *text, size_t len, int32_t **ids, size_t *n)
{
    int32_t *enc = NULL;
    size_t n_enc = 0;
    KILN_TRY(kiln_tokenizer_encode(llm->tok, text, len, KILN_TOKENIZE_PARSE_SPECIAL, &enc, &n_enc));
    int add = llm->cfg.add_bos && llm->cfg.bos_id >= 0 && (n_enc == 0 || enc[0] != llm->cfg.bos_id);
    int32_t *p = malloc(sizeof *p * (n_enc + 1));
    if (!p) {
        free(enc);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a prompt");
    }
    if (add)
        p[0] = llm->cfg.bos_id;
    memcpy(p + add, enc, sizeof *p * n_enc);
    free(enc);
    *ids = p;
    *n = n_enc + (size_t)add;
    return KILN_OK;
}

/* Tokenizes and checks one request and takes all the memory it will use. */
static kiln_status seq_init(kiln_llm *llm, int32_t i, const kiln_llm_request *user_req, gen_seq *q)
{
    const kiln_llm_config *c = &llm->cfg;
    char what[32];
    snprintf(what, sizeof what, "request %d", (int)i);
    if (!user_req)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s is NULL", what);
    kiln_llm_request_init(&q->req_copy);
    KILN_TRY(kiln_api_struct_read(&q->req_copy, sizeof q->req_copy, user_req, what));
    kiln_llm_sampling_init(&q->sampling);
    if (q->req_copy.sampling) {
        snprintf(what, sizeof what, "request %d: sampling", (int)i);
        KILN_TRY(kiln_api_struct_read(&q->sampling, sizeof q->sampling, q->req_copy.sampling, what));
    }
    q->req_copy.sampling = &q->sampling;
    q->req = &q->req_copy;
    const kiln_llm_request *r = q->req;
    q->slot = -1;
    if (r->max_tokens < 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "request %d: max_tokens %d must be >= 1", (int)i,
                         (int)r->max_tokens);
    int32_t *p = NULL;
    size_t n = 0;
    KILN_TRY(prompt_ids(llm, r, &p, &n));
    q->ids = p;
    q->n_prompt = q->n_ids = n;
    if (n == 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "request %d: the prompt is empty", (int)i);
    if (n >= (size_t)c->max_seq_len)
        return kiln_fail(KILN_ERROR_LIMIT,
                         "request %d: prompt of %zu tokens exceeds the engine's max sequence length %d", (int)i, n,
                         (int)c->max_seq_len);
    size_t total = n + (size_t)r->max_tokens;
    if (total > (size_t)c->max_seq_len)
        return kiln_fail(
            KILN_ERROR_LIMIT,
            "request %d: prompt of %zu tokens plus max_tokens %d exceeds the engine's max sequence length %d", (int)i,
            n, (int)r->max_tokens, (int)c->max_seq_len);
    q->reserve = kiln_kv_blocks_for(&llm->pool, (int64_t)total);
    if (q->reserve > llm->pool.n_blocks)
        return kiln_fail(
            KILN_ERROR_LIMIT,
            "request %d: prompt of %zu tokens plus max_tokens %d needs %d KV blocks, the cache holds %d (%lld tokens)",
            (int)i, n, (int)r->max_tokens, (int)q->reserve, (int)llm->pool.n_blocks,
            (long long)llm->pool.n_blocks * c->block_size);
    for (int32_t k = 0; k < r->n_stop; k++) {
        size_t len = r->stop[k] ? strlen(r->stop[k]) : 0;
        if (len == 0)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "request %d: stop string %d is empty", (int)i, (int)k);
        if (len > q->max_stop)
            q->max_stop = len;
    }
    int32_t *grown = realloc(q->ids, sizeof *q->ids * total);
    if (!grown)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for request %d", (int)i);
    q->ids = grown;
    /* A decoded token is at most its vocabulary string, tripled when each
     * byte of it is invalid UTF-8 and becomes U+FFFD. */
    q->text_cap = 3 * (llm->max_piece + 4) * (size_t)r->max_tokens + 1;
    q->text = malloc(q->text_cap);
    q->blocks = malloc(sizeof *q->blocks * (size_t)llm->max_blocks);
    q->seen = calloc((size_t)c->vocab_size, 1);
    q->count = calloc((size_t)c->vocab_size, sizeof *q->count);
    if (!q->text || !q->blocks || !q->seen || !q->count)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for request %d", (int)i);
    KILN_TRY(kiln_tokenizer_stream_create(llm->tok, 0, &q->stream));
    kiln_kv_seq_init(&q->kv, q->blocks, llm->max_blocks);
    for (size_t k = 0; k < n; k++)
        q->seen[q->ids[k]] = 1;
    kiln_rng_seed(&q->rng, r->sampling->seed);
    q->text[0] = '\0';
    return KILN_OK;
}

/* ---- text, stop strings and streaming ------------------------------------------------------ */

static void text_append(gen_seq *q, const char *s, size_t n)
{
    if (q->text_len + n + 1 > q->text_cap) {
        /* Beyond the bound computed at the start; only a tokenizer that
         * expands more than that gets here. */
        size_t cap = (q->text_len + n + 1) * 2;
        char *t = realloc(q->text, cap);
        if (!t)
            return;
        q->text = t;
        q->text_cap = cap;
    }
    memcpy(q->text + q->text_len, s, n);
    q->text_len += n;
    q->text[q->text_len] = '\0';
}

/* Looks for a stop string in the text not yet emitted (and the bytes before
 * it a stop string could start in); truncates there. Returns 1 on a match. */
static int stop_match(gen_seq *q)
{
    const kiln_llm_request *r = q->req;
    if (!r->n_stop)
        return 0;
    size_t from = q->emitted > q->max_stop ? q->emitted - q->max_stop : 0;
    size_t best = SIZE_MAX;
    for (int32_t k = 0; k < r->n_stop; k++) {
        size_t len = strlen(r->stop[k]);
        for (size_t at = from; at + len <= q->text_len; at++)
            if (memcmp(q->text + at, r->stop[k], len) == 0) {
                if (at < best)
                    best = at;
                break;
            }
    }
    if (best == SIZE_MAX)
        return 0;
    q->text_len = best;
    q->text[best] = '\0';
    return 1;
}

/* Bytes at the end of the text that could begin a stop string: held back
 * until the next token decides. A stop string's prefix starts on a UTF-8
 * character boundary, so what is emitted is always whole characters. */
static size_t stop_holdback(const gen_seq *q)
{
    const kiln_llm_request *r = q->req;
    size_t hold = 0;
    for (int32_t k = 0; k < r->n_stop; k++) {
        size_t len = strlen(r->stop[k]);
        for (size_t h = len - 1; h > hold; h--)
            if (h <= q->text_len - q->emitted && memcmp(q->text + q->text_len - h, r->stop[k], h) == 0) {
                hold = h;
                break;
            }
    }
    return hold;
}

/* Emits the text that became final; returns nonzero when the callback asks
 * to end the request. */
static int emit(gen_seq *q, int32_t index, int32_t token, int final, kiln_llm_token_fn fn, void *user)
{
    size_t hold = final ? 0 : stop_holdback(q);
    size_t end = q->text_len - hold;
    size_t from = q->emitted;
    if (end < from)
        end = from;
    q->emitted = end;
    if (!fn || (token < 0 && end == from))
        return 0;
    return fn(user, index, token, q->text + from, end - from);
}

static int has_penalty(const kiln_llm_sampling *p)
{
    return (p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f) || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

/* A running sequence holds at most one slot, and there are max_batch. */
static void slot_release(kiln_llm *llm, gen_seq *q)
{
    if (q->slot >= 0)
        llm->free_slots[llm->n_free_slots++] = q->slot;
    q->slot = -1;
}

/* ---- one request's end ---------------------------------------------------------------------- */

static void seq_finish(kiln_llm *llm, gen_seq *q, int32_t index, kiln_llm_finish why, kiln_llm_token_fn fn, void *user)
{
    if (why != KILN_LLM_FINISH_STOP) {
        const char *t;
        size_t n;
        if (kiln_tokenizer_stream_finish(q->stream, &t, &n) == KILN_OK && n) {
            text_append(q, t, n);
            if (stop_match(q))
                why = KILN_LLM_FINISH_STOP;
        }
    }
    emit(q, index, -1, 1, fn, user);
    q->finish = why;
    q->state = SEQ_DONE;
    kiln_kv_seq_release(&llm->pool, &q->kv);
    slot_release(llm, q);
}

/* Handles a sampled token. */
static void seq_accept(kiln_llm *llm, gen_seq *q, int32_t index, int32_t id, kiln_llm_token_fn fn, void *user)
{
    const kiln_llm_config *c = &llm->cfg;
    double t = now_ms();
    if (q->n_ids == q->n_prompt)
        q->t_first = t;
    q->t_last = t;
    q->ids[q->n_ids++] = id;
    q->seen[id] = 1;
    q->count[id]++;
    if (!q->req->ignore_eos)
        for (int32_t k = 0; k < c->n_eos; k++)
            if (c->eos_ids[k] == id) {
                seq_finish(llm, q, index, KILN_LLM_FINISH_EOS, fn, user);
                return;
            }
    const char *piece = NULL;
    size_t n = 0;
    if (kiln_tokenizer_stream_push(q->stream, id, &piece, &n) == KILN_OK && n)
        text_append(q, piece, n);
    if (stop_match(q)) {
        emit(q, index, id, 1, fn, user);
        seq_finish(llm, q, index, KILN_LLM_FINISH_STOP, fn, user);
        return;
    }
    if (emit(q, index, id, 0, fn, user)) {
        seq_finish(llm, q, index, KILN_LLM_FINISH_CANCELLED, fn, user);
        return;
    }
    if (q->n_ids - q->n_prompt >= (size_t)q->req->max_tokens || q->n_ids >= (size_t)c->max_seq_len)
        seq_finish(llm, q, index, KILN_LLM_FINISH_LENGTH, fn, user);
}

/* ---- the scheduler --------------------------------------------------------------------------- */

/* Admits waiting requests, in order, while the batch has room and the
 * blocks every running sequence may still need stay available: a running
 * sequence never waits for a block. */
static void admit(kiln_llm *llm, gen_seq *seqs, int32_t n, int32_t *n_running)
{
    int64_t promised = 0;
    for (int32_t i = 0; i < n; i++)
        if (seqs[i].state == SEQ_RUNNING)
            promised += seqs[i].reserve - seqs[i].kv.n_blocks;
    for (int32_t i = 0; i < n && *n_running < llm->max_batch; i++) {
        gen_seq *q = &seqs[i];
        if (q->state != SEQ_WAITING)
            continue;
        if (llm->pool.n_free - promised < q->reserve)
            break;
        q->state = SEQ_RUNNING;
        if (llm->has_sampler && has_penalty(q->req->sampling) && llm->n_free_slots > 0)
            q->slot = llm->free_slots[--llm->n_free_slots];
        promised += q->reserve;
        (*n_running)++;
    }
}

/* Packs one step: decode tokens first (one each), then prefill chunks in
 * the remaining token budget. step[s] is the sequence of row s. */
static int32_t pack_step(kiln_llm *llm, gen_seq *seqs, int32_t n, int32_t *step, int32_t *T_out)
{
    step_host *h = &llm->h;
    int32_t S = 0, T = 0;
    h->query_start[0] = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; i < n && S < llm->max_batch && T < llm->max_tokens; i++) {
            gen_seq *q = &seqs[i];
            if (q->state != SEQ_RUNNING)
                continue;
            size_t pending = q->n_ids - q->n_cached;
            if ((pass == 0) != (pending == 1))
                continue;
            size_t chunk = pending;
            if (chunk > (size_t)(llm->max_tokens - T))
                chunk = (size_t)(llm->max_tokens - T);
            /* Admission promised these blocks, so growing cannot fail. */
            if (kiln_kv_seq_grow(&llm->pool, &q->kv, (int64_t)(q->n_cached + chunk)) != KILN_OK)
                continue;
            for (size_t j = 0; j < chunk; j++) {
                h->tokens[T + (int32_t)j] = q->ids[q->n_cached + j];
                h->positions[T + (int32_t)j] = (int32_t)(q->n_cached + j);
            }
            T += (int32_t)chunk;
            int32_t *row = h->block_table + (size_t)S * (size_t)llm->max_blocks;
            memcpy(row, q->kv.blocks, sizeof *row * (size_t)q->kv.n_blocks);
            h->seq_lens[S] = (int32_t)(q->n_cached + chunk);
            h->query_start[S + 1] = T;
            h->last_token[S] = T - 1;
            step[S++] = i;
        }
    *T_out = T;
    return S;
}

/* Rows [S, B) of a decode step padded up to a graph's batch size B: each a
 * one-token sequence at position 0 of the scratch block, sampled greedily
 * and ignored. */
static void pad_rows(kiln_llm *llm, int32_t S, int32_t B)
{
    step_host *h = &llm->h;
    for (int32_t s = S; s < B; s++) {
        h->tokens[s] = 0;
        h->positions[s] = 0;
        h->block_table[(size_t)s * (size_t)llm->max_blocks] = llm->scratch_block;
        h->seq_lens[s] = 1;
        h->query_start[s + 1] = s + 1;
        h->last_token[s] = s;
        memset(h->params + SAMPLE_PARAMS * s, 0, SAMPLE_PARAMS * sizeof *h->params);
        h->seq[SAMPLE_SEQ * s + 2] = -1;
    }
}

/* The smallest captured batch size that holds a decode step of S
 * sequences, 0 when none does (or graphs are off). */
static int32_t bucket_for(const kiln_llm *llm, int32_t S)
{
    for (int32_t i = 0; i < llm->n_buckets; i++)
        if (llm->buckets[i] >= S)
            return llm->buckets[i];
    return 0;
}

/* Copies the step's inputs in, runs it, and copies out what the host
 * samples from: next_token, or the logits for an engine without the
 * sampling layer.
 * One synchronization. With `graph` the step is a decode step padded to a
 * captured batch size and replays its graph. */
/* Copies a step input in unless its buffer holds those bytes already. */
static kiln_status copy_in(kiln_llm *llm, int which, const void *src, size_t bytes)
{
    if (llm->shadow_bytes[which] == bytes && memcmp(llm->shadow[which], src, bytes) == 0)
        return KILN_OK;
    llm->shadow_bytes[which] = 0;
    KILN_TRY(kiln_context_copy_input(llm->ctx, step_input_names[which], src, bytes));
    memcpy(llm->shadow[which], src, bytes);
    llm->shadow_bytes[which] = bytes;
    return KILN_OK;
}

static kiln_status run_step(kiln_llm *llm, int32_t T, int32_t S, int graph, int need_logits)
{
    step_host *h = &llm->h;
    kiln_context *ctx = llm->ctx;
    const size_t i4 = sizeof(int32_t);
    KILN_TRY(set_step_shapes(llm, T, S));
    KILN_TRY(copy_in(llm, IN_TOKENS, h->tokens, i4 * (size_t)T));
    KILN_TRY(copy_in(llm, IN_POSITIONS, h->positions, i4 * (size_t)T));
    KILN_TRY(copy_in(llm, IN_BLOCK_TABLE, h->block_table, i4 * (size_t)S * (size_t)llm->max_blocks));
    KILN_TRY(copy_in(llm, IN_SEQ_LENS, h->seq_lens, i4 * (size_t)S));
    KILN_TRY(copy_in(llm, IN_QUERY_START, h->query_start, i4 * ((size_t)S + 1)));
    KILN_TRY(copy_in(llm, IN_LAST_TOKEN, h->last_token, i4 * (size_t)S));
    if (llm->has_sampler) {
        KILN_TRY(copy_in(llm, IN_PARAMS, h->params, sizeof *h->params * SAMPLE_PARAMS * (size_t)S));
        KILN_TRY(copy_in(llm, IN_SEQ, h->seq, i4 * SAMPLE_SEQ * (size_t)S));
    }
    if (llm->n_buckets)
        KILN_TRY(kiln_context_set_cuda_graph(ctx, graph ? KILN_CUDA_GRAPH_ON : KILN_CUDA_GRAPH_PAUSED));
    KILN_TRY(kiln_context_enqueue(ctx, NULL));
    if (llm->has_sampler)
        KILN_TRY(kiln_context_copy_output(ctx, "next_token", h->next, i4 * (size_t)S));
    if (need_logits)
        KILN_TRY(kiln_context_copy_output(ctx, "logits", h->logits,
                                          sizeof *h->logits * (size_t)S * (size_t)llm->cfg.vocab_size));
    return kiln_context_synchronize(ctx);
}

/* Fills row s's sampling inputs: the request's parameters when the row
 * samples, its state slot (the layer tracks the tokens every row of the
 * sequence feeds), and a uniform drawn from its PRNG exactly when
 * sampler.c would draw one. */
static void set_sampling_row(kiln_llm *llm, int32_t s, gen_seq *q, int sample)
{
    float *p = llm->h.params + SAMPLE_PARAMS * s;
    int32_t *sq = llm->h.seq + SAMPLE_SEQ * s;
    const kiln_llm_sampling *sp = q->req->sampling;
    memset(p, 0, SAMPLE_PARAMS * sizeof *p);
    sq[2] = q->slot;
    sq[3] = (int32_t)q->n_prompt;
    if (!sample || !llm->has_sampler)
        return;
    p[0] = sp->temperature;
    p[1] = (float)(sp->top_k < llm->cfg.vocab_size ? sp->top_k : llm->cfg.vocab_size);
    p[2] = sp->top_p;
    p[3] = sp->min_p;
    p[4] = sp->repetition_penalty;
    p[5] = sp->presence_penalty;
    p[6] = sp->frequency_penalty;
    if (sp->temperature > 0.0f)
        kiln_sampler_uniform_bits(&q->rng, sq);
}

static kiln_status generate_loop(kiln_llm *llm, gen_seq *seqs, int32_t n, int32_t *step, kiln_llm_token_fn fn,
                                 void *user)
{
    const int32_t V = llm->cfg.vocab_size;
    step_host *h = &llm->h;
    int32_t n_running = 0, n_done = 0;
    while (n_done < n) {
        if (atomic_load(&llm->cancel)) {
            for (int32_t i = 0; i < n; i++)
                if (seqs[i].state != SEQ_DONE)
                    seq_finish(llm, &seqs[i], i, KILN_LLM_FINISH_CANCELLED, fn, user);
            return KILN_OK;
        }
        admit(llm, seqs, n, &n_running);
        int32_t T = 0;
        int32_t S = pack_step(llm, seqs, n, step, &T);
        if (S == 0)
            return kiln_fail(KILN_ERROR_INTERNAL, "generation scheduled an empty step");
        int need_logits = 0;
        for (int32_t s = 0; s < S; s++) {
            gen_seq *q = &seqs[step[s]];
            int sample = (size_t)h->seq_lens[s] >= q->n_ids;
            set_sampling_row(llm, s, q, sample);
            need_logits |= sample && !llm->has_sampler;
        }
        int32_t B = T == S ? bucket_for(llm, S) : 0;
        if (B)
            pad_rows(llm, S, B);
        KILN_TRY(run_step(llm, B ? B : T, B ? B : S, B != 0, need_logits));
        for (int32_t s = 0; s < S; s++) {
            gen_seq *q = &seqs[step[s]];
            q->n_cached = (size_t)h->seq_lens[s];
            if (q->n_cached < q->n_ids)
                continue; /* a prefill chunk short of the prompt's end */
            int32_t id;
            if (llm->has_sampler) {
                id = h->next[s];
            } else {
                /* An engine built without the sampling layer. */
                float *row = h->logits + (size_t)s * (size_t)V;
                kiln_sampler_penalize(row, V, q->req->sampling, q->seen, q->count);
                id = kiln_sampler_sample(row, V, q->req->sampling, &q->rng, llm->cand);
            }
            if (id < 0 || id >= V)
                return kiln_fail(KILN_ERROR_INTERNAL, "the engine sampled id %d outside the vocabulary [0, %d)",
                                 (int)id, (int)V);
            seq_accept(llm, q, step[s], id, fn, user);
            if (q->state == SEQ_DONE) {
                n_running--;
                n_done++;
            }
        }
    }
    return KILN_OK;
}

static kiln_status fill_result(gen_seq *q, double t0)
{
    kiln_llm_result *r = calloc(1, sizeof *r);
    if (!r)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a result");
    q->res = r;
    r->struct_size = (uint32_t)sizeof *r;
    r->abi_version = KILN_API_VERSION;
    size_t n_gen = q->n_ids - q->n_prompt;
    r->prompt_ids = malloc(sizeof *r->prompt_ids * (q->n_prompt ? q->n_prompt : 1));
    r->ids = malloc(sizeof *r->ids * (n_gen ? n_gen : 1));
    r->text = malloc(q->text_len + 1);
    if (!r->prompt_ids || !r->ids || !r->text) {
        kiln_llm_result_free(r);
        q->res = NULL;
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a result");
    }
    memcpy(r->prompt_ids, q->ids, sizeof *r->ids * q->n_prompt);
    r->n_prompt_ids = q->n_prompt;
    memcpy(r->ids, q->ids + q->n_prompt, sizeof *r->ids * n_gen);
    r->n_ids = n_gen;
    memcpy(r->text, q->text, q->text_len + 1);
    r->text_len = q->text_len;
    r->finish = q->finish;
    if (n_gen) {
        r->prompt_ms = q->t_first - t0;
        r->generate_ms = q->t_last - q->t_first;
        r->prompt_tok_s = r->prompt_ms > 0 ? (double)q->n_prompt / (r->prompt_ms / 1e3) : 0;
        r->generate_tok_s = n_gen > 1 && r->generate_ms > 0 ? (double)(n_gen - 1) / (r->generate_ms / 1e3) : 0;
    }
    return KILN_OK;
}

kiln_status kiln_llm_generate(kiln_llm *llm, const kiln_llm_request *const *reqs, int32_t n, kiln_llm_token_fn fn,
                              void *user, kiln_llm_result **results)
{
    if (!llm || (n > 0 && (!reqs || !results)) || n < 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_llm_generate: llm, requests and results are required");
    double t0 = now_ms();
    gen_seq *seqs = calloc(n > 0 ? (size_t)n : 1, sizeof *seqs);
    int32_t *step = calloc((size_t)llm->max_batch, sizeof *step);
    kiln_status s =
        seqs && step ? KILN_OK : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for %d requests", (int)n);
    /* A request after one that fails seq_init is never initialized, and the
     * cleanup below must not release slot 0 for it. */
    for (int32_t i = 0; seqs && i < n; i++)
        seqs[i].slot = -1;
    for (int32_t i = 0; s == KILN_OK && i < n; i++)
        s = seq_init(llm, i, reqs[i], &seqs[i]);
    if (s == KILN_OK)
        s = generate_loop(llm, seqs, n, step, fn, user);
    for (int32_t i = 0; s == KILN_OK && i < n; i++)
        s = fill_result(&seqs[i], t0);
    for (int32_t i = 0; seqs && i < n; i++) {
        if (s == KILN_OK)
            results[i] = seqs[i].res;
        else
            kiln_llm_result_free(seqs[i].res);
    }
    for (int32_t i = 0; seqs && i < n; i++) {
        kiln_kv_seq_release(&llm->pool, &seqs[i].kv);
        slot_release(llm, &seqs[i]);
        seq_free(&seqs[i]);
    }
    free(seqs);
    free(step);
    atomic_store(&llm->cancel, 0);
    return s;
}
