/* Prometheus text for GET /metrics. Names follow Prometheus' conventions
 * (base units, _total for counters); the model is a label so that one
 * scrape config serves several kiln servers. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/metrics.h"

/* Bucket bounds in seconds: from a fast GPU's inter-token gap to a long
 * CPU request. */
static const double bounds[KILN_METRICS_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                    0.5,   1,      2.5,   5,    10,    30,   60,  300};

void kiln_metrics_init(kiln_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
}

void kiln_metrics_destroy(kiln_metrics *m) { pthread_mutex_destroy(&m->lock); }

void kiln_metrics_observe(kiln_metrics *m, kiln_metric_hist h, double seconds)
{
    int b = 0;
    while (b < KILN_METRICS_BUCKETS && seconds > bounds[b])
        b++;
    pthread_mutex_lock(&m->lock);
    m->hist[h].counts[b]++;
    m->hist[h].count++;
    m->hist[h].sum += seconds;
    pthread_mutex_unlock(&m->lock);
}

void kiln_metrics_count_response(kiln_metrics *m, int status)
{
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < KILN_METRICS_CODES; i++) {
        if (m->codes[i] == status || m->codes[i] == 0) {
            m->codes[i] = status;
            m->code_counts[i]++;
            break;
        }
    }
    pthread_mutex_unlock(&m->lock);
}

void kiln_metrics_count_disconnect(kiln_metrics *m)
{
    pthread_mutex_lock(&m->lock);
    m->disconnects++;
    pthread_mutex_unlock(&m->lock);
}

typedef struct page {
    char *p;
    size_t len, cap;
    int oom;
} page;

static void put(page *pg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(page *pg, const char *fmt, ...)
{
    for (;;) {
        if (pg->oom)
            return;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(pg->p + pg->len, pg->cap - pg->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            pg->oom = 1;
            return;
        }
        if ((size_t)n < pg->cap - pg->len) {
            pg->len += (size_t)n;
            return;
        }
        size_t cap = pg->cap * 2 + (size_t)n;
        char *q = realloc(pg->p, cap);
        if (!q) {
            pg->oom = 1;
            return;
        }
        pg->p = q;
        pg->cap = cap;
    }
}

static void metric(page *pg, const char *name, const char *type, const char *help, const char *model, double v)
{
    put(pg, "# HELP %s %s\n# TYPE %s %s\n%s{model=\"%s\"} %.17g\n", name, help, name, type, name, model, v);
}

static void histogram(page *pg, const char *name, const char *help, const char *model, const kiln_histogram *h)
{
    put(pg, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < KILN_METRICS_BUCKETS; b++) {
        cum += h->counts[b];
        put(pg, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", name, model, bounds[b], (unsigned long long)cum);
    }
    cum += h->counts[KILN_METRICS_BUCKETS];
    put(pg, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n", name, model, (unsigned long long)cum);
    put(pg, "%s_sum{model=\"%s\"} %.17g\n%s_count{model=\"%s\"} %llu\n", name, model, h->sum, name, model,
        (unsigned long long)h->count);
}

char *kiln_metrics_render(kiln_metrics *m, const kiln_llm_scheduler_stats *s, const char *model_name)
{
    /* a label value escapes backslash, quote and newline */
    char model[256];
    size_t w = 0;
    for (const char *c = model_name; *c && w + 3 < sizeof model; c++) {
        if (*c == '\\' || *c == '"' || *c == '\n')
            model[w++] = '\\';
        model[w++] = *c == '\n' ? 'n' : *c;
    }
    model[w] = '\0';
    page pg = {malloc(8192), 0, 8192, 0};
    if (!pg.p)
        return NULL;
    pg.p[0] = '\0';
    metric(&pg, "kiln_requests_running", "gauge", "Requests holding KV-cache blocks.", model, s->running);
    metric(&pg, "kiln_requests_waiting", "gauge", "Requests queued for admission, preempted ones included.", model,
           s->waiting);
    metric(&pg, "kiln_kv_cache_blocks_total", "gauge", "KV-cache blocks.", model, s->blocks_total);
    metric(&pg, "kiln_kv_cache_blocks_used", "gauge", "KV-cache blocks held by requests or shared prefixes in use.",
           model, s->blocks_used);
    metric(&pg, "kiln_kv_cache_blocks_free", "gauge", "KV-cache blocks free.", model, s->blocks_total - s->blocks_used);
    metric(&pg, "kiln_kv_cache_usage_ratio", "gauge", "Fraction of the KV-cache blocks in use.", model,
           s->blocks_total > 0 ? (double)s->blocks_used / s->blocks_total : 0);
    metric(&pg, "kiln_kv_cache_blocks_peak", "gauge", "Most KV-cache blocks in use at once.", model, s->blocks_peak);
    metric(&pg, "kiln_steps_total", "counter", "Engine steps run.", model, (double)s->steps);
    metric(&pg, "kiln_preemptions_total", "counter", "Requests preempted when the KV cache ran dry.", model,
           (double)s->preemptions);
    metric(&pg, "kiln_decode_steps_total", "counter", "Engine steps of one token a request.", model,
           (double)s->decode_steps);
    put(&pg, "# HELP kiln_step_seconds_total Time in engine steps, by kind: decode (one token a request) or "
             "prompt (prompt tokens in the step).\n# TYPE kiln_step_seconds_total counter\n");
    put(&pg, "kiln_step_seconds_total{model=\"%s\",kind=\"decode\"} %.6f\n", model, s->decode_us * 1e-6);
    put(&pg, "kiln_step_seconds_total{model=\"%s\",kind=\"prompt\"} %.6f\n", model, s->prompt_step_us * 1e-6);
    metric(&pg, "kiln_prefix_cache_hit_tokens_total", "counter", "Prompt tokens whose KV was reused from the cache.",
           model, (double)s->prefix_hit_tokens);
    metric(&pg, "kiln_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", model,
           (double)s->prompt_tokens);
    metric(&pg, "kiln_generation_tokens_total", "counter", "Tokens generated.", model, (double)s->generated_tokens);
    put(&pg, "# HELP kiln_requests_total Requests that ended, by outcome.\n# TYPE kiln_requests_total counter\n");
    put(&pg, "kiln_requests_total{model=\"%s\",outcome=\"finished\"} %llu\n", model, (unsigned long long)s->finished);
    put(&pg, "kiln_requests_total{model=\"%s\",outcome=\"cancelled\"} %llu\n", model, (unsigned long long)s->cancelled);
    put(&pg, "kiln_requests_total{model=\"%s\",outcome=\"failed\"} %llu\n", model, (unsigned long long)s->failed);

    kiln_metrics snap;
    pthread_mutex_lock(&m->lock);
    memcpy(snap.hist, m->hist, sizeof snap.hist);
    memcpy(snap.codes, m->codes, sizeof snap.codes);
    memcpy(snap.code_counts, m->code_counts, sizeof snap.code_counts);
    snap.disconnects = m->disconnects;
    pthread_mutex_unlock(&m->lock);
    metric(&pg, "kiln_client_disconnects_total", "counter",
           "Requests cancelled because their client closed the connection.", model, (double)snap.disconnects);
    put(&pg, "# HELP kiln_http_responses_total HTTP responses sent, by status code.\n"
             "# TYPE kiln_http_responses_total counter\n");
    for (int i = 0; i < KILN_METRICS_CODES && snap.codes[i]; i++)
        put(&pg, "kiln_http_responses_total{model=\"%s\",code=\"%d\"} %llu\n", model, snap.codes[i],
            (unsigned long long)snap.code_counts[i]);
    histogram(&pg, "kiln_time_to_first_token_seconds", "From a request's arrival to its first token.", model,
              &snap.hist[KILN_HIST_TTFT]);
    histogram(&pg, "kiln_inter_token_latency_seconds", "Between consecutive tokens of one request.", model,
              &snap.hist[KILN_HIST_ITL]);
    histogram(&pg, "kiln_request_latency_seconds", "From a request's arrival to its end.", model,
              &snap.hist[KILN_HIST_E2E]);
    if (pg.oom) {
        free(pg.p);
        return NULL;
    }
    return pg.p;
}
