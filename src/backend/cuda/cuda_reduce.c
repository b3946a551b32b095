/* Op entries of reductions and softmax (kernels in cuda_reduce.cu). */
#ifdef KILN_HAVE_CUDA

#include "backend/cuda/cuda_ops.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* kiln_reduce_plan's maps as the kernel's (a map of rank 0 sends every
 * index to offset 0). */
static void map_from(kcu_map *m, int32_t n, const int64_t *dims, const int64_t *st)
{
    m->rank = n;
    for (int32_t i = 0; i < n; i++) {
        m->dims[i] = dims[i];
        m->st[i] = st[i];
    }
}

kiln_status cuda_run_reduce(const kiln_cuda_args *a)
{
    kiln_reduce_plan g;
    KILN_TRY(kiln_layer_plan_reduce(layer_name(a), a->layer, a->inputs, a->outputs, &g));
    if (g.kept == 0)
        return KILN_OK;
    kcu_reduce_args r;
    memset(&r, 0, sizeof r);
    map_from(&r.kept, g.n_kept, g.kept_dims, g.kept_st);
    map_from(&r.red, g.n_red, g.red_dims, g.red_st);
    r.rcount = g.rcount;
    for (int32_t i = 0; i < r.red.rank; i++)
        if (r.red.dims[i] == 0)
            r.red.rank = 0; /* empty reduction: the line loop never runs */
    r.in = a->inputs[0].data;
    r.in_dtype = a->inputs[0].dtype;
    r.out = a->outputs[0].data;
    r.out_dtype = a->outputs[0].dtype;
    r.op = a->layer->p.reduce.op;
    r.n_out = g.kept;
    KCU_CHECK(a, kcu_launch_reduce(&r, a->device->sms, a->stream));
    return KILN_OK;
}

kiln_status cuda_run_softmax(const kiln_cuda_args *a)
{
    int64_t count, len, inner;
    KILN_TRY(kiln_layer_plan_softmax(layer_name(a), a->layer, a->inputs, a->outputs, &count, &len, &inner));
    if (count == 0)
        return KILN_OK;
    KCU_CHECK(a, kcu_launch_softmax(a->inputs[0].data, a->inputs[0].dtype, a->outputs[0].data, a->outputs[0].dtype,
                                    count / len, len, inner, a->device->sms, a->stream));
    return KILN_OK;
}

#endif
