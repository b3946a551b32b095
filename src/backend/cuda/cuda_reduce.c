/* Op entries of reductions and softmax (kernels in cuda_reduce.cu). */
#ifdef KILN_HAVE_CUDA

#include "cuda_ops.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

kiln_status cuda_run_reduce(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_layer *l = a->layer;
    KILN_TRY(kiln_layer_check_reduce(name, l, a->inputs, a->outputs));
    const kiln_dims *d = &a->inputs[0].dims;
    uint32_t axes = l->p.reduce.axes;
    kcu_reduce_args r;
    memset(&r, 0, sizeof r);
    int64_t st[KILN_MAX_RANK], kept = 1;
    kiln_exec_strides(d, st);
    r.rcount = 1;
    for (int32_t i = 0; i < d->rank; i++) {
        kcu_map *m = (axes & (1u << i)) ? &r.red : &r.kept;
        if (axes & (1u << i))
            r.rcount *= d->d[i];
        else
            kept *= d->d[i];
        /* merge with the previous axis of the same kind when adjacent in memory */
        if (m->rank && m->st[m->rank - 1] == st[i] * d->d[i]) {
            m->dims[m->rank - 1] *= d->d[i];
            m->st[m->rank - 1] = st[i];
        } else {
            m->dims[m->rank] = d->d[i];
            m->st[m->rank++] = st[i];
        }
    }
    if (kiln_exec_count(&a->outputs[0].dims) != kept)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": reduce output has %lld elements, expected %lld", name,
                         (long long)kiln_exec_count(&a->outputs[0].dims), (long long)kept);
    if (kept == 0)
        return KILN_OK;
    for (int32_t i = 0; i < r.red.rank; i++)
        if (r.red.dims[i] == 0)
            r.red.rank = 0; /* empty reduction: the line loop never runs */
    r.in = a->inputs[0].data;
    r.in_dtype = a->inputs[0].dtype;
    r.out = a->outputs[0].data;
    r.out_dtype = a->outputs[0].dtype;
    r.op = l->p.reduce.op;
    r.n_out = kept;
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
