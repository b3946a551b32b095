/* Launchers of the built-in LLM plugins' CUDA kernels (plugins/<name>/
 * <name>_cuda.cu). Plain C, so the plugins' C files include it; each
 * launcher only launches on `stream` (a cudaStream_t) and returns the
 * cudaError_t of the launch (0 on success). Pointers are device memory;
 * dtypes are kiln_dtype values. Every kernel follows its plugin's CPU
 * reference operation by operation (f32 arithmetic, the same roundings to
 * the storage dtype). */
#ifndef KILN_PLUGINS_CUDA_H
#define KILN_PLUGINS_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* RMSNorm over `rows` rows of h; with residual non-NULL (AddRMSNorm),
 * sum = x + residual is stored first and normalized. */
int kiln_rmsnorm_cuda(const void *x, const void *residual, const void *weight, void *sum, void *y, int32_t dtype,
                      int32_t weight_dtype, int64_t rows, int64_t h, float epsilon, void *stream);

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
 * are `width` long. */
int kiln_swiglu_cuda(const void *gate, const void *up, void *y, int32_t dtype, int64_t rows, int64_t width,
                     int64_t ld, void *stream);

/* y [rows, n] = x [rows, k] · Wᵀ with W in ggml block format `type`
 * (8 Q8_0, 2 Q4_0, 3 Q4_1), rows of k / 32 blocks; x and y of `dtype`. */
int kiln_qmatmul_cuda(int32_t type, const void *x, const uint8_t *w, void *y, int32_t dtype, int64_t rows,
                      int32_t n, int32_t k, void *stream);

#ifdef __cplusplus
}
#endif

#endif
