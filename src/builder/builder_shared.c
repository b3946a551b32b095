/* Helpers the builder's passes share: shapes at every profile bound, name
 * lists for log lines, alignment. They call no pass. */
#include "builder/builder_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* ---- names and alignment --------------------------------------------------- */

void kiln_builder_name_list(char *buf, size_t size, const char *const *names, int32_t n, int32_t max)
{
    if (!buf || size == 0)
        return;
    size_t pos = strlen(buf);
    for (int32_t i = 0; i < n && i < max && pos < size; i++) {
        int w = snprintf(buf + pos, size - pos, "%s\"%s\"", i ? ", " : "", names[i]);
        if (w < 0)
            return;
        pos += (size_t)w;
    }
    if (n > max && pos < size)
        snprintf(buf + pos, size - pos, " and %d more", n - max);
}

int kiln_builder_align(size_t bytes, size_t *out)
{
    size_t r;
    if (kiln_add_overflow(bytes, KILN_BUILDER_ALIGN - 1, &r))
        return 1;
    *out = r / KILN_BUILDER_ALIGN * KILN_BUILDER_ALIGN;
    return 0;
}

/* ---- shapes at every bound ------------------------------------------------------- */

const char *kiln_builder_bound_name(int which) { return which == 0 ? "min" : which == 1 ? "opt" : "max"; }

void kiln_bound_shapes_free(kiln_bound_shapes *b)
{
    if (!b)
        return;
    free(b->dims);
    free(b->profile);
    free(b->which);
    memset(b, 0, sizeof *b);
}

/* Names the layer behind a negative dim (eval_shapes reports only the
 * tensor, and a user fixes a profile by knowing which layer broke).
 * Returns 1 with the error set, 0 when no dim is negative. */
static int explain_negative(const kiln_graph *g, const int64_t *values, const char *where)
{
    for (int32_t t = 0; t < g->n_tensors; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        for (int32_t a = 0; a < r->rank; a++) {
            if (r->dims[a] < 0 || r->dims[a] >= g->exprs.n || values[r->dims[a]] >= 0)
                continue;
            const char *layer = r->producer >= 0 && r->producer < g->n_layers ? g->layers[r->producer].name : NULL;
            if (layer)
                kiln_fail(KILN_ERROR_SHAPE, "%s: layer \"%s\": output \"%s\" dim %d is %" PRId64 " (must be >= 0)",
                          where, layer, r->name, a, values[r->dims[a]]);
            else
                kiln_fail(KILN_ERROR_SHAPE, "%s: tensor \"%s\" dim %d is %" PRId64 " (must be >= 0)", where, r->name, a,
                          values[r->dims[a]]);
            return 1;
        }
    }
    return 0;
}

kiln_status kiln_builder_eval_bounds(const kiln_graph *g, kiln_bound_shapes *out)
{
    kiln_bound_shapes b;
    memset(&b, 0, sizeof b);
    b.n_tensors = g->n_tensors;
    b.n_bounds = g->n_profiles > 0 ? g->n_profiles * 3 : 1;
    size_t n_dims = (size_t)b.n_bounds * (size_t)(g->n_tensors > 0 ? g->n_tensors : 1);
    b.dims = calloc(n_dims, sizeof *b.dims);
    b.profile = calloc((size_t)b.n_bounds, sizeof *b.profile);
    b.which = calloc((size_t)b.n_bounds, sizeof *b.which);
    int64_t *symbols = calloc(g->n_symbols > 0 ? (size_t)g->n_symbols : 1, sizeof *symbols);
    int64_t *values = calloc(g->exprs.n > 0 ? (size_t)g->exprs.n : 1, sizeof *values);
    if (!b.dims || !b.profile || !b.which || !symbols || !values) {
        free(symbols);
        free(values);
        kiln_bound_shapes_free(&b);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "evaluating shapes of %d tensors at %d bounds", g->n_tensors,
                         b.n_bounds);
    }
    kiln_status s = KILN_OK;
    for (int32_t k = 0; k < b.n_bounds && s == KILN_OK; k++) {
        int32_t profile = g->n_profiles > 0 ? k / 3 : -1;
        int which = g->n_profiles > 0 ? k % 3 : 2;
        b.profile[k] = profile;
        b.which[k] = which;
        char where[64];
        if (profile >= 0) {
            kiln_graph_profile_symbols(g, profile, which, symbols);
            snprintf(where, sizeof where, "profile %d (%s)", profile, kiln_builder_bound_name(which));
        } else {
            snprintf(where, sizeof where, "static shapes");
        }
        s = kiln_graph_eval_shapes(g, symbols, values, b.dims + (size_t)k * (size_t)g->n_tensors);
        if (s != KILN_OK) {
            /* eval_shapes fails on a negative dim after evaluating every
             * expression; re-evaluate to tell which layer made it. */
            if (!(kiln_expr_pool_eval(&g->exprs, symbols, g->n_symbols, values) == KILN_OK &&
                  explain_negative(g, values, where)))
                s = kiln_fail_context(s, "%s", where);
            break;
        }
        s = kiln_graph_check_constraints(g, values);
        if (s != KILN_OK)
            s = kiln_fail_context(s, "%s", where);
    }
    free(symbols);
    free(values);
    if (s != KILN_OK) {
        kiln_bound_shapes_free(&b);
        return s;
    }
    *out = b;
    return KILN_OK;
}
