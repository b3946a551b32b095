/* The builder's passes over a graph. */
#ifndef KILN_BUILDER_PASSES_H
#define KILN_BUILDER_PASSES_H

#include <kiln/builder.h>
#include "core/graph.h"

/* Copies `net` into *out and runs every pass on the copy: validation,
 * shape checks at every profile's min/opt/max, dead-layer removal, constant
 * folding, elementwise fusion, workspace sizing, memory planning and (for
 * CUDA) tactic selection. Logs each pass at KILN_LOG_INFO. The copy's
 * constants borrow net's data (folded ones are its own): free *out before
 * net. */
kiln_status kiln_builder_run(const kiln_graph *net, const kiln_build_config *config, kiln_graph *out);

#endif
