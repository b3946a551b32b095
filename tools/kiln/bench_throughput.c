/* kiln bench ENGINE --throughput: serving throughput through the
 * request-level scheduler (include/kiln/llm.h, docs/scheduling.md), like
 * trtllm-bench throughput: N requests of random prompt ids, with input and
 * output lengths fixed or spread, submitted all at once or at Poisson
 * arrival times from this thread while the scheduler steps on its own.
 * --instances N opens the engine N times and deals the requests out among
 * their schedulers, which step at once (on a GPU each on its own stream):
 * whether two step streams that overlap on one GPU serve more than one
 * (an attention's memory-bound kernels beside the other's GEMMs) is a
 * question this answers before a scheduler that shares the weights is
 * built for it. */
#include <jansson.h>
#include <kiln/kiln.h>
#include <kiln/llm.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_llm.h"

static const char throughput_help[] =
    "usage: kiln bench ENGINE --throughput [options]\n"
    "\n"
    "Serving throughput of an LLM engine through the request-level scheduler:\n"
    "N requests of random prompt ids (fixed seed), greedy, end-of-sequence\n"
    "ignored, each generating exactly its output length, submitted all at\n"
    "once or at Poisson arrival times while the scheduler steps on its own\n"
    "thread. Reports output and total (prompt + output) tok/s and requests/s\n"
    "over the time from the first submission to the last token, time to\n"
    "first token (from submission) and inter-token latency p50/p99, the peak\n"
    "KV-cache use, preemptions and prefix-cache hits.\n"
    "\n"
    "options:\n"
    "  --requests N             requests (default 256)\n"
    "  --input-len N            prompt tokens per request (default 128)\n"
    "  --output-len M           tokens generated per request (default 128)\n"
    "  --input-dist D           fixed (default), uniform or normal around --input-len\n"
    "  --output-dist D          fixed (default), uniform or normal around --output-len\n"
    "  --spread F               uniform: lengths in [L(1-F), L(1+F)]; normal: standard\n"
    "                           deviation F*L (default 0.5); clamped to the engine's limits\n"
    "  --rate R                 Poisson arrivals, R requests/s on average (default 0: all\n"
    "                           at once)\n"
    "  --prefix-len N           the first N prompt tokens are the same in every request (a\n"
    "                           shared system prompt; default 0)\n"
    "  --warmup N               untimed requests first (default 4)\n"
    "  --seed S                 seed of the prompts, lengths and arrivals (default 1)\n"
    "  --no-prefix-caching      do not share KV blocks of equal prompt prefixes\n"
    "  --no-evict               admit only requests whose whole output fits beside the\n"
    "                           running ones' (never preempt; default: admit while the\n"
    "                           prompt fits, preempt the newest when the cache runs dry)\n"
    "  --instances N            open the engine N times (1..8, default 1; each with its own\n"
    "                           weights and, on a GPU, its own stream), request i to instance\n"
    "                           i mod N, all stepping at once: totals over all of them, step\n"
    "                           times and KV blocks summed. On a GPU each gets 1/N of\n"
    "                           --kv-cache-fraction of the memory all N leave free;\n"
    "                           --kv-cache-mb is per instance\n" CLI_LLM_MEMORY_HELP
    "  --plugins LIB            load a plugin library first (repeatable)\n"
    "  --json                   print one JSON object\n"
    "  -h, --help               show this help\n";

enum { DIST_FIXED, DIST_UNIFORM, DIST_NORMAL };

static const char *const dist_names[3] = {"fixed", "uniform", "normal"};

typedef struct tp_options {
    long requests, input_len, output_len, warmup, prefix_len, instances;
    int input_dist, output_dist;
    double spread, rate;
    long seed;
    int prefix_caching, no_evict, json;
} tp_options;

/* ---- clocks and random numbers -------------------------------------------------------- */

static uint64_t next_u64(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1Dull;
}

/* Uniform in (0, 1). */
static double uniform(uint64_t *x) { return ((double)(next_u64(x) >> 11) + 0.5) * 0x1.0p-53; }

static double normal(uint64_t *x) { return sqrt(-2.0 * log(uniform(x))) * cos(2.0 * M_PI * uniform(x)); }

static long draw_len(uint64_t *x, long mean, int dist, double spread, long lo, long hi)
{
    double v = (double)mean;
    if (dist == DIST_UNIFORM)
        v = (double)mean * (1.0 - spread + 2.0 * spread * uniform(x));
    else if (dist == DIST_NORMAL)
        v = (double)mean * (1.0 + spread * normal(x));
    long n = (long)llround(v);
    return n < lo ? lo : n > hi ? hi : n;
}

/* ---- requests and their clocks ----------------------------------------------------------- */

typedef struct tp_run tp_run;

typedef struct tp_req {
    tp_run *run;
    kiln_llm_request req;
    int32_t *ids;
    long n_in, n_out;
    double t_submit, t_first, t_last;
    long tokens;
    double *itl; /* [n_out - 1] gaps between its tokens */
    int finish;  /* kiln_llm_finish, -1 until it ends */
} tp_req;

struct tp_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long ended, failed;
    char error[256];
};

static int tp_on_token(void *user, const kiln_llm_token *tok)
{
    tp_req *r = user;
    if (tok->id < 0)
        return 0;
    double t = bench_now_ms();
    if (r->tokens == 0)
        r->t_first = t;
    else if (r->tokens - 1 < r->n_out - 1)
        r->itl[r->tokens - 1] = t - r->t_last;
    r->t_last = t;
    r->tokens++;
    return 0;
}

static void tp_on_finish(void *user, kiln_llm_result *res)
{
    tp_req *r = user;
    tp_run *run = r->run;
    pthread_mutex_lock(&run->mu);
    r->finish = res ? (int)res->finish : KILN_LLM_FINISH_ERROR;
    if (r->finish == KILN_LLM_FINISH_ERROR && !run->failed++)
        snprintf(run->error, sizeof run->error, "%s", res && res->error ? res->error : "out of memory");
    run->ended++;
    pthread_cond_broadcast(&run->cv);
    pthread_mutex_unlock(&run->mu);
    kiln_llm_result_free(res);
}

/* Submits reqs[0..n) at their arrival offsets (ms after t0, 0: at once),
 * request i to scheduler i mod n_sc, and waits until every one has ended. */
static int submit_all(kiln_llm_scheduler *const *sc, long n_sc, tp_run *run, tp_req *reqs, long n, const double *arrive,
                      double t0)
{
    kiln_llm_callbacks cb;
    kiln_llm_callbacks_init(&cb);
    cb.on_token = tp_on_token;
    cb.on_finish = tp_on_finish;
    for (long i = 0; i < n; i++) {
        double wait = t0 + (arrive ? arrive[i] : 0) - bench_now_ms();
        if (wait > 0) {
            struct timespec ts = {(time_t)(wait / 1e3), (long)(fmod(wait, 1e3) * 1e6)};
            nanosleep(&ts, NULL);
        }
        cb.user = &reqs[i];
        reqs[i].t_submit = bench_now_ms();
        if (kiln_llm_submit(sc[i % n_sc], &reqs[i].req, &cb, NULL) != KILN_OK) {
            int st = cli_kiln_error();
            /* What was submitted still ends; wait for it before returning. */
            pthread_mutex_lock(&run->mu);
            while (run->ended < i)
                pthread_cond_wait(&run->cv, &run->mu);
            pthread_mutex_unlock(&run->mu);
            return st;
        }
    }
    pthread_mutex_lock(&run->mu);
    while (run->ended < n)
        pthread_cond_wait(&run->cv, &run->mu);
    pthread_mutex_unlock(&run->mu);
    return run->failed ? cli_error("%ld requests failed: %s", run->failed, run->error) : CLI_OK;
}

/* ---- the run ----------------------------------------------------------------------------------- */

typedef struct tp_report {
    const char *engine, *backend, *dtype;
    int32_t max_batch, max_tokens;
    long instances;
    char device[128]; /* what it ran on (kiln_backend_device_name) */
    double duration_s, output_tok_s, total_tok_s, requests_s;
    double ttft_p50, ttft_p99, ttft_max, itl_p50, itl_p99;
    long prompt_tokens, output_tokens;
    kiln_llm_scheduler_stats stats;
} tp_report;

static int print_report(const tp_options *o, const tp_report *r)
{
    const kiln_llm_scheduler_stats *s = &r->stats;
    double peak = s->blocks_total ? (double)s->blocks_peak / s->blocks_total : 0;
    if (!o->json) {
        printf("engine: %s (%s, %s), max_batch %d, max_tokens %d per step", r->engine, r->backend, r->dtype,
               (int)r->max_batch, (int)r->max_tokens);
        if (r->instances > 1)
            printf(", %ld instances stepping at once", r->instances);
        printf("\ndevice: %s\n", r->device);
        printf("%ld requests, input %ld (%s), output %ld (%s), %s, %s admission\n", o->requests, o->input_len,
               dist_names[o->input_dist], o->output_len, dist_names[o->output_dist],
               o->rate > 0 ? "Poisson arrivals" : "all at once", o->no_evict ? "no-evict" : "max-utilization");
        if (o->rate > 0)
            printf("  arrival rate:       %.2f requests/s\n", o->rate);
        printf("  duration:           %.3f s (%ld prompt + %ld output tokens)\n", r->duration_s, r->prompt_tokens,
               r->output_tokens);
        printf("  output throughput:  %.1f tok/s\n", r->output_tok_s);
        printf("  total throughput:   %.1f tok/s\n", r->total_tok_s);
        printf("  requests:           %.2f /s\n", r->requests_s);
        printf("  time to 1st token:  p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", r->ttft_p50, r->ttft_p99, r->ttft_max);
        printf("  inter-token:        p50 %.3f ms, p99 %.3f ms\n", r->itl_p50, r->itl_p99);
        printf("  KV cache:           peak %d of %d blocks (%.1f%%)\n", (int)s->blocks_peak, (int)s->blocks_total,
               100 * peak);
        printf("  steps %llu, preemptions %llu, prefix-cache hits %llu tokens\n", (unsigned long long)s->steps,
               (unsigned long long)s->preemptions, (unsigned long long)s->prefix_hit_tokens);
        if (r->instances > 1)
            printf("  (KV blocks, steps and step times: summed over the instances)\n");
        const unsigned long long prompt_steps = (unsigned long long)(s->steps - s->decode_steps);
        printf("  step time:          %llu decode steps %.3f s (%.3f ms each), %llu with prompt tokens %.3f s\n",
               (unsigned long long)s->decode_steps, s->decode_us * 1e-6,
               s->decode_steps ? s->decode_us * 1e-3 / (double)s->decode_steps : 0.0, prompt_steps,
               s->prompt_step_us * 1e-6);
        return CLI_OK;
    }
    json_t *j = json_object();
    json_object_set_new(j, "engine", json_string(r->engine));
    json_object_set_new(j, "backend", json_string(r->backend));
    json_object_set_new(j, "dtype", json_string(r->dtype));
    json_object_set_new(j, "device", json_string(r->device));
    json_object_set_new(j, "max_batch", json_integer(r->max_batch));
    json_object_set_new(j, "max_tokens", json_integer(r->max_tokens));
    json_object_set_new(j, "instances", json_integer(r->instances));
    json_object_set_new(j, "requests", json_integer(o->requests));
    json_object_set_new(j, "input_len", json_integer(o->input_len));
    json_object_set_new(j, "output_len", json_integer(o->output_len));
    json_object_set_new(j, "input_dist", json_string(dist_names[o->input_dist]));
    json_object_set_new(j, "output_dist", json_string(dist_names[o->output_dist]));
    json_object_set_new(j, "rate", json_real(o->rate));
    json_object_set_new(j, "prefix_len", json_integer(o->prefix_len));
    json_object_set_new(j, "prefix_caching", json_boolean(o->prefix_caching));
    json_object_set_new(j, "admission", json_string(o->no_evict ? "no-evict" : "max-utilization"));
    json_object_set_new(j, "duration_s", json_real(r->duration_s));
    json_object_set_new(j, "prompt_tokens", json_integer(r->prompt_tokens));
    json_object_set_new(j, "output_tokens", json_integer(r->output_tokens));
    json_object_set_new(j, "output_tok_s", json_real(r->output_tok_s));
    json_object_set_new(j, "total_tok_s", json_real(r->total_tok_s));
    json_object_set_new(j, "requests_s", json_real(r->requests_s));
    json_object_set_new(j, "ttft_ms_p50", json_real(r->ttft_p50));
    json_object_set_new(j, "ttft_ms_p99", json_real(r->ttft_p99));
    json_object_set_new(j, "ttft_ms_max", json_real(r->ttft_max));
    json_object_set_new(j, "itl_ms_p50", json_real(r->itl_p50));
    json_object_set_new(j, "itl_ms_p99", json_real(r->itl_p99));
    json_object_set_new(j, "kv_blocks_total", json_integer(s->blocks_total));
    json_object_set_new(j, "kv_blocks_peak", json_integer(s->blocks_peak));
    json_object_set_new(j, "kv_peak_fraction", json_real(peak));
    json_object_set_new(j, "steps", json_integer((json_int_t)s->steps));
    json_object_set_new(j, "preemptions", json_integer((json_int_t)s->preemptions));
    json_object_set_new(j, "prefix_hit_tokens", json_integer((json_int_t)s->prefix_hit_tokens));
    json_object_set_new(j, "decode_steps", json_integer((json_int_t)s->decode_steps));
    json_object_set_new(j, "decode_step_s", json_real(s->decode_us * 1e-6));
    json_object_set_new(j, "prompt_step_s", json_real(s->prompt_step_us * 1e-6));
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text)
        return cli_error("out of memory writing JSON");
    puts(text);
    free(text);
    return CLI_OK;
}

/* n requests with their lengths and prompts; arrive[i] their Poisson
 * offsets (when rate > 0). */
static int make_requests(const tp_options *o, const kiln_llm_info *info, tp_run *run, uint64_t *x, long n, tp_req *reqs,
                         kiln_llm_sampling *greedy)
{
    long max_seq = info->max_seq_len;
    for (long i = 0; i < n; i++) {
        tp_req *r = &reqs[i];
        r->run = run;
        r->finish = -1;
        r->n_in = draw_len(x, o->input_len, o->input_dist, o->spread, 1, max_seq - 1);
        r->n_out = draw_len(x, o->output_len, o->output_dist, o->spread, 1, max_seq - r->n_in);
        r->ids = malloc(sizeof *r->ids * (size_t)r->n_in);
        r->itl = malloc(sizeof *r->itl * (size_t)r->n_out);
        if (!r->ids || !r->itl)
            return cli_error("out of memory for %ld requests", n);
        /* The shared prefix: the same ids for every request. */
        uint64_t shared = (uint64_t)o->seed + 7;
        for (long k = 0; k < r->n_in; k++)
            r->ids[k] = (int32_t)(next_u64(k < o->prefix_len ? &shared : x) % (uint64_t)info->vocab_size);
        kiln_llm_request_init(&r->req);
        r->req.prompt_ids = r->ids;
        r->req.n_prompt_ids = (size_t)r->n_in;
        r->req.max_tokens = (int32_t)r->n_out;
        r->req.ignore_eos = 1;
        r->req.sampling = greedy;
    }
    return CLI_OK;
}

static void free_requests(tp_req *reqs, long n)
{
    for (long i = 0; reqs && i < n; i++) {
        free(reqs[i].ids);
        free(reqs[i].itl);
    }
    free(reqs);
}

/* The counters of one scheduler added into *sum (the first: copied). */
static void add_stats(kiln_llm_scheduler_stats *sum, const kiln_llm_scheduler_stats *s, int first)
{
    if (first) {
        *sum = *s;
        return;
    }
    sum->blocks_total += s->blocks_total;
    sum->blocks_peak += s->blocks_peak;
    sum->steps += s->steps;
    sum->preemptions += s->preemptions;
    sum->prefix_hit_tokens += s->prefix_hit_tokens;
    sum->decode_steps += s->decode_steps;
    sum->decode_us += s->decode_us;
    sum->prompt_step_us += s->prompt_step_us;
}

/* All schedulers' counters summed. */
static void stats_all(kiln_llm_scheduler *const *sc, long n, kiln_llm_scheduler_stats *sum)
{
    for (long k = 0; k < n; k++) {
        kiln_llm_scheduler_stats s = {.struct_size = sizeof s};
        kiln_llm_scheduler_stats_get(sc[k], &s);
        add_stats(sum, &s, k == 0);
    }
}

static int throughput(kiln_llm *const *llms, long n_inst, const tp_options *o, tp_report *rep)
{
    kiln_llm *llm = llms[0];
    const kiln_llm_info *info = kiln_llm_info_get(llm);
    rep->instances = n_inst;
    const kiln_backend backend = kiln_engine_backend(kiln_llm_engine(llm));
    rep->backend = kiln_backend_name(backend);
    if (kiln_backend_device_name(backend, rep->device, sizeof rep->device) != KILN_OK)
        snprintf(rep->device, sizeof rep->device, "unknown");
    rep->dtype = kiln_dtype_name(info->dtype);
    rep->max_batch = info->max_batch;
    rep->max_tokens = info->max_tokens;
    if (o->input_len >= info->max_seq_len)
        return cli_error("--input-len %ld leaves no room to generate in the engine's max sequence length %d",
                         o->input_len, (int)info->max_seq_len);
    uint64_t x = (uint64_t)o->seed * 0x9E3779B97F4A7C15ull + 1;
    kiln_llm_sampling greedy;
    kiln_llm_sampling_init(&greedy);
    greedy.temperature = 0;
    tp_run run = {.ended = 0};
    pthread_mutex_init(&run.mu, NULL);
    pthread_cond_init(&run.cv, NULL);
    long N = o->requests, W = o->warmup;
    tp_req *reqs = calloc((size_t)N, sizeof *reqs), *warm = calloc(W > 0 ? (size_t)W : 1, sizeof *warm);
    double *arrive = calloc((size_t)N, sizeof *arrive), *ttft = calloc((size_t)N, sizeof *ttft);
    int st = reqs && warm && arrive && ttft ? CLI_OK : cli_error("out of memory for %ld requests", N);
    if (st == CLI_OK)
        st = make_requests(o, info, &run, &x, W, warm, &greedy);
    if (st == CLI_OK)
        st = make_requests(o, info, &run, &x, N, reqs, &greedy);
    for (long i = 1; st == CLI_OK && o->rate > 0 && i < N; i++)
        arrive[i] = arrive[i - 1] - log(uniform(&x)) / o->rate * 1e3;
    kiln_llm_scheduler_options so;
    kiln_llm_scheduler_options_init(&so);
    so.prefix_caching = o->prefix_caching;
    so.admission = o->no_evict ? KILN_LLM_ADMIT_NO_EVICT : KILN_LLM_ADMIT_MAX_UTILIZATION;
    so.max_queue = (int32_t)(N > W ? N : W) + 1;
    kiln_llm_scheduler *sc[8] = {NULL};
    long n_sc = 0;
    while (st == CLI_OK && n_sc < n_inst) {
        if (kiln_llm_scheduler_start(llms[n_sc], &so, &sc[n_sc]) != KILN_OK)
            st = cli_kiln_error();
        else
            n_sc++;
    }
    /* each instance warms up: W requests apiece */
    for (long k = 0; st == CLI_OK && W > 0 && k < n_sc; k++) {
        for (long i = 0; i < W; i++)
            warm[i].tokens = 0, warm[i].finish = -1;
        run.ended = 0;
        st = submit_all(&sc[k], 1, &run, warm, W, NULL, bench_now_ms());
    }
    kiln_llm_scheduler_stats before = {.struct_size = sizeof before};
    if (n_sc)
        stats_all(sc, n_sc, &before);
    double t0 = bench_now_ms();
    run.ended = 0;
    if (st == CLI_OK)
        st = submit_all(sc, n_sc, &run, reqs, N, o->rate > 0 ? arrive : NULL, t0);
    double end = t0;
    rep->stats.struct_size = sizeof rep->stats;
    if (n_sc)
        stats_all(sc, n_sc, &rep->stats);
    for (long k = 0; k < n_sc; k++)
        kiln_llm_scheduler_stop(sc[k], 0);
    if (st == CLI_OK) {
        size_t n_itl = 0;
        for (long i = 0; i < N; i++)
            n_itl += reqs[i].tokens > 1 ? (size_t)reqs[i].tokens - 1 : 0;
        double *itl = malloc(sizeof *itl * (n_itl ? n_itl : 1));
        if (!itl)
            st = cli_error("out of memory");
        n_itl = 0;
        for (long i = 0; st == CLI_OK && i < N; i++) {
            const tp_req *r = &reqs[i];
            if (r->tokens != r->n_out) {
                st = cli_error("request %ld generated %ld tokens, expected %ld (%s)", i, r->tokens, r->n_out,
                               kiln_llm_finish_name((kiln_llm_finish)r->finish));
                break;
            }
            ttft[i] = r->t_first - r->t_submit;
            if (r->t_last > end)
                end = r->t_last;
            rep->prompt_tokens += r->n_in;
            rep->output_tokens += r->n_out;
            for (long k = 0; k + 1 < r->tokens; k++)
                itl[n_itl++] = r->itl[k];
        }
        if (st == CLI_OK) {
            rep->duration_s = (end - t0) / 1e3;
            rep->output_tok_s = rep->duration_s > 0 ? (double)rep->output_tokens / rep->duration_s : 0;
            rep->total_tok_s =
                rep->duration_s > 0 ? (double)(rep->prompt_tokens + rep->output_tokens) / rep->duration_s : 0;
            rep->requests_s = rep->duration_s > 0 ? (double)N / rep->duration_s : 0;
            rep->ttft_p50 = bench_quantile(ttft, (size_t)N, 0.5);
            rep->ttft_p99 = bench_quantile(ttft, (size_t)N, 0.99);
            rep->ttft_max = ttft[N - 1];
            rep->itl_p50 = bench_quantile(itl, n_itl, 0.5);
            rep->itl_p99 = bench_quantile(itl, n_itl, 0.99);
            /* Counters of the timed requests alone (the peak covers all). */
            rep->stats.steps -= before.steps;
            rep->stats.preemptions -= before.preemptions;
            rep->stats.prefix_hit_tokens -= before.prefix_hit_tokens;
            rep->stats.decode_steps -= before.decode_steps;
            rep->stats.decode_us -= before.decode_us;
            rep->stats.prompt_step_us -= before.prompt_step_us;
        }
        free(itl);
    }
    free_requests(reqs, N);
    free_requests(warm, W);
    free(arrive);
    free(ttft);
    pthread_mutex_destroy(&run.mu);
    pthread_cond_destroy(&run.cv);
    return st;
}

/* The KV memory of each of n instances of a GPU engine, as
 * lo->kv_cache_mb: kv_cache_fraction of the memory left free once all n
 * hold their weights and step buffers (opened once with one KV block and
 * no graphs to see it), split evenly. A CPU engine keeps its own default. */
static int share_kv(kiln_registry *reg, const char *path, kiln_llm_options *lo, long n)
{
    kiln_llm *probe[8] = {NULL};
    kiln_llm_options po = *lo;
    po.kv_cache_blocks = 1;
    po.no_cuda_graphs = 1;
    int st = CLI_OK;
    long k = 0;
    size_t free_b = 0, total = 0;
    for (; st == CLI_OK && k < n; k++)
        if (kiln_llm_open(reg, path, &po, &probe[k]) != KILN_OK)
            st = cli_error("instance %ld of %ld: %s", k + 1, n, kiln_last_error());
    const kiln_engine *e = st == CLI_OK ? kiln_llm_engine(probe[n - 1]) : NULL;
    int gpu = e && kiln_engine_backend(e) != KILN_BACKEND_CPU;
    if (gpu && kiln_engine_memory_info(e, &free_b, &total) != KILN_OK)
        st = cli_kiln_error();
    for (long i = 0; i < n; i++)
        kiln_llm_close(probe[i]);
    if (st != CLI_OK || !gpu)
        return st;
    size_t each = (size_t)((double)free_b * lo->kv_cache_fraction / (double)n) >> 20;
    if (each == 0)
        return cli_error("%ld instances leave %zu MB of GPU memory free for their KV caches", n, free_b >> 20);
    lo->kv_cache_mb = each;
    return CLI_OK;
}

static int parse_dist(const char *opt, const char *val, int *out)
{
    for (int d = 0; d < 3; d++)
        if (!strcmp(val, dist_names[d])) {
            *out = d;
            return CLI_OK;
        }
    return cli_usage("bench", "%s must be fixed, uniform or normal, not \"%s\"", opt, val);
}

static int parse_real(const char *opt, const char *val, double lo, double hi, double *out)
{
    char *end = NULL;
    double v = strtod(val, &end);
    if (!end || *end || end == val || !(v >= lo && v <= hi))
        return cli_usage("bench", "%s must be a number in [%g, %g], not \"%s\"", opt, lo, hi, val);
    *out = v;
    return CLI_OK;
}

int cli_bench_throughput(int argc, char **argv)
{
    static const char *const valued[] = {
        "--requests", "--input-len",  "--output-len", "--input-dist",        "--output-dist", "--spread",    "--rate",
        "--warmup",   "--prefix-len", "--seed",       CLI_LLM_MEMORY_VALUED, "--plugins",     "--instances", NULL};
    cli_args a;
    cli_args_init(&a, "bench", argc, argv);
    const char *opt, *val;
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    int n_libs = 0, help = 0, handled = 0;
    kiln_llm_options lo;
    kiln_llm_options_init(&lo);
    tp_options o = {.requests = 256,
                    .input_len = 128,
                    .output_len = 128,
                    .warmup = 4,
                    .spread = 0.5,
                    .seed = 1,
                    .instances = 1,
                    .prefix_caching = 1};
    int st = libs ? CLI_OK : cli_error("out of memory");
    while (st == CLI_OK && (opt = cli_args_next(&a, valued, &val))) {
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help"))
            help = 1;
        else if (!strcmp(opt, "--throughput"))
            continue;
        else if (!strcmp(opt, "--requests"))
            st = cli_parse_count("bench", opt, val, &o.requests);
        else if (!strcmp(opt, "--input-len"))
            st = cli_parse_count("bench", opt, val, &o.input_len);
        else if (!strcmp(opt, "--output-len"))
            st = cli_parse_count("bench", opt, val, &o.output_len);
        else if (!strcmp(opt, "--prefix-len"))
            st = cli_parse_count("bench", opt, val, &o.prefix_len);
        else if (!strcmp(opt, "--warmup"))
            st = cli_parse_count("bench", opt, val, &o.warmup);
        else if (!strcmp(opt, "--seed"))
            st = cli_parse_count("bench", opt, val, &o.seed);
        else if (!strcmp(opt, "--instances"))
            st = cli_parse_count("bench", opt, val, &o.instances);
        else if (!strcmp(opt, "--input-dist"))
            st = parse_dist(opt, val, &o.input_dist);
        else if (!strcmp(opt, "--output-dist"))
            st = parse_dist(opt, val, &o.output_dist);
        else if (!strcmp(opt, "--spread"))
            st = parse_real(opt, val, 0.0, 1.0, &o.spread);
        else if (!strcmp(opt, "--rate"))
            st = parse_real(opt, val, 0.0, 1e6, &o.rate);
        else if (!strcmp(opt, "--no-prefix-caching"))
            o.prefix_caching = 0;
        else if (!strcmp(opt, "--no-evict"))
            o.no_evict = 1;
        else if (!strcmp(opt, "--plugins"))
            libs[n_libs++] = val;
        else if (!strcmp(opt, "--json"))
            o.json = 1;
        else if ((st = cli_llm_memory_option("bench", opt, val, &lo, &handled)) == CLI_OK && !handled)
            st = cli_usage("bench", "unknown option %s", opt);
    }
    if (st == CLI_OK && a.status)
        st = a.status;
    if (st == CLI_OK && help)
        fputs(throughput_help, stdout);
    else if (st == CLI_OK && a.n_positional != 1)
        st = cli_usage("bench", "expected one ENGINE, got %d arguments", a.n_positional);
    else if (st == CLI_OK && (o.requests < 1 || o.requests > 1000000))
        st = cli_usage("bench", "--requests must be in 1..1000000");
    else if (st == CLI_OK && (o.input_len < 1 || o.output_len < 1))
        st = cli_usage("bench", "--input-len and --output-len must be >= 1");
    else if (st == CLI_OK && o.warmup > 10000)
        st = cli_usage("bench", "--warmup must be in 0..10000");
    else if (st == CLI_OK && (o.instances < 1 || o.instances > 8))
        st = cli_usage("bench", "--instances must be in 1..8");
    kiln_registry *reg = NULL;
    kiln_llm *llms[8] = {NULL};
    long n_open = 0;
    if (st == CLI_OK && !help) {
        tp_report r;
        memset(&r, 0, sizeof r);
        r.engine = a.positional[0];
        st = cli_registry(libs, n_libs, &reg);
        if (st == CLI_OK && o.instances > 1 && !lo.kv_cache_mb && !lo.kv_cache_blocks)
            st = share_kv(reg, r.engine, &lo, o.instances);
        while (st == CLI_OK && n_open < o.instances) {
            if (kiln_llm_open(reg, r.engine, &lo, &llms[n_open]) == KILN_OK)
                n_open++;
            else if (o.instances == 1)
                st = cli_kiln_error();
            else
                st = cli_error("instance %ld of %ld: %s", n_open + 1, o.instances, kiln_last_error());
        }
        if (st == CLI_OK)
            st = throughput(llms, n_open, &o, &r);
        if (st == CLI_OK)
            st = print_report(&o, &r);
    }
    for (long k = 0; k < n_open; k++)
        kiln_llm_close(llms[k]);
    kiln_registry_destroy(reg);
    free(libs);
    cli_args_free(&a);
    return st;
}
