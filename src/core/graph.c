/* The graph: storage, deep copy, and shape evaluation. */
#include "core/graph.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"

/* ---- lifetime ---------------------------------------------------------------- */

void kiln_graph_init(kiln_graph *g)
{
    memset(g, 0, sizeof *g);
    kiln_expr_pool_init(&g->exprs);
}

void kiln_tensor_rec_free(kiln_tensor_rec *t)
{
    free(t->name);
    if (t->data_owned)
        free(t->data);
}

void kiln_layer_free(kiln_layer *l)
{
    free(l->name);
    free(l->inputs);
    free(l->outputs);
}

void kiln_plugin_rec_free(kiln_plugin_rec *r)
{
    free(r->name);
    free(r->version);
    free(r->plugin_namespace);
    free(r->library);
    if (r->instance && r->instance->ops && r->instance->ops->destroy)
        r->instance->ops->destroy(r->instance);
    free(r->blob);
}

void kiln_graph_free(kiln_graph *g)
{
    if (!g)
        return;
    for (int32_t i = 0; i < g->n_tensors; i++)
        kiln_tensor_rec_free(&g->tensors[i]);
    free(g->tensors);
    for (int32_t i = 0; i < g->n_layers; i++)
        kiln_layer_free(&g->layers[i]);
    free(g->layers);
    free(g->inputs);
    free(g->outputs);
    free(g->symbols);
    free(g->profiles);
    for (int32_t i = 0; i < g->n_constraints; i++)
        free(g->constraints[i].what);
    free(g->constraints);
    for (int32_t i = 0; i < g->n_plugins; i++)
        kiln_plugin_rec_free(&g->plugins[i]);
    free(g->plugins);
    for (int32_t i = 0; i < g->n_sections; i++)
        if (g->sections[i].data_owned)
            free(g->sections[i].data);
    free(g->sections);
    kiln_expr_pool_free(&g->exprs);
    kiln_graph_init(g);
}

/* ---- deep copy ----------------------------------------------------------------- */

/* malloc + memcpy of n elements; *ok cleared on failure. n == 0 gives NULL. */
static void *dup_array(const void *src, size_t n, size_t elem, int *ok)
{
    if (n == 0 || !src)
        return NULL;
    size_t bytes;
    void *d = NULL;
    if (!kiln_mul_overflow(n, elem, &bytes))
        d = malloc(bytes);
    if (!d) {
        *ok = 0;
        return NULL;
    }
    memcpy(d, src, bytes);
    return d;
}

static char *dup_str(const char *s, int *ok)
{
    char *d = kiln_strdup(s);
    if (s && !d)
        *ok = 0;
    return d;
}

/* The deep copy; with `borrow` the copy's constants point at src's data. */
static kiln_status graph_copy(kiln_graph *dst, const kiln_graph *src, int borrow)
{
    kiln_graph t;
    int ok = 1, plugin_failed = 0;
    kiln_graph_init(&t);
    /* Scalars and plan fields first; every pointer is replaced below. */
    t = *src;
    t.tensors = NULL;
    t.layers = NULL;
    t.inputs = t.outputs = NULL;
    t.symbols = NULL;
    t.profiles = NULL;
    t.constraints = NULL;
    t.plugins = NULL;
    t.sections = NULL;
    t.n_tensors = t.cap_tensors = t.n_layers = t.cap_layers = 0;
    t.n_constraints = t.n_plugins = t.n_sections = 0;
    kiln_expr_pool_init(&t.exprs);

    if (kiln_expr_pool_copy(&t.exprs, &src->exprs) != KILN_OK)
        ok = 0;
    t.inputs = dup_array(src->inputs, (size_t)src->n_inputs, sizeof *t.inputs, &ok);
    t.outputs = dup_array(src->outputs, (size_t)src->n_outputs, sizeof *t.outputs, &ok);
    t.symbols = dup_array(src->symbols, (size_t)src->n_symbols, sizeof *t.symbols, &ok);
    t.profiles = dup_array(src->profiles, (size_t)src->n_profiles * (size_t)src->n_inputs, sizeof *t.profiles, &ok);

    if (ok && src->n_tensors > 0) {
        t.tensors = calloc((size_t)src->n_tensors, sizeof *t.tensors);
        if (!t.tensors)
            ok = 0;
        for (int32_t i = 0; ok && i < src->n_tensors; i++) {
            const kiln_tensor_rec *s = &src->tensors[i];
            kiln_tensor_rec *d = &t.tensors[i];
            *d = *s;
            d->name = NULL;
            d->data = NULL;
            d->data_owned = 0;
            t.n_tensors = t.cap_tensors = i + 1;
            d->name = dup_str(s->name, &ok);
            /* An empty constant still has a (1-byte) buffer, so "has data"
             * stays a plain NULL test for every reader of the graph. */
            if (s->data && borrow) {
                d->data = s->data;
            } else if (s->data) {
                d->data = malloc(s->data_size ? s->data_size : 1);
                if (d->data) {
                    memcpy(d->data, s->data, s->data_size);
                    d->data_owned = 1;
                } else {
                    ok = 0;
                }
            }
        }
    }
    if (ok && src->n_layers > 0) {
        t.layers = calloc((size_t)src->n_layers, sizeof *t.layers);
        if (!t.layers)
            ok = 0;
        for (int32_t i = 0; ok && i < src->n_layers; i++) {
            const kiln_layer *s = &src->layers[i];
            kiln_layer *d = &t.layers[i];
            *d = *s;
            d->name = NULL;
            d->inputs = d->outputs = NULL;
            t.n_layers = t.cap_layers = i + 1;
            d->name = dup_str(s->name, &ok);
            d->inputs = dup_array(s->inputs, (size_t)s->n_inputs, sizeof *d->inputs, &ok);
            d->outputs = dup_array(s->outputs, (size_t)s->n_outputs, sizeof *d->outputs, &ok);
        }
    }
    if (ok && src->n_constraints > 0) {
        t.constraints = calloc((size_t)src->n_constraints, sizeof *t.constraints);
        if (!t.constraints)
            ok = 0;
        for (int32_t i = 0; ok && i < src->n_constraints; i++) {
            t.constraints[i] = src->constraints[i];
            t.constraints[i].what = NULL;
            t.n_constraints = i + 1;
            t.constraints[i].what = dup_str(src->constraints[i].what, &ok);
        }
    }
    if (ok && src->n_sections > 0) {
        t.sections = calloc((size_t)src->n_sections, sizeof *t.sections);
        if (!t.sections)
            ok = 0;
        for (int32_t i = 0; ok && i < src->n_sections; i++) {
            const kiln_section_rec *s = &src->sections[i];
            t.sections[i].id = s->id;
            t.n_sections = i + 1;
            if (s->data && s->size > 0) {
                t.sections[i].data = dup_array(s->data, s->size, 1, &ok);
                t.sections[i].size = s->size;
                t.sections[i].data_owned = t.sections[i].data != NULL;
            }
        }
    }
    kiln_status st = KILN_ERROR_OUT_OF_MEMORY;
    if (ok && src->n_plugins > 0) {
        t.plugins = calloc((size_t)src->n_plugins, sizeof *t.plugins);
        if (!t.plugins)
            ok = 0;
        for (int32_t i = 0; ok && i < src->n_plugins; i++) {
            const kiln_plugin_rec *s = &src->plugins[i];
            kiln_plugin_rec *d = &t.plugins[i];
            t.n_plugins = i + 1;
            d->name = dup_str(s->name, &ok);
            d->version = dup_str(s->version, &ok);
            d->plugin_namespace = dup_str(s->plugin_namespace, &ok);
            d->library = dup_str(s->library, &ok);
            d->creator = s->creator;
            d->blob_version = s->blob_version;
            if (s->blob && s->blob_size > 0) {
                d->blob = dup_array(s->blob, s->blob_size, 1, &ok);
                d->blob_size = s->blob_size;
            }
            if (ok && s->instance) {
                kiln_status cs = KILN_ERROR_PLUGIN;
                unsigned long fails = kiln_fail_count();
                if (s->instance->ops && s->instance->ops->clone)
                    cs = s->instance->ops->clone(s->instance, &d->instance);
                else
                    kiln_fail(cs, "plugin %s %s (namespace \"%s\") has no clone function", s->name ? s->name : "?",
                              s->version ? s->version : "?", s->plugin_namespace ? s->plugin_namespace : "");
                if (cs != KILN_OK || !d->instance) {
                    d->instance = NULL;
                    if (cs == KILN_OK) {
                        cs = KILN_ERROR_PLUGIN;
                        kiln_fail(cs, "clone returned no instance");
                    } else if (kiln_fail_count() == fails) {
                        kiln_fail(cs, "clone failed with %s and gave no message", kiln_status_name(cs));
                    }
                    kiln_fail_context(cs, "cloning plugin %s %s", s->name ? s->name : "?",
                                      s->version ? s->version : "?");
                    st = cs;
                    plugin_failed = 1;
                    ok = 0;
                }
            }
        }
    }
    if (!ok) {
        if (st == KILN_ERROR_OUT_OF_MEMORY && !plugin_failed)
            kiln_fail(st, "out of memory copying a graph of %d tensors and %d layers", src->n_tensors, src->n_layers);
        kiln_graph_free(&t);
        return st;
    }
    *dst = t;
    return KILN_OK;
}

kiln_status kiln_graph_copy(kiln_graph *dst, const kiln_graph *src) { return graph_copy(dst, src, 0); }

kiln_status kiln_graph_copy_borrowing(kiln_graph *dst, const kiln_graph *src) { return graph_copy(dst, src, 1); }

/* ---- appending ------------------------------------------------------------------ */

int32_t kiln_graph_add_tensor(kiln_graph *g, const char *name, kiln_dtype dtype, int32_t rank, const kiln_expr *dims)
{
    if (rank < 0 || rank > KILN_MAX_RANK || (rank > 0 && !dims)) {
        kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tensor \"%s\": rank %d is outside 0..%d", name ? name : "", rank,
                  KILN_MAX_RANK);
        return -1;
    }
    if (g->n_tensors == g->cap_tensors) {
        int32_t cap = g->cap_tensors ? g->cap_tensors * 2 : 16;
        kiln_tensor_rec *t = g->cap_tensors > INT32_MAX / 2 ? NULL : realloc(g->tensors, (size_t)cap * sizeof *t);
        if (!t) {
            kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "adding tensor \"%s\"", name ? name : "");
            return -1;
        }
        g->tensors = t;
        g->cap_tensors = cap;
    }
    kiln_tensor_rec *t = &g->tensors[g->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = kiln_strdup(name ? name : "");
    if (!t->name) {
        kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "adding tensor \"%s\"", name ? name : "");
        return -1;
    }
    t->dtype = dtype;
    t->rank = rank;
    for (int32_t i = 0; i < KILN_MAX_RANK; i++)
        t->dims[i] = i < rank ? dims[i] : -1;
    t->producer = -1;
    t->arena_offset = -1;
    return g->n_tensors++;
}

int32_t kiln_graph_add_layer(kiln_graph *g, const char *name, kiln_op op, const int32_t *inputs, int32_t n_inputs,
                             int32_t n_outputs)
{
    if (n_inputs < 0 || n_outputs < 0 || (n_inputs > 0 && !inputs)) {
        kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": %d inputs and %d outputs", name ? name : "", n_inputs,
                  n_outputs);
        return -1;
    }
    if (g->n_layers == g->cap_layers) {
        int32_t cap = g->cap_layers ? g->cap_layers * 2 : 16;
        kiln_layer *l = g->cap_layers > INT32_MAX / 2 ? NULL : realloc(g->layers, (size_t)cap * sizeof *l);
        if (!l) {
            kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "adding layer \"%s\"", name ? name : "");
            return -1;
        }
        g->layers = l;
        g->cap_layers = cap;
    }
    kiln_layer *l = &g->layers[g->n_layers];
    memset(l, 0, sizeof *l);
    l->name = kiln_strdup(name ? name : "");
    l->inputs = n_inputs ? malloc((size_t)n_inputs * sizeof *l->inputs) : NULL;
    l->outputs = n_outputs ? malloc((size_t)n_outputs * sizeof *l->outputs) : NULL;
    if (!l->name || (n_inputs && !l->inputs) || (n_outputs && !l->outputs)) {
        free(l->name);
        free(l->inputs);
        free(l->outputs);
        kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "adding layer \"%s\"", name ? name : "");
        return -1;
    }
    if (n_inputs)
        memcpy(l->inputs, inputs, (size_t)n_inputs * sizeof *l->inputs);
    for (int32_t i = 0; i < n_outputs; i++)
        l->outputs[i] = -1;
    l->op = op;
    l->n_inputs = n_inputs;
    l->n_outputs = n_outputs;
    l->tactic = -1;
    return g->n_layers++;
}

int32_t kiln_graph_find_tensor(const kiln_graph *g, const char *name)
{
    if (!name)
        return -1;
    for (int32_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].name && strcmp(g->tensors[i].name, name) == 0)
            return i;
    return -1;
}

int32_t kiln_graph_find_layer(const kiln_graph *g, const char *name)
{
    if (!name)
        return -1;
    for (int32_t i = 0; i < g->n_layers; i++)
        if (g->layers[i].name && strcmp(g->layers[i].name, name) == 0)
            return i;
    return -1;
}

/* ---- shapes ----------------------------------------------------------------------- */

kiln_status kiln_graph_eval_shapes(const kiln_graph *g, const int64_t *symbols, int64_t *values, kiln_dims *dims)
{
    KILN_TRY(kiln_expr_pool_eval(&g->exprs, symbols, g->n_symbols, values));
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        if (r->rank < 0 || r->rank > KILN_MAX_RANK)
            return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\": rank %d is outside 0..%d", r->name, r->rank,
                             KILN_MAX_RANK);
        kiln_dims d;
        memset(&d, 0, sizeof d);
        d.rank = r->rank;
        for (int32_t i = 0; i < r->rank; i++) {
            if (r->dims[i] < 0 || r->dims[i] >= g->exprs.n)
                return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\": dim %d has no shape expression", r->name, i);
            d.d[i] = values[r->dims[i]];
            if (d.d[i] < 0) {
                /* A violated constraint (e.g. a slice starting past the
                 * end) explains a negative dim better, naming the layer. */
                KILN_TRY(kiln_graph_check_constraints(g, values));
                char buf[128];
                return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\": dim %d = %s is %" PRId64 " (negative)", r->name, i,
                                 kiln_expr_format(&g->exprs, r->dims[i], buf, sizeof buf), d.d[i]);
            }
        }
        dims[t] = d;
    }
    return KILN_OK;
}

kiln_status kiln_graph_check_constraints(const kiln_graph *g, const int64_t *values)
{
    for (int32_t i = 0; i < g->n_constraints; i++) {
        const kiln_constraint *c = &g->constraints[i];
        int two = c->kind == KILN_CONSTRAINT_EQUAL || c->kind == KILN_CONSTRAINT_BROADCAST;
        if (c->a < 0 || c->a >= g->exprs.n || (two && (c->b < 0 || c->b >= g->exprs.n)))
            return kiln_fail(KILN_ERROR_SHAPE, "constraint %d refers to a missing shape expression", i);
        int64_t a = values[c->a], b = two ? values[c->b] : 0;
        const char *layer =
            c->layer >= 0 && c->layer < g->n_layers && g->layers[c->layer].name ? g->layers[c->layer].name : "?";
        const char *what = c->what ? c->what : "shape";
        switch (c->kind) {
        case KILN_CONSTRAINT_EQUAL:
            if (a != b)
                return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": %s: dims %" PRId64 " and %" PRId64 " differ (a == b)",
                                 layer, what, a, b);
            break;
        case KILN_CONSTRAINT_BROADCAST:
            if (a != b && a != 1 && b != 1)
                return kiln_fail(KILN_ERROR_SHAPE,
                                 "layer \"%s\": cannot broadcast dims %" PRId64 " and %" PRId64
                                 " (a == b || a == 1 || b == 1) in %s",
                                 layer, a, b, what);
            break;
        case KILN_CONSTRAINT_POSITIVE:
            if (a < 1)
                return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": %s: dim is %" PRId64 " (a >= 1)", layer, what, a);
            break;
        case KILN_CONSTRAINT_NONNEGATIVE:
            if (a < 0)
                return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": %s: dim is %" PRId64 " (a >= 0)", layer, what, a);
            break;
        default: return kiln_fail(KILN_ERROR_SHAPE, "constraint %d has unknown kind %d", i, (int)c->kind);
        }
    }
    return KILN_OK;
}

kiln_status kiln_graph_check_profiles(const kiln_graph *g)
{
    for (int32_t i = 0; i < g->n_inputs; i++) {
        int32_t t = g->inputs[i];
        if (t < 0 || t >= g->n_tensors)
            return kiln_fail(KILN_ERROR_INTERNAL, "network input %d refers to tensor %d of %d", i, t, g->n_tensors);
        const kiln_tensor_rec *r = &g->tensors[t];
        for (int32_t a = 0; a < r->rank; a++) {
            int64_t v;
            if (kiln_expr_is_const(&g->exprs, r->dims[a], &v))
                continue;
            if (g->n_profiles == 0)
                return kiln_fail(KILN_ERROR_SHAPE,
                                 "input \"%s\" dim %d is dynamic but there is no optimization "
                                 "profile",
                                 r->name, a);
            for (int32_t p = 0; p < g->n_profiles; p++) {
                const kiln_profile_dims *pd = &g->profiles[(size_t)p * (size_t)g->n_inputs + (size_t)i];
                int set = pd->min.rank == r->rank && pd->opt.rank == r->rank && pd->max.rank == r->rank &&
                          pd->min.d[a] >= 0 && pd->opt.d[a] >= 0 && pd->max.d[a] >= 0;
                if (!set)
                    return kiln_fail(KILN_ERROR_SHAPE, "profile %d: input \"%s\" dim %d is dynamic but has no bounds",
                                     p, r->name, a);
            }
        }
    }
    return KILN_OK;
}

void kiln_graph_profile_symbols(const kiln_graph *g, int32_t profile, int which, int64_t *symbols)
{
    for (int32_t s = 0; s < g->n_symbols; s++) {
        int64_t v = -1;
        int32_t pos = -1;
        for (int32_t i = 0; i < g->n_inputs; i++)
            if (g->inputs[i] == g->symbols[s].tensor)
                pos = i;
        int32_t axis = g->symbols[s].axis;
        if (pos >= 0 && profile >= 0 && profile < g->n_profiles && axis >= 0 && axis < KILN_MAX_RANK) {
            const kiln_profile_dims *pd = &g->profiles[(size_t)profile * (size_t)g->n_inputs + (size_t)pos];
            const kiln_dims *d = which == 0 ? &pd->min : which == 1 ? &pd->opt : &pd->max;
            v = d->d[axis];
        }
        symbols[s] = v;
    }
}

kiln_status kiln_dims_count(const kiln_dims *d, int64_t *count)
{
    if (d->rank < 0 || d->rank > KILN_MAX_RANK)
        return kiln_fail(KILN_ERROR_SHAPE, "rank %d is outside 0..%d", d->rank, KILN_MAX_RANK);
    int64_t n = 1;
    for (int32_t i = 0; i < d->rank; i++) {
        if (d->d[i] < 0)
            return kiln_fail(KILN_ERROR_SHAPE, "dim %d is negative (%" PRId64 ")", i, d->d[i]);
        if (__builtin_mul_overflow(n, d->d[i], &n)) {
            char buf[200];
            return kiln_fail(KILN_ERROR_SHAPE, "element count of shape %s overflows int64",
                             kiln_dims_format(d, buf, sizeof buf));
        }
    }
    *count = n;
    return KILN_OK;
}

kiln_status kiln_dims_bytes(const kiln_dims *d, kiln_dtype dtype, size_t *bytes)
{
    int64_t n = 0;
    size_t es = kiln_dtype_size(dtype), b;
    if (es == 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "dtype %d is out of range", (int)dtype);
    KILN_TRY(kiln_dims_count(d, &n));
    if ((uint64_t)n > SIZE_MAX || kiln_mul_overflow((size_t)n, es, &b)) {
        char buf[200];
        return kiln_fail(KILN_ERROR_SHAPE, "byte size of a %s tensor of shape %s overflows", kiln_dtype_name(dtype),
                         kiln_dims_format(d, buf, sizeof buf));
    }
    *bytes = b;
    return KILN_OK;
}

char *kiln_dims_format(const kiln_dims *d, char *buf, size_t size)
{
    if (!buf || size == 0)
        return buf;
    buf[0] = '\0';
    if (d->rank == 0) {
        snprintf(buf, size, "scalar");
        return buf;
    }
    size_t pos = 0;
    int32_t rank = d->rank < 0 ? 0 : d->rank > KILN_MAX_RANK ? KILN_MAX_RANK : d->rank;
    for (int32_t i = 0; i < rank && pos < size; i++) {
        int w = snprintf(buf + pos, size - pos, "%s%" PRId64, i ? "x" : "", d->d[i]);
        if (w < 0)
            break;
        pos += (size_t)w;
    }
    return buf;
}
