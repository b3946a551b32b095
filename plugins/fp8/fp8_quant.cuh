/* A row of activations to E4M3 codes and a scale, on the device, as
 * kiln/Fp8MatMul defines it (fp8.c; kiln_fp8_quantize_row is the host's
 * form): a = max |x|, scale a / 448, codes e4m3(x · (448 / a)), all 0 for a
 * row of zeros. Shared by the kernels that write such rows: Fp8MatMul's own
 * quantization, and RMSNorm, AddRMSNorm and SwiGLU with quantize = fp8,
 * which quantize the y they hold in registers instead of storing it.
 * Also the GEMVs' loads of E4M3 weights and of x as floats (Fp8MatMul's,
 * and FusedMatMul's over E4M3 weights). */
#ifndef KILN_PLUGINS_FP8_QUANT_CUH
#define KILN_PLUGINS_FP8_QUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <kiln/types.h>

#include "core/fp8.h"

/* The row's scale from each thread's max |x| (a block of 256 threads, one
 * row a block at a time): the block's max a, *sx = a / 448 (thread 0), and
 * 448 / a returned (0 for a row of zeros); fp8.c's f32 operations. Ends
 * with a barrier, so a block may take its next row at once. A static
 * amax > 0 (the plugins' field x_amax: the same for every thread) stands
 * for the block's max, with no reduction. */
static __device__ __forceinline__ float fp8_row_scale(float a, float amax, float *sx)
{
    if (amax > 0.0f) {
        a = amax;
    } else {
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
    }
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

/* 16 E4M3 codes as floats. */
static __device__ __forceinline__ void fp8_unpack(const uint4 &v, float *f)
{
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[i] >> (16 * h)), __NV_E4M3);
            float2 p = __half22float2(*reinterpret_cast<const __half2 *>(&r));
            f[4 * i + 2 * h] = p.x;
            f[4 * i + 2 * h + 1] = p.y;
        }
    }
}

/* 16 elements of x (dtype XT) from element i (a multiple of 16, the row
 * 16-byte aligned) as floats: two or four 16-byte loads. */
template <int XT> static __device__ __forceinline__ void fp8_load_x16(const void *x, int64_t i, float *f)
{
    if constexpr (XT == KILN_DTYPE_F32) {
        const float4 *p = reinterpret_cast<const float4 *>((const float *)x + i);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float4 v = __ldg(p + j);
            f[4 * j] = v.x, f[4 * j + 1] = v.y, f[4 * j + 2] = v.z, f[4 * j + 3] = v.w;
        }
    } else {
        const uint4 *p = reinterpret_cast<const uint4 *>((const uint16_t *)x + i);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint4 v = __ldg(p + j);
            const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int h = 0; h < 4; h++) {
                float2 q;
                if constexpr (XT == KILN_DTYPE_BF16)
                    q = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u[h]));
                else
                    q = __half22float2(*reinterpret_cast<const __half2 *>(&u[h]));
                f[8 * j + 2 * h] = q.x, f[8 * j + 2 * h + 1] = q.y;
            }
        }
    }
}

#endif
