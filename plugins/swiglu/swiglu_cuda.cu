/* SwiGLU on CUDA: silu in f32 with the IEEE exp and division of the CPU
 * reference, rounded to the storage dtype before the multiply as swiglu.c
 * does. When rows, row strides and pointers allow, a thread takes one
 * 16-byte vector of gate and of up (grid: x over a row's vectors, y over
 * rows, so no 64-bit division per element); otherwise one element per
 * thread (grid-stride). */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"
#include "fp8/fp8_quant.cuh"

#include <cooperative_groups.h>
#include <stdlib.h>

namespace cg = cooperative_groups;

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

/* quantize = fp8: each row (grid y, grid-stride) by a cluster of up to 8
 * blocks (grid x), each thread's up to V vectors of y's values in
 * registers, rounded to DT; the blocks' max |y| are merged through
 * distributed shared memory, then each writes its part of the row's E4M3
 * codes (the scale by block 0), as fp8_quant.cuh defines them: y itself
 * never reaches memory. A row of one block alone put a decode step's
 * 14,336 SwiGLUs (an exp and a division each) on one SM: on the H200 the
 * 8B FP8 decode was 1.7% slower than with the unquantized kernel's 7
 * blocks (352.8 against 359.0 tok/s). wv: vectors a row of y (at most
 * V * 8 * SWIGLU_THREADS); ldv as above. A static amax > 0 (the field
 * x_amax) is every row's max |y|: no reduction and no cluster barrier. */
template <int DT, int V>
__global__ void __launch_bounds__(SWIGLU_THREADS)
    swiglu_q8_kernel(const uint4 *gate, const uint4 *up, uint8_t *q, float *q_scale, int64_t rows, int32_t wv,
                     int64_t ldv, float amax)
{
    KTL_SCOPE(0);
    kcu_after_prior(gate, up, rows, wv);
    constexpr int PER = DT == KILN_DTYPE_F32 ? 4 : 8;
    __shared__ float red[SWIGLU_THREADS / 32];
    __shared__ float block_max;
    cg::cluster_group cl = cg::this_cluster();
    const int32_t nb = (int32_t)cl.num_blocks(), stride = nb * SWIGLU_THREADS;
    const int32_t t0 = (int32_t)cl.block_rank() * SWIGLU_THREADS + (int32_t)threadIdx.x;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        float f[V][PER];
        float a = 0.0f;
#pragma unroll
        for (int v = 0; v < V; v++) {
            const int32_t c = t0 + v * stride;
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
        if (amax > 0.0f) { /* the same in every block of the grid */
            a = amax;
        } else {
            for (int o = 16; o > 0; o >>= 1)
                a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
            if ((threadIdx.x & 31) == 0)
                red[threadIdx.x >> 5] = a;
            __syncthreads();
            if (threadIdx.x == 0) {
                float m = red[0];
                for (int i = 1; i < SWIGLU_THREADS / 32; i++)
                    m = fmaxf(m, red[i]);
                block_max = m;
            }
            cl.sync(); /* every block's max written */
            a = 0.0f;
            for (int32_t b = 0; b < nb; b++)
                a = fmaxf(a, *cl.map_shared_rank(&block_max, b));
            cl.sync(); /* every block's max read: the next row may rewrite them */
        }
        if (t0 == 0)
            q_scale[r] = __fdiv_rn(a, KILN_E4M3_MAX);
        const float qi = a > 0.0f ? __fdiv_rn(KILN_E4M3_MAX, a) : 0.0f;
#pragma unroll
        for (int v = 0; v < V; v++) {
            const int32_t c = t0 + v * stride;
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

/* Blocks a row: as many as the row has 256 vectors (at most 8, the
 * portable cluster size), so that a decode step's one row spreads over 8
 * SMs. KILN_SWIGLU_Q8_BLOCKS=N (1..8) takes N instead, where N blocks of
 * 8 vectors a thread cover the row: at thousands of rows (a prefill) the
 * clusters' two barriers a row may cost more than they spread (ncu of an
 * 8B FP8 prefill of 2,048 tokens: 2.6x the kernel's bytes at the copy
 * rate), which a block a row, with no cluster barrier and up to 16 loads a
 * thread in flight, would not pay. Not yet measured: bench/README.md. */
static int32_t swiglu_q8_blocks(int32_t wv)
{
    const int32_t fit = (wv + SWIGLU_THREADS - 1) / SWIGLU_THREADS,
                  least = (wv + 8 * SWIGLU_THREADS - 1) / (8 * SWIGLU_THREADS);
    const char *e = getenv("KILN_SWIGLU_Q8_BLOCKS");
    const int32_t want = e && *e ? (int32_t)atoi(e) : 0;
    if (want >= 1 && want <= 8)
        return want > least ? (want < fit ? want : fit) : least;
    return fit < 8 ? fit : 8;
}

/* swiglu_q8_kernel over clusters of swiglu_q8_blocks blocks, V vectors a
 * thread. */
template <int DT>
static cudaError_t swiglu_q8_launch(const uint4 *g, const uint4 *u, uint8_t *q, float *q_scale, int64_t rows,
                                    int32_t wv, int64_t ldv, float amax, cudaStream_t st)
{
    const int32_t nb = swiglu_q8_blocks(wv);
    const int32_t per = (wv + nb * SWIGLU_THREADS - 1) / (nb * SWIGLU_THREADS);
    cudaLaunchAttribute attr[2];
    int n = 0;
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = (unsigned)nb;
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
    if (kcu_pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)nb, (unsigned)(rows < 65535 ? rows : 65535));
    cfg.blockDim = dim3(SWIGLU_THREADS);
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = (unsigned)n;
    return per <= 1   ? cudaLaunchKernelEx(&cfg, swiglu_q8_kernel<DT, 1>, g, u, q, q_scale, rows, wv, ldv, amax)
           : per <= 2 ? cudaLaunchKernelEx(&cfg, swiglu_q8_kernel<DT, 2>, g, u, q, q_scale, rows, wv, ldv, amax)
           : per <= 4 ? cudaLaunchKernelEx(&cfg, swiglu_q8_kernel<DT, 4>, g, u, q, q_scale, rows, wv, ldv, amax)
                      : cudaLaunchKernelEx(&cfg, swiglu_q8_kernel<DT, 8>, g, u, q, q_scale, rows, wv, ldv, amax);
}

/* SwiGLU into y, then (q non-NULL) y quantized into q and q_scale. */
static int swiglu_store(const void *gate, const void *up, void *y, int32_t dtype, int64_t rows, int64_t width,
                        int64_t ld, cudaStream_t st);

extern "C" int kiln_swiglu_cuda(const void *gate, const void *up, void *y, int32_t dtype, int64_t rows, int64_t width,
                                int64_t ld, uint8_t *q, float *q_scale, float amax, void *stream)
{
    if (rows * width <= 0)
        return 0;
    cudaStream_t st = (cudaStream_t)stream;
    const int per = dtype == KILN_DTYPE_F32 ? 4 : 8;
    if (q) {
        const int64_t wv = width / per;
        if (width % per == 0 && ld % per == 0 && wv <= 64 * SWIGLU_THREADS &&
            (((uintptr_t)gate | (uintptr_t)up | (uintptr_t)q) & 15) == 0) {
            const uint4 *g = (const uint4 *)gate, *u = (const uint4 *)up;
            switch (dtype) {
            case KILN_DTYPE_F32:
                return (int)swiglu_q8_launch<KILN_DTYPE_F32>(g, u, q, q_scale, rows, (int32_t)wv, ld / per, amax, st);
            case KILN_DTYPE_F16:
                return (int)swiglu_q8_launch<KILN_DTYPE_F16>(g, u, q, q_scale, rows, (int32_t)wv, ld / per, amax, st);
            default:
                return (int)swiglu_q8_launch<KILN_DTYPE_BF16>(g, u, q, q_scale, rows, (int32_t)wv, ld / per, amax, st);
            }
        }
        /* elsewhere y is stored (in the caller's scratch) and then quantized */
        int e = swiglu_store(gate, up, y, dtype, rows, width, ld, st);
        if (e || width > INT32_MAX)
            return e ? e : (int)cudaErrorInvalidValue;
        return kiln_fp8_quantize_cuda(y, dtype, q, q_scale, rows, (int32_t)width, amax, stream);
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
