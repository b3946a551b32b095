/* What every CUDA kernel of kiln shares: launch geometry, programmatic
 * dependent launch (PDL) and element access. Included by the kernel files
 * of src/backend/cuda/ (one per op family) and by plugin kernels; the
 * scalar conversions and formulas come from src/core/scalar.h, the same
 * code the CPU backend runs.
 *
 * Every kernel is a grid-stride loop over 64-bit indices, so any tensor
 * size works with a bounded grid, and calls kcu_after_prior() before it
 * touches memory: kernels are launched with kcu_launch, which lets a launch
 * overlap the previous kernel on the stream. */
#ifndef KILN_BACKEND_CUDA_COMMON_CUH
#define KILN_BACKEND_CUDA_COMMON_CUH

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/timeline.cuh"
#include "core/scalar.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define KCU_THREADS 256

/* Blocks for n work items: enough to fill the GPU several times over,
 * never more than the items need. */
static inline unsigned kcu_blocks(int64_t n, int32_t sms, int per_thread)
{
    int64_t want = (n + (int64_t)KCU_THREADS * per_thread - 1) / ((int64_t)KCU_THREADS * per_thread);
    int64_t cap = (int64_t)(sms > 0 ? sms : 132) * 8;
    if (want > cap)
        want = cap;
    return (unsigned)(want > 0 ? want : 1);
}

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
    ktl_waited();
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
    ktl_waited();
#else
    (void)p;
    (void)q;
    (void)n;
    (void)m;
#endif
}

/* A 16-byte load that skips L1 allocation: for weights a kernel reads
 * exactly once (the GEMVs stream them). */
__device__ __forceinline__ uint4 kcu_load_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Whether launches use PDL (kcu_set_pdl; cuda_elementwise.cu holds it). */
extern int kcu_pdl;

/* Launches with programmatic stream serialization, so the launch overlaps
 * the previous kernel on the stream (see kcu_after_prior, which every
 * kernel here calls first). Works inside stream capture as well. */
template <typename... P, typename... A>
static inline cudaError_t kcu_launch(void (*kernel)(P...), unsigned blocks, cudaStream_t stream, A... args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(KCU_THREADS);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = kcu_pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* kcu_launch with any grid and block shape and `smem` bytes of dynamic
 * shared memory (plugin kernels). */
template <typename... P, typename... A>
static inline cudaError_t kcu_launch_smem(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                          A... args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = kcu_pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* The same with no dynamic shared memory. */
template <typename... P, typename... A>
static inline cudaError_t kcu_launch_cfg(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t stream, A... args)
{
    return kcu_launch_smem(kernel, grid, block, 0, stream, args...);
}

/* ---- element access (src/core/scalar.h) ---------------------------------------------- */

__device__ __forceinline__ float kcu_load(const void *p, int t, int64_t i) { return kiln_elem_load_f32(p, t, i); }

__device__ __forceinline__ void kcu_store(void *p, int t, int64_t i, float v) { kiln_elem_store_f32(p, t, i, v); }

/* The plugins' names for the same (plugin_load / plugin_store of
 * plugins/plugin_util.h on the device), and v rounded to dtype t. */
__device__ __forceinline__ float kcu_load_float(const void *p, int t, int64_t i) { return kiln_elem_load_f32(p, t, i); }

__device__ __forceinline__ void kcu_store_float(void *p, int t, int64_t i, float v) { kiln_elem_store_f32(p, t, i, v); }

/* The rounding is scalar.h's (to nearest even), done by the conversion
 * instructions, one each way: the fused GEMV rounds every normalized
 * element twice (plugins/fusedmm), and scalar.h's bit arithmetic took
 * about eight instructions a rounding. A NaN stays a NaN (its payload may
 * change, which no float comparison sees). */
__device__ __forceinline__ float kcu_round_float(int t, float v)
{
    if (t == KILN_DTYPE_F16)
        return __half2float(__float2half_rn(v));
    if (t == KILN_DTYPE_BF16)
        return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}

__device__ __forceinline__ float kcu_bf16_f32(uint16_t b) { return kiln_bf16_to_f32(b); }
__device__ __forceinline__ float kcu_f16_f32(uint16_t h) { return kiln_f16_to_f32(h); }

/* Sum of v over the warp, every lane getting it. */
__device__ __forceinline__ float kcu_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- reduce and softmax -------------------------------------------------------------- */

__device__ __forceinline__ int64_t kcu_map_off(const kcu_map &m, int64_t i)
{
    int64_t off = 0;
    for (int d = m.rank - 1; d >= 0; d--) {
        off += (i % m.dims[d]) * m.st[d];
        i /= m.dims[d];
    }
    return off;
}


#endif
