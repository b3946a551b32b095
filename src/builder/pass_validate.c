/* Passes 1 and 2: validation, and shapes at every profile's min/opt/max. */
#include "builder/builder_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "plugin/plugin_internal.h"

/* ---- pass 1: validation ----------------------------------------------------------------- */

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
        if (l->op == KILN_OP_GATHER && is_input && k == 1 && (d == KILN_DTYPE_I32 || d == KILN_DTYPE_I64))
            continue;
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "layer \"%s\" (%s): %s \"%s\" has dtype %s, which the cuda backend does "
                         "not support for this layer (f32, f16, bf16)",
                         l->name, kiln_op_name(l->op), is_input ? "input" : "output", g->tensors[t].name,
                         kiln_dtype_name(d));
    }
    return KILN_OK;
}

kiln_status kiln_builder_validate(const kiln_graph *g, const kiln_build_config *config)
{
    if (g->n_outputs < 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "the network has no outputs (mark at least one with "
                                                      "kiln_network_mark_output)");
    for (int32_t i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] < 0 || g->outputs[i] >= g->n_tensors)
            return kiln_fail(KILN_ERROR_INTERNAL, "network output %d refers to tensor %d of %d", i, g->outputs[i],
                             g->n_tensors);
    KILN_TRY(kiln_graph_check_profiles(g));
    int32_t n_plugin_layers = 0;
    for (int32_t i = 0; i < g->n_layers; i++) {
        const kiln_layer *l = &g->layers[i];
        for (int32_t k = 0; k < l->n_inputs + l->n_outputs; k++) {
            int32_t t = k < l->n_inputs ? l->inputs[k] : l->outputs[k - l->n_inputs];
            if (t < 0 || t >= g->n_tensors)
                return kiln_fail(KILN_ERROR_INTERNAL, "layer \"%s\": tensor index %d of %d", l->name, t, g->n_tensors);
        }
        if (l->op == KILN_OP_PLUGIN) {
            n_plugin_layers++;
            KILN_TRY(kiln_plugin_check_layer(g, l, config->backend));
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
