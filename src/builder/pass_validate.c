/* Passes 1 and 2: validation, and shapes at every profile's min/opt/max. */
#include "builder_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/dtype.h"
#include "../core/error.h"

/* ---- pass 1: validation ----------------------------------------------------------------- */

/* Every dynamic dim (a dim whose expression is not a constant) of every
 * input needs min/opt/max in every profile. The network API rejects
 * inconsistent bounds when they are set; here we only catch missing ones,
 * which the network stores with a rank that does not match or negative
 * dims. */
static kiln_status check_profiles(const kiln_graph *g)
{
    for (int32_t i = 0; i < g->n_inputs; i++) {
        int32_t t = g->inputs[i];
        if (t < 0 || t >= g->n_tensors)
            return kiln_fail(KILN_ERROR_INTERNAL, "network input %d refers to tensor %d of %d", i,
                             t, g->n_tensors);
        const kiln_tensor_rec *r = &g->tensors[t];
        for (int32_t a = 0; a < r->rank; a++) {
            int64_t v;
            if (kiln_expr_is_const(&g->exprs, r->dims[a], &v))
                continue;
            if (g->n_profiles == 0)
                return kiln_fail(KILN_ERROR_SHAPE,
                                 "input \"%s\" dim %d is dynamic but the network has no "
                                 "optimization profile", r->name, a);
            for (int32_t p = 0; p < g->n_profiles; p++) {
                const kiln_profile_dims *pd = &g->profiles[(size_t)p * (size_t)g->n_inputs + (size_t)i];
                int set = pd->min.rank == r->rank && pd->opt.rank == r->rank &&
                          pd->max.rank == r->rank && pd->min.d[a] >= 0 && pd->opt.d[a] >= 0 &&
                          pd->max.d[a] >= 0;
                if (!set)
                    return kiln_fail(KILN_ERROR_SHAPE,
                                     "profile %d: input \"%s\" dim %d is dynamic but has no bounds",
                                     p, r->name, a);
            }
        }
    }
    return KILN_OK;
}

static int cuda_native_dtype(kiln_dtype t)
{
    return t == KILN_DTYPE_F32 || t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16;
}

/* Native layers on CUDA compute in f32/f16/bf16; the only integer tensors
 * they take are gather indices. */
static kiln_status check_native_cuda(const kiln_graph *g, const kiln_layer *l)
{
    for (int32_t k = 0; k < l->n_inputs + l->n_outputs; k++) {
        int is_input = k < l->n_inputs;
        int32_t t = is_input ? l->inputs[k] : l->outputs[k - l->n_inputs];
        kiln_dtype d = g->tensors[t].dtype;
        if (cuda_native_dtype(d))
            continue;
        if (l->op == KILN_OP_GATHER && is_input && k == 1 &&
            (d == KILN_DTYPE_I32 || d == KILN_DTYPE_I64))
            continue;
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "layer \"%s\" (%s): %s \"%s\" has dtype %s, which the cuda backend does "
                         "not support for this layer (f32, f16, bf16)",
                         l->name, kiln_op_name(l->op), is_input ? "input" : "output",
                         g->tensors[t].name, kiln_dtype_name(d));
    }
    return KILN_OK;
}

static kiln_status check_plugin_layer(const kiln_graph *g, const kiln_layer *l,
                                      kiln_backend backend)
{
    int32_t pi = l->p.plugin.index;
    if (pi < 0 || pi >= g->n_plugins)
        return kiln_fail(KILN_ERROR_INTERNAL, "layer \"%s\": plugin record %d of %d", l->name, pi,
                         g->n_plugins);
    const kiln_plugin_rec *rec = &g->plugins[pi];
    if (!rec->instance || !rec->instance->ops)
        return kiln_fail(KILN_ERROR_PLUGIN,
                         "layer \"%s\": plugin %s %s (namespace \"%s\") is not resolved", l->name,
                         rec->name, rec->version, rec->plugin_namespace ? rec->plugin_namespace : "");
    const kiln_plugin_ops *ops = rec->instance->ops;
    if (!(ops->backends & KILN_BACKEND_BIT(backend)))
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "layer \"%s\": plugin %s %s (namespace \"%s\") has no %s implementation",
                         l->name, rec->name, rec->version,
                         rec->plugin_namespace ? rec->plugin_namespace : "", kiln_backend_name(backend));
    int32_t n = l->n_inputs + l->n_outputs;
    kiln_tensor_desc *descs = calloc(n > 0 ? (size_t)n : 1, sizeof *descs);
    if (!descs)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\": checking dtypes", l->name);
    for (int32_t k = 0; k < n; k++) {
        const kiln_tensor_rec *t =
            &g->tensors[k < l->n_inputs ? l->inputs[k] : l->outputs[k - l->n_inputs]];
        descs[k].struct_size = (uint32_t)sizeof descs[k];
        descs[k].abi_version = KILN_PLUGIN_ABI_VERSION;
        descs[k].dtype = t->dtype;
        descs[k].format = KILN_FORMAT_LINEAR;
        descs[k].dims.rank = t->rank;
    }
    int ok = KILN_OPS_HAS(ops, supports) &&
             ops->supports(rec->instance, backend, descs, l->n_inputs, l->n_outputs);
    kiln_status s = KILN_OK;
    if (!ok) {
        char list[256] = "";
        size_t pos = 0;
        for (int32_t k = 0; k < n && pos < sizeof list; k++) {
            int w = snprintf(list + pos, sizeof list - pos, "%s%s", k == 0 ? "" :
                             k == l->n_inputs ? " -> " : ", ", kiln_dtype_name(descs[k].dtype));
            if (w < 0)
                break;
            pos += (size_t)w;
        }
        s = kiln_fail(KILN_ERROR_UNSUPPORTED,
                      "layer \"%s\": plugin %s %s does not support dtypes (%s) on %s", l->name,
                      rec->name, rec->version, list, kiln_backend_name(backend));
    }
    free(descs);
    return s;
}

kiln_status kiln_builder_validate(const kiln_graph *g, const kiln_build_config *config)
{
    if (g->n_outputs < 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "the network has no outputs (mark at least one with "
                         "kiln_network_mark_output)");
    for (int32_t i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] < 0 || g->outputs[i] >= g->n_tensors)
            return kiln_fail(KILN_ERROR_INTERNAL, "network output %d refers to tensor %d of %d", i,
                             g->outputs[i], g->n_tensors);
    KILN_TRY(check_profiles(g));
    int32_t n_plugin_layers = 0;
    for (int32_t i = 0; i < g->n_layers; i++) {
        const kiln_layer *l = &g->layers[i];
        for (int32_t k = 0; k < l->n_inputs + l->n_outputs; k++) {
            int32_t t = k < l->n_inputs ? l->inputs[k] : l->outputs[k - l->n_inputs];
            if (t < 0 || t >= g->n_tensors)
                return kiln_fail(KILN_ERROR_INTERNAL, "layer \"%s\": tensor index %d of %d",
                                 l->name, t, g->n_tensors);
        }
        if (l->op == KILN_OP_PLUGIN) {
            n_plugin_layers++;
            KILN_TRY(check_plugin_layer(g, l, config->backend));
        } else if (config->backend == KILN_BACKEND_CUDA && l->op != KILN_OP_CONSTANT) {
            KILN_TRY(check_native_cuda(g, l));
        }
    }
    kiln_log(KILN_LOG_INFO,
             "validation: %d inputs, %d outputs, %d layers (%d plugin layers), %d tensors, "
             "%d profiles, backend %s",
             g->n_inputs, g->n_outputs, g->n_layers, n_plugin_layers, g->n_tensors, g->n_profiles,
             kiln_backend_name(config->backend));
    return KILN_OK;
}
