/* The layer checks and plugin call shared by the CPU and CUDA backends. */
#include "backend/layer_check.h"

#include <kiln/kiln.h>

#include <stddef.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "plugin/plugin_internal.h"

kiln_status kiln_layer_check_binary(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                    const kiln_exec_tensor *out)
{
    if (l->n_inputs != 2 || l->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": binary needs 2 inputs, 1 output", name);
    kiln_binary_op op = l->p.binary.op;
    if ((unsigned)op >= KILN_BINARY_OP_COUNT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": unknown binary op %d", name, (int)op);
    kiln_dtype t = out[0].dtype;
    if (in[0].dtype != t || in[1].dtype != t)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": binary inputs are %s and %s, output %s", name,
                         kiln_dtype_name(in[0].dtype), kiln_dtype_name(in[1].dtype), kiln_dtype_name(t));
    return KILN_OK;
}

kiln_status kiln_layer_check_unary(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                   const kiln_exec_tensor *out)
{
    if (l->n_inputs != 1 || l->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": unary needs 1 input, 1 output", name);
    kiln_unary_op op = l->p.unary.op;
    if ((unsigned)op >= KILN_UNARY_OP_COUNT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": unknown unary op %d", name, (int)op);
    kiln_dtype t = out[0].dtype;
    if (in[0].dtype != t)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": unary input is %s, output %s", name,
                         kiln_dtype_name(in[0].dtype), kiln_dtype_name(t));
    if (kiln_exec_count(&in[0].dims) != kiln_exec_count(&out[0].dims))
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": unary input and output sizes differ", name);
    return KILN_OK;
}

kiln_status kiln_layer_check_fused(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                   const kiln_exec_tensor *out)
{
    int32_t n_in = l->n_inputs, n_steps = l->p.fused.n_steps;
    if (n_in < 1 || n_in > KILN_FUSED_MAX_INPUTS || l->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": fused chain needs 1..%d inputs and 1 output", name,
                         KILN_FUSED_MAX_INPUTS);
    if (n_steps < 1 || n_steps > KILN_FUSED_MAX_STEPS)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": fused chain has %d steps", name, (int)n_steps);
    for (int32_t s = 0; s < n_steps; s++) {
        const kiln_fused_step *st = &l->p.fused.steps[s];
        int32_t limit = n_in + s; /* inputs and earlier steps only */
        int bad_op = st->is_binary ? (unsigned)st->op >= KILN_BINARY_OP_COUNT : (unsigned)st->op >= KILN_UNARY_OP_COUNT;
        if (bad_op || st->a < 0 || st->a >= limit || (st->is_binary && (st->b < 0 || st->b >= limit)))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": fused step %d has a bad op or operand", name,
                             (int)s);
    }
    for (int32_t k = 0; k < n_in; k++)
        if (!kiln_dtype_is_float(in[k].dtype))
            return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": fused input %d is %s", name, (int)k,
                             kiln_dtype_name(in[k].dtype));
    if (!kiln_dtype_is_float(out[0].dtype))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": fused output is %s", name,
                         kiln_dtype_name(out[0].dtype));
    return KILN_OK;
}

kiln_status kiln_layer_plan_reduce(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                   const kiln_exec_tensor *out, kiln_reduce_plan *plan)
{
    if (l->n_inputs != 1 || l->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": reduce needs 1 input, 1 output", name);
    const kiln_dims *d = &in[0].dims;
    uint32_t axes = l->p.reduce.axes;
    if ((unsigned)l->p.reduce.op >= KILN_REDUCE_OP_COUNT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": unknown reduce op %d", name, (int)l->p.reduce.op);
    if (d->rank < 32 && (axes >> d->rank) != 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": reduce axes 0x%x outside rank %d", name, axes,
                         (int)d->rank);
    if (in[0].dtype != out[0].dtype || in[0].dtype == KILN_DTYPE_BOOL || in[0].dtype >= KILN_DTYPE_FP8_E4M3)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": reduce from %s to %s", name,
                         kiln_dtype_name(in[0].dtype), kiln_dtype_name(out[0].dtype));
    memset(plan, 0, sizeof *plan);
    plan->kept = plan->rcount = 1;
    int64_t st[KILN_MAX_RANK];
    kiln_exec_strides(d, st);
    for (int32_t i = 0; i < d->rank; i++) {
        int red = (axes & (1u << i)) != 0;
        int32_t *n = red ? &plan->n_red : &plan->n_kept;
        int64_t *dims = red ? plan->red_dims : plan->kept_dims, *s = red ? plan->red_st : plan->kept_st;
        *(red ? &plan->rcount : &plan->kept) *= d->d[i];
        /* merge with the previous axis of the same kind when adjacent in memory */
        if (*n && s[*n - 1] == st[i] * d->d[i]) {
            dims[*n - 1] *= d->d[i];
            s[*n - 1] = st[i];
        } else {
            dims[*n] = d->d[i];
            s[(*n)++] = st[i];
        }
    }
    if (kiln_exec_count(&out[0].dims) != plan->kept)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": reduce output has %lld elements, expected %lld", name,
                         (long long)kiln_exec_count(&out[0].dims), (long long)plan->kept);
    return KILN_OK;
}

kiln_status kiln_layer_check_perm(const char *name, const int32_t *perm, int32_t rank, const char *which)
{
    uint32_t seen = 0;
    for (int32_t i = 0; i < rank; i++) {
        if (perm[i] < 0 || perm[i] >= rank || (seen & (1u << perm[i])))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": %s transpose is not a permutation of %d axes",
                             name, which, (int)rank);
        seen |= 1u << perm[i];
    }
    return KILN_OK;
}

kiln_status kiln_layer_plan_slice(const char *name, const kiln_layer *l, const kiln_exec_tensor *x,
                                  const kiln_exec_tensor *o, int64_t *base, int64_t *step, int *empty)
{
    int32_t r = x->dims.rank;
    if (l->n_inputs < 1 || l->n_outputs != 1 || o->dims.rank != r || x->dtype != o->dtype)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": slice input and output disagree", name);
    int64_t st[KILN_MAX_RANK];
    kiln_exec_strides(&x->dims, st);
    *empty = kiln_exec_count(&o->dims) == 0;
    *base = 0;
    for (int32_t i = 0; i < r; i++) {
        int64_t start = l->p.slice.start[i], stride = l->p.slice.stride[i], size = o->dims.d[i];
        if (start < 0 || stride < 1 ||
            (!*empty && size > 0 && (start >= x->dims.d[i] || (x->dims.d[i] - 1 - start) / stride < size - 1)))
            return kiln_fail(KILN_ERROR_SHAPE,
                             "layer \"%s\": slice axis %d (start %lld, size %lld, stride %lld) exceeds dim %lld", name,
                             (int)i, (long long)start, (long long)size, (long long)stride, (long long)x->dims.d[i]);
        *base += start * st[i];
        step[i] = st[i] * stride;
    }
    return KILN_OK;
}

kiln_status kiln_layer_check_shuffle(const char *name, const kiln_layer *l, const kiln_exec_tensor *x,
                                     const kiln_exec_tensor *o, int *first, int *second)
{
    const kiln_layer_params *p = &l->p;
    if (l->n_inputs < 1 || l->n_outputs != 1 || x->dtype != o->dtype)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": shuffle input and output disagree", name);
    int64_t count = kiln_exec_count(&x->dims);
    if (kiln_exec_count(&o->dims) != count)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": shuffle input has %lld elements, output %lld", name,
                         (long long)count, (long long)kiln_exec_count(&o->dims));
    *first = p->shuffle.has_first && !kiln_perm_is_identity(p->shuffle.first, x->dims.rank);
    *second = p->shuffle.has_second && !kiln_perm_is_identity(p->shuffle.second, o->dims.rank);
    if (*first)
        KILN_TRY(kiln_layer_check_perm(name, p->shuffle.first, x->dims.rank, "first"));
    if (*second)
        KILN_TRY(kiln_layer_check_perm(name, p->shuffle.second, o->dims.rank, "second"));
    return KILN_OK;
}

kiln_status kiln_layer_plan_concat(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                   const kiln_exec_tensor *out, int64_t *outer, int64_t *inner, int64_t *total)
{
    const kiln_exec_tensor *o = &out[0];
    int32_t axis = l->p.concat.axis, r = o->dims.rank;
    if (l->n_inputs < 1 || l->n_outputs != 1 || axis < 0 || axis >= r)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": concat axis %d, %d inputs", name, (int)axis,
                         (int)l->n_inputs);
    *total = 0;
    for (int32_t k = 0; k < l->n_inputs; k++) {
        const kiln_exec_tensor *x = &in[k];
        if (x->dtype != o->dtype || x->dims.rank != r)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "layer \"%s\": concat input %d is %s rank %d, output %s rank %d", name, (int)k,
                             kiln_dtype_name(x->dtype), (int)x->dims.rank, kiln_dtype_name(o->dtype), (int)r);
        for (int32_t i = 0; i < r; i++)
            if (i != axis && x->dims.d[i] != o->dims.d[i])
                return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": concat input %d dim %d is %lld, expected %lld", name,
                                 (int)k, (int)i, (long long)x->dims.d[i], (long long)o->dims.d[i]);
        *total += x->dims.d[axis];
    }
    if (*total != o->dims.d[axis])
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": concat inputs sum to %lld along axis %d, output has %lld",
                         name, (long long)*total, (int)axis, (long long)o->dims.d[axis]);
    *outer = *inner = 1;
    for (int32_t i = 0; i < axis; i++)
        *outer *= o->dims.d[i];
    for (int32_t i = axis + 1; i < r; i++)
        *inner *= o->dims.d[i];
    return KILN_OK;
}

kiln_status kiln_layer_plan_gather(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                   const kiln_exec_tensor *out, int64_t *outer, int64_t *n_idx, int64_t *inner,
                                   int64_t *dim)
{
    if (l->n_inputs != 2 || l->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": gather needs 2 inputs, 1 output", name);
    const kiln_exec_tensor *x = &in[0], *ix = &in[1], *o = &out[0];
    int32_t axis = l->p.gather.axis;
    if (axis < 0 || axis >= x->dims.rank)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": gather axis %d outside rank %d", name, (int)axis,
                         (int)x->dims.rank);
    if (ix->dtype != KILN_DTYPE_I32 && ix->dtype != KILN_DTYPE_I64)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": gather indices are %s, need i32 or i64", name,
                         kiln_dtype_name(ix->dtype));
    if (x->dtype != o->dtype)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": gather data is %s, output %s", name,
                         kiln_dtype_name(x->dtype), kiln_dtype_name(o->dtype));
    *outer = *inner = 1;
    *n_idx = kiln_exec_count(&ix->dims);
    *dim = x->dims.d[axis];
    for (int32_t i = 0; i < axis; i++)
        *outer *= x->dims.d[i];
    for (int32_t i = axis + 1; i < x->dims.rank; i++)
        *inner *= x->dims.d[i];
    int64_t want = *outer * *n_idx * *inner;
    if (kiln_exec_count(&o->dims) != want)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": gather output has %lld elements, expected %lld", name,
                         (long long)kiln_exec_count(&o->dims), (long long)want);
    return KILN_OK;
}

kiln_status kiln_layer_plan_softmax(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                    const kiln_exec_tensor *out, int64_t *count, int64_t *len, int64_t *inner)
{
    if (l->n_inputs != 1 || l->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": softmax needs 1 input, 1 output", name);
    const kiln_dims *d = &in[0].dims;
    int32_t axis = l->p.softmax.axis;
    if (axis < 0 || axis >= d->rank)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": softmax axis %d outside rank %d", name, (int)axis,
                         (int)d->rank);
    if (!kiln_dtype_is_float(in[0].dtype) || !kiln_dtype_is_float(out[0].dtype))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": softmax on %s", name, kiln_dtype_name(in[0].dtype));
    *count = kiln_exec_count(d);
    if (kiln_exec_count(&out[0].dims) != *count)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": softmax input and output sizes differ", name);
    *len = d->d[axis];
    *inner = 1;
    for (int32_t i = axis + 1; i < d->rank; i++)
        *inner *= d->d[i];
    return KILN_OK;
}

kiln_status kiln_layer_check_cast(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                  const kiln_exec_tensor *out, int64_t *count)
{
    if (l->n_inputs != 1 || l->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": cast needs 1 input, 1 output", name);
    if ((unsigned)in[0].dtype > KILN_DTYPE_BOOL || (unsigned)out[0].dtype > KILN_DTYPE_BOOL)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": cast from %s to %s", name, kiln_dtype_name(in[0].dtype),
                         kiln_dtype_name(out[0].dtype));
    *count = kiln_exec_count(&in[0].dims);
    if (kiln_exec_count(&out[0].dims) != *count)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": cast input and output sizes differ", name);
    return KILN_OK;
}

int kiln_perm_is_identity(const int32_t *perm, int32_t rank)
{
    for (int32_t i = 0; i < rank; i++)
        if (perm[i] != i)
            return 0;
    return 1;
}

kiln_status kiln_layer_run_plugin(const char *name, kiln_plugin *plugin, kiln_backend backend, const kiln_layer *l,
                                  const kiln_exec_tensor *in, const kiln_exec_tensor *out, void *workspace,
                                  void *stream)
{
    const kiln_plugin_ops *ops = plugin ? plugin->ops : NULL;
    if (!ops || ops->struct_size < offsetof(kiln_plugin_ops, enqueue) + sizeof ops->enqueue || !ops->enqueue)
        return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": no plugin instance to enqueue", name);
    if (!(ops->backends & KILN_BACKEND_BIT(backend)))
        return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": the plugin has no %s implementation", name,
                         backend == KILN_BACKEND_CUDA ? "CUDA" : "CPU");
    int32_t ni = l->n_inputs, no = l->n_outputs, n = ni + no;
    kiln_tensor_desc descs[KILN_PLUGIN_MAX_INPUTS + KILN_PLUGIN_MAX_OUTPUTS];
    void *ptrs[KILN_PLUGIN_MAX_INPUTS + KILN_PLUGIN_MAX_OUTPUTS];
    if (ni < 0 || no < 0 || ni > KILN_PLUGIN_MAX_INPUTS || no > KILN_PLUGIN_MAX_OUTPUTS)
        return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": %d inputs and %d outputs exceed the limits (%d, %d)", name,
                         ni, no, KILN_PLUGIN_MAX_INPUTS, KILN_PLUGIN_MAX_OUTPUTS);
    memset(descs, 0, sizeof(kiln_tensor_desc) * (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        const kiln_exec_tensor *t = i < ni ? &in[i] : &out[i - ni];
        descs[i].struct_size = sizeof descs[i];
        descs[i].abi_version = KILN_PLUGIN_ABI_VERSION;
        descs[i].dtype = t->dtype;
        descs[i].format = KILN_FORMAT_LINEAR;
        descs[i].dims = t->dims;
        ptrs[i] = t->data;
    }
    unsigned long fails = kiln_host_fail_count();
    kiln_status st = ops->enqueue(plugin, backend, descs, (const void *const *)ptrs, ni, descs + ni, ptrs + ni, no,
                                  workspace, stream);
    if (st != KILN_OK)
        return kiln_plugin_enqueue_error(name, st, fails);
    return KILN_OK;
}
