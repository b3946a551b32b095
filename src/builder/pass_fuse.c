/* Pass 5: elementwise-chain fusion.
 *
 * A tree of BINARY/UNARY layers whose intermediate results each have one
 * consumer layer, are not network outputs, have the output's dtype and the
 * output's exact dim expressions (so no intermediate is broadcast: each
 * external input broadcasts straight to the output shape, as the fused
 * kernel does) becomes one KILN_OP_FUSED layer at the position of the
 * tree's root (its last layer; every external input is produced before any
 * member, so that position is a valid schedule).
 *
 * Naming: the fused layer is called "fused(a+b+c)" after the original
 * layers in step order, and steps[i].src_layer is i, the position of the
 * step's original name in that list — the original layer indices do not
 * survive the build, so `kiln inspect` recovers names from the layer name.
 */
#include "builder/builder_internal.h"

#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"

typedef struct fuse_state {
    kiln_graph *g;
    int32_t *producer;     /* per tensor: producing layer or -1 */
    int32_t *consumers;    /* per tensor: number of distinct consuming layers */
    unsigned char *is_out; /* per tensor: a network output */
    int32_t *owner;        /* per layer: root of the fused group, or -1 */
} fuse_state;

static int eligible(const kiln_graph *g, const kiln_layer *l)
{
    if ((l->op != KILN_OP_BINARY && l->op != KILN_OP_UNARY) || l->n_outputs != 1 ||
        l->n_inputs != (l->op == KILN_OP_BINARY ? 2 : 1))
        return 0;
    if (!kiln_dtype_is_float(g->tensors[l->outputs[0]].dtype))
        return 0;
    for (int32_t k = 0; k < l->n_inputs; k++)
        if (!kiln_dtype_is_float(g->tensors[l->inputs[k]].dtype))
            return 0;
    return 1;
}

static int same_shape(const kiln_tensor_rec *a, const kiln_tensor_rec *b)
{
    if (a->rank != b->rank)
        return 0;
    for (int32_t i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return 0;
    return 1;
}

static int in_group(const int32_t *members, int32_t n, int32_t layer)
{
    for (int32_t i = 0; i < n; i++)
        if (members[i] == layer)
            return 1;
    return 0;
}

/* External inputs of a group: tensors its members read that no member
 * produces, in first-use order over the members as listed. */
static int32_t group_externals(const fuse_state *st, const int32_t *members, int32_t n, int32_t *ext, int32_t cap)
{
    int32_t n_ext = 0;
    for (int32_t i = 0; i < n; i++) {
        const kiln_layer *l = &st->g->layers[members[i]];
        for (int32_t k = 0; k < l->n_inputs; k++) {
            int32_t t = l->inputs[k];
            if (in_group(members, n, st->producer[t]))
                continue;
            int seen = 0;
            for (int32_t e = 0; e < n_ext && e < cap; e++)
                seen |= ext[e] == t;
            if (seen)
                continue;
            if (n_ext < cap)
                ext[n_ext] = t;
            n_ext++;
        }
    }
    return n_ext;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Grows the group rooted at `root` as far as the rules and limits allow;
 * returns the member count. */
static int32_t grow_group(const fuse_state *st, int32_t root, int32_t *members)
{
    const kiln_graph *g = st->g;
    const kiln_tensor_rec *out = &g->tensors[g->layers[root].outputs[0]];
    int32_t n = 1;
    int32_t ext[KILN_FUSED_MAX_INPUTS + 2];
    members[0] = root;
    for (int32_t m = 0; m < n; m++) {
        const kiln_layer *l = &g->layers[members[m]];
        for (int32_t k = 0; k < l->n_inputs && n < KILN_FUSED_MAX_STEPS; k++) {
            int32_t t = l->inputs[k];
            int32_t p = st->producer[t];
            const kiln_tensor_rec *r = &g->tensors[t];
            if (p < 0 || st->owner[p] >= 0 || in_group(members, n, p) || !eligible(g, &g->layers[p]) ||
                st->consumers[t] != 1 || st->is_out[t] || r->dtype != out->dtype || !same_shape(r, out))
                continue;
            members[n++] = p;
            if (group_externals(st, members, n, ext, KILN_FUSED_MAX_INPUTS + 2) > KILN_FUSED_MAX_INPUTS)
                n--;
        }
    }
    return n;
}

/* Rewrites the root layer into the fused layer of `members` (sorted). */
static kiln_status rewrite_root(fuse_state *st, int32_t *members, int32_t n)
{
    kiln_graph *g = st->g;
    int32_t root = members[n - 1];
    int32_t ext[KILN_FUSED_MAX_INPUTS];
    int32_t n_ext = group_externals(st, members, n, ext, KILN_FUSED_MAX_INPUTS);

    size_t name_len = sizeof "fused()";
    for (int32_t i = 0; i < n; i++)
        name_len += strlen(g->layers[members[i]].name) + 1;
    char *name = malloc(name_len);
    int32_t *inputs = malloc((size_t)n_ext * sizeof *inputs);
    if (!name || !inputs) {
        free(name);
        free(inputs);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "fusing layer \"%s\"", g->layers[root].name);
    }
    strcpy(name, "fused(");
    for (int32_t i = 0; i < n; i++) {
        if (i)
            strcat(name, "+");
        strcat(name, g->layers[members[i]].name);
    }
    strcat(name, ")");
    memcpy(inputs, ext, (size_t)n_ext * sizeof *inputs);

    kiln_layer_params p;
    memset(&p, 0, sizeof p);
    p.fused.n_steps = n;
    for (int32_t i = 0; i < n; i++) {
        const kiln_layer *l = &g->layers[members[i]];
        kiln_fused_step *s = &p.fused.steps[i];
        int32_t operand[2] = {0, 0};
        for (int32_t k = 0; k < l->n_inputs; k++) {
            int32_t t = l->inputs[k];
            int32_t step = -1;
            for (int32_t j = 0; j < i; j++)
                if (g->layers[members[j]].outputs[0] == t)
                    step = j;
            if (step >= 0) {
                operand[k] = n_ext + step;
            } else {
                for (int32_t e = 0; e < n_ext; e++)
                    if (ext[e] == t)
                        operand[k] = e;
            }
        }
        s->is_binary = l->op == KILN_OP_BINARY;
        s->op = s->is_binary ? (int32_t)l->p.binary.op : (int32_t)l->p.unary.op;
        s->a = operand[0];
        /* b is unused by a unary step; a copy of a keeps every operand a
         * valid index for readers that check them all. */
        s->b = s->is_binary ? operand[1] : operand[0];
        s->src_layer = i;
    }

    kiln_layer *l = &g->layers[root];
    free(l->name);
    free(l->inputs);
    l->name = name;
    l->inputs = inputs;
    l->n_inputs = n_ext;
    l->op = KILN_OP_FUSED;
    l->p = p;
    return KILN_OK;
}

kiln_status kiln_builder_fuse_elementwise(kiln_graph *g)
{
    int32_t nl = g->n_layers, nt = g->n_tensors;
    fuse_state st = {g, NULL, NULL, NULL, NULL};
    st.producer = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *st.producer);
    st.consumers = calloc((size_t)(nt > 0 ? nt : 1), sizeof *st.consumers);
    st.is_out = calloc((size_t)(nt > 0 ? nt : 1), 1);
    st.owner = malloc((size_t)(nl > 0 ? nl : 1) * sizeof *st.owner);
    int32_t *redirect = malloc((size_t)(nl > 0 ? nl : 1) * sizeof *redirect);
    kiln_status s = KILN_OK;
    if (!st.producer || !st.consumers || !st.is_out || !st.owner || !redirect)
        s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "fusion over %d layers", nl);
    for (int32_t t = 0; s == KILN_OK && t < nt; t++)
        st.producer[t] = -1;
    for (int32_t i = 0; s == KILN_OK && i < g->n_outputs; i++)
        st.is_out[g->outputs[i]] = 1;
    for (int32_t i = 0; s == KILN_OK && i < nl; i++) {
        const kiln_layer *l = &g->layers[i];
        st.owner[i] = -1;
        redirect[i] = i;
        for (int32_t k = 0; k < l->n_outputs; k++)
            st.producer[l->outputs[k]] = i;
        for (int32_t k = 0; k < l->n_inputs; k++) {
            int dup = 0;
            for (int32_t j = 0; j < k; j++)
                dup |= l->inputs[j] == l->inputs[k];
            if (!dup)
                st.consumers[l->inputs[k]]++;
        }
    }

    int32_t n_groups = 0, n_fused_layers = 0;
    int32_t members[KILN_FUSED_MAX_STEPS];
    /* Roots first (reverse order), so each group is as large as it can be. */
    for (int32_t i = nl - 1; s == KILN_OK && i >= 0; i--) {
        if (st.owner[i] >= 0 || !eligible(g, &g->layers[i]))
            continue;
        int32_t n = grow_group(&st, i, members);
        if (n < 2)
            continue;
        qsort(members, (size_t)n, sizeof members[0], cmp_i32);
        for (int32_t m = 0; m < n; m++) {
            st.owner[members[m]] = i;
            redirect[members[m]] = i;
        }
        s = rewrite_root(&st, members, n);
        if (s == KILN_OK) {
            kiln_log(KILN_LOG_INFO, "fusion: \"%s\": %d steps, %d inputs", g->layers[i].name, n, g->layers[i].n_inputs);
            n_groups++;
            n_fused_layers += n;
        }
    }
    if (s == KILN_OK) {
        int32_t removed_layers = 0, removed_tensors = 0;
        s = kiln_builder_sweep(g, redirect, &removed_layers, &removed_tensors);
        if (s == KILN_OK && n_groups > 0)
            kiln_log(KILN_LOG_INFO,
                     "fusion: %d elementwise layers fused into %d layers (%d intermediate "
                     "tensors dropped)",
                     n_fused_layers, n_groups, removed_tensors);
        else if (s == KILN_OK)
            kiln_log(KILN_LOG_INFO, "fusion: no elementwise chain to fuse");
    }
    free(st.producer);
    free(st.consumers);
    free(st.is_out);
    free(st.owner);
    free(redirect);
    return s;
}
