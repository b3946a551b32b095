/* The CUDA backend's host half: the device (cuBLASLt handle, workspace,
 * error word), checks and shape arithmetic for every layer (mirroring the
 * CPU backend's, whose semantics these kernels reproduce), matmul through
 * cuBLASLt and plugin dispatch. Launches only: nothing here allocates
 * device memory or synchronizes once a device exists, except the tactic
 * tuner and kiln_cuda_device_check, which run outside enqueue.
 *
 * Elementwise choice: one generic fused kernel interprets the builder's
 * step program (passed by value as a kernel parameter) rather than code
 * generated with NVRTC: engines stay free of GPU code blobs and NVRTC is
 * not a run-time dependency. A vectorized variant runs an
 * accumulator micro-program (at most two live values, held in registers):
 * the per-op dispatch is one uniform branch per 16-byte vector, so a chain
 * costs a few instructions per element and stays memory bound. */
#ifdef KILN_HAVE_CUDA

#include "cuda_backend.h"
#include "cuda_internal.h"
#include "../broadcast.h"
#include "../matmul_shape.h"

#include "../../core/dtype.h"
#include "../../core/error.h"
#include "../../plugin/plugin_internal.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct kiln_cuda_device {
    int ordinal;
    int32_t arch, sms;
    int32_t gemv; /* small-m matmuls through kcu_gemv */
    cublasLtHandle_t lt;
    void *lt_workspace;          /* KILN_CUDA_CUBLASLT_WORKSPACE bytes */
    kcu_error_word *err;         /* device memory */
};

static const char *layer_name(const kiln_cuda_args *a)
{
    return a->layer && a->layer->name ? a->layer->name : "?";
}

static kiln_status cuda_fail(cudaError_t e, const char *who, const char *call, const char *file, int line)
{
    return kiln_fail(KILN_ERROR_BACKEND, "%s: %s failed: %s (%s:%d)", who, call, cudaGetErrorString(e),
                     file, line);
}

/* Checks a CUDA runtime call; `who` names the layer or function. */
#define CU_CHECK(who, call)                                                   \
    do {                                                                      \
        cudaError_t cu_e_ = (call);                                           \
        if (cu_e_ != cudaSuccess)                                             \
            return cuda_fail(cu_e_, (who), #call, __FILE__, __LINE__);         \
    } while (0)

/* Checks a launcher's returned cudaError_t. */
#define KCU_CHECK(a, call) CU_CHECK(layer_name(a), (cudaError_t)(call))

#define LT_CHECK(who, call)                                                                     \
    do {                                                                                        \
        cublasStatus_t lt_s_ = (call);                                                          \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS)                                                     \
            return kiln_fail(KILN_ERROR_BACKEND, "%s: %s failed: cuBLAS status %d (%s:%d)", (who), \
                             #call, (int)lt_s_, __FILE__, __LINE__);                            \
    } while (0)

static int64_t count_of(const kiln_dims *d)
{
    int64_t n = 1;
    for (int32_t i = 0; i < d->rank; i++)
        n *= d->d[i] > 0 ? d->d[i] : 0;
    return n;
}

static void strides_of(const kiln_dims *d, int64_t *s)
{
    int64_t acc = 1;
    for (int32_t i = d->rank - 1; i >= 0; i--) {
        s[i] = acc;
        acc *= d->d[i];
    }
}

/* ---- the device ------------------------------------------------------------------------ */

int kiln_cuda_available(int32_t *arch)
{
    int n = 0, dev = 0, major = 0, minor = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1 || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* no GPU is not an error for later calls */
        return 0;
    }
    if (arch)
        *arch = 10 * major + minor;
    return 1;
}

int kiln_cuda_can_tune(void) { return kiln_cuda_available(NULL); }

kiln_status kiln_cuda_device_create(kiln_cuda_device **out)
{
    const char *who = "CUDA device";
    int32_t arch = 0;
    if (!kiln_cuda_available(&arch))
        return kiln_fail(KILN_ERROR_TARGET, "no CUDA GPU is available");
    kiln_cuda_device *d = calloc(1, sizeof *d);
    if (!d)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a CUDA device");
    d->arch = arch;
    /* KILN_CUDA_PDL=0 launches without programmatic dependent launch: for
     * timing both ways, and a way out should a driver mishandle it. */
    const char *pdl = getenv("KILN_CUDA_PDL");
    kcu_set_pdl(!(pdl && strcmp(pdl, "0") == 0));
    kcu_gemv_set_pdl(!(pdl && strcmp(pdl, "0") == 0));
    const char *gemv = getenv("KILN_CUDA_GEMV");
    d->gemv = !(gemv && strcmp(gemv, "0") == 0);
    kiln_status st = KILN_OK;
    cudaError_t e = cudaGetDevice(&d->ordinal);
    int sms = 0;
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d->ordinal);
    if (e == cudaSuccess)
        e = cudaMalloc(&d->lt_workspace, KILN_CUDA_CUBLASLT_WORKSPACE);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&d->err, sizeof *d->err);
    if (e == cudaSuccess)
        e = cudaMemset(d->err, 0, sizeof *d->err);
    if (e != cudaSuccess) {
        st = kiln_fail(KILN_ERROR_BACKEND, "%s: setup failed: %s", who, cudaGetErrorString(e));
    } else {
        cublasStatus_t ls = cublasLtCreate(&d->lt);
        if (ls != CUBLAS_STATUS_SUCCESS) {
            d->lt = NULL;
            st = kiln_fail(KILN_ERROR_BACKEND, "%s: cublasLtCreate failed: cuBLAS status %d", who, (int)ls);
        }
    }
    d->sms = sms;
    if (st != KILN_OK) {
        kiln_cuda_device_destroy(d);
        return st;
    }
    *out = d;
    return KILN_OK;
}

void kiln_cuda_device_destroy(kiln_cuda_device *dev)
{
    if (!dev)
        return;
    if (dev->lt)
        cublasLtDestroy(dev->lt);
    cudaFree(dev->lt_workspace);
    cudaFree(dev->err);
    free(dev);
}

kiln_status kiln_cuda_device_check(kiln_cuda_device *dev, const kiln_graph *graph)
{
    if (!dev)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_device_check: no device");
    kcu_error_word w;
    CU_CHECK("CUDA device", cudaMemcpy(&w, dev->err, sizeof w, cudaMemcpyDeviceToHost));
    if (!w.flag)
        return KILN_OK;
    CU_CHECK("CUDA device", cudaMemset(dev->err, 0, sizeof *dev->err));
    const char *name = graph && w.layer >= 0 && w.layer < graph->n_layers && graph->layers[w.layer].name
                           ? graph->layers[w.layer].name
                           : "?";
    return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                     "layer \"%s\": gather index %lld at position %lld is out of range (clamped on the GPU)",
                     name, (long long)w.index, (long long)w.position);
}

/* ---- elementwise ---------------------------------------------------------------------------- */

/* Output shape with each operand's strides (0 on broadcast axes), size-1
 * axes dropped and adjacent axes merged where every operand allows (the
 * CPU backend's broadcast walk). */
static kiln_status ew_bcast(const kiln_cuda_args *a, const kiln_dims *out, const kiln_exec_tensor *ins,
                            int32_t n_ins, kcu_ew_args *e)
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
    e->count = count_of(out);
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
    int scalar[KCU_MAX_INPUTS] = {0}, fast = out->dtype == KILN_DTYPE_F32 || out->dtype == KILN_DTYPE_F16 ||
                                             out->dtype == KILN_DTYPE_BF16;
    fast = fast && ((uintptr_t)out->data & 15) == 0;
    for (int32_t k = 0; k < e->n_in && fast; k++) {
        int64_t c = count_of(&a->inputs[k].dims);
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

static int is_int_dtype(kiln_dtype t)
{
    return t == KILN_DTYPE_I8 || t == KILN_DTYPE_U8 || t == KILN_DTYPE_I32 || t == KILN_DTYPE_I64;
}

static kiln_status run_binary(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    if (a->layer->n_inputs != 2 || a->layer->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": binary needs 2 inputs, 1 output", name);
    kiln_binary_op op = a->layer->p.binary.op;
    if ((unsigned)op >= KILN_BINARY_OP_COUNT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": unknown binary op %d", name, (int)op);
    kiln_dtype t = a->outputs[0].dtype;
    if (a->inputs[0].dtype != t || a->inputs[1].dtype != t)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": binary inputs are %s and %s, output %s", name,
                         kiln_dtype_name(a->inputs[0].dtype), kiln_dtype_name(a->inputs[1].dtype),
                         kiln_dtype_name(t));
    kcu_ew_args e;
    memset(&e, 0, sizeof e);
    KILN_TRY(ew_bcast(a, &a->outputs[0].dims, a->inputs, 2, &e));
    e.n_steps = 1;
    e.steps[0] = (kcu_step){1, (int8_t)op, 0, 1};
    if (kiln_dtype_is_float(t))
        return ew_run(a, &e, &a->outputs[0]);
    if (!is_int_dtype(t))
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

static kiln_status run_unary(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    if (a->layer->n_inputs != 1 || a->layer->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": unary needs 1 input, 1 output", name);
    kiln_unary_op op = a->layer->p.unary.op;
    if ((unsigned)op >= KILN_UNARY_OP_COUNT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": unknown unary op %d", name, (int)op);
    kiln_dtype t = a->outputs[0].dtype;
    if (a->inputs[0].dtype != t)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": unary input is %s, output %s", name,
                         kiln_dtype_name(a->inputs[0].dtype), kiln_dtype_name(t));
    if (count_of(&a->inputs[0].dims) != count_of(&a->outputs[0].dims))
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": unary input and output sizes differ", name);
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
    if (!is_int_dtype(t) || !int_ok)
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

static kiln_status run_fused(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_layer *l = a->layer;
    int32_t n_in = l->n_inputs, n_steps = l->p.fused.n_steps;
    if (n_in < 1 || n_in > KILN_FUSED_MAX_INPUTS || l->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": fused chain needs 1..%d inputs and 1 output",
                         name, KILN_FUSED_MAX_INPUTS);
    if (n_steps < 1 || n_steps > KILN_FUSED_MAX_STEPS)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": fused chain has %d steps", name, (int)n_steps);
    kcu_ew_args e;
    memset(&e, 0, sizeof e);
    for (int32_t s = 0; s < n_steps; s++) {
        const kiln_fused_step *st = &l->p.fused.steps[s];
        int32_t limit = n_in + s;
        int bad_op = st->is_binary ? (unsigned)st->op >= KILN_BINARY_OP_COUNT
                                   : (unsigned)st->op >= KILN_UNARY_OP_COUNT;
        if (bad_op || st->a < 0 || st->a >= limit || (st->is_binary && (st->b < 0 || st->b >= limit)))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": fused step %d has a bad op or operand",
                             name, (int)s);
        e.steps[s] = (kcu_step){(int8_t)(st->is_binary != 0), (int8_t)st->op, (int8_t)st->a,
                                (int8_t)(st->is_binary ? st->b : 0)};
    }
    for (int32_t k = 0; k < n_in; k++)
        if (!kiln_dtype_is_float(a->inputs[k].dtype))
            return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": fused input %d is %s", name, (int)k,
                             kiln_dtype_name(a->inputs[k].dtype));
    if (!kiln_dtype_is_float(a->outputs[0].dtype))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": fused output is %s", name,
                         kiln_dtype_name(a->outputs[0].dtype));
    KILN_TRY(ew_bcast(a, &a->outputs[0].dims, a->inputs, n_in, &e));
    e.n_steps = n_steps;
    return ew_run(a, &e, &a->outputs[0]);
}

/* ---- reduce and softmax ------------------------------------------------------------------------ */

static kiln_status run_reduce(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_layer *l = a->layer;
    if (l->n_inputs != 1 || l->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": reduce needs 1 input, 1 output", name);
    const kiln_dims *d = &a->inputs[0].dims;
    uint32_t axes = l->p.reduce.axes;
    if ((unsigned)l->p.reduce.op >= KILN_REDUCE_OP_COUNT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": unknown reduce op %d", name,
                         (int)l->p.reduce.op);
    if (d->rank < 32 && (axes >> d->rank) != 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": reduce axes 0x%x outside rank %d", name,
                         axes, (int)d->rank);
    if (a->inputs[0].dtype != a->outputs[0].dtype || a->inputs[0].dtype == KILN_DTYPE_BOOL ||
        a->inputs[0].dtype >= KILN_DTYPE_FP8_E4M3)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": reduce from %s to %s", name,
                         kiln_dtype_name(a->inputs[0].dtype), kiln_dtype_name(a->outputs[0].dtype));
    kcu_reduce_args r;
    memset(&r, 0, sizeof r);
    int64_t st[KILN_MAX_RANK], kept = 1;
    strides_of(d, st);
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
    if (count_of(&a->outputs[0].dims) != kept)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": reduce output has %lld elements, expected %lld", name,
                         (long long)count_of(&a->outputs[0].dims), (long long)kept);
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

static kiln_status run_softmax(const kiln_cuda_args *a)
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
    int64_t count = count_of(d);
    if (count_of(&a->outputs[0].dims) != count)
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

/* ---- data movement ------------------------------------------------------------------------------ */

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

static kiln_status run_concat(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_exec_tensor *o = &a->outputs[0];
    int32_t axis = a->layer->p.concat.axis, r = o->dims.rank;
    if (a->layer->n_inputs < 1 || a->layer->n_outputs != 1 || axis < 0 || axis >= r)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": concat axis %d, %d inputs", name, (int)axis,
                         (int)a->layer->n_inputs);
    size_t esize = kiln_dtype_size(o->dtype);
    if (!esize_ok(esize))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": concat of %s", name, kiln_dtype_name(o->dtype));
    int64_t total = 0;
    for (int32_t k = 0; k < a->layer->n_inputs; k++) {
        const kiln_exec_tensor *x = &a->inputs[k];
        if (x->dtype != o->dtype || x->dims.rank != r)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": concat input %d is %s rank %d, output %s rank %d",
                             name, (int)k, kiln_dtype_name(x->dtype), (int)x->dims.rank, kiln_dtype_name(o->dtype),
                             (int)r);
        for (int32_t i = 0; i < r; i++)
            if (i != axis && x->dims.d[i] != o->dims.d[i])
                return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": concat input %d dim %d is %lld, expected %lld", name,
                                 (int)k, (int)i, (long long)x->dims.d[i], (long long)o->dims.d[i]);
        total += x->dims.d[axis];
    }
    if (total != o->dims.d[axis])
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": concat inputs sum to %lld along axis %d, output has %lld",
                         name, (long long)total, (int)axis, (long long)o->dims.d[axis]);
    int64_t outer = 1, inner = 1;
    for (int32_t i = 0; i < axis; i++)
        outer *= o->dims.d[i];
    for (int32_t i = axis + 1; i < r; i++)
        inner *= o->dims.d[i];
    int64_t col = 0;
    for (int32_t k = 0; k < a->layer->n_inputs; k++) {
        int64_t w = a->inputs[k].dims.d[axis] * inner;
        KCU_CHECK(a, kcu_launch_band(a->inputs[k].data, o->data, outer, w, total * inner, col, (int32_t)esize,
                                     a->device->sms, a->stream));
        col += w;
    }
    return KILN_OK;
}

static kiln_status run_slice(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_exec_tensor *x = &a->inputs[0], *o = &a->outputs[0];
    int32_t r = x->dims.rank;
    if (a->layer->n_inputs < 1 || a->layer->n_outputs != 1 || o->dims.rank != r || x->dtype != o->dtype)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": slice input and output disagree", name);
    size_t esize = kiln_dtype_size(x->dtype);
    if (!esize_ok(esize))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": slice of %s", name, kiln_dtype_name(x->dtype));
    int64_t st[KILN_MAX_RANK], step[KILN_MAX_RANK], base = 0;
    strides_of(&x->dims, st);
    int empty = count_of(&o->dims) == 0;
    for (int32_t i = 0; i < r; i++) {
        int64_t start = a->layer->p.slice.start[i], stride = a->layer->p.slice.stride[i], size = o->dims.d[i];
        if (start < 0 || stride < 1 ||
            (!empty && size > 0 && (start >= x->dims.d[i] || (x->dims.d[i] - 1 - start) / stride < size - 1)))
            return kiln_fail(KILN_ERROR_SHAPE,
                             "layer \"%s\": slice axis %d (start %lld, size %lld, stride %lld) exceeds dim %lld", name,
                             (int)i, (long long)start, (long long)size, (long long)stride, (long long)x->dims.d[i]);
        base += start * st[i];
        step[i] = st[i] * stride;
    }
    if (empty)
        return KILN_OK;
    kcu_map dm, sm;
    map_init(&dm, r, o->dims.d, step);
    memset(&sm, 0, sizeof sm);
    KCU_CHECK(a, kcu_launch_copy(x->data, o->data, count_of(&o->dims), base, &dm, &sm, (int32_t)esize,
                                 a->device->sms, a->stream));
    return KILN_OK;
}

static kiln_status check_perm(const kiln_cuda_args *a, const int32_t *perm, int32_t rank, const char *which)
{
    uint32_t seen = 0;
    for (int32_t i = 0; i < rank; i++) {
        if (perm[i] < 0 || perm[i] >= rank || (seen & (1u << perm[i])))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": %s transpose is not a permutation of %d axes",
                             layer_name(a), which, (int)rank);
        seen |= 1u << perm[i];
    }
    return KILN_OK;
}

static int perm_is_identity(const int32_t *perm, int32_t rank)
{
    for (int32_t i = 0; i < rank; i++)
        if (perm[i] != i)
            return 0;
    return 1;
}

/* transpose, reshape, transpose in one pass without a temporary: an output
 * coordinate gives the mid tensor's linear index through the second
 * transpose; that index, as coordinates of the first transpose's result,
 * gives the input offset. */
static kiln_status run_shuffle(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_exec_tensor *x = &a->inputs[0], *o = &a->outputs[0];
    const kiln_layer_params *p = &a->layer->p;
    if (a->layer->n_inputs < 1 || a->layer->n_outputs != 1 || x->dtype != o->dtype)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": shuffle input and output disagree", name);
    int64_t count = count_of(&x->dims);
    if (count_of(&o->dims) != count)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": shuffle input has %lld elements, output %lld", name,
                         (long long)count, (long long)count_of(&o->dims));
    size_t esize = kiln_dtype_size(x->dtype);
    if (!esize_ok(esize))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": shuffle of %s", name, kiln_dtype_name(x->dtype));
    int first = p->shuffle.has_first && !perm_is_identity(p->shuffle.first, x->dims.rank);
    int second = p->shuffle.has_second && !perm_is_identity(p->shuffle.second, o->dims.rank);
    if (first)
        KILN_TRY(check_perm(a, p->shuffle.first, x->dims.rank, "first"));
    if (second)
        KILN_TRY(check_perm(a, p->shuffle.second, o->dims.rank, "second"));
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
        strides_of(&md, mid_st);
        for (int32_t i = 0; i < o->dims.rank; i++)
            dst_st[i] = mid_st[p->shuffle.second[i]];
    } else {
        strides_of(&o->dims, dst_st);
    }
    kcu_map dm, sm;
    map_init(&dm, o->dims.rank, o->dims.d, dst_st);
    memset(&sm, 0, sizeof sm);
    if (first) {
        /* mid linear index = linear index of transpose(x, first) */
        int64_t xs[KILN_MAX_RANK], td[KILN_MAX_RANK], ts[KILN_MAX_RANK];
        strides_of(&x->dims, xs);
        for (int32_t i = 0; i < x->dims.rank; i++) {
            td[i] = x->dims.d[p->shuffle.first[i]];
            ts[i] = xs[p->shuffle.first[i]];
        }
        map_init(&sm, x->dims.rank, td, ts);
    }
    KCU_CHECK(a, kcu_launch_copy(x->data, o->data, count, 0, &dm, &sm, (int32_t)esize, a->device->sms, a->stream));
    return KILN_OK;
}

static kiln_status run_gather(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    if (a->layer->n_inputs != 2 || a->layer->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": gather needs 2 inputs, 1 output", name);
    const kiln_exec_tensor *x = &a->inputs[0], *ix = &a->inputs[1], *o = &a->outputs[0];
    int32_t axis = a->layer->p.gather.axis;
    if (axis < 0 || axis >= x->dims.rank)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": gather axis %d outside rank %d", name, (int)axis,
                         (int)x->dims.rank);
    if (ix->dtype != KILN_DTYPE_I32 && ix->dtype != KILN_DTYPE_I64)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": gather indices are %s, need i32 or i64", name,
                         kiln_dtype_name(ix->dtype));
    if (x->dtype != o->dtype)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": gather data is %s, output %s", name,
                         kiln_dtype_name(x->dtype), kiln_dtype_name(o->dtype));
    size_t esize = kiln_dtype_size(x->dtype);
    if (!esize_ok(esize))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": gather of %s", name, kiln_dtype_name(x->dtype));
    int64_t outer = 1, inner = 1, n_idx = count_of(&ix->dims), dim = x->dims.d[axis];
    for (int32_t i = 0; i < axis; i++)
        outer *= x->dims.d[i];
    for (int32_t i = axis + 1; i < x->dims.rank; i++)
        inner *= x->dims.d[i];
    if (count_of(&o->dims) != outer * n_idx * inner)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": gather output has %lld elements, expected %lld", name,
                         (long long)count_of(&o->dims), (long long)(outer * n_idx * inner));
    if (dim <= 0 && outer * n_idx * inner > 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": gather from an empty axis %d", name, (int)axis);
    int32_t index = a->graph && a->layer >= a->graph->layers && a->layer < a->graph->layers + a->graph->n_layers
                        ? (int32_t)(a->layer - a->graph->layers)
                        : -1;
    KCU_CHECK(a, kcu_launch_gather(x->data, ix->data, ix->dtype == KILN_DTYPE_I64, o->data, outer, n_idx, inner, dim,
                                   (int32_t)esize, a->device->err, index, a->device->sms, a->stream));
    return KILN_OK;
}

static kiln_status run_cast(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    if (a->layer->n_inputs != 1 || a->layer->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": cast needs 1 input, 1 output", name);
    const kiln_exec_tensor *x = &a->inputs[0], *o = &a->outputs[0];
    if ((unsigned)x->dtype > KILN_DTYPE_BOOL || (unsigned)o->dtype > KILN_DTYPE_BOOL)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": cast from %s to %s", name, kiln_dtype_name(x->dtype),
                         kiln_dtype_name(o->dtype));
    int64_t n = count_of(&x->dims);
    if (count_of(&o->dims) != n)
        return kiln_fail(KILN_ERROR_SHAPE, "layer \"%s\": cast input and output sizes differ", name);
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

/* ---- matmul ------------------------------------------------------------------------------------- */

/* When an operand's batch offset is b * stride for every batch b (fully
 * batched or fully broadcast), *stride receives it. */
static int mm_uniform(const kiln_matmul_shape *s, const int64_t *st, int64_t *stride)
{
    int64_t inner = 1, unit = -1;
    for (int32_t i = s->nb - 1; i >= 0; i--) {
        if (s->bd[i] != 1) {
            int64_t u = st[i] / inner;
            if (st[i] % inner != 0 || (unit >= 0 && u != unit))
                return 0;
            unit = u;
        }
        inner *= s->bd[i];
    }
    *stride = unit < 0 ? 0 : unit;
    return 1;
}

static cudaDataType_t mm_type(kiln_dtype t)
{
    return t == KILN_DTYPE_F16 ? CUDA_R_16F : t == KILN_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* One cuBLASLt problem: row-major C[m,n] = op(A)·op(B) is computed as the
 * column-major C^T = op(B)^T · op(A)^T, so B is cuBLASLt's first operand. */
typedef struct mm_plan {
    void *ws;                                  /* cuBLASLt workspace and its size */
    size_t ws_size;
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;  /* lb: kiln's B (first), la: kiln's A */
    int32_t n_algos;
    cublasLtMatmulHeuristicResult_t algos[KILN_CUDA_MATMUL_CANDIDATES];
} mm_plan;

static kiln_status mm_layout(const char *name, cublasLtMatrixLayout_t l, cudaDataType_t t, int64_t rows,
                             int64_t cols, int64_t ld, int64_t batch, int64_t stride)
{
    LT_CHECK(name, cublasLtMatrixLayoutInit(l, t, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        int32_t bc = (int32_t)batch;
        LT_CHECK(name, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        LT_CHECK(name, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                        sizeof stride));
    }
    return KILN_OK;
}

/* The alignment, up to 256 bytes, that every address a + k * step keeps. */
static uint32_t mm_align(uintptr_t a, uintptr_t step)
{
    uintptr_t v = a | step | 256u;
    return (uint32_t)(v & (~v + 1u));
}

/* m rows of A against B, `batch` problems with the given element strides;
 * `align` holds the byte alignment of A, B and C as launched (cuBLASLt's
 * heuristic otherwise assumes 256 and may pick kernels that need it). */
static kiln_status mm_plan_init(const char *name, kiln_cuda_device *dev, mm_plan *p, const kiln_matmul_shape *s, int64_t m,
                                kiln_dtype at, kiln_dtype bt, kiln_dtype ct, int64_t batch, int64_t sa, int64_t sb,
                                const uint32_t *align)
{
    if ((at != bt) || (at == KILN_DTYPE_F32 && ct != KILN_DTYPE_F32) ||
        (at != KILN_DTYPE_F32 && ct != at && ct != KILN_DTYPE_F32))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": matmul of %s and %s into %s is not supported on CUDA",
                         name, kiln_dtype_name(at), kiln_dtype_name(bt), kiln_dtype_name(ct));
    if (batch > INT32_MAX)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": matmul batch %lld is too large", name, (long long)batch);
    /* exact f32 (no TF32) so results agree with the CPU reference */
    LT_CHECK(name, cublasLtMatmulDescInit(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opb = s->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = s->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(name, cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
    LT_CHECK(name, cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
    KILN_TRY(mm_layout(name, &p->lb, mm_type(bt), s->tb ? s->k : s->n, s->tb ? s->n : s->k, s->ldb, batch, sb));
    KILN_TRY(mm_layout(name, &p->la, mm_type(at), s->ta ? m : s->k, s->ta ? s->k : m, s->lda, batch, sa));
    KILN_TRY(mm_layout(name, &p->lc, mm_type(ct), s->n, m, s->n, batch, m * s->n));
    cublasLtMatmulPreferenceOpaque_t pref;
    LT_CHECK(name, cublasLtMatmulPreferenceInit(&pref));
    size_t ws = p->ws_size;
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                        sizeof ws));
    /* cuBLASLt's A is kiln's B (see mm_plan) */
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[1],
                                                        sizeof align[1]));
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[0],
                                                        sizeof align[0]));
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2],
                                                        sizeof align[2]));
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2],
                                                        sizeof align[2]));
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(dev->lt, &p->desc, &p->lb, &p->la, &p->lc, &p->lc, &pref,
                                                       KILN_CUDA_MATMUL_CANDIDATES, p->algos, &found);
    if (hs != CUBLAS_STATUS_SUCCESS || found < 1)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": cuBLASLt has no algorithm for this %s matmul (status %d)",
                         name, kiln_dtype_name(at), (int)hs);
    p->n_algos = found;
    return KILN_OK;
}

static kiln_status mm_launch(const char *name, kiln_cuda_device *dev, mm_plan *p, int32_t algo, const void *A,
                             const void *B, void *C, cudaStream_t stream)
{
    const float one = 1.0f, zero = 0.0f;
    LT_CHECK(name, cublasLtMatmul(dev->lt, &p->desc, &one, B, &p->lb, A, &p->la, &zero, C, &p->lc, C, &p->lc,
                                  &p->algos[algo].algo, p->ws, p->ws_size, stream));
    return KILN_OK;
}

static kiln_status run_matmul(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    if (a->layer->n_inputs != 2 || a->layer->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": matmul needs 2 inputs, 1 output", name);
    const kiln_exec_tensor *A = &a->inputs[0], *B = &a->inputs[1], *C = &a->outputs[0];
    if (!kiln_dtype_is_float(A->dtype) || !kiln_dtype_is_float(B->dtype) || !kiln_dtype_is_float(C->dtype))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": matmul of %s and %s into %s", name,
                         kiln_dtype_name(A->dtype), kiln_dtype_name(B->dtype), kiln_dtype_name(C->dtype));
    kiln_matmul_shape s;
    KILN_TRY(kiln_matmul_shape_init(name, a->layer, &A->dims, &B->dims, &C->dims, &s));
    if (s.batches == 0 || s.m == 0 || s.n == 0)
        return KILN_OK;
    cudaStream_t stream = (cudaStream_t)a->stream;
    if (s.k == 0) {
        CU_CHECK(name, cudaMemsetAsync(C->data, 0, (size_t)(s.batches * s.m * s.n) * kiln_dtype_size(C->dtype),
                                       stream));
        return KILN_OK;
    }
    /* A few rows against a weight stored [N, K]: a pass over the weight,
     * which the GEMV kernel streams closer to the memory's rate than
     * cuBLASLt's tiles (bench: matmul_gemv). KILN_CUDA_GEMV=0 turns it off. */
    if (s.tb && !s.ta && s.batches == 1 && A->dtype == B->dtype && a->device->gemv &&
        kcu_gemv_supported((int32_t)s.m, (int32_t)B->dtype, (int32_t)C->dtype, A->data, s.lda, B->data, C->data,
                           s.n, s.n, s.k)) {
        CU_CHECK(name, (cudaError_t)kcu_gemv((int32_t)s.m, (int32_t)B->dtype, (int32_t)C->dtype, A->data, s.lda,
                                             B->data, C->data, s.n, s.n, s.k, stream));
        return KILN_OK;
    }
    size_t ae = kiln_dtype_size(A->dtype), be = kiln_dtype_size(B->dtype), ce = kiln_dtype_size(C->dtype);
    int64_t sa = 0, sb = 0;
    mm_plan p;
    int64_t tactic = a->layer->tactic;
    /* the context's own workspace when the plan gave the layer one, so
     * contexts on different streams never share cuBLASLt scratch */
    if (a->workspace && a->layer->workspace > 0) {
        p.ws = a->workspace;
        p.ws_size = a->layer->workspace;
    } else {
        p.ws = a->device->lt_workspace;
        p.ws_size = KILN_CUDA_CUBLASLT_WORKSPACE;
    }
    uintptr_t astep = 0, bstep = 0;
    for (int32_t i = 0; i < s.nb; i++) {
        astep |= (uintptr_t)s.as[i] * ae;
        bstep |= (uintptr_t)s.bs[i] * be;
    }
    const uint32_t align[3] = {mm_align((uintptr_t)A->data, astep), mm_align((uintptr_t)B->data, bstep),
                               mm_align((uintptr_t)C->data, (uintptr_t)(s.m * s.n) * ce)};
    if (s.b_batches == 1 && !s.ta && s.a_batches == s.batches && mm_uniform(&s, s.as, &sa) &&
        (s.batches == 1 || sa == s.m * s.k)) {
        /* B shared and A's batches contiguous: one tall GEMM */
        KILN_TRY(mm_plan_init(name, a->device, &p, &s, s.batches * s.m, A->dtype, B->dtype, C->dtype, 1, 0, 0, align));
        return mm_launch(name, a->device, &p, tactic >= 0 && tactic < p.n_algos ? (int32_t)tactic : 0, A->data,
                         B->data, C->data, stream);
    }
    if (mm_uniform(&s, s.as, &sa) && mm_uniform(&s, s.bs, &sb)) {
        KILN_TRY(mm_plan_init(name, a->device, &p, &s, s.m, A->dtype, B->dtype, C->dtype, s.batches, sa, sb, align));
        return mm_launch(name, a->device, &p, tactic >= 0 && tactic < p.n_algos ? (int32_t)tactic : 0, A->data,
                         B->data, C->data, stream);
    }
    KILN_TRY(mm_plan_init(name, a->device, &p, &s, s.m, A->dtype, B->dtype, C->dtype, 1, 0, 0, align));
    int32_t algo = tactic >= 0 && tactic < p.n_algos ? (int32_t)tactic : 0;
    for (int64_t b = 0; b < s.batches; b++) {
        int64_t ao, bo;
        kiln_matmul_batch_offsets(&s, b, &ao, &bo);
        KILN_TRY(mm_launch(name, a->device, &p, algo, (const char *)A->data + (size_t)ao * ae,
                           (const char *)B->data + (size_t)bo * be, (char *)C->data + (size_t)(b * s.m * s.n) * ce,
                           stream));
    }
    return KILN_OK;
}

#define TUNE_REPS 5

kiln_status kiln_cuda_matmul_tune(kiln_cuda_device *dev, const kiln_layer *layer, const kiln_exec_tensor *a,
                                  const kiln_exec_tensor *b, const kiln_exec_tensor *c, int64_t *tactic)
{
    const char *name = layer && layer->name ? layer->name : "?";
    if (!dev || !layer || !a || !b || !c || !tactic)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_matmul_tune: missing argument");
    kiln_matmul_shape s;
    KILN_TRY(kiln_matmul_shape_init(name, layer, &a->dims, &b->dims, &c->dims, &s));
    *tactic = -1;
    if (s.batches == 0 || s.m == 0 || s.n == 0 || s.k == 0)
        return KILN_OK;
    /* time one problem of the shape: the tall GEMM when batches fold,
     * else one batch (the strided-batch and looped paths repeat it) */
    int fold = s.b_batches == 1 && !s.ta && s.a_batches == s.batches;
    int64_t sa = 0, sb = 0, m = fold ? s.batches * s.m : s.m, batch = 1;
    if (!fold && mm_uniform(&s, s.as, &sa) && mm_uniform(&s, s.bs, &sb))
        batch = s.batches;
    mm_plan p;
    p.ws = dev->lt_workspace;
    p.ws_size = KILN_CUDA_CUBLASLT_WORKSPACE;
    const uint32_t align[3] = {256, 256, 256}; /* cudaMalloc'd scratch, as arena tensors usually are */
    KILN_TRY(mm_plan_init(name, dev, &p, &s, m, a->dtype, b->dtype, c->dtype, batch, sa, sb, align));
    if (p.n_algos == 1) {
        *tactic = 0;
        return KILN_OK;
    }
    size_t ab = (size_t)count_of(&a->dims) * kiln_dtype_size(a->dtype);
    size_t bb = (size_t)count_of(&b->dims) * kiln_dtype_size(b->dtype);
    size_t cb = (size_t)(batch * m * s.n) * kiln_dtype_size(c->dtype);
    void *da = NULL, *db = NULL, *dc = NULL;
    cudaStream_t stream = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    kiln_status st = KILN_OK;
    cudaError_t e = cudaMalloc(&da, ab);
    if (e == cudaSuccess)
        e = cudaMalloc(&db, bb);
    if (e == cudaSuccess)
        e = cudaMalloc(&dc, cb);
    if (e == cudaSuccess)
        e = cudaMemset(da, 0, ab);
    if (e == cudaSuccess)
        e = cudaMemset(db, 0, bb);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreate(&e0);
    if (e == cudaSuccess)
        e = cudaEventCreate(&e1);
    if (e != cudaSuccess) {
        st = kiln_fail(KILN_ERROR_BACKEND, "layer \"%s\": tuning setup failed: %s", name, cudaGetErrorString(e));
        goto done;
    }
    float best = -1.0f;
    for (int32_t i = 0; i < p.n_algos; i++) {
        /* a candidate that fails to run is skipped, not fatal */
        if (mm_launch(name, dev, &p, i, da, db, dc, stream) != KILN_OK)
            continue;
        e = cudaEventRecord(e0, stream);
        for (int r = 0; r < TUNE_REPS && e == cudaSuccess; r++)
            if (mm_launch(name, dev, &p, i, da, db, dc, stream) != KILN_OK)
                e = cudaErrorLaunchFailure;
        if (e == cudaSuccess)
            e = cudaEventRecord(e1, stream);
        if (e == cudaSuccess)
            e = cudaEventSynchronize(e1);
        float ms = 0.0f;
        if (e == cudaSuccess)
            e = cudaEventElapsedTime(&ms, e0, e1);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            e = cudaSuccess;
            continue;
        }
        if (best < 0.0f || ms < best) {
            best = ms;
            *tactic = i;
        }
    }
    if (best < 0.0f)
        st = kiln_fail(KILN_ERROR_BACKEND, "layer \"%s\": no cuBLASLt candidate ran", name);
done:
    if (stream)
        cudaStreamSynchronize(stream);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (stream)
        cudaStreamDestroy(stream);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    return st;
}

/* ---- plugins ---------------------------------------------------------------------------------------- */

/* Descriptors live on the stack: a launch allocates nothing. */
#define PLUGIN_MAX_TENSORS 64

static kiln_status run_plugin(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    const kiln_plugin *pl = a->plugin;
    const kiln_plugin_ops *ops = pl ? pl->ops : NULL;
    if (!ops || ops->struct_size < offsetof(kiln_plugin_ops, enqueue) + sizeof ops->enqueue || !ops->enqueue)
        return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": no plugin instance to enqueue", name);
    if (!(ops->backends & KILN_BACKEND_BIT(KILN_BACKEND_CUDA)))
        return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": the plugin has no CUDA implementation", name);
    int32_t ni = a->layer->n_inputs, no = a->layer->n_outputs, n = ni + no;
    if (ni < 0 || no < 0 || n > PLUGIN_MAX_TENSORS)
        return kiln_fail(KILN_ERROR_PLUGIN, "layer \"%s\": %d plugin tensors, at most %d are supported", name, (int)n,
                         PLUGIN_MAX_TENSORS);
    kiln_tensor_desc descs[PLUGIN_MAX_TENSORS];
    void *ptrs[PLUGIN_MAX_TENSORS];
    for (int32_t i = 0; i < n; i++) {
        const kiln_exec_tensor *t = i < ni ? &a->inputs[i] : &a->outputs[i - ni];
        memset(&descs[i], 0, sizeof descs[i]);
        descs[i].struct_size = sizeof descs[i];
        descs[i].abi_version = KILN_PLUGIN_ABI_VERSION;
        descs[i].dtype = t->dtype;
        descs[i].format = KILN_FORMAT_LINEAR;
        descs[i].dims = t->dims;
        ptrs[i] = t->data;
    }
    unsigned long fails = kiln_host_fail_count();
    kiln_status st = ops->enqueue(a->plugin, KILN_BACKEND_CUDA, descs, (const void *const *)ptrs, ni, descs + ni,
                                  ptrs + ni, no, a->workspace, a->stream);
    if (st != KILN_OK)
        return kiln_plugin_enqueue_error(name, st, fails);
    return KILN_OK;
}

/* ---- dispatch --------------------------------------------------------------------------------------- */

kiln_status kiln_cuda_run_layer(const kiln_cuda_args *args)
{
    if (!args || !args->layer)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_run_layer: no layer");
    const kiln_layer *l = args->layer;
    if (!args->device)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": no CUDA device", layer_name(args));
    if ((l->n_inputs > 0 && !args->inputs) || (l->n_outputs > 0 && !args->outputs) || l->n_outputs < 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": missing input or output tensors",
                         layer_name(args));
    switch (l->op) {
    case KILN_OP_MATMUL: return run_matmul(args);
    case KILN_OP_BINARY: return run_binary(args);
    case KILN_OP_UNARY: return run_unary(args);
    case KILN_OP_REDUCE: return run_reduce(args);
    case KILN_OP_SOFTMAX: return run_softmax(args);
    case KILN_OP_CONCAT: return run_concat(args);
    case KILN_OP_SLICE: return run_slice(args);
    case KILN_OP_SHUFFLE: return run_shuffle(args);
    case KILN_OP_GATHER: return run_gather(args);
    case KILN_OP_CAST: return run_cast(args);
    case KILN_OP_PLUGIN: return run_plugin(args);
    case KILN_OP_FUSED: return run_fused(args);
    default:
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": op %d is not executed by the CUDA backend",
                         layer_name(args), (int)l->op);
    }
}

#endif
