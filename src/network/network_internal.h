/* The network object behind include/kiln/network.h. */
#ifndef KILN_NETWORK_INTERNAL_H
#define KILN_NETWORK_INTERNAL_H

#include "core/graph.h"

struct kiln_network {
    kiln_graph graph;
    kiln_registry *registry; /* borrowed */
    int32_t auto_names;      /* counter for generated layer names */
};

/* kiln_network_add_constant without the copy: on success the network owns
 * `data` (malloc'd, at least the constant's bytes) and frees it; on
 * failure the caller still does. Builds of large checkpoints hand their
 * converted weights over instead of holding them twice. */
kiln_status kiln_network_add_constant_take(kiln_network *net, const char *name, kiln_dtype dtype, const kiln_dims *dims,
                                           void *data, kiln_tensor *out);

#endif
