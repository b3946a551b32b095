/* A small thread pool that several threads may use at once: the caller of
 * kiln_threadpool_run works on its own job too, so jobs from concurrent
 * contexts always progress. */
#ifndef KILN_CORE_THREADPOOL_H
#define KILN_CORE_THREADPOOL_H

#include <kiln/plugin.h>

typedef struct kiln_threadpool kiln_threadpool;

/* n_threads <= 0: kiln_cpu_physical_cores(). */
kiln_status kiln_threadpool_create(int32_t n_threads, kiln_threadpool **out);
void kiln_threadpool_destroy(kiln_threadpool *pool); /* NULL is a no-op */
int32_t kiln_threadpool_size(const kiln_threadpool *pool);

/* Runs fn(arg, begin, end) over chunks covering [0, n) and returns when all
 * are done. pool may be NULL: runs inline on the caller. */
void kiln_threadpool_run(kiln_threadpool *pool, int64_t n, kiln_parallel_fn fn, void *arg);

/* The process-wide pool used by CPU engines (created on first use, with
 * kiln_cpu_physical_cores() threads). */
kiln_threadpool *kiln_threadpool_global(void);

/* Physical cores this process may run on: the CPUs of its affinity mask,
 * SMT siblings counted once (sysfs topology). Compute-bound kernels gain
 * nothing from a second thread on a core whose vector units are already
 * busy, and lose to the contention. At least 1. */
int32_t kiln_cpu_physical_cores(void);

#endif
