/* The broadcast walk shared by the CPU and CUDA elementwise kernels. */
#include "backend/broadcast.h"

#include <string.h>

#include "core/error.h"

kiln_status kiln_broadcast_init(kiln_broadcast *b, const char *layer, const kiln_dims *out, const kiln_exec_tensor *ins,
                                int32_t n)
{
    memset(b, 0, sizeof *b);
    int32_t r = out->rank;
    int64_t st[KILN_FUSED_MAX_INPUTS][KILN_MAX_RANK];
    if (n < 0 || n > KILN_FUSED_MAX_INPUTS)
        return kiln_fail(KILN_ERROR_INTERNAL, "layer \"%s\": %d elementwise operands (at most %d)", layer, (int)n,
                         KILN_FUSED_MAX_INPUTS);
    for (int32_t k = 0; k < n; k++) {
        const kiln_dims *d = &ins[k].dims;
        if (d->rank > r)
            return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": input %d has rank %d, output rank %d", layer, (int)k,
                             (int)d->rank, (int)r);
        int64_t acc = 1;
        for (int32_t i = r - 1; i >= 0; i--) {
            int32_t j = i - (r - d->rank);
            if (j < 0) {
                st[k][i] = 0;
                continue;
            }
            if (d->d[j] == out->d[i])
                st[k][i] = out->d[i] == 1 ? 0 : acc;
            else if (d->d[j] == 1)
                st[k][i] = 0;
            else
                return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": input %d dim %d is %lld, cannot broadcast to %lld",
                                 layer, (int)k, (int)j, (long long)d->d[j], (long long)out->d[i]);
            acc *= d->d[j];
        }
    }
    for (int32_t i = 0; i < r; i++) {
        if (out->d[i] == 1)
            continue;
        int32_t m = b->rank;
        int mergeable = m > 0;
        for (int32_t k = 0; k < n && mergeable; k++)
            mergeable = b->st[k][m - 1] == st[k][i] * out->d[i];
        if (mergeable) {
            b->dims[m - 1] *= out->d[i];
            for (int32_t k = 0; k < n; k++)
                b->st[k][m - 1] = st[k][i];
        } else {
            b->dims[m] = out->d[i];
            for (int32_t k = 0; k < n; k++)
                b->st[k][m] = st[k][i];
            b->rank++;
        }
    }
    return KILN_OK;
}
