/* The builder's passes, one function each, run in this order by
 * kiln_builder_run (builder.c), and the helpers they share
 * (builder_shared.c). Every pass works on the builder's private copy of the
 * network graph, logs what it did at KILN_LOG_INFO and fails with a
 * one-line message naming the layer, tensor or profile. Passes call the
 * shared helpers and kiln_builder_sweep, never the driver. */
#ifndef KILN_BUILDER_INTERNAL_H
#define KILN_BUILDER_INTERNAL_H

#include <stddef.h>

#include <kiln/builder.h>

#include "core/graph.h"

#include "engine/engine_file.h"

/* Arena offsets and the shared workspace are aligned to this many bytes:
 * the alignment the engine reader requires. */
#define KILN_BUILDER_ALIGN KILN_ENGINE_ARENA_ALIGN

/* 1. The graph can be built for config->backend: at least one output, every
 * dynamic input dim bounded by every profile, plugin layers resolved and
 * accepting their dtypes on the backend. */
kiln_status kiln_builder_validate(const kiln_graph *g, const kiln_build_config *config);

/* ---- shared helpers (builder_shared.c) ---- */

/* Concrete shapes of every tensor at every bound: for each profile its min,
 * opt and max (or one set when the network has no profile). Evaluating also
 * checks every constraint and that no dim is negative; errors name the
 * profile, the bound and the layer. */
typedef struct kiln_bound_shapes {
    int32_t n_bounds;
    int32_t n_tensors;
    kiln_dims *dims;  /* n_bounds × n_tensors, row per bound */
    int32_t *profile; /* n_bounds: the profile of each row (-1: none) */
    int32_t *which;   /* n_bounds: 0 min, 1 opt, 2 max */
} kiln_bound_shapes;

kiln_status kiln_builder_eval_bounds(const kiln_graph *g, kiln_bound_shapes *out);
void kiln_bound_shapes_free(kiln_bound_shapes *b);
const char *kiln_builder_bound_name(int which); /* "min", "opt", "max" */

/* Removes layers and compacts the graph. redirect has n_layers entries:
 * redirect[i] == i keeps layer i, -1 removes it, j != i removes it and hands
 * its shape constraints to layer j (a fused layer). Then every kept layer
 * whose outputs do not reach a network output is removed too. Tensors no
 * longer referenced by a layer, the inputs or the outputs are dropped,
 * plugin records no layer uses are destroyed, and every index (layer inputs
 * and outputs, graph inputs/outputs, symbols, producers, constraint layers,
 * plugin indices) is remapped. redirect may be NULL (keep all). Counts of
 * what went away are added to *removed_layers / *removed_tensors (may be
 * NULL). */
kiln_status kiln_builder_sweep(kiln_graph *g, const int32_t *redirect, int32_t *removed_layers,
                               int32_t *removed_tensors);

/* 3. Dead-layer removal (kiln_builder_sweep with nothing forced). */
kiln_status kiln_builder_remove_dead(kiln_graph *g);

/* 4. Constant folding on the CPU backend. */
kiln_status kiln_builder_fold_constants(kiln_graph *g);

/* 5. Elementwise-chain fusion into KILN_OP_FUSED layers. */
kiln_status kiln_builder_fuse_elementwise(kiln_graph *g);

/* 6. Plugin workspaces at every profile's max shapes. */
kiln_status kiln_builder_size_workspace(kiln_graph *g);

/* 7. Activation arena offsets by liveness. */
kiln_status kiln_builder_plan_memory(kiln_graph *g);

/* 8. Target and tactics (pass_tactics.c): the backend and its GPU
 * architectures, each layer's tactic (timed on the device where the
 * backend has one here), GPU matmul scratch in the workspace. */
kiln_status kiln_builder_select_tactics(kiln_graph *g, const kiln_build_config *config);

/* Appends layer names to buf as "a", "b", ... (at most `max` names, then
 * "and N more"); used by the passes' log lines. */
void kiln_builder_name_list(char *buf, size_t size, const char *const *names, int32_t n, int32_t max);

/* Bytes rounded up to KILN_BUILDER_ALIGN; nonzero on overflow. */
int kiln_builder_align(size_t bytes, size_t *out);

/* Whether a plugin's ops table is long enough to hold `member`. */
#define KILN_OPS_HAS(ops, member) \
    ((ops) && (ops)->struct_size >= offsetof(kiln_plugin_ops, member) + sizeof((ops)->member) && (ops)->member)

#endif
