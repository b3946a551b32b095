/* The plan checks: what the reader requires of a plan beyond its syntax,
 * so that a plan the builder could not have produced is refused before a
 * byte of it runs (docs/engine-format.md section 6, "Plan checks"). The
 * writer runs them on what it wrote, so the builder refuses first with the
 * same message. */
#include "engine/engine_format.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"

static kiln_status plan_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static kiln_status plan_fail(const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_fail(KILN_ERROR_FORMAT, "engine plan: %s", msg);
}

static int dtype_usable(kiln_dtype t)
{
    return (unsigned)t < KILN_DTYPE_COUNT && t != KILN_DTYPE_FP8_E4M3 && t != KILN_DTYPE_FP8_E5M2;
}

/* ---- who writes each tensor ------------------------------------------------------------ */

static kiln_status check_roles(const kiln_graph *g, uint8_t *listed)
{
    /* listed[t]: bit 0 a network input, bit 1 a network output. */
    for (int32_t i = 0; i < g->n_inputs; i++) {
        int32_t t = g->inputs[i];
        if (listed[t] & 1)
            return plan_fail("tensor \"%s\" is listed twice as an input", g->tensors[t].name);
        listed[t] |= 1;
    }
    for (int32_t i = 0; i < g->n_outputs; i++) {
        int32_t t = g->outputs[i];
        if (listed[t] & 2)
            return plan_fail("tensor \"%s\" is listed twice as an output", g->tensors[t].name);
        listed[t] |= 2;
    }
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        int is_in = (r->flags & KILN_TENSOR_INPUT) != 0, is_out = (r->flags & KILN_TENSOR_OUTPUT) != 0;
        int is_const = (r->flags & KILN_TENSOR_CONSTANT) != 0;
        if (is_in != (listed[t] & 1) || is_out != ((listed[t] >> 1) & 1))
            return plan_fail("tensor \"%s\": its input/output flags disagree with the plan's "
                             "inputs and outputs",
                             r->name);
        /* A constant may be a network output (copied out by enqueue), never an input. */
        if (is_const && is_in)
            return plan_fail("tensor \"%s\" is a constant and a network input", r->name);
        if (!dtype_usable(r->dtype))
            return plan_fail("tensor \"%s\": dtype %s is reserved; no layer accepts it", r->name,
                             kiln_dtype_name(r->dtype));
        if ((is_in || is_const) && r->producer != -1)
            return plan_fail("tensor \"%s\" is a %s but names layer %d as its producer", r->name,
                             is_in ? "network input" : "constant", r->producer);
        if (!is_in && !is_const && r->producer < 0)
            return plan_fail("tensor \"%s\" is neither an input, a constant nor a layer's output", r->name);
    }
    for (int32_t i = 0; i < g->n_layers; i++) {
        const kiln_layer *l = &g->layers[i];
        for (int32_t k = 0; k < l->n_outputs; k++) {
            const kiln_tensor_rec *r = &g->tensors[l->outputs[k]];
            if (r->flags & (KILN_TENSOR_CONSTANT | KILN_TENSOR_INPUT))
                return plan_fail("layer \"%s\" writes %s \"%s\": a layer's outputs are activations", l->name,
                                 (r->flags & KILN_TENSOR_CONSTANT) ? "the constant" : "the input", r->name);
            if (r->producer != i)
                return plan_fail("layer \"%s\" writes tensor \"%s\", whose producer is layer %d", l->name, r->name,
                                 r->producer);
            for (int32_t j = 0; j < k; j++)
                if (l->outputs[j] == l->outputs[k])
                    return plan_fail("layer \"%s\" writes tensor \"%s\" twice", l->name, r->name);
        }
        /* Execution order: what a layer reads exists before it runs. */
        for (int32_t k = 0; k < l->n_inputs; k++) {
            const kiln_tensor_rec *r = &g->tensors[l->inputs[k]];
            if (r->producer >= i)
                return plan_fail("layer \"%s\" reads tensor \"%s\" before layer %d writes it", l->name, r->name,
                                 r->producer);
        }
    }
    /* A producer names a layer that lists the tensor among its outputs. */
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        if (r->producer < 0)
            continue;
        const kiln_layer *l = &g->layers[r->producer];
        int found = 0;
        for (int32_t k = 0; k < l->n_outputs && !found; k++)
            found = l->outputs[k] == t;
        if (!found)
            return plan_fail("tensor \"%s\" names layer \"%s\" as its producer, which does not write it", r->name,
                             l->name);
    }
    return KILN_OK;
}

/* ---- dtypes and ranks by each native op's rules ------------------------------------------- */

static kiln_status check_layer_types(const kiln_graph *g, const kiln_layer *l)
{
    if (l->op == KILN_OP_PLUGIN || l->op == KILN_OP_CONSTANT)
        return KILN_OK; /* plugins: checked against the plugin at load (runtime) */
    const kiln_tensor_rec *x = &g->tensors[l->inputs[0]], *y = &g->tensors[l->outputs[0]];
    const char *op = kiln_op_name(l->op);
    kiln_dtype want = x->dtype;
    int32_t want_rank = x->rank;
    int need_float = 0, same_inputs = 0;
    switch (l->op) {
    case KILN_OP_MATMUL:
        need_float = same_inputs = 1;
        want_rank = -1;
        break;
    case KILN_OP_BINARY: {
        same_inputs = 1;
        int32_t rb = g->tensors[l->inputs[1]].rank;
        want_rank = x->rank > rb ? x->rank : rb;
        break;
    }
    case KILN_OP_UNARY:
    case KILN_OP_SOFTMAX: need_float = 1; break;
    case KILN_OP_REDUCE:
        need_float = 1;
        if (!l->p.reduce.keep_dims)
            want_rank = x->rank - __builtin_popcount(l->p.reduce.axes);
        break;
    case KILN_OP_FUSED:
        need_float = same_inputs = 1;
        want_rank = -1;
        break;
    case KILN_OP_CONCAT: same_inputs = 1; break;
    case KILN_OP_SLICE: break;
    case KILN_OP_SHUFFLE: want_rank = l->p.shuffle.mid_rank; break;
    case KILN_OP_GATHER: {
        const kiln_tensor_rec *idx = &g->tensors[l->inputs[1]];
        if (idx->dtype != KILN_DTYPE_I32 && idx->dtype != KILN_DTYPE_I64)
            return plan_fail("layer \"%s\": gather indices \"%s\" are %s, not i32 or i64", l->name, idx->name,
                             kiln_dtype_name(idx->dtype));
        want_rank = x->rank - 1 + idx->rank;
        break;
    }
    case KILN_OP_CAST: want = l->p.cast.to; break;
    default: break;
    }
    if (need_float && !kiln_dtype_is_float(x->dtype))
        return plan_fail("layer \"%s\": %s of %s input \"%s\" (it takes f32, f16 or bf16)", l->name, op,
                         kiln_dtype_name(x->dtype), x->name);
    for (int32_t k = 1; same_inputs && k < l->n_inputs; k++)
        if (g->tensors[l->inputs[k]].dtype != x->dtype)
            return plan_fail("layer \"%s\": %s inputs \"%s\" (%s) and \"%s\" (%s) differ in dtype", l->name, op,
                             x->name, kiln_dtype_name(x->dtype), g->tensors[l->inputs[k]].name,
                             kiln_dtype_name(g->tensors[l->inputs[k]].dtype));
    if (y->dtype != want)
        return plan_fail("layer \"%s\": %s output \"%s\" is %s, its rules give %s", l->name, op, y->name,
                         kiln_dtype_name(y->dtype), kiln_dtype_name(want));
    if (want_rank >= 0 && y->rank != want_rank)
        return plan_fail("layer \"%s\": %s output \"%s\" has rank %d, its rules give %d", l->name, op, y->name, y->rank,
                         want_rank);
    return KILN_OK;
}

/* ---- memory: arena ranges and sizes at every profile bound ------------------------------------ */

static kiln_status check_arena(const kiln_graph *g)
{
    if (g->workspace_size % KILN_ENGINE_ARENA_ALIGN)
        return plan_fail("workspace_size %zu is not a multiple of %u", g->workspace_size, KILN_ENGINE_ARENA_ALIGN);
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        if (r->flags & KILN_TENSOR_CONSTANT) {
            if (r->arena_offset != -1)
                return plan_fail("constant \"%s\" has arena_offset %" PRId64 " (constants have -1)", r->name,
                                 r->arena_offset);
            continue;
        }
        if (r->arena_offset < 0)
            return plan_fail("tensor \"%s\" has no arena range", r->name);
        if ((uint64_t)r->arena_offset % KILN_ENGINE_ARENA_ALIGN || r->max_bytes % KILN_ENGINE_ARENA_ALIGN)
            return plan_fail("tensor \"%s\": arena range [%" PRId64 ", +%zu) is not aligned to %u bytes", r->name,
                             r->arena_offset, r->max_bytes, KILN_ENGINE_ARENA_ALIGN);
    }
    for (int32_t i = 0; i < g->n_layers; i++)
        if (g->layers[i].workspace > g->workspace_size)
            return plan_fail("layer \"%s\": workspace %zu bytes exceeds the engine's %zu", g->layers[i].name,
                             g->layers[i].workspace, g->workspace_size);
    return KILN_OK;
}

/* Tensors live at the same time never share arena bytes, as the builder's
 * liveness plan guarantees: an activation is live from the layer that
 * writes it through the last layer that reads it (so a layer's inputs and
 * outputs are disjoint); a network input or output is live for the whole
 * run (the runtime cuts I/O ranges out of the arena, which is safe only
 * because nothing else lies in them). Layers are visited in order, keeping
 * the live activations sorted by offset; a newcomer only has to miss its
 * two neighbours there and among the I/O ranges, since those already live
 * are disjoint. */
#define KILN_ENGINE_MAX_LIVE 4096

typedef struct live_range {
    uint64_t begin, end;
    int32_t tensor;
} live_range;

static size_t live_find(const live_range *v, size_t n, uint64_t begin)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid].begin < begin)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int is_activation(const kiln_tensor_rec *r)
{
    return !(r->flags & (KILN_TENSOR_CONSTANT | KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT)) && r->max_bytes > 0;
}

static int is_io(const kiln_tensor_rec *r)
{
    return !(r->flags & KILN_TENSOR_CONSTANT) && (r->flags & (KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT)) &&
           r->max_bytes > 0;
}

static int cmp_range(const void *a, const void *b)
{
    const live_range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The range among v[0..n) (sorted, disjoint) that r overlaps, or NULL. */
static const live_range *clash_with(const live_range *v, size_t n, const live_range *r)
{
    size_t at = live_find(v, n, r->begin);
    if (at > 0 && v[at - 1].end > r->begin)
        return &v[at - 1];
    if (at < n && v[at].begin < r->end)
        return &v[at];
    return NULL;
}

static kiln_status check_liveness(const kiln_graph *g)
{
    int32_t nt = g->n_tensors, nl = g->n_layers;
    size_t n1 = (size_t)(nt > 0 ? nt : 1), l1 = (size_t)nl + 1;
    int32_t *last = malloc(n1 * sizeof *last);
    /* Tensors by the layer after which they die: a counting sort. */
    int32_t *die_count = calloc(l1 + 1, sizeof *die_count), *die = malloc(n1 * sizeof *die);
    live_range *live = malloc(sizeof *live * KILN_ENGINE_MAX_LIVE), *io = malloc(n1 * sizeof *io);
    kiln_status s = KILN_OK;
    size_t n_io = 0;
    if (!last || !die_count || !die || !live || !io) {
        s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "checking the engine plan");
        goto done;
    }
    for (int32_t t = 0; t < nt; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        if (is_io(r))
            io[n_io++] = (live_range){(uint64_t)r->arena_offset, (uint64_t)r->arena_offset + r->max_bytes, t};
    }
    qsort(io, n_io, sizeof *io, cmp_range);
    for (size_t i = 1; i < n_io; i++)
        if (io[i].begin < io[i - 1].end) {
            s = plan_fail("tensors \"%s\" and \"%s\" share arena bytes while both are live (the whole run)",
                          g->tensors[io[i - 1].tensor].name, g->tensors[io[i].tensor].name);
            goto done;
        }
    for (int32_t t = 0; t < nt; t++)
        last[t] = g->tensors[t].producer;
    for (int32_t i = 0; i < nl; i++)
        for (int32_t k = 0; k < g->layers[i].n_inputs; k++) {
            int32_t t = g->layers[i].inputs[k];
            if (last[t] < i)
                last[t] = i;
        }
    for (int32_t t = 0; t < nt; t++)
        if (is_activation(&g->tensors[t]))
            die_count[last[t] + 1]++;
    for (size_t i = 1; i <= l1; i++)
        die_count[i] += die_count[i - 1];
    for (int32_t t = 0; t < nt; t++)
        if (is_activation(&g->tensors[t]))
            die[die_count[last[t]]++] = t;
    /* die_count[i] is now the end of layer i's group; layer i's group
     * starts at die_count[i - 1] (0 for the first). */
    size_t n_live = 0, next_death = 0;
    for (int32_t i = 0; i < nl && s == KILN_OK; i++) {
        const kiln_layer *l = &g->layers[i];
        for (int32_t k = 0; k < l->n_outputs && s == KILN_OK; k++) {
            int32_t t = l->outputs[k];
            const kiln_tensor_rec *r = &g->tensors[t];
            if (!is_activation(r))
                continue;
            live_range nr = {(uint64_t)r->arena_offset, (uint64_t)r->arena_offset + r->max_bytes, t};
            size_t at = live_find(live, n_live, nr.begin);
            const live_range *clash = clash_with(live, n_live, &nr);
            if (!clash)
                clash = clash_with(io, n_io, &nr);
            if (clash)
                s = plan_fail("tensors \"%s\" and \"%s\" share arena bytes while both are live (layer \"%s\")",
                              g->tensors[clash->tensor].name, r->name, l->name);
            else if (n_live == KILN_ENGINE_MAX_LIVE)
                s = plan_fail("more than %d activations are live at layer \"%s\"", KILN_ENGINE_MAX_LIVE, l->name);
            else {
                memmove(live + at + 1, live + at, sizeof *live * (n_live - at));
                live[at] = nr;
                n_live++;
            }
        }
        /* Those last read by this layer (or never read) die after it. */
        for (; s == KILN_OK && next_death < (size_t)die_count[i]; next_death++) {
            const kiln_tensor_rec *r = &g->tensors[die[next_death]];
            size_t at = live_find(live, n_live, (uint64_t)r->arena_offset);
            if (at < n_live && live[at].tensor == die[next_death]) {
                memmove(live + at, live + at + 1, sizeof *live * (n_live - at - 1));
                n_live--;
            }
        }
    }
done:
    free(last);
    free(die_count);
    free(die);
    free(live);
    free(io);
    return s;
}

static const char *const bound_names[3] = {"min", "opt", "max"};

static kiln_status check_bound(const kiln_graph *g, int32_t p, int which, int64_t *symbols, int64_t *values,
                               kiln_dims *dims)
{
    kiln_graph_profile_symbols(g, p, which, symbols);
    kiln_status s = kiln_graph_eval_shapes(g, symbols, values, dims);
    if (s == KILN_OK)
        s = kiln_graph_check_constraints(g, values);
    if (s != KILN_OK)
        return kiln_fail_context(KILN_ERROR_FORMAT, "engine plan: profile %d (%s)", p, bound_names[which]);
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        size_t bytes = 0;
        if (kiln_dims_bytes(&dims[t], r->dtype, &bytes) != KILN_OK)
            return plan_fail("profile %d (%s): tensor \"%s\" is too large", p, bound_names[which], r->name);
        size_t cap = (r->flags & KILN_TENSOR_CONSTANT) ? r->data_size : r->max_bytes;
        if (bytes > cap)
            return plan_fail("profile %d (%s): tensor \"%s\" needs %zu bytes but the plan gives it %zu", p,
                             bound_names[which], r->name, bytes, cap);
    }
    return KILN_OK;
}

static kiln_status check_bounds(const kiln_graph *g)
{
    size_t ns = g->n_symbols > 0 ? (size_t)g->n_symbols : 1, ne = g->exprs.n > 0 ? (size_t)g->exprs.n : 1;
    size_t nt = g->n_tensors > 0 ? (size_t)g->n_tensors : 1;
    int64_t *symbols = malloc(ns * sizeof *symbols), *values = malloc(ne * sizeof *values);
    kiln_dims *dims = malloc(nt * sizeof *dims);
    kiln_status s = KILN_OK;
    if (!symbols || !values || !dims)
        s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "checking the engine plan");
    /* With no profile the network has no dynamic dim (kiln_graph_check_profiles). */
    int32_t n = g->n_profiles > 0 ? g->n_profiles : 1;
    for (int32_t p = 0; p < n && s == KILN_OK; p++)
        for (int which = 0; which < 3 && s == KILN_OK; which++)
            s = check_bound(g, g->n_profiles > 0 ? p : -1, which, symbols, values, dims);
    free(symbols);
    free(values);
    free(dims);
    return s;
}

kiln_status kiln_engine_check_plan(const kiln_graph *g)
{
    kiln_status s = kiln_graph_check_profiles(g);
    if (s != KILN_OK)
        return kiln_fail_context(KILN_ERROR_FORMAT, "engine plan");
    uint8_t *listed = calloc(g->n_tensors > 0 ? (size_t)g->n_tensors : 1, 1);
    if (!listed)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "checking the engine plan");
    s = check_roles(g, listed);
    free(listed);
    KILN_TRY(s);
    for (int32_t i = 0; i < g->n_layers; i++)
        KILN_TRY(check_layer_types(g, &g->layers[i]));
    KILN_TRY(check_arena(g));
    KILN_TRY(check_liveness(g));
    return check_bounds(g);
}
