/* The matmul shape rules shared by the CPU and CUDA backends. */
#include "backend/matmul_shape.h"

#include <string.h>

#include "core/error.h"

static kiln_status batch_strides(const char *name, const kiln_dims *d, int32_t mat_rank, int64_t mat_size,
                                 const kiln_matmul_shape *s, int64_t *strides, int64_t *count, const char *which)
{
    int32_t r = d->rank - mat_rank;
    if (r > s->nb)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": matmul %s has more batch axes than the output", name, which);
    int64_t acc = mat_size;
    *count = 1;
    for (int32_t i = s->nb - 1; i >= 0; i--) {
        int32_t j = i - (s->nb - r);
        if (j < 0) {
            strides[i] = 0;
            continue;
        }
        if (d->d[j] == s->bd[i])
            strides[i] = s->bd[i] == 1 ? 0 : acc;
        else if (d->d[j] == 1)
            strides[i] = 0;
        else
            return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": matmul %s batch dim %d is %lld, output has %lld", name,
                             which, (int)j, (long long)d->d[j], (long long)s->bd[i]);
        acc *= d->d[j];
        *count *= d->d[j];
    }
    return KILN_OK;
}

kiln_status kiln_matmul_shape_init(const char *name, const kiln_layer *l, const kiln_dims *da, const kiln_dims *db,
                                   const kiln_dims *dc, kiln_matmul_shape *s)
{
    memset(s, 0, sizeof *s);
    if (da->rank < 1 || db->rank < 1)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": matmul operands must have rank >= 1", name);
    int a_vec = da->rank == 1, b_vec = db->rank == 1;
    int64_t k2;
    if (a_vec) {
        s->m = 1;
        s->k = da->d[0];
        s->lda = s->k;
    } else {
        s->ta = l->p.matmul.transpose_a != 0;
        int64_t r0 = da->d[da->rank - 2], r1 = da->d[da->rank - 1];
        s->m = s->ta ? r1 : r0;
        s->k = s->ta ? r0 : r1;
        s->lda = r1;
    }
    if (b_vec) {
        k2 = db->d[0];
        s->n = 1;
        s->ldb = 1;
    } else {
        s->tb = l->p.matmul.transpose_b != 0;
        int64_t r0 = db->d[db->rank - 2], r1 = db->d[db->rank - 1];
        k2 = s->tb ? r1 : r0;
        s->n = s->tb ? r0 : r1;
        s->ldb = r1;
    }
    if (k2 != s->k)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": matmul inner dims differ (%lld vs %lld)", name,
                         (long long)s->k, (long long)k2);
    s->nb = dc->rank - (a_vec ? 0 : 1) - (b_vec ? 0 : 1);
    if (s->nb < 0 || (!a_vec && dc->d[s->nb] != s->m) || (!b_vec && dc->d[dc->rank - 1] != s->n))
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": matmul output shape does not match %lldx%lld", name,
                         (long long)s->m, (long long)s->n);
    s->batches = 1;
    for (int32_t i = 0; i < s->nb; i++) {
        s->bd[i] = dc->d[i];
        s->batches *= dc->d[i];
    }
    KILN_TRY(batch_strides(name, da, a_vec ? 1 : 2, s->m * s->k, s, s->as, &s->a_batches, "A"));
    KILN_TRY(batch_strides(name, db, b_vec ? 1 : 2, s->k * s->n, s, s->bs, &s->b_batches, "B"));
    return KILN_OK;
}

void kiln_matmul_batch_offsets(const kiln_matmul_shape *s, int64_t b, int64_t *ao, int64_t *bo)
{
    *ao = 0;
    *bo = 0;
    for (int32_t i = s->nb - 1; i >= 0; i--) {
        int64_t c = b % s->bd[i];
        b /= s->bd[i];
        *ao += c * s->as[i];
        *bo += c * s->bs[i];
    }
}
