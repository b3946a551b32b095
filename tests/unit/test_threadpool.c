/* The thread pool: every index covered exactly once, concurrent callers,
 * nested calls, the inline (NULL) pool and the global pool; the physical
 * core count against /proc/cpuinfo. */
#include "test.h"

#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct cover {
    atomic_int *hits;
    atomic_llong sum;
    atomic_int calls;
} cover;

static void cover_fn(void *p, int64_t begin, int64_t end)
{
    cover *c = p;
    atomic_fetch_add(&c->calls, 1);
    for (int64_t i = begin; i < end; i++) {
        atomic_fetch_add(&c->hits[i], 1);
        atomic_fetch_add(&c->sum, i);
    }
}

static int covered_once(kiln_threadpool *pool, int64_t n)
{
    cover c = {.hits = calloc((size_t)n + 1, sizeof(atomic_int))};
    atomic_init(&c.sum, 0);
    atomic_init(&c.calls, 0);
    kiln_threadpool_run(pool, n, cover_fn, &c);
    int ok = atomic_load(&c.sum) == n * (n - 1) / 2;
    for (int64_t i = 0; i < n; i++)
        ok &= atomic_load(&c.hits[i]) == 1;
    free(c.hits);
    return ok;
}

static void test_sizes_and_cover(void)
{
    for (int32_t t = 1; t <= 4; t++) {
        kiln_threadpool *pool = NULL;
        CHECK_OK(kiln_threadpool_create(t, &pool));
        CHECK(kiln_threadpool_size(pool) == t);
        CHECK(covered_once(pool, 1));
        CHECK(covered_once(pool, 7));
        CHECK(covered_once(pool, 1000));
        CHECK(covered_once(pool, 100003));
        kiln_threadpool_destroy(pool);
    }
    kiln_threadpool_destroy(NULL);
}

static void test_null_pool_inline(void)
{
    CHECK(kiln_threadpool_size(NULL) == 1);
    cover c = {.hits = calloc(10, sizeof(atomic_int))};
    atomic_init(&c.sum, 0);
    atomic_init(&c.calls, 0);
    kiln_threadpool_run(NULL, 10, cover_fn, &c);
    CHECK(atomic_load(&c.calls) == 1); /* one call over the whole range */
    CHECK(atomic_load(&c.sum) == 45);
    kiln_threadpool_run(NULL, 0, cover_fn, &c);
    CHECK(atomic_load(&c.calls) == 1); /* n = 0 runs nothing */
    free(c.hits);
}

static void test_work_is_split(void)
{
    kiln_threadpool *pool = NULL;
    CHECK_OK(kiln_threadpool_create(4, &pool));
    cover c = {.hits = calloc(1000, sizeof(atomic_int))};
    atomic_init(&c.sum, 0);
    atomic_init(&c.calls, 0);
    kiln_threadpool_run(pool, 1000, cover_fn, &c);
    CHECK(atomic_load(&c.calls) > 1);
    free(c.hits);
    kiln_threadpool_destroy(pool);
}

/* ---- concurrent callers -------------------------------------------------------- */

typedef struct range_sum {
    int64_t *vals;
    atomic_llong total;
} range_sum;

static void range_sum_fn(void *p, int64_t begin, int64_t end)
{
    range_sum *r = p;
    int64_t s = 0;
    for (int64_t i = begin; i < end; i++)
        s += r->vals[i];
    atomic_fetch_add(&r->total, s);
}

typedef struct caller {
    kiln_threadpool *pool;
    int32_t id;
    int32_t bad;
} caller;

static void *caller_main(void *p)
{
    caller *c = p;
    int64_t n = 5000 + c->id * 1237;
    int64_t *vals = malloc((size_t)n * sizeof *vals);
    for (int64_t i = 0; i < n; i++)
        vals[i] = (i * 7 + c->id) % 101;
    int64_t expect = 0;
    for (int64_t i = 0; i < n; i++)
        expect += vals[i];
    for (int rep = 0; rep < 300; rep++) {
        range_sum r = {.vals = vals};
        atomic_init(&r.total, 0);
        kiln_threadpool_run(c->pool, n, range_sum_fn, &r);
        if (atomic_load(&r.total) != expect)
            c->bad++;
    }
    free(vals);
    return NULL;
}

static void test_concurrent_callers(void)
{
    kiln_threadpool *pool = NULL;
    CHECK_OK(kiln_threadpool_create(4, &pool));
    pthread_t th[4];
    caller cs[4];
    for (int i = 0; i < 4; i++) {
        cs[i] = (caller){.pool = pool, .id = i};
        CHECK(pthread_create(&th[i], NULL, caller_main, &cs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(cs[i].bad == 0);
    }
    kiln_threadpool_destroy(pool);
}

/* A job that runs another job on the same pool from inside its chunks: the
 * callers work on their own jobs, so this finishes even with every worker
 * busy. */
typedef struct nested {
    kiln_threadpool *pool;
    atomic_llong total;
} nested;

static void nested_inner(void *p, int64_t begin, int64_t end)
{
    nested *n = p;
    atomic_fetch_add(&n->total, end - begin);
}

static void nested_outer(void *p, int64_t begin, int64_t end)
{
    nested *n = p;
    for (int64_t i = begin; i < end; i++)
        kiln_threadpool_run(n->pool, 100, nested_inner, n);
}

static void test_nested(void)
{
    kiln_threadpool *pool = NULL;
    CHECK_OK(kiln_threadpool_create(3, &pool));
    nested n = {.pool = pool};
    atomic_init(&n.total, 0);
    kiln_threadpool_run(pool, 50, nested_outer, &n);
    CHECK(atomic_load(&n.total) == 50 * 100);
    kiln_threadpool_destroy(pool);
}

static void test_global(void)
{
    kiln_threadpool *g = kiln_threadpool_global();
    CHECK(g != NULL);
    CHECK(g == kiln_threadpool_global());
    CHECK(kiln_threadpool_size(g) == kiln_cpu_physical_cores());
    CHECK(covered_once(g, 12345));
}

/* The kernel's own account of the cores: distinct (physical id, core id)
 * pairs in /proc/cpuinfo. Comparable when this process may run on every
 * online CPU (no affinity mask narrower than the machine); -1 otherwise
 * or when the file lacks the fields (some VMs and architectures). */
static int cpuinfo_cores(void)
{
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 ||
        CPU_COUNT(&allowed) != (int)sysconf(_SC_NPROCESSORS_ONLN))
        return -1;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return -1;
    char line[512];
    long pkg = -1, pairs[1024][2];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        long v;
        if (sscanf(line, "physical id : %ld", &v) == 1) {
            pkg = v;
        } else if (sscanf(line, "core id : %ld", &v) == 1 && pkg >= 0) {
            int seen = 0;
            for (int i = 0; i < n; i++)
                seen |= pairs[i][0] == pkg && pairs[i][1] == v;
            if (!seen && n < 1024) {
                pairs[n][0] = pkg;
                pairs[n][1] = v;
                n++;
            }
            pkg = -1;
        }
    }
    fclose(f);
    return n > 0 ? n : -1;
}

static void test_physical_cores(void)
{
    int32_t cores = kiln_cpu_physical_cores();
    CHECK(cores >= 1 && cores <= (int32_t)sysconf(_SC_NPROCESSORS_ONLN));
    int ref = cpuinfo_cores();
    if (ref > 0)
        CHECK(cores == ref);
    else
        printf("  (no /proc/cpuinfo core ids or a narrowed affinity mask: only the bounds checked)\n");
}

static const test_case_ tests[] = {
    TEST(test_sizes_and_cover), TEST(test_null_pool_inline), TEST(test_work_is_split),  TEST(test_concurrent_callers),
    TEST(test_nested),          TEST(test_global),           TEST(test_physical_cores),
};
TEST_MAIN(tests)
