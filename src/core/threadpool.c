/* A shared pthread pool. Each kiln_threadpool_run call publishes a job on
 * the pool's list; idle workers join any listed job and take chunks from it
 * with an atomic counter while the calling thread does the same. A chunk
 * is 1/size of what is left when it is taken (guided scheduling): the
 * first ones are long, for the GEMVs' streams, and the last ones are one
 * item, so the threads end a job together. Equal chunks, four a thread,
 * left one thread idle for half a chunk at the end of each job on
 * average: guided chunks took 2-7% off a 2-thread decode step
 * (bench/README-llm.md, twelfth session). The job
 * lives on the caller's stack, so the caller unlists it and waits until no
 * worker still holds it before returning. Because the caller always works
 * on its own job, a job finishes even when every worker is busy elsewhere.
 *
 * An idle worker polls for the next job for a short while (KILN_POOL_SPIN
 * pauses, some tens of microseconds) before it sleeps on the condition
 * variable: a decode step runs hundreds of short jobs back to back, and
 * waking a sleeping thread for each one costs a futex call and a
 * reschedule per job. The caller likewise polls briefly for the workers
 * still inside its job. Neither is woken through the kernel unless it
 * sleeps. */
#include "core/threadpool.h"

#include "core/error.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct job {
    kiln_parallel_fn fn;
    void *arg;
    int64_t n;          /* items [0, n) */
    int64_t div;        /* a chunk takes 1/div of the items left (at least one) */
    atomic_llong next;  /* the first item not yet taken */
    atomic_int holders; /* workers inside the job (changed under the pool mutex) */
    int32_t listed;     /* on the pool's list (pool mutex) */
    struct job *prev, *nextjob;
} job;

struct kiln_threadpool {
    int32_t size; /* threads working on a job: workers + the caller */
    int32_t n_workers;
    pthread_t *workers;
    pthread_mutex_t mu;
    pthread_cond_t work; /* a job was listed, or stop */
    pthread_cond_t idle; /* a worker left a job */
    job *head;
    int32_t stop;
    int32_t sleeping;   /* workers waiting on `work` (pool mutex) */
    atomic_uint listed; /* jobs listed so far: what idle workers poll */
};

/* Pauses an idle thread polls for before it sleeps. */
#define KILN_POOL_SPIN 2048

static void job_unlist(kiln_threadpool *pool, job *j)
{
    if (!j->listed)
        return;
    if (j->prev)
        j->prev->nextjob = j->nextjob;
    else
        pool->head = j->nextjob;
    if (j->nextjob)
        j->nextjob->prev = j->prev;
    j->listed = 0;
}

/* Takes chunks until none are left; returns when the job is exhausted. */
static void job_work(job *j)
{
    long long b = atomic_load_explicit(&j->next, memory_order_relaxed);
    while (b < j->n) {
        long long size = (j->n - b) / j->div;
        size = size < 1 ? 1 : size;
        /* on failure b is the counter's current value: try again from it */
        if (atomic_compare_exchange_weak_explicit(&j->next, &b, b + size, memory_order_relaxed, memory_order_relaxed)) {
            j->fn(j->arg, b, b + size);
            b = atomic_load_explicit(&j->next, memory_order_relaxed);
        }
    }
}

static void *worker_main(void *p)
{
    kiln_threadpool *pool = p;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop && !pool->head) {
            unsigned seen = atomic_load_explicit(&pool->listed, memory_order_relaxed);
            pthread_mutex_unlock(&pool->mu);
            for (int i = 0; i < KILN_POOL_SPIN && atomic_load_explicit(&pool->listed, memory_order_relaxed) == seen;
                 i++)
                POOL_PAUSE();
            pthread_mutex_lock(&pool->mu);
            if (pool->stop || pool->head)
                break;
            pool->sleeping++;
            pthread_cond_wait(&pool->work, &pool->mu);
            pool->sleeping--;
        }
        if (pool->stop)
            break;
        job *j = pool->head;
        atomic_fetch_add(&j->holders, 1);
        pthread_mutex_unlock(&pool->mu);
        job_work(j);
        pthread_mutex_lock(&pool->mu);
        /* Exhausted: nobody else should join it. */
        job_unlist(pool, j);
        if (atomic_fetch_sub(&j->holders, 1) == 1)
            pthread_cond_broadcast(&pool->idle);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

/* Parses a sysfs CPU list ("0-3,8,10-11") into `set`; 0 when malformed. */
static int parse_cpu_list(const char *s, cpu_set_t *set)
{
    CPU_ZERO(set);
    while (*s && *s != '\n') {
        char *end;
        long lo = strtol(s, &end, 10), hi = lo;
        if (end == s || lo < 0)
            return 0;
        if (*end == '-') {
            s = end + 1;
            hi = strtol(s, &end, 10);
            if (end == s || hi < lo)
                return 0;
        }
        for (long c = lo; c <= hi && c < CPU_SETSIZE; c++)
            CPU_SET((int)c, set);
        s = *end == ',' ? end + 1 : end;
    }
    return 1;
}

int32_t kiln_cpu_physical_cores(void)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n < 1 ? 1 : n > 1024 ? 1024 : (int32_t)n;
    }
    int32_t cores = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &allowed))
            continue;
        /* A core is counted at its lowest allowed hardware thread. */
        char path[96], buf[256];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        FILE *f = fopen(path, "r");
        cpu_set_t siblings;
        int known = f && fgets(buf, sizeof buf, f) && parse_cpu_list(buf, &siblings);
        if (f)
            fclose(f);
        int first = c;
        if (known)
            for (int o = 0; o < c; o++)
                if (CPU_ISSET(o, &siblings) && CPU_ISSET(o, &allowed)) {
                    first = o;
                    break;
                }
        cores += first == c;
    }
    return cores < 1 ? 1 : cores > 1024 ? 1024 : cores;
}

kiln_status kiln_threadpool_create(int32_t n_threads, kiln_threadpool **out)
{
    if (n_threads <= 0)
        n_threads = kiln_cpu_physical_cores();
    kiln_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "thread pool: out of memory");
    pool->size = n_threads;
    atomic_init(&pool->listed, 0);
    if (n_threads > 1) {
        pool->workers = calloc((size_t)(n_threads - 1), sizeof *pool->workers);
        if (!pool->workers) {
            free(pool);
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "thread pool: out of memory");
        }
    }
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->work, NULL);
    pthread_cond_init(&pool->idle, NULL);
    for (int32_t i = 0; i < n_threads - 1; i++) {
        if (pthread_create(&pool->workers[i], NULL, worker_main, pool) != 0) {
            kiln_threadpool_destroy(pool);
            return kiln_fail(KILN_ERROR_INTERNAL, "thread pool: cannot start thread %d of %d", (int)i + 1,
                             (int)(n_threads - 1));
        }
        pool->n_workers++;
    }
    *out = pool;
    return KILN_OK;
}

void kiln_threadpool_destroy(kiln_threadpool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    for (int32_t i = 0; i < pool->n_workers; i++)
        pthread_join(pool->workers[i], NULL);
    pthread_cond_destroy(&pool->idle);
    pthread_cond_destroy(&pool->work);
    pthread_mutex_destroy(&pool->mu);
    free(pool->workers);
    free(pool);
}

int32_t kiln_threadpool_size(const kiln_threadpool *pool) { return pool ? pool->size : 1; }

void kiln_threadpool_run(kiln_threadpool *pool, int64_t n, kiln_parallel_fn fn, void *arg)
{
    if (n <= 0)
        return;
    if (!pool || pool->n_workers == 0 || n == 1) {
        fn(arg, 0, n);
        return;
    }
    job j = {.fn = fn, .arg = arg, .n = n, .div = pool->size};
    atomic_init(&j.next, 0);
    atomic_init(&j.holders, 0);

    pthread_mutex_lock(&pool->mu);
    j.nextjob = pool->head;
    if (pool->head)
        pool->head->prev = &j;
    pool->head = &j;
    j.listed = 1;
    atomic_fetch_add_explicit(&pool->listed, 1, memory_order_relaxed);
    if (pool->sleeping > 0)
        pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);

    job_work(&j);

    pthread_mutex_lock(&pool->mu);
    job_unlist(pool, &j);
    pthread_mutex_unlock(&pool->mu);
    /* Workers still inside finish their last chunk soon: poll first. */
    for (int i = 0; i < KILN_POOL_SPIN && atomic_load(&j.holders) > 0; i++)
        POOL_PAUSE();
    pthread_mutex_lock(&pool->mu);
    while (atomic_load(&j.holders) > 0)
        pthread_cond_wait(&pool->idle, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

/* ---- the process-wide pool ------------------------------------------------------ */

/* Kept reachable from this static for the life of the process: destroying
 * it at exit could race with threads still running kernels. */
static kiln_threadpool *global_pool;
static pthread_once_t global_once = PTHREAD_ONCE_INIT;

static void global_create(void)
{
    if (kiln_threadpool_create(0, &global_pool) != KILN_OK)
        global_pool = NULL; /* kiln_threadpool_run(NULL) runs inline */
}

kiln_threadpool *kiln_threadpool_global(void)
{
    pthread_once(&global_once, global_create);
    return global_pool;
}
