/* The builder's entry points: the pass driver and the public kiln_build*. */
#include "builder/builder_internal.h"
#include "builder/builder_passes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/api_struct.h"
#include "core/atomic_write.h"
#include "core/error.h"
#include "core/file.h"
#include "engine/engine_file.h"
#include "network/network_internal.h"

void kiln_build_config_init(kiln_build_config *config)
{
    if (!config)
        return;
    memset(config, 0, sizeof *config);
    config->struct_size = (uint32_t)sizeof *config;
    config->abi_version = KILN_API_VERSION;
    config->backend = KILN_BACKEND_CPU;
}

void kiln_buffer_free(kiln_buffer *buf)
{
    if (!buf)
        return;
    free(buf->data);
    buf->data = NULL;
    buf->size = 0;
}

/* ---- the pass driver ----------------------------------------------------------------- */

/* The caller's config, read only as far as its struct_size reaches, so a
 * caller compiled against an older (shorter) kiln_build_config still works. */
static kiln_status read_config(const kiln_build_config *in, kiln_build_config *cfg)
{
    kiln_build_config_init(cfg);
    if (!in)
        return KILN_OK;
    KILN_TRY(kiln_api_struct_read(cfg, sizeof *cfg, in, "build config"));
    if ((unsigned)cfg->backend >= KILN_BACKEND_COUNT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "build config: backend %d is unknown", (int)cfg->backend);
    if (cfg->n_gpu_archs < 0 || cfg->n_gpu_archs > 8)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "build config: n_gpu_archs %d is outside 0..8", cfg->n_gpu_archs);
    for (int32_t i = 0; i < cfg->n_gpu_archs; i++)
        if (cfg->gpu_archs[i] <= 0)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "build config: gpu_archs[%d] = %d is not an architecture", i,
                             cfg->gpu_archs[i]);
    return KILN_OK;
}

static void report(const kiln_build_config *cfg, double fraction, const char *what)
{
    if (cfg->progress)
        cfg->progress(cfg->progress_user, fraction, what);
}

/* Shape checks run as their own pass (bound shapes are not kept: later
 * passes change the tensor set and evaluate again). */
static kiln_status check_shapes(kiln_graph *g)
{
    kiln_bound_shapes b;
    KILN_TRY(kiln_builder_eval_bounds(g, &b));
    kiln_log(KILN_LOG_INFO,
             "shape check: %d tensors at %d shape sets (%d profiles x min/opt/max), "
             "%d constraints hold",
             g->n_tensors, b.n_bounds, g->n_profiles, g->n_constraints);
    kiln_bound_shapes_free(&b);
    return KILN_OK;
}

kiln_status kiln_builder_run(const kiln_graph *net, const kiln_build_config *config, kiln_graph *out)
{
    if (!net || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_builder_run: %s is NULL",
                         !net ? "network graph" : "output graph");
    kiln_build_config cfg;
    KILN_TRY(read_config(config, &cfg));

    enum { N_PASSES = 8 };
    static const char *const names[N_PASSES] = {
        "validation", "shape check", "dead-layer removal", "constant folding",
        "fusion",     "workspace",   "memory plan",        "tactics",
    };
    kiln_graph g;
    /* the network's weights are not copied: the engine writer reads them where they are */
    KILN_TRY(kiln_graph_copy_borrowing(&g, net));
    kiln_status s = KILN_OK;
    for (int i = 0; i < N_PASSES && s == KILN_OK; i++) {
        report(&cfg, (double)i / N_PASSES, names[i]);
        switch (i) {
        case 0: s = kiln_builder_validate(&g, &cfg); break;
        case 1: s = check_shapes(&g); break;
        case 2: s = kiln_builder_remove_dead(&g); break;
        case 3:
            if (cfg.flags & KILN_BUILD_NO_CONSTANT_FOLDING)
                kiln_log(KILN_LOG_INFO, "constant folding: skipped (turned off)");
            else
                s = kiln_builder_fold_constants(&g);
            break;
        case 4:
            if (cfg.flags & KILN_BUILD_NO_FUSION)
                kiln_log(KILN_LOG_INFO, "fusion: skipped (turned off)");
            else
                s = kiln_builder_fuse_elementwise(&g);
            break;
        case 5: s = kiln_builder_size_workspace(&g); break;
        case 6: s = kiln_builder_plan_memory(&g); break;
        default: s = kiln_builder_select_tactics(&g, &cfg); break;
        }
    }
    if (s != KILN_OK) {
        kiln_graph_free(&g);
        return s;
    }
    report(&cfg, 1.0, "done");
    *out = g;
    return KILN_OK;
}

/* ---- public API ------------------------------------------------------------------------ */

kiln_status kiln_build(const kiln_network *net, const kiln_build_config *config, kiln_buffer *out)
{
    if (!net || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_build: %s is NULL", !net ? "network" : "output buffer");
    kiln_graph g;
    KILN_TRY(kiln_builder_run(&net->graph, config, &g));
    kiln_buffer buf = {NULL, 0};
    kiln_status s = kiln_engine_write(&g, &buf);
    kiln_graph_free(&g);
    if (s != KILN_OK)
        return s;
    kiln_log(KILN_LOG_INFO, "engine: %zu bytes", buf.size);
    *out = buf;
    return KILN_OK;
}

kiln_status kiln_build_to_file(const kiln_network *net, const kiln_build_config *config, const char *path)
{
    if (!net || !path)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_build_to_file: %s is NULL", !net ? "network" : "path");
    /* Refused before the build, which may take long. */
    KILN_TRY(kiln_file_check_output(path));
    kiln_graph g;
    KILN_TRY(kiln_builder_run(&net->graph, config, &g));
    /* streamed: the weights are written from the network's constants,
     * never gathered into one image in memory */
    kiln_status s = kiln_engine_write_file(&g, path);
    kiln_graph_free(&g);
    if (s == KILN_OK)
        kiln_log(KILN_LOG_INFO, "engine: wrote \"%s\"", path);
    return s;
}
