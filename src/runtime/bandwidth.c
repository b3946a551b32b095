/* kiln_backend_measure_copy_bandwidth (include/kiln/runtime.h): the copy
 * bandwidth a memory-bound step is compared with, measured in the same
 * process as the benchmark it serves. The CUDA side is in cuda_runtime.c. */
#include <kiln/kiln.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../core/error.h"
#include "runtime_internal.h"

enum { MAX_THREADS = 256, MAX_REPS = 64, WARMUP = 2 };

typedef struct copy_slice {
    unsigned char *dst;
    const unsigned char *src;
    size_t bytes;
} copy_slice;

static void *copy_slice_run(void *arg)
{
    copy_slice *c = arg;
    memcpy(c->dst, c->src, c->bytes);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One timed copy over all threads; the calling thread takes the first
 * slice, so one CPU needs no thread at all. */
static kiln_status timed_copy(unsigned char *dst, const unsigned char *src, size_t bytes, int threads,
                              double *seconds)
{
    pthread_t tid[MAX_THREADS];
    copy_slice slices[MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        size_t lo = bytes / (size_t)threads * (size_t)t;
        size_t hi = t + 1 == threads ? bytes : bytes / (size_t)threads * (size_t)(t + 1);
        slices[t] = (copy_slice){dst + lo, src + lo, hi - lo};
    }
    double t0 = now_s();
    int started = 1;
    for (; started < threads; started++)
        if (pthread_create(&tid[started], NULL, copy_slice_run, &slices[started]) != 0)
            break;
    copy_slice_run(&slices[0]);
    for (int t = 1; t < started; t++)
        pthread_join(tid[t], NULL);
    *seconds = now_s() - t0;
    if (started < threads)
        return kiln_fail(KILN_ERROR_INTERNAL, "could not start copy thread %d of %d", started, threads);
    return KILN_OK;
}

static kiln_status cpu_copy_bandwidth(size_t bytes, int32_t reps, double *bytes_per_s)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
    unsigned char *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst) {
        free(src);
        free(dst);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for two %zu-byte copy buffers", bytes);
    }
    /* Touch every page first so the timed copies do not count page faults. */
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    double t[MAX_REPS];
    kiln_status s = KILN_OK;
    for (int32_t i = 0; s == KILN_OK && i < WARMUP + reps; i++) {
        double sec = 0;
        s = timed_copy(dst, src, bytes, threads, &sec);
        if (i >= WARMUP)
            t[i - WARMUP] = sec;
    }
    free(src);
    free(dst);
    if (s != KILN_OK)
        return s;
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    double median = t[reps / 2];
    if (!(median > 0))
        return kiln_fail(KILN_ERROR_INTERNAL, "a host copy of %zu bytes took no measurable time", bytes);
    *bytes_per_s = 2.0 * (double)bytes / median;
    return KILN_OK;
}

kiln_status kiln_backend_measure_copy_bandwidth(kiln_backend backend, size_t bytes, int32_t reps,
                                                double *bytes_per_s)
{
    if (!bytes_per_s || reps < 1 || reps > MAX_REPS)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "kiln_backend_measure_copy_bandwidth: reps %d must be in 1..%d and bytes_per_s set",
                         (int)reps, MAX_REPS);
    switch (backend) {
    case KILN_BACKEND_CPU:
        return cpu_copy_bandwidth(bytes ? bytes : (size_t)256 << 20, reps, bytes_per_s);
    case KILN_BACKEND_CUDA:
#ifdef KILN_HAVE_CUDA
        return kiln_cuda_copy_bandwidth(bytes ? bytes : (size_t)1 << 30, reps, bytes_per_s);
#else
        return kiln_fail(KILN_ERROR_TARGET, "this libkiln was built without the CUDA backend");
#endif
    default:
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "unknown backend %d", (int)backend);
    }
}
