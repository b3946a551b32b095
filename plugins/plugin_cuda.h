/* Launchers of the built-in LLM plugins' CUDA kernels (plugins/<name>/
 * <name>_cuda.cu). Plain C, so the plugins' C files include it; each
 * launcher only launches on `stream` (a cudaStream_t) and returns the
 * cudaError_t of the launch (0 on success). Pointers are device memory;
 * dtypes are kiln_dtype values. Every kernel follows its plugin's CPU
 * reference operation by operation (f32 arithmetic, the same roundings to
 * the storage dtype). */
#ifndef KILN_PLUGINS_CUDA_H
#define KILN_PLUGINS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* RMSNorm over `rows` rows of h; with residual non-NULL (AddRMSNorm),
 * sum = x + residual is stored first (in x's dtype) and normalized. x
 * and sum, the residual, y and the weight each have their own dtype (an
 * f32 residual stream with bf16 layer outputs and norms). With q non-NULL
 * (quantize = fp8) y leaves as E4M3 codes q [rows, h] and q_scale [rows],
 * and y is scratch of rows * h values of y_dtype; amax > 0 is a static
 * max |y| for every row (the field x_amax), 0 each row's own. */
int kiln_rmsnorm_cuda(const void *x, const void *residual, const void *weight, void *sum, void *y, int32_t x_dtype,
                      int32_t residual_dtype, int32_t y_dtype, int32_t weight_dtype, int64_t rows, int64_t h,
                      float epsilon, uint8_t *q, float *q_scale, float amax, void *stream);

#define ROPE_MAX_PAIRS 256

/* RoPE over `tokens` rows of row_heads heads; the first rotated_heads are
 * rotated, the rest copied (when y != x). Passed by value to the kernel. */
typedef struct kiln_rope_cuda_args {
    const void *x;
    const int32_t *pos;
    void *y;
    int32_t dtype;
    int32_t row_heads, rotated_heads, head_dim, rotary_dim, interleaved;
    int64_t tokens;
    float inv_freq[ROPE_MAX_PAIRS];
} kiln_rope_cuda_args;

int kiln_rope_cuda(const kiln_rope_cuda_args *a, void *stream);

/* y[r, c] = silu(gate[r * ld + c]) * up[r * ld + c], c < width; y rows
 * are `width` long. With q non-NULL (quantize = fp8) y leaves as E4M3
 * codes q [rows, width] and q_scale [rows], and y is scratch of
 * rows * width values of `dtype`; amax > 0 as for kiln_rmsnorm_cuda. */
int kiln_swiglu_cuda(const void *gate, const void *up, void *y, int32_t dtype, int64_t rows, int64_t width, int64_t ld,
                     uint8_t *q, float *q_scale, float amax, void *stream);

/* y [rows, n] = x [rows, k] · Wᵀ with W in ggml block format `type`
 * (8 Q8_0, 2 Q4_0, 3 Q4_1), rows of k / 32 blocks; x and y of `dtype`. */
int kiln_qmatmul_cuda(int32_t type, const void *x, const uint8_t *w, void *y, int32_t dtype, int64_t rows, int32_t n,
                      int32_t k, void *stream);

/* Fp8MatMul (plugins/fp8/fp8.c): the workspace holds the rows of x in
 * E4M3 [rows, k], their scales f32 [rows], and beyond the GEMV's rows the
 * GEMM's f32 result [rows, n] and cuBLASLt's scratch, each 256-aligned.
 * The layout is shared by the CPU reference (which uses the first two). */
#define KILN_FP8_GEMV_MAX_ROWS 8
#define KILN_FP8_LT_WORKSPACE ((size_t)32 << 20)

static inline size_t kiln_fp8_align(size_t b) { return (b + 255) & ~(size_t)255; }

/* Offset of the scales, of the f32 result, and the whole size. */
static inline size_t kiln_fp8_workspace_scales(int64_t rows, int64_t k) { return kiln_fp8_align((size_t)(rows * k)); }
static inline size_t kiln_fp8_workspace_result(int64_t rows, int64_t k)
{
    return kiln_fp8_workspace_scales(rows, k) + kiln_fp8_align((size_t)rows * sizeof(float));
}
static inline size_t kiln_fp8_workspace(int64_t rows, int64_t n, int64_t k)
{
    size_t b = kiln_fp8_workspace_result(rows, k);
    return rows > KILN_FP8_GEMV_MAX_ROWS
               ? b + kiln_fp8_align((size_t)(rows * n) * sizeof(float)) + KILN_FP8_LT_WORKSPACE
               : b;
}

/* Sets up the process's cuBLASLt handle for the FP8 GEMM once; 0 when it
 * is ready (called from the plugin's supports, outside any capture). */
int kiln_fp8_cuda_init(void);

/* y [rows, n] = Fp8MatMul(x [rows, k]; w E4M3 [n, k], w_scale f32 [n]);
 * x and y of `dtype`; `workspace` of kiln_fp8_workspace(rows, n, k) bytes;
 * amax > 0: a static max |x| for every row (the field x_amax).
 * Returns 0, a cudaError_t, or a cuBLAS status + 10000. */
int kiln_fp8_matmul_cuda(const void *x, const void *w, const void *w_scale, void *y, int32_t dtype, int64_t rows,
                         int32_t n, int32_t k, float amax, void *workspace, size_t workspace_size, void *stream);

/* The same with x given as E4M3 codes xq [rows, k] and their scales
 * x_scale f32 [rows] (Fp8MatMul's fourth input); y of `y_dtype`. */
int kiln_fp8_matmul_q8_cuda(const void *xq, const void *x_scale, const void *w, const void *w_scale, void *y,
                            int32_t y_dtype, int64_t rows, int32_t n, int32_t k, void *workspace, size_t workspace_size,
                            void *stream);

/* y [rows, n] = residual + the product of kiln_fp8_matmul_q8_cuda, both
 * of y_dtype, the add in cuBLASLt's epilogue (beta = 1; y may be the
 * residual), for FusedMatMul's residual form past the GEMV's rows.
 * Returns KILN_FP8_NO_ADD (nothing launched) where that GEMM has no
 * kernel or the rows are the GEMV's: the caller adds itself. */
#define KILN_FP8_NO_ADD 20001
int kiln_fp8_matmul_q8_add_cuda(const void *xq, const void *x_scale, const void *w, const void *w_scale,
                                const void *residual, void *y, int32_t y_dtype, int64_t rows, int32_t n, int32_t k,
                                void *workspace, size_t workspace_size, void *stream);

/* Rows of x [rows, k] (`dtype`) as Fp8MatMul quantizes them: codes q
 * [rows, k], scales [rows] (amax as for kiln_fp8_matmul_cuda). Returns 0
 * or a cudaError_t. */
int kiln_fp8_quantize_cuda(const void *x, int32_t dtype, uint8_t *q, float *scale, int64_t rows, int32_t k, float amax,
                           void *stream);

/* Text of a code kiln_fp8_matmul_cuda or kiln_fp8_cuda_init returned. */
const char *kiln_fp8_cuda_error(int code);

/* FusedMatMul (plugins/fusedmm/fusedmm.c): y = epilogue(prologue(x) · Wᵀ).
 * Epilogues: */
#define KILN_FUSEDMM_NONE 0
#define KILN_FUSEDMM_SWIGLU 1      /* rows of W interleaved gate, up: y [rows, n / 2] */
#define KILN_FUSEDMM_RESIDUAL 2    /* y = residual + x · Wᵀ */
#define KILN_FUSEDMM_ROPE 3        /* RoPE over the packed qkv row; W's rotated pairs adjacent */
#define KILN_FUSEDMM_NO_ALGO 20000 /* code: cuBLASLt offered no GEMM */
/* cuBLASLt's scratch: the native matmul's (KILN_GPU_MATMUL_WORKSPACE), so
 * that its heuristic picks the prefill GEMMs' algorithm from the same
 * candidates as for the unfused layers' matmuls */
#define KILN_FUSEDMM_LT_WORKSPACE ((size_t)32 << 20)

/* Workspace, each part 256-aligned: rows of x as f32 (the CPU) or
 * normalized in the dtype (the GPU's GEMM path), the GEMM's result in the
 * dtype (`es` bytes a value) before an epilogue, cuBLASLt's scratch. */
static inline size_t kiln_fusedmm_align(size_t b) { return (b + 255) & ~(size_t)255; }
static inline size_t kiln_fusedmm_workspace_t(int64_t rows, int64_t k)
{
    return kiln_fusedmm_align((size_t)(rows * k) * sizeof(float));
}
static inline size_t kiln_fusedmm_workspace_lt(int64_t rows, int64_t n, int64_t k, size_t es)
{
    return kiln_fusedmm_workspace_t(rows, k) + kiln_fusedmm_align((size_t)(rows * n) * es);
}
static inline size_t kiln_fusedmm_workspace(int64_t rows, int64_t n, int64_t k, size_t es)
{
    return kiln_fusedmm_workspace_lt(rows, n, k, es) + KILN_FUSEDMM_LT_WORKSPACE;
}

/* With E4M3 weights (field weights = fp8) the workspace also holds, each
 * 256-aligned after the above, the prefill path's quantized rows of x
 * [rows, k] (codes), their scales f32 [rows], and Fp8MatMul's workspace
 * (kiln_fp8_workspace: its GEMM's result and scratch). The CPU reference
 * uses the first part (x as f32 rows) and the codes and scales. */
static inline size_t kiln_fusedmm_fp8_workspace_codes(int64_t rows, int64_t n, int64_t k, size_t es)
{
    return kiln_fusedmm_workspace(rows, n, k, es);
}
static inline size_t kiln_fusedmm_fp8_workspace_scales(int64_t rows, int64_t n, int64_t k, size_t es)
{
    return kiln_fusedmm_fp8_workspace_codes(rows, n, k, es) + kiln_fusedmm_align((size_t)(rows * k));
}
static inline size_t kiln_fusedmm_fp8_workspace_matmul(int64_t rows, int64_t n, int64_t k, size_t es)
{
    return kiln_fusedmm_fp8_workspace_scales(rows, n, k, es) + kiln_fusedmm_align((size_t)rows * sizeof(float));
}
static inline size_t kiln_fusedmm_fp8_workspace(int64_t rows, int64_t n, int64_t k, size_t es)
{
    return kiln_fusedmm_fp8_workspace_matmul(rows, n, k, es) + kiln_fp8_workspace(rows, n, k);
}

/* The rope epilogue's rotation, passed to the kernels by value: the first
 * rotated_heads heads of a row are rotated (as kiln/RoPE). */
typedef struct kiln_fusedmm_rope {
    int32_t rotated_heads, head_dim, rotary_dim, interleaved;
    float inv_freq[ROPE_MAX_PAIRS];
} kiln_fusedmm_rope;

typedef struct kiln_fusedmm_cuda_args {
    const void *x;            /* [rows, k] */
    const void *w;            /* [n, k]: of dtype, or E4M3 codes with w_scale */
    const float *w_scale;     /* [n]: W's per-channel scales (weights = fp8), or NULL */
    const void *norm_weight;  /* [k], or NULL: no RMSNorm prologue */
    const void *residual;     /* [rows, n] with KILN_FUSEDMM_RESIDUAL */
    const int32_t *positions; /* [rows] with KILN_FUSEDMM_ROPE */
    kiln_fusedmm_rope rope;
    void *y;
    void *workspace;
    size_t workspace_size;
    int64_t rows;
    int32_t n, k, epilogue;
    int32_t dtype;   /* w's and norm_weight's (f32, f16, bf16), the product's; with E4M3
                      * weights norm_weight's, or x's without the norm */
    int32_t x_dtype; /* dtype, or f32 with the norm prologue (a residual stream in f32) */
    int32_t y_dtype; /* dtype, or f32 with the residual epilogue (the residual's too) or none */
    float epsilon;
    float x_amax; /* weights = fp8: a static max |x| (the field x_amax), 0: each row's own */
} kiln_fusedmm_cuda_args;

/* Sets up the process's cuBLASLt handle for the prefill GEMM once; 0 when
 * it is ready (called from the plugin's supports, outside any capture). */
int kiln_fusedmm_cuda_init(void);

/* Launches the fused layer on `stream`. Returns 0, a cudaError_t, a
 * cuBLAS status + 10000 or KILN_FUSEDMM_NO_ALGO. */
int kiln_fusedmm_cuda(const kiln_fusedmm_cuda_args *a, void *stream);

/* y [rows, n] (rows ldy elements apart) = x [rows, k] · wᵀ, w [n, k], all of
 * `dtype`: cuBLASLt's GEMM as the prefill path above runs it (f32
 * accumulation; the same cache of algorithms), for other plugins' prefill
 * (WeightOnlyMatMul's dequantized weights). lt_workspace holds
 * KILN_FUSEDMM_LT_WORKSPACE bytes. Returns a code as kiln_fusedmm_cuda. */
int kiln_fusedmm_gemm_cuda(int32_t dtype, const void *x, const void *w, void *y, int64_t rows, int32_t n, int32_t k,
                           int64_t ldy, void *lt_workspace, void *stream);

/* Text of a code kiln_fusedmm_cuda or kiln_fusedmm_gemm_cuda returned. */
const char *kiln_fusedmm_cuda_error(int code);

/* y [rows, n] = x [rows, k] · Wᵀ with W in WeightOnlyMatMul's layout
 * (plugins/woq/woq.c): q u8 rows of k · bits / 8 bytes, scales f32 and,
 * for 4 bits, zeros u8 [n, k / group]; x and y of `dtype` (`es` bytes an
 * element). Up to KILN_WOQ_GEMV_MAX_ROWS rows (decode) a GEMV; with
 * 16-bit x and groups the tensor-core GEMV takes (multiples of 128 int4
 * or 64 int8 weights), up to KILN_WOQ_LOOP_MAX_ROWS rows that GEMV over
 * groups of 8 rows; past that (prefill) W is dequantized into the
 * workspace in slices of kiln_woq_slice_rows weight rows, in x's dtype,
 * and each slice multiplied by cuBLASLt (FusedMatMul's GEMM). */
#define KILN_WOQ_GEMV_MAX_ROWS 8
#define KILN_WOQ_LOOP_MAX_ROWS 32
#define KILN_WOQ_SLICE_BYTES ((size_t)256 << 20) /* a slice's dequantized weights, at most about */

/* The most rows a launch runs without the GEMM (so without workspace). */
static inline int64_t kiln_woq_gemv_rows(int32_t bits, int32_t group, size_t es)
{
    return es == 2 && group % (bits == 4 ? 128 : 64) == 0 ? KILN_WOQ_LOOP_MAX_ROWS : KILN_WOQ_GEMV_MAX_ROWS;
}

/* Weight rows dequantized at a time: all n when they fit in
 * KILN_WOQ_SLICE_BYTES, else n split evenly into slices of a multiple of
 * 128 rows (so every slice's first column of y is 256-byte aligned). */
static inline int64_t kiln_woq_slice_rows(int64_t n, int64_t k, size_t es)
{
    const size_t row = (size_t)k * es;
    if ((size_t)n * row <= KILN_WOQ_SLICE_BYTES)
        return n;
    const int64_t slices = (int64_t)(((size_t)n * row + KILN_WOQ_SLICE_BYTES - 1) / KILN_WOQ_SLICE_BYTES);
    const int64_t r = ((n + slices - 1) / slices + 127) / 128 * 128;
    return r < n ? r : n;
}

/* Device workspace for `rows` rows of x: none up to kiln_woq_gemv_rows,
 * else a slice of dequantized weights (256-aligned) and cuBLASLt's
 * scratch. */
static inline size_t kiln_woq_cuda_workspace(int32_t bits, int32_t group, int64_t rows, int64_t n, int64_t k, size_t es)
{
    if (rows <= kiln_woq_gemv_rows(bits, group, es))
        return 0;
    return (((size_t)kiln_woq_slice_rows(n, k, es) * (size_t)k * es + 255) & ~(size_t)255) + KILN_FUSEDMM_LT_WORKSPACE;
}

int kiln_woq_matmul_cuda(int32_t bits, int32_t group, const void *x, const void *q, const void *scales,
                         const void *zeros, void *y, int32_t dtype, int64_t rows, int32_t n, int32_t k, void *workspace,
                         size_t workspace_size, void *stream);

/* Sets up the decode GEMVs on the current device (their shared memory
 * past 48 KB, the occupancy their grids are sized by), so that no launch
 * inside a stream capture does it first; a launch does it where this was
 * not called. Returns a CUDA error code (0: done). */
int kiln_woq_cuda_init(void);

/* Text of a code kiln_woq_matmul_cuda returned. */
const char *kiln_woq_cuda_error(int code);

/* PagedAttention (plugins/attention/attention_cuda.cu): one step's cache
 * write and attention. q, k and v point at head 0 of token 0 and their
 * rows are q_ld, k_ld and v_ld elements apart (separate tensors, or the
 * three parts of one packed qkv row). Pointers are device memory. */
typedef struct kiln_attention_cuda_args {
    const void *q, *k, *v;
    int64_t q_ld, k_ld, v_ld;
    void *cache;             /* [n_blocks, 2, n_kv_heads, block_size, head_dim] */
    void *out;               /* [tokens, n_heads * head_dim] */
    const int32_t *table;    /* [n_seqs, max_blocks] */
    const int32_t *seq_lens; /* [n_seqs] */
    const int32_t *qstart;   /* [n_seqs + 1] */
    void *workspace;         /* kiln_attention_cuda_workspace() bytes for the max shapes */
    int64_t tokens, n_seqs, max_blocks, n_blocks;
    int32_t n_heads, n_kv_heads, head_dim, block_size;
    float scale;
    int32_t dtype;       /* of q, k, v and out (f32, f16, bf16) */
    int32_t cache_dtype; /* of the cache: dtype, or KILN_DTYPE_U8 for FP8 E4M3 codes */
} kiln_attention_cuda_args;

/* Device scratch bytes a step of at most `tokens` tokens, `n_seqs`
 * sequences and `max_blocks` blocks per sequence needs (the split partial
 * results of decode). Depends on shapes alone. */
size_t kiln_attention_cuda_workspace(int64_t tokens, int64_t n_seqs, int64_t max_blocks, int32_t n_heads,
                                     int32_t n_kv_heads, int32_t head_dim, int32_t block_size);

/* Launches the cache write and the attention on `stream` (a cudaStream_t):
 * only launches, no allocation, no synchronization, no reads of device
 * data on the host. The decode kernel reads table, seq_lens, qstart and
 * the cache rows before each sequence's new tokens before it waits on the
 * previous kernel of the stream (programmatic dependent launch): no kernel
 * that may still run may write them (step inputs copied before the step,
 * a cache written by earlier, finished steps). Returns a cudaError_t (0 on
 * success); a step that needs a workspace but got none is
 * cudaErrorInvalidValue. */
int kiln_attention_cuda(const kiln_attention_cuda_args *a, void *stream);

/* Text of a code kiln_attention_cuda returned. */
const char *kiln_attention_cuda_error(int code);

#ifdef __cplusplus
}
#endif

#endif
