/* RoPE on CUDA: one thread per (token, head, pair slot). A slot of a
 * rotated head below rotary_dim / 2 rotates its pair (reading both values
 * before writing either, so y may alias x); the other slots copy two
 * elements through when y is not x (dims past rotary_dim, the v heads of a
 * packed row). Angles are position * inv_freq in f32, the frequencies
 * computed on the host exactly as the CPU reference uses them; cos and sin
 * and every product are rounded to the storage dtype as in rope.c. */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"

#define ROPE_THREADS 256

__global__ void __launch_bounds__(ROPE_THREADS) rope_kernel(const kiln_rope_cuda_args a)
{
    kcu_after_prior(a.x, a.pos, a.tokens, a.dtype);
    const int t = a.dtype, slots = a.head_dim / 2, half = a.rotary_dim / 2;
    const int64_t width = (int64_t)a.row_heads * a.head_dim, n = a.tokens * a.row_heads * slots;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t tok = i / ((int64_t)a.row_heads * slots);
        int rem = (int)(i - tok * a.row_heads * slots), h = rem / slots, j = rem - h * slots;
        int64_t base = tok * width + (int64_t)h * a.head_dim;
        if (h < a.rotated_heads && j < half) {
            int64_t ia = base + (a.interleaved ? 2 * j : j), ib = base + (a.interleaved ? 2 * j + 1 : j + half);
            float angle = __fmul_rn((float)a.pos[tok], a.inv_freq[j]);
            float s, c;
            sincosf(angle, &s, &c);
            c = kcu_round_float(t, c);
            s = kcu_round_float(t, s);
            float x0 = kcu_load_float(a.x, t, ia), x1 = kcu_load_float(a.x, t, ib);
            float y0 = __fsub_rn(kcu_round_float(t, __fmul_rn(x0, c)), kcu_round_float(t, __fmul_rn(x1, s)));
            float y1 = __fadd_rn(kcu_round_float(t, __fmul_rn(x1, c)), kcu_round_float(t, __fmul_rn(x0, s)));
            kcu_store_float(a.y, t, ia, y0);
            kcu_store_float(a.y, t, ib, y1);
        } else if (a.x != a.y) {
            /* pass-through: slot j of a v head holds dims 2j, 2j+1; of a
             * rotated head, the dims past rotary_dim in order */
            int d = h < a.rotated_heads ? a.rotary_dim + 2 * (j - half) : 2 * j;
            for (int e = d; e < d + 2; e++)
                kcu_store_float(a.y, t, base + e, kcu_load_float(a.x, t, base + e));
        }
    }
}

extern "C" int kiln_rope_cuda(const kiln_rope_cuda_args *a, void *stream)
{
    int64_t n = a->tokens * a->row_heads * (a->head_dim / 2);
    if (n <= 0)
        return 0;
    int64_t want = (n + ROPE_THREADS - 1) / ROPE_THREADS;
    unsigned blocks = (unsigned)(want < 132 * 16 ? want : 132 * 16);
    return (int)kcu_launch_cfg(rope_kernel, dim3(blocks), dim3(ROPE_THREADS), (cudaStream_t)stream, *a);
}
