/* Passes 6-7: plugin workspace and the activation memory plan. */
#include "builder/builder_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"

/* ---- pass 6: workspace ---------------------------------------------------------------------- */

static void fill_desc(kiln_tensor_desc *d, kiln_dtype dtype, const kiln_dims *dims)
{
    memset(d, 0, sizeof *d);
    d->struct_size = (uint32_t)sizeof *d;
    d->abi_version = KILN_PLUGIN_ABI_VERSION;
    d->dtype = dtype;
    d->format = KILN_FORMAT_LINEAR;
    d->dims = *dims;
}

static kiln_status layer_workspace(const kiln_graph *g, const kiln_layer *l, const kiln_bound_shapes *b, size_t *out)
{
    const kiln_plugin_rec *rec = &g->plugins[l->p.plugin.index];
    const kiln_plugin_ops *ops = rec->instance->ops;
    *out = 0;
    if (!KILN_OPS_HAS(ops, workspace_size))
        return KILN_OK;
    int32_t n = l->n_inputs + l->n_outputs;
    kiln_tensor_desc *descs = calloc(n > 0 ? (size_t)n : 1, sizeof *descs);
    if (!descs)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\": workspace query", l->name);
    for (int32_t k = 0; k < b->n_bounds; k++) {
        if (b->which[k] != 2)
            continue;
        const kiln_dims *dims = b->dims + (size_t)k * (size_t)b->n_tensors;
        for (int32_t j = 0; j < n; j++) {
            int32_t t = j < l->n_inputs ? l->inputs[j] : l->outputs[j - l->n_inputs];
            fill_desc(&descs[j], g->tensors[t].dtype, &dims[t]);
        }
        size_t w = ops->workspace_size(rec->instance, descs, l->n_inputs, descs + l->n_inputs, l->n_outputs);
        if (w > *out)
            *out = w;
    }
    free(descs);
    return KILN_OK;
}

kiln_status kiln_builder_size_workspace(kiln_graph *g)
{
    kiln_bound_shapes b;
    KILN_TRY(kiln_builder_eval_bounds(g, &b));
    size_t largest = 0;
    const char *largest_layer = NULL;
    int32_t n_plugin_layers = 0;
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < g->n_layers && s == KILN_OK; i++) {
        kiln_layer *l = &g->layers[i];
        l->workspace = 0;
        if (l->op != KILN_OP_PLUGIN)
            continue;
        n_plugin_layers++;
        s = layer_workspace(g, l, &b, &l->workspace);
        if (s == KILN_OK && l->workspace > 0)
            kiln_log(KILN_LOG_INFO, "workspace: layer \"%s\" (plugin %s) needs %zu bytes", l->name,
                     g->plugins[l->p.plugin.index].name, l->workspace);
        if (l->workspace > largest) {
            largest = l->workspace;
            largest_layer = l->name;
        }
    }
    kiln_bound_shapes_free(&b);
    if (s != KILN_OK)
        return s;
    /* Layers run one after another, so one workspace serves them all. */
    if (kiln_builder_align(largest, &g->workspace_size))
        return kiln_fail(KILN_ERROR_LIMIT, "layer \"%s\": workspace of %zu bytes is too large", largest_layer, largest);
    if (largest_layer)
        kiln_log(KILN_LOG_INFO, "workspace: %zu bytes shared by %d plugin layers (largest: \"%s\")", g->workspace_size,
                 n_plugin_layers, largest_layer);
    else
        kiln_log(KILN_LOG_INFO, "workspace: none needed (%d plugin layers)", n_plugin_layers);
    return KILN_OK;
}

/* ---- pass 7: memory plan ---------------------------------------------------------------------- */

typedef struct plan_item {
    int32_t tensor;
    int32_t start, end; /* live interval over layer indices, inclusive */
    size_t size;
    size_t offset;
} plan_item;

static int cmp_items(const void *pa, const void *pb)
{
    const plan_item *a = pa, *b = pb;
    if (a->size != b->size)
        return a->size > b->size ? -1 : 1;
    if (a->start != b->start)
        return a->start < b->start ? -1 : 1;
    return (a->tensor > b->tensor) - (a->tensor < b->tensor);
}

typedef struct span {
    size_t begin, end;
} span;

static int cmp_spans(const void *pa, const void *pb)
{
    const span *a = pa, *b = pb;
    return (a->begin > b->begin) - (a->begin < b->begin);
}

/* Lowest offset where [offset, offset + item->size) misses every placed
 * item whose live interval meets this one's. */
static kiln_status place(plan_item *items, int32_t n_placed, plan_item *item, span *scratch, const kiln_graph *g)
{
    int32_t n = 0;
    for (int32_t i = 0; i < n_placed; i++) {
        const plan_item *o = &items[i];
        if (o->size == 0 || o->end < item->start || item->end < o->start)
            continue;
        scratch[n].begin = o->offset;
        scratch[n].end = o->offset + o->size;
        n++;
    }
    qsort(scratch, (size_t)n, sizeof *scratch, cmp_spans);
    size_t at = 0, end;
    for (int32_t i = 0; i < n; i++) {
        if (kiln_add_overflow(at, item->size, &end))
            break;
        if (end <= scratch[i].begin)
            break;
        if (scratch[i].end > at)
            at = scratch[i].end;
    }
    if (kiln_add_overflow(at, item->size, &end))
        return kiln_fail(KILN_ERROR_LIMIT, "tensor \"%s\": arena offset overflows", g->tensors[item->tensor].name);
    item->offset = at;
    return KILN_OK;
}

static kiln_status tensor_sizes(kiln_graph *g, const kiln_bound_shapes *b)
{
    for (int32_t t = 0; t < g->n_tensors; t++) {
        kiln_tensor_rec *r = &g->tensors[t];
        if (r->flags & KILN_TENSOR_CONSTANT) {
            r->arena_offset = -1;
            r->max_bytes = r->data_size;
            continue;
        }
        size_t largest = 0;
        for (int32_t k = 0; k < b->n_bounds; k++) {
            size_t bytes;
            kiln_status s = kiln_dims_bytes(&b->dims[(size_t)k * (size_t)b->n_tensors + (size_t)t], r->dtype, &bytes);
            if (s != KILN_OK)
                return kiln_fail_context(s, "tensor \"%s\" at profile %d (%s)", r->name, b->profile[k],
                                         kiln_builder_bound_name(b->which[k]));
            if (bytes > largest)
                largest = bytes;
        }
        if (kiln_builder_align(largest, &r->max_bytes))
            return kiln_fail(KILN_ERROR_LIMIT, "tensor \"%s\": %zu bytes is too large", r->name, largest);
    }
    return KILN_OK;
}

kiln_status kiln_builder_plan_memory(kiln_graph *g)
{
    kiln_bound_shapes b;
    KILN_TRY(kiln_builder_eval_bounds(g, &b));
    kiln_status s = tensor_sizes(g, &b);
    kiln_bound_shapes_free(&b);
    if (s != KILN_OK)
        return s;

    int32_t nt = g->n_tensors, nl = g->n_layers;
    plan_item *items = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *items);
    span *scratch = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *scratch);
    int32_t *start = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *start);
    int32_t *end = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *end);
    if (!items || !scratch || !start || !end) {
        free(items);
        free(scratch);
        free(start);
        free(end);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "planning memory for %d tensors", nt);
    }
    /* Inputs, outputs and anything without a producer live for the whole
     * run (-1 .. nl): the caller writes inputs before enqueue and reads
     * outputs after it. A layer's inputs stay live through the layer, so
     * they never share bytes with its outputs. */
    for (int32_t t = 0; t < nt; t++) {
        int32_t p = g->tensors[t].producer;
        int whole = p < 0 || p >= nl || (g->tensors[t].flags & (KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT));
        start[t] = whole ? -1 : p;
        end[t] = whole ? nl : p;
    }
    for (int32_t i = 0; i < g->n_inputs; i++) {
        start[g->inputs[i]] = -1;
        end[g->inputs[i]] = nl;
    }
    for (int32_t i = 0; i < g->n_outputs; i++) {
        start[g->outputs[i]] = -1;
        end[g->outputs[i]] = nl;
    }
    for (int32_t i = 0; i < nl; i++)
        for (int32_t k = 0; k < g->layers[i].n_inputs; k++) {
            int32_t t = g->layers[i].inputs[k];
            if (end[t] < i)
                end[t] = i;
        }
    int32_t n = 0;
    size_t naive = 0;
    for (int32_t t = 0; t < nt; t++) {
        if (g->tensors[t].flags & KILN_TENSOR_CONSTANT)
            continue;
        items[n] = (plan_item){t, start[t], end[t], g->tensors[t].max_bytes, 0};
        if (kiln_add_overflow(naive, items[n].size, &naive))
            naive = SIZE_MAX;
        n++;
    }
    qsort(items, (size_t)n, sizeof *items, cmp_items);
    size_t arena = 0;
    for (int32_t i = 0; i < n && s == KILN_OK; i++) {
        s = place(items, i, &items[i], scratch, g);
        if (s == KILN_OK && items[i].offset + items[i].size > arena)
            arena = items[i].offset + items[i].size;
    }
    if (s == KILN_OK) {
        for (int32_t i = 0; i < n; i++)
            g->tensors[items[i].tensor].arena_offset = (int64_t)items[i].offset;
        g->arena_size = arena;
        /* The runtime keeps I/O tensors out of the arena (engine.c's
         * check_plan: the caller binds them, sized to their current
         * shape), so a context takes the arena less theirs plus the
         * workspace (planned by the pass before: the figure `kiln
         * inspect` reads as context_bytes); at their max shapes the I/O
         * tensors can be huge (an LLM's KV cache). */
        size_t io = 0;
        for (int32_t i = 0; i < n; i++)
            if (g->tensors[items[i].tensor].flags & (KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT))
                io += items[i].size;
        size_t inner = (arena > io ? arena - io : 0) + g->workspace_size;
        size_t whole = arena + g->workspace_size;
        kiln_log(KILN_LOG_INFO,
                 "memory plan: %d tensors; a context takes %zu bytes (%.2f MiB) besides the I/O tensors, "
                 "%zu bytes (%.2f MiB) with them at their max shapes; naive sum %zu bytes (%.2f MiB)",
                 n, inner, (double)inner / (1024.0 * 1024.0), whole, (double)whole / (1024.0 * 1024.0), naive,
                 (double)naive / (1024.0 * 1024.0));
    }
    free(items);
    free(scratch);
    free(start);
    free(end);
    return s;
}
