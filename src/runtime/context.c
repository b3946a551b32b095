/* Execution contexts: shapes, bindings, memory from the engine's pool, and
 * running the layers on the CPU backend. */
#include "runtime_internal.h"

#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "../backend/cpu/cpu_backend.h"
#include "../core/error.h"


/* ---- the engine's pool ------------------------------------------------------------ */

/* Host blocks are anonymous mappings: page-aligned, and the part of a
 * max-profile arena that smaller shapes never touch costs no memory. */
static void *host_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void host_free(void *block, size_t bytes) { munmap(block, bytes ? bytes : 1); }

static void *block_alloc(const kiln_arena_pool *p)
{
#ifdef KILN_HAVE_CUDA
    if (p->device)
        return kiln_cuda_block_alloc(p->block_bytes);
#endif
    return host_alloc(p->block_bytes);
}

static void block_free(const kiln_arena_pool *p, void *block)
{
#ifdef KILN_HAVE_CUDA
    if (p->device) {
        kiln_cuda_block_free(block);
        return;
    }
#endif
    host_free(block, p->block_bytes);
}

void *kiln_arena_pool_take(kiln_arena_pool *p)
{
    void *block = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->n_free > 0) {
        block = p->free_list[--p->n_free];
    } else {
        block = block_alloc(p);
        if (block)
            p->n_allocated++;
    }
    pthread_mutex_unlock(&p->lock);
    return block;
}

void kiln_arena_pool_give(kiln_arena_pool *p, void *block)
{
    pthread_mutex_lock(&p->lock);
    if (p->n_free == p->cap_free) {
        int32_t cap = p->cap_free ? p->cap_free * 2 : 4;
        void **list = realloc(p->free_list, sizeof *list * (size_t)cap);
        if (!list) {
            /* Keeping the invariant matters more than keeping the block. */
            block_free(p, block);
            p->n_allocated--;
            pthread_mutex_unlock(&p->lock);
            return;
        }
        p->free_list = list;
        p->cap_free = cap;
    }
    p->free_list[p->n_free++] = block;
    pthread_mutex_unlock(&p->lock);
}

void kiln_arena_pool_release(kiln_arena_pool *p)
{
    for (int32_t i = 0; i < p->n_free; i++)
        block_free(p, p->free_list[i]);
    free(p->free_list);
    p->free_list = NULL;
    p->n_free = p->cap_free = 0;
}

/* ---- I/O buffers ----------------------------------------------------------------------- */

static void io_free(const kiln_context *ctx, void *p)
{
    if (!p)
        return;
#ifdef KILN_HAVE_CUDA
    if (ctx->engine->pool.device) {
        kiln_cuda_block_free(p);
        return;
    }
#endif
    (void)ctx;
    free(p);
}

static void *io_alloc(const kiln_context *ctx, size_t bytes)
{
#ifdef KILN_HAVE_CUDA
    if (ctx->engine->pool.device)
        return kiln_cuda_block_alloc(bytes);
#endif
    (void)ctx;
    void *p = NULL;
    return posix_memalign(&p, 256, bytes) == 0 ? p : NULL;
}

/* Gives every unbound I/O tensor a buffer of at least its current size.
 * Needs shapes_ready. Buffers only grow, so a step loop whose shapes
 * shrink and grow again allocates only until the largest shape was seen. */
static kiln_status ensure_io_buffers(kiln_context *ctx)
{
    const kiln_engine *e = ctx->engine;
    for (int32_t i = 0; i < e->n_io; i++) {
        int32_t t = e->io[i];
        const kiln_tensor_rec *r = &e->graph.tensors[t];
        if ((r->flags & KILN_TENSOR_CONSTANT) || ctx->bound[t])
            continue;
        size_t bytes;
        KILN_TRY(kiln_dims_bytes(&ctx->dims[t], r->dtype, &bytes));
        if (bytes == 0)
            bytes = 1;
        if (ctx->io_buf[t] && ctx->io_cap[t] >= bytes)
            continue;
        void *p = io_alloc(ctx, bytes);
        if (!p)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for %zu bytes of I/O tensor \"%s\"",
                             bytes, r->name);
        io_free(ctx, ctx->io_buf[t]);
        ctx->io_buf[t] = p;
        ctx->io_cap[t] = bytes;
    }
    return KILN_OK;
}

/* ---- create / destroy --------------------------------------------------------------- */

static int32_t input_index(const kiln_graph *g, int32_t tensor)
{
    for (int32_t i = 0; i < g->n_inputs; i++)
        if (g->inputs[i] == tensor)
            return i;
    return -1;
}

static int input_has_symbols(const kiln_graph *g, int32_t tensor)
{
    for (int32_t s = 0; s < g->n_symbols; s++)
        if (g->symbols[s].tensor == tensor)
            return 1;
    return 0;
}

/* Evaluates every tensor's dims for the current symbols and checks what the
 * runtime relies on: constraints, and that no tensor outgrows the memory
 * the builder planned for it. */
static kiln_status eval_shapes(kiln_context *ctx)
{
    const kiln_graph *g = &ctx->engine->graph;
    KILN_TRY(kiln_graph_eval_shapes(g, ctx->symbols, ctx->values, ctx->dims));
    KILN_TRY(kiln_graph_check_constraints(g, ctx->values));
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        size_t bytes;
        KILN_TRY(kiln_dims_bytes(&ctx->dims[t], r->dtype, &bytes));
        size_t cap = (r->flags & KILN_TENSOR_CONSTANT) ? r->data_size : r->max_bytes;
        if (bytes > cap)
            return kiln_fail(KILN_ERROR_SHAPE,
                             "tensor \"%s\" needs %zu bytes at these shapes but the engine planned %zu",
                             r->name, bytes, cap);
    }
    return KILN_OK;
}

void kiln_context_destroy(kiln_context *ctx)
{
    if (!ctx)
        return;
    const kiln_graph *g = &ctx->engine->graph;
#ifdef KILN_HAVE_CUDA
    /* The stream must be idle before the plugins it runs are destroyed and
     * its block serves another context. */
    kiln_cuda_context_destroy(ctx);
#endif
    if (ctx->plugins)
        for (int32_t i = 0; i < g->n_plugins; i++)
            if (ctx->plugins[i])
                ctx->plugins[i]->ops->destroy(ctx->plugins[i]);
    if (ctx->block)
        kiln_arena_pool_give(&ctx->engine->pool, ctx->block);
    if (ctx->io_buf)
        for (int32_t t = 0; t < g->n_tensors; t++)
            io_free(ctx, ctx->io_buf[t]);
    free(ctx->io_buf);
    free(ctx->io_cap);
    free(ctx->layer_ms);
    free(ctx->plugins);
    free(ctx->symbols);
    free(ctx->values);
    free(ctx->dims);
    free(ctx->input_set);
    free(ctx->bound);
    free(ctx->in_args);
    free(ctx->out_args);
    free(ctx);
}

static size_t count_or_one(int32_t n) { return n > 0 ? (size_t)n : 1; }

kiln_status kiln_context_create(kiln_engine *engine, kiln_context **out)
{
    if (!engine || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_context_create: engine and out are required");
    const kiln_graph *g = &engine->graph;
    kiln_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory creating a context");
    ctx->engine = engine;
    ctx->plugins = calloc(count_or_one(g->n_plugins), sizeof *ctx->plugins);
    ctx->symbols = calloc(count_or_one(g->n_symbols), sizeof *ctx->symbols);
    ctx->values = calloc(count_or_one(g->exprs.n), sizeof *ctx->values);
    ctx->dims = calloc(count_or_one(g->n_tensors), sizeof *ctx->dims);
    ctx->input_set = calloc(count_or_one(g->n_inputs), sizeof *ctx->input_set);
    ctx->bound = calloc(count_or_one(g->n_tensors), sizeof *ctx->bound);
    ctx->in_args = calloc(count_or_one(engine->max_layer_inputs), sizeof *ctx->in_args);
    ctx->out_args = calloc(count_or_one(engine->max_layer_outputs), sizeof *ctx->out_args);
    ctx->io_buf = calloc(count_or_one(g->n_tensors), sizeof *ctx->io_buf);
    ctx->io_cap = calloc(count_or_one(g->n_tensors), sizeof *ctx->io_cap);
    if (!ctx->io_buf || !ctx->io_cap || !ctx->plugins || !ctx->symbols || !ctx->values || !ctx->dims ||
        !ctx->input_set || !ctx->bound || !ctx->in_args || !ctx->out_args) {
        kiln_context_destroy(ctx);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory creating a context");
    }
    ctx->block = kiln_arena_pool_take(&engine->pool);
    if (!ctx->block) {
        kiln_context_destroy(ctx);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a %zu-byte context arena",
                         engine->pool.block_bytes);
    }
    for (int32_t i = 0; i < g->n_plugins; i++) {
        const kiln_plugin *proto = g->plugins[i].instance;
        char before[256];
        snprintf(before, sizeof before, "%s", kiln_last_error());
        kiln_status s = proto->ops->clone(proto, &ctx->plugins[i]);
        if (s != KILN_OK || !ctx->plugins[i]) {
            ctx->plugins[i] = NULL;
            kiln_context_destroy(ctx);
            if (s == KILN_OK)
                s = kiln_fail(KILN_ERROR_PLUGIN, "clone returned no instance");
            else if (strncmp(before, kiln_last_error(), sizeof before - 1) == 0)
                kiln_fail(s, "clone failed with %s and gave no message", kiln_status_name(s));
            return kiln_fail_context(s, "plugin \"%s\": cloning for a context",
                                     g->plugins[i].name);
        }
    }
#ifdef KILN_HAVE_CUDA
    if (engine->cuda) {
        kiln_status s = kiln_cuda_context_create(ctx);
        if (s != KILN_OK) {
            kiln_context_destroy(ctx);
            return s;
        }
    }
#endif
    /* Inputs without dynamic dims have their shape already. */
    int32_t all_set = 1;
    for (int32_t i = 0; i < g->n_inputs; i++) {
        ctx->input_set[i] = !input_has_symbols(g, g->inputs[i]);
        all_set &= ctx->input_set[i];
    }
    if (all_set) {
        kiln_status s = eval_shapes(ctx);
        if (s == KILN_OK)
            s = ensure_io_buffers(ctx);
        if (s != KILN_OK) {
            kiln_context_destroy(ctx);
            return s;
        }
        ctx->shapes_ready = 1;
    }
    *out = ctx;
    return KILN_OK;
}

/* ---- shapes ---------------------------------------------------------------------- */

kiln_status kiln_context_set_profile(kiln_context *ctx, int32_t profile)
{
    const kiln_graph *g = &ctx->engine->graph;
    /* Profile 0 is every context's default, also for an engine of static
     * shapes that has no profiles. */
    if (profile == ctx->profile)
        return KILN_OK;
    if (profile < 0 || profile >= g->n_profiles)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "profile %d out of range (engine has %d)",
                         (int)profile, (int)g->n_profiles);
    /* Shapes set under the old profile may be outside the new one's
     * bounds: dynamic inputs must be set again. */
    ctx->profile = profile;
    for (int32_t i = 0; i < g->n_inputs; i++)
        if (input_has_symbols(g, g->inputs[i])) {
            ctx->input_set[i] = 0;
            ctx->shapes_ready = 0;
        }
    return KILN_OK;
}

static kiln_status check_input_dims(const kiln_context *ctx, int32_t in, const kiln_dims *dims)
{
    const kiln_graph *g = &ctx->engine->graph;
    const kiln_tensor_rec *r = &g->tensors[g->inputs[in]];
    if (dims->rank != r->rank)
        return kiln_fail(KILN_ERROR_SHAPE, "input \"%s\" has rank %d, got a shape of rank %d",
                         r->name, (int)r->rank, (int)dims->rank);
    const kiln_profile_dims *p = g->n_profiles
                                     ? &g->profiles[(size_t)ctx->profile * (size_t)g->n_inputs + (size_t)in]
                                     : NULL;
    for (int32_t k = 0; k < r->rank; k++) {
        int64_t fixed, v = dims->d[k];
        if (v < 0)
            return kiln_fail(KILN_ERROR_SHAPE, "input \"%s\" dim %d = %lld is negative", r->name,
                             (int)k, (long long)v);
        if (kiln_expr_is_const(&g->exprs, r->dims[k], &fixed) && v != fixed)
            return kiln_fail(KILN_ERROR_SHAPE, "input \"%s\" dim %d = %lld, but the engine fixes it at %lld",
                             r->name, (int)k, (long long)v, (long long)fixed);
        if (p && p->min.rank == r->rank && p->max.rank == r->rank &&
            (v < p->min.d[k] || v > p->max.d[k]))
            return kiln_fail(KILN_ERROR_SHAPE, "input \"%s\" dim %d = %lld is outside profile %d [%lld, %lld]",
                             r->name, (int)k, (long long)v, (int)ctx->profile,
                             (long long)p->min.d[k], (long long)p->max.d[k]);
    }
    return KILN_OK;
}

kiln_status kiln_context_set_input_shape(kiln_context *ctx, const char *name, const kiln_dims *dims)
{
    const kiln_graph *g = &ctx->engine->graph;
    int32_t t = name ? kiln_graph_find_tensor(g, name) : -1;
    int32_t in = t >= 0 ? input_index(g, t) : -1;
    if (in < 0)
        return kiln_fail(KILN_ERROR_NOT_FOUND, "engine has no input named \"%s\"",
                         name ? name : "(null)");
    if (!dims)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "input \"%s\": dims are required", name);
    KILN_TRY(check_input_dims(ctx, in, dims));

    /* Remember what to restore if the new shape breaks a constraint, so a
     * failed call leaves the context as it was. */
    int64_t old[KILN_MAX_RANK];
    for (int32_t s = 0; s < g->n_symbols; s++)
        if (g->symbols[s].tensor == t && g->symbols[s].axis >= 0 && g->symbols[s].axis < dims->rank) {
            old[g->symbols[s].axis] = ctx->symbols[s];
            ctx->symbols[s] = dims->d[g->symbols[s].axis];
        }
    int32_t was_set = ctx->input_set[in], was_ready = ctx->shapes_ready;
    ctx->input_set[in] = 1;
    int32_t all_set = 1;
    for (int32_t i = 0; i < g->n_inputs; i++)
        all_set &= ctx->input_set[i];
    if (all_set) {
        kiln_status s = eval_shapes(ctx);
        if (s != KILN_OK) {
            for (int32_t k = 0; k < g->n_symbols; k++)
                if (g->symbols[k].tensor == t && g->symbols[k].axis >= 0 &&
                    g->symbols[k].axis < dims->rank)
                    ctx->symbols[k] = old[g->symbols[k].axis];
            ctx->input_set[in] = was_set;
            /* The dims array was overwritten; re-evaluate the old shapes. */
            if (was_ready)
                ctx->shapes_ready = eval_shapes(ctx) == KILN_OK;
            return kiln_fail_context(s, "input \"%s\" = %s", name,
                                     kiln_dims_format(dims, (char[160]){0}, 160));
        }
    }
    if (all_set) {
        kiln_status s = ensure_io_buffers(ctx);
        if (s != KILN_OK) {
            ctx->shapes_ready = 0;
            return s;
        }
    }
    ctx->shapes_ready = all_set;
#ifdef KILN_HAVE_CUDA
    if (all_set && ctx->cuda)
        return kiln_cuda_context_shapes_changed(ctx);
#endif
    return KILN_OK;
}

kiln_status kiln_context_require_shapes(const kiln_context *ctx)
{
    if (ctx->shapes_ready)
        return KILN_OK;
    const kiln_graph *g = &ctx->engine->graph;
    for (int32_t i = 0; i < g->n_inputs; i++)
        if (!ctx->input_set[i])
            return kiln_fail(KILN_ERROR_SHAPE,
                             "input \"%s\" has dynamic dims and its shape is not set "
                             "(kiln_context_set_input_shape)",
                             g->tensors[g->inputs[i]].name);
    return kiln_fail(KILN_ERROR_SHAPE, "input shapes are not valid");
}

static int32_t find_io(const kiln_context *ctx, const char *name)
{
    const kiln_graph *g = &ctx->engine->graph;
    int32_t t = name ? kiln_graph_find_tensor(g, name) : -1;
    if (t < 0 || !(g->tensors[t].flags & (KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT))) {
        kiln_fail(KILN_ERROR_NOT_FOUND, "engine has no input or output named \"%s\"",
                  name ? name : "(null)");
        return -1;
    }
    return t;
}

kiln_status kiln_context_tensor_shape(kiln_context *ctx, const char *name, kiln_dims *out)
{
    int32_t t = find_io(ctx, name);
    if (t < 0)
        return KILN_ERROR_NOT_FOUND;
    KILN_TRY(kiln_context_require_shapes(ctx));
    *out = ctx->dims[t];
    return KILN_OK;
}

/* ---- memory ---------------------------------------------------------------------- */

/* A constant is always read from the engine (its device copy on CUDA),
 * even when it is also an output the caller bound memory to: that memory
 * only receives a copy after the run. */
void *kiln_context_tensor_data(const kiln_context *ctx, int32_t t)
{
    const kiln_engine *e = ctx->engine;
    if (e->graph.tensors[t].flags & KILN_TENSOR_CONSTANT) {
#ifdef KILN_HAVE_CUDA
        if (e->cuda)
            return kiln_cuda_engine_constant(e, t);
#endif
        return e->graph.tensors[t].data;
    }
    if (ctx->bound[t])
        return ctx->bound[t];
    if (e->offsets[t] < 0)
        return ctx->io_buf[t];
    return ctx->block + e->offsets[t];
}

kiln_status kiln_context_set_tensor_address(kiln_context *ctx, const char *name, void *ptr)
{
    int32_t t = find_io(ctx, name);
    if (t < 0)
        return KILN_ERROR_NOT_FOUND;
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda && ptr)
        KILN_TRY(kiln_cuda_check_binding(name, ptr));
#endif
    ctx->bound[t] = ptr;
    if (ptr) {
        /* A bound tensor needs no memory of its own. */
        io_free(ctx, ctx->io_buf[t]);
        ctx->io_buf[t] = NULL;
        ctx->io_cap[t] = 0;
    } else if (ctx->shapes_ready) {
        KILN_TRY(ensure_io_buffers(ctx));
    }
    return KILN_OK;
}

kiln_status kiln_context_tensor_address(kiln_context *ctx, const char *name, void **ptr)
{
    int32_t t = find_io(ctx, name);
    if (t < 0)
        return KILN_ERROR_NOT_FOUND;
    const kiln_engine *e = ctx->engine;
    if (!ctx->bound[t] && !(e->graph.tensors[t].flags & KILN_TENSOR_CONSTANT) && !ctx->io_buf[t])
        KILN_TRY(kiln_context_require_shapes(ctx));
    *ptr = ctx->bound[t] ? ctx->bound[t] : kiln_context_tensor_data(ctx, t);
    return KILN_OK;
}

/* ---- execution -------------------------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* With host_block, arena tensors live in that block at their engine
 * offsets, I/O tensors in host_io and constants are the engine's host
 * copies: how a CUDA context runs the CPU reference on host copies of its
 * device data. */
static void *host_data(const kiln_context *ctx, unsigned char *host_block, void **host_io, int32_t t)
{
    const kiln_engine *e = ctx->engine;
    if (!host_block)
        return kiln_context_tensor_data(ctx, t);
    if (e->graph.tensors[t].flags & KILN_TENSOR_CONSTANT)
        return e->graph.tensors[t].data;
    if (e->offsets[t] < 0)
        return host_io[t];
    return host_block + e->offsets[t];
}

kiln_status kiln_context_run_cpu(kiln_context *ctx, int reference, unsigned char *host_block,
                                 void **host_io)
{
    const kiln_engine *e = ctx->engine;
    const kiln_graph *g = &e->graph;
    KILN_TRY(kiln_context_require_shapes(ctx));
    kiln_threadpool *pool = reference ? NULL : kiln_threadpool_global();
    unsigned char *block = host_block ? host_block : ctx->block;
    for (int32_t l = 0; l < g->n_layers; l++) {
        const kiln_layer *L = &g->layers[l];
        if (L->op == KILN_OP_CONSTANT)
            continue;
        for (int32_t i = 0; i < L->n_inputs; i++) {
            int32_t t = L->inputs[i];
            ctx->in_args[i] = (kiln_exec_tensor){host_data(ctx, host_block, host_io, t), g->tensors[t].dtype, ctx->dims[t]};
        }
        for (int32_t i = 0; i < L->n_outputs; i++) {
            int32_t t = L->outputs[i];
            ctx->out_args[i] = (kiln_exec_tensor){host_data(ctx, host_block, host_io, t), g->tensors[t].dtype, ctx->dims[t]};
        }
        kiln_cpu_args args = {
            .graph = g,
            .layer = L,
            .inputs = ctx->in_args,
            .outputs = ctx->out_args,
            .plugin = L->op == KILN_OP_PLUGIN ? ctx->plugins[L->p.plugin.index] : NULL,
            .workspace = block + e->workspace_offset,
            .pool = pool,
            .reference = reference,
        };
        double t0 = ctx->layer_ms ? now_ms() : 0;
        KILN_TRY(kiln_cpu_run_layer(&args));
        if (ctx->layer_ms)
            ctx->layer_ms[l] = now_ms() - t0;
    }
    if (host_block)
        return KILN_OK;
    /* An output the builder folded to a constant has no producing layer;
     * a caller who bound memory for it still expects the values there. */
    for (int32_t i = 0; i < g->n_outputs; i++) {
        int32_t t = g->outputs[i];
        const kiln_tensor_rec *r = &g->tensors[t];
        size_t bytes;
        if ((r->flags & KILN_TENSOR_CONSTANT) && ctx->bound[t] && ctx->bound[t] != r->data &&
            kiln_dims_bytes(&ctx->dims[t], r->dtype, &bytes) == KILN_OK)
            memcpy(ctx->bound[t], r->data, bytes);
    }
    return KILN_OK;
}

kiln_status kiln_context_enqueue(kiln_context *ctx, void *stream)
{
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda)
        return kiln_cuda_context_enqueue(ctx, stream);
#endif
    (void)stream;
    return kiln_context_run_cpu(ctx, 0, NULL, NULL);
}

kiln_status kiln_context_synchronize(kiln_context *ctx)
{
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda)
        return kiln_cuda_context_synchronize(ctx);
#endif
    (void)ctx;
    return KILN_OK;
}

kiln_status kiln_context_run_reference(kiln_context *ctx)
{
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda)
        return kiln_cuda_context_run_reference(ctx);
#endif
    return kiln_context_run_cpu(ctx, 1, NULL, NULL);
}

/* ---- host copies, timing, CUDA graphs ------------------------------------------------ */

/* The I/O tensor `name` and its bytes at the current shapes, which must be
 * exactly `bytes`: a short copy would leave stale data in the tensor. */
static kiln_status io_bytes(kiln_context *ctx, const char *name, const void *host, size_t bytes,
                            int32_t *t, size_t *need)
{
    *t = find_io(ctx, name);
    if (*t < 0)
        return KILN_ERROR_NOT_FOUND;
    KILN_TRY(kiln_context_require_shapes(ctx));
    const kiln_tensor_rec *r = &ctx->engine->graph.tensors[*t];
    KILN_TRY(kiln_dims_bytes(&ctx->dims[*t], r->dtype, need));
    if (bytes != *need)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "tensor \"%s\" holds %zu bytes at these shapes, the copy has %zu", name,
                         *need, bytes);
    if (!host && bytes)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tensor \"%s\": host pointer is NULL", name);
    return KILN_OK;
}

kiln_status kiln_context_copy_input(kiln_context *ctx, const char *name, const void *host,
                                    size_t bytes)
{
    int32_t t;
    size_t need;
    KILN_TRY(io_bytes(ctx, name, host, bytes, &t, &need));
    if (ctx->engine->graph.tensors[t].flags & KILN_TENSOR_CONSTANT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tensor \"%s\" is a constant of the engine",
                         name);
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda)
        return kiln_cuda_context_copy(ctx, t, (void *)host, bytes, 1);
#endif
    if (bytes)
        memcpy(ctx->bound[t] ? ctx->bound[t] : kiln_context_tensor_data(ctx, t), host, bytes);
    return KILN_OK;
}

kiln_status kiln_context_copy_output(kiln_context *ctx, const char *name, void *host, size_t bytes)
{
    int32_t t;
    size_t need;
    KILN_TRY(io_bytes(ctx, name, host, bytes, &t, &need));
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda)
        return kiln_cuda_context_copy(ctx, t, host, bytes, 0);
#endif
    if (bytes)
        memcpy(host, ctx->bound[t] ? ctx->bound[t] : kiln_context_tensor_data(ctx, t), bytes);
    return KILN_OK;
}

kiln_status kiln_context_set_cuda_graph(kiln_context *ctx, int32_t mode)
{
    if (mode != KILN_CUDA_GRAPH_OFF && mode != KILN_CUDA_GRAPH_ON && mode != KILN_CUDA_GRAPH_PAUSED)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "CUDA graph mode %d is not OFF, ON or PAUSED", (int)mode);
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda)
        return kiln_cuda_context_set_graph(ctx, mode);
#endif
    return kiln_fail(KILN_ERROR_TARGET, "CUDA graphs need an engine built for cuda; this one is %s",
                     kiln_backend_name(ctx->engine->info.backend));
}

kiln_status kiln_context_graph_nodes(kiln_context *ctx, size_t *n_nodes)
{
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda)
        return kiln_cuda_context_graph_nodes(ctx, n_nodes);
#endif
    (void)n_nodes;
    return kiln_fail(KILN_ERROR_TARGET, "CUDA graphs need an engine built for cuda; this one is %s",
                     kiln_backend_name(ctx->engine->info.backend));
}

kiln_status kiln_context_gpu_time(kiln_context *ctx, float *ms)
{
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda)
        return kiln_cuda_context_gpu_time(ctx, ms);
#endif
    (void)ms;
    return kiln_fail(KILN_ERROR_TARGET, "GPU time needs an engine built for cuda; this one is %s",
                     kiln_backend_name(ctx->engine->info.backend));
}

kiln_status kiln_context_set_profiling(kiln_context *ctx, int32_t enable)
{
    const kiln_graph *g = &ctx->engine->graph;
    if (!enable) {
        free(ctx->layer_ms);
        ctx->layer_ms = NULL;
        return KILN_OK;
    }
    if (!ctx->layer_ms && !(ctx->layer_ms = calloc(count_or_one(g->n_layers), sizeof *ctx->layer_ms)))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for layer timings");
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda)
        return kiln_cuda_context_set_profiling(ctx);
#endif
    return KILN_OK;
}

int32_t kiln_context_num_layers(const kiln_context *ctx) { return ctx->engine->graph.n_layers; }

kiln_status kiln_context_layer_time(kiln_context *ctx, int32_t i, const char **name,
                                    const char **op, double *ms)
{
    const kiln_graph *g = &ctx->engine->graph;
    if (i < 0 || i >= g->n_layers)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer %d out of range (engine has %d)",
                         (int)i, (int)g->n_layers);
    if (!ctx->layer_ms)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "layer times need kiln_context_set_profiling before the run");
#ifdef KILN_HAVE_CUDA
    if (ctx->cuda)
        KILN_TRY(kiln_cuda_context_layer_times(ctx));
#endif
    if (name)
        *name = g->layers[i].name;
    if (op)
        *op = kiln_op_name(g->layers[i].op);
    if (ms)
        *ms = ctx->layer_ms[i];
    return KILN_OK;
}
