/* The CPU backend's copy bandwidth (backend table member copy_bandwidth):
 * what a memory-bound step on the CPU is compared with; and its device
 * name (device_name), which a benchmark prints beside it. */
#include "backend/cpu/cpu_backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

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
static kiln_status timed_copy(unsigned char *dst, const unsigned char *src, size_t bytes, int threads, double *seconds)
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

kiln_status kiln_cpu_copy_bandwidth(size_t bytes, int32_t reps, double *bytes_per_s)
{
    if (bytes == 0)
        bytes = (size_t)256 << 20;
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

kiln_status kiln_cpu_device_name(char *name, size_t size)
{
    /* name and size were checked by kiln_backend_device_name, the one caller */
    snprintf(name, size, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return KILN_OK;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        /* x86: "model name"; some ARM kernels say only "Hardware" or "CPU part" */
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *v = strchr(line, ':');
        if (!v)
            continue;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        size_t n = strcspn(v, "\n");
        snprintf(name, size, "%.*s", (int)n, v);
        break;
    }
    fclose(f);
    return KILN_OK;
}
