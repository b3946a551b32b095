/* One table of the native ops: name, how many inputs and outputs each
 * takes, and its attributes (where each lives in kiln_layer_params, its
 * type and valid range). It drives the engine writer and reader, the engine
 * description (`kiln inspect`) and the JSON network parser, so an op or an
 * attribute is declared once. */
#ifndef KILN_CORE_OP_TABLE_H
#define KILN_CORE_OP_TABLE_H

#include <stddef.h>

#include "core/graph.h"

typedef enum kiln_attr_type {
    KILN_ATTR_I32,      /* one int32_t at offset, in lo..hi (hi per `bound`) */
    KILN_ATTR_AXES,     /* uint32_t bit mask of axes of the first input */
    KILN_ATTR_I64_RANK, /* int64_t[rank of the first input], each >= lo */
    KILN_ATTR_PERM,     /* optional permutation; int32_t presence flag at aux */
    KILN_ATTR_EXPRS,    /* up to KILN_MAX_RANK exprs; int32_t count at aux */
    KILN_ATTR_STEPS,    /* the fused program (kiln_layer_params.fused) */
    KILN_ATTR_TYPE_COUNT
} kiln_attr_type;

/* What an attribute's upper bound depends on. */
typedef enum kiln_attr_bound {
    KILN_BOUND_FIXED = 0, /* hi as written */
    KILN_BOUND_RANK,      /* rank of the first input − 1 (axes, permutations) */
    KILN_BOUND_MID_RANK,  /* shuffle: the reshape's rank − 1 */
    KILN_BOUND_PLUGINS,   /* number of plugin records − 1 */
    KILN_BOUND_COUNT
} kiln_attr_bound;

typedef struct kiln_op_attr {
    const char *key; /* member of the plan's "params" */
    kiln_attr_type type;
    size_t offset;  /* into kiln_layer_params */
    size_t aux;     /* PERM: presence flag; EXPRS: count */
    int64_t lo, hi; /* valid values (I32, I64_RANK lo) */
    kiln_attr_bound bound;
    const char *(*value_name)(int32_t); /* I32 enums: the value's name, or NULL */
} kiln_op_attr;

#define KILN_OP_MAX_ATTRS 3

typedef struct kiln_op_info {
    const char *name;               /* "matmul"; the JSON network's "op" */
    int32_t min_inputs, max_inputs; /* max -1: any number */
    int32_t min_outputs, max_outputs;
    int32_t declarable; /* may be written in a network JSON file */
    int32_t n_attrs;
    kiln_op_attr attrs[KILN_OP_MAX_ATTRS];
} kiln_op_info;

/* The row of op, or NULL when op is not a kiln_op. */
const kiln_op_info *kiln_op_info_get(kiln_op op);

/* The op whose name is `name`, or -1. */
int32_t kiln_op_find(const char *name);

/* Upper bound of attribute a for a layer whose first input has rank
 * `rank`, whose shuffle reshape has rank `mid_rank`, in a graph with
 * n_plugins plugin records. */
int64_t kiln_op_attr_hi(const kiln_op_attr *a, int32_t rank, int32_t mid_rank, int32_t n_plugins);

#endif
