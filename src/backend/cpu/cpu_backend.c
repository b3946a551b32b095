/* The CPU backend's entry point, and the kernels that only move data
 * (concat, slice, shuffle, gather, cast) plus plugin dispatch. Data
 * movement works on element sizes, so it serves every dtype. */
#include "backend/cpu/cpu_internal.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Bytes below which a copy stays on the calling thread. */
#define KILN_CPU_COPY_PARALLEL_MIN (1 << 20)

/* ---- strided copies -------------------------------------------------------------------- */

/* n elements of `esize` bytes, source elements `stride` elements apart. */
static void copy_strided(char *dst, const char *src, int64_t n, int64_t stride, size_t esize)
{
    if (stride == 1) {
        memcpy(dst, src, (size_t)n * esize);
        return;
    }
    switch (esize) {
    case 1:
        for (int64_t i = 0; i < n; i++)
            dst[i] = src[i * stride];
        break;
    case 2:
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = ((const uint16_t *)src)[i * stride];
        break;
    case 4:
        for (int64_t i = 0; i < n; i++)
            ((uint32_t *)dst)[i] = ((const uint32_t *)src)[i * stride];
        break;
    case 8:
        for (int64_t i = 0; i < n; i++)
            ((uint64_t *)dst)[i] = ((const uint64_t *)src)[i * stride];
        break;
    default:
        for (int64_t i = 0; i < n; i++)
            memcpy(dst + (size_t)i * esize, src + (size_t)(i * stride) * esize, esize);
        break;
    }
}

/* A gather of the source into a contiguous destination: dst element
 * (i_0, ..., i_{r-1}) = src[base + sum i_k * st[k]]. Used by slice and
 * transpose; axes that walk the source contiguously are merged first. */
typedef struct strided_copy {
    const char *src;
    char *dst;
    size_t esize;
    int32_t rank;
    int64_t dims[KILN_MAX_RANK], st[KILN_MAX_RANK];
    int64_t base, rows, inner;
} strided_copy;

static void strided_rows(void *p, int64_t begin, int64_t end)
{
    const strided_copy *c = p;
    int64_t inner_stride = c->st[c->rank - 1];
    for (int64_t r = begin; r < end; r++) {
        int64_t off = c->base, rem = r;
        for (int32_t i = c->rank - 2; i >= 0; i--) {
            off += (rem % c->dims[i]) * c->st[i];
            rem /= c->dims[i];
        }
        copy_strided(c->dst + (size_t)(r * c->inner) * c->esize, c->src + (size_t)off * c->esize, c->inner,
                     inner_stride, c->esize);
    }
}

/* When the source is contiguous along the second-to-last output axis and
 * strided along the last (a 2-D transpose, possibly batched), row-by-row
 * copying reads one element per cache line; 32x32 tiles keep both sides in
 * cache. Units are (outer index, tile row). */
#define TILE 32

#define TILE_COPY(T) \
    do { \
        const T *s_ = (const T *)src; \
        T *d_ = (T *)dst; \
        for (int64_t j0 = 0; j0 < cols; j0 += TILE) { \
            int64_t j1 = j0 + TILE < cols ? j0 + TILE : cols; \
            for (int64_t i = i0; i < i1; i++) \
                for (int64_t j = j0; j < j1; j++) \
                    d_[i * cols + j] = s_[i + j * sc]; \
        } \
    } while (0)

static void tiled_units(void *p, int64_t begin, int64_t end)
{
    const strided_copy *c = p;
    int64_t rows = c->dims[c->rank - 2], cols = c->dims[c->rank - 1], sc = c->st[c->rank - 1];
    int64_t n_tiles = (rows + TILE - 1) / TILE;
    for (int64_t u = begin; u < end; u++) {
        int64_t o = u / n_tiles, i0 = (u % n_tiles) * TILE;
        int64_t i1 = i0 + TILE < rows ? i0 + TILE : rows;
        int64_t off = c->base, rem = o;
        for (int32_t i = c->rank - 3; i >= 0; i--) {
            off += (rem % c->dims[i]) * c->st[i];
            rem /= c->dims[i];
        }
        const char *src = c->src + (size_t)off * c->esize;
        char *dst = c->dst + (size_t)(o * rows * cols) * c->esize;
        switch (c->esize) {
        case 1: TILE_COPY(uint8_t); break;
        case 2: TILE_COPY(uint16_t); break;
        case 4: TILE_COPY(uint32_t); break;
        default: TILE_COPY(uint64_t); break;
        }
    }
}

static void strided_copy_run(const kiln_cpu_args *a, const void *src, void *dst, size_t esize, int32_t rank,
                             const int64_t *dims, const int64_t *st, int64_t base)
{
    strided_copy c = {.src = src, .dst = dst, .esize = esize, .base = base};
    int64_t count = 1;
    for (int32_t i = 0; i < rank; i++) {
        count *= dims[i];
        if (dims[i] == 1)
            continue;
        if (c.rank && c.st[c.rank - 1] == st[i] * dims[i]) {
            c.dims[c.rank - 1] *= dims[i];
            c.st[c.rank - 1] = st[i];
        } else {
            c.dims[c.rank] = dims[i];
            c.st[c.rank++] = st[i];
        }
    }
    if (count == 0)
        return;
    if (c.rank == 0) {
        c.rank = 1;
        c.dims[0] = 1;
        c.st[0] = 1;
    }
    c.inner = c.dims[c.rank - 1];
    c.rows = count / c.inner;
    if (c.rank >= 2 && c.st[c.rank - 1] != 1 && c.st[c.rank - 2] == 1 &&
        (esize == 1 || esize == 2 || esize == 4 || esize == 8)) {
        int64_t units = count / (c.dims[c.rank - 2] * c.inner) * ((c.dims[c.rank - 2] + TILE - 1) / TILE);
        if ((size_t)count * esize < KILN_CPU_COPY_PARALLEL_MIN)
            tiled_units(&c, 0, units);
        else
            kiln_threadpool_run(cpu_pool(a), units, tiled_units, &c);
        return;
    }
    if ((size_t)count * esize < KILN_CPU_COPY_PARALLEL_MIN)
        strided_rows(&c, 0, c.rows);
    else
        kiln_threadpool_run(cpu_pool(a), c.rows, strided_rows, &c);
}

/* dst = src with axes permuted: dst axis i is src axis perm[i]. */
static void transpose(const kiln_cpu_args *a, const void *src, const int64_t *src_dims, int32_t rank,
                      const int32_t *perm, void *dst, size_t esize)
{
    int64_t st[KILN_MAX_RANK], dims[KILN_MAX_RANK], pst[KILN_MAX_RANK], acc = 1;
    for (int32_t i = rank - 1; i >= 0; i--) {
        st[i] = acc;
        acc *= src_dims[i];
    }
    for (int32_t i = 0; i < rank; i++) {
        dims[i] = src_dims[perm[i]];
        pst[i] = st[perm[i]];
    }
    strided_copy_run(a, src, dst, esize, rank, dims, pst, 0);
}

/* ---- concat ------------------------------------------------------------------------------ */

typedef struct concat_job {
    const kiln_cpu_args *a;
    size_t esize;
    int64_t inner, total; /* elements after the axis; output size along it */
} concat_job;

/* Outer rows of the output: each input fills its band of the row. */
static void concat_rows(void *p, int64_t begin, int64_t end)
{
    const concat_job *j = p;
    const kiln_exec_tensor *o = &j->a->outputs[0];
    for (int64_t i = begin; i < end; i++) {
        int64_t col = 0;
        for (int32_t k = 0; k < j->a->layer->n_inputs; k++) {
            const kiln_exec_tensor *x = &j->a->inputs[k];
            int64_t w = x->dims.d[j->a->layer->p.concat.axis] * j->inner;
            memcpy((char *)o->data + (size_t)(i * j->total * j->inner + col) * j->esize,
                   (const char *)x->data + (size_t)(i * w) * j->esize, (size_t)w * j->esize);
            col += w;
        }
    }
}

kiln_status cpu_run_concat(const kiln_cpu_args *a)
{
    int64_t outer, inner, total;
    KILN_TRY(kiln_layer_plan_concat(cpu_layer_name(a), a->layer, a->inputs, a->outputs, &outer, &inner, &total));
    size_t esize = kiln_dtype_size(a->outputs[0].dtype);
    concat_job j = {.a = a, .esize = esize, .inner = inner, .total = total};
    if ((size_t)(outer * total * inner) * esize < KILN_CPU_COPY_PARALLEL_MIN)
        concat_rows(&j, 0, outer);
    else
        kiln_threadpool_run(cpu_pool(a), outer, concat_rows, &j);
    return KILN_OK;
}

/* ---- slice -------------------------------------------------------------------------------- */

kiln_status cpu_run_slice(const kiln_cpu_args *a)
{
    const kiln_exec_tensor *x = &a->inputs[0], *o = &a->outputs[0];
    int64_t step[KILN_MAX_RANK], base;
    int empty;
    KILN_TRY(kiln_layer_plan_slice(cpu_layer_name(a), a->layer, x, o, &base, step, &empty));
    if (empty)
        return KILN_OK;
    strided_copy_run(a, x->data, o->data, kiln_dtype_size(x->dtype), x->dims.rank, o->dims.d, step, base);
    return KILN_OK;
}

/* ---- shuffle ------------------------------------------------------------------------------- */

kiln_status cpu_run_shuffle(const kiln_cpu_args *a)
{
    const kiln_exec_tensor *x = &a->inputs[0], *o = &a->outputs[0];
    const int32_t *perm1 = a->layer->p.shuffle.first, *perm2 = a->layer->p.shuffle.second;
    int first, second;
    KILN_TRY(kiln_layer_check_shuffle(cpu_layer_name(a), a->layer, x, o, &first, &second));
    int64_t count = kiln_exec_count(&x->dims);
    size_t esize = kiln_dtype_size(x->dtype);
    /* The mid shape (after the reshape) is the output permuted back through
     * the second transpose: out[i] = mid[second[i]]. */
    int64_t mid[KILN_MAX_RANK];
    if (second) {
        for (int32_t i = 0; i < o->dims.rank; i++)
            mid[perm2[i]] = o->dims.d[i];
    }
    if (count == 0)
        return KILN_OK;
    void *tmp = NULL;
    const void *src = x->data;
    if (first) {
        if (second) {
            tmp = malloc((size_t)count * esize);
            if (!tmp)
                return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\": out of memory for a shuffle",
                                 cpu_layer_name(a));
        }
        /* The reshape is free: the transposed data, read flat, is the mid tensor. */
        transpose(a, x->data, x->dims.d, x->dims.rank, perm1, second ? tmp : o->data, esize);
        src = tmp;
    }
    if (second)
        transpose(a, src, mid, o->dims.rank, perm2, o->data, esize);
    else if (!first && o->data != x->data)
        memcpy(o->data, x->data, (size_t)count * esize);
    free(tmp);
    return KILN_OK;
}

/* ---- gather -------------------------------------------------------------------------------- */

typedef struct gather_job {
    const kiln_exec_tensor *x, *ix, *o;
    int64_t n_idx, dim;
    size_t row; /* bytes per gathered slice */
} gather_job;

/* Output rows r = (outer index, index position), indices already checked. */
static void gather_rows(void *p, int64_t begin, int64_t end)
{
    const gather_job *j = p;
    for (int64_t r = begin; r < end; r++) {
        int64_t i = r / j->n_idx, k = r % j->n_idx;
        int64_t v =
            j->ix->dtype == KILN_DTYPE_I32 ? ((const int32_t *)j->ix->data)[k] : ((const int64_t *)j->ix->data)[k];
        memcpy((char *)j->o->data + (size_t)r * j->row, (const char *)j->x->data + (size_t)(i * j->dim + v) * j->row,
               j->row);
    }
}

kiln_status cpu_run_gather(const kiln_cpu_args *a)
{
    const char *name = cpu_layer_name(a);
    const kiln_exec_tensor *x = &a->inputs[0], *ix = &a->inputs[1], *o = &a->outputs[0];
    int64_t outer, n_idx, inner, dim;
    KILN_TRY(kiln_layer_plan_gather(name, a->layer, a->inputs, a->outputs, &outer, &n_idx, &inner, &dim));
    /* Check every index before writing, so a bad one leaves no partial output. */
    for (int64_t j = 0; j < n_idx; j++) {
        int64_t v = ix->dtype == KILN_DTYPE_I32 ? ((const int32_t *)ix->data)[j] : ((const int64_t *)ix->data)[j];
        if (v < 0 || v >= dim)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "layer \"%s\": gather index %lld at position %lld is outside [0, %lld)", name,
                             (long long)v, (long long)j, (long long)dim);
    }
    gather_job j = {
        .x = x, .ix = ix, .o = o, .n_idx = n_idx, .dim = dim, .row = (size_t)inner * kiln_dtype_size(x->dtype)};
    int64_t rows = outer * n_idx;
    if ((size_t)rows * j.row < KILN_CPU_COPY_PARALLEL_MIN)
        gather_rows(&j, 0, rows);
    else
        kiln_threadpool_run(cpu_pool(a), rows, gather_rows, &j);
    return KILN_OK;
}

/* ---- cast ----------------------------------------------------------------------------------- */

kiln_status cpu_run_cast(const kiln_cpu_args *a)
{
    const kiln_exec_tensor *x = &a->inputs[0], *o = &a->outputs[0];
    int64_t n;
    KILN_TRY(kiln_layer_check_cast(cpu_layer_name(a), a->layer, a->inputs, a->outputs, &n));
    cpu_convert(cpu_pool(a), o->data, o->dtype, x->data, x->dtype, n);
    return KILN_OK;
}

/* ---- plugins ---------------------------------------------------------------------------------- */

/* The stream of a CPU plugin is the pool; host->parallel_for runs on it
 * (NULL: inline, as the reference wants one thread). */
static kiln_status cpu_run_plugin(const kiln_cpu_args *a)
{
    return kiln_layer_run_plugin(cpu_layer_name(a), a->plugin, KILN_BACKEND_CPU, a->layer, a->inputs, a->outputs,
                                 a->workspace, cpu_pool(a));
}

/* ---- dispatch ------------------------------------------------------------------------------------ */

static kiln_status check_tensor(const kiln_cpu_args *a, const kiln_exec_tensor *t, const char *kind, int32_t i)
{
    int ok = (unsigned)t->dtype < KILN_DTYPE_COUNT && t->dims.rank >= 0 && t->dims.rank <= KILN_MAX_RANK;
    for (int32_t d = 0; ok && d < t->dims.rank; d++)
        ok = t->dims.d[d] >= 0;
    if (!ok)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": %s %d has a bad dtype or shape", cpu_layer_name(a),
                         kind, (int)i);
    if (!t->data && kiln_exec_count(&t->dims) > 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": %s %d has no memory", cpu_layer_name(a), kind,
                         (int)i);
    return KILN_OK;
}

kiln_status kiln_cpu_run_layer(const kiln_cpu_args *args)
{
    if (!args || !args->layer)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cpu_run_layer: no layer");
    const kiln_layer *l = args->layer;
    if ((l->n_inputs > 0 && !args->inputs) || (l->n_outputs > 0 && !args->outputs) || l->n_outputs < 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": missing input or output tensors",
                         cpu_layer_name(args));
    for (int32_t i = 0; i < l->n_inputs; i++)
        KILN_TRY(check_tensor(args, &args->inputs[i], "input", i));
    for (int32_t i = 0; i < l->n_outputs; i++)
        KILN_TRY(check_tensor(args, &args->outputs[i], "output", i));
    switch (l->op) {
    case KILN_OP_MATMUL: return cpu_run_matmul(args);
    case KILN_OP_BINARY: return cpu_run_binary(args);
    case KILN_OP_UNARY: return cpu_run_unary(args);
    case KILN_OP_REDUCE: return cpu_run_reduce(args);
    case KILN_OP_SOFTMAX: return cpu_run_softmax(args);
    case KILN_OP_CONCAT: return cpu_run_concat(args);
    case KILN_OP_SLICE: return cpu_run_slice(args);
    case KILN_OP_SHUFFLE: return cpu_run_shuffle(args);
    case KILN_OP_GATHER: return cpu_run_gather(args);
    case KILN_OP_CAST: return cpu_run_cast(args);
    case KILN_OP_PLUGIN: return cpu_run_plugin(args);
    case KILN_OP_FUSED: return cpu_run_fused(args);
    default:
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": op %d is not executed by the CPU backend",
                         cpu_layer_name(args), (int)l->op);
    }
}
