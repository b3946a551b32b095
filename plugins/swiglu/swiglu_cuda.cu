/* SwiGLU on CUDA: silu in f32 with the IEEE exp and division of the CPU
 * reference, rounded to the storage dtype before the multiply as swiglu.c
 * does. When rows, row strides and pointers allow, a thread takes one
 * 16-byte vector of gate and of up (grid: x over a row's vectors, y over
 * rows, so no 64-bit division per element); otherwise one element per
 * thread (grid-stride). */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"
#include "fp8/fp8_quant.cuh"

#define SWIGLU_THREADS 256

__device__ __forceinline__ float swiglu_one(int t, float g, float u)
{
    float s = kcu_round_float(t, __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))));
    return __fmul_rn(s, u);
}

__global__ void __launch_bounds__(SWIGLU_THREADS)
    swiglu_kernel(const void *gate, const void *up, void *y, int t, int64_t rows, int64_t width, int64_t ld)
{
    KTL_SCOPE(0);
    kcu_after_prior(gate, up, rows, t);
    int64_t n = rows * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / width, c = i - r * width, src = r * ld + c;
        kcu_store_float(y, t, i, swiglu_one(t, kcu_load_float(gate, t, src), kcu_load_float(up, t, src)));
    }
}

/* DT's elements in a 16-byte vector: f32 4, f16/bf16 8. wv: vectors per
 * row of y; ldv: vectors between rows of gate and up. */
template <int DT>
__global__ void __launch_bounds__(SWIGLU_THREADS)
    swiglu_vec_kernel(const uint4 *gate, const uint4 *up, uint4 *y, int64_t rows, int32_t wv, int64_t ldv)
{
    KTL_SCOPE(0);
    kcu_after_prior(gate, up, rows, wv);
    constexpr int PER = DT == KILN_DTYPE_F32 ? 4 : 8;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
        for (int32_t c = blockIdx.x * SWIGLU_THREADS + threadIdx.x; c < wv; c += gridDim.x * SWIGLU_THREADS) {
            uint4 g = __ldg(gate + r * ldv + c), u = __ldg(up + r * ldv + c), o;
            const void *gp = &g, *up_ = &u;
            void *op = &o;
#pragma unroll
            for (int e = 0; e < PER; e++)
                kiln_elem_store_f32(op, DT, e,
                                    swiglu_one(DT, kiln_elem_load_f32(gp, DT, e), kiln_elem_load_f32(up_, DT, e)));
            y[r * wv + c] = o;
        }
}

/* quantize = fp8: a block a row (grid-stride), each thread's up to V
 * vectors of y's values in registers, rounded to DT, then the row's E4M3
 * codes and scale (fp8_quant.cuh): y itself never reaches memory. wv:
 * vectors a row of y (at most V * SWIGLU_THREADS); ldv as above. */
template <int DT, int V>
__global__ void __launch_bounds__(SWIGLU_THREADS)
    swiglu_q8_kernel(const uint4 *gate, const uint4 *up, uint8_t *q, float *q_scale, int64_t rows, int32_t wv,
                     int64_t ldv)
{
    KTL_SCOPE(0);
    kcu_after_prior(gate, up, rows, wv);
    constexpr int PER = DT == KILN_DTYPE_F32 ? 4 : 8;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        float f[V][PER];
        float a = 0.0f;
#pragma unroll
        for (int v = 0; v < V; v++) {
            const int32_t c = threadIdx.x + v * SWIGLU_THREADS;
            if (c < wv) {
                uint4 g = __ldg(gate + r * ldv + c), u = __ldg(up + r * ldv + c);
                const void *gp = &g, *up_ = &u;
#pragma unroll
                for (int e = 0; e < PER; e++) {
                    f[v][e] = kcu_round_float(
                        DT, swiglu_one(DT, kiln_elem_load_f32(gp, DT, e), kiln_elem_load_f32(up_, DT, e)));
                    a = fmaxf(a, fabsf(f[v][e]));
                }
            }
        }
        const float qi = fp8_row_scale(a, q_scale + r);
#pragma unroll
        for (int v = 0; v < V; v++) {
            const int32_t c = threadIdx.x + v * SWIGLU_THREADS;
            if (c < wv) {
                uint8_t *qr = q + (r * wv + c) * PER;
                if constexpr (PER == 8)
                    *reinterpret_cast<uint2 *>(qr) = make_uint2(fp8_pack4(f[v], qi), fp8_pack4(f[v] + 4, qi));
                else
                    *reinterpret_cast<uint32_t *>(qr) = fp8_pack4(f[v], qi);
            }
        }
    }
}

template <int DT>
static cudaError_t swiglu_q8_launch(const uint4 *g, const uint4 *u, uint8_t *q, float *q_scale, int64_t rows,
                                    int32_t wv, int64_t ldv, cudaStream_t st)
{
    const dim3 grid((unsigned)(rows < 65535 ? rows : 65535)), block(SWIGLU_THREADS);
    const int32_t per = (wv + SWIGLU_THREADS - 1) / SWIGLU_THREADS;
    return per <= 1   ? kcu_launch_cfg(swiglu_q8_kernel<DT, 1>, grid, block, st, g, u, q, q_scale, rows, wv, ldv)
           : per <= 2 ? kcu_launch_cfg(swiglu_q8_kernel<DT, 2>, grid, block, st, g, u, q, q_scale, rows, wv, ldv)
           : per <= 4 ? kcu_launch_cfg(swiglu_q8_kernel<DT, 4>, grid, block, st, g, u, q, q_scale, rows, wv, ldv)
                      : kcu_launch_cfg(swiglu_q8_kernel<DT, 8>, grid, block, st, g, u, q, q_scale, rows, wv, ldv);
}

/* SwiGLU into y, then (q non-NULL) y quantized into q and q_scale. */
static int swiglu_store(const void *gate, const void *up, void *y, int32_t dtype, int64_t rows, int64_t width,
                        int64_t ld, cudaStream_t st);

extern "C" int kiln_swiglu_cuda(const void *gate, const void *up, void *y, int32_t dtype, int64_t rows, int64_t width,
                                int64_t ld, uint8_t *q, float *q_scale, void *stream)
{
    if (rows * width <= 0)
        return 0;
    cudaStream_t st = (cudaStream_t)stream;
    const int per = dtype == KILN_DTYPE_F32 ? 4 : 8;
    if (q) {
        const int64_t wv = width / per;
        if (width % per == 0 && ld % per == 0 && wv <= 8 * SWIGLU_THREADS &&
            (((uintptr_t)gate | (uintptr_t)up | (uintptr_t)q) & 15) == 0) {
            const uint4 *g = (const uint4 *)gate, *u = (const uint4 *)up;
            switch (dtype) {
            case KILN_DTYPE_F32:
                return (int)swiglu_q8_launch<KILN_DTYPE_F32>(g, u, q, q_scale, rows, (int32_t)wv, ld / per, st);
            case KILN_DTYPE_F16:
                return (int)swiglu_q8_launch<KILN_DTYPE_F16>(g, u, q, q_scale, rows, (int32_t)wv, ld / per, st);
            default: return (int)swiglu_q8_launch<KILN_DTYPE_BF16>(g, u, q, q_scale, rows, (int32_t)wv, ld / per, st);
            }
        }
        /* elsewhere y is stored (in the caller's scratch) and then quantized */
        int e = swiglu_store(gate, up, y, dtype, rows, width, ld, st);
        if (e || width > INT32_MAX)
            return e ? e : (int)cudaErrorInvalidValue;
        return kiln_fp8_quantize_cuda(y, dtype, q, q_scale, rows, (int32_t)width, stream);
    }
    return swiglu_store(gate, up, y, dtype, rows, width, ld, st);
}

static int swiglu_store(const void *gate, const void *up, void *y, int32_t dtype, int64_t rows, int64_t width,
                        int64_t ld, cudaStream_t st)
{
    int64_t n = rows * width;
    const int per = dtype == KILN_DTYPE_F32 ? 4 : 8;
    if (width % per == 0 && ld % per == 0 && width / per <= INT32_MAX &&
        (((uintptr_t)gate | (uintptr_t)up | (uintptr_t)y) & 15) == 0) {
        const int64_t wv = width / per, bx = (wv + SWIGLU_THREADS - 1) / SWIGLU_THREADS;
        dim3 grid((unsigned)(bx < 1024 ? bx : 1024), (unsigned)(rows < 65535 ? rows : 65535));
        const uint4 *g = (const uint4 *)gate, *u = (const uint4 *)up;
        uint4 *o = (uint4 *)y;
        switch (dtype) {
        case KILN_DTYPE_F32:
            return (int)kcu_launch_cfg(swiglu_vec_kernel<KILN_DTYPE_F32>, grid, dim3(SWIGLU_THREADS), st, g, u, o, rows,
                                       (int32_t)wv, ld / per);
        case KILN_DTYPE_F16:
            return (int)kcu_launch_cfg(swiglu_vec_kernel<KILN_DTYPE_F16>, grid, dim3(SWIGLU_THREADS), st, g, u, o, rows,
                                       (int32_t)wv, ld / per);
        default:
            return (int)kcu_launch_cfg(swiglu_vec_kernel<KILN_DTYPE_BF16>, grid, dim3(SWIGLU_THREADS), st, g, u, o,
                                       rows, (int32_t)wv, ld / per);
        }
    }
    int64_t want = (n + SWIGLU_THREADS - 1) / SWIGLU_THREADS;
    unsigned blocks = (unsigned)(want < 132 * 16 ? want : 132 * 16);
    return (int)kcu_launch_cfg(swiglu_kernel, dim3(blocks), dim3(SWIGLU_THREADS), st, gate, up, y, (int)dtype, rows,
                               width, ld);
}
