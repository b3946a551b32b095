/* Elementwise kernels: binary (numpy broadcasting), unary and fused chains.
 *
 * All three share one broadcast walk: the output shape with each input's
 * strides (0 on broadcast axes), with adjacent axes merged wherever every
 * operand allows it. The innermost merged axis is processed in blocks of
 * KILN_CPU_BLOCK elements: each input block is loaded into an f32 buffer
 * (or read in place when it is contiguous f32), the op runs over whole
 * blocks in tight per-op loops the compiler vectorizes, and the result is
 * stored (in place when the output is f32). Work is split over
 * (row, block) units. */
#include "backend/cpu/cpu_internal.h"
#include "backend/broadcast.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- f32 block primitives ------------------------------------------------------- */

/* One binary op over n elements: 8 lanes at a time (vexpr, the same
 * arithmetic as the scalar formula), then the tail by the formula. */
#define BINARY_LOOP(OP, vexpr) \
    do { \
        int64_t i = 0; \
        for (; i + 8 <= n; i += 8) { \
            cpu_v8 x, y, r; \
            cpu_ld8(x, a + i); \
            cpu_ld8(y, b + i); \
            r = vexpr; \
            cpu_st8(out + i, r); \
        } \
        for (; i < n; i++) \
            out[i] = kiln_binary_f32(OP, a[i], b[i]); \
    } while (0)

/* Ops with no vector form: the scalar formula element by element. */
#define SCALAR_LOOP(expr) \
    do { \
        for (int64_t i = 0; i < n; i++) \
            out[i] = expr; \
    } while (0)

CPU_SIMD static void cpu_binary_f32_simd(kiln_binary_op op, const float *a, const float *b, float *out, int64_t n)
{
    switch (op) {
    case KILN_BINARY_ADD: BINARY_LOOP(KILN_BINARY_ADD, x + y); break;
    case KILN_BINARY_SUB: BINARY_LOOP(KILN_BINARY_SUB, x - y); break;
    case KILN_BINARY_MUL: BINARY_LOOP(KILN_BINARY_MUL, x * y); break;
    case KILN_BINARY_DIV: BINARY_LOOP(KILN_BINARY_DIV, x / y); break;
    case KILN_BINARY_POW: SCALAR_LOOP(kiln_binary_f32(KILN_BINARY_POW, a[i], b[i])); break;
    case KILN_BINARY_MAX: BINARY_LOOP(KILN_BINARY_MAX, cpu_select8((cpu_u8)(x > y), x, y)); break;
    case KILN_BINARY_MIN: BINARY_LOOP(KILN_BINARY_MIN, cpu_select8((cpu_u8)(x < y), x, y)); break;
    default: break;
    }
}

void cpu_binary_f32(kiln_binary_op op, const float *a, const float *b, float *out, int64_t n)
{
    cpu_binary_f32_simd(op, a, b, out, n);
}

/* One unary op over n elements, 8 lanes at a time; the tail goes through
 * a padded vector too, so every element sees the same arithmetic. */
#define UNARY_LOOP(fn) \
    do { \
        int64_t i = 0; \
        cpu_v8 v, r; \
        for (; i + 8 <= n; i += 8) { \
            cpu_ld8(v, x + i); \
            fn(&r, &v); \
            cpu_st8(out + i, r); \
        } \
        if (i < n) { \
            float t_[8] = {0}; \
            memcpy(t_, x + i, (size_t)(n - i) * sizeof(float)); \
            cpu_ld8(v, t_); \
            fn(&r, &v); \
            cpu_st8(t_, r); \
            memcpy(out + i, t_, (size_t)(n - i) * sizeof(float)); \
        } \
    } while (0)

static inline void neg8(cpu_v8 *r, const cpu_v8 *v) { *r = -*v; }
static inline void abs8(cpu_v8 *r, const cpu_v8 *v) { *r = (cpu_v8)((cpu_u8)*v & 0x7fffffffu); }

static inline void relu8(cpu_v8 *r, const cpu_v8 *v)
{
    const cpu_v8 zero = {0};
    *r = cpu_select8((cpu_u8)(*v > zero), *v, zero);
}

static inline void sigmoid8(cpu_v8 *r, const cpu_v8 *v)
{
    cpu_v8 m = -*v, e;
    cpu_exp8(&e, &m);
    *r = 1.0f / (1.0f + e);
}

static inline void silu8(cpu_v8 *r, const cpu_v8 *v)
{
    cpu_v8 m = -*v, e;
    cpu_exp8(&e, &m);
    *r = *v / (1.0f + e);
}

static inline void gelu_tanh8(cpu_v8 *r, const cpu_v8 *pv)
{
    /* tanh(z) = 1 - 2 / (e^{2z} + 1): exact limits at ±inf through exp */
    cpu_v8 v = *pv, e;
    cpu_v8 z2 = 2.0f * KILN_GELU_TANH_K * (v + KILN_GELU_TANH_C * v * v * v);
    cpu_exp8(&e, &z2);
    *r = 0.5f * v * (1.0f + (1.0f - 2.0f / (e + 1.0f)));
}

CPU_SIMD static void cpu_unary_f32_simd(kiln_unary_op op, const float *x, float *out, int64_t n)
{
    switch (op) {
    case KILN_UNARY_NEG: UNARY_LOOP(neg8); break;
    case KILN_UNARY_ABS: UNARY_LOOP(abs8); break;
    case KILN_UNARY_EXP: UNARY_LOOP(cpu_exp8); break;
    case KILN_UNARY_LOG: SCALAR_LOOP(kiln_unary_f32(KILN_UNARY_LOG, x[i])); break;
    case KILN_UNARY_SQRT: SCALAR_LOOP(kiln_unary_f32(KILN_UNARY_SQRT, x[i])); break;
    case KILN_UNARY_RSQRT: SCALAR_LOOP(kiln_unary_f32(KILN_UNARY_RSQRT, x[i])); break;
    case KILN_UNARY_TANH: SCALAR_LOOP(kiln_unary_f32(KILN_UNARY_TANH, x[i])); break;
    case KILN_UNARY_SIGMOID: UNARY_LOOP(sigmoid8); break;
    case KILN_UNARY_RELU: UNARY_LOOP(relu8); break;
    case KILN_UNARY_GELU_ERF: SCALAR_LOOP(kiln_unary_f32(KILN_UNARY_GELU_ERF, x[i])); break;
    case KILN_UNARY_GELU_TANH: UNARY_LOOP(gelu_tanh8); break;
    case KILN_UNARY_SILU: UNARY_LOOP(silu8); break;
    default: break;
    }
}

void cpu_unary_f32(kiln_unary_op op, const float *x, float *out, int64_t n) { cpu_unary_f32_simd(op, x, out, n); }

/* ---- the broadcast walk ------------------------------------------------------------ */

typedef struct bcast {
    int32_t rank; /* merged axes, >= 1 */
    int32_t n_ops;
    int64_t dims[KILN_MAX_RANK];
    int64_t st[KILN_FUSED_MAX_INPUTS][KILN_MAX_RANK]; /* element strides, 0 = broadcast */
    int64_t rows, inner, n_blocks;                    /* rows × blocks of the innermost axis */
} bcast;

static kiln_status bcast_init(bcast *b, const kiln_cpu_args *a, const kiln_dims *out, const kiln_exec_tensor *ins,
                              int32_t n_ins)
{
    memset(b, 0, sizeof *b);
    b->n_ops = n_ins;
    kiln_broadcast w;
    KILN_TRY(kiln_broadcast_init(&w, cpu_layer_name(a), out, ins, n_ins));
    b->rank = w.rank;
    memcpy(b->dims, w.dims, sizeof b->dims);
    memcpy(b->st, w.st, sizeof b->st);
    if (b->rank == 0) {
        b->rank = 1;
        b->dims[0] = kiln_exec_count(out) ? 1 : 0;
    }
    b->rows = 1;
    for (int32_t i = 0; i < b->rank - 1; i++)
        b->rows *= b->dims[i];
    b->inner = b->dims[b->rank - 1];
    b->n_blocks = (b->inner + KILN_CPU_BLOCK - 1) / KILN_CPU_BLOCK;
    return KILN_OK;
}

/* Element offsets of operand k and of the output at unit u; *n receives the
 * block length. */
static void bcast_unit(const bcast *b, int64_t u, int64_t *offs, int64_t *out_off, int64_t *n)
{
    int64_t row = u / b->n_blocks, i0 = (u % b->n_blocks) * KILN_CPU_BLOCK;
    for (int32_t k = 0; k < b->n_ops; k++)
        offs[k] = i0 * b->st[k][b->rank - 1];
    int64_t rem = row;
    for (int32_t i = b->rank - 2; i >= 0; i--) {
        int64_t c = rem % b->dims[i];
        rem /= b->dims[i];
        for (int32_t k = 0; k < b->n_ops; k++)
            offs[k] += c * b->st[k][i];
    }
    *out_off = row * b->inner + i0;
    *n = b->inner - i0 < KILN_CPU_BLOCK ? b->inner - i0 : KILN_CPU_BLOCK;
}

/* A block of an operand as f32: in place when contiguous f32. */
static const float *load_block(float *buf, const void *base, kiln_dtype t, int64_t off, int64_t stride, int64_t n)
{
    if (stride == 0) {
        float v = kiln_load_f32(base, t, off);
        for (int64_t i = 0; i < n; i++)
            buf[i] = v;
        return buf;
    }
    switch (t) {
    case KILN_DTYPE_F32: return (const float *)base + off;
    case KILN_DTYPE_F16:
    case KILN_DTYPE_BF16: cpu_widen(buf, (const uint16_t *)base + off, t, n); return buf;
    default:
        for (int64_t i = 0; i < n; i++)
            buf[i] = kiln_load_f32(base, t, off + i);
        return buf;
    }
}

/* Where to compute an output block: the output itself when it is f32. */
static float *out_block(float *buf, void *base, kiln_dtype t, int64_t off)
{
    return t == KILN_DTYPE_F32 ? (float *)base + off : buf;
}

static void store_block(void *base, kiln_dtype t, int64_t off, const float *v, int64_t n)
{
    switch (t) {
    case KILN_DTYPE_F32: break; /* computed in place */
    case KILN_DTYPE_F16: cpu_narrow_f16((uint16_t *)base + off, v, n); break;
    case KILN_DTYPE_BF16: cpu_narrow_bf16((uint16_t *)base + off, v, n); break;
    default:
        for (int64_t i = 0; i < n; i++)
            kiln_store_f32(base, t, off + i, v[i]);
        break;
    }
}

static void bcast_run(const kiln_cpu_args *a, const bcast *b, kiln_parallel_fn fn, void *job)
{
    int64_t units = b->rows * b->n_blocks;
    if (b->rows * b->inner < KILN_CPU_PARALLEL_MIN)
        fn(job, 0, units);
    else
        kiln_threadpool_run(cpu_pool(a), units, fn, job);
}

/* ---- binary ---------------------------------------------------------------------------- */

typedef struct ew_job {
    const kiln_cpu_args *a;
    bcast b;
    int32_t op;
} ew_job;

static void binary_float_units(void *p, int64_t begin, int64_t end)
{
    const ew_job *j = p;
    const kiln_exec_tensor *x = &j->a->inputs[0], *y = &j->a->inputs[1], *o = &j->a->outputs[0];
    float ba[KILN_CPU_BLOCK], bb[KILN_CPU_BLOCK], bo[KILN_CPU_BLOCK];
    for (int64_t u = begin; u < end; u++) {
        int64_t offs[2], oo, n;
        bcast_unit(&j->b, u, offs, &oo, &n);
        const float *pa = load_block(ba, x->data, x->dtype, offs[0], j->b.st[0][j->b.rank - 1], n);
        const float *pb = load_block(bb, y->data, y->dtype, offs[1], j->b.st[1][j->b.rank - 1], n);
        float *po = out_block(bo, o->data, o->dtype, oo);
        cpu_binary_f32((kiln_binary_op)j->op, pa, pb, po, n);
        store_block(o->data, o->dtype, oo, po, n);
    }
}

static void binary_int_units(void *p, int64_t begin, int64_t end)
{
    const ew_job *j = p;
    const kiln_exec_tensor *x = &j->a->inputs[0], *y = &j->a->inputs[1], *o = &j->a->outputs[0];
    int64_t sa = j->b.st[0][j->b.rank - 1], sb = j->b.st[1][j->b.rank - 1];
    for (int64_t u = begin; u < end; u++) {
        int64_t offs[2], oo, n;
        bcast_unit(&j->b, u, offs, &oo, &n);
        for (int64_t i = 0; i < n; i++)
            kiln_elem_store_wrap(o->data, o->dtype, oo + i,
                                 kiln_binary_int(j->op, kiln_elem_load_int(x->data, x->dtype, offs[0] + i * sa),
                                                 kiln_elem_load_int(y->data, y->dtype, offs[1] + i * sb)));
    }
}

kiln_status cpu_run_binary(const kiln_cpu_args *a)
{
    const char *name = cpu_layer_name(a);
    KILN_TRY(kiln_layer_check_binary(name, a->layer, a->inputs, a->outputs));
    kiln_binary_op op = a->layer->p.binary.op;
    kiln_dtype t = a->outputs[0].dtype;
    ew_job j = {.a = a, .op = op};
    KILN_TRY(bcast_init(&j.b, a, &a->outputs[0].dims, a->inputs, 2));
    if (kiln_dtype_is_float(t))
        bcast_run(a, &j.b, binary_float_units, &j);
    else if (kiln_exec_is_int(t))
        bcast_run(a, &j.b, binary_int_units, &j);
    else
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": binary %s on %s is not supported", name,
                         kiln_binary_op_name(op), kiln_dtype_name(t));
    return KILN_OK;
}

/* ---- unary --------------------------------------------------------------------------------- */

static void unary_float_units(void *p, int64_t begin, int64_t end)
{
    const ew_job *j = p;
    const kiln_exec_tensor *x = &j->a->inputs[0], *o = &j->a->outputs[0];
    float bx[KILN_CPU_BLOCK], bo[KILN_CPU_BLOCK];
    for (int64_t u = begin; u < end; u++) {
        int64_t off, oo, n;
        bcast_unit(&j->b, u, &off, &oo, &n);
        const float *px = load_block(bx, x->data, x->dtype, off, j->b.st[0][j->b.rank - 1], n);
        float *po = out_block(bo, o->data, o->dtype, oo);
        cpu_unary_f32((kiln_unary_op)j->op, px, po, n);
        store_block(o->data, o->dtype, oo, po, n);
    }
}

static void unary_int_units(void *p, int64_t begin, int64_t end)
{
    const ew_job *j = p;
    const kiln_exec_tensor *x = &j->a->inputs[0], *o = &j->a->outputs[0];
    for (int64_t u = begin; u < end; u++) {
        int64_t off, oo, n;
        bcast_unit(&j->b, u, &off, &oo, &n);
        for (int64_t i = 0; i < n; i++)
            kiln_elem_store_wrap(o->data, o->dtype, oo + i,
                                 kiln_unary_int(j->op, kiln_elem_load_int(x->data, x->dtype, off + i)));
    }
}

kiln_status cpu_run_unary(const kiln_cpu_args *a)
{
    const char *name = cpu_layer_name(a);
    KILN_TRY(kiln_layer_check_unary(name, a->layer, a->inputs, a->outputs));
    kiln_unary_op op = a->layer->p.unary.op;
    kiln_dtype t = a->outputs[0].dtype;
    ew_job j = {.a = a, .op = op};
    KILN_TRY(bcast_init(&j.b, a, &a->outputs[0].dims, &a->outputs[0], 1));
    int int_ok = op == KILN_UNARY_NEG || op == KILN_UNARY_ABS || op == KILN_UNARY_RELU;
    if (kiln_dtype_is_float(t))
        bcast_run(a, &j.b, unary_float_units, &j);
    else if (kiln_exec_is_int(t) && int_ok)
        bcast_run(a, &j.b, unary_int_units, &j);
    else
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": unary %s on %s is not supported", name,
                         kiln_unary_op_name(op), kiln_dtype_name(t));
    return KILN_OK;
}

/* ---- fused elementwise chains -------------------------------------------------------------- */

static void fused_step_block(const kiln_fused_step *s, const float *const *ops, float *out, int64_t n)
{
    if (s->is_binary)
        cpu_binary_f32((kiln_binary_op)s->op, ops[s->a], ops[s->b], out, n);
    else
        cpu_unary_f32((kiln_unary_op)s->op, ops[s->a], out, n);
}

static void fused_units(void *p, int64_t begin, int64_t end)
{
    const ew_job *j = p;
    const kiln_cpu_args *a = j->a;
    const kiln_layer *l = a->layer;
    const kiln_exec_tensor *o = &a->outputs[0];
    int32_t n_in = l->n_inputs, n_steps = l->p.fused.n_steps;
    float in_buf[KILN_FUSED_MAX_INPUTS][KILN_CPU_BLOCK];
    float regs[KILN_FUSED_MAX_STEPS][KILN_CPU_BLOCK];
    const float *ops[KILN_FUSED_MAX_INPUTS + KILN_FUSED_MAX_STEPS];
    for (int32_t s = 0; s < n_steps; s++)
        ops[n_in + s] = regs[s];
    for (int64_t u = begin; u < end; u++) {
        int64_t offs[KILN_FUSED_MAX_INPUTS], oo, n;
        bcast_unit(&j->b, u, offs, &oo, &n);
        for (int32_t k = 0; k < n_in; k++)
            ops[k] =
                load_block(in_buf[k], a->inputs[k].data, a->inputs[k].dtype, offs[k], j->b.st[k][j->b.rank - 1], n);
        for (int32_t s = 0; s < n_steps - 1; s++)
            fused_step_block(&l->p.fused.steps[s], ops, regs[s], n);
        float *po = out_block(regs[n_steps - 1], o->data, o->dtype, oo);
        fused_step_block(&l->p.fused.steps[n_steps - 1], ops, po, n);
        store_block(o->data, o->dtype, oo, po, n);
    }
}

/* Reference: every input broadcast to a full-size f32 array, then each step
 * over whole arrays, so every intermediate exists as in an unfused graph. */
static kiln_status fused_reference(const kiln_cpu_args *a, const bcast *b)
{
    const kiln_layer *l = a->layer;
    int32_t n_in = l->n_inputs, n_steps = l->p.fused.n_steps;
    int64_t count = kiln_exec_count(&a->outputs[0].dims);
    size_t bytes = (size_t)(count > 0 ? count : 1) * sizeof(float);
    float *arr[KILN_FUSED_MAX_INPUTS + KILN_FUSED_MAX_STEPS] = {0};
    kiln_status st = KILN_OK;
    for (int32_t k = 0; k < n_in + n_steps; k++) {
        arr[k] = malloc(bytes);
        if (!arr[k]) {
            st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\": out of memory for %zu bytes", cpu_layer_name(a),
                           bytes);
            goto done;
        }
    }
    float buf[KILN_CPU_BLOCK];
    for (int64_t u = 0; u < b->rows * b->n_blocks; u++) {
        int64_t offs[KILN_FUSED_MAX_INPUTS], oo, n;
        bcast_unit(b, u, offs, &oo, &n);
        for (int32_t k = 0; k < n_in; k++) {
            const float *v = load_block(buf, a->inputs[k].data, a->inputs[k].dtype, offs[k], b->st[k][b->rank - 1], n);
            memcpy(arr[k] + oo, v, (size_t)n * sizeof(float));
        }
    }
    for (int32_t s = 0; s < n_steps; s++)
        fused_step_block(&l->p.fused.steps[s], (const float *const *)arr, arr[n_in + s], count);
    cpu_convert(NULL, a->outputs[0].data, a->outputs[0].dtype, arr[n_in + n_steps - 1], KILN_DTYPE_F32, count);
done:
    for (int32_t k = 0; k < n_in + n_steps; k++)
        free(arr[k]);
    return st;
}

kiln_status cpu_run_fused(const kiln_cpu_args *a)
{
    KILN_TRY(kiln_layer_check_fused(cpu_layer_name(a), a->layer, a->inputs, a->outputs));
    int32_t n_in = a->layer->n_inputs;
    ew_job j = {.a = a};
    KILN_TRY(bcast_init(&j.b, a, &a->outputs[0].dims, a->inputs, n_in));
    if (a->reference)
        return fused_reference(a, &j.b);
    bcast_run(a, &j.b, fused_units, &j);
    return KILN_OK;
}
