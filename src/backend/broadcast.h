/* The broadcast walk shared by the CPU and CUDA elementwise kernels. */
#ifndef KILN_BACKEND_BROADCAST_H
#define KILN_BACKEND_BROADCAST_H

#include "backend/cpu/cpu_backend.h"

/* Each operand's element strides over the output shape (0 on broadcast
 * axes), with size-1 axes dropped and an axis merged into the next one when
 * every operand steps through both as through one axis: the fewest loops
 * that visit the output in order. */
typedef struct kiln_broadcast {
    int32_t rank; /* merged axes; 0 when the output has one element or none */
    int64_t dims[KILN_MAX_RANK];
    int64_t st[KILN_FUSED_MAX_INPUTS][KILN_MAX_RANK];
} kiln_broadcast;

/* n <= KILN_FUSED_MAX_INPUTS operands. Fails, naming `layer`, when an
 * operand cannot broadcast to `out`. */
kiln_status kiln_broadcast_init(kiln_broadcast *b, const char *layer, const kiln_dims *out, const kiln_exec_tensor *ins,
                                int32_t n);

#endif
