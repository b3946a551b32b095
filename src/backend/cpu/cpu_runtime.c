/* The CPU backend's table: host memory, and enqueue as a plain run of the
 * layer loop on the calling thread and the engine's thread pool. */
#include "backend/cpu/cpu_backend.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "core/error.h"

/* ---- memory ------------------------------------------------------------------------------- */

/* Blocks are anonymous mappings: page-aligned, and the part of a
 * max-profile arena that smaller shapes never touch costs no memory. */
static void *cpu_mem_alloc(size_t bytes, int block)
{
    if (block) {
        void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = NULL;
    return posix_memalign(&p, 256, bytes ? bytes : 1) == 0 ? p : NULL;
}

static void cpu_mem_free(void *p, size_t bytes, int block)
{
    if (block)
        munmap(p, bytes ? bytes : 1);
    else
        free(p);
}

/* ---- running the layers --------------------------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

typedef struct cpu_run {
    kiln_exec_plan *plan;
    kiln_threadpool *pool;
    int32_t reference;
} cpu_run;

static kiln_status run_layer(void *user, const kiln_exec_call *call)
{
    const cpu_run *r = user;
    kiln_cpu_args args = {
        .graph = call->graph,
        .layer = call->layer,
        .inputs = call->inputs,
        .outputs = call->outputs,
        .plugin = call->plugin,
        .workspace = call->workspace,
        .pool = r->pool,
        .reference = r->reference,
    };
    double *ms = r->plan->layer_ms;
    double t0 = ms ? now_ms() : 0;
    KILN_TRY(kiln_cpu_run_layer(&args));
    if (ms)
        ms[call->index] = now_ms() - t0;
    return KILN_OK;
}

static kiln_status copy_bytes(void *user, void *dst, const void *src, size_t bytes)
{
    (void)user;
    memcpy(dst, src, bytes);
    return KILN_OK;
}

kiln_status kiln_cpu_exec(kiln_exec_plan *plan, const kiln_exec_host *host, int reference)
{
    kiln_threadpool *pool = reference ? NULL : plan->pool ? plan->pool : kiln_threadpool_global();
    cpu_run r = {plan, pool, reference};
    kiln_exec_hooks hooks = {.run = run_layer, .copy = copy_bytes, .user = &r};
    return kiln_exec_run(plan, host, &hooks);
}

/* ---- the table ------------------------------------------------------------------------------------ */

/* A CPU context is its plan. */
struct kiln_backend_context {
    kiln_exec_plan *plan;
};

static kiln_status cpu_engine_create(const kiln_graph *g, kiln_backend_engine **out, void *const **constants)
{
    (void)g;
    *out = NULL;
    *constants = NULL;
    return KILN_OK;
}

static void cpu_engine_destroy(kiln_backend_engine *e) { (void)e; }

static kiln_status cpu_context_create(kiln_backend_engine *e, kiln_exec_plan *plan, kiln_backend_context **out)
{
    (void)e;
    kiln_backend_context *c = malloc(sizeof *c);
    if (!c)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory creating a context");
    c->plan = plan;
    *out = c;
    return KILN_OK;
}

static void cpu_context_destroy(kiln_backend_context *c) { free(c); }

static kiln_status cpu_enqueue(kiln_backend_context *c, void *stream)
{
    (void)stream;
    return kiln_cpu_exec(c->plan, NULL, 0);
}

static kiln_status cpu_synchronize(kiln_backend_context *c)
{
    (void)c;
    return KILN_OK;
}

static kiln_status cpu_run_reference(kiln_backend_context *c) { return kiln_cpu_exec(c->plan, NULL, 1); }

static kiln_status cpu_copy(kiln_backend_context *c, int32_t t, void *host, size_t bytes, int to_device)
{
    void *mem = kiln_exec_io_address(c->plan, t);
    if (to_device)
        memcpy(mem, host, bytes);
    else
        memcpy(host, mem, bytes);
    return KILN_OK;
}

static kiln_status cpu_copy_between(kiln_backend_context *c, int32_t dst, int32_t src, size_t bytes)
{
    memmove(kiln_exec_io_address(c->plan, dst), kiln_exec_io_address(c->plan, src), bytes);
    return KILN_OK;
}

const kiln_backend_i kiln_backend_cpu = {
    .kind = KILN_BACKEND_CPU,
    .engine_create = cpu_engine_create,
    .engine_destroy = cpu_engine_destroy,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .context_create = cpu_context_create,
    .context_destroy = cpu_context_destroy,
    .enqueue = cpu_enqueue,
    .synchronize = cpu_synchronize,
    .run_reference = cpu_run_reference,
    .copy = cpu_copy,
    .copy_between = cpu_copy_between,
    .copy_bandwidth = kiln_cpu_copy_bandwidth,
    .device_name = kiln_cpu_device_name,
};
