/* RoPE on CUDA. Grid: x = token (strided), y = group of heads; a block's
 * thread i rotates pair i % half of head (group * per + i / half), with
 * half = rotary_dim / 2 and per = ROPE_THREADS / half heads a group, so
 * each thread computes its angle's sine and cosine once for all the heads
 * it rotates in the token, not once per head. Both values of a pair are
 * read before either is written, so y may alias x. When y is not x, the
 * last y-slice of the grid copies what is not rotated (the v heads of a
 * packed row, dims past rotary_dim). Angles are position * inv_freq in
 * f32, the frequencies computed on the host exactly as the CPU reference
 * uses them; cos and sin and every product are rounded to the storage
 * dtype as in rope.c. */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"

#define ROPE_THREADS 256

__global__ void __launch_bounds__(ROPE_THREADS) rope_kernel(const kiln_rope_cuda_args a, int32_t groups)
{
    KTL_SCOPE(0);
    kcu_after_prior(a.x, a.pos, a.tokens, a.dtype);
    const int t = a.dtype, half = a.rotary_dim / 2, per = ROPE_THREADS / half;
    const int64_t width = (int64_t)a.row_heads * a.head_dim;
    if ((int)blockIdx.y == groups) {
        /* the copy slice: dims [rotated ? rotary_dim : 0, head_dim) of every head */
        const int keep = a.head_dim - a.rotary_dim;
        const int64_t n_rot = (int64_t)a.rotated_heads * keep,
                      n = n_rot + (int64_t)(a.row_heads - a.rotated_heads) * a.head_dim;
        for (int64_t tok = blockIdx.x; tok < a.tokens; tok += gridDim.x)
            for (int64_t i = threadIdx.x; i < n; i += ROPE_THREADS) {
                int64_t off = i < n_rot ? (i / keep) * a.head_dim + a.rotary_dim + i % keep
                                        : (int64_t)a.rotated_heads * a.head_dim + (i - n_rot);
                kcu_store_float(a.y, t, tok * width + off, kcu_load_float(a.x, t, tok * width + off));
            }
        return;
    }
    const int j = threadIdx.x % half, h = blockIdx.y * per + threadIdx.x / half;
    if (threadIdx.x >= per * half || h >= a.rotated_heads)
        return;
    const float inv = a.inv_freq[j];
    for (int64_t tok = blockIdx.x; tok < a.tokens; tok += gridDim.x) {
        const int64_t base = tok * width + (int64_t)h * a.head_dim;
        const int64_t ia = base + (a.interleaved ? 2 * j : j), ib = base + (a.interleaved ? 2 * j + 1 : j + half);
        float x0 = kcu_load_float(a.x, t, ia), x1 = kcu_load_float(a.x, t, ib);
        float angle = __fmul_rn((float)a.pos[tok], inv);
        float s, c;
        sincosf(angle, &s, &c);
        c = kcu_round_float(t, c);
        s = kcu_round_float(t, s);
        float y0 = __fsub_rn(kcu_round_float(t, __fmul_rn(x0, c)), kcu_round_float(t, __fmul_rn(x1, s)));
        float y1 = __fadd_rn(kcu_round_float(t, __fmul_rn(x1, c)), kcu_round_float(t, __fmul_rn(x0, s)));
        kcu_store_float(a.y, t, ia, y0);
        kcu_store_float(a.y, t, ib, y1);
    }
}

extern "C" int kiln_rope_cuda(const kiln_rope_cuda_args *a, void *stream)
{
    const int half = a->rotary_dim / 2;
    if (a->tokens <= 0 || half < 1 || half > ROPE_THREADS)
        return a->tokens <= 0 ? 0 : (int)cudaErrorInvalidValue;
    const int per = ROPE_THREADS / half;
    const int32_t groups = (a->rotated_heads + per - 1) / per;
    const int copy = a->x != a->y && (a->rotary_dim < a->head_dim || a->row_heads > a->rotated_heads);
    unsigned tok_blocks = (unsigned)(a->tokens < 65535 ? a->tokens : 65535);
    return (int)kcu_launch_cfg(rope_kernel, dim3(tok_blocks, (unsigned)(groups + copy)), dim3(ROPE_THREADS),
                               (cudaStream_t)stream, *a, groups);
}
