/* Teacher-forced scoring (kiln_llm_score) and the weight bytes
 * (kiln_llm_weight_bytes) on engines of the tiny checkpoints of
 * tests/data/llm, against transformers' references there (refs.json,
 * tests/data/llm/make_references.py): scoring a prompt followed by HF's 32
 * greedy tokens must give HF's logits at the prompt's last position
 * (within 1e-4 relative, f32 engine) and, at every later position, an
 * argmax equal to HF's next greedy token — HF's greedy loop takes exactly
 * that argmax. Engines are built with max_batch 4 and KV blocks of 4
 * tokens, so every prompt is scored in several steps that attend to blocks
 * cached by earlier ones. The weight bytes are checked against the
 * parameter counts in the checkpoint's safetensors headers; the copy
 * bandwidth probe for its argument checks and a plausible result. */
#include <jansson.h>
#include <stdint.h>
#include <unistd.h>

#include "llm/gguf.h"
#include "llm/model.h"
#include "test.h"

#define DATA "tests/data/llm/"

static const char *const families[] = {"llama", "llama3", "mistral", "qwen2", "smollm", "tinyllama"};

typedef struct built {
    char path[256];
    kiln_registry *reg;
    kiln_llm *llm;
} built;

/* Builds the family's HF checkpoint into a temporary f32 engine file and
 * opens it with a 4-block generation cache (scoring brings its own). */
static int open_family(const char *family, built *b)
{
    memset(b, 0, sizeof *b);
    char dir[128];
    snprintf(dir, sizeof dir, DATA "%s", family);
    kiln_llm_checkpoint *ck = NULL;
    CHECK_OK(kiln_llm_import_hf(dir, &ck));
    if (!ck)
        return 0;
    kiln_llm_build_options opt;
    kiln_llm_build_options_init(&opt);
    opt.max_batch = 4;
    opt.block_size = 4;
    opt.max_seq_len = 96;
    kiln_buffer buf = {0};
    CHECK_OK(kiln_registry_create(&b->reg));
    kiln_status s = kiln_llm_build_engine(ck, &opt, b->reg, NULL, &buf);
    CHECK_OK(s);
    kiln_llm_checkpoint_free(ck);
    if (s != KILN_OK)
        return 0;
    snprintf(b->path, sizeof b->path, "/tmp/kiln-test-score-%s-%d.engine", family, (int)getpid());
    FILE *f = fopen(b->path, "wb");
    int ok = f && fwrite(buf.data, 1, buf.size, f) == buf.size;
    if (f)
        ok = fclose(f) == 0 && ok;
    kiln_buffer_free(&buf);
    CHECK(ok);
    kiln_llm_options lo;
    kiln_llm_options_init(&lo);
    lo.kv_cache_blocks = 4;
    CHECK_OK(kiln_llm_open(b->reg, b->path, &lo, &b->llm));
    return b->llm != NULL;
}

static void close_family(built *b)
{
    kiln_llm_close(b->llm);
    kiln_registry_destroy(b->reg);
    if (b->path[0])
        unlink(b->path);
}

/* ---- scoring against transformers ----------------------------------------------------- */

typedef struct collect {
    int32_t vocab;
    size_t n, calls;
    float *logits; /* [n, vocab] */
    int in_order;
} collect;

static void on_logits(void *user, size_t pos, const float *logits)
{
    collect *c = user;
    if (pos != c->calls)
        c->in_order = 0;
    c->calls++;
    if (pos < c->n)
        memcpy(c->logits + pos * (size_t)c->vocab, logits, sizeof(float) * (size_t)c->vocab);
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static double rel_err(const float *a, const json_t *ref, int32_t n)
{
    double num = 0, den = 0;
    for (int32_t i = 0; i < n; i++) {
        double r = json_number_value(json_array_get(ref, (size_t)i)), d = a[i] - r;
        num += d * d;
        den += r * r;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void score_family(const char *family)
{
    char refs[128];
    snprintf(refs, sizeof refs, DATA "%s/refs.json", family);
    json_t *root = json_load_file(refs, 0, NULL);
    CHECK(root != NULL);
    built b;
    if (!root || !open_family(family, &b)) {
        json_decref(root);
        return;
    }
    const kiln_llm_info *info = kiln_llm_info_get(b.llm);
    json_t *prompts = json_object_get(root, "prompts");
    CHECK(json_array_size(prompts) == 8);
    for (size_t i = 0; i < json_array_size(prompts); i++) {
        json_t *pr = json_array_get(prompts, i);
        json_t *jids = json_object_get(pr, "ids"), *greedy = json_object_get(pr, "greedy");
        size_t np = json_array_size(jids), ng = json_array_size(greedy), n = np + ng;
        int32_t ids[128];
        CHECK(np >= 1 && ng == 32 && n <= sizeof ids / sizeof ids[0]);
        if (np < 1 || n > sizeof ids / sizeof ids[0])
            continue;
        for (size_t j = 0; j < n; j++)
            ids[j] = (int32_t)json_integer_value(j < np ? json_array_get(jids, j) : json_array_get(greedy, j - np));
        collect c = {info->vocab_size, n, 0, malloc(sizeof(float) * n * (size_t)info->vocab_size), 1};
        CHECK_OK(kiln_llm_score(b.llm, ids, n, on_logits, &c));
        CHECK(c.calls == n && c.in_order);
        double e = rel_err(c.logits + (np - 1) * (size_t)info->vocab_size, json_object_get(pr, "last_logits"),
                           info->vocab_size);
        if (!(e <= 1e-4))
            fprintf(stderr, "%s prompt %zu: last prompt position's logits relative error %g\n", family, i, e);
        CHECK(e <= 1e-4);
        int32_t differ = -1;
        for (size_t k = 0; k < ng && differ < 0; k++)
            if (argmax(c.logits + (np - 1 + k) * (size_t)info->vocab_size, info->vocab_size) != ids[np + k])
                differ = (int32_t)k;
        if (differ >= 0)
            fprintf(stderr, "%s prompt %zu: teacher-forced argmax differs from HF's greedy token %d\n", family, i,
                    (int)differ);
        CHECK(differ < 0);
        free(c.logits);
    }
    close_family(&b);
    json_decref(root);
}

static void test_score_matches_transformers(void)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        score_family(families[i]);
}

/* ---- refusals --------------------------------------------------------------------------- */

static void count_calls(void *user, size_t pos, const float *logits)
{
    (void)pos;
    (void)logits;
    (*(size_t *)user)++;
}

static void test_score_refusals(void)
{
    built b;
    if (!open_family("llama", &b))
        return;
    const kiln_llm_info *info = kiln_llm_info_get(b.llm);
    int32_t ids[97] = {0};
    size_t calls = 0;
    ids[3] = info->vocab_size;
    CHECK_FAILS(kiln_llm_score(b.llm, ids, 5, count_calls, &calls), KILN_ERROR_INVALID_ARGUMENT, "token 3 is id");
    ids[3] = -1;
    CHECK_FAILS(kiln_llm_score(b.llm, ids, 5, count_calls, &calls), KILN_ERROR_INVALID_ARGUMENT,
                "outside the vocabulary");
    ids[3] = 0;
    CHECK_FAILS(kiln_llm_score(b.llm, ids, 97, count_calls, &calls), KILN_ERROR_LIMIT, "max sequence length 96");
    CHECK_FAILS(kiln_llm_score(b.llm, ids, 0, count_calls, &calls), KILN_ERROR_INVALID_ARGUMENT, "n >= 1");
    CHECK(calls == 0);
    /* the longest sequence the engine takes, then generation still works */
    CHECK_OK(kiln_llm_score(b.llm, ids, 96, count_calls, &calls));
    CHECK(calls == 96);
    kiln_llm_request req;
    kiln_llm_request_init(&req);
    req.prompt = "Hello";
    req.prompt_len = 5;
    req.max_tokens = 2;
    const kiln_llm_request *reqs[1] = {&req};
    kiln_llm_result *res = NULL;
    CHECK_OK(kiln_llm_generate(b.llm, reqs, 1, NULL, NULL, &res));
    CHECK(res && res->n_ids == 2);
    kiln_llm_result_free(res);
    close_family(&b);
}

/* ---- weight bytes -------------------------------------------------------------------------- */

/* Parameters in a safetensors file (its header's shapes); the embedding's
 * separately. */
static int64_t safetensors_params(const char *path, int64_t *embed)
{
    FILE *f = fopen(path, "rb");
    unsigned char len8[8];
    if (!f || fread(len8, 1, 8, f) != 8) {
        if (f)
            fclose(f);
        return -1;
    }
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--)
        len = len << 8 | len8[i];
    char *text = len < (1u << 24) ? malloc(len) : NULL;
    int ok = text && fread(text, 1, len, f) == len;
    fclose(f);
    json_t *h = ok ? json_loadb(text, len, 0, NULL) : NULL;
    free(text);
    if (!h)
        return -1;
    int64_t total = 0;
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v)
    {
        json_t *shape = json_object_get(v, "shape");
        if (!shape)
            continue;
        int64_t n = 1;
        for (size_t i = 0; i < json_array_size(shape); i++)
            n *= json_integer_value(json_array_get(shape, i));
        total += n;
        if (strcmp(key, "model.embed_tokens.weight") == 0)
            *embed = n;
    }
    json_decref(h);
    return total;
}

static void test_weight_bytes(void)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        const char *fam = families[i];
        char p1[128], p2[128];
        int64_t embed = 0, params;
        if (strcmp(fam, "mistral") == 0) {
            snprintf(p1, sizeof p1, DATA "%s/model-00001-of-00002.safetensors", fam);
            snprintf(p2, sizeof p2, DATA "%s/model-00002-of-00002.safetensors", fam);
            params = safetensors_params(p1, &embed) + safetensors_params(p2, &embed);
        } else {
            snprintf(p1, sizeof p1, DATA "%s/model.safetensors", fam);
            params = safetensors_params(p1, &embed);
        }
        CHECK(params > 0 && embed > 0);
        built b;
        if (!open_family(fam, &b))
            continue;
        size_t total = 0, per_token = 0;
        kiln_llm_weight_bytes(b.llm, &total, &per_token);
        /* Tied: the output projection reads the whole embedding each step. */
        char cfg[128];
        snprintf(cfg, sizeof cfg, DATA "%s/config.json", fam);
        json_t *c = json_load_file(cfg, 0, NULL);
        int tied = c && json_is_true(json_object_get(c, "tie_word_embeddings"));
        json_decref(c);
        size_t want_step = (size_t)(tied ? params : params - embed) * 4;
        if (total != (size_t)params * 4 || per_token != want_step)
            fprintf(stderr, "%s: weight bytes %zu / per token %zu, expected %zu / %zu (%lld parameters)\n", fam, total,
                    per_token, (size_t)params * 4, want_step, (long long)params);
        CHECK(total == (size_t)params * 4);
        CHECK(per_token == want_step);
        close_family(&b);
    }
}

/* A native engine of an untied GGUF keeps the embedding quantized for
 * kiln/QuantGather, which reads one row per token: a step reads every
 * constant but it, whose bytes are the GGUF's token_embd as stored. */
static void test_weight_bytes_native(void)
{
    const char *path = DATA "qwen2/model-q8_0.gguf";
    kiln_gguf *g = NULL;
    CHECK_OK(kiln_gguf_open(path, &g));
    const kiln_gguf_tensor *emb = g ? kiln_gguf_find_tensor(g, "token_embd.weight") : NULL;
    /* untied: the checkpoint has its own output.weight */
    CHECK(emb && emb->type == KILN_GGML_Q8_0 && kiln_gguf_find_tensor(g, "output.weight") != NULL);
    size_t emb_bytes = emb ? emb->size : 0;
    kiln_gguf_close(g);
    kiln_llm_checkpoint *ck = NULL;
    CHECK_OK(kiln_llm_import_gguf(path, &ck));
    built b;
    memset(&b, 0, sizeof b);
    if (!ck)
        return;
    kiln_llm_build_options opt;
    kiln_llm_build_options_init(&opt);
    opt.native = 1;
    opt.max_batch = 2;
    opt.block_size = 4;
    opt.max_seq_len = 32;
    kiln_buffer buf = {0};
    CHECK_OK(kiln_registry_create(&b.reg));
    CHECK_OK(kiln_llm_build_engine(ck, &opt, b.reg, NULL, &buf));
    kiln_llm_checkpoint_free(ck);
    snprintf(b.path, sizeof b.path, "/tmp/kiln-test-score-native-%d.engine", (int)getpid());
    FILE *f = fopen(b.path, "wb");
    int ok = buf.data && f && fwrite(buf.data, 1, buf.size, f) == buf.size;
    if (f)
        ok = fclose(f) == 0 && ok;
    kiln_buffer_free(&buf);
    CHECK(ok);
    if (ok)
        CHECK_OK(kiln_llm_open(b.reg, b.path, NULL, &b.llm));
    if (b.llm) {
        size_t total = 0, per_token = 0;
        kiln_llm_weight_bytes(b.llm, &total, &per_token);
        CHECK(emb_bytes > 0 && total > emb_bytes && per_token == total - emb_bytes);
    }
    close_family(&b);
}

/* ---- copy bandwidth -------------------------------------------------------------------------- */

static void test_copy_bandwidth(void)
{
    double bw = -1;
    CHECK_FAILS(kiln_backend_measure_copy_bandwidth(KILN_BACKEND_CPU, 1 << 20, 0, &bw), KILN_ERROR_INVALID_ARGUMENT,
                "reps 0");
    CHECK_FAILS(kiln_backend_measure_copy_bandwidth(KILN_BACKEND_CPU, 1 << 20, 65, &bw), KILN_ERROR_INVALID_ARGUMENT,
                "1..64");
    CHECK(bw == -1);
    CHECK_OK(kiln_backend_measure_copy_bandwidth(KILN_BACKEND_CPU, 4 << 20, 3, &bw));
    CHECK(bw > 1e6 && bw < 1e13);
    /* CUDA: a bandwidth where a GPU is present, else a target error. */
    double gpu = -1;
    kiln_status s = kiln_backend_measure_copy_bandwidth(KILN_BACKEND_CUDA, 16 << 20, 3, &gpu);
    if (s == KILN_OK)
        CHECK(gpu > 1e9);
    else
        CHECK(s == KILN_ERROR_TARGET && gpu == -1);
}

/* The device a benchmark names: the CPU's model (never empty), cut to the
 * room given; CUDA's where a GPU is present, else a target error. */
static void test_device_name(void)
{
    char name[128], tiny[4];
    CHECK_OK(kiln_backend_device_name(KILN_BACKEND_CPU, name, sizeof name));
    CHECK(name[0] != 0 && strlen(name) < sizeof name);
    CHECK_OK(kiln_backend_device_name(KILN_BACKEND_CPU, tiny, sizeof tiny));
    CHECK(strlen(tiny) <= 3 && strncmp(tiny, name, strlen(tiny)) == 0);
    CHECK_FAILS(kiln_backend_device_name(KILN_BACKEND_CPU, name, 0), KILN_ERROR_INVALID_ARGUMENT, "no room");
    kiln_status s = kiln_backend_device_name(KILN_BACKEND_CUDA, name, sizeof name);
    if (s == KILN_OK)
        CHECK(strlen(name) > 0);
    else
        CHECK(s == KILN_ERROR_TARGET && name[0] == 0);
}

static const test_case_ tests[] = {
    TEST(test_score_matches_transformers), TEST(test_score_refusals), TEST(test_weight_bytes),
    TEST(test_weight_bytes_native),        TEST(test_copy_bandwidth), TEST(test_device_name)};

TEST_MAIN(tests)
