/* Op entries of data movement: concat, slice, shuffle, gather, cast
 * (kernels in cuda_movement.cu). Copies work on element sizes, so they
 * serve every dtype. */
#ifdef KILN_HAVE_CUDA

#include "backend/cuda/cuda_ops.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* A map from a row-major shape to offsets, size-1 axes dropped and axes
 * that step through memory as one merged (fewer divisions per element). */
static void map_init(kcu_map *m, int32_t rank, const int64_t *dims, const int64_t *st)
{
    memset(m, 0, sizeof *m);
    for (int32_t i = 0; i < rank; i++) {
        if (dims[i] == 1)
            continue;
        if (m->rank && m->st[m->rank - 1] == st[i] * dims[i]) {
            m->dims[m->rank - 1] *= dims[i];
            m->st[m->rank - 1] = st[i];
        } else {
            m->dims[m->rank] = dims[i];
            m->st[m->rank++] = st[i];
        }
    }
    if (m->rank == 0) {
        m->rank = 1;
        m->dims[0] = 1;
        m->st[0] = 0;
    }
}

static int esize_ok(size_t esize) { return esize == 1 || esize == 2 || esize == 4 || esize == 8; }

kiln_status cuda_run_concat(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_exec_tensor *o = &a->outputs[0];
    int64_t outer, inner, total;
    KILN_TRY(kiln_layer_plan_concat(name, a->layer, a->inputs, a->outputs, &outer, &inner, &total));
    int32_t axis = a->layer->p.concat.axis;
    size_t esize = kiln_dtype_size(o->dtype);
    if (!esize_ok(esize))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": concat of %s", name, kiln_dtype_name(o->dtype));
    int64_t col = 0;
    for (int32_t k = 0; k < a->layer->n_inputs; k++) {
        int64_t w = a->inputs[k].dims.d[axis] * inner;
        KCU_CHECK(a, kcu_launch_band(a->inputs[k].data, o->data, outer, w, total * inner, col, (int32_t)esize,
                                     a->device->sms, a->stream));
        col += w;
    }
    return KILN_OK;
}

kiln_status cuda_run_slice(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_exec_tensor *x = &a->inputs[0], *o = &a->outputs[0];
    int64_t step[KILN_MAX_RANK], base;
    int empty;
    KILN_TRY(kiln_layer_plan_slice(name, a->layer, x, o, &base, step, &empty));
    size_t esize = kiln_dtype_size(x->dtype);
    if (!esize_ok(esize))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": slice of %s", name, kiln_dtype_name(x->dtype));
    if (empty)
        return KILN_OK;
    kcu_map dm, sm;
    map_init(&dm, x->dims.rank, o->dims.d, step);
    memset(&sm, 0, sizeof sm);
    KCU_CHECK(a, kcu_launch_copy(x->data, o->data, kiln_exec_count(&o->dims), base, &dm, &sm, (int32_t)esize,
                                 a->device->sms, a->stream));
    return KILN_OK;
}

/* transpose, reshape, transpose in one pass without a temporary: an output
 * coordinate gives the mid tensor's linear index through the second
 * transpose; that index, as coordinates of the first transpose's result,
 * gives the input offset. */
kiln_status cuda_run_shuffle(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_exec_tensor *x = &a->inputs[0], *o = &a->outputs[0];
    const kiln_layer_params *p = &a->layer->p;
    int first, second;
    KILN_TRY(kiln_layer_check_shuffle(name, a->layer, x, o, &first, &second));
    int64_t count = kiln_exec_count(&x->dims);
    size_t esize = kiln_dtype_size(x->dtype);
    if (!esize_ok(esize))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": shuffle of %s", name, kiln_dtype_name(x->dtype));
    if (count == 0)
        return KILN_OK;
    if (!first && !second) {
        if (o->data != x->data)
            CU_CHECK(name, cudaMemcpyAsync(o->data, x->data, (size_t)count * esize, cudaMemcpyDeviceToDevice,
                                           (cudaStream_t)a->stream));
        return KILN_OK;
    }
    /* output -> mid linear index */
    int64_t dst_st[KILN_MAX_RANK] = {0};
    if (second) {
        int64_t mid[KILN_MAX_RANK], mid_st[KILN_MAX_RANK];
        for (int32_t i = 0; i < o->dims.rank; i++)
            mid[p->shuffle.second[i]] = o->dims.d[i];
        kiln_dims md = {.rank = o->dims.rank};
        memcpy(md.d, mid, sizeof(int64_t) * (size_t)o->dims.rank);
        kiln_exec_strides(&md, mid_st);
        for (int32_t i = 0; i < o->dims.rank; i++)
            dst_st[i] = mid_st[p->shuffle.second[i]];
    } else {
        kiln_exec_strides(&o->dims, dst_st);
    }
    kcu_map dm, sm;
    map_init(&dm, o->dims.rank, o->dims.d, dst_st);
    memset(&sm, 0, sizeof sm);
    if (first) {
        /* mid linear index = linear index of transpose(x, first) */
        int64_t xs[KILN_MAX_RANK], td[KILN_MAX_RANK], ts[KILN_MAX_RANK];
        kiln_exec_strides(&x->dims, xs);
        for (int32_t i = 0; i < x->dims.rank; i++) {
            td[i] = x->dims.d[p->shuffle.first[i]];
            ts[i] = xs[p->shuffle.first[i]];
        }
        map_init(&sm, x->dims.rank, td, ts);
    }
    KCU_CHECK(a, kcu_launch_copy(x->data, o->data, count, 0, &dm, &sm, (int32_t)esize, a->device->sms, a->stream));
    return KILN_OK;
}

kiln_status cuda_run_gather(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_exec_tensor *x = &a->inputs[0], *ix = &a->inputs[1], *o = &a->outputs[0];
    int32_t axis = a->layer->p.gather.axis;
    int64_t outer, n_idx, inner, dim;
    KILN_TRY(kiln_layer_plan_gather(name, a->layer, a->inputs, a->outputs, &outer, &n_idx, &inner, &dim));
    size_t esize = kiln_dtype_size(x->dtype);
    if (!esize_ok(esize))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": gather of %s", name, kiln_dtype_name(x->dtype));
    if (dim <= 0 && outer * n_idx * inner > 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": gather from an empty axis %d", name, (int)axis);
    int32_t index = a->graph && a->layer >= a->graph->layers && a->layer < a->graph->layers + a->graph->n_layers
                        ? (int32_t)(a->layer - a->graph->layers)
                        : -1;
    KCU_CHECK(a, kcu_launch_gather(x->data, ix->data, ix->dtype == KILN_DTYPE_I64, o->data, outer, n_idx, inner, dim,
                                   (int32_t)esize, a->device->err, a->device->report_dev, index, a->device->sms,
                                   a->stream));
    return KILN_OK;
}

kiln_status cuda_run_cast(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_exec_tensor *x = &a->inputs[0], *o = &a->outputs[0];
    int64_t n;
    KILN_TRY(kiln_layer_check_cast(name, a->layer, a->inputs, a->outputs, &n));
    if (n == 0)
        return KILN_OK;
    if (x->dtype == o->dtype) {
        if (o->data != x->data)
            CU_CHECK(name, cudaMemcpyAsync(o->data, x->data, (size_t)n * kiln_dtype_size(x->dtype),
                                           cudaMemcpyDeviceToDevice, (cudaStream_t)a->stream));
        return KILN_OK;
    }
    KCU_CHECK(a, kcu_launch_cast(x->data, x->dtype, o->data, o->dtype, n, a->device->sms, a->stream));
    return KILN_OK;
}

#endif
