/* The server's own measurements for GET /metrics (Prometheus text format
 * 0.0.4): latency histograms and HTTP response counts, beside the
 * scheduler's counters (kiln_llm_scheduler_stats). Thread-safe: tokens are
 * timed on the scheduler's thread, responses counted on the HTTP one. */
#ifndef KILN_SERVER_METRICS_H
#define KILN_SERVER_METRICS_H

#include <kiln/llm.h>
#include <pthread.h>
#include <stdint.h>

enum { KILN_METRICS_BUCKETS = 16, KILN_METRICS_CODES = 16 };

typedef struct kiln_histogram {
    uint64_t counts[KILN_METRICS_BUCKETS + 1]; /* per bucket, the last one +Inf */
    uint64_t count;
    double sum;
} kiln_histogram;

typedef enum kiln_metric_hist {
    KILN_HIST_TTFT = 0, /* submit to first token, seconds */
    KILN_HIST_ITL,      /* between two tokens of one request */
    KILN_HIST_E2E,      /* submit to the request's end */
    KILN_HIST_COUNT
} kiln_metric_hist;

typedef struct kiln_metrics {
    pthread_mutex_t lock;
    kiln_histogram hist[KILN_HIST_COUNT];
    int codes[KILN_METRICS_CODES]; /* HTTP status codes seen, and their counts */
    uint64_t code_counts[KILN_METRICS_CODES];
    uint64_t disconnects; /* requests cancelled because their client went away */
} kiln_metrics;

void kiln_metrics_init(kiln_metrics *m);
void kiln_metrics_destroy(kiln_metrics *m);
void kiln_metrics_observe(kiln_metrics *m, kiln_metric_hist h, double seconds);
void kiln_metrics_count_response(kiln_metrics *m, int status);
void kiln_metrics_count_disconnect(kiln_metrics *m);

/* The whole page, NUL-terminated, malloc'd (NULL when out of memory). */
char *kiln_metrics_render(kiln_metrics *m, const kiln_llm_scheduler_stats *stats, const char *model);

#endif
