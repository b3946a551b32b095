/* The matmul shape rules shared by the CPU and CUDA backends: rank-1 A is a
 * row and rank-1 B a column (that axis is dropped from the output), the last
 * two axes may be transposed, and batch axes broadcast numpy-style. */
#ifndef KILN_BACKEND_MATMUL_SHAPE_H
#define KILN_BACKEND_MATMUL_SHAPE_H

#include "core/graph.h"

typedef struct kiln_matmul_shape {
    int64_t m, n, k;
    int32_t ta, tb; /* effective transposes (vectors: none) */
    int64_t lda, ldb;
    int32_t nb;                                   /* output batch rank */
    int64_t bd[KILN_MAX_RANK];                    /* output batch dims */
    int64_t as[KILN_MAX_RANK], bs[KILN_MAX_RANK]; /* batch strides in elements, 0 = broadcast */
    int64_t batches, a_batches, b_batches;
} kiln_matmul_shape;

/* Derives the shape of layer `l` (named `name` in errors) from its operand
 * and output dims; fails when they do not agree. */
kiln_status kiln_matmul_shape_init(const char *name, const kiln_layer *l, const kiln_dims *da, const kiln_dims *db,
                                   const kiln_dims *dc, kiln_matmul_shape *s);

/* Element offsets of A and B for output batch b. */
void kiln_matmul_batch_offsets(const kiln_matmul_shape *s, int64_t b, int64_t *ao, int64_t *bo);

#endif
