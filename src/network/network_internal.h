/* The network object behind include/kiln/network.h. */
#ifndef KILN_NETWORK_INTERNAL_H
#define KILN_NETWORK_INTERNAL_H

#include "core/graph.h"

struct kiln_network {
    kiln_graph graph;
    kiln_registry *registry; /* borrowed */
    int32_t auto_names;      /* counter for generated layer names */
};

#endif
