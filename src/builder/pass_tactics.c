/* Pass 8b: CUDA targets and matmul tactics. Runs after
 * kiln_builder_select_tactics (which records the backend and resets every
 * tactic): reserves each matmul's cuBLASLt scratch in the per-context
 * workspace, records the GPU architectures this library holds code for when
 * the config names none, and on a machine with a GPU times the cuBLASLt
 * heuristic's candidates for each matmul at profile 0's opt shapes and
 * stores the fastest. Without a GPU the heuristic's first choice stays
 * (tactic -1), and the build says so. */
#include <stdlib.h>
#include <string.h>

#include "builder_internal.h"
#include "../core/error.h"
#ifdef KILN_HAVE_CUDA
#include "../backend/cuda/cuda_backend.h"
#endif

#ifdef KILN_HAVE_CUDA
/* KILN_CUDA_ARCHITECTURES is CMake's list ("90", "80;90-real", ...): the
 * architectures this library's kernels exist for. */
static void library_archs(kiln_graph *g)
{
    const char *p = KILN_CUDA_ARCHITECTURES;
    int32_t n = 0;
    while (*p && n < 8) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end != p && v > 0 && v < 1000) {
            int dup = 0;
            for (int32_t i = 0; i < n; i++)
                dup |= g->gpu_archs[i] == (int32_t)v;
            if (!dup)
                g->gpu_archs[n++] = (int32_t)v;
        }
        while (*end && *end != ';' && *end != ',' && *end != ' ')
            end++;
        while (*end == ';' || *end == ',' || *end == ' ')
            end++;
        if (end == p)
            break;
        p = end;
    }
    if (n > 0) {
        for (int32_t i = n; i < 8; i++)
            g->gpu_archs[i] = 0;
        g->n_gpu_archs = n;
    }
}

/* Times each matmul at the opt shapes of the first shape set that has
 * them (profile 0, or the one set of a static network). */
static kiln_status tune_matmuls(kiln_graph *g)
{
    kiln_bound_shapes b;
    KILN_TRY(kiln_builder_eval_bounds(g, &b));
    int32_t row = 0;
    for (int32_t r = 0; r < b.n_bounds; r++)
        if (b.which[r] == 1 && b.profile[r] <= 0) {
            row = r;
            break;
        }
    const kiln_dims *dims = &b.dims[(size_t)row * (size_t)b.n_tensors];
    kiln_cuda_device *dev = NULL;
    kiln_status s = kiln_cuda_device_create(&dev);
    int32_t tuned = 0;
    for (int32_t l = 0; s == KILN_OK && l < g->n_layers; l++) {
        kiln_layer *L = &g->layers[l];
        if (L->op != KILN_OP_MATMUL || L->n_inputs < 2 || L->n_outputs < 1)
            continue;
        int32_t ta = L->inputs[0], tb = L->inputs[1], tc = L->outputs[0];
        kiln_exec_tensor a = {NULL, g->tensors[ta].dtype, dims[ta]};
        kiln_exec_tensor bt = {NULL, g->tensors[tb].dtype, dims[tb]};
        kiln_exec_tensor c = {NULL, g->tensors[tc].dtype, dims[tc]};
        int64_t tactic = -1;
        s = kiln_cuda_matmul_tune(dev, L, &a, &bt, &c, &tactic);
        if (s != KILN_OK) {
            s = kiln_fail_context(s, "tactics: layer \"%s\"", L->name);
            break;
        }
        L->tactic = tactic;
        tuned++;
        kiln_log(KILN_LOG_INFO, "tactics: layer \"%s\" (matmul): cuBLASLt candidate %lld",
                 L->name, (long long)tactic);
    }
    kiln_cuda_device_destroy(dev);
    kiln_bound_shapes_free(&b);
    if (s == KILN_OK)
        kiln_log(KILN_LOG_INFO, "tactics: timed %d matmul%s on this GPU", (int)tuned,
                 tuned == 1 ? "" : "s");
    return s;
}
#endif

/* cuBLASLt scratch per matmul launch. Each context gets its own in the
 * shared workspace region of its block, so two contexts running matmuls
 * on two streams never share one. The same figure as the kernels'
 * KILN_CUDA_CUBLASLT_WORKSPACE, here so that a kiln built without CUDA
 * plans cuda engines the same way. */
#define MATMUL_WORKSPACE ((size_t)32 << 20)
#ifdef KILN_HAVE_CUDA
_Static_assert(MATMUL_WORKSPACE == KILN_CUDA_CUBLASLT_WORKSPACE,
               "pass_tactics.c reserves what cuBLASLt is given");
#endif

kiln_status kiln_builder_tune_tactics(kiln_graph *g, const kiln_build_config *config)
{
    if (config->backend != KILN_BACKEND_CUDA)
        return KILN_OK;
    int32_t n_matmul = 0;
    for (int32_t l = 0; l < g->n_layers; l++) {
        kiln_layer *L = &g->layers[l];
        if (L->op != KILN_OP_MATMUL)
            continue;
        n_matmul++;
        if (L->workspace < MATMUL_WORKSPACE)
            L->workspace = MATMUL_WORKSPACE;
        if (g->workspace_size < MATMUL_WORKSPACE)
            g->workspace_size = MATMUL_WORKSPACE;
    }
#ifdef KILN_HAVE_CUDA
    if (config->n_gpu_archs == 0)
        library_archs(g);
    if (kiln_cuda_can_tune())
        return n_matmul ? tune_matmuls(g) : KILN_OK;
#endif
    kiln_log(KILN_LOG_WARNING, "no CUDA GPU here: using heuristic tactics (%d matmul%s)",
             (int)n_matmul, n_matmul == 1 ? "" : "s");
    return KILN_OK;
}
