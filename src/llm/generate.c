/* Text generation over an LLM engine (include/kiln/llm.h): opening the
 * engine with its KV cache and step buffers, tokens and chat, and
 * kiln_llm_generate, a batch of requests run through the scheduler
 * (scheduler.c). */
#include <kiln/kiln.h>
#include <kiln/llm.h>

#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <string.h>
#include <unistd.h>

#include "core/api_struct.h"
#include "core/error.h"
#include "core/threadpool.h"
#include "sample/sample.h"
#include "llm/chat_template.h"
#include "llm/kv_cache.h"
#include "llm/llm_config.h"
#include "llm/llm_internal.h"
#include "llm/tokenizer.h"
#include "runtime/runtime_internal.h"


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
    free(llm->packed);
    free(llm->free_slots);
    free(h->next);
    free(h->next_ahead);
    free(h->logits);
    free(h->logprob);
    free(h->top_ids);
    free(h->top_logprobs);
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

/* What a chat needs: one sequence at max_seq_len, in whole blocks, or
 * max_batch of them while that stays under CPU_KV_CHEAP (small engines:
 * tests, short contexts), capped at a quarter of the memory. Batches of
 * several long sequences ask for more (kv_cache_mb); requests that do not
 * fit together wait, rather than every CPU process reserving max_batch
 * full contexts (1.4 GB for SmolLM2-135M). */
#define CPU_KV_CHEAP ((size_t)64 << 20)

static size_t default_cache_bytes(const kiln_llm *llm, size_t block_bytes)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t quarter = pages > 0 && page > 0 ? (size_t)pages / 4 * (size_t)page : (size_t)1 << 30;
    const kiln_llm_config *c = &llm->cfg;
    size_t per_seq = ((size_t)c->max_seq_len + (size_t)c->block_size - 1) / (size_t)c->block_size;
    size_t one, all;
    if (kiln_mul_overflow(per_seq, block_bytes, &one))
        return quarter;
    if (!kiln_mul_overflow(one, (size_t)c->max_batch, &all) && all <= CPU_KV_CHEAP)
        one = all;
    return one < quarter ? one : quarter;
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

/* The step's inputs in one block of host memory and one of the engine's
 * (llm_internal.h: packed), each input bound at its offset: in the order
 * of `layout`, 256-byte aligned, block_table last. */
static kiln_status setup_packed(kiln_llm *llm, size_t T, size_t S, size_t P)
{
    static const int layout[N_STEP_INPUTS] = {IN_TOKENS,     IN_POSITIONS, IN_SEQ_LENS, IN_QUERY_START,
                                              IN_LAST_TOKEN, IN_PARAMS,    IN_SEQ,      IN_BLOCK_TABLE};
    static const char *const names[N_STEP_INPUTS] = {"tokens",      "positions",  "block_table",   "seq_lens",
                                                     "query_start", "last_token", "sample_params", "sample_seq"};
    const size_t bytes[N_STEP_INPUTS] = {
        [IN_TOKENS] = 4 * T,     [IN_POSITIONS] = 4 * T,         [IN_BLOCK_TABLE] = 4 * S * (size_t)llm->max_blocks,
        [IN_SEQ_LENS] = 4 * S,   [IN_QUERY_START] = 4 * (S + 1), [IN_LAST_TOKEN] = 4 * S,
        [IN_PARAMS] = 4 * P * S, [IN_SEQ] = 4 * SAMPLE_SEQ * S};
    size_t total = 0;
    for (int i = 0; i < N_STEP_INPUTS; i++) {
        llm->offset[layout[i]] = total;
        total += (bytes[layout[i]] + 255) / 256 * 256;
    }
    if (!(llm->packed = calloc(1, total)))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for the generation buffers");
    char *base = llm->packed;
    step_host *h = &llm->h;
    h->tokens = (int32_t *)(base + llm->offset[IN_TOKENS]);
    h->positions = (int32_t *)(base + llm->offset[IN_POSITIONS]);
    h->block_table = (int32_t *)(base + llm->offset[IN_BLOCK_TABLE]);
    h->seq_lens = (int32_t *)(base + llm->offset[IN_SEQ_LENS]);
    h->query_start = (int32_t *)(base + llm->offset[IN_QUERY_START]);
    h->last_token = (int32_t *)(base + llm->offset[IN_LAST_TOKEN]);
    h->params = (float *)(base + llm->offset[IN_PARAMS]);
    h->seq = (int32_t *)(base + llm->offset[IN_SEQ]);
    void *span = NULL;
    KILN_TRY(kiln_context_io_span(llm->ctx, total, &span));
    for (int i = 0; i < N_STEP_INPUTS; i++) {
        if (!llm->has_sampler && (i == IN_PARAMS || i == IN_SEQ))
            continue;
        KILN_TRY(kiln_context_set_tensor_address(llm->ctx, names[i], (char *)span + llm->offset[i]));
    }
    /* A first copy of everything: the staging memory a copy goes through
     * is taken now, at its largest, and never during a step. */
    KILN_TRY(kiln_context_copy_span(llm->ctx, "tokens", llm->packed, total));
    return kiln_context_synchronize(llm->ctx);
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
    llm->n_params = SAMPLE_PARAMS;
    if (llm->has_sampler) {
        KILN_TRY(io_max(llm, "next_token", KILN_DTYPE_I32, &m));
        KILN_TRY(io_max(llm, "sample_params", KILN_DTYPE_F32, &m));
        if (m.rank != 2 || (m.d[1] != SAMPLE_PARAMS && m.d[1] != SAMPLE_PARAMS_LOGPROBS))
            return kiln_fail(KILN_ERROR_FORMAT, "sample_params must be [S, %d] or [S, %d]", SAMPLE_PARAMS,
                             SAMPLE_PARAMS_LOGPROBS);
        llm->n_params = (int32_t)m.d[1];
        KILN_TRY(io_max(llm, "sample_seq", KILN_DTYPE_I32, &m));
        KILN_TRY(io_max(llm, "sample_state", KILN_DTYPE_I32, &m));
        if (m.rank != 2 || m.d[0] < llm->max_batch || m.d[1] != c->vocab_size)
            return kiln_fail(KILN_ERROR_FORMAT, "sample_state must be [max_batch %d, vocab_size %d]",
                             (int)llm->max_batch, (int)c->vocab_size);
        if (llm->n_params == SAMPLE_PARAMS_LOGPROBS) {
            KILN_TRY(io_max(llm, "logprob", KILN_DTYPE_F32, &m));
            KILN_TRY(io_max(llm, "top_ids", KILN_DTYPE_I32, &m));
            if (m.rank != 2 || m.d[1] < 1 || m.d[1] > SAMPLE_MAX_TOP)
                return kiln_fail(KILN_ERROR_FORMAT, "top_ids must be [S, 1..%d]", SAMPLE_MAX_TOP);
            llm->logprob_top = (int32_t)m.d[1];
            KILN_TRY(io_max(llm, "top_logprobs", KILN_DTYPE_F32, &m));
        }
    }
    size_t T = (size_t)llm->max_tokens, S = (size_t)llm->max_batch, V = (size_t)c->vocab_size;
    step_host *h = &llm->h;
    size_t P = (size_t)llm->n_params, K = llm->logprob_top > 0 ? (size_t)llm->logprob_top : 1;
    h->logprob = calloc(S, sizeof *h->logprob);
    h->top_ids = calloc(S * K, sizeof *h->top_ids);
    h->top_logprobs = calloc(S * K, sizeof *h->top_logprobs);
    llm->free_slots = calloc(S, sizeof *llm->free_slots);
    h->next = calloc(S, sizeof *h->next);
    h->next_ahead = calloc(S, sizeof *h->next_ahead);
    /* Host sampling only for engines without the sampling layer. */
    h->logits = calloc(llm->has_sampler ? 1 : S * V, sizeof *h->logits);
    llm->cand = calloc(llm->has_sampler ? 1 : V, sizeof *llm->cand);
    if (!h->next || !h->next_ahead || !h->logits || !llm->cand || !llm->free_slots || !h->logprob || !h->top_ids ||
        !h->top_logprobs)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for the generation buffers");
    for (size_t i = 0; i < S; i++)
        llm->free_slots[i] = (int32_t)(S - 1 - i);
    llm->n_free_slots = (int32_t)S;
    KILN_TRY(setup_packed(llm, T, S, P));
    /* Every input at its max shape: the context's own buffers (sample_state,
     * the caches until they are sized) are allocated once, so their
     * addresses, which captured graphs hold, never change. */
    KILN_TRY(kiln_llm_step_shapes(llm, llm->max_tokens, llm->max_batch));
    for (int32_t id = 0; id < c->vocab_size; id++) {
        size_t len = 0;
        if (kiln_tokenizer_token_to_piece(llm->tok, id, &len) && len > llm->max_piece)
            llm->max_piece = len;
    }
    return KILN_OK;
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
    info->dtype = llm->kv_dtype == KILN_DTYPE_U8 ? KILN_DTYPE_FP8_E4M3 : llm->kv_dtype; /* u8: E4M3 codes */
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
    llm->no_prefix_caching = opt->no_prefix_caching != 0;
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
        KILN_TRY(kiln_llm_capture_graphs(llm));
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
#ifdef __GLIBC__
    /* Reading the plan and the tokenizer builds and frees tens of MB of
     * small JSON objects; glibc keeps the freed heap pages resident unless
     * asked (SmolLM2: 21 MB of the process's peak, against llama.cpp's). */
    malloc_trim(0);
#endif
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

kiln_status kiln_llm_request_prompt(const kiln_llm *llm, const kiln_llm_request *r, int32_t **ids, size_t *n)
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

/* ---- a batch of requests through the scheduler ---------------------------------------------- */

/* What the scheduler's callbacks of one request of kiln_llm_generate need. */
typedef struct gen_call {
    kiln_llm_token_fn fn;
    void *user;
    int32_t index;
    kiln_llm_result **result;
} gen_call;

static int gen_on_token(void *user, const kiln_llm_token *tok)
{
    const gen_call *g = user;
    return g->fn ? g->fn(g->user, g->index, tok->id, tok->text, tok->len) : 0;
}

static void gen_on_finish(void *user, kiln_llm_result *res)
{
    const gen_call *g = user;
    *g->result = res;
}

kiln_status kiln_llm_generate(kiln_llm *llm, const kiln_llm_request *const *reqs, int32_t n, kiln_llm_token_fn fn,
                              void *user, kiln_llm_result **results)
{
    if (!llm || (n > 0 && (!reqs || !results)) || n < 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_llm_generate: llm, requests and results are required");
    gen_call *calls = calloc(n > 0 ? (size_t)n : 1, sizeof *calls);
    kiln_llm_result **res = calloc(n > 0 ? (size_t)n : 1, sizeof *res);
    kiln_llm_scheduler *sc = NULL;
    kiln_status s =
        calls && res ? KILN_OK : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for %d requests", (int)n);
    kiln_llm_scheduler_options opt;
    kiln_llm_scheduler_options_init(&opt);
    opt.thread = 0;
    opt.max_queue = n > 0 ? n : 1;
    opt.prefix_caching = !llm->no_prefix_caching;
    if (s == KILN_OK)
        s = kiln_llm_scheduler_start(llm, &opt, &sc);
    kiln_llm_callbacks cb;
    kiln_llm_callbacks_init(&cb);
    cb.on_token = gen_on_token;
    cb.on_finish = gen_on_finish;
    /* Every request is checked before any work starts. */
    for (int32_t i = 0; s == KILN_OK && i < n; i++) {
        calls[i] = (gen_call){fn, user, i, &res[i]};
        cb.user = &calls[i];
        if (!reqs[i])
            s = kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "request %d is NULL", (int)i);
        else if ((s = kiln_llm_submit(sc, reqs[i], &cb, NULL)) != KILN_OK)
            kiln_fail_context(s, "request %d", (int)i);
    }
    for (int busy = 1; s == KILN_OK && busy;)
        s = kiln_llm_scheduler_step(sc, &busy);
    for (int32_t i = 0; s == KILN_OK && i < n; i++)
        if (!res[i] || !res[i]->text)
            s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for the result of request %d", (int)i);
    /* What stop cancels is freed with the rest on failure; keep the
     * message of the failure. */
    char why[512] = "";
    if (s != KILN_OK)
        snprintf(why, sizeof why, "%s", kiln_last_error());
    kiln_llm_scheduler_stop(sc, 0);
    for (int32_t i = 0; res && i < n; i++) {
        if (s == KILN_OK)
            results[i] = res[i];
        else
            kiln_llm_result_free(res[i]);
    }
    free(calls);
    free(res);
    atomic_store(&llm->cancel, 0);
    return s == KILN_OK ? KILN_OK : kiln_fail(s, "%s", why);
}
