/* Execution contexts: shapes, bindings, memory from the engine's pool, and
 * everything else through the engine's backend table (src/backend/backend.h). */
#include "runtime/runtime_internal.h"

#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/threadpool.h"


/* ---- the engine's pool ------------------------------------------------------------ */

static void *block_alloc(const kiln_arena_pool *p) { return p->backend->mem_alloc(p->block_bytes, 1); }

static void block_free(const kiln_arena_pool *p, void *block) { p->backend->mem_free(block, p->block_bytes, 1); }

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

static void io_free(const kiln_context *ctx, int32_t t)
{
    if (ctx->plan.io_buf[t])
        ctx->engine->backend->mem_free(ctx->plan.io_buf[t], ctx->io_cap[t], 0);
    ctx->plan.io_buf[t] = NULL;
    ctx->io_cap[t] = 0;
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
        if ((r->flags & KILN_TENSOR_CONSTANT) || ctx->plan.bound[t])
            continue;
        size_t bytes;
        KILN_TRY(kiln_dims_bytes(&ctx->plan.dims[t], r->dtype, &bytes));
        if (bytes == 0)
            bytes = 1;
        if (ctx->plan.io_buf[t] && ctx->io_cap[t] >= bytes)
            continue;
        void *p = e->backend->mem_alloc(bytes, 0);
        if (!p)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for %zu bytes of I/O tensor \"%s\"", bytes,
                             r->name);
        io_free(ctx, t);
        ctx->plan.io_buf[t] = p;
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
    KILN_TRY(kiln_graph_eval_shapes(g, ctx->plan.symbols, ctx->values, ctx->plan.dims));
    KILN_TRY(kiln_graph_check_constraints(g, ctx->values));
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        size_t bytes;
        KILN_TRY(kiln_dims_bytes(&ctx->plan.dims[t], r->dtype, &bytes));
        size_t cap = (r->flags & KILN_TENSOR_CONSTANT) ? r->data_size : r->max_bytes;
        if (bytes > cap)
            return kiln_fail(KILN_ERROR_SHAPE,
                             "tensor \"%s\" needs %zu bytes at these shapes but the engine planned %zu", r->name, bytes,
                             cap);
    }
    return KILN_OK;
}

void kiln_context_destroy(kiln_context *ctx)
{
    if (!ctx)
        return;
    const kiln_graph *g = &ctx->engine->graph;
    /* The backend's work must be done before the plugins it runs are
     * destroyed and its block serves another context. */
    ctx->engine->backend->context_destroy(ctx->backend_context);
    if (ctx->plan.plugins)
        for (int32_t i = 0; i < g->n_plugins; i++)
            if (ctx->plan.plugins[i])
                ctx->plan.plugins[i]->ops->destroy(ctx->plan.plugins[i]);
    if (ctx->plan.block)
        kiln_arena_pool_give(&ctx->engine->pool, ctx->plan.block);
    if (ctx->plan.io_buf && ctx->io_cap)
        for (int32_t t = 0; t < g->n_tensors; t++)
            io_free(ctx, t);
    free(ctx->plan.io_buf);
    free(ctx->io_cap);
    if (ctx->span)
        ctx->engine->backend->mem_free(ctx->span, ctx->span_bytes, 0);
    free(ctx->plan.layer_ms);
    kiln_threadpool_destroy(ctx->plan.pool);
    free(ctx->plan.plugins);
    free(ctx->plan.symbols);
    free(ctx->values);
    free(ctx->plan.dims);
    free(ctx->input_set);
    free(ctx->plan.bound);
    free(ctx->plan.in_args);
    free(ctx->plan.out_args);
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
    ctx->plan.graph = g;
    ctx->plan.offsets = engine->offsets;
    ctx->plan.io = engine->io;
    ctx->plan.n_io = engine->n_io;
    ctx->plan.block_bytes = engine->pool.block_bytes;
    ctx->plan.workspace_offset = engine->workspace_offset;
    ctx->plan.constants = engine->constants;
    ctx->plan.plugins = calloc(count_or_one(g->n_plugins), sizeof *ctx->plan.plugins);
    ctx->plan.symbols = calloc(count_or_one(g->n_symbols), sizeof *ctx->plan.symbols);
    ctx->values = calloc(count_or_one(g->exprs.n), sizeof *ctx->values);
    ctx->plan.dims = calloc(count_or_one(g->n_tensors), sizeof *ctx->plan.dims);
    ctx->input_set = calloc(count_or_one(g->n_inputs), sizeof *ctx->input_set);
    ctx->plan.bound = calloc(count_or_one(g->n_tensors), sizeof *ctx->plan.bound);
    ctx->plan.in_args = calloc(count_or_one(engine->max_layer_inputs), sizeof *ctx->plan.in_args);
    ctx->plan.out_args = calloc(count_or_one(engine->max_layer_outputs), sizeof *ctx->plan.out_args);
    ctx->plan.io_buf = calloc(count_or_one(g->n_tensors), sizeof *ctx->plan.io_buf);
    ctx->io_cap = calloc(count_or_one(g->n_tensors), sizeof *ctx->io_cap);
    if (!ctx->plan.io_buf || !ctx->io_cap || !ctx->plan.plugins || !ctx->plan.symbols || !ctx->values ||
        !ctx->plan.dims || !ctx->input_set || !ctx->plan.bound || !ctx->plan.in_args || !ctx->plan.out_args) {
        kiln_context_destroy(ctx);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory creating a context");
    }
    ctx->plan.block = kiln_arena_pool_take(&engine->pool);
    if (!ctx->plan.block) {
        kiln_context_destroy(ctx);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a %zu-byte context arena",
                         engine->pool.block_bytes);
    }
    for (int32_t i = 0; i < g->n_plugins; i++) {
        const kiln_plugin *proto = g->plugins[i].instance;
        char before[256];
        snprintf(before, sizeof before, "%s", kiln_last_error());
        kiln_status s = proto->ops->clone(proto, &ctx->plan.plugins[i]);
        if (s != KILN_OK || !ctx->plan.plugins[i]) {
            ctx->plan.plugins[i] = NULL;
            kiln_context_destroy(ctx);
            if (s == KILN_OK)
                s = kiln_fail(KILN_ERROR_PLUGIN, "clone returned no instance");
            else if (strncmp(before, kiln_last_error(), sizeof before - 1) == 0)
                kiln_fail(s, "clone failed with %s and gave no message", kiln_status_name(s));
            return kiln_fail_context(s, "plugin \"%s\": cloning for a context", g->plugins[i].name);
        }
    }
    kiln_status bs = engine->backend->context_create(engine->backend_engine, &ctx->plan, &ctx->backend_context);
    if (bs != KILN_OK) {
        kiln_context_destroy(ctx);
        return bs;
    }
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
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "profile %d out of range (engine has %d)", (int)profile,
                         (int)g->n_profiles);
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
        return kiln_fail(KILN_ERROR_SHAPE, "input \"%s\" has rank %d, got a shape of rank %d", r->name, (int)r->rank,
                         (int)dims->rank);
    const kiln_profile_dims *p =
        g->n_profiles ? &g->profiles[(size_t)ctx->profile * (size_t)g->n_inputs + (size_t)in] : NULL;
    for (int32_t k = 0; k < r->rank; k++) {
        int64_t fixed, v = dims->d[k];
        if (v < 0)
            return kiln_fail(KILN_ERROR_SHAPE, "input \"%s\" dim %d = %lld is negative", r->name, (int)k, (long long)v);
        if (kiln_expr_is_const(&g->exprs, r->dims[k], &fixed) && v != fixed)
            return kiln_fail(KILN_ERROR_SHAPE, "input \"%s\" dim %d = %lld, but the engine fixes it at %lld", r->name,
                             (int)k, (long long)v, (long long)fixed);
        if (p && p->min.rank == r->rank && p->max.rank == r->rank && (v < p->min.d[k] || v > p->max.d[k]))
            return kiln_fail(KILN_ERROR_SHAPE, "input \"%s\" dim %d = %lld is outside profile %d [%lld, %lld]", r->name,
                             (int)k, (long long)v, (int)ctx->profile, (long long)p->min.d[k], (long long)p->max.d[k]);
    }
    return KILN_OK;
}

kiln_status kiln_context_set_input_shape(kiln_context *ctx, const char *name, const kiln_dims *dims)
{
    const kiln_graph *g = &ctx->engine->graph;
    int32_t t = name ? kiln_graph_find_tensor(g, name) : -1;
    int32_t in = t >= 0 ? input_index(g, t) : -1;
    if (in < 0)
        return kiln_fail(KILN_ERROR_NOT_FOUND, "engine has no input named \"%s\"", name ? name : "(null)");
    if (!dims)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "input \"%s\": dims are required", name);
    KILN_TRY(check_input_dims(ctx, in, dims));

    /* Remember what to restore if the new shape breaks a constraint, so a
     * failed call leaves the context as it was. */
    int64_t old[KILN_MAX_RANK];
    for (int32_t s = 0; s < g->n_symbols; s++)
        if (g->symbols[s].tensor == t && g->symbols[s].axis >= 0 && g->symbols[s].axis < dims->rank) {
            old[g->symbols[s].axis] = ctx->plan.symbols[s];
            ctx->plan.symbols[s] = dims->d[g->symbols[s].axis];
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
                if (g->symbols[k].tensor == t && g->symbols[k].axis >= 0 && g->symbols[k].axis < dims->rank)
                    ctx->plan.symbols[k] = old[g->symbols[k].axis];
            ctx->input_set[in] = was_set;
            /* The dims array was overwritten; re-evaluate the old shapes. */
            if (was_ready)
                ctx->shapes_ready = eval_shapes(ctx) == KILN_OK;
            return kiln_fail_context(s, "input \"%s\" = %s", name, kiln_dims_format(dims, (char[160]){0}, 160));
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
    if (all_set && ctx->engine->backend->shapes_changed)
        return ctx->engine->backend->shapes_changed(ctx->backend_context);
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
        kiln_fail(KILN_ERROR_NOT_FOUND, "engine has no input or output named \"%s\"", name ? name : "(null)");
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
    *out = ctx->plan.dims[t];
    return KILN_OK;
}

/* ---- memory ---------------------------------------------------------------------- */

kiln_status kiln_context_set_tensor_address(kiln_context *ctx, const char *name, void *ptr)
{
    int32_t t = find_io(ctx, name);
    if (t < 0)
        return KILN_ERROR_NOT_FOUND;
    if (ptr && ctx->engine->backend->check_binding)
        KILN_TRY(ctx->engine->backend->check_binding(name, ptr));
    ctx->plan.bound[t] = ptr;
    if (ptr) {
        /* A bound tensor needs no memory of its own. */
        io_free(ctx, t);
    } else if (ctx->shapes_ready) {
        KILN_TRY(ensure_io_buffers(ctx));
    }
    return KILN_OK;
}

kiln_status kiln_context_io_span(kiln_context *ctx, size_t bytes, void **ptr)
{
    if (ctx->span) {
        /* Work in flight may still read it. */
        KILN_TRY(kiln_context_synchronize(ctx));
        ctx->engine->backend->mem_free(ctx->span, ctx->span_bytes, 0);
        ctx->span = NULL;
        ctx->span_bytes = 0;
    }
    void *p = ctx->engine->backend->mem_alloc(bytes ? bytes : 1, 0);
    if (!p)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of %s memory for %zu bytes of step inputs",
                         kiln_backend_name(ctx->engine->info.backend), bytes);
    ctx->span = p;
    ctx->span_bytes = bytes;
    *ptr = p;
    return KILN_OK;
}

kiln_status kiln_context_copy_span(kiln_context *ctx, const char *first, const void *host, size_t bytes)
{
    int32_t t = find_io(ctx, first);
    if (t < 0)
        return kiln_fail(KILN_ERROR_NOT_FOUND, "the engine has no I/O tensor \"%s\"", first);
    if (!ctx->span || ctx->plan.bound[t] != ctx->span || bytes > ctx->span_bytes || !host)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "a span copy of %zu bytes: \"%s\" must be bound at the start of a span of %zu bytes", bytes,
                         first, ctx->span_bytes);
    if (!bytes)
        return KILN_OK;
    return ctx->engine->backend->copy(ctx->backend_context, t, (void *)host, bytes, 1);
}

kiln_status kiln_context_tensor_address(kiln_context *ctx, const char *name, void **ptr)
{
    int32_t t = find_io(ctx, name);
    if (t < 0)
        return KILN_ERROR_NOT_FOUND;
    const kiln_engine *e = ctx->engine;
    if (!ctx->plan.bound[t] && !(e->graph.tensors[t].flags & KILN_TENSOR_CONSTANT) && !ctx->plan.io_buf[t])
        KILN_TRY(kiln_context_require_shapes(ctx));
    *ptr = kiln_exec_io_address(&ctx->plan, t);
    return KILN_OK;
}

/* ---- execution -------------------------------------------------------------------- */

kiln_status kiln_context_enqueue(kiln_context *ctx, void *stream)
{
    KILN_TRY(kiln_context_require_shapes(ctx));
    return ctx->engine->backend->enqueue(ctx->backend_context, stream);
}

kiln_status kiln_context_synchronize(kiln_context *ctx)
{
    return ctx->engine->backend->synchronize(ctx->backend_context);
}

kiln_status kiln_context_run_reference(kiln_context *ctx)
{
    KILN_TRY(kiln_context_require_shapes(ctx));
    return ctx->engine->backend->run_reference(ctx->backend_context);
}

/* ---- host copies, timing, graph mode ------------------------------------------------ */

/* The I/O tensor `name` and its bytes at the current shapes, which must be
 * exactly `bytes`: a short copy would leave stale data in the tensor. */
static kiln_status io_bytes(kiln_context *ctx, const char *name, const void *host, size_t bytes, int32_t *t,
                            size_t *need)
{
    *t = find_io(ctx, name);
    if (*t < 0)
        return KILN_ERROR_NOT_FOUND;
    KILN_TRY(kiln_context_require_shapes(ctx));
    const kiln_tensor_rec *r = &ctx->engine->graph.tensors[*t];
    KILN_TRY(kiln_dims_bytes(&ctx->plan.dims[*t], r->dtype, need));
    if (bytes != *need)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tensor \"%s\" holds %zu bytes at these shapes, the copy has %zu",
                         name, *need, bytes);
    if (!host && bytes)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tensor \"%s\": host pointer is NULL", name);
    return KILN_OK;
}

kiln_status kiln_context_copy_input(kiln_context *ctx, const char *name, const void *host, size_t bytes)
{
    int32_t t;
    size_t need;
    KILN_TRY(io_bytes(ctx, name, host, bytes, &t, &need));
    if (ctx->engine->graph.tensors[t].flags & KILN_TENSOR_CONSTANT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tensor \"%s\" is a constant of the engine", name);
    if (!bytes)
        return KILN_OK;
    return ctx->engine->backend->copy(ctx->backend_context, t, (void *)host, bytes, 1);
}

kiln_status kiln_context_copy_output(kiln_context *ctx, const char *name, void *host, size_t bytes)
{
    int32_t t;
    size_t need;
    KILN_TRY(io_bytes(ctx, name, host, bytes, &t, &need));
    if (!bytes)
        return KILN_OK;
    return ctx->engine->backend->copy(ctx->backend_context, t, host, bytes, 0);
}

kiln_status kiln_context_copy_between(kiln_context *ctx, const char *dst, const char *src, size_t bytes)
{
    const int32_t t[2] = {find_io(ctx, dst), find_io(ctx, src)};
    if (t[0] < 0 || t[1] < 0)
        return KILN_ERROR_NOT_FOUND;
    KILN_TRY(kiln_context_require_shapes(ctx));
    size_t have[2];
    for (int i = 0; i < 2; i++)
        KILN_TRY(kiln_dims_bytes(&ctx->plan.dims[t[i]], ctx->engine->graph.tensors[t[i]].dtype, &have[i]));
    if (!(ctx->engine->graph.tensors[t[0]].flags & KILN_TENSOR_INPUT) ||
        (ctx->engine->graph.tensors[t[0]].flags & KILN_TENSOR_CONSTANT))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tensor \"%s\" is not an input the caller fills", dst);
    if (bytes > have[0] || bytes > have[1])
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "a copy of %zu bytes from \"%s\" (%zu bytes) to \"%s\" (%zu bytes) is past a tensor's end",
                         bytes, src, have[1], dst, have[0]);
    if (!bytes)
        return KILN_OK;
    const kiln_backend_i *b = ctx->engine->backend;
    if (!b->copy_between)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "the %s backend copies no tensor into another",
                         kiln_backend_name(ctx->engine->info.backend));
    return b->copy_between(ctx->backend_context, t[0], t[1], bytes);
}

/* What a backend without graph mode or device timing answers: `what`
 * ("CUDA graphs need", "GPU time needs") an engine of the GPU backend. */
static kiln_status lacks(const kiln_context *ctx, const char *what)
{
    return kiln_fail(KILN_ERROR_TARGET, "%s an engine built for %s; this one is %s", what,
                     kiln_backend_name(KILN_BACKEND_CUDA), kiln_backend_name(ctx->engine->info.backend));
}

kiln_status kiln_context_set_cuda_graph(kiln_context *ctx, int32_t mode)
{
    const kiln_backend_i *b = ctx->engine->backend;
    if (mode != KILN_CUDA_GRAPH_OFF && mode != KILN_CUDA_GRAPH_ON && mode != KILN_CUDA_GRAPH_PAUSED)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "CUDA graph mode %d is not OFF, ON or PAUSED", (int)mode);
    return b->set_graph_mode ? b->set_graph_mode(ctx->backend_context, mode) : lacks(ctx, "CUDA graphs need");
}

kiln_status kiln_context_graph_nodes(kiln_context *ctx, size_t *n_nodes)
{
    const kiln_backend_i *b = ctx->engine->backend;
    return b->graph_nodes ? b->graph_nodes(ctx->backend_context, n_nodes) : lacks(ctx, "CUDA graphs need");
}

kiln_status kiln_context_gpu_time(kiln_context *ctx, float *ms)
{
    const kiln_backend_i *b = ctx->engine->backend;
    return b->gpu_time ? b->gpu_time(ctx->backend_context, ms) : lacks(ctx, "GPU time needs");
}

kiln_status kiln_context_set_threads(kiln_context *ctx, int32_t n_threads)
{
    if (ctx->engine->backend->kind != KILN_BACKEND_CPU)
        return kiln_fail(KILN_ERROR_TARGET, "thread counts are for CPU engines; this one runs on %s",
                         kiln_backend_name(ctx->engine->backend->kind));
    if (n_threads < 0 || n_threads > 1024)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "thread count %d is outside 0..1024", (int)n_threads);
    kiln_threadpool *pool = NULL;
    if (n_threads > 0)
        KILN_TRY(kiln_threadpool_create(n_threads, &pool));
    kiln_threadpool_destroy(ctx->plan.pool);
    ctx->plan.pool = pool;
    return KILN_OK;
}

kiln_status kiln_context_set_profiling(kiln_context *ctx, int32_t enable)
{
    const kiln_graph *g = &ctx->engine->graph;
    if (!enable) {
        free(ctx->plan.layer_ms);
        ctx->plan.layer_ms = NULL;
        return KILN_OK;
    }
    if (!ctx->plan.layer_ms && !(ctx->plan.layer_ms = calloc(count_or_one(g->n_layers), sizeof *ctx->plan.layer_ms)))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for layer timings");
    if (ctx->engine->backend->set_profiling)
        return ctx->engine->backend->set_profiling(ctx->backend_context);
    return KILN_OK;
}

int32_t kiln_context_num_layers(const kiln_context *ctx) { return ctx->engine->graph.n_layers; }

kiln_status kiln_context_layer_time(kiln_context *ctx, int32_t i, const char **name, const char **op, double *ms)
{
    const kiln_graph *g = &ctx->engine->graph;
    if (i < 0 || i >= g->n_layers)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer %d out of range (engine has %d)", (int)i,
                         (int)g->n_layers);
    if (!ctx->plan.layer_ms)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer times need kiln_context_set_profiling before the run");
    if (ctx->engine->backend->layer_times)
        KILN_TRY(ctx->engine->backend->layer_times(ctx->backend_context));
    if (name)
        *name = g->layers[i].name;
    if (op)
        *op = kiln_op_name(g->layers[i].op);
    if (ms)
        *ms = ctx->plan.layer_ms[i];
    return KILN_OK;
}
