/* Reductions and softmax. Both work on "lines": a reduce output element
 * gathers the input over the reduced axes; a softmax line runs along one
 * axis. Lines are independent, so they are split across the pool. Sums
 * accumulate in f64 (per block of KILN_CPU_BLOCK in f32 lanes), and the
 * result does not depend on how lines are split. */
#include "backend/cpu/cpu_internal.h"

#include <math.h>
#include <string.h>

/* ---- reduce -------------------------------------------------------------------------- */

typedef struct reduce_job {
    const kiln_cpu_args *a;
    kiln_reduce_op op;
    kiln_reduce_plan g; /* the geometry */
} reduce_job;

/* A block of a contiguous line as f32 (in place for f32). */
static const float *line_block(float *buf, const void *base, kiln_dtype t, int64_t off, int64_t n)
{
    if (t == KILN_DTYPE_F32)
        return (const float *)base + off;
    if (t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16)
        cpu_widen(buf, (const uint16_t *)base + off, t, n);
    else
        for (int64_t i = 0; i < n; i++)
            buf[i] = kiln_load_f32(base, t, off + i);
    return buf;
}

/* Folds a contiguous f32 block into the running sum or extreme. NaN wins a
 * max/min, as in numpy. */
CPU_SIMD static void reduce_block(kiln_reduce_op op, const float *v, int64_t n, double *sum, float *best)
{
    int64_t i = 0;
    if (op == KILN_REDUCE_SUM || op == KILN_REDUCE_MEAN) {
        cpu_v8 acc = {0}, x;
        for (; i + 8 <= n; i += 8) {
            cpu_ld8(x, v + i);
            acc += x;
        }
        float t = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; i < n; i++)
            t += v[i];
        *sum += t;
        return;
    }
    int is_max = op == KILN_REDUCE_MAX;
    float b = *best;
    if (n >= 8) {
        cpu_v8 m, x;
        cpu_ld8(m, v);
        for (i = 8; i + 8 <= n; i += 8) {
            cpu_ld8(x, v + i);
            cpu_u8 take = (cpu_u8)(is_max ? x > m : x < m) | (cpu_u8)(x != x);
            m = cpu_select8(take, x, m);
        }
        for (int k = 0; k < 8; k++)
            b = (is_max ? m[k] > b : m[k] < b) || m[k] != m[k] ? m[k] : b;
    }
    for (; i < n; i++)
        b = (is_max ? v[i] > b : v[i] < b) || v[i] != v[i] ? v[i] : b;
    *best = b;
}

/* One run of `inner` elements, `istride` apart, from element `off`. */
static void reduce_run(const reduce_job *j, const kiln_exec_tensor *x, int64_t off, int64_t inner, int64_t istride,
                       double *sum, float *best)
{
    if (istride == 1 && kiln_dtype_is_float(x->dtype)) {
        float buf[KILN_CPU_BLOCK];
        for (int64_t b0 = 0; b0 < inner; b0 += KILN_CPU_BLOCK) {
            int64_t n = inner - b0 < KILN_CPU_BLOCK ? inner - b0 : KILN_CPU_BLOCK;
            reduce_block(j->op, line_block(buf, x->data, x->dtype, off + b0, n), n, sum, best);
        }
        return;
    }
    int is_max = j->op == KILN_REDUCE_MAX;
    for (int64_t i = 0; i < inner; i++) {
        float v = kiln_load_f32(x->data, x->dtype, off + i * istride);
        if (j->op == KILN_REDUCE_SUM || j->op == KILN_REDUCE_MEAN)
            *sum += v;
        else
            *best = (is_max ? v > *best : v < *best) || v != v ? v : *best;
    }
}

static void reduce_units(void *p, int64_t begin, int64_t end)
{
    const reduce_job *j = p;
    const kiln_exec_tensor *x = &j->a->inputs[0], *o = &j->a->outputs[0];
    const kiln_reduce_plan *g = &j->g;
    int64_t inner = g->n_red ? g->red_dims[g->n_red - 1] : 1;
    int64_t istride = g->n_red ? g->red_st[g->n_red - 1] : 0;
    int64_t outer = inner ? j->g.rcount / inner : 0;
    for (int64_t u = begin; u < end; u++) {
        int64_t base = 0, rem = u;
        for (int32_t i = j->g.n_kept - 1; i >= 0; i--) {
            base += (rem % j->g.kept_dims[i]) * j->g.kept_st[i];
            rem /= j->g.kept_dims[i];
        }
        double sum = 0.0;
        float best = j->op == KILN_REDUCE_MAX ? -INFINITY : INFINITY;
        int64_t idx[KILN_MAX_RANK] = {0};
        for (int64_t r = 0; r < outer; r++) {
            int64_t off = base;
            for (int32_t i = 0; i < j->g.n_red - 1; i++)
                off += idx[i] * j->g.red_st[i];
            reduce_run(j, x, off, inner, istride, &sum, &best);
            /* odometer over the outer reduced axes */
            for (int32_t i = j->g.n_red - 2; i >= 0; i--) {
                if (++idx[i] < j->g.red_dims[i])
                    break;
                idx[i] = 0;
            }
        }
        float v;
        if (j->op == KILN_REDUCE_SUM)
            v = (float)sum;
        else if (j->op == KILN_REDUCE_MEAN)
            v = (float)(sum / (double)j->g.rcount);
        else
            v = best;
        kiln_store_f32(o->data, o->dtype, u, v);
    }
}

kiln_status cpu_run_reduce(const kiln_cpu_args *a)
{
    reduce_job j = {.a = a, .op = a->layer->p.reduce.op};
    KILN_TRY(kiln_layer_plan_reduce(cpu_layer_name(a), a->layer, a->inputs, a->outputs, &j.g));
    if (j.g.kept * j.g.rcount < KILN_CPU_PARALLEL_MIN)
        reduce_units(&j, 0, j.g.kept);
    else
        kiln_threadpool_run(cpu_pool(a), j.g.kept, reduce_units, &j);
    return KILN_OK;
}

/* ---- softmax ------------------------------------------------------------------------------ */

typedef struct softmax_job {
    const kiln_cpu_args *a;
    int64_t len, inner;
} softmax_job;

/* dst = e^(src - m) over n elements; returns their sum. */
CPU_SIMD static double exp_shifted(float *dst, const float *src, float m, int64_t n)
{
    cpu_v8 acc = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        cpu_v8 d, e;
        cpu_ld8(d, src + i);
        d -= m;
        cpu_exp8(&e, &d);
        cpu_st8(dst + i, e);
        acc += e;
    }
    double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    if (i < n) {
        float t[8] = {0};
        memcpy(t, src + i, (size_t)(n - i) * sizeof(float));
        cpu_v8 d, e;
        cpu_ld8(d, t);
        d -= m;
        cpu_exp8(&e, &d);
        cpu_st8(t, e);
        memcpy(dst + i, t, (size_t)(n - i) * sizeof(float));
        for (int64_t k = 0; k < n - i; k++)
            sum += t[k];
    }
    return sum;
}

/* One lane of cpu_exp8, so strided lines match contiguous ones exactly. */
static float exp1(float x)
{
    cpu_v8 v = {x}, e;
    cpu_exp8(&e, &v);
    return e[0];
}

CPU_SIMD static void scale_f32(float *p, float s, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        cpu_v8 v;
        cpu_ld8(v, p + i);
        v *= s;
        cpu_st8(p + i, v);
    }
    for (; i < n; i++)
        p[i] *= s;
}

/* max, then sum of exp in f64, then exp(x - max) / sum. Contiguous lines
 * go block by block (the f32 output keeps exp between passes); strided
 * lines (softmax over a non-last axis) go element by element. */
static void softmax_units(void *p, int64_t begin, int64_t end)
{
    const softmax_job *j = p;
    const kiln_exec_tensor *x = &j->a->inputs[0], *o = &j->a->outputs[0];
    int64_t len = j->len, inner = j->inner;
    float buf[KILN_CPU_BLOCK], ob[KILN_CPU_BLOCK];
    for (int64_t u = begin; u < end; u++) {
        int64_t base = (u / inner) * len * inner + u % inner;
        if (inner == 1) {
            float m = -INFINITY;
            for (int64_t b0 = 0; b0 < len; b0 += KILN_CPU_BLOCK) {
                int64_t n = len - b0 < KILN_CPU_BLOCK ? len - b0 : KILN_CPU_BLOCK;
                const float *v = line_block(buf, x->data, x->dtype, base + b0, n);
                for (int64_t i = 0; i < n; i++)
                    m = v[i] > m ? v[i] : m;
            }
            double sum = 0.0;
            for (int64_t b0 = 0; b0 < len; b0 += KILN_CPU_BLOCK) {
                int64_t n = len - b0 < KILN_CPU_BLOCK ? len - b0 : KILN_CPU_BLOCK;
                const float *v = line_block(buf, x->data, x->dtype, base + b0, n);
                float *e = o->dtype == KILN_DTYPE_F32 ? (float *)o->data + base + b0 : ob;
                sum += exp_shifted(e, v, m, n);
            }
            float inv = (float)(1.0 / sum);
            for (int64_t b0 = 0; b0 < len; b0 += KILN_CPU_BLOCK) {
                int64_t n = len - b0 < KILN_CPU_BLOCK ? len - b0 : KILN_CPU_BLOCK;
                if (o->dtype == KILN_DTYPE_F32) {
                    scale_f32((float *)o->data + base + b0, inv, n);
                    continue;
                }
                const float *v = line_block(buf, x->data, x->dtype, base + b0, n);
                exp_shifted(ob, v, m, n);
                scale_f32(ob, inv, n);
                cpu_convert(NULL, (char *)o->data + (size_t)(base + b0) * kiln_dtype_size(o->dtype), o->dtype, ob,
                            KILN_DTYPE_F32, n);
            }
            continue;
        }
        float m = -INFINITY;
        for (int64_t i = 0; i < len; i++) {
            float v = kiln_load_f32(x->data, x->dtype, base + i * inner);
            m = v > m ? v : m;
        }
        double sum = 0.0;
        for (int64_t i = 0; i < len; i++)
            sum += exp1(kiln_load_f32(x->data, x->dtype, base + i * inner) - m);
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < len; i++) {
            float e = exp1(kiln_load_f32(x->data, x->dtype, base + i * inner) - m);
            kiln_store_f32(o->data, o->dtype, base + i * inner, e * inv);
        }
    }
}

kiln_status cpu_run_softmax(const kiln_cpu_args *a)
{
    softmax_job j = {.a = a};
    int64_t count;
    KILN_TRY(kiln_layer_plan_softmax(cpu_layer_name(a), a->layer, a->inputs, a->outputs, &count, &j.len, &j.inner));
    if (count == 0)
        return KILN_OK;
    int64_t lines = count / j.len;
    if (count < KILN_CPU_PARALLEL_MIN / 8) /* exp makes each element costly */
        softmax_units(&j, 0, lines);
    else
        kiln_threadpool_run(cpu_pool(a), lines, softmax_units, &j);
    return KILN_OK;
}
