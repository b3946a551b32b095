/* Pass 8: target and tactics. Records the backend and, for CUDA, the GPU
 * architectures the engine is for; resets every tactic; reserves each
 * matmul's cuBLASLt scratch in the per-context workspace; and where the
 * backend has a device here, times each matmul's candidates up to profile
 * 0's max shapes and stores the fastest (the backend table's tune_layer;
 * the CUDA backend times several row counts up to the max, each bucket
 * getting its own choice).
 * Without a device the heuristic's first choice stays (tactic -1), and the
 * build says so. */
#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder/builder_internal.h"
#include "backend/backend.h"
#include "core/error.h"

/* The architectures a CUDA engine records: the config's (`kiln build
 * --gpu-arch`), else the GPU's present here, else those this kiln's CUDA
 * kernels are configured for (CMake's KILN_CUDA_ARCHITECTURES, also set in
 * a build without CUDA). */
static void target_archs(kiln_graph *g, const kiln_build_config *config, const kiln_backend_i *b)
{
    int32_t arch = 0;
    if (config->n_gpu_archs > 0) {
        g->n_gpu_archs = config->n_gpu_archs;
        memcpy(g->gpu_archs, config->gpu_archs, (size_t)config->n_gpu_archs * sizeof g->gpu_archs[0]);
    } else if (b && b->device_arch && b->device_arch(&arch)) {
        g->n_gpu_archs = 1;
        g->gpu_archs[0] = arch;
    } else {
        int32_t ptx[8];
        g->n_gpu_archs = kiln_gpu_archs_parse(KILN_CUDA_ARCHITECTURES, g->gpu_archs, ptx, 8);
    }
}

/* Times each matmul given the max shapes of the first shape set that has
 * them (profile 0, or the one set of a static network). */
static kiln_status tune_matmuls(kiln_graph *g, const kiln_backend_i *be)
{
    kiln_bound_shapes b;
    KILN_TRY(kiln_builder_eval_bounds(g, &b));
    int32_t row = 0;
    for (int32_t r = 0; r < b.n_bounds; r++)
        if (b.which[r] == 2 && b.profile[r] <= 0) {
            row = r;
            break;
        }
    const kiln_dims *dims = &b.dims[(size_t)row * (size_t)b.n_tensors];
    void *tuner = NULL;
    kiln_status s = be->tuner_create(&tuner);
    int32_t tuned = 0;
    for (int32_t l = 0; s == KILN_OK && l < g->n_layers; l++) {
        kiln_layer *L = &g->layers[l];
        if (L->op != KILN_OP_MATMUL || L->n_inputs < 2 || L->n_outputs < 1)
            continue;
        int32_t ta = L->inputs[0], tb = L->inputs[1], tc = L->outputs[0];
        kiln_exec_tensor in[2] = {{NULL, g->tensors[ta].dtype, dims[ta]}, {NULL, g->tensors[tb].dtype, dims[tb]}};
        kiln_exec_tensor out = {NULL, g->tensors[tc].dtype, dims[tc]};
        int64_t tactic = -1;
        s = be->tune_layer(tuner, L, in, &out, &tactic);
        if (s != KILN_OK) {
            s = kiln_fail_context(s, "tactics: layer \"%s\"", L->name);
            break;
        }
        L->tactic = tactic;
        tuned++;
        kiln_log(KILN_LOG_INFO, "tactics: layer \"%s\" (matmul): tactic %llx", L->name, (unsigned long long)tactic);
    }
    if (tuner)
        be->tuner_destroy(tuner);
    kiln_bound_shapes_free(&b);
    if (s == KILN_OK)
        kiln_log(KILN_LOG_INFO, "tactics: timed %d matmul%s on this GPU", (int)tuned, tuned == 1 ? "" : "s");
    return s;
}

kiln_status kiln_builder_select_tactics(kiln_graph *g, const kiln_build_config *config)
{
    for (int32_t i = 0; i < g->n_layers; i++)
        g->layers[i].tactic = -1;
    g->backend = config->backend;
    g->n_gpu_archs = 0;
    memset(g->gpu_archs, 0, sizeof g->gpu_archs);
    /* NULL when this kiln was built without the backend: the engine is
     * still built, for a machine that has it. */
    const kiln_backend_i *be = kiln_backend_find(config->backend);
    if (config->backend == KILN_BACKEND_CUDA)
        target_archs(g, config, be);
    char archs[64] = "";
    size_t pos = 0;
    for (int32_t i = 0; i < g->n_gpu_archs && pos < sizeof archs; i++) {
        int w = snprintf(archs + pos, sizeof archs - pos, "%ssm_%d", i ? "," : " for ", g->gpu_archs[i]);
        if (w < 0)
            break;
        pos += (size_t)w;
    }
    kiln_log(KILN_LOG_INFO, "tactics: backend %s%s, default kernel for all %d layers", kiln_backend_name(g->backend),
             archs, g->n_layers);
    if (config->backend != KILN_BACKEND_CUDA)
        return KILN_OK;

    /* Each context gets its own cuBLASLt scratch in the shared workspace
     * region of its block, so two contexts running matmuls on two streams
     * never share one. */
    int32_t n_matmul = 0;
    for (int32_t l = 0; l < g->n_layers; l++) {
        kiln_layer *L = &g->layers[l];
        if (L->op != KILN_OP_MATMUL)
            continue;
        n_matmul++;
        if (L->workspace < KILN_GPU_MATMUL_WORKSPACE)
            L->workspace = KILN_GPU_MATMUL_WORKSPACE;
        if (g->workspace_size < KILN_GPU_MATMUL_WORKSPACE)
            g->workspace_size = KILN_GPU_MATMUL_WORKSPACE;
    }
    if (be && be->tune_layer && be->device_arch && be->device_arch(NULL))
        return n_matmul ? tune_matmuls(g, be) : KILN_OK;
    kiln_log(KILN_LOG_WARNING, "no CUDA GPU here: using heuristic tactics (%d matmul%s)", (int)n_matmul,
             n_matmul == 1 ? "" : "s");
    return KILN_OK;
}
