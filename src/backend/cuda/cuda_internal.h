/* The boundary between the host half of the CUDA backend (cuda_backend.c:
 * validation, shapes, cuBLASLt, plugins) and its kernels (cuda_kernels.cu).
 * Plain C types only, so nvcc never compiles the graph headers. Every
 * launcher returns the cudaError_t of the launch (0 on success) and does
 * nothing but launch on `stream`. */
#ifndef KILN_BACKEND_CUDA_INTERNAL_H
#define KILN_BACKEND_CUDA_INTERNAL_H

#include <kiln/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The graph's limits (KILN_FUSED_MAX_INPUTS/STEPS), which nvcc does not
 * see; cuda_elementwise.c asserts they agree. */
#define KCU_MAX_INPUTS 8
#define KCU_MAX_STEPS 16

/* Where kernels report a gather index out of range (device memory). */
typedef struct kcu_error_word {
    int32_t flag; /* 0: nothing recorded */
    int32_t layer;
    int64_t index;
    int64_t position;
} kcu_error_word;

/* A linear index of a row-major shape mapped to an element offset:
 * off = sum over axes of (coordinate * st). rank 0 maps every index to 0. */
typedef struct kcu_map {
    int32_t rank;
    int64_t dims[KILN_MAX_RANK];
    int64_t st[KILN_MAX_RANK];
} kcu_map;

/* ---- elementwise ------------------------------------------------------------------- */

/* One step: operands index the register file r[] of the generic kernel:
 * r[k] = input k (k < n_in), r[n_in + s] = result of step s. */
typedef struct kcu_step {
    int8_t is_binary, op, a, b;
} kcu_step;

/* The generic path: every operand through its own map (broadcast axes have
 * stride 0), any float dtype per operand; elements [start, count). */
typedef struct kcu_ew_args {
    int32_t n_in, n_steps;
    kcu_step steps[KCU_MAX_STEPS];
    const void *in[KCU_MAX_INPUTS];
    int32_t in_dtype[KCU_MAX_INPUTS];
    void *out;
    int32_t out_dtype;
    int32_t rank; /* of the merged output shape */
    int64_t dims[KILN_MAX_RANK];
    int64_t st[KCU_MAX_INPUTS][KILN_MAX_RANK]; /* element strides, 0 = broadcast */
    int64_t start, count;
} kcu_ew_args;

/* The vectorized path runs a micro-program over an accumulator `acc` and
 * one saved register `sv`, each a 16-byte vector's worth of f32 lanes:
 * most chains are linear (each step consumes the previous result), so
 * results stay in place and almost no lane moves are spent on copies.
 * Operand codes: the accumulator, the saved register, a full-size input
 * KCU_FAST_VEC + k (read 16 bytes at a time) or a one-element input
 * KCU_FAST_SCALAR + k (broadcast). */
#define KCU_SRC_ACC 0
#define KCU_SRC_SV 1
#define KCU_FAST_VEC 8
#define KCU_FAST_SCALAR 16

enum {
    KCU_UOP_LOAD = 0,     /* acc = src (saved register or input) */
    KCU_UOP_SAVE,         /* sv = acc */
    KCU_UOP_UNARY,        /* acc = op(acc) */
    KCU_UOP_BINARY,       /* acc = op(acc, src), src a vector operand */
    KCU_UOP_BINARY_SCALAR /* acc = op(acc, src), src a one-element input */
};

/* A binary op with this bit set takes its operands swapped: op(src, acc). */
#define KCU_SWAPPED 16

/* Each step becomes at most a save, a load and the op itself. */
#define KCU_FAST_OPS (3 * KCU_MAX_STEPS)

typedef struct kcu_fast_step {
    int8_t kind, op, src, pad;
} kcu_fast_step;

/* The vectorized path: output and inputs share dtype `dtype` (f32, f16,
 * bf16); full-size inputs and the output are 16-byte aligned; elements
 * [0, nvec * (16 / size)) are processed. */
typedef struct kcu_fast_args {
    /* One-element inputs whose value the host knows (engine constants),
     * widened to f32: bit k of scal_known says scal[k] holds input k, so
     * the kernel takes it from its parameters instead of a device load
     * that would wait on the previous kernel. First, beside n_ops and the
     * first ops, so that one parameter line read before the wait holds
     * what a short program needs. */
    float scal[KCU_MAX_INPUTS];
    int32_t scal_known;
    int32_t n_ops;
    kcu_fast_step ops[KCU_FAST_OPS];
    const void *in[KCU_MAX_INPUTS];
    void *out;
    int32_t dtype;
    int32_t uses_sv;  /* the program saves to sv (else a leaner kernel runs it) */
    int32_t lead;     /* full-size input that ops[0] loads, read one pass ahead
                         into registers; -1 when ops[0] loads something else */
    int32_t n_vec_in; /* full-size inputs, prefetched ahead */
    int32_t vec_in[KCU_MAX_INPUTS];
    int64_t nvec;
} kcu_fast_args;

/* Whether kernels are launched with programmatic dependent launch (on by
 * default; process-wide, set before any launch). */
void kcu_set_pdl(int32_t on);

int kcu_launch_ew(const kcu_ew_args *a, int32_t sms, void *stream);

/* ---- small-m matmul (gemv.cu) ---------------------------------------------------- */

/* Rows of x up to which kcu_gemv runs: past that cuBLASLt's tiles reuse w. */
#define KCU_GEMV_MAX_M 8

/* Whether kcu_gemv handles y[m, n] = x[m, k] . w[n, k]^T with these dtypes
 * (x and w share wdtype; y is wdtype or f32), strides (elements) and
 * addresses: 16-byte aligned rows of x and w. */
int32_t kcu_gemv_supported(int32_t m, int32_t wdtype, int32_t ydtype, const void *x, int64_t ldx, const void *w,
                           const void *y, int64_t ldy, int64_t n, int64_t k);
int kcu_gemv(int32_t m, int32_t wdtype, int32_t ydtype, const void *x, int64_t ldx, const void *w, void *y, int64_t ldy,
             int64_t n, int64_t k, void *stream);
void kcu_gemv_set_pdl(int32_t on);
/* Rows of w per block for one-row products: 1, 2 (the default) or 4, each
 * with 8 loads a lane in flight (process-wide; KILN_CUDA_GEMV_ROWS at
 * device creation, for kiln_bench's sweep). */
void kcu_gemv_set_rows(int32_t rows);
int kcu_launch_ew_fast(const kcu_fast_args *a, int32_t sms, void *stream);

/* Integer binary (is_binary) or unary (neg/abs/relu) over int64 compute,
 * results wrapping to the storage width; the same maps as kcu_ew_args
 * (n_in 2 or 1, steps unused except steps[0].op). */
int kcu_launch_ew_int(const kcu_ew_args *a, int32_t is_binary, int32_t op, int32_t sms, void *stream);

/* ---- reductions ------------------------------------------------------------------ */

typedef struct kcu_reduce_args {
    const void *in;
    int32_t in_dtype;
    void *out;
    int32_t out_dtype;
    int32_t op;   /* kiln_reduce_op */
    kcu_map kept; /* output index -> input offset of the line's start */
    kcu_map red;  /* reduced index -> offset within the line */
    int64_t n_out, rcount;
} kcu_reduce_args;

int kcu_launch_reduce(const kcu_reduce_args *a, int32_t sms, void *stream);

/* Softmax over lines of `len` elements `inner` apart. */
int kcu_launch_softmax(const void *in, int32_t in_dtype, void *out, int32_t out_dtype, int64_t lines, int64_t len,
                       int64_t inner, int32_t sms, void *stream);

/* ---- data movement ---------------------------------------------------------------- */

/* dst[i] = src[base + outer(inner_map(i))]: i's row-major coordinates over
 * `dst_map` give an offset, which (when `src_map.rank` > 0) is taken as a
 * linear index of `src_map` and mapped again. Elements of `esize` bytes
 * (1, 2, 4 or 8). */
int kcu_launch_copy(const void *src, void *dst, int64_t count, int64_t base, const kcu_map *dst_map,
                    const kcu_map *src_map, int32_t esize, int32_t sms, void *stream);

/* rows × width elements of a contiguous src into dst at column `col` of
 * rows `pitch` elements long (one concat input). */
int kcu_launch_band(const void *src, void *dst, int64_t rows, int64_t width, int64_t pitch, int64_t col, int32_t esize,
                    int32_t sms, void *stream);

/* out[i, j, c] = data[i, idx[j], c] for i < outer, j < n_idx, c < inner;
 * an index outside [0, dim) is clamped; the first one claims *err (device
 * memory) and is recorded in *report (host memory mapped for the device). */
int kcu_launch_gather(const void *data, const void *idx, int32_t idx_is_i64, void *out, int64_t outer, int64_t n_idx,
                      int64_t inner, int64_t dim, int32_t esize, kcu_error_word *err, kcu_error_word *report,
                      int32_t layer, int32_t sms, void *stream);

/* n elements converted between dtypes (as kiln_convert). */
int kcu_launch_cast(const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype, int64_t n, int32_t sms,
                    void *stream);

#ifdef __cplusplus
}
#endif

#endif
