/* Device helpers shared by the CUDA backend's kernels (cuda_kernels.cu)
 * and the built-in plugins' kernels (plugins/<name>/<name>_cuda.cu): the
 * programmatic-dependent-launch wait and launch, and the f16/bf16
 * conversions that are bit-exact with src/core/dtype.c. Include from .cu
 * files only. */
#ifndef KILN_BACKEND_CUDA_KCU_DEVICE_CUH
#define KILN_BACKEND_CUDA_KCU_DEVICE_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_internal.h"

/* Programmatic dependent launch (sm_90): a kernel may be launched while
 * the previous one on the stream still runs (its launch latency hidden),
 * and waits here until that one has finished and its writes are visible.
 * Everything a kernel touches comes after this wait, so the overlap is
 * safe whatever ran before. Without PDL it returns at once. */
__device__ __forceinline__ void kcu_after_prior()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* The same, for a kernel whose first loads after the wait use the given
 * values: they come from the kernel's parameters, which do not depend on
 * the previous kernel, so naming them as operands makes the parameter
 * loads (constant-cache misses in a fresh launch) happen while waiting
 * instead of after it. */
__device__ __forceinline__ void kcu_after_prior(const void *p, const void *q, int64_t n, int32_t m)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::"l"(p), "l"(q), "l"(n), "r"(m) : "memory");
#else
    (void)p;
    (void)q;
    (void)n;
    (void)m;
#endif
}

/* Launches with programmatic stream serialization, so the launch overlaps
 * the previous kernel on the stream (see kcu_after_prior, which every
 * kernel here calls first). Works inside stream capture as well. */
template <typename... P, typename... A>
static cudaError_t kcu_launch_cfg(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, A... args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = kcu_pdl_enabled() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* ---- element conversions (bit-exact with src/core/dtype.c) ------------------------- */

__device__ __forceinline__ float kcu_bf16_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__device__ __forceinline__ uint16_t kcu_f32_bf16(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

__device__ __forceinline__ float kcu_f16_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* Round to nearest even; NaN keeps its top payload bits, as the host does. */
__device__ __forceinline__ uint16_t kcu_f32_f16(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
    return __half_as_ushort(__float2half_rn(f));
}

/* Element i of a float tensor (kiln_dtype t: f32, f16 or bf16) as f32, the
 * reverse, and v rounded to t (plugin_load, plugin_store and plugin_round
 * of plugins/plugin_util.h on the device). */
__device__ __forceinline__ float kcu_load_float(const void *p, int t, int64_t i)
{
    if (t == KILN_DTYPE_F16)
        return kcu_f16_f32(((const uint16_t *)p)[i]);
    if (t == KILN_DTYPE_BF16)
        return kcu_bf16_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

__device__ __forceinline__ void kcu_store_float(void *p, int t, int64_t i, float v)
{
    if (t == KILN_DTYPE_F16)
        ((uint16_t *)p)[i] = kcu_f32_f16(v);
    else if (t == KILN_DTYPE_BF16)
        ((uint16_t *)p)[i] = kcu_f32_bf16(v);
    else
        ((float *)p)[i] = v;
}

__device__ __forceinline__ float kcu_round_float(int t, float v)
{
    if (t == KILN_DTYPE_F16)
        return kcu_f16_f32(kcu_f32_f16(v));
    if (t == KILN_DTYPE_BF16)
        return kcu_bf16_f32(kcu_f32_bf16(v));
    return v;
}

/* Sum of v over the warp, every lane getting it. */
__device__ __forceinline__ float kcu_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#endif
