/* The checks every backend makes on a layer before running it, and the
 * plugin call, written once for the CPU and CUDA op entries. Each fails
 * with a message naming the layer (`name`). */
#ifndef KILN_BACKEND_LAYER_CHECK_H
#define KILN_BACKEND_LAYER_CHECK_H

#include "backend/backend.h"

/* Element count of concrete dims (negative dims count as zero). */
static inline int64_t kiln_exec_count(const kiln_dims *d)
{
    int64_t n = 1;
    for (int32_t i = 0; i < d->rank; i++)
        n *= d->d[i] > 0 ? d->d[i] : 0;
    return n;
}

/* Row-major element strides of dims. */
static inline void kiln_exec_strides(const kiln_dims *d, int64_t *s)
{
    int64_t acc = 1;
    for (int32_t i = d->rank - 1; i >= 0; i--) {
        s[i] = acc;
        acc *= d->d[i];
    }
}

/* The integer dtypes arithmetic takes (bool is not one). */
static inline int kiln_exec_is_int(kiln_dtype t)
{
    return t == KILN_DTYPE_I8 || t == KILN_DTYPE_U8 || t == KILN_DTYPE_I32 || t == KILN_DTYPE_I64;
}

/* Binary: 2 inputs, 1 output, a known op, one dtype for all three. */
kiln_status kiln_layer_check_binary(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                    const kiln_exec_tensor *out);
/* Unary: 1 input, 1 output, a known op, one dtype, equal element counts. */
kiln_status kiln_layer_check_unary(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                   const kiln_exec_tensor *out);
/* Fused chain: 1..KILN_FUSED_MAX_INPUTS float inputs, 1 float output,
 * 1..KILN_FUSED_MAX_STEPS steps each reading inputs or earlier steps. */
kiln_status kiln_layer_check_fused(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                   const kiln_exec_tensor *out);
/* A reduction's geometry: output element u is the line of input elements
 * at offset kept(u) + red(j), j < rcount, where kept maps u's row-major
 * coordinates over kept_dims through kept_st and red maps j over red_dims
 * through red_st. Adjacent axes of one kind that step through memory as
 * one are merged. */
typedef struct kiln_reduce_plan {
    int32_t n_kept, n_red;
    int64_t kept_dims[KILN_MAX_RANK], kept_st[KILN_MAX_RANK];
    int64_t red_dims[KILN_MAX_RANK], red_st[KILN_MAX_RANK];
    int64_t kept, rcount; /* output elements, elements per line */
} kiln_reduce_plan;

/* Reduce: 1 input, 1 output, a known op, axes inside the rank, the same
 * numeric (not bool, not fp8) dtype in and out, as many output elements as
 * kept ones; then the geometry into *plan. */
kiln_status kiln_layer_plan_reduce(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                   const kiln_exec_tensor *out, kiln_reduce_plan *plan);

/* Slice: input and output of one dtype and rank, every axis's window
 * inside the input. *base receives the element offset of the first
 * element read, step[i] the input stride of output axis i; *empty whether
 * the output has no elements. */
kiln_status kiln_layer_plan_slice(const char *name, const kiln_layer *l, const kiln_exec_tensor *x,
                                  const kiln_exec_tensor *o, int64_t *base, int64_t *step, int *empty);
/* Shuffle: input and output of one dtype and element count, each present
 * transpose a permutation. *first / *second: whether each transpose is
 * present and not the identity. */
kiln_status kiln_layer_check_shuffle(const char *name, const kiln_layer *l, const kiln_exec_tensor *x,
                                     const kiln_exec_tensor *o, int *first, int *second);

/* Concat: 1+ inputs of the output's dtype and rank, equal but along
 * `axis`, their sizes along it summing to the output's. The output is
 * *outer rows of *total * *inner elements (per row, input k's band is its
 * dims[axis] * inner elements). */
kiln_status kiln_layer_plan_concat(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                   const kiln_exec_tensor *out, int64_t *outer, int64_t *inner, int64_t *total);
/* Gather: data, i32/i64 indices, output of data's dtype with outer * n_idx
 * * inner elements; *dim is data's size along the axis. */
kiln_status kiln_layer_plan_gather(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                   const kiln_exec_tensor *out, int64_t *outer, int64_t *n_idx, int64_t *inner,
                                   int64_t *dim);
/* Softmax: float in and out of one element count, the axis inside the
 * rank; lines of *len elements *inner apart; *count elements in all. */
kiln_status kiln_layer_plan_softmax(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                    const kiln_exec_tensor *out, int64_t *count, int64_t *len, int64_t *inner);
/* Cast: 1 input, 1 output of equal element count (*count), dtypes up to
 * bool (not fp8). */
kiln_status kiln_layer_check_cast(const char *name, const kiln_layer *l, const kiln_exec_tensor *in,
                                  const kiln_exec_tensor *out, int64_t *count);

/* perm is a permutation of rank axes; `which` says which transpose of a
 * shuffle ("first", "second"). */
kiln_status kiln_layer_check_perm(const char *name, const int32_t *perm, int32_t rank, const char *which);
int kiln_perm_is_identity(const int32_t *perm, int32_t rank);

/* Calls the plugin's enqueue for `backend` with descriptors of the
 * layer's tensors (on the stack: a launch allocates nothing). */
kiln_status kiln_layer_run_plugin(const char *name, kiln_plugin *plugin, kiln_backend backend, const kiln_layer *l,
                                  const kiln_exec_tensor *in, const kiln_exec_tensor *out, void *workspace,
                                  void *stream);

#endif
