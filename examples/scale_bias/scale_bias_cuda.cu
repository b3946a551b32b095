/* ScaleBias on the GPU: y = scale * x + bias for f32, f16 and bf16.
 *
 * Memory bound, so each thread moves 16 bytes per load and store (4 f32 or
 * 8 halves) in a grid-stride loop; the elements past the last whole vector,
 * or every element when a pointer is not 16-byte aligned, take a scalar
 * path. The multiply and add are rounded separately (no FMA contraction)
 * so results are bit-identical to the plugin's CPU path. Only launches:
 * nothing is allocated and nothing waits, so it can be graph-captured.
 *
 * Compiled into libkiln_scale_bias only when CMake finds nvcc; it links
 * the static CUDA runtime and nothing from kiln. */
#include <kiln/types.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define SB_THREADS 256
#define SB_MAX_BLOCKS 4096 /* enough to fill any current GPU several times */

__device__ __forceinline__ float sb_f16_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* Round to nearest even; NaN keeps its top payload bits, as the host's. */
__device__ __forceinline__ uint16_t sb_f32_f16(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
    return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ float sb_bf16_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__device__ __forceinline__ uint16_t sb_f32_bf16(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

__device__ __forceinline__ float sb_apply(float x, float s, float b) { return __fadd_rn(__fmul_rn(s, x), b); }

template <int DT> struct sb_elem;
template <> struct sb_elem<KILN_DTYPE_F32> {
    typedef uint32_t bits;
    static __device__ __forceinline__ float load(uint32_t v) { return __uint_as_float(v); }
    static __device__ __forceinline__ uint32_t store(float v) { return __float_as_uint(v); }
};
template <> struct sb_elem<KILN_DTYPE_F16> {
    typedef uint16_t bits;
    static __device__ __forceinline__ float load(uint16_t v) { return sb_f16_f32(v); }
    static __device__ __forceinline__ uint16_t store(float v) { return sb_f32_f16(v); }
};
template <> struct sb_elem<KILN_DTYPE_BF16> {
    typedef uint16_t bits;
    static __device__ __forceinline__ float load(uint16_t v) { return sb_bf16_f32(v); }
    static __device__ __forceinline__ uint16_t store(float v) { return sb_f32_bf16(v); }
};

/* `vec` nonzero: elements [0, nvec * per) as 16-byte vectors, then the
 * tail [nvec * per, n) one element per thread. `vec` zero: all scalar. */
template <int DT>
__global__ void __launch_bounds__(SB_THREADS)
    sb_kernel(const void *__restrict__ x, void *__restrict__ y, int64_t n, int64_t nvec, float s, float b)
{
    typedef typename sb_elem<DT>::bits E;
    constexpr int per = (int)(16 / sizeof(E));
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const uint4 *xv = (const uint4 *)x;
    uint4 *yv = (uint4 *)y;
    for (int64_t i = tid; i < nvec; i += stride) {
        uint4 u = __ldg(xv + i);
        E e[per];
        memcpy(e, &u, sizeof u);
#pragma unroll
        for (int j = 0; j < per; j++)
            e[j] = sb_elem<DT>::store(sb_apply(sb_elem<DT>::load(e[j]), s, b));
        memcpy(&u, e, sizeof u);
        yv[i] = u;
    }
    const E *xs = (const E *)x;
    E *ys = (E *)y;
    for (int64_t i = nvec * per + tid; i < n; i += stride)
        ys[i] = sb_elem<DT>::store(sb_apply(sb_elem<DT>::load(xs[i]), s, b));
}

extern "C" int scale_bias_cuda_launch(const void *x, void *y, int dtype, int64_t n, float scale, float bias,
                                      void *stream)
{
    if (n <= 0)
        return (int)cudaSuccess;
    int64_t esize = dtype == KILN_DTYPE_F32 ? 4 : 2;
    int aligned = ((uintptr_t)x & 15) == 0 && ((uintptr_t)y & 15) == 0;
    int64_t nvec = aligned ? n / (16 / esize) : 0;
    int64_t work = nvec > 0 ? nvec : n;
    int64_t blocks = (work + SB_THREADS - 1) / SB_THREADS;
    if (blocks > SB_MAX_BLOCKS)
        blocks = SB_MAX_BLOCKS;
    cudaStream_t s = (cudaStream_t)stream;
    switch (dtype) {
    case KILN_DTYPE_F32:
        sb_kernel<KILN_DTYPE_F32><<<(unsigned)blocks, SB_THREADS, 0, s>>>(x, y, n, nvec, scale, bias);
        break;
    case KILN_DTYPE_F16:
        sb_kernel<KILN_DTYPE_F16><<<(unsigned)blocks, SB_THREADS, 0, s>>>(x, y, n, nvec, scale, bias);
        break;
    case KILN_DTYPE_BF16:
        sb_kernel<KILN_DTYPE_BF16><<<(unsigned)blocks, SB_THREADS, 0, s>>>(x, y, n, nvec, scale, bias);
        break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

extern "C" const char *scale_bias_cuda_error(int code) { return cudaGetErrorString((cudaError_t)code); }
