/* Pass 4: constant folding. A native layer whose inputs are all constants
 * runs once now, on the CPU reference kernels, and its output becomes a
 * constant tensor; layers after it may then fold in turn. */
#include "builder/builder_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

static int is_output(const kiln_graph *g, int32_t t)
{
    for (int32_t i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == t)
            return 1;
    return 0;
}

/* Static dims of a tensor; 0 when one is not a constant expression. */
static int static_dims(const kiln_graph *g, const kiln_tensor_rec *t, kiln_dims *d)
{
    memset(d, 0, sizeof *d);
    d->rank = t->rank;
    for (int32_t a = 0; a < t->rank; a++)
        if (!kiln_expr_is_const(&g->exprs, t->dims[a], &d->d[a]) || d->d[a] < 0)
            return 0;
    return 1;
}

/* Whether layer l can fold: not a plugin (its enqueue may have effects or
 * need a device), every input a constant with data, every output static and
 * not a network output (outputs are written into caller buffers at run
 * time, which a constant tensor never is). */
static int foldable(const kiln_graph *g, const kiln_layer *l)
{
    if (l->op == KILN_OP_PLUGIN || l->op == KILN_OP_CONSTANT || l->op == KILN_OP_FUSED || l->n_inputs == 0 ||
        l->n_outputs != 1)
        return 0;
    for (int32_t k = 0; k < l->n_inputs; k++) {
        const kiln_tensor_rec *t = &g->tensors[l->inputs[k]];
        if (!(t->flags & KILN_TENSOR_CONSTANT))
            return 0;
    }
    kiln_dims d;
    return !is_output(g, l->outputs[0]) && static_dims(g, &g->tensors[l->outputs[0]], &d);
}

static kiln_status fold_layer(kiln_graph *g, const kiln_layer *l)
{
    kiln_exec_tensor *in = calloc((size_t)l->n_inputs, sizeof *in);
    if (!in)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\": folding", l->name);
    for (int32_t k = 0; k < l->n_inputs; k++) {
        const kiln_tensor_rec *t = &g->tensors[l->inputs[k]];
        in[k].data = t->data;
        in[k].dtype = t->dtype;
        static_dims(g, t, &in[k].dims);
    }
    kiln_tensor_rec *o = &g->tensors[l->outputs[0]];
    kiln_exec_tensor out;
    out.dtype = o->dtype;
    static_dims(g, o, &out.dims);
    size_t bytes = 0;
    kiln_status s = kiln_dims_bytes(&out.dims, o->dtype, &bytes);
    /* One extra byte so a zero-element result still owns a buffer. */
    out.data = s == KILN_OK && bytes < SIZE_MAX ? malloc(bytes + 1) : NULL;
    if (!out.data) {
        free(in);
        if (s != KILN_OK)
            return kiln_fail_context(s, "layer \"%s\": constant folding", l->name);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\": folding %zu bytes", l->name, bytes);
    }
    kiln_cpu_args args;
    memset(&args, 0, sizeof args);
    args.graph = g;
    args.layer = l;
    args.inputs = in;
    args.outputs = &out;
    args.reference = 1;
    s = kiln_cpu_run_layer(&args);
    free(in);
    if (s != KILN_OK) {
        free(out.data);
        return kiln_fail_context(s, "constant folding");
    }
    o->flags |= KILN_TENSOR_CONSTANT;
    o->data = out.data;
    o->data_size = bytes;
    o->data_owned = 1;
    o->producer = -1;
    return KILN_OK;
}

kiln_status kiln_builder_fold_constants(kiln_graph *g)
{
    int32_t nl = g->n_layers;
    int32_t *redirect = malloc((size_t)(nl > 0 ? nl : 1) * sizeof *redirect);
    const char **folded = calloc((size_t)(nl > 0 ? nl : 1), sizeof *folded);
    if (!redirect || !folded) {
        free(redirect);
        free(folded);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "constant folding over %d layers", nl);
    }
    int32_t n_folded = 0;
    size_t folded_bytes = 0;
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < nl && s == KILN_OK; i++) {
        redirect[i] = i;
        const kiln_layer *l = &g->layers[i];
        if (!foldable(g, l))
            continue;
        s = fold_layer(g, l);
        /* A layer the CPU kernels do not cover runs unfolded at run time. */
        if (s == KILN_ERROR_UNSUPPORTED) {
            kiln_log(KILN_LOG_DEBUG, "constant folding: skipped \"%s\": %s", l->name, kiln_last_error());
            s = KILN_OK;
            continue;
        }
        if (s != KILN_OK)
            break;
        redirect[i] = -1;
        folded[n_folded++] = l->name;
        folded_bytes += g->tensors[l->outputs[0]].data_size;
    }
    if (s == KILN_OK) {
        char names[512] = "";
        kiln_builder_name_list(names, sizeof names, folded, n_folded, 8);
        int32_t removed_layers = 0, removed_tensors = 0;
        s = kiln_builder_sweep(g, redirect, &removed_layers, &removed_tensors);
        if (s == KILN_OK && n_folded > 0)
            kiln_log(KILN_LOG_INFO,
                     "constant folding: folded %d layers (%s) into %zu bytes of constants; "
                     "%d layers and %d tensors dropped",
                     n_folded, names, folded_bytes, removed_layers, removed_tensors);
        else if (s == KILN_OK)
            kiln_log(KILN_LOG_INFO, "constant folding: no layer has only constant inputs");
    }
    free(redirect);
    free(folded);
    return s;
}
