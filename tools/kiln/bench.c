/* kiln bench ENGINE: prompt (prefill) and generation (decode) speed of an
 * LLM engine through the public generation API, beside the memory-bandwidth
 * floor of a decode step measured in the same run (like llama-bench and
 * trtllm-bench's latency mode). Timings come from the token callback.
 * `--throughput` is serving throughput instead (bench_throughput.c). */
#include <jansson.h>
#include <kiln/kiln.h>
#include <kiln/llm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli.h"
#include "cli_llm.h"

static const char bench_help[] =
    "usage: kiln bench ENGINE [options]\n"
    "\n"
    "Times prompt processing and generation of an LLM engine: B requests of\n"
    "N random prompt tokens (fixed seed) each generate exactly M tokens,\n"
    "greedy, end-of-sequence ignored; one untimed warm-up, then R timed\n"
    "repetitions (medians shown). Reports prefill and decode tok/s, time to\n"
    "first token, inter-token latency p50/p99, the weights' bytes per token\n"
    "and the fraction of the decode step's memory-bandwidth floor, with the\n"
    "bandwidth measured in the same run by a copy (device to device on a CUDA\n"
    "engine, host memcpy on a CPU one).\n"
    "\n"
    "options:\n"
    "  --prompt-len N           prompt tokens per request (default 128)\n"
    "  --gen-len M              tokens generated per request (default 128)\n"
    "  --batch B                requests run together (default 1)\n"
    "  --reps R                 timed repetitions (default 3)\n"
    "  --copy-mb N              size of the bandwidth copy (default 1024 on CUDA, 256 when\n"
    "                           the GPU has no room for it, 256 on the CPU)\n" CLI_LLM_MEMORY_HELP
    "  --plugins LIB            load a plugin library first (repeatable)\n"
    "  --json                   print one JSON object\n"
    "  --throughput             serving throughput through the scheduler instead\n"
    "                           (kiln bench --throughput --help)\n"
    "  -h, --help               show this help\n"
    "\n"
    "Definitions: time to first token is from the call to the first sampled\n"
    "token (mean over the requests); prefill tok/s is B*N over the time until\n"
    "every request has its first token; decode tok/s is the tokens sampled\n"
    "after that over the time they took; the floor is one decode step reading\n"
    "the weights once (kiln_llm_weight_bytes) plus each sequence's KV cache at\n"
    "its mean decode length, at the measured copy bandwidth (bytes read +\n"
    "written per second).\n";

double bench_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_quantile(double *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(q * (double)n);
    return v[i < n ? i : n - 1];
}

/* ---- one repetition ------------------------------------------------------------------ */

typedef struct rep_clock {
    int32_t batch, gen_len;
    double t0;
    double *times;  /* [batch, gen_len]: when each token was sampled */
    int32_t *count; /* [batch] */
} rep_clock;

static int on_token(void *user, int32_t request, int32_t token, const char *text, size_t len)
{
    rep_clock *c = user;
    (void)text;
    (void)len;
    if (token < 0 || request < 0 || request >= c->batch || c->count[request] >= c->gen_len)
        return 0;
    c->times[(size_t)request * (size_t)c->gen_len + (size_t)c->count[request]++] = bench_now_ms();
    return 0;
}

typedef struct rep_result {
    double prefill_tok_s, decode_tok_s, ttft_ms;
} rep_result;

/* Runs the requests once; appends the inter-token latencies to itl. */
static int run_rep(kiln_llm *llm, const kiln_llm_request *const *reqs, rep_clock *c, double *itl, size_t *n_itl,
                   rep_result *out)
{
    kiln_llm_result **res = calloc((size_t)c->batch, sizeof *res);
    if (!res)
        return cli_error("out of memory");
    memset(c->count, 0, sizeof *c->count * (size_t)c->batch);
    c->t0 = bench_now_ms();
    kiln_status s = kiln_llm_generate(llm, reqs, c->batch, on_token, c, res);
    for (int32_t i = 0; i < c->batch; i++)
        kiln_llm_result_free(res[i]);
    free(res);
    if (s != KILN_OK)
        return cli_kiln_error();
    double first_all = 0, ttft = 0, end = 0;
    for (int32_t i = 0; i < c->batch; i++) {
        if (c->count[i] != c->gen_len)
            return cli_error("request %d generated %d tokens, expected %d", (int)i, (int)c->count[i], (int)c->gen_len);
        const double *t = c->times + (size_t)i * (size_t)c->gen_len;
        ttft += t[0] - c->t0;
        if (t[0] > first_all)
            first_all = t[0];
        if (t[c->gen_len - 1] > end)
            end = t[c->gen_len - 1];
        for (int32_t k = 1; k < c->gen_len; k++)
            itl[(*n_itl)++] = t[k] - t[k - 1];
    }
    /* Decode: every token sampled after the last request's first one. */
    size_t after = 0;
    for (int32_t i = 0; i < c->batch; i++)
        for (int32_t k = 0; k < c->gen_len; k++)
            after += c->times[(size_t)i * (size_t)c->gen_len + (size_t)k] > first_all;
    out->ttft_ms = ttft / c->batch;
    out->prefill_tok_s =
        first_all > c->t0 ? (double)c->batch * (double)reqs[0]->n_prompt_ids / ((first_all - c->t0) / 1e3) : 0;
    out->decode_tok_s = end > first_all ? (double)after / ((end - first_all) / 1e3) : 0;
    return CLI_OK;
}

/* ---- report ------------------------------------------------------------------------------ */

typedef struct bench_report {
    const char *engine;
    const char *backend;
    const char *dtype;
    long batch, prompt_len, gen_len, reps;
    double open_ms;
    double graph_capture_ms; /* CUDA graphs captured at open (0: none) */
    int32_t n_graphs;
    double prefill_tok_s, decode_tok_s, ttft_ms, itl_p50, itl_p99;
    double prefill_min, prefill_max, decode_min, decode_max;
    size_t weight_bytes, weight_bytes_per_token;
    double kv_bytes_per_token; /* one cached token of one sequence, all layers */
    double copy_bytes_per_s;
    double floor_step_ms, floor_tok_s, floor_fraction;
    double peak_rss_mb;
    char device[128];    /* what it ran on (kiln_backend_device_name) */
    int32_t threads;     /* CPU: threads of a step; 0 on a GPU */
    int32_t *prompt_ids; /* owned: the prompts, request 0's first (its ids go into the JSON) */
} bench_report;

static int print_report(const bench_report *r, int json)
{
    if (!json) {
        printf("engine: %s (%s, %s)\n", r->engine, r->backend, r->dtype);
        printf("device: %s\n", r->device);
        printf("batch %ld, prompt %ld tokens, %ld generated, %ld reps (medians; min-max)\n", r->batch, r->prompt_len,
               r->gen_len, r->reps);
        printf("  open:              %.0f ms (%d CUDA graphs captured in %.1f ms)\n", r->open_ms, (int)r->n_graphs,
               r->graph_capture_ms);
        printf("  prefill:           %.1f tok/s (%.1f-%.1f)\n", r->prefill_tok_s, r->prefill_min, r->prefill_max);
        printf("  time to 1st token: %.2f ms\n", r->ttft_ms);
        printf("  decode:            %.1f tok/s (%.1f-%.1f)\n", r->decode_tok_s, r->decode_min, r->decode_max);
        printf("  inter-token:       p50 %.3f ms, p99 %.3f ms\n", r->itl_p50, r->itl_p99);
        printf("  weights:           %.1f MB per token (%.1f MB in the engine)\n", r->weight_bytes_per_token / 1e6,
               r->weight_bytes / 1e6);
        printf("  copy bandwidth:    %.1f GB/s (read + written)\n", r->copy_bytes_per_s / 1e9);
        printf("  decode floor:      %.3f ms/step = %.1f tok/s; measured = %.3f of the floor\n", r->floor_step_ms,
               r->floor_tok_s, r->floor_fraction);
        printf("  peak host RSS:     %.0f MB\n", r->peak_rss_mb);
        if (r->threads)
            printf("  threads:           %d\n", (int)r->threads);
        return CLI_OK;
    }
    json_t *o = json_object();
    json_object_set_new(o, "engine", json_string(r->engine));
    json_object_set_new(o, "backend", json_string(r->backend));
    json_object_set_new(o, "dtype", json_string(r->dtype));
    json_object_set_new(o, "device", json_string(r->device));
    json_object_set_new(o, "batch", json_integer(r->batch));
    json_object_set_new(o, "prompt_len", json_integer(r->prompt_len));
    json_object_set_new(o, "gen_len", json_integer(r->gen_len));
    json_object_set_new(o, "reps", json_integer(r->reps));
    json_object_set_new(o, "open_ms", json_real(r->open_ms));
    json_object_set_new(o, "graphs", json_integer(r->n_graphs));
    json_object_set_new(o, "graph_capture_ms", json_real(r->graph_capture_ms));
    json_object_set_new(o, "prefill_tok_s", json_real(r->prefill_tok_s));
    json_object_set_new(o, "prefill_tok_s_range", json_pack("[f, f]", r->prefill_min, r->prefill_max));
    json_object_set_new(o, "decode_tok_s", json_real(r->decode_tok_s));
    json_object_set_new(o, "decode_tok_s_range", json_pack("[f, f]", r->decode_min, r->decode_max));
    json_object_set_new(o, "ttft_ms", json_real(r->ttft_ms));
    json_object_set_new(o, "itl_ms_p50", json_real(r->itl_p50));
    json_object_set_new(o, "itl_ms_p99", json_real(r->itl_p99));
    json_object_set_new(o, "weight_bytes", json_integer((json_int_t)r->weight_bytes));
    json_object_set_new(o, "weight_bytes_per_token", json_integer((json_int_t)r->weight_bytes_per_token));
    json_object_set_new(o, "kv_bytes_per_token", json_real(r->kv_bytes_per_token));
    json_object_set_new(o, "copy_bandwidth_gb_s", json_real(r->copy_bytes_per_s / 1e9));
    json_object_set_new(o, "decode_floor_ms", json_real(r->floor_step_ms));
    json_object_set_new(o, "decode_floor_tok_s", json_real(r->floor_tok_s));
    json_object_set_new(o, "floor_fraction", json_real(r->floor_fraction));
    json_object_set_new(o, "peak_rss_mb", json_real(r->peak_rss_mb));
    if (r->threads)
        json_object_set_new(o, "threads", json_integer(r->threads));
    json_t *ids = json_array();
    for (long i = 0; r->prompt_ids && i < r->prompt_len; i++)
        json_array_append_new(ids, json_integer(r->prompt_ids[i]));
    json_object_set_new(o, "prompt_ids", ids);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s)
        return cli_error("out of memory writing JSON");
    puts(s);
    free(s);
    return CLI_OK;
}

/* ---- the command ----------------------------------------------------------------------------- */

/* Random prompt ids in [0, vocab), the same every run (xorshift64*). */
static void random_ids(int32_t *ids, size_t n, int32_t vocab, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        ids[i] = (int32_t)((x * 0x2545F4914F6CDD1Dull >> 33) % (uint64_t)vocab);
    }
}

static int bench(kiln_llm *llm, double open_ms, long copy_mb, bench_report *r)
{
    const kiln_llm_info *info = kiln_llm_info_get(llm);
    kiln_backend backend = kiln_engine_backend(kiln_llm_engine(llm));
    r->backend = kiln_backend_name(backend);
    r->dtype = kiln_dtype_name(info->dtype);
    r->open_ms = open_ms;
    r->n_graphs = info->n_graphs;
    r->graph_capture_ms = info->graph_capture_ms;
    r->threads = info->n_threads;
    if (r->prompt_len + r->gen_len > info->max_seq_len)
        return cli_error("prompt %ld + generated %ld tokens exceed the engine's max sequence length %d", r->prompt_len,
                         r->gen_len, (int)info->max_seq_len);
    size_t B = (size_t)r->batch, N = (size_t)r->prompt_len, M = (size_t)r->gen_len, R = (size_t)r->reps;
    int32_t *ids = malloc(sizeof *ids * B * N);
    kiln_llm_request *reqs = calloc(B, sizeof *reqs);
    const kiln_llm_request **req_ptrs = calloc(B, sizeof *req_ptrs);
    kiln_llm_sampling greedy;
    kiln_llm_sampling_init(&greedy);
    greedy.temperature = 0;
    rep_clock c = {(int32_t)B, (int32_t)M, 0, malloc(sizeof(double) * B * M), calloc(B, sizeof(int32_t))};
    double *itl = malloc(sizeof *itl * (B * (M > 1 ? M - 1 : 1) * R + 1));
    rep_result *reps = calloc(R, sizeof *reps);
    double *v = malloc(sizeof *v * R);
    int st = ids && reqs && req_ptrs && c.times && c.count && itl && reps && v ? CLI_OK : cli_error("out of memory");
    for (size_t i = 0; st == CLI_OK && i < B; i++) {
        random_ids(ids + i * N, N, info->vocab_size, 1234 + i);
        kiln_llm_request_init(&reqs[i]);
        reqs[i].prompt_ids = ids + i * N;
        reqs[i].n_prompt_ids = N;
        reqs[i].max_tokens = (int32_t)M;
        reqs[i].sampling = &greedy;
        reqs[i].ignore_eos = 1;
        req_ptrs[i] = &reqs[i];
    }
    size_t n_itl = 0;
    rep_result warm;
    if (st == CLI_OK)
        st = run_rep(llm, req_ptrs, &c, itl, &n_itl, &warm);
    n_itl = 0;
    for (size_t k = 0; st == CLI_OK && k < R; k++)
        st = run_rep(llm, req_ptrs, &c, itl, &n_itl, &reps[k]);
    if (st == CLI_OK) {
        for (size_t k = 0; k < R; k++)
            v[k] = reps[k].prefill_tok_s;
        r->prefill_tok_s = bench_quantile(v, R, 0.5);
        r->prefill_min = v[0];
        r->prefill_max = v[R - 1];
        for (size_t k = 0; k < R; k++)
            v[k] = reps[k].decode_tok_s;
        r->decode_tok_s = bench_quantile(v, R, 0.5);
        r->decode_min = v[0];
        r->decode_max = v[R - 1];
        for (size_t k = 0; k < R; k++)
            v[k] = reps[k].ttft_ms;
        r->ttft_ms = bench_quantile(v, R, 0.5);
        r->itl_p50 = bench_quantile(itl, n_itl, 0.5);
        r->itl_p99 = bench_quantile(itl, n_itl, 0.99);
        /* Before the copy, whose buffers are not the engine's. */
        struct rusage ru;
        r->peak_rss_mb = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : 0;
        kiln_llm_weight_bytes(llm, &r->weight_bytes, &r->weight_bytes_per_token);
        r->kv_bytes_per_token = info->cache_tokens > 0 ? (double)info->cache_bytes / (double)info->cache_tokens : 0;
        /* The KV cache may have taken most of the GPU's memory: without an
         * explicit size, a copy that finds no room is retried at 256 MiB. */
        size_t bytes = copy_mb > 0 ? (size_t)copy_mb << 20 : 0;
        kiln_status s = kiln_backend_measure_copy_bandwidth(backend, bytes, 10, &r->copy_bytes_per_s);
        if (s != KILN_OK && copy_mb == 0)
            s = kiln_backend_measure_copy_bandwidth(backend, (size_t)256 << 20, 10, &r->copy_bytes_per_s);
        if (s != KILN_OK)
            st = cli_kiln_error();
        else if (kiln_backend_device_name(backend, r->device, sizeof r->device) != KILN_OK)
            snprintf(r->device, sizeof r->device, "unknown");
    }
    if (st == CLI_OK) {
        /* One decode step reads the weights once and each sequence's cache,
         * on average N + M/2 tokens long over the decode. */
        double step_bytes =
            (double)r->weight_bytes_per_token + (double)B * ((double)N + (double)M / 2) * r->kv_bytes_per_token;
        r->floor_step_ms = step_bytes / r->copy_bytes_per_s * 1e3;
        r->floor_tok_s = r->floor_step_ms > 0 ? (double)B / (r->floor_step_ms / 1e3) : 0;
        r->floor_fraction = r->floor_tok_s > 0 ? r->decode_tok_s / r->floor_tok_s : 0;
    }
    r->prompt_ids = ids;
    free(reqs);
    free(req_ptrs);
    free(c.times);
    free(c.count);
    free(itl);
    free(reps);
    free(v);
    return st;
}

int cli_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--throughput"))
            return cli_bench_throughput(argc, argv);
    static const char *const valued[] = {"--prompt-len", "--gen-len",           "--batch",   "--reps",
                                         "--copy-mb",    CLI_LLM_MEMORY_VALUED, "--plugins", NULL};
    cli_args a;
    cli_args_init(&a, "bench", argc, argv);
    const char *opt, *val;
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    int n_libs = 0, json = 0, help = 0;
    long copy_mb = 0;
    kiln_llm_options lo;
    kiln_llm_options_init(&lo);
    /* Every repetition computes its prompt: the same prompt again must not
     * be served from the prefix cache the previous one filled. */
    lo.no_prefix_caching = 1;
    int handled = 0;
    bench_report r;
    memset(&r, 0, sizeof r);
    r.prompt_len = 128;
    r.gen_len = 128;
    r.batch = 1;
    r.reps = 3;
    int st = libs ? CLI_OK : cli_error("out of memory");
    while (st == CLI_OK && (opt = cli_args_next(&a, valued, &val))) {
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help"))
            help = 1;
        else if (!strcmp(opt, "--prompt-len"))
            st = cli_parse_count("bench", opt, val, &r.prompt_len);
        else if (!strcmp(opt, "--gen-len"))
            st = cli_parse_count("bench", opt, val, &r.gen_len);
        else if (!strcmp(opt, "--batch"))
            st = cli_parse_count("bench", opt, val, &r.batch);
        else if (!strcmp(opt, "--reps"))
            st = cli_parse_count("bench", opt, val, &r.reps);
        else if (!strcmp(opt, "--copy-mb"))
            st = cli_parse_count("bench", opt, val, &copy_mb);
        else if (!strcmp(opt, "--plugins"))
            libs[n_libs++] = val;
        else if (!strcmp(opt, "--json"))
            json = 1;
        else if ((st = cli_llm_memory_option("bench", opt, val, &lo, &handled)) == CLI_OK && !handled)
            st = cli_usage("bench", "unknown option %s", opt);
    }
    if (st == CLI_OK && a.status)
        st = a.status;
    if (st == CLI_OK && help)
        fputs(bench_help, stdout);
    else if (st == CLI_OK && a.n_positional != 1)
        st = cli_usage("bench", "expected one ENGINE, got %d arguments", a.n_positional);
    else if (st == CLI_OK && (r.prompt_len < 1 || r.gen_len < 2))
        st = cli_usage("bench", "--prompt-len must be >= 1 and --gen-len >= 2");
    else if (st == CLI_OK && (r.batch < 1 || r.batch > 4096))
        st = cli_usage("bench", "--batch must be in 1..4096");
    else if (st == CLI_OK && (r.reps < 1 || r.reps > 1000))
        st = cli_usage("bench", "--reps must be in 1..1000");
    kiln_registry *reg = NULL;
    kiln_llm *llm = NULL;
    if (st == CLI_OK && !help) {
        r.engine = a.positional[0];
        double t0 = bench_now_ms();
        st = cli_llm_open(r.engine, libs, n_libs, &lo, &reg, &llm);
        if (st == CLI_OK)
            st = bench(llm, bench_now_ms() - t0, copy_mb, &r);
        if (st == CLI_OK)
            st = print_report(&r, json);
    }
    free(r.prompt_ids);
    kiln_llm_close(llm);
    kiln_registry_destroy(reg);
    free(libs);
    cli_args_free(&a);
    return st;
}
