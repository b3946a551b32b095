/* One pair's rotation as kiln/RoPE computes it on CUDA, with rope.c's
 * roundings: the cosine and sine of pos · inv_freq (the angle in f32)
 * each rounded to the storage dtype, every product rounded to it, then
 * their difference and sum (rounded again where they are stored). Shared
 * by kiln/RoPE's kernels and FusedMatMul's rope epilogue, which rotates
 * the packed qkv row exactly as RoPE does. */
#ifndef KILN_PLUGINS_ROPE_MATH_CUH
#define KILN_PLUGINS_ROPE_MATH_CUH

#include "backend/cuda/cuda_common.cuh"

__device__ __forceinline__ void rope_cos_sin(int t, float pos, float inv_freq, float *c, float *s)
{
    sincosf(__fmul_rn(pos, inv_freq), s, c);
    *c = kcu_round_float(t, *c);
    *s = kcu_round_float(t, *s);
}

__device__ __forceinline__ void rope_rotate(int t, float x0, float x1, float c, float s, float *y0, float *y1)
{
    *y0 = __fsub_rn(kcu_round_float(t, __fmul_rn(x0, c)), kcu_round_float(t, __fmul_rn(x1, s)));
    *y1 = __fadd_rn(kcu_round_float(t, __fmul_rn(x1, c)), kcu_round_float(t, __fmul_rn(x0, s)));
}

#endif
