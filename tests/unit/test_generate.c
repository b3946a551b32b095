/* Generation on a tiny LLM engine: a 2-layer Llama with deterministic
 * pseudo-random weights and a self-contained SentencePiece-style byte
 * tokenizer, built with the LLM build (src/llm/model.c) into a temporary
 * engine file. Checks what the generation runtime promises: batching does
 * not change greedy tokens, chunked prefill equals whole prefill, limits are
 * refused with their numbers, cancellation and stop strings work, seeded
 * sampling is reproducible, the decode step allocates nothing, and the
 * sampling layer chooses what host sampling chooses; an FP8 KV cache
 * keeps the f16 cache's greedy tokens (or its top 5 where they part). */
#include "test.h"

#include <kiln/llm.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "core/error.h"
#include "core/graph.h"
#include "llm/model.h"
#include "llm/tokenizer.h"
#include "tiny_llm.h"

/* ---- counting allocations -------------------------------------------------------
 * The test binary's malloc family replaces libc's for the whole process
 * (every library included), counting calls while `counting` is set. Not
 * under AddressSanitizer, which owns malloc itself. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NO_MALLOC_HOOK 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define NO_MALLOC_HOOK 1
#endif

#ifndef NO_MALLOC_HOOK
static volatile int counting;
static volatile long n_allocs;

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

void *malloc(size_t n)
{
    if (counting)
        __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
    if (counting)
        __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED);
    return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
    if (counting)
        __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED);
    return __libc_realloc(p, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    if (counting)
        __atomic_add_fetch(&n_allocs, 1, __ATOMIC_RELAXED);
    void *p = __libc_memalign(align, n);
    if (!p)
        return 12; /* ENOMEM */
    *out = p;
    return 0;
}
#endif

static char engine_path[256], host_engine_path[256];

/* The step network without the sampling layer, as engines built before
 * it were: generation samples on the host from copied-out logits. */
static kiln_status build_host_sampled(kiln_llm_checkpoint *ck, const kiln_llm_build_options *opt, kiln_registry *reg,
                                      kiln_buffer *buf)
{
    kiln_network *net = NULL;
    KILN_TRY(kiln_llm_build_network(ck, opt, reg, &net));
    char *cfg = NULL;
    void *tok = NULL;
    size_t cfg_len = 0, tok_len = 0;
    kiln_status s = kiln_llm_config_to_json(&ck->config, &cfg, &cfg_len);
    if (s == KILN_OK)
        s = kiln_llm_network_add_section(net, KILN_LLM_SECTION_CONFIG, cfg, cfg_len);
    if (s == KILN_OK)
        s = kiln_tokenizer_serialize(ck->tokenizer, &tok, &tok_len);
    if (s == KILN_OK)
        s = kiln_llm_network_add_section(net, KILN_LLM_SECTION_TOKENIZER, tok, tok_len);
    kiln_build_config bc;
    kiln_build_config_init(&bc);
    if (s == KILN_OK)
        s = kiln_build(net, &bc, buf);
    free(cfg);
    free(tok);
    kiln_network_destroy(net);
    return s;
}

/* Builds the engine once per process into a temporary file. */
static int build_tiny_engine(void)
{
    if (engine_path[0])
        return 1;
    kiln_llm_checkpoint *ck = tiny_checkpoint();
    CHECK(ck != NULL);
    if (!ck)
        return 0;
    ck->config.max_position_embeddings = 64;
    kiln_llm_build_options opt;
    kiln_llm_build_options_init(&opt);
    opt.max_batch = 4;
    opt.max_seq_len = 64;
    opt.max_tokens = 16; /* long prompts are prefilled in chunks */
    opt.block_size = 4;
    kiln_registry *reg = NULL;
    kiln_buffer buf = {0};
    CHECK_OK(kiln_registry_create(&reg));
    kiln_buffer host_buf = {0};
    kiln_status s = kiln_llm_build_engine(ck, &opt, reg, NULL, &buf);
    CHECK_OK(s);
    if (s == KILN_OK)
        CHECK_OK(s = build_host_sampled(ck, &opt, reg, &host_buf));
    kiln_llm_checkpoint_free(ck);
    kiln_registry_destroy(reg);
    int ok = s == KILN_OK;
    snprintf(engine_path, sizeof engine_path, "/tmp/kiln-test-generate-%d.engine", (int)getpid());
    snprintf(host_engine_path, sizeof host_engine_path, "/tmp/kiln-test-generate-host-%d.engine", (int)getpid());
    ok = ok && tiny_write_file(engine_path, &buf) && tiny_write_file(host_engine_path, &host_buf);
    CHECK(ok);
    kiln_buffer_free(&buf);
    kiln_buffer_free(&host_buf);
    if (!ok)
        engine_path[0] = '\0';
    return ok;
}

typedef struct tiny {
    kiln_registry *reg;
    kiln_llm *llm;
} tiny;

static int tiny_open_threads(tiny *t, int32_t kv_blocks, int32_t n_threads)
{
    memset(t, 0, sizeof *t);
    if (!build_tiny_engine())
        return 0;
    kiln_llm_options opt;
    kiln_llm_options_init(&opt);
    opt.kv_cache_blocks = kv_blocks;
    opt.n_threads = n_threads;
    CHECK_OK(kiln_registry_create(&t->reg));
    CHECK_OK(kiln_llm_open(t->reg, engine_path, &opt, &t->llm));
    return t->llm != NULL;
}

static int tiny_open(tiny *t, int32_t kv_blocks) { return tiny_open_threads(t, kv_blocks, 0); }

static void tiny_close(tiny *t)
{
    kiln_llm_close(t->llm);
    kiln_registry_destroy(t->reg);
}

static kiln_llm_sampling greedy_sampling;

static kiln_llm_request greedy(const char *prompt, int32_t n)
{
    kiln_llm_sampling_init(&greedy_sampling);
    greedy_sampling.temperature = 0;
    kiln_llm_request r;
    kiln_llm_request_init(&r);
    r.prompt = prompt;
    r.prompt_len = strlen(prompt);
    r.max_tokens = n;
    r.sampling = &greedy_sampling;
    r.ignore_eos = 1;
    return r;
}

/* kiln_llm_generate for one request. */
static kiln_status generate1(kiln_llm *llm, const kiln_llm_request *r, kiln_llm_token_fn fn, void *user,
                             kiln_llm_result **res)
{
    return kiln_llm_generate(llm, &r, 1, fn, user, res);
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_open_info(void)
{
    tiny t;
    if (!tiny_open(&t, 0))
        return;
    const kiln_llm_info *info = kiln_llm_info_get(t.llm);
    CHECK(info->vocab_size == VOCAB && info->n_layers == LAYERS);
    CHECK(info->max_seq_len == 64 && info->max_batch == 4 && info->max_tokens == 16 && info->block_size == 4);
    /* Default CPU cache: max_batch full sequences (4 * 64 tokens = 64
     * blocks) while that is small; one full sequence beyond (the default
     * model's cache, checked in tests/e2e/llm_run.sh). */
    CHECK(info->n_blocks == 64 && info->cache_tokens == 256);
    /* f32: 2 (k, v) * 2 kv heads * 4 tokens * 8 dims * 4 bytes per block and layer. */
    CHECK(info->cache_bytes == (size_t)64 * 2 * KV_HEADS * 4 * HEAD_DIM * 4 * LAYERS);
    /* The process-wide pool: one thread per physical core. */
    CHECK(info->n_threads >= 1);
    CHECK(info->chat_template && !strcmp(info->chat_template, "llama2"));
    /* A CPU engine: no CUDA graphs. */
    CHECK(info->backend == KILN_BACKEND_CPU && info->n_graphs == 0 && info->graph_nodes == 0);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(kiln_llm_prompt_ids(t.llm, "hello", 5, &ids, &n));
    /* BOS, then the bytes of "\u2581hello". */
    const int32_t want[9] = {1, 3 + 0xE2, 3 + 0x96, 3 + 0x81, 3 + 'h', 3 + 'e', 3 + 'l', 3 + 'l', 3 + 'o'};
    CHECK(n == 9 && ids && !memcmp(ids, want, sizeof want));
    kiln_free(ids);
    tiny_close(&t);
}

static void test_batched_equals_alone(void)
{
    tiny t;
    if (!tiny_open(&t, 0))
        return;
    /* The third prompt (27 tokens) is longer than a step's 16-token budget,
     * so it is prefilled in chunks while the others decode. */
    const char *prompts[3] = {"hello world", "the", "a quick brown fox"};
    kiln_llm_request reqs[3];
    kiln_llm_result *alone[3] = {0}, *together[3] = {0};
    const kiln_llm_request *rp[3] = {&reqs[0], &reqs[1], &reqs[2]};
    for (int i = 0; i < 3; i++) {
        reqs[i] = greedy(prompts[i], 12 + 4 * i);
        CHECK_OK(generate1(t.llm, &reqs[i], NULL, NULL, &alone[i]));
    }
    CHECK_OK(kiln_llm_generate(t.llm, rp, 3, NULL, NULL, together));
    for (int i = 0; i < 3; i++) {
        CHECK(alone[i]->n_ids == (size_t)(12 + 4 * i) && together[i]->n_ids == alone[i]->n_ids);
        CHECK(alone[i]->finish == KILN_LLM_FINISH_LENGTH && together[i]->finish == KILN_LLM_FINISH_LENGTH);
        CHECK(together[i]->n_prompt_ids == alone[i]->n_prompt_ids);
        int same = together[i]->ids && alone[i]->ids &&
                   !memcmp(together[i]->ids, alone[i]->ids, sizeof(int32_t) * alone[i]->n_ids);
        CHECK(same);
        CHECK(together[i]->text && alone[i]->text && !strcmp(together[i]->text, alone[i]->text));
        kiln_llm_result_free(alone[i]);
        kiln_llm_result_free(together[i]);
    }
    tiny_close(&t);
}

/* A step on a context pool of 3 threads (or 1) gives the tokens of the
 * process-wide pool: every kernel splits its work without changing any
 * sum's order. A count outside 1..1024 is refused. */
static void test_threads_same_tokens(void)
{
    kiln_llm_result *want = NULL;
    kiln_llm_request r = greedy("a quick brown fox", 20);
    tiny t;
    if (!tiny_open(&t, 0))
        return;
    CHECK_OK(generate1(t.llm, &r, NULL, NULL, &want));
    tiny_close(&t);
    const int32_t counts[2] = {3, 1};
    for (int i = 0; i < 2 && want; i++) {
        if (!tiny_open_threads(&t, 0, counts[i]))
            break;
        CHECK(kiln_llm_info_get(t.llm)->n_threads == counts[i]);
        kiln_llm_result *got = NULL;
        CHECK_OK(generate1(t.llm, &r, NULL, NULL, &got));
        CHECK(got && got->n_ids == want->n_ids && !memcmp(got->ids, want->ids, sizeof(int32_t) * want->n_ids));
        kiln_llm_result_free(got);
        tiny_close(&t);
    }
    kiln_llm_result_free(want);
    kiln_registry *reg = NULL;
    kiln_llm *llm = NULL;
    kiln_llm_options opt;
    kiln_llm_options_init(&opt);
    opt.n_threads = 1025;
    CHECK_OK(kiln_registry_create(&reg));
    CHECK_FAILS(kiln_llm_open(reg, engine_path, &opt, &llm), KILN_ERROR_INVALID_ARGUMENT, "1025");
    CHECK(llm == NULL);
    kiln_registry_destroy(reg);
}

/* Decoding from the cache agrees with prefilling everything: the greedy
 * token after prompt + the first k generated tokens, computed from scratch,
 * is generated token k. */
static void test_decode_matches_prefill(void)
{
    tiny t;
    if (!tiny_open(&t, 0))
        return;
    kiln_llm_request r = greedy("hello world", 24);
    kiln_llm_result *full = NULL;
    CHECK_OK(generate1(t.llm, &r, NULL, NULL, &full));
    int distinct = 0;
    for (size_t i = 1; i < full->n_ids; i++)
        distinct += full->ids[i] != full->ids[0];
    CHECK(full->n_ids == 24 && distinct > 0);
    int32_t ids[64];
    for (size_t k = 1; full->n_ids == 24 && k < 24; k += 5) {
        memcpy(ids, full->prompt_ids, sizeof *ids * full->n_prompt_ids);
        memcpy(ids + full->n_prompt_ids, full->ids, sizeof *ids * k);
        kiln_llm_request q = greedy("", 1);
        q.prompt = NULL;
        q.prompt_ids = ids;
        q.n_prompt_ids = full->n_prompt_ids + k;
        kiln_llm_result *one = NULL;
        CHECK_OK(generate1(t.llm, &q, NULL, NULL, &one));
        CHECK(one->n_ids == 1 && one->ids && one->ids[0] == full->ids[k]);
        kiln_llm_result_free(one);
    }
    kiln_llm_result_free(full);
    tiny_close(&t);
}

/* A cache of 12 blocks (48 tokens) serves requests of 17 + 16, 7 + 16 and
 * 5 + 16 tokens (9, 6 and 6 blocks) only one or two at a time; the tokens
 * must not change. */
static void test_small_cache_queues(void)
{
    tiny big, small;
    if (!tiny_open(&big, 0) || !tiny_open(&small, 12)) {
        tiny_close(&big);
        return;
    }
    const char *prompts[3] = {"hello world", "the", "a"};
    kiln_llm_request reqs[3];
    kiln_llm_result *a[3] = {0}, *b[3] = {0};
    const kiln_llm_request *rp[3] = {&reqs[0], &reqs[1], &reqs[2]};
    for (int i = 0; i < 3; i++)
        reqs[i] = greedy(prompts[i], 16);
    CHECK_OK(kiln_llm_generate(big.llm, rp, 3, NULL, NULL, a));
    CHECK_OK(kiln_llm_generate(small.llm, rp, 3, NULL, NULL, b));
    for (int i = 0; i < 3; i++) {
        CHECK(a[i]->n_ids == 16 && b[i]->n_ids == 16 && a[i]->ids && b[i]->ids &&
              !memcmp(a[i]->ids, b[i]->ids, sizeof(int32_t) * 16));
        kiln_llm_result_free(a[i]);
        kiln_llm_result_free(b[i]);
    }
    tiny_close(&big);
    tiny_close(&small);
}

static void test_limits_refused(void)
{
    tiny t;
    if (!tiny_open(&t, 8))
        return;
    char text[200];
    memset(text, 'x', 99);
    text[99] = '\0';
    kiln_llm_request r = greedy(text, 4);
    kiln_llm_result *res = NULL;
    /* BOS + 3 + 99 bytes = 103 tokens, above 64. */
    CHECK_FAILS(generate1(t.llm, &r, NULL, NULL, &res), KILN_ERROR_LIMIT,
                "prompt of 103 tokens exceeds the engine's max sequence length 64");
    r = greedy("hello", 56);
    CHECK_FAILS(generate1(t.llm, &r, NULL, NULL, &res), KILN_ERROR_LIMIT,
                "prompt of 9 tokens plus max_tokens 56 exceeds the engine's max sequence length 64");
    /* 9 + 40 tokens need 13 blocks of 4; the cache has 8. */
    r = greedy("hello", 40);
    CHECK_FAILS(generate1(t.llm, &r, NULL, NULL, &res), KILN_ERROR_LIMIT,
                "needs 13 KV blocks, the cache holds 8 (32 tokens)");
    CHECK(res == NULL);
    /* A bad request refuses the whole call before any work. */
    kiln_llm_request two[2] = {greedy("hello", 4), greedy("hello", 40)};
    const kiln_llm_request *two_p[2] = {&two[0], &two[1]};
    kiln_llm_result *two_res[2] = {0};
    CHECK_FAILS(kiln_llm_generate(t.llm, two_p, 2, NULL, NULL, two_res), KILN_ERROR_LIMIT, "request 1");
    CHECK(two_res[0] == NULL && two_res[1] == NULL);
    /* The cache is whole again afterwards: 8 blocks hold 9 + 23 tokens. */
    r = greedy("hello", 23);
    CHECK_OK(generate1(t.llm, &r, NULL, NULL, &res));
    CHECK(res->n_ids == 23);
    kiln_llm_result_free(res);
    tiny_close(&t);
}

typedef struct stream_log {
    char text[3][4096];
    size_t len[3];
    int calls[3];
    int cancel_after; /* request 0 ends after this many calls; 0: never */
    kiln_llm *cancel_llm;
    int cancel_llm_after;
} stream_log;

static int on_token(void *user, int32_t request, int32_t token, const char *text, size_t len)
{
    stream_log *log = user;
    (void)token;
    if (request < 0 || request > 2 || log->len[request] + len >= sizeof log->text[0])
        return 1;
    memcpy(log->text[request] + log->len[request], text, len);
    log->len[request] += len;
    log->calls[request]++;
    if (log->cancel_llm && log->calls[request] == log->cancel_llm_after)
        kiln_llm_cancel(log->cancel_llm);
    return request == 0 && log->cancel_after && log->calls[0] >= log->cancel_after;
}

static void test_streaming_and_cancel(void)
{
    tiny t;
    if (!tiny_open(&t, 0))
        return;
    kiln_llm_request reqs[2] = {greedy("hello", 20), greedy("the", 20)};
    const kiln_llm_request *rp[2] = {&reqs[0], &reqs[1]};
    kiln_llm_result *res[2] = {0};
    stream_log *log = calloc(1, sizeof *log);
    /* The streamed pieces add up to the result's text. */
    CHECK_OK(kiln_llm_generate(t.llm, rp, 2, on_token, log, res));
    for (int i = 0; i < 2; i++) {
        CHECK(log->len[i] == res[i]->text_len && !memcmp(log->text[i], res[i]->text, res[i]->text_len));
        CHECK(log->calls[i] >= 20);
        kiln_llm_result_free(res[i]);
    }
    /* The callback ends request 0 after 5 tokens; request 1 runs on. */
    memset(log, 0, sizeof *log);
    log->cancel_after = 5;
    CHECK_OK(kiln_llm_generate(t.llm, rp, 2, on_token, log, res));
    CHECK(res[0]->finish == KILN_LLM_FINISH_CANCELLED && res[0]->n_ids == 5);
    CHECK(res[1]->finish == KILN_LLM_FINISH_LENGTH && res[1]->n_ids == 20);
    kiln_llm_result_free(res[0]);
    kiln_llm_result_free(res[1]);
    /* kiln_llm_cancel ends every request at the next step. */
    memset(log, 0, sizeof *log);
    log->cancel_llm = t.llm;
    log->cancel_llm_after = 3;
    CHECK_OK(kiln_llm_generate(t.llm, rp, 2, on_token, log, res));
    CHECK(res[0]->finish == KILN_LLM_FINISH_CANCELLED && res[1]->finish == KILN_LLM_FINISH_CANCELLED);
    CHECK(res[0]->n_ids < 20 && res[1]->n_ids < 20);
    kiln_llm_result_free(res[0]);
    kiln_llm_result_free(res[1]);
    /* The flag is cleared for the next call. */
    CHECK_OK(kiln_llm_generate(t.llm, rp, 1, NULL, NULL, res));
    CHECK(res[0]->finish == KILN_LLM_FINISH_LENGTH);
    kiln_llm_result_free(res[0]);
    free(log);
    tiny_close(&t);
}

static void test_stop_strings(void)
{
    tiny t;
    if (!tiny_open(&t, 0))
        return;
    kiln_llm_request r = greedy("hello world", 40);
    kiln_llm_result *full = NULL, *cut = NULL;
    CHECK_OK(generate1(t.llm, &r, NULL, NULL, &full));
    if (!full->text || full->text_len < 8) {
        CHECK(!"the tiny model produced too little text for a stop-string test");
        kiln_llm_result_free(full);
        tiny_close(&t);
        return;
    }
    /* Stop at the first occurrence of two bytes taken from the middle of
     * the text (at a UTF-8 character start, so the stop string is valid). */
    size_t at = full->text_len / 2;
    while (at > 0 && ((unsigned char)full->text[at] & 0xC0) == 0x80)
        at--;
    size_t stop_len = ((unsigned char)full->text[at] & 0x80) ? 3 : 2;
    if (at + stop_len > full->text_len)
        stop_len = full->text_len - at;
    char stop[8] = {0};
    memcpy(stop, full->text + at, stop_len);
    const char *stops[1] = {stop};
    const char *first = strstr(full->text, stop);
    size_t want = first ? (size_t)(first - full->text) : 0;
    r.stop = stops;
    r.n_stop = 1;
    stream_log *log = calloc(1, sizeof *log);
    CHECK_OK(generate1(t.llm, &r, on_token, log, &cut));
    CHECK(cut->finish == KILN_LLM_FINISH_STOP);
    CHECK(cut->text_len == want && cut->text && !memcmp(cut->text, full->text, want));
    /* Streaming never emitted the stop string or what followed it. */
    CHECK(log->len[0] == want && !memcmp(log->text[0], full->text, want));
    CHECK(cut->n_ids <= full->n_ids && !memcmp(cut->ids, full->ids, sizeof(int32_t) * cut->n_ids));
    free(log);
    kiln_llm_result_free(full);
    kiln_llm_result_free(cut);
    tiny_close(&t);
}

static void test_eos_and_seeded_sampling(void)
{
    tiny t;
    if (!tiny_open(&t, 0))
        return;
    kiln_llm_request r = greedy("hello", 24);
    kiln_llm_sampling samp;
    kiln_llm_sampling_init(&samp);
    samp.temperature = 1.5f;
    samp.seed = 42;
    r.sampling = &samp;
    kiln_llm_result *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(generate1(t.llm, &r, NULL, NULL, &a));
    CHECK_OK(generate1(t.llm, &r, NULL, NULL, &b));
    CHECK(a->n_ids == b->n_ids && !memcmp(a->ids, b->ids, sizeof(int32_t) * a->n_ids));
    samp.seed = 43;
    CHECK_OK(generate1(t.llm, &r, NULL, NULL, &c));
    CHECK(c->n_ids != a->n_ids || memcmp(c->ids, a->ids, sizeof(int32_t) * a->n_ids) != 0);
    kiln_llm_result_free(b);
    kiln_llm_result_free(c);
    /* With EOS honoured, a sampled EOS ends the request; a run whose draws
     * contain an EOS stops right there. */
    samp.seed = 42;
    r.ignore_eos = 0;
    CHECK_OK(generate1(t.llm, &r, NULL, NULL, &b));
    size_t eos_at = a->n_ids;
    for (size_t i = 0; i < a->n_ids; i++)
        if (a->ids[i] == 2) {
            eos_at = i;
            break;
        }
    if (eos_at < a->n_ids)
        CHECK(b->finish == KILN_LLM_FINISH_EOS && b->n_ids == eos_at + 1);
    else
        CHECK(b->finish == KILN_LLM_FINISH_LENGTH && b->n_ids == a->n_ids);
    kiln_llm_result_free(a);
    kiln_llm_result_free(b);
    tiny_close(&t);
}

#ifndef NO_MALLOC_HOOK
typedef struct alloc_watch {
    int tokens;
    long during_decode;
} alloc_watch;

/* Counts allocations between consecutive tokens of one request once its
 * prompt is done: that span is exactly one decode step (scheduling, the
 * engine run, sampling, detokenizing). */
static int watch_token(void *user, int32_t request, int32_t token, const char *text, size_t len)
{
    alloc_watch *w = user;
    (void)request;
    (void)text;
    (void)len;
    if (token < 0)
        return 0;
    if (w->tokens >= 1) {
        counting = 0;
        w->during_decode += n_allocs;
    }
    w->tokens++;
    n_allocs = 0;
    counting = 1;
    return 0;
}
#endif

static void test_decode_allocates_nothing(void)
{
#ifdef NO_MALLOC_HOOK
    printf("skip test_decode_allocates_nothing: AddressSanitizer owns malloc\n");
#else
    tiny t;
    if (!tiny_open(&t, 0))
        return;
    kiln_llm_request r = greedy("hello world", 30);
    kiln_llm_sampling samp;
    kiln_llm_sampling_init(&samp);
    samp.temperature = 0.9f;
    samp.top_k = 20;
    samp.top_p = 0.9f;
    samp.repetition_penalty = 1.2f;
    samp.frequency_penalty = 0.5f;
    r.sampling = &samp;
    kiln_llm_result *res = NULL;
    alloc_watch w = {0};
    kiln_status s = generate1(t.llm, &r, watch_token, &w, &res);
    counting = 0;
    CHECK_OK(s);
    CHECK(w.tokens == 30);
    CHECK(w.during_decode == 0);
    if (w.during_decode)
        fprintf(stderr, "decode steps made %ld allocations\n", w.during_decode);
    kiln_llm_result_free(res);
    tiny_close(&t);
#endif
}

/* The sampling layer chooses what host sampling chose: an engine without
 * it (logits copied out, src/llm/sampler.c) and one with it give the same
 * ids for greedy, seeded sampling and every penalty, batched together. */
static void test_layer_equals_host_sampling(void)
{
    tiny t, h;
    if (!tiny_open(&t, 0))
        return;
    memset(&h, 0, sizeof h);
    CHECK_OK(kiln_registry_create(&h.reg));
    CHECK_OK(kiln_llm_open(h.reg, host_engine_path, NULL, &h.llm));
    if (!h.llm) {
        tiny_close(&t);
        tiny_close(&h);
        return;
    }
    const char *prompts[4] = {"hello world", "the", "a quick brown fox", "hi"};
    kiln_llm_request reqs[4];
    kiln_llm_sampling samp[4];
    const kiln_llm_request *rp[4];
    kiln_llm_result *a[4] = {0}, *b[4] = {0};
    for (int i = 0; i < 4; i++) {
        reqs[i] = greedy(prompts[i], 20);
        kiln_llm_sampling_init(&samp[i]);
        samp[i].temperature = 0;
        samp[i].seed = 7 + (uint64_t)i;
        reqs[i].sampling = &samp[i];
        rp[i] = &reqs[i];
    }
    samp[0].repetition_penalty = 1.3f;
    samp[1].temperature = 1.2f;
    samp[1].top_k = 30;
    samp[1].top_p = 0.9f;
    samp[1].presence_penalty = 0.5f;
    samp[2].temperature = 0.9f;
    samp[2].min_p = 0.05f;
    samp[2].frequency_penalty = 0.7f;
    samp[2].repetition_penalty = 1.1f;
    samp[3].temperature = 1.5f;
    CHECK_OK(kiln_llm_generate(t.llm, rp, 4, NULL, NULL, a));
    CHECK_OK(kiln_llm_generate(h.llm, rp, 4, NULL, NULL, b));
    for (int i = 0; i < 4; i++) {
        CHECK(a[i] && b[i] && a[i]->n_ids == 20 && b[i]->n_ids == 20 &&
              !memcmp(a[i]->ids, b[i]->ids, sizeof(int32_t) * 20));
        kiln_llm_result_free(a[i]);
        kiln_llm_result_free(b[i]);
    }
    tiny_close(&t);
    tiny_close(&h);
}

static void test_chat_tokenize(void)
{
    tiny t;
    if (!tiny_open(&t, 0))
        return;
    kiln_llm_message sys, user;
    kiln_llm_message_init(&sys);
    kiln_llm_message_init(&user);
    sys.role = "system";
    sys.content = "be brief";
    user.role = "user";
    user.content = "hello";
    const kiln_llm_message *m[2] = {&sys, &user};
    int32_t *ids = NULL, *want = NULL;
    size_t n = 0, n_want = 0;
    CHECK_OK(kiln_llm_chat_tokenize(t.llm, m, 2, &ids, &n));
    /* The llama2 template's text, tokenized with special tokens parsed. */
    const char *text = "<s>[INST] <<SYS>>\nbe brief\n<</SYS>>\n\nhello [/INST]";
    CHECK_OK(kiln_llm_tokenize(t.llm, text, strlen(text), KILN_LLM_TOKENIZE_PARSE_SPECIAL, &want, &n_want));
    CHECK(n == n_want && n > 0 && ids && want && !memcmp(ids, want, sizeof *ids * n));
    CHECK(ids && ids[0] == 1);
    kiln_free(ids);
    kiln_free(want);
    tiny_close(&t);
}

/* A caller compiled against an older, shorter kiln_llm_request: members its
 * struct_size does not cover are not read, so the sampling pointer beyond
 * it (greedy here) is ignored and the request samples neutrally, exactly
 * like a full request with sampling NULL. A struct never set up with its
 * _init function is refused. */
static void test_struct_size_read(void)
{
    tiny t;
    if (!tiny_open(&t, 0))
        return;
    kiln_llm_request neutral = greedy("hello", 12);
    neutral.sampling = NULL;
    kiln_llm_request older = greedy("hello", 12);
    older.struct_size = (uint32_t)offsetof(kiln_llm_request, sampling);
    kiln_llm_result *a = NULL, *b = NULL, *g = NULL;
    kiln_llm_request full_greedy = greedy("hello", 12);
    CHECK_OK(generate1(t.llm, &neutral, NULL, NULL, &a));
    CHECK_OK(generate1(t.llm, &older, NULL, NULL, &b));
    CHECK_OK(generate1(t.llm, &full_greedy, NULL, NULL, &g));
    CHECK(a && b && g && a->n_ids == 12 && b->n_ids == 12 && !memcmp(a->ids, b->ids, sizeof(int32_t) * 12));
    /* ... and the neutral draws differ from greedy ones, so the test can fail. */
    CHECK(a && g && memcmp(a->ids, g->ids, sizeof(int32_t) * 12) != 0);
    CHECK(a && a->struct_size == sizeof(kiln_llm_result) && a->abi_version == KILN_API_VERSION);
    kiln_llm_result_free(a);
    kiln_llm_result_free(b);
    kiln_llm_result_free(g);
    kiln_llm_request zero;
    memset(&zero, 0, sizeof zero);
    kiln_llm_result *z = NULL;
    CHECK_FAILS(generate1(t.llm, &zero, NULL, NULL, &z), KILN_ERROR_INVALID_ARGUMENT,
                "request 0: request: struct_size 0");
    CHECK(z == NULL);
    tiny_close(&t);
}

/* An LLM engine's sections through the public calls: kiln_engine_find_section
 * on a loaded engine, and kiln_llm_describe_json on the file; both agree
 * with what the tiny model was built from. */
static void test_sections_and_description(void)
{
    if (!build_tiny_engine())
        return;
    kiln_registry *reg = NULL;
    kiln_engine *engine = NULL;
    CHECK_OK(kiln_registry_create(&reg));
    CHECK_OK(kiln_engine_load(reg, engine_path, &engine));
    const void *data = NULL;
    size_t size = 0;
    CHECK_OK(kiln_engine_find_section(engine, KILN_FOURCC('L', 'L', 'M', 'C'), &data, &size));
    CHECK(data && size > 2 && ((const char *)data)[0] == '{');
    CHECK_OK(kiln_engine_find_section(engine, KILN_FOURCC('T', 'O', 'K', 'N'), &data, &size));
    CHECK_FAILS(kiln_engine_find_section(engine, KILN_FOURCC('N', 'O', 'N', 'E'), &data, &size), KILN_ERROR_NOT_FOUND,
                "no section NONE");
    kiln_engine_destroy(engine);
    kiln_registry_destroy(reg);

    char *json = NULL;
    CHECK_OK(kiln_llm_describe_json(engine_path, &json));
    char want[64];
    snprintf(want, sizeof want, "\"vocab_size\": %d", VOCAB);
    CHECK(json && strstr(json, want) && strstr(json, "\"chat_template\": \"llama2\"") &&
          strstr(json, "\"tokenizer\": {") && !strstr(json, "\"error\""));
    kiln_free(json);
    CHECK_FAILS(kiln_llm_describe_json("/nonexistent/x.engine", &json), KILN_ERROR_IO, "x.engine");
}

static void test_not_an_llm_engine(void)
{
    kiln_registry *reg = NULL;
    kiln_llm *llm = NULL;
    CHECK_OK(kiln_registry_create(&reg));
    CHECK_FAILS(kiln_llm_open(reg, "/nonexistent/x.engine", NULL, &llm), KILN_ERROR_IO, "x.engine");
    CHECK(llm == NULL);
    kiln_registry_destroy(reg);
}

/* The tiny model built with a KV cache of kv_cache (KILN_LLM_KV_*) and
 * opened; the engine file is removed once open. */
static int open_kv_engine(int32_t kv_cache, tiny *t)
{
    memset(t, 0, sizeof *t);
    kiln_llm_checkpoint *ck = tiny_checkpoint();
    CHECK(ck != NULL);
    if (!ck)
        return 0;
    ck->config.max_position_embeddings = 64;
    kiln_llm_build_options opt;
    kiln_llm_build_options_init(&opt);
    opt.max_batch = 4;
    opt.max_seq_len = 64;
    opt.max_tokens = 16;
    opt.block_size = 4;
    opt.kv_cache = kv_cache;
    kiln_buffer buf = {0};
    char path[256];
    snprintf(path, sizeof path, "/tmp/kiln-test-generate-kv%d-%d.engine", (int)kv_cache, (int)getpid());
    CHECK_OK(kiln_registry_create(&t->reg));
    kiln_status s = kiln_llm_build_engine(ck, &opt, t->reg, NULL, &buf);
    CHECK_OK(s);
    kiln_llm_checkpoint_free(ck);
    int ok = s == KILN_OK && tiny_write_file(path, &buf);
    kiln_buffer_free(&buf);
    kiln_llm_options lo;
    kiln_llm_options_init(&lo);
    if (ok)
        CHECK_OK(kiln_llm_open(t->reg, path, &lo, &t->llm));
    unlink(path);
    return ok && t->llm != NULL;
}

typedef struct top5 {
    size_t at;   /* the position whose logits are wanted */
    int32_t tok; /* the token to look for */
    int32_t vocab;
    int rank; /* how many logits exceed tok's: 0 = argmax */
} top5;

static void rank_of(void *user, size_t position, const float *logits)
{
    top5 *r = user;
    if (position != r->at)
        return;
    r->rank = 0;
    for (int32_t i = 0; i < r->vocab; i++)
        r->rank += logits[i] > logits[r->tok];
}

/* An FP8 (E4M3) cache against an f16 one: the cache takes half the bytes
 * for the same blocks, and greedy generation gives the same tokens, or,
 * where it first differs, the FP8 engine's token is among the f16 engine's
 * top 5 after the same (teacher-forced) prefix. */
static void test_fp8_kv_cache(void)
{
    tiny h, q;
    int ok_h = open_kv_engine(KILN_LLM_KV_F16, &h), ok_q = open_kv_engine(KILN_LLM_KV_FP8, &q);
    if (ok_h && ok_q) {
        const kiln_llm_info *ih = kiln_llm_info_get(h.llm), *iq = kiln_llm_info_get(q.llm);
        CHECK(ih->dtype == KILN_DTYPE_F16 && iq->dtype == KILN_DTYPE_FP8_E4M3);
        CHECK(iq->cache_bytes * 2 == ih->cache_bytes * iq->n_blocks / ih->n_blocks);
        CHECK(iq->cache_bytes == (size_t)iq->n_blocks * 2 * KV_HEADS * 4 * HEAD_DIM * LAYERS);
        const char *prompts[4] = {"hello world", "the", "a quick brown fox", "0123"};
        int same = 0;
        for (int i = 0; i < 4; i++) {
            kiln_llm_request r = greedy(prompts[i], 24);
            kiln_llm_result *a = NULL, *b = NULL;
            CHECK_OK(generate1(h.llm, &r, NULL, NULL, &a));
            CHECK_OK(generate1(q.llm, &r, NULL, NULL, &b));
            if (a && b && a->n_ids == 24 && b->n_ids == 24) {
                size_t d = 0;
                while (d < 24 && a->ids[d] == b->ids[d])
                    d++;
                same += d == 24;
                if (d < 24) {
                    int32_t seq[64];
                    size_t n = a->n_prompt_ids + d;
                    memcpy(seq, a->prompt_ids, sizeof(int32_t) * a->n_prompt_ids);
                    memcpy(seq + a->n_prompt_ids, a->ids, sizeof(int32_t) * d);
                    top5 r5 = {n - 1, b->ids[d], VOCAB, -1};
                    CHECK_OK(kiln_llm_score(h.llm, seq, n, rank_of, &r5));
                    if (getenv("KILN_TEST_VERBOSE") || !(r5.rank >= 0 && r5.rank < 5))
                        fprintf(stderr, "fp8 kv: prompt %d differs at token %zu, rank %d in the f16 engine\n", i, d,
                                r5.rank);
                    CHECK(r5.rank >= 0 && r5.rank < 5);
                }
            } else {
                CHECK(0);
            }
            kiln_llm_result_free(a);
            kiln_llm_result_free(b);
        }
        fprintf(stderr, "fp8 kv: %d of 4 prompts give the f16 cache's 24 greedy tokens\n", same);
    }
    if (ok_h)
        tiny_close(&h);
    if (ok_q)
        tiny_close(&q);
}

static void cleanup(void)
{
    if (engine_path[0]) {
        unlink(engine_path);
        unlink(host_engine_path);
    }
}

static const test_case_ tests[] = {
    TEST(test_open_info),
    TEST(test_batched_equals_alone),
    TEST(test_decode_matches_prefill),
    TEST(test_small_cache_queues),
    TEST(test_limits_refused),
    TEST(test_streaming_and_cancel),
    TEST(test_stop_strings),
    TEST(test_eos_and_seeded_sampling),
    TEST(test_decode_allocates_nothing),
    TEST(test_layer_equals_host_sampling),
    TEST(test_chat_tokenize),
    TEST(test_threads_same_tokens),
    TEST(test_struct_size_read),
    TEST(test_sections_and_description),
    TEST(test_not_an_llm_engine),
    TEST(test_fp8_kv_cache),
    TEST(cleanup),
};

TEST_MAIN(tests)
