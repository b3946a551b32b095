/* What the C microbenchmarks in bench/ share: a monotonic clock, the qsort
 * order their medians sort by, and a plugin tensor descriptor. Header-only:
 * each benchmark is one file linked against the library. */
#ifndef KILN_BENCH_UTIL_H
#define KILN_BENCH_UTIL_H

#include <kiln/plugin.h>

#include <string.h>
#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline kiln_tensor_desc desc(kiln_dtype t, int rank, const int64_t *d)
{
    kiln_tensor_desc r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    r.abi_version = KILN_PLUGIN_ABI_VERSION;
    r.dtype = t;
    r.dims.rank = rank;
    for (int i = 0; i < rank; i++)
        r.dims.d[i] = d[i];
    return r;
}

#endif
