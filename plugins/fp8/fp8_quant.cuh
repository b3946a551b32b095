/* A row of activations to E4M3 codes and a scale, on the device, as
 * kiln/Fp8MatMul defines it (fp8.c; kiln_fp8_quantize_row is the host's
 * form): a = max |x|, scale a / 448, codes e4m3(x · (448 / a)), all 0 for a
 * row of zeros. Shared by the kernels that write such rows: Fp8MatMul's own
 * quantization, and RMSNorm, AddRMSNorm and SwiGLU with quantize = fp8,
 * which quantize the y they hold in registers instead of storing it. */
#ifndef KILN_PLUGINS_FP8_QUANT_CUH
#define KILN_PLUGINS_FP8_QUANT_CUH

#include <cuda_fp8.h>

#include "core/fp8.h"

/* The row's scale from each thread's max |x| (a block of 256 threads, one
 * row a block at a time): the block's max a, *sx = a / 448 (thread 0), and
 * 448 / a returned (0 for a row of zeros); fp8.c's f32 operations. Ends
 * with a barrier, so a block may take its next row at once. */
static __device__ __forceinline__ float fp8_row_scale(float a, float *sx)
{
    __shared__ float red[8];
    for (int o = 16; o > 0; o >>= 1)
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = a;
    __syncthreads();
    a = red[0];
    for (int i = 1; i < 8; i++)
        a = fmaxf(a, red[i]);
    __syncthreads(); /* red is rewritten by the next row */
    if (threadIdx.x == 0)
        *sx = __fdiv_rn(a, KILN_E4M3_MAX);
    return a > 0.0f ? __fdiv_rn(KILN_E4M3_MAX, a) : 0.0f;
}

/* Four values times inv as E4M3 codes (the first in the lowest byte): the
 * hardware's saturating round-to-nearest-even conversion, the codes
 * kiln_f32_to_e4m3 gives for every |value| <= 448. */
static __device__ __forceinline__ uint32_t fp8_pack4(const float *f, float inv)
{
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(f[0], inv), __fmul_rn(f[1], inv)), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(f[2], inv), __fmul_rn(f[3], inv)), __NV_SATFINITE, __NV_E4M3);
    return (uint32_t)lo | (uint32_t)hi << 16;
}

#endif
