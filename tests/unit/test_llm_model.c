/* The Llama-family step network: built from tiny checkpoints
 * (tests/data/llm), run through kiln's runtime directly, checked for shape,
 * self-consistency (batched == separate, prefill+decode == prefill), the
 * same weights through the HF, GGUF and llama2.c importers, and against
 * transformers' logits and greedy tokens (refs.json, written by
 * tests/data/llm/make_references.py on a machine with PyTorch). */
#include <jansson.h>
#include <stdint.h>
#include <unistd.h>

#include "sample/sample.h"
#include "core/error.h"
#include "engine/engine_file.h"
#include "llm/model.h"
#include "runtime/runtime_internal.h"
#include "test.h"

#define DATA "tests/data/llm/"

static kiln_registry *reg;

/* An engine built from a checkpoint, with one context and its KV caches. */
typedef struct runner {
    kiln_llm_config cfg;
    kiln_engine *engine;
    kiln_context *ctx;
    int32_t n_blocks, max_blocks;
    void **caches;
    size_t cache_bytes;
} runner;

static void runner_free(runner *r)
{
    kiln_context_destroy(r->ctx);
    kiln_engine_destroy(r->engine);
    for (int32_t l = 0; r->caches && l < r->cfg.n_layers; l++)
        free(r->caches[l]);
    free(r->caches);
    memset(r, 0, sizeof *r);
}

/* Nonzero: runners build with quantized GGUF weights kept (opt.native). */
static int native_build;
static int32_t kv_cache_opt; /* KILN_LLM_KV_*: the runners' KV cache type */

static kiln_status runner_open_ck(runner *r, kiln_llm_checkpoint *ck, kiln_dtype dtype)
{
    memset(r, 0, sizeof *r);
    kiln_llm_build_options opt;
    kiln_llm_build_options_init(&opt);
    opt.dtype = dtype;
    opt.native = native_build;
    opt.kv_cache = kv_cache_opt;
    opt.max_seq_len = 64;
    opt.max_batch = 4;
    opt.block_size = 8;
    kiln_buffer buf = {0};
    KILN_TRY(kiln_llm_build_engine(ck, &opt, reg, NULL, &buf));
    r->cfg = ck->config;
    kiln_status st = kiln_engine_load_memory(reg, buf.data, buf.size, &r->engine);
    kiln_buffer_free(&buf);
    KILN_TRY(st);
    KILN_TRY(kiln_context_create(r->engine, &r->ctx));
    r->max_blocks = (r->cfg.max_seq_len + r->cfg.block_size - 1) / r->cfg.block_size;
    r->n_blocks = r->max_blocks * r->cfg.max_batch;
    size_t es = dtype == KILN_DTYPE_F32 ? 4 : 2;
    r->cache_bytes = (size_t)r->n_blocks * 2 * r->cfg.n_kv_heads * r->cfg.block_size * r->cfg.head_dim * es;
    r->caches = calloc((size_t)r->cfg.n_layers, sizeof *r->caches);
    for (int32_t l = 0; l < r->cfg.n_layers; l++)
        r->caches[l] = calloc(1, r->cache_bytes);
    return KILN_OK;
}

static kiln_status runner_open(runner *r, const char *kind, const char *path, kiln_dtype dtype)
{
    kiln_llm_checkpoint *ck = NULL;
    memset(r, 0, sizeof *r);
    if (strcmp(kind, "hf") == 0)
        KILN_TRY(kiln_llm_import_hf(path, &ck));
    else if (strcmp(kind, "gguf") == 0)
        KILN_TRY(kiln_llm_import_gguf(path, &ck));
    else {
        char tok[512];
        snprintf(tok, sizeof tok, "%s", path);
        char *slash = strrchr(tok, '/');
        snprintf(slash + 1, sizeof tok - (size_t)(slash + 1 - tok), "tokenizer.bin");
        KILN_TRY(kiln_llm_import_llama2c(path, tok, &ck));
    }
    kiln_status st = runner_open_ck(r, ck, dtype);
    kiln_llm_checkpoint_free(ck);
    return st;
}

static kiln_status set_shape(kiln_context *ctx, const char *name, int64_t n0, int64_t n1)
{
    kiln_dims d = {0};
    d.rank = n1 ? 2 : 1;
    d.d[0] = n0;
    d.d[1] = n1;
    KILN_TRY(kiln_context_set_input_shape(ctx, name, &d));
    return KILN_OK;
}

static kiln_status copy_i32(kiln_context *ctx, const char *name, const int32_t *v, size_t n)
{
    void *p;
    KILN_TRY(kiln_context_tensor_address(ctx, name, &p));
    memcpy(p, v, n * sizeof *v);
    return KILN_OK;
}

/* One step: S sequences; sequence s (cache blocks s*max_blocks...) gets
 * n_new[s] tokens new_ids[s] after past[s] cached tokens. logits: S × vocab. */
static kiln_status runner_step(runner *r, int32_t S, const int32_t *const *new_ids, const int32_t *n_new,
                               const int32_t *past, float *logits)
{
    int32_t T = 0;
    for (int32_t s = 0; s < S; s++)
        T += n_new[s];
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)T), *pos = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)(S * r->max_blocks));
    int32_t seq_lens[8], qs[9], last[8];
    qs[0] = 0;
    for (int32_t s = 0, t = 0; s < S; s++) {
        for (int32_t j = 0; j < n_new[s]; j++, t++) {
            tokens[t] = new_ids[s][j];
            pos[t] = past[s] + j;
        }
        for (int32_t b = 0; b < r->max_blocks; b++)
            bt[s * r->max_blocks + b] = s * r->max_blocks + b;
        seq_lens[s] = past[s] + n_new[s];
        qs[s + 1] = t;
        last[s] = t - 1;
    }
    kiln_context *ctx = r->ctx;
    kiln_status st = KILN_OK;
#define STEP_TRY(e) \
    do { \
        if ((st = (e)) != KILN_OK) \
            goto done; \
    } while (0)
    STEP_TRY(set_shape(ctx, "tokens", T, 0));
    STEP_TRY(set_shape(ctx, "positions", T, 0));
    STEP_TRY(set_shape(ctx, "block_table", S, r->max_blocks));
    STEP_TRY(set_shape(ctx, "seq_lens", S, 0));
    STEP_TRY(set_shape(ctx, "query_start", S + 1, 0));
    STEP_TRY(set_shape(ctx, "last_token", S, 0));
    /* The sampling layer's inputs: greedy rows (its ids are not checked
     * here; tests/unit/test_sampler.c checks the layer). */
    STEP_TRY(set_shape(ctx, "sample_params", S, SAMPLE_PARAMS_LOGPROBS));
    STEP_TRY(set_shape(ctx, "sample_seq", S, 4));
    for (int32_t l = 0; l < r->cfg.n_layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "kv_cache.%d", l);
        kiln_dims d = {0};
        d.rank = 5;
        d.d[0] = r->n_blocks, d.d[1] = 2, d.d[2] = r->cfg.n_kv_heads, d.d[3] = r->cfg.block_size,
        d.d[4] = r->cfg.head_dim;
        STEP_TRY(kiln_context_set_input_shape(ctx, name, &d));
        STEP_TRY(kiln_context_set_tensor_address(ctx, name, r->caches[l]));
    }
    STEP_TRY(copy_i32(ctx, "tokens", tokens, (size_t)T));
    STEP_TRY(copy_i32(ctx, "positions", pos, (size_t)T));
    STEP_TRY(copy_i32(ctx, "block_table", bt, (size_t)(S * r->max_blocks)));
    STEP_TRY(copy_i32(ctx, "seq_lens", seq_lens, (size_t)S));
    STEP_TRY(copy_i32(ctx, "query_start", qs, (size_t)S + 1));
    STEP_TRY(copy_i32(ctx, "last_token", last, (size_t)S));
    void *sp;
    STEP_TRY(kiln_context_tensor_address(ctx, "sample_params", &sp));
    memset(sp, 0, sizeof(float) * SAMPLE_PARAMS_LOGPROBS * (size_t)S);
    /* all -1: no penalty state slot */
    STEP_TRY(kiln_context_tensor_address(ctx, "sample_seq", &sp));
    memset(sp, 0xff, sizeof(int32_t) * 4 * (size_t)S);
    kiln_dims od;
    STEP_TRY(kiln_context_tensor_shape(ctx, "logits", &od));
    if (od.rank != 2 || od.d[0] != S || od.d[1] != r->cfg.vocab_size) {
        st = KILN_ERROR_SHAPE;
        fprintf(stderr, "logits shape [%lld, %lld], expected [%d, %d]\n", (long long)od.d[0], (long long)od.d[1], S,
                r->cfg.vocab_size);
        goto done;
    }
    STEP_TRY(kiln_context_enqueue(ctx, NULL));
    STEP_TRY(kiln_context_synchronize(ctx));
    void *out;
    STEP_TRY(kiln_context_tensor_address(ctx, "logits", &out));
    memcpy(logits, out, sizeof(float) * (size_t)S * (size_t)r->cfg.vocab_size);
done:
#undef STEP_TRY
    free(tokens);
    free(pos);
    free(bt);
    return st;
}

/* Prefill of one sequence from scratch (sequence slot 0). */
static kiln_status prefill(runner *r, const int32_t *ids, int32_t n, float *logits)
{
    const int32_t *p[1] = {ids};
    int32_t past = 0;
    return runner_step(r, 1, p, &n, &past, logits);
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Largest |a - b| over the largest |b|: the relative error the tests bound. */
static double rel_err(const float *a, const float *b, int32_t n)
{
    double d = 0, m = 1e-30;
    for (int32_t i = 0; i < n; i++) {
        if (fabs((double)a[i] - b[i]) > d || a[i] != a[i])
            d = a[i] != a[i] ? INFINITY : fabs((double)a[i] - b[i]);
        if (fabs((double)b[i]) > m)
            m = fabs((double)b[i]);
    }
    return d / m;
}

static const int32_t prompt[] = {5, 17, 42, 99, 3, 250, 7, 18, 60, 61, 62};
#define PROMPT_LEN ((int32_t)(sizeof prompt / sizeof prompt[0]))

static void test_network_shape_and_finite(void)
{
    runner r;
    CHECK_OK(runner_open(&r, "hf", DATA "llama", KILN_DTYPE_F32));
    if (!r.ctx)
        return;
    CHECK(r.cfg.vocab_size == 320 && r.cfg.n_layers == 2 && r.cfg.n_kv_heads == 2 && r.cfg.head_dim == 16);
    /* the engine's I/O is docs/llm.md's step network */
    const char *names[] = {"tokens",     "positions",  "block_table", "seq_lens", "query_start",
                           "last_token", "kv_cache.0", "kv_cache.1",  "logits"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        kiln_dtype dt;
        kiln_dims d;
        int32_t is_input;
        CHECK_OK(kiln_engine_io_tensor_info(r.engine, names[i], &dt, &is_input, &d));
        CHECK(is_input == (i < 8) && dt == (i < 6 ? KILN_DTYPE_I32 : KILN_DTYPE_F32));
    }
    float *logits = malloc(sizeof(float) * 320);
    CHECK_OK(prefill(&r, prompt, PROMPT_LEN, logits));
    int finite = 1;
    double spread = 0;
    for (int32_t i = 0; i < 320; i++) {
        finite &= isfinite(logits[i]) != 0;
        spread = fmax(spread, fabs(logits[i] - logits[0]));
    }
    CHECK(finite);
    CHECK(spread > 0.1); /* random weights: the logits are not all equal */
    free(logits);
    runner_free(&r);
}

/* Packing several sequences into one step, and prefilling in pieces, give
 * the logits of separate full prefills: attention only mixes a sequence
 * with its own past. */
static void test_batched_and_incremental_agree(void)
{
    runner r;
    CHECK_OK(runner_open(&r, "hf", DATA "qwen2", KILN_DTYPE_F32));
    if (!r.ctx)
        return;
    int32_t V = r.cfg.vocab_size;
    float *a = malloc(sizeof(float) * (size_t)V * 3), *b = malloc(sizeof(float) * (size_t)V * 3);
    const int32_t s1[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, s2[] = {200, 100}, s3[] = {31};
    CHECK_OK(prefill(&r, s1, 13, a));
    CHECK_OK(prefill(&r, s2, 2, a + V));
    CHECK_OK(prefill(&r, s3, 1, a + 2 * V));
    const int32_t *ps[3] = {s1, s2, s3};
    int32_t ns[3] = {13, 2, 1}, past[3] = {0, 0, 0};
    CHECK_OK(runner_step(&r, 3, ps, ns, past, b));
    for (int32_t s = 0; s < 3; s++)
        CHECK(rel_err(b + s * V, a + s * V, V) < 1e-5);
    /* s1 as 9 tokens then 3 then 1 (sequence slot 0 keeps its cache) */
    int32_t n9 = 9, n3 = 3, n1 = 1, p0 = 0, p9 = 9, p12 = 12;
    const int32_t *q[1] = {s1};
    CHECK_OK(runner_step(&r, 1, q, &n9, &p0, b));
    q[0] = s1 + 9;
    CHECK_OK(runner_step(&r, 1, q, &n3, &p9, b));
    q[0] = s1 + 12;
    CHECK_OK(runner_step(&r, 1, q, &n1, &p12, b));
    CHECK(rel_err(b, a, V) < 1e-5);
    free(a);
    free(b);
    runner_free(&r);
}

/* f16 and bf16 engines stay close to the f32 one (the dtype's precision
 * over two layers). */
static void test_half_dtypes(void)
{
    runner r32, r16, rb16;
    CHECK_OK(runner_open(&r32, "hf", DATA "smollm", KILN_DTYPE_F32));
    CHECK_OK(runner_open(&r16, "hf", DATA "smollm", KILN_DTYPE_F16));
    CHECK_OK(runner_open(&rb16, "hf", DATA "smollm", KILN_DTYPE_BF16));
    if (!r32.ctx || !r16.ctx || !rb16.ctx)
        return;
    float a[320], b[320], c[320];
    CHECK_OK(prefill(&r32, prompt, PROMPT_LEN, a));
    CHECK_OK(prefill(&r16, prompt, PROMPT_LEN, b));
    CHECK_OK(prefill(&rb16, prompt, PROMPT_LEN, c));
    CHECK(rel_err(b, a, 320) < 1e-2);
    CHECK(rel_err(c, a, 320) < 6e-2);
    CHECK(rel_err(b, a, 320) > 0); /* the engine really computes in f16 */
    runner_free(&r32);
    runner_free(&r16);
    runner_free(&rb16);
}

/* The sections make the engine self-contained: LLMC parses back to the
 * config, TOKN to the tokenizer. */
static void test_engine_sections(void)
{
    kiln_llm_checkpoint *ck = NULL;
    CHECK_OK(kiln_llm_import_hf(DATA "llama3", &ck));
    if (!ck)
        return;
    kiln_llm_build_options opt;
    kiln_llm_build_options_init(&opt);
    opt.max_seq_len = 32;
    kiln_network *net = NULL;
    CHECK_OK(kiln_llm_build_network(ck, &opt, reg, &net));
    CHECK(ck->config.max_seq_len == 32 && ck->config.max_tokens == 32 && ck->config.block_size == 16);
    CHECK(ck->config.rope.scaling == KILN_LLM_ROPE_LLAMA3 && ck->config.rope.theta == 500000.0);
    CHECK(ck->config.chat_template == KILN_LLM_CHAT_LLAMA3);
    CHECK(ck->config.n_eos == 2);
    kiln_network_destroy(net);
    kiln_buffer buf = {0};
    CHECK_OK(kiln_llm_build_engine(ck, &opt, reg, NULL, &buf));
    kiln_engine *e = NULL;
    CHECK_OK(kiln_engine_load_memory(reg, buf.data, buf.size, &e));
    kiln_engine_destroy(e);
    /* the engine file carries both sections; they parse back */
    kiln_graph g;
    kiln_engine_header_info info;
    CHECK_OK(kiln_engine_read(buf.data, buf.size, 0, &g, &info));
    int found = 0;
    for (int32_t i = 0; i < g.n_sections; i++) {
        const kiln_section_rec *s = &g.sections[i];
        if (s->id == KILN_LLM_SECTION_CONFIG) {
            kiln_llm_config back;
            CHECK_OK(kiln_llm_config_from_json(s->data, s->size, &back));
            CHECK(back.vocab_size == 320 && back.n_layers == 2 && back.max_seq_len == 32 && back.n_eos == 2 &&
                  back.eos_ids[1] == ck->config.eos_ids[1] && back.rope.scaling == KILN_LLM_ROPE_LLAMA3 &&
                  back.chat_template == KILN_LLM_CHAT_LLAMA3 && back.bos_id == ck->config.bos_id);
            found |= 1;
        } else if (s->id == KILN_LLM_SECTION_TOKENIZER) {
            kiln_tokenizer *t = NULL;
            CHECK_OK(kiln_tokenizer_deserialize(s->data, s->size, &t));
            CHECK(t && kiln_tokenizer_vocab_size(t) == kiln_tokenizer_vocab_size(ck->tokenizer));
            kiln_tokenizer_free(t);
            found |= 2;
        }
    }
    CHECK(found == 3);
    kiln_graph_free(&g);
    kiln_buffer_free(&buf);
    kiln_llm_checkpoint_free(ck);
}

/* ---- against transformers (refs.json) ------------------------------------ */

static int refs_missing;

/* Compares the engine built from `kind`:`path` with the family's refs.json:
 * last-token logits within `tol` relative, the 32 greedy tokens identical,
 * and (tokenize != 0) the prompt ids of the engine's own tokenizer. */
static void check_refs(const char *family, const char *kind, const char *path, double tol, int tokenize)
{
    char refs[256];
    snprintf(refs, sizeof refs, DATA "%s/refs.json", family);
    if (access(refs, R_OK) != 0) {
        refs_missing = 1;
        printf("SKIP %s: %s is absent (run tests/data/llm/make_references.py where PyTorch is installed)\n", path,
               refs);
        return;
    }
    json_error_t err;
    json_t *root = json_load_file(refs, 0, &err);
    CHECK(root != NULL);
    if (!root)
        return;
    runner r;
    kiln_llm_checkpoint *ck = NULL;
    CHECK_OK(runner_open(&r, kind, path, KILN_DTYPE_F32));
    if (tokenize) {
        /* a second import for its tokenizer: the runner's is inside the engine */
        if (strcmp(kind, "hf") == 0)
            CHECK_OK(kiln_llm_import_hf(path, &ck));
        else if (strcmp(kind, "gguf") == 0)
            CHECK_OK(kiln_llm_import_gguf(path, &ck));
        else
            CHECK_OK(kiln_llm_import_llama2c(path, DATA "tinyllama/tokenizer.bin", &ck));
    }
    json_t *prompts = json_object_get(root, "prompts");
    CHECK(json_array_size(prompts) == 8);
    int32_t V = r.cfg.vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V), *ref = malloc(sizeof(float) * (size_t)V);
    for (size_t i = 0; r.ctx && i < json_array_size(prompts); i++) {
        json_t *pr = json_array_get(prompts, i);
        json_t *ids = json_object_get(pr, "ids"), *jl = json_object_get(pr, "last_logits"),
               *gen = json_object_get(pr, "greedy");
        const char *text = json_string_value(json_object_get(pr, "text"));
        int32_t n = (int32_t)json_array_size(ids);
        CHECK(n >= 1 && (int32_t)json_array_size(jl) == V && json_array_size(gen) == 32);
        if (n < 1 || n + 32 > r.cfg.max_seq_len || (int32_t)json_array_size(jl) != V)
            continue;
        int32_t seq[128];
        for (int32_t j = 0; j < n; j++)
            seq[j] = (int32_t)json_integer_value(json_array_get(ids, (size_t)j));
        for (int32_t j = 0; j < V; j++)
            ref[j] = (float)json_number_value(json_array_get(jl, (size_t)j));
        if (ck && text) {
            int32_t *mine = NULL;
            size_t n_mine = 0;
            CHECK_OK(kiln_tokenizer_encode(ck->tokenizer, text, strlen(text), KILN_TOKENIZE_DEFAULT, &mine, &n_mine));
            int same = mine && n_mine == (size_t)n && memcmp(mine, seq, sizeof(int32_t) * (size_t)n) == 0;
            if (!same)
                fprintf(stderr, "%s prompt %zu: token ids differ from the HF tokenizer's\n", path, i);
            CHECK(same);
            free(mine);
        }
        CHECK_OK(prefill(&r, seq, n, logits));
        double e = rel_err(logits, ref, V);
        if (!(e <= tol))
            fprintf(stderr, "%s prompt %zu: logits relative error %g (tolerance %g)\n", path, i, e, tol);
        CHECK(e <= tol);
        /* greedy: 32 tokens, one decode step each */
        int32_t mismatch = -1;
        for (int32_t k = 0; k < 32; k++) {
            int32_t next = argmax(logits, V);
            if (mismatch < 0 && next != json_integer_value(json_array_get(gen, (size_t)k)))
                mismatch = k;
            seq[n + k] = next;
            const int32_t *p[1] = {seq + n + k};
            int32_t one = 1, past = n + k;
            CHECK_OK(runner_step(&r, 1, p, &one, &past, logits));
        }
        if (mismatch >= 0)
            fprintf(stderr, "%s prompt %zu: greedy token %d differs from transformers\n", path, i, mismatch);
        CHECK(mismatch < 0);
    }
    free(logits);
    free(ref);
    kiln_llm_checkpoint_free(ck);
    runner_free(&r);
    json_decref(root);
}

/* Every family from its HF directory against transformers. */
static void test_refs_hf(void)
{
    const char *fams[] = {"llama", "llama3", "mistral", "qwen2", "smollm", "tinyllama"};
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        char path[128];
        snprintf(path, sizeof path, DATA "%s", fams[i]);
        check_refs(fams[i], "hf", path, 1e-4, 1);
    }
}

/* The same weights through the GGUF (F32, Q/K rows permuted by the
 * converter, interleaved RoPE) and llama2.c importers match transformers
 * just as closely: the permutation and the rotation cancel exactly. */
static void test_refs_gguf_and_llama2c(void)
{
    check_refs("llama", "gguf", DATA "llama/model-f32.gguf", 1e-4, 1);
    check_refs("tinyllama", "llama2c", DATA "tinyllama/model.bin", 1e-4, 1);
}

/* Quantized and f16 GGUF files agree with the safetensors path to their
 * precision, and are not bit-identical to it (the quantized weights are
 * really used). */
static void test_gguf_quantized_close(void)
{
    const struct {
        const char *hf, *gguf;
        double tol;
    } cases[] = {{DATA "smollm", DATA "smollm/model-f16.gguf", 5e-3},
                 {DATA "smollm", DATA "smollm/model-q8_0.gguf", 5e-2},
                 {DATA "qwen2", DATA "qwen2/model-q8_0.gguf", 5e-2},
                 {DATA "llama3", DATA "llama3/model-f16.gguf", 5e-3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        runner a, b;
        CHECK_OK(runner_open(&a, "hf", cases[c].hf, KILN_DTYPE_F32));
        CHECK_OK(runner_open(&b, "gguf", cases[c].gguf, KILN_DTYPE_F32));
        if (a.ctx && b.ctx) {
            CHECK(a.cfg.rope.interleaved == 0 && b.cfg.rope.interleaved == (strstr(cases[c].gguf, "qwen2") == NULL));
            CHECK(a.cfg.tied_embeddings == b.cfg.tied_embeddings && a.cfg.qkv_bias == b.cfg.qkv_bias);
            float la[320], lb[320];
            CHECK_OK(prefill(&a, prompt, PROMPT_LEN, la));
            CHECK_OK(prefill(&b, prompt, PROMPT_LEN, lb));
            double e = rel_err(lb, la, 320);
            if (!(e < cases[c].tol && e > 0))
                fprintf(stderr, "%s: relative error %g vs the safetensors path\n", cases[c].gguf, e);
            CHECK(e < cases[c].tol && e > 0);
        }
        runner_free(&a);
        runner_free(&b);
    }
}

/* The checkpoint's own read_quantized, and a wrapper that hides k_proj and
 * up_proj (they are then dequantized): the native build must fall back to
 * separate matmuls for q/k/v and gate/up. */
static kiln_status (*own_read_quantized)(void *, const char *, uint32_t *, const void **, size_t *);
static kiln_status read_quantized_mixed(void *user, const char *name, uint32_t *type, const void **data, size_t *size)
{
    if (strstr(name, "k_proj") || strstr(name, "up_proj"))
        return KILN_ERROR_NOT_FOUND;
    return own_read_quantized(user, name, type, data, size);
}

/* Native builds of Q8_0 GGUFs (one stacked QuantMatMul for q/k/v and one
 * for gate/up; Qwen2's biases stacked too) against the same file
 * dequantized to f32: with QuantMatMul's f32 activations
 * (KILN_QMATMUL_F32ACT=1: identical weight values, so only the order of
 * the sums differs); with some parts unquantized (the unfused fallback);
 * in bf16 (QuantMatMul with bf16 activations); and with the CPU's default
 * 8-bit activations (llama.cpp's arithmetic: about 1% of error, as bf16
 * activations give). */
/* The dtype of the engine's tensor `name`, -1 when it has none. */
static int tensor_dtype(const runner *r, const char *name)
{
    const kiln_graph *g = &r->engine->graph;
    for (int32_t t = 0; t < g->n_tensors; t++)
        if (strcmp(g->tensors[t].name, name) == 0)
            return (int)g->tensors[t].dtype;
    return -1;
}

static void test_native_builds(void)
{
    const char *files[] = {DATA "smollm/model-q8_0.gguf", DATA "qwen2/model-q8_0.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        runner ref, nat, mixed, half, nat16;
        float lr[320], ln[320], lm[320], lh[320], lq[320], l16[320];
        CHECK_OK(runner_open(&ref, "gguf", files[i], KILN_DTYPE_F32));
        native_build = 1;
        /* the default native engine: an f16 KV cache (as llama.cpp's) */
        CHECK_OK(runner_open(&nat16, "gguf", files[i], KILN_DTYPE_F32));
        CHECK_OK(runner_open(&half, "gguf", files[i], KILN_DTYPE_BF16));
        /* the others keep an f32 cache, so that only the weights' arithmetic differs */
        kv_cache_opt = KILN_LLM_KV_F32;
        CHECK_OK(runner_open(&nat, "gguf", files[i], KILN_DTYPE_F32));
        kiln_llm_checkpoint *ck = NULL;
        CHECK_OK(kiln_llm_import_gguf(files[i], &ck));
        memset(&mixed, 0, sizeof mixed);
        if (ck) {
            own_read_quantized = ck->read_quantized;
            ck->read_quantized = read_quantized_mixed;
            CHECK_OK(runner_open_ck(&mixed, ck, KILN_DTYPE_F32));
            kiln_llm_checkpoint_free(ck);
        }
        native_build = 0;
        kv_cache_opt = KILN_LLM_KV_AUTO;
        CHECK(strcmp(ref.cfg.quantized, "") == 0 && strcmp(nat.cfg.quantized, "Q8_0") == 0 &&
              strcmp(mixed.cfg.quantized, "Q8_0") == 0);
        /* The native engine keeps the (tied) embedding as stored, one
         * constant for the gather and the output projection. */
        if (ref.engine && nat.engine) {
            CHECK(tensor_dtype(&ref, "model.embed_tokens.weight") == KILN_DTYPE_F32);
            CHECK(tensor_dtype(&nat, "model.embed_tokens.weight") == KILN_DTYPE_U8);
            CHECK(tensor_dtype(&nat, "lm_head.weight") == -1 || !nat.cfg.tied_embeddings);
            CHECK(nat.engine->image_size * 3 < ref.engine->image_size);
        }
        if (nat16.engine && nat.engine) {
            CHECK(tensor_dtype(&nat16, "kv_cache.0") == KILN_DTYPE_F16);
            CHECK(tensor_dtype(&nat, "kv_cache.0") == KILN_DTYPE_F32);
        }
        if (ref.ctx && nat.ctx && mixed.ctx && half.ctx && nat16.ctx) {
            setenv("KILN_QMATMUL_F32ACT", "1", 1);
            CHECK_OK(prefill(&ref, prompt, PROMPT_LEN, lr));
            CHECK_OK(prefill(&nat, prompt, PROMPT_LEN, ln));
            CHECK_OK(prefill(&nat16, prompt, PROMPT_LEN, l16));
            CHECK_OK(prefill(&mixed, prompt, PROMPT_LEN, lm));
            CHECK_OK(prefill(&half, prompt, PROMPT_LEN, lh));
            unsetenv("KILN_QMATMUL_F32ACT");
            CHECK_OK(prefill(&nat, prompt, PROMPT_LEN, lq));
            double en = rel_err(ln, lr, 320), em = rel_err(lm, lr, 320), eh = rel_err(lh, lr, 320);
            double eq = rel_err(lq, lr, 320), e16 = rel_err(l16, lr, 320);
            /* the f16 cache: keys and values rounded to 11 significant bits
             * (2^-11 = 4.9e-4 each) through a few layers */
            int ok = en < 1e-5 && em < 1e-5 && eh < 5e-2 && eh > 0 && eq < 5e-2 && eq > 0 && e16 < 2e-3 && e16 > 0;
            if (!ok)
                fprintf(stderr,
                        "%s: native %g, mixed %g, native bf16 %g, native 8-bit activations %g, native with an f16 "
                        "KV cache %g relative to the dequantized f32 build\n",
                        files[i], en, em, eh, eq, e16);
            CHECK(ok);
        }
        runner_free(&ref);
        runner_free(&nat);
        runner_free(&mixed);
        runner_free(&half);
        runner_free(&nat16);
    }
}

/* A GGUF whose matmul weights QuantMatMul's CUDA kernels cannot read
 * (llama.cpp's Q5_1 file: Q5_1 with a Q6_K output projection) builds for
 * CUDA with those weights expanded to the engine dtype and a warning that
 * names them; for the CPU every format stays native, with no warning. */
static char build_warning[512];
static void keep_warning(void *user, kiln_log_level level, const char *message)
{
    if (level == KILN_LOG_WARNING && strstr(message, "no CUDA kernel"))
        snprintf(build_warning, sizeof build_warning, "%s", message);
}

static void test_cuda_expands_formats_without_kernel(void)
{
    const kiln_backend backends[2] = {KILN_BACKEND_CPU, KILN_BACKEND_CUDA};
    const char *kept[2] = {"Q5_1,Q6_K", "Q6_K"};
    kiln_set_log(keep_warning, NULL, KILN_LOG_WARNING);
    for (int i = 0; i < 2; i++) {
        kiln_llm_checkpoint *ck = NULL;
        CHECK_OK(kiln_llm_import_gguf(DATA "quantized/model-q5_1.gguf", &ck));
        if (!ck)
            continue;
        kiln_llm_build_options opt;
        kiln_llm_build_options_init(&opt);
        opt.native = 1;
        opt.backend = backends[i];
        opt.dtype = i == 0 ? KILN_DTYPE_F32 : KILN_DTYPE_BF16;
        opt.max_seq_len = 32;
        build_warning[0] = '\0';
        kiln_network *net = NULL;
        CHECK_OK(kiln_llm_build_network(ck, &opt, reg, &net));
        if (strcmp(ck->config.quantized, kept[i]) != 0)
            fprintf(stderr, "%s build keeps \"%s\", expected \"%s\"\n", i ? "cuda" : "cpu", ck->config.quantized,
                    kept[i]);
        CHECK(strcmp(ck->config.quantized, kept[i]) == 0);
        if (i == 0)
            CHECK(build_warning[0] == '\0');
        else
            CHECK(strstr(build_warning, "Q5_1") && strstr(build_warning, "bf16") && !strstr(build_warning, "Q6_K"));
        kiln_network_destroy(net);
        kiln_llm_checkpoint_free(ck);
    }
    kiln_set_log(NULL, NULL, KILN_LOG_WARNING);
}

static const test_case_ tests[] = {TEST(test_network_shape_and_finite),
                                   TEST(test_batched_and_incremental_agree),
                                   TEST(test_half_dtypes),
                                   TEST(test_engine_sections),
                                   TEST(test_refs_hf),
                                   TEST(test_refs_gguf_and_llama2c),
                                   TEST(test_gguf_quantized_close),
                                   TEST(test_native_builds),
                                   TEST(test_cuda_expands_formats_without_kernel)};

int main(void)
{
    if (kiln_registry_create(&reg) != KILN_OK) {
        fprintf(stderr, "registry: %s\n", kiln_last_error());
        return 1;
    }
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        int before = test_failures_;
        tests[i].fn();
        printf("%s %s\n", test_failures_ == before ? "ok  " : "FAIL", tests[i].name);
    }
    printf("%d checks, %d failed\n", test_checks_, test_failures_);
    kiln_registry_destroy(reg);
    if (test_failures_)
        return 1;
    /* everything else passed; without references the comparison did not run */
    return refs_missing ? 77 : 0;
}
