/* FusedMatMul's epilogues on CUDA, shared by its GEMVs over weights in the
 * dtype (fusedmm_cuda.cu) and over E4M3 weights (fusedmm_fp8_cuda.cu):
 * SwiGLU of a gate/up pair and RoPE of a rotated pair as kiln/SwiGLU and
 * kiln/RoPE compute them, and the two files' entry points into each
 * other. */
#ifndef KILN_PLUGINS_FUSEDMM_EPILOGUE_CUH
#define KILN_PLUGINS_FUSEDMM_EPILOGUE_CUH

#include <type_traits>

#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"
#include "rope/rope_math.cuh"

namespace
{

__device__ __forceinline__ float silu_times(int t, float g, float u)
{
    const float s = kcu_round_float(t, __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))));
    return __fmul_rn(s, u);
}

/* The rotation of the pair (a, b) = (p0, p1) of row m (at position pos)
 * as kiln/RoPE computes it: pair i of head h, stored at its place in the
 * packed row. */
template <int DT>
__device__ __forceinline__ void rope_store(const kiln_fusedmm_rope &rope, float pos, void *y, int64_t m, int64_t n,
                                           int64_t row0, float p0, float p1)
{
    const int64_t h = row0 / rope.head_dim, o = row0 % rope.head_dim;
    int64_t a = row0, b = row0 + 1;
    if (h < rope.rotated_heads && o < rope.rotary_dim) {
        const int i = (int)(o / 2), half = rope.rotary_dim / 2;
        a = h * rope.head_dim + (rope.interleaved ? 2 * i : i);
        b = h * rope.head_dim + (rope.interleaved ? 2 * i + 1 : i + half);
        float s, c, y0, y1;
        rope_cos_sin(DT, pos, rope.inv_freq[i], &c, &s);
        rope_rotate(DT, p0, p1, c, s, &y0, &y1);
        p0 = y0, p1 = y1;
    }
    kcu_store_float(y, DT, m * n + a, p0);
    kcu_store_float(y, DT, m * n + b, p1);
}

struct no_rope {
};

/* The rotation reaches the kernel by value only in the rope form. */
template <int EPI>
using rope_arg = typename std::conditional<EPI == KILN_FUSEDMM_ROPE, kiln_fusedmm_rope, no_rope>::type;

} /* namespace */

/* The prefill path's RoPE or SwiGLU from t [rows, n], the product in
 * a->dtype, into a->y (fusedmm_cuda.cu). Returns a cudaError_t. */
int fmm_epilogue_launch(const kiln_fusedmm_cuda_args *a, const void *t, cudaStream_t s);

/* FusedMatMul over E4M3 weights (a->w_scale non-NULL;
 * fusedmm_fp8_cuda.cu). Returns a code as kiln_fusedmm_cuda. */
int fmm_fp8_cuda(const kiln_fusedmm_cuda_args *a, cudaStream_t s);

#endif
