/* Op entries of reductions and softmax (kernels in cuda_reduce.cu). */
#ifdef KILN_HAVE_CUDA

#include "cuda_ops.h"

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
    const char *name = layer_name(a);
    const kiln_layer *l = a->layer;
    if (l->n_inputs != 1 || l->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": softmax needs 1 input, 1 output", name);
    const kiln_dims *d = &a->inputs[0].dims;
    int32_t axis = l->p.softmax.axis;
    if (axis < 0 || axis >= d->rank)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": softmax axis %d outside rank %d", name,
                         (int)axis, (int)d->rank);
    if (!kiln_dtype_is_float(a->inputs[0].dtype) || !kiln_dtype_is_float(a->outputs[0].dtype))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": softmax on %s", name,
                         kiln_dtype_name(a->inputs[0].dtype));
    int64_t count = kiln_exec_count(d);
    if (kiln_exec_count(&a->outputs[0].dims) != count)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": softmax input and output sizes differ", name);
    if (count == 0)
        return KILN_OK;
    int64_t len = d->d[axis], inner = 1;
    for (int32_t i = axis + 1; i < d->rank; i++)
        inner *= d->d[i];
    KCU_CHECK(a, kcu_launch_softmax(a->inputs[0].data, a->inputs[0].dtype, a->outputs[0].data,
                                    a->outputs[0].dtype, count / len, len, inner, a->device->sms, a->stream));
    return KILN_OK;
}

#endif
