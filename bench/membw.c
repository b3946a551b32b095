/* A STREAM-like memory bandwidth probe, independent of kiln: best of
 * several passes over buffers far larger than the caches, with one thread
 * per online CPU. Prints JSON: copy GB/s (bytes read + written, as STREAM
 * counts them) and read GB/s (a sum over the buffer: what a decode step
 * does to the weights).
 *
 * The read is meant as a floor no decode can beat, so it reads as fast as
 * this machine allows: 64-byte vector loads into four independent sums
 * (AVX-512 where the CPU has it), every line asked for 2 KB ahead, and the
 * buffers in huge pages where the kernel grants them on request. A scalar
 * sum (four chains of double adds, 4 KB pages) read 13-15 GB/s on the
 * 2-core host where this reads 22-29, and kiln's 1B decode exceeded it.
 * Build: cc -O2 -pthread membw.c -o membw */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

#define AHEAD 2048 /* bytes asked for ahead of the loads */

/* Four running sums of 8 doubles over n doubles (n a multiple of 32). */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static double sum_avx512(const double *p, size_t n)
{
    __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n; i += 32) {
        for (int l = 0; l < 4; l++)
            _mm_prefetch((const char *)(p + i) + AHEAD + 64 * l, _MM_HINT_T0);
        s0 = _mm512_add_pd(s0, _mm512_loadu_pd(p + i));
        s1 = _mm512_add_pd(s1, _mm512_loadu_pd(p + i + 8));
        s2 = _mm512_add_pd(s2, _mm512_loadu_pd(p + i + 16));
        s3 = _mm512_add_pd(s3, _mm512_loadu_pd(p + i + 24));
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
}
#endif

/* The same with whatever vectors the compiler makes of 32 independent sums. */
static double sum_portable(const double *p, size_t n)
{
    double s[32] = {0};
    for (size_t i = 0; i < n; i += 32) {
        __builtin_prefetch((const char *)(p + i) + AHEAD);
        __builtin_prefetch((const char *)(p + i) + AHEAD + 128);
        for (int k = 0; k < 32; k++)
            s[k] += p[i + k];
    }
    double t = 0;
    for (int k = 0; k < 32; k++)
        t += s[k];
    return t;
}

static void *work(void *arg)
{
    job *j = arg;
    if (j->copy) {
        memcpy(j->dst, j->src, j->n * sizeof(double));
        return NULL;
    }
    size_t whole = j->n / 32 * 32;
#if defined(__x86_64__)
    j->sum = __builtin_cpu_supports("avx512f") ? sum_avx512(j->src, whole) : sum_portable(j->src, whole);
#else
    j->sum = sum_portable(j->src, whole);
#endif
    for (size_t i = whole; i < j->n; i++)
        j->sum += j->src[i];
    return NULL;
}

/* A buffer on 2 MB boundaries, offered huge pages before it is touched. */
static double *buffer(void)
{
    void *p = NULL;
    if (posix_memalign(&p, (size_t)2 << 20, BYTES) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, BYTES, MADV_HUGEPAGE);
#endif
    return p;
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
    double *a = buffer(), *b = buffer();
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
