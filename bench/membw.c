/* A STREAM-like memory bandwidth probe, independent of kiln: best of
 * several passes over buffers far larger than the caches, with one thread
 * per online CPU. Prints JSON: copy GB/s (bytes read + written, as STREAM
 * counts them) and read GB/s (a sum over the buffer: what a decode step
 * does to the weights). Build: cc -O2 -pthread membw.c -o membw */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BYTES ((size_t)512 << 20)
#define PASSES 8
#define MAX_THREADS 64

typedef struct job {
    const double *src;
    double *dst;
    size_t n;
    double sum;
    int copy;
} job;

static void *work(void *arg)
{
    job *j = arg;
    if (j->copy) {
        memcpy(j->dst, j->src, j->n * sizeof(double));
    } else {
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        size_t i = 0;
        for (; i + 4 <= j->n; i += 4) {
            s0 += j->src[i];
            s1 += j->src[i + 1];
            s2 += j->src[i + 2];
            s3 += j->src[i + 3];
        }
        for (; i < j->n; i++)
            s0 += j->src[i];
        j->sum = s0 + s1 + s2 + s3;
    }
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best time of PASSES runs of one kind over all threads. */
static double best_time(const double *src, double *dst, size_t n, int threads, int copy, double *sink)
{
    pthread_t tid[MAX_THREADS];
    job jobs[MAX_THREADS];
    double best = 1e30;
    for (int p = 0; p < PASSES; p++) {
        double t0 = now_s();
        for (int t = 0; t < threads; t++) {
            size_t lo = n * (size_t)t / (size_t)threads, hi = n * (size_t)(t + 1) / (size_t)threads;
            jobs[t] = (job){src + lo, dst + lo, hi - lo, 0, copy};
            pthread_create(&tid[t], NULL, work, &jobs[t]);
        }
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            *sink += jobs[t].sum;
        }
        double dt = now_s() - t0;
        if (dt < best)
            best = dt;
    }
    return best;
}

int main(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
    size_t n = BYTES / sizeof(double);
    double *a = malloc(BYTES), *b = malloc(BYTES);
    if (!a || !b) {
        fprintf(stderr, "membw: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        a[i] = (double)(i & 1023), b[i] = 0;
    double sink = 0;
    double tc = best_time(a, b, n, threads, 1, &sink);
    double tr = best_time(a, b, n, threads, 0, &sink);
    printf("{\"threads\": %d, \"bytes\": %zu, \"copy_gbs\": %.2f, \"read_gbs\": %.2f, \"checksum\": %.0f}\n", threads,
           BYTES, 2.0 * (double)BYTES / tc / 1e9, (double)BYTES / tr / 1e9, sink + b[n / 2]);
    free(a);
    free(b);
    return 0;
}
