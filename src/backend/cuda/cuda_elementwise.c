/* Op entries of the elementwise family: binary, unary and fused chains
 * (kernels in cuda_elementwise.cu).
 *
 * One generic kernel interprets the builder's step program (passed by
 * value as a kernel parameter) rather than code generated with NVRTC:
 * engines stay free of GPU code blobs and NVRTC is not a run-time
 * dependency. A vectorized variant runs an accumulator micro-program (at
 * most two live values, held in registers): the per-op dispatch is one
 * uniform branch per 16-byte vector, so a chain costs a few instructions
 * per element and stays memory bound. */
#ifdef KILN_HAVE_CUDA

#include "backend/cuda/cuda_ops.h"
#include "backend/broadcast.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The kernels' fixed-size operand arrays (cuda_internal.h) hold every
 * input and step of a fused chain the builder can make. */
_Static_assert(KCU_MAX_INPUTS == KILN_FUSED_MAX_INPUTS, "kcu_ew_args holds a fused chain's inputs");
_Static_assert(KCU_MAX_STEPS == KILN_FUSED_MAX_STEPS, "kcu_ew_args holds a fused chain's steps");
/* Operand codes of the vectorized program fit their int8 field without
 * overlapping, a swapped binary op keeps its op bits, and one bit of
 * scal_known per input. */
_Static_assert(KCU_SRC_SV < KCU_FAST_VEC && KCU_FAST_VEC + KCU_MAX_INPUTS <= KCU_FAST_SCALAR &&
                   KCU_FAST_SCALAR + KCU_MAX_INPUTS <= 127,
               "vectorized operand codes overlap");
_Static_assert(KILN_BINARY_OP_COUNT <= KCU_SWAPPED && (KCU_SWAPPED | (KCU_SWAPPED - 1)) <= 127,
               "KCU_SWAPPED collides with a binary op");
_Static_assert(KCU_MAX_INPUTS <= 31, "scal_known has a bit per input");

/* ---- broadcast and the vectorized program ------------------------------------------------ */

/* Output shape with each operand's strides (0 on broadcast axes), size-1
 * axes dropped and adjacent axes merged where every operand allows (the
 * CPU backend's broadcast walk). */
static kiln_status ew_bcast(const kiln_cuda_args *a, const kiln_dims *out, const kiln_exec_tensor *ins, int32_t n_ins,
                            kcu_ew_args *e)
{
    kiln_broadcast w;
    KILN_TRY(kiln_broadcast_init(&w, layer_name(a), out, ins, n_ins));
    e->rank = w.rank;
    memcpy(e->dims, w.dims, sizeof w.dims);
    for (int32_t k = 0; k < n_ins; k++)
        memcpy(e->st[k], w.st[k], sizeof w.st[k]);
    e->n_in = n_ins;
    for (int32_t k = 0; k < n_ins; k++) {
        e->in[k] = ins[k].data;
        e->in_dtype[k] = ins[k].dtype;
    }
    e->start = 0;
    e->count = kiln_exec_count(out);
    return KILN_OK;
}

/* Compiles the step program into the vectorized kernel's micro-program
 * (cuda_internal.h): a step whose operand is the previous result runs in
 * place on the accumulator; otherwise the accumulator is saved when still
 * needed and loaded from the operand. Returns 0 when the chain needs more
 * than the two registers (the generic kernel takes it). */
static void fast_emit(kcu_fast_args *f, int kind, int op, int src)
{
    f->ops[f->n_ops++] = (kcu_fast_step){(int8_t)kind, (int8_t)op, (int8_t)src, 0};
}

static int fast_compile(const kcu_ew_args *e, const int *scalar, kcu_fast_args *f)
{
    int32_t n_in = e->n_in, n = e->n_steps;
    int32_t last_use[KCU_MAX_STEPS];
    for (int32_t s = 0; s < n; s++)
        last_use[s] = s == n - 1 ? n : s;
    for (int32_t s = 0; s < n; s++) {
        const kcu_step *st = &e->steps[s];
        if (st->a >= n_in && last_use[st->a - n_in] < s)
            last_use[st->a - n_in] = s;
        if (st->is_binary && st->b >= n_in && last_use[st->b - n_in] < s)
            last_use[st->b - n_in] = s;
    }
    int32_t acc = -1, sv = -1; /* the step whose value each register holds */
    f->n_ops = 0;
    for (int32_t s = 0; s < n; s++) {
        const kcu_step *st = &e->steps[s];
        int32_t ops[2] = {st->a, st->b}, nops = st->is_binary ? 2 : 1;
        int code[2] = {0, 0};
        for (int32_t i = 0; i < nops; i++) {
            int32_t o = ops[i];
            if (o < n_in)
                code[i] = (scalar[o] ? KCU_FAST_SCALAR : KCU_FAST_VEC) + o;
            else if (o - n_in == acc)
                code[i] = KCU_SRC_ACC;
            else if (o - n_in == sv)
                code[i] = KCU_SRC_SV;
            else
                return 0;
        }
        int swapped = 0;
        if (code[0] != KCU_SRC_ACC && (!st->is_binary || code[1] != KCU_SRC_ACC)) {
            /* neither operand is in the accumulator: free it and load */
            if (acc >= 0 && last_use[acc] > s) {
                if ((sv >= 0 && last_use[sv] >= s) || code[0] == KCU_SRC_SV || code[1] == KCU_SRC_SV)
                    return 0;
                fast_emit(f, KCU_UOP_SAVE, 0, 0);
                sv = acc;
            }
            fast_emit(f, KCU_UOP_LOAD, 0, code[0]);
            code[0] = KCU_SRC_ACC;
        } else if (st->is_binary && code[0] != KCU_SRC_ACC) {
            swapped = 1; /* acc is the right operand */
            code[1] = code[0];
        }
        if (!st->is_binary)
            fast_emit(f, KCU_UOP_UNARY, st->op, 0);
        else
            fast_emit(f, code[1] >= KCU_FAST_SCALAR ? KCU_UOP_BINARY_SCALAR : KCU_UOP_BINARY,
                      st->op | (swapped ? KCU_SWAPPED : 0), code[1]);
        acc = s;
    }
    f->uses_sv = 0;
    for (int32_t i = 0; i < f->n_ops; i++)
        f->uses_sv |= f->ops[i].kind == KCU_UOP_SAVE;
    /* the first step never finds its operand in a register, so ops[0] is a load */
    int src0 = f->ops[0].src;
    f->lead = src0 >= KCU_FAST_VEC && src0 < KCU_FAST_SCALAR ? src0 - KCU_FAST_VEC : -1;
    return 1;
}

/* The value of one-element input k when it is an engine constant: the
 * device copy a layer reads was uploaded from these host bytes and never
 * changes, so a kernel can take the value as a parameter and not wait for
 * the previous kernel before loading it (see kcu_fast_args.scal). */
static int host_scalar(const kiln_cuda_args *a, int32_t k, kiln_dtype t, float *v)
{
    const kiln_layer *l = a->layer;
    if (!a->graph || !l || !l->inputs || k >= l->n_inputs)
        return 0;
    int32_t i = l->inputs[k];
    if (i < 0 || i >= a->graph->n_tensors)
        return 0;
    const kiln_tensor_rec *r = &a->graph->tensors[i];
    if (!(r->flags & KILN_TENSOR_CONSTANT) || !r->data || r->dtype != t || r->data_size != kiln_dtype_size(t))
        return 0;
    *v = kiln_load_f32(r->data, t, 0);
    return 1;
}

/* Runs a float elementwise program: the vectorized kernel over the aligned
 * bulk when every input has the output's dtype and is full-size or a
 * single element, the generic kernel over everything else and the tail. */
static kiln_status ew_run(const kiln_cuda_args *a, kcu_ew_args *e, const kiln_exec_tensor *out)
{
    int32_t sms = a->device->sms;
    e->out = out->data;
    e->out_dtype = out->dtype;
    int64_t n = e->count;
    if (n == 0)
        return KILN_OK;
    if (e->rank == 0) {
        e->rank = 1;
        e->dims[0] = 1;
    }
    int scalar[KCU_MAX_INPUTS] = {0},
        fast = out->dtype == KILN_DTYPE_F32 || out->dtype == KILN_DTYPE_F16 || out->dtype == KILN_DTYPE_BF16;
    fast = fast && ((uintptr_t)out->data & 15) == 0;
    for (int32_t k = 0; k < e->n_in && fast; k++) {
        int64_t c = kiln_exec_count(&a->inputs[k].dims);
        if (a->layer->op == KILN_OP_UNARY)
            c = n; /* the unary input is read flat */
        scalar[k] = c == 1 && n > 1;
        fast = a->inputs[k].dtype == out->dtype && (scalar[k] || (c == n && ((uintptr_t)e->in[k] & 15) == 0));
    }
    kcu_fast_args f;
    if (fast) {
        memset(&f, 0, sizeof f);
        fast = fast_compile(e, scalar, &f);
    }
    if (fast) {
        int64_t per = 16 / (int64_t)kiln_dtype_size(out->dtype);
        f.nvec = n / per;
        for (int32_t k = 0; k < e->n_in; k++) {
            f.in[k] = e->in[k];
            if (!scalar[k])
                f.vec_in[f.n_vec_in++] = k;
            else if (host_scalar(a, k, out->dtype, &f.scal[k]))
                f.scal_known |= 1 << k;
        }
        f.out = out->data;
        f.dtype = out->dtype;
        KCU_CHECK(a, kcu_launch_ew_fast(&f, sms, a->stream));
        e->start = f.nvec * per;
        if (e->start == n)
            return KILN_OK;
    }
    KCU_CHECK(a, kcu_launch_ew(e, sms, a->stream));
    return KILN_OK;
}

kiln_status cuda_run_binary(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    KILN_TRY(kiln_layer_check_binary(name, a->layer, a->inputs, a->outputs));
    kiln_binary_op op = a->layer->p.binary.op;
    kiln_dtype t = a->outputs[0].dtype;
    kcu_ew_args e;
    memset(&e, 0, sizeof e);
    KILN_TRY(ew_bcast(a, &a->outputs[0].dims, a->inputs, 2, &e));
    e.n_steps = 1;
    e.steps[0] = (kcu_step){1, (int8_t)op, 0, 1};
    if (kiln_dtype_is_float(t))
        return ew_run(a, &e, &a->outputs[0]);
    if (!kiln_exec_is_int(t))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": binary %s on %s is not supported", name,
                         kiln_binary_op_name(op), kiln_dtype_name(t));
    e.out = a->outputs[0].data;
    e.out_dtype = t;
    if (e.rank == 0) {
        e.rank = 1;
        e.dims[0] = 1;
    }
    KCU_CHECK(a, kcu_launch_ew_int(&e, 1, op, a->device->sms, a->stream));
    return KILN_OK;
}

kiln_status cuda_run_unary(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    KILN_TRY(kiln_layer_check_unary(name, a->layer, a->inputs, a->outputs));
    kiln_unary_op op = a->layer->p.unary.op;
    kiln_dtype t = a->outputs[0].dtype;
    /* the input is read flat, in the output's shape */
    kiln_exec_tensor in = a->inputs[0];
    in.dims = a->outputs[0].dims;
    kcu_ew_args e;
    memset(&e, 0, sizeof e);
    KILN_TRY(ew_bcast(a, &a->outputs[0].dims, &in, 1, &e));
    e.n_steps = 1;
    e.steps[0] = (kcu_step){0, (int8_t)op, 0, 0};
    int int_ok = op == KILN_UNARY_NEG || op == KILN_UNARY_ABS || op == KILN_UNARY_RELU;
    if (kiln_dtype_is_float(t))
        return ew_run(a, &e, &a->outputs[0]);
    if (!kiln_exec_is_int(t) || !int_ok)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": unary %s on %s is not supported", name,
                         kiln_unary_op_name(op), kiln_dtype_name(t));
    e.out = a->outputs[0].data;
    e.out_dtype = t;
    e.in[1] = e.in[0];
    e.in_dtype[1] = e.in_dtype[0];
    if (e.rank == 0) {
        e.rank = 1;
        e.dims[0] = 1;
    }
    KCU_CHECK(a, kcu_launch_ew_int(&e, 0, op, a->device->sms, a->stream));
    return KILN_OK;
}

kiln_status cuda_run_fused(const kiln_cuda_args *a)
{
    const kiln_layer *l = a->layer;
    KILN_TRY(kiln_layer_check_fused(layer_name(a), l, a->inputs, a->outputs));
    int32_t n_in = l->n_inputs, n_steps = l->p.fused.n_steps;
    kcu_ew_args e;
    memset(&e, 0, sizeof e);
    for (int32_t s = 0; s < n_steps; s++) {
        const kiln_fused_step *st = &l->p.fused.steps[s];
        e.steps[s] = (kcu_step){(int8_t)(st->is_binary != 0), (int8_t)st->op, (int8_t)st->a,
                                (int8_t)(st->is_binary ? st->b : 0)};
    }
    KILN_TRY(ew_bcast(a, &a->outputs[0].dims, a->inputs, n_in, &e));
    e.n_steps = n_steps;
    return ew_run(a, &e, &a->outputs[0]);
}

#endif
