/* The network API: building a graph layer by layer with symbolic shapes.
 *
 * Every add_* validates its arguments, infers output dims as shape
 * expressions, and records what it could not prove as constraints (checked
 * by the builder at each profile's min/opt/max). A failing call leaves the
 * network as it was, apart from unused nodes in the expression pool. */
#include "network/network_internal.h"

#include <kiln/registry.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/api_struct.h"
#include "core/dtype.h"
#include "plugin/plugin_internal.h"
#include "core/error.h"

/* ---- op names ------------------------------------------------------------------- */

static const char *const binary_names[KILN_BINARY_OP_COUNT] = {"add", "sub", "mul", "div", "pow", "max", "min"};
static const char *const unary_names[KILN_UNARY_OP_COUNT] = {
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu_erf", "gelu_tanh", "silu"};
static const char *const reduce_names[KILN_REDUCE_OP_COUNT] = {"sum", "mean", "max", "min"};

const char *kiln_binary_op_name(kiln_binary_op op)
{
    return (unsigned)op < KILN_BINARY_OP_COUNT ? binary_names[op] : "?";
}

const char *kiln_unary_op_name(kiln_unary_op op) { return (unsigned)op < KILN_UNARY_OP_COUNT ? unary_names[op] : "?"; }

const char *kiln_reduce_op_name(kiln_reduce_op op)
{
    return (unsigned)op < KILN_REDUCE_OP_COUNT ? reduce_names[op] : "?";
}

static kiln_status parse_name(const char *const *names, int n, const char *kind, const char *name, int *out)
{
    if (!name || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s op name is NULL", kind);
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i], name) == 0) {
            *out = i;
            return KILN_OK;
        }
    }
    char list[256] = "";
    size_t pos = 0;
    for (int i = 0; i < n && pos < sizeof list; i++) {
        int w = snprintf(list + pos, sizeof list - pos, "%s%s", i ? ", " : "", names[i]);
        if (w < 0)
            break;
        pos += (size_t)w;
    }
    return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "unknown %s op \"%s\" (expected one of: %s)", kind, name, list);
}

kiln_status kiln_binary_op_parse(const char *name, kiln_binary_op *out)
{
    int v = 0;
    KILN_TRY(parse_name(binary_names, KILN_BINARY_OP_COUNT, "binary", name, &v));
    *out = (kiln_binary_op)v;
    return KILN_OK;
}

kiln_status kiln_unary_op_parse(const char *name, kiln_unary_op *out)
{
    int v = 0;
    KILN_TRY(parse_name(unary_names, KILN_UNARY_OP_COUNT, "unary", name, &v));
    *out = (kiln_unary_op)v;
    return KILN_OK;
}

kiln_status kiln_reduce_op_parse(const char *name, kiln_reduce_op *out)
{
    int v = 0;
    KILN_TRY(parse_name(reduce_names, KILN_REDUCE_OP_COUNT, "reduce", name, &v));
    *out = (kiln_reduce_op)v;
    return KILN_OK;
}

/* ---- lifetime --------------------------------------------------------------------- */

kiln_status kiln_network_create(kiln_registry *reg, kiln_network **out)
{
    if (!out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_network_create: out is NULL");
    kiln_network *net = calloc(1, sizeof *net);
    if (!net)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "creating a network");
    kiln_graph_init(&net->graph);
    net->registry = reg;
    *out = net;
    return KILN_OK;
}

void kiln_network_destroy(kiln_network *net)
{
    if (!net)
        return;
    kiln_graph_free(&net->graph);
    free(net);
}

/* ---- helpers ------------------------------------------------------------------------ */

static int dtype_usable(kiln_dtype t)
{
    return (unsigned)t < KILN_DTYPE_COUNT && t != KILN_DTYPE_FP8_E4M3 && t != KILN_DTYPE_FP8_E5M2;
}

static kiln_status check_dtype(const char *what, const char *name, kiln_dtype t)
{
    if ((unsigned)t >= KILN_DTYPE_COUNT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s \"%s\": dtype %d is out of range", what, name, (int)t);
    if (!dtype_usable(t))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s \"%s\": dtype %s is reserved; no layer accepts it yet", what, name,
                         kiln_dtype_name(t));
    return KILN_OK;
}

/* Tensor and layer names share one namespace: a layer's output tensor takes
 * the layer's name. */
static int name_taken(const kiln_graph *g, const char *name)
{
    return kiln_graph_find_tensor(g, name) >= 0 || kiln_graph_find_layer(g, name) >= 0;
}

static kiln_status check_new_name(const kiln_graph *g, const char *what, const char *name)
{
    if (!name || !name[0])
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s name is empty", what);
    if (name_taken(g, name))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s \"%s\": the name is already used by a %s", what, name,
                         kiln_graph_find_tensor(g, name) >= 0 ? "tensor" : "layer");
    return KILN_OK;
}

/* "<prefix>_<n>" with the first n that is free. */
static kiln_status auto_name(kiln_network *net, const char *prefix, char *buf, size_t size)
{
    for (;;) {
        if (net->auto_names == INT32_MAX)
            return kiln_fail(KILN_ERROR_LIMIT, "out of generated layer names");
        snprintf(buf, size, "%s_%d", prefix, net->auto_names++);
        if (!name_taken(&net->graph, buf))
            return KILN_OK;
    }
}

/* The layer being added: its name, and the constraints it has appended so
 * far (removed again if it fails). */
typedef struct layer_ctx {
    kiln_network *net;
    kiln_graph *g;
    const char *name;
    char auto_buf[128];
    int32_t first_constraint;
} layer_ctx;

static void rollback_constraints(layer_ctx *c)
{
    kiln_graph *g = c->g;
    while (g->n_constraints > c->first_constraint)
        free(g->constraints[--g->n_constraints].what);
}

static kiln_status lfail(layer_ctx *c, kiln_status status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static kiln_status lfail(layer_ctx *c, kiln_status status, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rollback_constraints(c);
    return kiln_fail(status, "layer \"%s\": %s", c->name, msg);
}

static kiln_status begin_layer(kiln_network *net, const char *name, const char *prefix, layer_ctx *c)
{
    if (!net)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "network is NULL");
    memset(c, 0, sizeof *c);
    c->net = net;
    c->g = &net->graph;
    c->first_constraint = net->graph.n_constraints;
    if (name) {
        KILN_TRY(check_new_name(&net->graph, "layer", name));
        c->name = name;
    } else {
        KILN_TRY(auto_name(net, prefix, c->auto_buf, sizeof c->auto_buf));
        c->name = c->auto_buf;
    }
    return KILN_OK;
}

static const kiln_tensor_rec *get_tensor(layer_ctx *c, kiln_tensor t, const char *role, kiln_status *st)
{
    if (t.id < 0 || t.id >= c->g->n_tensors) {
        *st = lfail(c, KILN_ERROR_INVALID_ARGUMENT, "%s is not a tensor of this network (id %d)", role, t.id);
        return NULL;
    }
    return &c->g->tensors[t.id];
}

static kiln_status add_constraint(layer_ctx *c, kiln_constraint_kind kind, kiln_expr a, kiln_expr b, const char *what)
{
    kiln_graph *g = c->g;
    if (a < 0 || (b < 0 && (kind == KILN_CONSTRAINT_EQUAL || kind == KILN_CONSTRAINT_BROADCAST)))
        return lfail(c, KILN_ERROR_OUT_OF_MEMORY, "out of memory building shape expressions");
    kiln_constraint *cs = realloc(g->constraints, (size_t)(g->n_constraints + 1) * sizeof *cs);
    if (!cs)
        return lfail(c, KILN_ERROR_OUT_OF_MEMORY, "out of memory adding a shape constraint");
    g->constraints = cs;
    char *w = kiln_strdup(what);
    if (!w)
        return lfail(c, KILN_ERROR_OUT_OF_MEMORY, "out of memory adding a shape constraint");
    kiln_constraint *k = &cs[g->n_constraints++];
    k->kind = kind;
    k->a = a;
    k->b = b;
    k->layer = g->n_layers; /* the index this layer will get */
    k->what = w;
    return KILN_OK;
}

static kiln_expr cst(layer_ctx *c, int64_t v) { return kiln_expr_const(&c->g->exprs, v); }

static kiln_expr eop(layer_ctx *c, kiln_expr_op op, kiln_expr a, kiln_expr b)
{
    return kiln_expr_operation(&c->g->exprs, op, a, b);
}

static int is_const(layer_ctx *c, kiln_expr e, int64_t *v) { return kiln_expr_is_const(&c->g->exprs, e, v); }

/* a and b must be equal: proves it, fails when both are known and differ,
 * else records an EQUAL constraint. Message: "<what> differ: <na> has X, <nb> has Y". */
static kiln_status require_equal(layer_ctx *c, kiln_expr a, kiln_expr b, const char *what, const char *na,
                                 const char *nb)
{
    int64_t va, vb;
    if (a == b && a >= 0)
        return KILN_OK;
    if (is_const(c, a, &va) && is_const(c, b, &vb))
        return lfail(c, KILN_ERROR_SHAPE, "%s differ: %s has %" PRId64 ", %s has %" PRId64, what, na, va, nb, vb);
    char w[256];
    snprintf(w, sizeof w, "%s of %s and %s", what, na, nb);
    return add_constraint(c, KILN_CONSTRAINT_EQUAL, a, b, w);
}

/* Numpy broadcast of one axis. MAX alone would turn (0, 1) into 1, so the
 * size is min(max(a, b), a*b): (a,a)->a, (1,b)->b, (a,1)->a, (0,1)->0. */
static kiln_status broadcast_dim(layer_ctx *c, kiln_expr a, kiln_expr b, const char *where, kiln_expr *out)
{
    int64_t va = 0, vb = 0;
    int ca = is_const(c, a, &va), cb = is_const(c, b, &vb);
    if (a == b) {
        *out = a;
        return KILN_OK;
    }
    if (ca && va == 1) {
        *out = b;
        return KILN_OK;
    }
    if (cb && vb == 1) {
        *out = a;
        return KILN_OK;
    }
    if (ca && cb)
        return lfail(c, KILN_ERROR_SHAPE,
                     "cannot broadcast dims %" PRId64 " and %" PRId64 " at %s (a == b || a == 1 || b == 1)", va, vb,
                     where);
    KILN_TRY(add_constraint(c, KILN_CONSTRAINT_BROADCAST, a, b, where));
    *out = eop(c, KILN_EXPR_MIN, eop(c, KILN_EXPR_MAX, a, b), eop(c, KILN_EXPR_MUL, a, b));
    return KILN_OK;
}

/* Right-aligned broadcast of two dim lists. */
static kiln_status broadcast_dims(layer_ctx *c, int32_t ra, const kiln_expr *da, int32_t rb, const kiln_expr *db,
                                  const char *na, const char *nb, const char *axis_word, int32_t *rank, kiln_expr *out)
{
    int32_t r = ra > rb ? ra : rb;
    kiln_expr one = cst(c, 1);
    for (int32_t i = 0; i < r; i++) {
        int32_t ia = i - (r - ra), ib = i - (r - rb);
        kiln_expr a = ia >= 0 ? da[ia] : one, b = ib >= 0 ? db[ib] : one;
        char where[128];
        snprintf(where, sizeof where, "%s %d of %s and %s", axis_word, i, na, nb);
        KILN_TRY(broadcast_dim(c, a, b, where, &out[i]));
    }
    *rank = r;
    return KILN_OK;
}

static kiln_status check_exprs(layer_ctx *c, int32_t rank, const kiln_expr *dims)
{
    for (int32_t i = 0; i < rank; i++)
        if (dims[i] < 0 || dims[i] >= c->g->exprs.n)
            return lfail(c, KILN_ERROR_OUT_OF_MEMORY, "out of memory building shape expressions");
    return KILN_OK;
}

/* Appends the output tensors and the layer. On failure everything this
 * layer added is removed again. */
static kiln_status commit_layer(layer_ctx *c, kiln_op op, const int32_t *inputs, int32_t n_inputs, int32_t n_outputs,
                                const kiln_dtype *dtypes, const int32_t *ranks, const kiln_expr (*dims)[KILN_MAX_RANK],
                                const kiln_layer_params *p, kiln_tensor *outs, int32_t max_outs)
{
    kiln_graph *g = c->g;
    int32_t first_tensor = g->n_tensors;
    kiln_status st = KILN_OK;
    for (int32_t o = 0; o < n_outputs; o++)
        KILN_TRY(check_exprs(c, ranks[o], dims[o]));
    size_t len = strlen(c->name) + 16;
    char *tname = malloc(len);
    if (!tname)
        return lfail(c, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    for (int32_t o = 0; o < n_outputs; o++) {
        if (n_outputs == 1)
            snprintf(tname, len, "%s", c->name);
        else
            snprintf(tname, len, "%s:%d", c->name, o);
        if (n_outputs > 1 && name_taken(g, tname)) {
            st = lfail(c, KILN_ERROR_INVALID_ARGUMENT, "output name \"%s\" is already used", tname);
            goto fail;
        }
        if (kiln_graph_add_tensor(g, tname, dtypes[o], ranks[o], dims[o]) < 0) {
            st = kiln_fail_context(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\"", c->name);
            rollback_constraints(c);
            goto fail;
        }
    }
    int32_t li = kiln_graph_add_layer(g, c->name, op, inputs, n_inputs, n_outputs);
    if (li < 0) {
        st = kiln_fail_context(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\"", c->name);
        rollback_constraints(c);
        goto fail;
    }
    kiln_layer *l = &g->layers[li];
    l->p = *p;
    for (int32_t o = 0; o < n_outputs; o++) {
        l->outputs[o] = first_tensor + o;
        g->tensors[first_tensor + o].producer = li;
        if (o < max_outs)
            outs[o].id = first_tensor + o;
    }
    free(tname);
    return KILN_OK;
fail:
    while (g->n_tensors > first_tensor)
        free(g->tensors[--g->n_tensors].name);
    free(tname);
    return st;
}

static kiln_status commit_single(layer_ctx *c, kiln_op op, const int32_t *inputs, int32_t n_inputs, kiln_dtype dtype,
                                 int32_t rank, const kiln_expr *dims, const kiln_layer_params *p, kiln_tensor *out)
{
    kiln_expr d[1][KILN_MAX_RANK];
    for (int32_t i = 0; i < KILN_MAX_RANK; i++)
        d[0][i] = i < rank ? dims[i] : -1;
    return commit_layer(c, op, inputs, n_inputs, 1, &dtype, &rank, (const kiln_expr(*)[KILN_MAX_RANK])d, p, out, 1);
}

static int32_t normalize_axis(int32_t axis, int32_t rank)
{
    int64_t a = axis < 0 ? (int64_t)axis + rank : axis;
    return a >= 0 && a < rank ? (int32_t)a : -1;
}

/* ---- inputs and profiles ------------------------------------------------------------ */

/* One input's entry in a fresh profile row: its static dims, -1 where
 * dynamic (the builder reports a dynamic dim that was never set). */
static void profile_entry_init(const kiln_graph *g, int32_t tensor, kiln_profile_dims *pd)
{
    const kiln_tensor_rec *t = &g->tensors[tensor];
    memset(pd, 0, sizeof *pd);
    pd->min.rank = pd->opt.rank = pd->max.rank = t->rank;
    for (int32_t i = 0; i < t->rank; i++) {
        int64_t v = -1;
        kiln_expr_is_const(&g->exprs, t->dims[i], &v);
        pd->min.d[i] = pd->opt.d[i] = pd->max.d[i] = v;
    }
}

kiln_status kiln_network_add_input(kiln_network *net, const char *name, kiln_dtype dtype, const kiln_dims *dims,
                                   kiln_tensor *out)
{
    if (!net || !dims || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_network_add_input: NULL argument");
    kiln_graph *g = &net->graph;
    KILN_TRY(check_new_name(g, "input", name));
    KILN_TRY(check_dtype("input", name, dtype));
    if (dims->rank < 0 || dims->rank > KILN_MAX_RANK)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "input \"%s\": rank %d is outside 0..%d", name, dims->rank,
                         KILN_MAX_RANK);
    int32_t n_dynamic = 0;
    for (int32_t i = 0; i < dims->rank; i++) {
        if (dims->d[i] < -1)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "input \"%s\": dim %d is %" PRId64 " (expected >= 0, or -1 for dynamic)", name, i,
                             dims->d[i]);
        n_dynamic += dims->d[i] == -1;
    }
    if (g->n_symbols > INT32_MAX - n_dynamic || g->n_inputs == INT32_MAX)
        return kiln_fail(KILN_ERROR_LIMIT, "input \"%s\": too many inputs", name);

    /* Grow every array first, and create the symbol expressions only once
     * the tensor exists: an orphan symbol node would make every later
     * evaluation of the pool fail. */
    kiln_symbol *syms = g->symbols;
    if (n_dynamic > 0) {
        syms = realloc(g->symbols, (size_t)(g->n_symbols + n_dynamic) * sizeof *syms);
        if (!syms)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "input \"%s\": out of memory", name);
        g->symbols = syms;
    }
    int32_t *inputs = realloc(g->inputs, (size_t)(g->n_inputs + 1) * sizeof *inputs);
    if (!inputs)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "input \"%s\": out of memory", name);
    g->inputs = inputs;
    kiln_profile_dims *rows = NULL;
    size_t new_in = (size_t)g->n_inputs + 1;
    if (g->n_profiles > 0) {
        rows = calloc((size_t)g->n_profiles * new_in, sizeof *rows);
        if (!rows)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "input \"%s\": out of memory", name);
    }
    int32_t t = kiln_graph_add_tensor(g, name, dtype, 0, NULL);
    if (t < 0) {
        free(rows);
        return kiln_fail_context(KILN_ERROR_OUT_OF_MEMORY, "input \"%s\"", name);
    }
    kiln_tensor_rec *r = &g->tensors[t];
    for (int32_t i = 0, sym = g->n_symbols; i < dims->rank; i++) {
        r->dims[i] = dims->d[i] == -1 ? kiln_expr_symbol(&g->exprs, sym++) : kiln_expr_const(&g->exprs, dims->d[i]);
        if (r->dims[i] < 0) {
            free(rows);
            free(r->name);
            g->n_tensors--;
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "input \"%s\": out of memory", name);
        }
    }
    r->rank = dims->rank;
    r->flags |= KILN_TENSOR_INPUT;
    for (int32_t i = 0, s = g->n_symbols; i < dims->rank; i++)
        if (dims->d[i] == -1)
            syms[s++] = (kiln_symbol){t, i};
    g->n_symbols += n_dynamic;
    /* Profiles created before this input get a row entry for it too. */
    if (rows) {
        for (int32_t p = 0; p < g->n_profiles; p++) {
            if (g->n_inputs > 0)
                memcpy(&rows[(size_t)p * new_in], &g->profiles[(size_t)p * (size_t)g->n_inputs],
                       (size_t)g->n_inputs * sizeof *rows);
            profile_entry_init(g, t, &rows[(size_t)p * new_in + (size_t)g->n_inputs]);
        }
        free(g->profiles);
        g->profiles = rows;
    }
    g->inputs[g->n_inputs++] = t;
    out->id = t;
    return KILN_OK;
}

kiln_status kiln_network_add_profile(kiln_network *net, int32_t *index)
{
    if (!net || !index)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_network_add_profile: NULL argument");
    kiln_graph *g = &net->graph;
    if (g->n_profiles == INT32_MAX)
        return kiln_fail(KILN_ERROR_LIMIT, "too many profiles");
    size_t n = ((size_t)g->n_profiles + 1) * (size_t)g->n_inputs;
    if (n > 0) {
        kiln_profile_dims *rows = realloc(g->profiles, n * sizeof *rows);
        if (!rows)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "adding profile %d", g->n_profiles);
        g->profiles = rows;
        for (int32_t i = 0; i < g->n_inputs; i++)
            profile_entry_init(g, g->inputs[i], &rows[(size_t)g->n_profiles * (size_t)g->n_inputs + (size_t)i]);
    }
    *index = g->n_profiles++;
    return KILN_OK;
}

kiln_status kiln_network_set_profile_shape(kiln_network *net, int32_t profile, const char *input, const kiln_dims *min,
                                           const kiln_dims *opt, const kiln_dims *max)
{
    if (!net || !input || !min || !opt || !max)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_network_set_profile_shape: NULL argument");
    kiln_graph *g = &net->graph;
    if (profile < 0 || profile >= g->n_profiles)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "profile %d does not exist (the network has %d profiles)",
                         profile, g->n_profiles);
    int32_t pos = -1;
    for (int32_t i = 0; i < g->n_inputs; i++)
        if (strcmp(g->tensors[g->inputs[i]].name, input) == 0)
            pos = i;
    if (pos < 0)
        return kiln_fail(KILN_ERROR_NOT_FOUND, "profile %d: \"%s\" is not a network input", profile, input);
    const kiln_tensor_rec *t = &g->tensors[g->inputs[pos]];
    const kiln_dims *ds[3] = {min, opt, max};
    static const char *const which[3] = {"min", "opt", "max"};
    for (int k = 0; k < 3; k++)
        if (ds[k]->rank != t->rank)
            return kiln_fail(KILN_ERROR_SHAPE, "profile %d, input \"%s\": %s has rank %d, the input has rank %d",
                             profile, input, which[k], ds[k]->rank, t->rank);
    for (int32_t i = 0; i < t->rank; i++) {
        int64_t fixed;
        if (kiln_expr_is_const(&g->exprs, t->dims[i], &fixed)) {
            for (int k = 0; k < 3; k++)
                if (ds[k]->d[i] != fixed)
                    return kiln_fail(KILN_ERROR_SHAPE,
                                     "profile %d, input \"%s\": dim %d is static (%" PRId64 ") but %s is %" PRId64,
                                     profile, input, i, fixed, which[k], ds[k]->d[i]);
            continue;
        }
        if (min->d[i] < 0)
            return kiln_fail(KILN_ERROR_SHAPE, "profile %d, input \"%s\": dim %d: min %" PRId64 " is negative", profile,
                             input, i, min->d[i]);
        if (min->d[i] > opt->d[i] || opt->d[i] > max->d[i])
            return kiln_fail(KILN_ERROR_SHAPE,
                             "profile %d, input \"%s\": dim %d: expected min <= opt <= max, got %" PRId64 ", %" PRId64
                             ", %" PRId64,
                             profile, input, i, min->d[i], opt->d[i], max->d[i]);
    }
    kiln_profile_dims *pd = &g->profiles[(size_t)profile * (size_t)g->n_inputs + (size_t)pos];
    pd->min = *min;
    pd->opt = *opt;
    pd->max = *max;
    pd->min.reserved = pd->opt.reserved = pd->max.reserved = 0;
    for (int32_t i = t->rank; i < KILN_MAX_RANK; i++)
        pd->min.d[i] = pd->opt.d[i] = pd->max.d[i] = 0;
    return KILN_OK;
}

/* ---- constants ---------------------------------------------------------------------- */

/* A constant holding a copy of data, or, with `take`, data itself. */
static kiln_status add_constant(kiln_network *net, const char *name, kiln_dtype dtype, const kiln_dims *dims,
                                const void *data, int take, kiln_tensor *out)
{
    if (!net || !dims || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_network_add_constant: NULL argument");
    kiln_graph *g = &net->graph;
    char buf[64];
    if (!name) {
        KILN_TRY(auto_name(net, "constant", buf, sizeof buf));
        name = buf;
    }
    KILN_TRY(check_new_name(g, "constant", name));
    KILN_TRY(check_dtype("constant", name, dtype));
    if (dims->rank < 0 || dims->rank > KILN_MAX_RANK)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "constant \"%s\": rank %d is outside 0..%d", name, dims->rank,
                         KILN_MAX_RANK);
    for (int32_t i = 0; i < dims->rank; i++)
        if (dims->d[i] < 0)
            return kiln_fail(KILN_ERROR_SHAPE, "constant \"%s\": dim %d is %" PRId64 " (constants are static)", name, i,
                             dims->d[i]);
    size_t bytes;
    if (kiln_dims_bytes(dims, dtype, &bytes) != KILN_OK)
        return kiln_fail_context(KILN_ERROR_SHAPE, "constant \"%s\"", name);
    if (bytes > 0 && !data)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "constant \"%s\": data is NULL for %zu bytes", name, bytes);
    kiln_expr e[KILN_MAX_RANK];
    for (int32_t i = 0; i < dims->rank; i++)
        if ((e[i] = kiln_expr_const(&g->exprs, dims->d[i])) < 0)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "constant \"%s\": out of memory", name);
    void *copy = take ? (void *)(uintptr_t)data : malloc(bytes ? bytes : 1);
    if (!copy)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "constant \"%s\": out of memory for %zu bytes", name, bytes);
    if (bytes && !take)
        memcpy(copy, data, bytes);
    int32_t t = kiln_graph_add_tensor(g, name, dtype, dims->rank, e);
    if (t < 0) {
        if (!take)
            free(copy);
        return kiln_fail_context(KILN_ERROR_OUT_OF_MEMORY, "constant \"%s\"", name);
    }
    kiln_tensor_rec *r = &g->tensors[t];
    r->flags |= KILN_TENSOR_CONSTANT;
    r->data = copy;
    r->data_size = bytes;
    r->data_owned = 1;
    out->id = t;
    return KILN_OK;
}

kiln_status kiln_network_add_constant(kiln_network *net, const char *name, kiln_dtype dtype, const kiln_dims *dims,
                                      const void *data, kiln_tensor *out)
{
    return add_constant(net, name, dtype, dims, data, 0, out);
}

kiln_status kiln_network_add_constant_take(kiln_network *net, const char *name, kiln_dtype dtype, const kiln_dims *dims,
                                           void *data, kiln_tensor *out)
{
    if (!data)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_network_add_constant_take: data is NULL");
    return add_constant(net, name, dtype, dims, data, 1, out);
}

/* ---- matmul ----------------------------------------------------------------------- */

kiln_status kiln_network_add_matmul(kiln_network *net, const char *name, kiln_tensor a, int32_t transpose_a,
                                    kiln_tensor b, int32_t transpose_b, kiln_tensor *out)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, "matmul", &c));
    if (!out)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "out is NULL");
    const kiln_tensor_rec *ta = get_tensor(&c, a, "A", &st);
    if (!ta)
        return st;
    const kiln_tensor_rec *tb = get_tensor(&c, b, "B", &st);
    if (!tb)
        return st;
    if (!kiln_dtype_is_float(ta->dtype) || ta->dtype != tb->dtype)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "A (%s) and B (%s) must have the same float dtype",
                     kiln_dtype_name(ta->dtype), kiln_dtype_name(tb->dtype));
    int32_t ra = ta->rank, rb = tb->rank;
    if (ra < 1 || rb < 1)
        return lfail(&c, KILN_ERROR_SHAPE, "A has rank %d and B rank %d; both need rank >= 1", ra, rb);
    /* A vector has no axis to transpose; refusing the flag avoids guessing
     * what the caller meant. */
    if ((ra == 1 && transpose_a) || (rb == 1 && transpose_b))
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "transpose_%s needs a matrix, but %s has rank 1",
                     ra == 1 && transpose_a ? "a" : "b", ra == 1 && transpose_a ? "A" : "B");
    kiln_expr m = -1, ka, kb, n = -1;
    if (ra == 1) {
        ka = ta->dims[0];
    } else {
        m = ta->dims[transpose_a ? ra - 1 : ra - 2];
        ka = ta->dims[transpose_a ? ra - 2 : ra - 1];
    }
    if (rb == 1) {
        kb = tb->dims[0];
    } else {
        kb = tb->dims[transpose_b ? rb - 1 : rb - 2];
        n = tb->dims[transpose_b ? rb - 2 : rb - 1];
    }
    KILN_TRY(require_equal(&c, ka, kb, "inner dims", "A", "B"));
    kiln_expr od[KILN_MAX_RANK];
    int32_t rank;
    KILN_TRY(broadcast_dims(&c, ra > 2 ? ra - 2 : 0, ta->dims, rb > 2 ? rb - 2 : 0, tb->dims, "A", "B", "batch axis",
                            &rank, od));
    if (m >= 0)
        od[rank++] = m;
    if (n >= 0)
        od[rank++] = n;
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    p.matmul.transpose_a = transpose_a != 0;
    p.matmul.transpose_b = transpose_b != 0;
    int32_t ins[2] = {a.id, b.id};
    return commit_single(&c, KILN_OP_MATMUL, ins, 2, ta->dtype, rank, od, &p, out);
}

/* ---- elementwise ------------------------------------------------------------------ */

kiln_status kiln_network_add_binary(kiln_network *net, const char *name, kiln_binary_op op, kiln_tensor a,
                                    kiln_tensor b, kiln_tensor *out)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, kiln_binary_op_name(op), &c));
    if (!out)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "out is NULL");
    if ((unsigned)op >= KILN_BINARY_OP_COUNT)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "binary op %d is out of range", (int)op);
    const kiln_tensor_rec *ta = get_tensor(&c, a, "A", &st);
    if (!ta)
        return st;
    const kiln_tensor_rec *tb = get_tensor(&c, b, "B", &st);
    if (!tb)
        return st;
    if (ta->dtype != tb->dtype)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "dtypes differ: A is %s, B is %s", kiln_dtype_name(ta->dtype),
                     kiln_dtype_name(tb->dtype));
    kiln_expr od[KILN_MAX_RANK];
    int32_t rank;
    KILN_TRY(broadcast_dims(&c, ta->rank, ta->dims, tb->rank, tb->dims, "A", "B", "axis", &rank, od));
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    p.binary.op = op;
    int32_t ins[2] = {a.id, b.id};
    return commit_single(&c, KILN_OP_BINARY, ins, 2, ta->dtype, rank, od, &p, out);
}

kiln_status kiln_network_add_unary(kiln_network *net, const char *name, kiln_unary_op op, kiln_tensor x,
                                   kiln_tensor *out)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, kiln_unary_op_name(op), &c));
    if (!out)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "out is NULL");
    if ((unsigned)op >= KILN_UNARY_OP_COUNT)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "unary op %d is out of range", (int)op);
    const kiln_tensor_rec *tx = get_tensor(&c, x, "input", &st);
    if (!tx)
        return st;
    if (!kiln_dtype_is_float(tx->dtype))
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "%s needs a float input, got %s", kiln_unary_op_name(op),
                     kiln_dtype_name(tx->dtype));
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    p.unary.op = op;
    return commit_single(&c, KILN_OP_UNARY, &x.id, 1, tx->dtype, tx->rank, tx->dims, &p, out);
}

/* ---- reduce and softmax --------------------------------------------------------------- */

kiln_status kiln_network_add_reduce(kiln_network *net, const char *name, kiln_reduce_op op, kiln_tensor x,
                                    uint32_t axes_mask, int32_t keep_dims, kiln_tensor *out)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, "reduce", &c));
    if (!out)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "out is NULL");
    if ((unsigned)op >= KILN_REDUCE_OP_COUNT)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "reduce op %d is out of range", (int)op);
    const kiln_tensor_rec *tx = get_tensor(&c, x, "input", &st);
    if (!tx)
        return st;
    if (!kiln_dtype_is_float(tx->dtype))
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "reduce %s needs a float input, got %s", kiln_reduce_op_name(op),
                     kiln_dtype_name(tx->dtype));
    if (axes_mask == 0)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "axes_mask selects no axis");
    if (tx->rank < 32 && (axes_mask >> tx->rank) != 0)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "axes_mask 0x%x names an axis >= rank %d", axes_mask, tx->rank);
    kiln_expr od[KILN_MAX_RANK];
    int32_t rank = 0;
    kiln_expr one = cst(&c, 1);
    for (int32_t i = 0; i < tx->rank; i++) {
        if (!(axes_mask & (1u << i))) {
            od[rank++] = tx->dims[i];
            continue;
        }
        /* sum of nothing is 0, but mean, max and min of nothing are undefined */
        if (op != KILN_REDUCE_SUM) {
            int64_t v;
            char what[64];
            snprintf(what, sizeof what, "reduced axis %d", i);
            if (is_const(&c, tx->dims[i], &v)) {
                if (v < 1)
                    return lfail(&c, KILN_ERROR_SHAPE, "%s over axis %d of size 0", kiln_reduce_op_name(op), i);
            } else {
                KILN_TRY(add_constraint(&c, KILN_CONSTRAINT_POSITIVE, tx->dims[i], -1, what));
            }
        }
        if (keep_dims)
            od[rank++] = one;
    }
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    p.reduce.op = op;
    p.reduce.axes = axes_mask;
    p.reduce.keep_dims = keep_dims != 0;
    return commit_single(&c, KILN_OP_REDUCE, &x.id, 1, tx->dtype, rank, od, &p, out);
}

kiln_status kiln_network_add_softmax(kiln_network *net, const char *name, kiln_tensor x, int32_t axis, kiln_tensor *out)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, "softmax", &c));
    if (!out)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "out is NULL");
    const kiln_tensor_rec *tx = get_tensor(&c, x, "input", &st);
    if (!tx)
        return st;
    if (!kiln_dtype_is_float(tx->dtype))
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "softmax needs a float input, got %s",
                     kiln_dtype_name(tx->dtype));
    int32_t ax = normalize_axis(axis, tx->rank);
    if (ax < 0)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "axis %d is out of range for rank %d", axis, tx->rank);
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    p.softmax.axis = ax;
    return commit_single(&c, KILN_OP_SOFTMAX, &x.id, 1, tx->dtype, tx->rank, tx->dims, &p, out);
}

/* ---- concat and slice ------------------------------------------------------------------ */

kiln_status kiln_network_add_concat(kiln_network *net, const char *name, const kiln_tensor *inputs, int32_t n,
                                    int32_t axis, kiln_tensor *out)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, "concat", &c));
    if (!out || !inputs || n < 1)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "needs at least one input (got %d) and an output", n);
    const kiln_tensor_rec *t0 = get_tensor(&c, inputs[0], "input 0", &st);
    if (!t0)
        return st;
    int32_t ax = normalize_axis(axis, t0->rank);
    if (ax < 0)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "axis %d is out of range for rank %d", axis, t0->rank);
    kiln_expr od[KILN_MAX_RANK];
    memcpy(od, t0->dims, sizeof od);
    int32_t *ins = malloc((size_t)n * sizeof *ins);
    if (!ins)
        return lfail(&c, KILN_ERROR_OUT_OF_MEMORY, "out of memory for %d inputs", n);
    ins[0] = inputs[0].id;
    for (int32_t k = 1; k < n; k++) {
        char role[32];
        snprintf(role, sizeof role, "input %d", k);
        const kiln_tensor_rec *tk = get_tensor(&c, inputs[k], role, &st);
        if (!tk)
            goto fail;
        ins[k] = inputs[k].id;
        if (tk->dtype != t0->dtype || tk->rank != t0->rank) {
            st = lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "input %d is %s rank %d, input 0 is %s rank %d", k,
                       kiln_dtype_name(tk->dtype), tk->rank, kiln_dtype_name(t0->dtype), t0->rank);
            goto fail;
        }
        for (int32_t i = 0; i < t0->rank; i++) {
            if (i == ax) {
                od[i] = eop(&c, KILN_EXPR_ADD, od[i], tk->dims[i]);
                continue;
            }
            char what[32];
            snprintf(what, sizeof what, "sizes of axis %d", i);
            if ((st = require_equal(&c, t0->dims[i], tk->dims[i], what, "input 0", role)) != KILN_OK)
                goto fail;
        }
    }
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    p.concat.axis = ax;
    st = commit_single(&c, KILN_OP_CONCAT, ins, n, t0->dtype, t0->rank, od, &p, out);
fail:
    free(ins);
    return st;
}

kiln_status kiln_network_add_slice(kiln_network *net, const char *name, kiln_tensor x, const int64_t *start,
                                   const int64_t *size, const int64_t *stride, kiln_tensor *out)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, "slice", &c));
    const kiln_tensor_rec *tx = get_tensor(&c, x, "input", &st);
    if (!tx)
        return st;
    if (!out || (tx->rank > 0 && (!start || !size || !stride)))
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "start, size, stride and out must not be NULL");
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    kiln_expr od[KILN_MAX_RANK];
    for (int32_t i = 0; i < tx->rank; i++) {
        if (start[i] < 0 || stride[i] < 1 || size[i] < -1)
            return lfail(&c, KILN_ERROR_INVALID_ARGUMENT,
                         "axis %d: start %" PRId64 ", size %" PRId64 ", stride %" PRId64
                         " (need start >= 0, size >= -1, stride >= 1)",
                         i, start[i], size[i], stride[i]);
        p.slice.start[i] = start[i];
        p.slice.stride[i] = stride[i];
        kiln_expr dim = tx->dims[i];
        int64_t dv;
        int dconst = is_const(&c, dim, &dv);
        char what[64];
        if (size[i] == -1) {
            if (dconst && dv < start[i])
                return lfail(&c, KILN_ERROR_SHAPE, "axis %d: start %" PRId64 " is past the end (size %" PRId64 ")", i,
                             start[i], dv);
            kiln_expr rest = eop(&c, KILN_EXPR_SUB, dim, cst(&c, start[i]));
            if (!dconst) {
                snprintf(what, sizeof what, "axis %d: start %" PRId64 " <= dim", i, start[i]);
                KILN_TRY(add_constraint(&c, KILN_CONSTRAINT_NONNEGATIVE, rest, -1, what));
            }
            od[i] = eop(&c, KILN_EXPR_CEIL_DIV, rest, cst(&c, stride[i]));
            continue;
        }
        od[i] = cst(&c, size[i]);
        if (size[i] == 0)
            continue;
        /* The last element read, start + (size-1)*stride, must be < dim. */
        int64_t last;
        if (__builtin_mul_overflow(size[i] - 1, stride[i], &last) || __builtin_add_overflow(last, start[i], &last) ||
            last == INT64_MAX)
            return lfail(&c, KILN_ERROR_SHAPE, "axis %d: start + (size-1)*stride overflows", i);
        if (dconst) {
            if (last >= dv)
                return lfail(&c, KILN_ERROR_SHAPE, "axis %d: reads index %" PRId64 " but the dim has size %" PRId64, i,
                             last, dv);
            continue;
        }
        snprintf(what, sizeof what, "axis %d: index %" PRId64 " < dim", i, last);
        KILN_TRY(add_constraint(&c, KILN_CONSTRAINT_POSITIVE, eop(&c, KILN_EXPR_SUB, dim, cst(&c, last)), -1, what));
    }
    return commit_single(&c, KILN_OP_SLICE, &x.id, 1, tx->dtype, tx->rank, od, &p, out);
}

/* ---- shuffle ----------------------------------------------------------------------- */

/* A product of dims as a constant times a sorted multiset of non-constant
 * factors (MUL nodes are flattened), so that equal products are recognized
 * however their dims were grouped: [B, S, 4096] and [B*S, 32, 128]. */
#define PRODUCT_MAX_FACTORS 64

typedef struct product {
    int ok; /* 0: too many factors or the constant overflowed */
    int64_t c;
    int32_t n;
    kiln_expr f[PRODUCT_MAX_FACTORS];
} product;

static void product_add(const kiln_expr_pool *pool, product *pr, kiln_expr e, int depth)
{
    if (!pr->ok)
        return;
    int64_t v;
    if (e < 0 || e >= pool->n) {
        pr->ok = 0;
        return;
    }
    if (kiln_expr_is_const(pool, e, &v)) {
        if (__builtin_mul_overflow(pr->c, v, &pr->c))
            pr->ok = 0;
        return;
    }
    const kiln_expr_node *nd = &pool->nodes[e];
    if (nd->kind == KILN_EXPR_MUL && depth < 16) {
        product_add(pool, pr, nd->a, depth + 1);
        product_add(pool, pr, nd->b, depth + 1);
        return;
    }
    if (pr->n == PRODUCT_MAX_FACTORS) {
        pr->ok = 0;
        return;
    }
    int32_t i = pr->n++;
    while (i > 0 && pr->f[i - 1] > e) {
        pr->f[i] = pr->f[i - 1];
        i--;
    }
    pr->f[i] = e;
}

static void product_of(const kiln_expr_pool *pool, const kiln_expr *dims, int32_t rank, int32_t skip, product *pr)
{
    pr->ok = 1;
    pr->c = 1;
    pr->n = 0;
    for (int32_t i = 0; i < rank; i++)
        if (i != skip)
            product_add(pool, pr, dims[i], 0);
}

static kiln_expr product_expr(layer_ctx *c, const product *pr)
{
    kiln_expr e = cst(c, pr->c);
    for (int32_t i = 0; i < pr->n; i++)
        e = eop(c, KILN_EXPR_MUL, e, pr->f[i]);
    return e;
}

/* Plain left-to-right product, for when a product could not be normalized. */
static kiln_expr plain_product(layer_ctx *c, const kiln_expr *dims, int32_t rank, int32_t skip)
{
    kiln_expr e = cst(c, 1);
    for (int32_t i = 0; i < rank; i++)
        if (i != skip)
            e = eop(c, KILN_EXPR_MUL, e, dims[i]);
    return e;
}

/* num / den exactly when den's factors are a sub-multiset of num's and the
 * constants divide; nonzero on success with *q set. */
static int product_divide(const product *num, const product *den, product *q)
{
    if (!num->ok || !den->ok || den->c == 0 || num->c % den->c != 0)
        return 0;
    q->ok = 1;
    q->c = num->c / den->c;
    q->n = 0;
    int32_t j = 0;
    for (int32_t i = 0; i < num->n; i++) {
        if (j < den->n && den->f[j] == num->f[i])
            j++;
        else
            q->f[q->n++] = num->f[i];
    }
    return j == den->n;
}

static kiln_status check_perm(layer_ctx *c, const char *which, const int32_t *perm, int32_t rank)
{
    uint32_t seen = 0;
    for (int32_t i = 0; i < rank; i++) {
        if (perm[i] < 0 || perm[i] >= rank || (seen & (1u << perm[i])))
            return lfail(c, KILN_ERROR_INVALID_ARGUMENT, "%s transpose is not a permutation of 0..%d (entry %d is %d)",
                         which, rank - 1, i, perm[i]);
        seen |= 1u << perm[i];
    }
    return KILN_OK;
}

void kiln_shuffle_desc_init(kiln_shuffle_desc *desc)
{
    if (!desc)
        return;
    memset(desc, 0, sizeof *desc);
    desc->struct_size = (uint32_t)sizeof *desc;
    desc->abi_version = KILN_API_VERSION;
}

kiln_status kiln_network_add_shuffle(kiln_network *net, const char *name, kiln_tensor x,
                                     const kiln_shuffle_desc *user_desc, kiln_tensor *out)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, "shuffle", &c));
    if (!out || !user_desc)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "desc and out must not be NULL");
    if (user_desc->struct_size < 2 * sizeof(uint32_t))
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT,
                     "desc: struct_size %u is too small (set it up with kiln_shuffle_desc_init)",
                     (unsigned)user_desc->struct_size);
    kiln_shuffle_desc full;
    kiln_shuffle_desc_init(&full);
    KILN_TRY(kiln_api_struct_read(&full, sizeof full, user_desc, "shuffle desc"));
    const kiln_shuffle_desc *desc = &full;
    const kiln_tensor_rec *tx = get_tensor(&c, x, "input", &st);
    if (!tx)
        return st;
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    int32_t rank = tx->rank;
    kiln_expr cur[KILN_MAX_RANK], tmp[KILN_MAX_RANK];
    memcpy(cur, tx->dims, sizeof cur);
    for (int32_t i = 0; i < KILN_MAX_RANK; i++)
        tmp[i] = -1;
    if (desc->has_first_transpose) {
        KILN_TRY(check_perm(&c, "first", desc->first_transpose, rank));
        p.shuffle.has_first = 1;
        for (int32_t i = 0; i < rank; i++) {
            p.shuffle.first[i] = desc->first_transpose[i];
            tmp[i] = cur[desc->first_transpose[i]];
        }
        memcpy(cur, tmp, sizeof cur);
    }
    if (desc->has_reshape) {
        const kiln_dims *r = &desc->reshape;
        if (r->rank < 0 || r->rank > KILN_MAX_RANK)
            return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "reshape rank %d is outside 0..%d", r->rank, KILN_MAX_RANK);
        int32_t infer = -1;
        for (int32_t i = 0; i < r->rank; i++) {
            if (r->d[i] == -1) {
                if (infer >= 0)
                    return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "reshape has more than one -1 (dims %d and %d)",
                                 infer, i);
                infer = i;
                tmp[i] = -1;
            } else if (r->d[i] == 0) {
                if (i >= rank)
                    return lfail(&c, KILN_ERROR_INVALID_ARGUMENT,
                                 "reshape dim %d is 0 (copy) but the input has rank %d", i, rank);
                tmp[i] = cur[i];
            } else if (r->d[i] > 0) {
                tmp[i] = cst(&c, r->d[i]);
            } else {
                return lfail(&c, KILN_ERROR_INVALID_ARGUMENT,
                             "reshape dim %d is %" PRId64 " (expected > 0, 0 to copy, or -1 to infer)", i, r->d[i]);
            }
        }
        product in, others, q;
        product_of(&c.g->exprs, cur, rank, -1, &in);
        product_of(&c.g->exprs, tmp, r->rank, infer, &others);
        kiln_expr pin = in.ok ? product_expr(&c, &in) : plain_product(&c, cur, rank, -1);
        kiln_expr poth = others.ok ? product_expr(&c, &others) : plain_product(&c, tmp, r->rank, infer);
        int64_t vin, voth;
        int cin = is_const(&c, pin, &vin), coth = is_const(&c, poth, &voth);
        if (infer >= 0 && coth && voth == 0)
            return lfail(&c, KILN_ERROR_SHAPE, "cannot infer the -1 dim: the other dims multiply to 0");
        if (infer >= 0) {
            if (product_divide(&in, &others, &q)) {
                tmp[infer] = product_expr(&c, &q);
            } else if (cin && coth) {
                if (voth == 0 || vin % voth != 0)
                    return lfail(&c, KILN_ERROR_SHAPE,
                                 "cannot reshape %" PRId64 " elements: the other dims multiply to %" PRId64, vin, voth);
                tmp[infer] = cst(&c, vin / voth);
            } else {
                tmp[infer] = eop(&c, KILN_EXPR_FLOOR_DIV, pin, poth);
                KILN_TRY(add_constraint(&c, KILN_CONSTRAINT_EQUAL, eop(&c, KILN_EXPR_MUL, tmp[infer], poth), pin,
                                        "element counts before and after the reshape"));
            }
        } else if (pin != poth) {
            if (cin && coth)
                return lfail(&c, KILN_ERROR_SHAPE, "cannot reshape %" PRId64 " elements into %" PRId64, vin, voth);
            if (!(in.ok && others.ok && in.c == others.c && in.n == others.n &&
                  memcmp(in.f, others.f, (size_t)in.n * sizeof in.f[0]) == 0))
                KILN_TRY(add_constraint(&c, KILN_CONSTRAINT_EQUAL, poth, pin,
                                        "element counts before and after the reshape"));
        }
        rank = r->rank;
        memcpy(cur, tmp, sizeof cur);
    }
    KILN_TRY(check_exprs(&c, rank, cur));
    p.shuffle.mid_rank = rank;
    for (int32_t i = 0; i < KILN_MAX_RANK; i++)
        p.shuffle.mid[i] = i < rank ? cur[i] : -1;
    if (desc->has_second_transpose) {
        KILN_TRY(check_perm(&c, "second", desc->second_transpose, rank));
        p.shuffle.has_second = 1;
        for (int32_t i = 0; i < rank; i++) {
            p.shuffle.second[i] = desc->second_transpose[i];
            tmp[i] = cur[desc->second_transpose[i]];
        }
        memcpy(cur, tmp, sizeof cur);
    }
    return commit_single(&c, KILN_OP_SHUFFLE, &x.id, 1, tx->dtype, rank, cur, &p, out);
}

/* ---- gather and cast ------------------------------------------------------------------ */

kiln_status kiln_network_add_gather(kiln_network *net, const char *name, kiln_tensor data, kiln_tensor indices,
                                    int32_t axis, kiln_tensor *out)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, "gather", &c));
    if (!out)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "out is NULL");
    const kiln_tensor_rec *td = get_tensor(&c, data, "data", &st);
    if (!td)
        return st;
    const kiln_tensor_rec *ti = get_tensor(&c, indices, "indices", &st);
    if (!ti)
        return st;
    if (ti->dtype != KILN_DTYPE_I32 && ti->dtype != KILN_DTYPE_I64)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "indices must be i32 or i64, got %s", kiln_dtype_name(ti->dtype));
    int32_t ax = normalize_axis(axis, td->rank);
    if (ax < 0)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "axis %d is out of range for rank %d", axis, td->rank);
    int32_t rank = td->rank - 1 + ti->rank;
    if (rank > KILN_MAX_RANK)
        return lfail(&c, KILN_ERROR_SHAPE, "output rank %d exceeds %d", rank, KILN_MAX_RANK);
    kiln_expr od[KILN_MAX_RANK];
    int32_t k = 0;
    for (int32_t i = 0; i < ax; i++)
        od[k++] = td->dims[i];
    for (int32_t i = 0; i < ti->rank; i++)
        od[k++] = ti->dims[i];
    for (int32_t i = ax + 1; i < td->rank; i++)
        od[k++] = td->dims[i];
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    p.gather.axis = ax;
    int32_t ins[2] = {data.id, indices.id};
    return commit_single(&c, KILN_OP_GATHER, ins, 2, td->dtype, rank, od, &p, out);
}

kiln_status kiln_network_add_cast(kiln_network *net, const char *name, kiln_tensor x, kiln_dtype dtype,
                                  kiln_tensor *out)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, "cast", &c));
    if (!out)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "out is NULL");
    const kiln_tensor_rec *tx = get_tensor(&c, x, "input", &st);
    if (!tx)
        return st;
    if (!dtype_usable(dtype))
        return lfail(&c, (unsigned)dtype < KILN_DTYPE_COUNT ? KILN_ERROR_UNSUPPORTED : KILN_ERROR_INVALID_ARGUMENT,
                     "cannot cast to dtype %s (%d)", kiln_dtype_name(dtype), (int)dtype);
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    p.cast.to = dtype;
    return commit_single(&c, KILN_OP_CAST, &x.id, 1, dtype, tx->rank, tx->dims, &p, out);
}

/* ---- plugins ------------------------------------------------------------------------- */

/* Upper bound on a plugin's outputs, so a broken plugin cannot make us
 * allocate without limit. */

kiln_status kiln_network_add_plugin(kiln_network *net, const char *name, const char *plugin_name, const char *version,
                                    const char *plugin_namespace, const kiln_field *fields, int32_t n_fields,
                                    const kiln_tensor *inputs, int32_t n_inputs, kiln_tensor *outputs,
                                    int32_t max_outputs, int32_t *n_outputs)
{
    layer_ctx c;
    kiln_status st = KILN_OK;
    KILN_TRY(begin_layer(net, name, plugin_name ? plugin_name : "plugin", &c));
    if (!plugin_name || !version || !plugin_namespace)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "plugin name, version and namespace must not be NULL");
    if (n_inputs < 0 || (n_inputs > 0 && !inputs) || n_fields < 0 || (n_fields > 0 && !fields) || max_outputs < 0 ||
        (max_outputs > 0 && !outputs))
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "inconsistent input, field or output arrays");
    if (n_inputs > KILN_PLUGIN_MAX_INPUTS)
        return lfail(&c, KILN_ERROR_INVALID_ARGUMENT, "a plugin layer takes at most %d inputs, got %d",
                     KILN_PLUGIN_MAX_INPUTS, n_inputs);
    if (!net->registry)
        return lfail(&c, KILN_ERROR_PLUGIN, "plugin %s %s (namespace \"%s\"): the network has no registry", plugin_name,
                     version, plugin_namespace);
    kiln_graph *g = c.g;
    /* The plugin's calls below run with a cleared last error so that a
     * failure it did not describe is not blamed on an older message; on
     * success the caller's last error is put back. */
    char saved_error[1024];
    snprintf(saved_error, sizeof saved_error, "%s", kiln_last_error());
    kiln_shape_expr *in_shapes = calloc((size_t)n_inputs + 1, sizeof *in_shapes);
    kiln_dtype *in_types = calloc((size_t)n_inputs + 1, sizeof *in_types);
    int32_t *ins = calloc((size_t)n_inputs + 1, sizeof *ins);
    kiln_plugin *inst = NULL;
    char *strs[4] = {NULL, NULL, NULL, NULL};
    if (!in_shapes || !in_types || !ins) {
        st = lfail(&c, KILN_ERROR_OUT_OF_MEMORY, "out of memory for %d inputs", n_inputs);
        goto done;
    }
    for (int32_t i = 0; i < n_inputs; i++) {
        char role[32];
        snprintf(role, sizeof role, "input %d", i);
        const kiln_tensor_rec *t = get_tensor(&c, inputs[i], role, &st);
        if (!t)
            goto done;
        ins[i] = inputs[i].id;
        in_types[i] = t->dtype;
        in_shapes[i].rank = t->rank;
        memcpy(in_shapes[i].d, t->dims, sizeof t->dims);
    }
    const char *library = NULL;
    const kiln_plugin_creator *creator =
        kiln_registry_find(net->registry, plugin_name, version, plugin_namespace, &library);
    if (!creator) {
        char near[512];
        near[0] = '\0';
        kiln_registry_near_misses(net->registry, plugin_name, version, plugin_namespace, near, sizeof near);
        st = lfail(&c, KILN_ERROR_PLUGIN, "plugin %s %s (namespace \"%s\") is not registered%s%s", plugin_name, version,
                   plugin_namespace, near[0] ? "; registered: " : "", near);
        goto done;
    }
    kiln_clear_error();
    st = kiln_plugin_create(creator, fields, n_fields, &inst);
    if (st != KILN_OK || !inst) {
        if (st == KILN_OK)
            st = kiln_fail(KILN_ERROR_PLUGIN, "plugin %s %s: create returned no instance", plugin_name, version);
        rollback_constraints(&c);
        st = kiln_fail_context(st, "layer \"%s\"", c.name);
        inst = NULL;
        goto done;
    }
    const kiln_plugin_ops *ops = inst->ops;
    if (!ops || !ops->num_outputs || !ops->output_shapes || !ops->output_dtypes || !ops->destroy) {
        st = lfail(&c, KILN_ERROR_PLUGIN,
                   "plugin %s %s: the instance lacks num_outputs, output_shapes, "
                   "output_dtypes or destroy",
                   plugin_name, version);
        goto done;
    }
    int32_t n_out = ops->num_outputs(inst);
    if (n_out < 1 || n_out > KILN_PLUGIN_MAX_OUTPUTS) {
        st = lfail(&c, KILN_ERROR_PLUGIN, "plugin %s %s reports %d outputs (expected 1..%d)", plugin_name, version,
                   n_out, KILN_PLUGIN_MAX_OUTPUTS);
        goto done;
    }
    kiln_shape_expr out_shapes[KILN_PLUGIN_MAX_OUTPUTS];
    kiln_dtype out_types[KILN_PLUGIN_MAX_OUTPUTS];
    char who[256];
    snprintf(who, sizeof who, "%s %s", plugin_name, version);
    unsigned long fails;
    int32_t out_ranks[KILN_PLUGIN_MAX_OUTPUTS];
    kiln_expr out_dims[KILN_PLUGIN_MAX_OUTPUTS][KILN_MAX_RANK];
    memset(out_shapes, 0, sizeof out_shapes);
    for (int32_t o = 0; o < n_out; o++)
        out_types[o] = KILN_DTYPE_COUNT;
    fails = kiln_host_fail_count();
    st = ops->output_shapes(inst, in_shapes, n_inputs, out_shapes, n_out, &g->exprs);
    if (st != KILN_OK) {
        rollback_constraints(&c);
        st = kiln_plugin_error(who, "output_shapes", st, fails);
        st = kiln_fail_context(st, "layer \"%s\"", c.name);
        goto done;
    }
    fails = kiln_host_fail_count();
    st = ops->output_dtypes(inst, in_types, n_inputs, out_types, n_out);
    if (st != KILN_OK) {
        rollback_constraints(&c);
        st = kiln_plugin_error(who, "output_dtypes", st, fails);
        st = kiln_fail_context(st, "layer \"%s\"", c.name);
        goto done;
    }
    for (int32_t o = 0; o < n_out; o++) {
        if (out_shapes[o].rank < 0 || out_shapes[o].rank > KILN_MAX_RANK) {
            st = lfail(&c, KILN_ERROR_PLUGIN, "plugin %s %s: output %d has rank %d", plugin_name, version, o,
                       out_shapes[o].rank);
            goto done;
        }
        for (int32_t i = 0; i < out_shapes[o].rank; i++) {
            kiln_expr e = out_shapes[o].d[i];
            if (e < 0 || e >= g->exprs.n) {
                st = lfail(&c, g->exprs.failed ? KILN_ERROR_OUT_OF_MEMORY : KILN_ERROR_PLUGIN,
                           "plugin %s %s: output %d dim %d is not a valid shape expression (%d)", plugin_name, version,
                           o, i, e);
                goto done;
            }
        }
        if (!dtype_usable(out_types[o])) {
            st = lfail(&c, KILN_ERROR_PLUGIN, "plugin %s %s: output %d has unusable dtype %d", plugin_name, version, o,
                       (int)out_types[o]);
            goto done;
        }
        out_ranks[o] = out_shapes[o].rank;
        for (int32_t i = 0; i < KILN_MAX_RANK; i++)
            out_dims[o][i] = i < out_ranks[o] ? out_shapes[o].d[i] : -1;
    }
    kiln_plugin_rec *recs = realloc(g->plugins, (size_t)(g->n_plugins + 1) * sizeof *recs);
    if (!recs) {
        st = lfail(&c, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    g->plugins = recs;
    strs[0] = kiln_strdup(plugin_name);
    strs[1] = kiln_strdup(version);
    strs[2] = kiln_strdup(plugin_namespace);
    strs[3] = kiln_strdup(library ? library : KILN_BUILTIN_LIBRARY);
    if (!strs[0] || !strs[1] || !strs[2] || !strs[3]) {
        st = lfail(&c, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    p.plugin.index = g->n_plugins;
    kiln_tensor handles[KILN_PLUGIN_MAX_OUTPUTS];
    st = commit_layer(&c, KILN_OP_PLUGIN, ins, n_inputs, n_out, out_types, out_ranks,
                      (const kiln_expr(*)[KILN_MAX_RANK])out_dims, &p, handles, KILN_PLUGIN_MAX_OUTPUTS);
    if (st != KILN_OK)
        goto done;
    kiln_plugin_rec *r = &g->plugins[g->n_plugins++];
    memset(r, 0, sizeof *r);
    r->name = strs[0];
    r->version = strs[1];
    r->plugin_namespace = strs[2];
    r->library = strs[3];
    r->creator = creator;
    r->instance = inst;
    r->blob_version = creator->blob_version;
    inst = NULL;
    memset(strs, 0, sizeof strs);
    for (int32_t o = 0; o < n_out && o < max_outputs; o++)
        outputs[o] = handles[o];
    if (n_outputs)
        *n_outputs = n_out;
    kiln_fail(KILN_OK, "%s", saved_error);
done:
    if (inst)
        inst->ops->destroy(inst);
    for (int i = 0; i < 4; i++)
        free(strs[i]);
    free(in_shapes);
    free(in_types);
    free(ins);
    return st;
}

/* ---- outputs and queries ------------------------------------------------------------------ */

kiln_status kiln_network_mark_output(kiln_network *net, kiln_tensor t, const char *name)
{
    if (!net)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "network is NULL");
    kiln_graph *g = &net->graph;
    if (t.id < 0 || t.id >= g->n_tensors)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "mark_output: tensor id %d is not in this network", t.id);
    kiln_tensor_rec *r = &g->tensors[t.id];
    if (r->flags & KILN_TENSOR_OUTPUT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tensor \"%s\" is already an output", r->name);
    char *new_name = NULL;
    if (name && strcmp(name, r->name) != 0) {
        if (!name[0])
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "output name for tensor \"%s\" is empty", r->name);
        if (kiln_graph_find_tensor(g, name) >= 0)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "cannot name output \"%s\" (tensor \"%s\"): a tensor already has that name", name,
                             r->name);
        int32_t l = kiln_graph_find_layer(g, name);
        if (l >= 0 && l != r->producer)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "cannot name output \"%s\" (tensor \"%s\"): a layer already has that name", name, r->name);
        new_name = kiln_strdup(name);
        if (!new_name)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "renaming output \"%s\"", r->name);
    }
    int32_t *outs = realloc(g->outputs, (size_t)(g->n_outputs + 1) * sizeof *outs);
    if (!outs) {
        free(new_name);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "marking output \"%s\"", r->name);
    }
    g->outputs = outs;
    g->outputs[g->n_outputs++] = t.id;
    r->flags |= KILN_TENSOR_OUTPUT;
    if (new_name) {
        free(r->name);
        r->name = new_name;
    }
    return KILN_OK;
}

kiln_status kiln_network_find_tensor(const kiln_network *net, const char *name, kiln_tensor *out)
{
    if (!net || !name || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_network_find_tensor: NULL argument");
    int32_t t = kiln_graph_find_tensor(&net->graph, name);
    if (t < 0)
        return kiln_fail(KILN_ERROR_NOT_FOUND, "no tensor named \"%s\"", name);
    out->id = t;
    return KILN_OK;
}

kiln_status kiln_network_tensor_info(const kiln_network *net, kiln_tensor t, kiln_dtype *dtype, int32_t *rank)
{
    if (!net)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "network is NULL");
    if (t.id < 0 || t.id >= net->graph.n_tensors)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tensor id %d is not in this network", t.id);
    if (dtype)
        *dtype = net->graph.tensors[t.id].dtype;
    if (rank)
        *rank = net->graph.tensors[t.id].rank;
    return KILN_OK;
}

int32_t kiln_network_num_layers(const kiln_network *net) { return net ? net->graph.n_layers : 0; }
