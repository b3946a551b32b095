/* FusedMatMul on CUDA (the semantics are fusedmm.c's):
 *  - 1, 2, 4 or 8 rows of x (decode; the graph buckets pad to these): one
 *    GEMV kernel built like src/backend/cuda/gemv.cu (4 warps split K,
 *    16-byte streaming loads, the first weight loads issued before the PDL
 *    wait) with the rest of the fused layer inside: with the RMSNorm
 *    prologue each block first sums the squares of its x rows (K values,
 *    read from L2) and normalizes each x element once for its 8 (or 4)
 *    weight rows; the epilogue adds the residual, or (weight rows
 *    interleaved gate, up) combines a pair of rows into silu(gate) * up,
 *    or (the weight's rotated pairs adjacent) rotates a pair as RoPE does.
 *    The intermediate tensors (the norm's output, gate/up) never reach
 *    memory. Where a warp's share of K is at most two loads a lane (K up
 *    to 2,048 in 16 bits) and there are more rows than one wave of
 *    blocks, at 1 or 2 rows of x, the same arithmetic runs in resident
 *    blocks that loop over the rows (fmm_loop_kernel).
 *  - any other row count (prefill): RMSNorm into the workspace
 *    (rmsnorm_cuda.cu), cuBLASLt's GEMM (f32 accumulation, TN), the
 *    residual add in the GEMM's own epilogue (beta = 1: the product is not
 *    rounded before the add, one rounding where the CPU reference has
 *    two), RoPE or SwiGLU as one elementwise kernel after it.
 * The residual stream of a bf16/f16 engine is f32: the norm forms then
 * read an f32 x and the residual form adds into an f32 residual and
 * writes f32 (the kernels' S, "stream", dtype; cuBLASLt's C and D in f32
 * with bf16/f16 A and B, one of its documented type combinations). */
#include <atomic>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#include "fusedmm_epilogue.cuh"
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"
#include "rope/rope_math.cuh"

#include <cublasLt.h>

namespace
{

constexpr int kWarps = 4;

cublasLtHandle_t fmm_lt;
int fmm_lt_status = -1;
std::once_flag fmm_lt_once;

/* 1. the fused GEMV ------------------------------------------------------------------------ */

/* The 16-byte vector v of dtype DT as floats (E of them). */
template <int DT> __device__ __forceinline__ void unpack(const uint4 &v, float *f)
{
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (DT == KILN_DTYPE_BF16) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        } else if constexpr (DT == KILN_DTYPE_F16) {
            const float2 p = __half22float2(*reinterpret_cast<const __half2 *>(&u[i]));
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        } else {
            f[i] = __uint_as_float(u[i]);
        }
    }
}

/* Weight rows a block computes (ROWS) and 16-byte loads of each row a lane
 * keeps in flight (UNROLL). The residual form has gemv.cu's shape (2 rows,
 * 4 loads). The norm forms add per block a pass over x for the sum of
 * squares, a __syncthreads, and the normalization of each x element (two
 * multiplies, two roundings) besides the rows' FMAs: at 2 rows a block
 * that was about 6 instructions per weight byte, the SM's whole issue rate
 * at the memory's (x and the norm weight also came from L2, as many bytes
 * as the weight rows), and the fused layers ran slower than the unfused
 * ones. At 8 rows (4 at 4 or 8 rows of x, where the accumulators take the
 * registers) it is about 1.5 instructions per byte, near the plain GEMV's
 * 1.25, and the L2 reads a quarter of the weight bytes; 2 loads a row
 * issue a 2048-long row's whole share of the lane before the wait on the
 * previous kernel. An even row count keeps SwiGLU's gate/up pairs and
 * RoPE's rotated pairs inside one block. */
template <int M, int NORM> struct gemv_shape {
    static constexpr int rows = NORM ? (M <= 2 ? 8 : 4) : 2;
    static constexpr int unroll = NORM ? 2 : 4;
};

/* E values of x (dtype S) from element i on, as floats: one 16-byte load
 * of DT-wide values, or two when S is f32 and DT is 16-bit. */
template <int DT, int S, int E> __device__ __forceinline__ void load_x(const char *x, int64_t i, float *f)
{
    if constexpr (S == DT) {
        unpack<DT>(__ldg((const uint4 *)(x + i * (16 / E))), f);
    } else {
        static_assert(S == KILN_DTYPE_F32 && E == 8, "an f32 x beside 16-bit weights");
        unpack<KILN_DTYPE_F32>(__ldg((const uint4 *)(x + i * 4)), f);
        unpack<KILN_DTYPE_F32>(__ldg((const uint4 *)(x + i * 4 + 16)), f + 4);
    }
}

/* acc[m][r] += x row m · w row r over one 16-byte vector of each w row
 * (xf: the M rows' E values there, as floats). */
template <int DT, int M, int ROWS>
__device__ __forceinline__ void dot_rows(const float (*xf)[DT == KILN_DTYPE_F32 ? 4 : 8], const uint4 *w,
                                         float (*acc)[ROWS])
{
    constexpr int E = DT == KILN_DTYPE_F32 ? 4 : 8;
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float wf[E];
        unpack<DT>(w[r], wf);
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[m][r] = fmaf(xf[m][e], wf[e], acc[m][r]);
    }
}

/* 1 / sqrt(mean(x²) + eps) of each of the M rows of x (dtype S) over all
 * of k, as rmsnorm.c, by the whole block; sq is the block's scratch. */
template <int DT, int S, int M>
__device__ __forceinline__ void norm_inv(const char *xb, int32_t k, float eps, float (*sq)[M], float *inv)
{
    constexpr int E = DT == KILN_DTYPE_F32 ? 4 : 8;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    float ss[M];
#pragma unroll
    for (int m = 0; m < M; m++)
        ss[m] = 0.0f;
        /* unrolled so that a thread's loads of x (2 at k = 2048) are in
     * flight together, not one L2 round trip after another */
#pragma unroll 4
    for (int64_t v = threadIdx.x; v < k / E; v += kWarps * 32)
#pragma unroll
        for (int m = 0; m < M; m++) {
            float f[E];
            load_x<DT, S, E>(xb, (int64_t)m * k + v * E, f);
#pragma unroll
            for (int e = 0; e < E; e++)
                ss[m] = __fadd_rn(ss[m], __fmul_rn(f[e], f[e]));
        }
#pragma unroll
    for (int m = 0; m < M; m++) {
        const float s = kcu_warp_sum(ss[m]);
        if (lane == 0)
            sq[wid][m] = s;
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < M; m++) {
        float total = 0.0f;
#pragma unroll
        for (int j = 0; j < kWarps; j++)
            total += sq[j][m];
        inv[m] = 1.0f / sqrtf(total / (float)k + eps);
    }
}

/* The end of a block's ROWS rows from row0 on: the kWarps warps' partial
 * sums in part, added and stored through the epilogue (ev: its operand,
 * the residual or the row's position, loaded by the thread that stores). */
template <int DT, int S, int M, int EPI, int ROWS>
__device__ __forceinline__ void store_rows(const float (*part)[M][ROWS], int64_t row0, int32_t n, float ev, void *y,
                                           int ydt, const rope_arg<EPI> &rope)
{
    if constexpr (EPI == KILN_FUSEDMM_ROPE || EPI == KILN_FUSEDMM_SWIGLU) {
        /* rows r0 and r0 + 1: a rotated pair, or gate and up of the
         * interleaved weight (n is even) */
        constexpr int PAIRS = ROWS / 2;
        if (threadIdx.x < M * PAIRS) {
            const int m = threadIdx.x / PAIRS, p = threadIdx.x % PAIRS;
            const int64_t r0 = row0 + 2 * p;
            if (r0 < n) {
                float a = 0.0f, b = 0.0f;
#pragma unroll
                for (int j = 0; j < kWarps; j++) {
                    a += part[j][m][2 * p];
                    b += part[j][m][2 * p + 1];
                }
                if constexpr (EPI == KILN_FUSEDMM_ROPE)
                    rope_store<DT>(rope, ev, y, m, n, r0, kcu_round_float(DT, a), kcu_round_float(DT, b));
                else
                    kcu_store_float(y, DT, (int64_t)m * (n / 2) + r0 / 2,
                                    silu_times(DT, kcu_round_float(DT, a), kcu_round_float(DT, b)));
            }
        }
    } else if (threadIdx.x < M * ROWS) {
        const int m = threadIdx.x / ROWS, r = threadIdx.x % ROWS;
        if (row0 + r < n) {
            float v = 0.0f;
#pragma unroll
            for (int j = 0; j < kWarps; j++)
                v += part[j][m][r];
            const int64_t at = (int64_t)m * n + row0 + r;
            if constexpr (EPI == KILN_FUSEDMM_RESIDUAL)
                kcu_store_float(y, S, at, __fadd_rn(kcu_round_float(DT, v), ev));
            else
                kcu_store_float(y, ydt, at, v);
        }
    }
}

/* x [M, k], w [n, k], nw [k] (norm), res and y [M, n] (y [M, n / 2] with
 * SwiGLU), w and nw of dtype DT; x of dtype S with the norm (else DT), res
 * and y of dtype S with the residual epilogue (else y in DT, or in ydt
 * without an epilogue: f32 logits, stored unrounded); k a
 * multiple of the vector width, x, w and nw 16-byte aligned. Each block
 * computes ROWS rows of y for the M rows of x; its kWarps warps split k
 * into contiguous quarters (as gemv.cu's). */
template <int DT, int S, int M, int NORM, int EPI, int ROWS, int UNROLL>
__global__ void __launch_bounds__(kWarps * 32)
    fmm_gemv_kernel(const void *x, const void *w, const void *nw, const void *res, void *y, int32_t n, int32_t k,
                    float eps, int ydt, const rope_arg<EPI> rope)
{
    KTL_SCOPE(k);
    constexpr int E = DT == KILN_DTYPE_F32 ? 4 : 8; /* elements per 16-byte vector */
    constexpr int ES = 16 / E;                      /* bytes per element */
    constexpr int STEP = 32 * E;
    constexpr int NU = NORM ? UNROLL : 1; /* vectors of the norm weight held */
    __shared__ float part[kWarps][M][ROWS];
    __shared__ float sq[kWarps][M];
    (void)sq;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t row0 = (int64_t)blockIdx.x * ROWS;
    const int64_t kq = ((int64_t)k / E + kWarps - 1) / kWarps * E;
    const int64_t k0 = wid * kq, k1 = k0 + kq < k ? k0 + kq : k;
    const char *xb = (const char *)x, *nb = (const char *)nw;

    /* rows past n read the last row: loaded, never stored */
    const char *wr[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
        wr[r] = (const char *)w + (row0 + r < n ? row0 + r : n - 1) * (int64_t)k * ES;
    /* the first vectors of w and of the norm weight before the wait: both
     * are constants, only x and res depend on the previous kernel */
    uint4 buf[UNROLL][ROWS], nbuf[NU];
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int64_t kk = k0 + (int64_t)u * STEP + lane * E;
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            buf[u][r] = kk < k1 ? kcu_load_stream(wr[r] + kk * ES) : make_uint4(0, 0, 0, 0);
        if constexpr (NORM)
            nbuf[u] = kk < k1 ? __ldg((const uint4 *)(nb + kk * ES)) : make_uint4(0, 0, 0, 0);
    }
    kcu_after_prior(x, res, n, k);

    /* the epilogue's operand (the residual, or the row's position) loaded
     * now, so that its round trip overlaps the products instead of
     * following them */
    float ev = 0.0f;
    if constexpr (EPI == KILN_FUSEDMM_RESIDUAL) {
        const int64_t r = row0 + threadIdx.x % ROWS;
        if (threadIdx.x < M * ROWS && r < n)
            ev = kcu_load_float(res, S, (int64_t)(threadIdx.x / ROWS) * n + r);
    } else if constexpr (EPI == KILN_FUSEDMM_ROPE) {
        if (threadIdx.x < M * (ROWS / 2))
            ev = (float)((const int32_t *)res)[threadIdx.x / (ROWS / 2)];
    }

    /* the RMSNorm statistics of each row over all of k, as rmsnorm.c; the
     * x vectors stay in L1 for the products below */
    float inv[M];
    if constexpr (NORM) {
        norm_inv<DT, S, M>(xb, k, eps, sq, inv);
    } else {
#pragma unroll
        for (int m = 0; m < M; m++)
            inv[m] = 1.0f;
    }

    float acc[M][ROWS];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            acc[m][r] = 0.0f;
    for (int64_t base = k0; base < k1; base += (int64_t)UNROLL * STEP) {
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t kk = base + (int64_t)u * STEP + lane * E;
            if (kk < k1) {
                /* the x vectors of this position, normalized once for all
                 * ROWS rows as RMSNorm stores its output: the normalized
                 * value rounded, times the weight, rounded */
                float xf[M][E];
#pragma unroll
                for (int m = 0; m < M; m++)
                    load_x<DT, NORM ? S : DT, E>(xb, (int64_t)m * k + kk, xf[m]);
                if constexpr (NORM) {
                    float nf[E];
                    unpack<DT>(nbuf[u], nf);
#pragma unroll
                    for (int m = 0; m < M; m++)
#pragma unroll
                        for (int e = 0; e < E; e++)
                            xf[m][e] =
                                kcu_round_float(DT, __fmul_rn(kcu_round_float(S, __fmul_rn(xf[m][e], inv[m])), nf[e]));
                }
                dot_rows<DT, M, ROWS>(xf, buf[u], acc);
            }
            /* refill this slot with the vector UNROLL loads ahead */
            const int64_t next = kk + (int64_t)UNROLL * STEP;
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                buf[u][r] = next < k1 ? kcu_load_stream(wr[r] + next * ES) : make_uint4(0, 0, 0, 0);
            if constexpr (NORM)
                nbuf[u] = next < k1 ? __ldg((const uint4 *)(nb + next * ES)) : make_uint4(0, 0, 0, 0);
        }
    }

#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const float v = kcu_warp_sum(acc[m][r]);
            if (lane == 0)
                part[wid][m][r] = v;
        }
    __syncthreads();
    store_rows<DT, S, M, EPI, ROWS>(part, row0, n, ev, y, ydt, rope);
}

/* The 16-byte vector of E values of dtype DT (each already a value of DT). */
template <int DT> __device__ __forceinline__ uint4 pack(const float *f)
{
    uint32_t u[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if constexpr (DT == KILN_DTYPE_BF16) {
            u[i] = (__float_as_uint(f[2 * i]) >> 16) | (__float_as_uint(f[2 * i + 1]) & 0xffff0000u);
        } else if constexpr (DT == KILN_DTYPE_F16) {
            const __half2 h = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
            u[i] = *reinterpret_cast<const uint32_t *>(&h);
        } else {
            u[i] = __float_as_uint(f[i]);
        }
    }
    return make_uint4(u[0], u[1], u[2], u[3]);
}

/* fmm_gemv_kernel's products and epilogues with resident blocks, where
 * each warp's quarter of k is at most NX = 2 steps (k up to 2,048 in 16
 * bits: the 1B's gate/up, o projection and head): a grid of at most one
 * wave of blocks, each computing group after group of ROWS rows (groups
 * blockIdx.x, + gridDim.x, ...). At such a k a block of fmm_gemv_kernel
 * issues all of its loads at once and then only computes, and its slot
 * streams nothing until the next block starts. Here the ring of UNROLL
 * loads a row runs on across groups: the slot a step frees is refilled
 * with the step UNROLL ahead, in the next group once this group's steps
 * run out, so the next rows are in flight while this group's sums are
 * reduced and stored. Each lane loads its own NX vectors of x once a
 * block, normalizes them with the norm (as RMSNorm stores its output) and
 * keeps them in registers, packed in DT. No shared memory beyond
 * fmm_gemv_kernel's: a first form kept x there and cost the 8B 6% of its
 * step (measured; our reading is that its blocks no longer started beside
 * the other kernels' on an SM). Measured on the H200 (1B decode,
 * bench/README.md, fifteenth session): the norm forms so +0.7%; the
 * residual form capped at 3 blocks an SM (loop_cap), so that the gate/up
 * kernel after the o projection finds room on every SM and issues its
 * first loads before the o projection ends, +1.7% more. */
template <int DT, int S, int M, int NORM, int EPI, int ROWS, int UNROLL, int NX>
__global__ void __launch_bounds__(kWarps * 32, 4)
    fmm_loop_kernel(const void *x, const void *w, const void *nw, const void *res, void *y, int32_t n, int32_t k,
                    float eps, int ydt, const rope_arg<EPI> rope)
{
    KTL_SCOPE(k);
    constexpr int E = DT == KILN_DTYPE_F32 ? 4 : 8; /* elements per 16-byte vector */
    constexpr int ES = 16 / E;                      /* bytes per element */
    constexpr int STEP = 32 * E;
    static_assert(NX % UNROLL == 0, "the ring's slots repeat every group");
    __shared__ float part[2][kWarps][M][ROWS];
    __shared__ float sq[kWarps][M];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int32_t groups = (n + ROWS - 1) / ROWS;
    const int64_t kq = ((int64_t)k / E + kWarps - 1) / kWarps * E;
    const int64_t k0 = wid * kq, k1 = k0 + kq < k ? k0 + kq : k;
    /* byte offsets in 32 bits (the launch checks that w has under 4 GB):
     * fewer registers than 64-bit row pointers */
    const uint32_t row_bytes = (uint32_t)k * ES, lane_bytes = (uint32_t)(k0 + lane * E) * ES;

    /* step s of group g into slot u: rows past n read the last row
     * (loaded, never stored), groups past the end nothing */
    uint4 buf[UNROLL][ROWS];
    auto fill = [&](int u, int32_t g, int s) {
        const bool in = g < groups && k0 + (int64_t)s * STEP + lane * E < k1;
        const uint32_t at = lane_bytes + (uint32_t)(s * STEP * ES);
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const uint32_t row = min((uint32_t)g * ROWS + r, (uint32_t)n - 1);
            buf[u][r] = in ? kcu_load_stream((const char *)w + (row * row_bytes + at)) : make_uint4(0, 0, 0, 0);
        }
    };
    int32_t g = blockIdx.x;
    /* the first group's first steps before the wait: w does not depend on
     * the previous kernel */
#pragma unroll
    for (int u = 0; u < UNROLL; u++)
        fill(u, g, u);
    kcu_after_prior(x, res, n, k);

    float ev = 0.0f; /* the rope form's position, the same for every group */
    if constexpr (EPI == KILN_FUSEDMM_ROPE) {
        if (threadIdx.x < M * (ROWS / 2))
            ev = (float)((const int32_t *)res)[threadIdx.x / (ROWS / 2)];
    }
    float inv[M];
    if constexpr (NORM)
        norm_inv<DT, S, M>((const char *)x, k, eps, sq, inv);
    (void)sq;
    /* this lane's x vectors (x in DT without the norm), normalized as
     * RMSNorm stores its output: the normalized value rounded, times the
     * weight, rounded */
    uint4 xr[NX][M];
#pragma unroll
    for (int s = 0; s < NX; s++) {
        const int64_t kk = k0 + (int64_t)s * STEP + lane * E;
        float nf[E];
        if constexpr (NORM)
            unpack<DT>(kk < k1 ? __ldg((const uint4 *)((const char *)nw + kk * ES)) : make_uint4(0, 0, 0, 0), nf);
#pragma unroll
        for (int m = 0; m < M; m++) {
            xr[s][m] = make_uint4(0, 0, 0, 0); /* past k1: zeros, as the weights there */
            if (kk < k1) {
                if constexpr (NORM) {
                    float f[E];
                    load_x<DT, S, E>((const char *)x, (int64_t)m * k + kk, f);
#pragma unroll
                    for (int e = 0; e < E; e++)
                        f[e] = kcu_round_float(DT, __fmul_rn(kcu_round_float(S, __fmul_rn(f[e], inv[m])), nf[e]));
                    xr[s][m] = pack<DT>(f);
                } else {
                    xr[s][m] = __ldg((const uint4 *)((const char *)x + ((int64_t)m * k + kk) * ES));
                }
            }
        }
    }

    for (int par = 0; g < groups; g += gridDim.x, par ^= 1) {
        if constexpr (EPI == KILN_FUSEDMM_RESIDUAL) { /* loaded now, used after the products */
            const int64_t r = (int64_t)g * ROWS + threadIdx.x % ROWS;
            if (threadIdx.x < M * ROWS && r < n)
                ev = kcu_load_float(res, S, (int64_t)(threadIdx.x / ROWS) * n + r);
        }
        float acc[M][ROWS];
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                acc[m][r] = 0.0f;
#pragma unroll
        for (int s = 0; s < NX; s++) {
            constexpr int U = UNROLL;
            const int u = s % U;
            /* steps past k1 hold zeros in both x and w */
            float xf[M][E];
#pragma unroll
            for (int m = 0; m < M; m++)
                unpack<DT>(xr[s][m], xf[m]);
            dot_rows<DT, M, ROWS>(xf, buf[u], acc);
            /* refill the slot with the step UNROLL ahead: in this group,
             * or the next group's */
            if (s + U < NX)
                fill(u, g, s + U);
            else
                fill(u, g + gridDim.x, s + U - NX);
        }
#pragma unroll
        for (int m = 0; m < M; m++)
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const float v = kcu_warp_sum(acc[m][r]);
                if (lane == 0)
                    part[par][wid][m][r] = v;
            }
        /* one barrier a group: part alternates, and a warp writes this
         * parity again only after the barrier of the next group, which the
         * threads that read it now reach after reading */
        __syncthreads();
        store_rows<DT, S, M, EPI, ROWS>(part[par], (int64_t)g * ROWS, n, ev, y, ydt, rope);
    }
}

/* The grid of fmm_loop_kernel for `groups` groups of rows, or 0 for
 * fmm_gemv_kernel. A wave is as many blocks as fit on the SMs, or cap_sm
 * an SM where that is fewer. KILN_FMM_LOOP: unset, the loop wherever the
 * groups outnumber one wave (a launch of one wave or less gains nothing
 * from it); "0" never; "all" always, one wave; N >= 1 always, at most N
 * blocks (the op tests: many groups a block). */
template <typename K> int32_t loop_blocks(K kernel, std::atomic<int> &known, int32_t groups, int cap_sm)
{
    long cap = -1; /* -1: automatic, 0: one wave */
    const char *e = getenv("KILN_FMM_LOOP");
    if (e && strcmp(e, "0") == 0)
        return 0;
    if (e && strcmp(e, "all") == 0) {
        cap = 0;
    } else if (e && *e) {
        char *end;
        const long v = strtol(e, &end, 10);
        if (end != e && !*end && v >= 1)
            cap = v;
    }
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    /* blocks an SM, once a kernel (the register count decides it) */
    int per_sm = known.load(std::memory_order_relaxed);
    if (per_sm == 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * 32, 0) != cudaSuccess) {
            (void)cudaGetLastError(); /* this query's own error: fmm_gemv_kernel instead */
            per_sm = -1;
        }
        known.store(per_sm, std::memory_order_relaxed); /* engines on other threads find the same */
    }
    if (per_sm < 1)
        return 0;
    const int64_t wave = (int64_t)sms * (cap_sm > 0 && cap_sm < per_sm ? cap_sm : per_sm);
    if (cap < 0)
        return groups > wave ? (int32_t)wave : 0;
    const int64_t b = cap == 0 || cap > wave ? wave : cap;
    return (int32_t)(b < groups ? b : groups);
}

/* fmm_loop_kernel with NX steps a warp (the warp's quarter of k in
 * steps, rounded up to the ring), when the launch takes it: -1 if not.
 * cap_sm > 0 caps the blocks an SM. */
template <int DT, int S, int M, int NORM, int EPI, int ROWS, int UNROLL, int NX>
int loop_launch(const kiln_fusedmm_cuda_args *a, const void *res, const rope_arg<EPI> &rope, int32_t groups, int cap_sm,
                cudaStream_t s)
{
    static std::atomic<int> per_sm{0};
    if ((uint64_t)a->n * (uint64_t)a->k * (DT == KILN_DTYPE_F32 ? 4 : 2) >= ((uint64_t)1 << 32))
        return -1; /* the kernel's offsets are 32-bit */
    const int32_t blocks = loop_blocks(fmm_loop_kernel<DT, S, M, NORM, EPI, ROWS, UNROLL, NX>, per_sm, groups, cap_sm);
    if (blocks < 1)
        return -1;
    return (int)kcu_launch_cfg(fmm_loop_kernel<DT, S, M, NORM, EPI, ROWS, UNROLL, NX>, dim3(blocks), dim3(kWarps * 32),
                               s, a->x, a->w, a->norm_weight, res, a->y, a->n, a->k, a->epsilon, (int)a->y_dtype, rope);
}

/* Blocks an SM of fmm_loop_kernel: KILN_FMM_LOOP_RESIDUAL=N (0..16) for
 * the residual form (the o and down projections), 3 by default, so that
 * the next kernel's blocks find room beside it and issue their first
 * loads while it runs (0: fmm_gemv_kernel); KILN_FMM_LOOP_NORM=N for the
 * norm forms, by default as many as fit (0). Measured at 1B (tok/s, two
 * runs each): residual 3 (default) 1,234-1,235, 2 1,223, 4 1,217, 1
 * 1,187; norm capped at 3 1,188, at 2 1,115; fmm_gemv_kernel alone
 * 1,206. */
int loop_cap(const char *name, int fallback)
{
    const char *e = getenv(name);
    char *end;
    const long v = e && *e ? strtol(e, &end, 10) : -1;
    return e && *e && !*end && v >= 0 && v <= 16 ? (int)v : fallback;
}

template <int DT, int S, int M, int NORM, int EPI>
cudaError_t gemv_launch(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    using shape = gemv_shape<M, NORM>;
    rope_arg<EPI> rope;
    const void *res = a->residual;
    if constexpr (EPI == KILN_FUSEDMM_ROPE) {
        rope = a->rope;
        res = a->positions;
    }
    const int32_t groups = (int32_t)((a->n + shape::rows - 1) / shape::rows);
    if constexpr (M <= 2) {
        /* two steps a warp (k up to 2,048 in 16 bits): x in 8 registers a
         * row of x. Four (k = 4,096) took 200 registers, or spilled at
         * the 128 that keep 4 blocks an SM. The residual form takes 4 rows
         * a block and 2 loads a row in flight (8, 2 with the norm). */
        constexpr int E = DT == KILN_DTYPE_F32 ? 4 : 8;
        const int64_t steps = ((a->k / E + kWarps - 1) / kWarps * E + 32 * E - 1) / (32 * E);
        const int cap = NORM ? loop_cap("KILN_FMM_LOOP_NORM", 0) : loop_cap("KILN_FMM_LOOP_RESIDUAL", 3);
        if (steps <= 2 && (NORM || cap)) {
            constexpr int R = NORM ? shape::rows : 4;
            const int e =
                loop_launch<DT, S, M, NORM, EPI, R, 2, 2>(a, res, rope, (int32_t)((a->n + R - 1) / R), cap, s);
            if (e >= 0)
                return (cudaError_t)e;
        }
    }
    return kcu_launch_cfg(fmm_gemv_kernel<DT, S, M, NORM, EPI, shape::rows, shape::unroll>, dim3(groups),
                          dim3(kWarps * 32), s, a->x, a->w, a->norm_weight, res, a->y, a->n, a->k, a->epsilon,
                          (int)a->y_dtype, rope);
}

/* The four forms a decoder layer uses; the others take the GEMM path. */
template <int DT, int S, int M> cudaError_t gemv_mode(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    if (a->epilogue == KILN_FUSEDMM_ROPE)
        return gemv_launch<DT, S, M, 1, KILN_FUSEDMM_ROPE>(a, s);
    if (a->epilogue == KILN_FUSEDMM_SWIGLU)
        return gemv_launch<DT, S, M, 1, KILN_FUSEDMM_SWIGLU>(a, s);
    if (a->epilogue == KILN_FUSEDMM_RESIDUAL)
        return gemv_launch<DT, S, M, 0, KILN_FUSEDMM_RESIDUAL>(a, s);
    return gemv_launch<DT, S, M, 1, KILN_FUSEDMM_NONE>(a, s);
}

template <int DT, int S> cudaError_t gemv_rows(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    switch (a->rows) {
    case 1: return gemv_mode<DT, S, 1>(a, s);
    case 2: return gemv_mode<DT, S, 2>(a, s);
    case 4: return gemv_mode<DT, S, 4>(a, s);
    default: return gemv_mode<DT, S, 8>(a, s);
    }
}

/* S: the stream's dtype, DT's own or f32 (x with the norm, the residual
 * and y with the residual add). */
template <int DT> cudaError_t gemv_stream(const kiln_fusedmm_cuda_args *a, int32_t stream, cudaStream_t s)
{
    return stream == DT ? gemv_rows<DT, DT>(a, s) : gemv_rows<DT, KILN_DTYPE_F32>(a, s);
}

/* 2. prefill: RMSNorm, cuBLASLt, epilogue ----------------------------------------------------- */

/* The rope epilogue over t [rows, n], the GEMM's result in DT: one
 * thread a pair of columns. */
template <int DT>
__global__ void __launch_bounds__(256)
    fmm_rope_kernel(const void *t, const int32_t *pos, void *y, int64_t rows, int32_t n, const kiln_fusedmm_rope rope)
{
    KTL_SCOPE(0);
    kcu_after_prior(t, pos, rows, n);
    const int64_t pairs = rows * (n / 2);
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < pairs; i += (int64_t)gridDim.x * 256) {
        const int64_t m = i / (n / 2), row0 = 2 * (i % (n / 2));
        rope_store<DT>(rope, (float)pos[m], y, m, n, row0, kcu_load_float(t, DT, m * n + row0),
                       kcu_load_float(t, DT, m * n + row0 + 1));
    }
}

/* y[r, c] = silu(t[r, 2c]) * t[r, 2c + 1] (SwiGLU over the interleaved
 * product), t the GEMM's result in DT. */
template <int DT> __global__ void __launch_bounds__(256) fmm_swiglu_kernel(const void *t, void *y, int64_t count)
{
    KTL_SCOPE(0);
    kcu_after_prior(t, y, count, DT);
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < count; i += (int64_t)gridDim.x * 256)
        kcu_store_float(y, DT, i, silu_times(DT, kcu_load_float(t, DT, 2 * i), kcu_load_float(t, DT, 2 * i + 1)));
}

/* The two epilogues in 16-byte vectors (PER elements of DT), for t and y
 * 16-byte aligned: one element a load, they ran at a fraction of the
 * memory's bandwidth at 1,024 rows (as kiln/RoPE's scalar kernel, 44 us
 * for 12.6 MB at the 8B's qkv). SwiGLU: output vector v from t's vectors
 * 2v and 2v + 1 (count a multiple of PER). */
template <int DT> __global__ void __launch_bounds__(256) fmm_swiglu_vec_kernel(const uint4 *t, uint4 *y, int64_t vecs)
{
    KTL_SCOPE(0);
    kcu_after_prior(t, y, vecs, DT);
    constexpr int PER = DT == KILN_DTYPE_F32 ? 4 : 8;
    for (int64_t v = (int64_t)blockIdx.x * 256 + threadIdx.x; v < vecs; v += (int64_t)gridDim.x * 256) {
        const uint4 a = __ldg(t + 2 * v), b = __ldg(t + 2 * v + 1);
        uint4 o;
#pragma unroll
        for (int e = 0; e < PER; e++) {
            const uint4 &src = e < PER / 2 ? a : b;
            const int i = 2 * (e % (PER / 2));
            kiln_elem_store_f32(&o, DT, e,
                                silu_times(DT, kiln_elem_load_f32(&src, DT, i), kiln_elem_load_f32(&src, DT, i + 1)));
        }
        y[v] = o;
    }
}

/* RoPE: a vector of PER columns of t is PER / 2 pairs of one head (head_dim
 * and rotary_dim multiples of PER), all rotated or none; rotated, its
 * pairs go to one 16-byte vector (interleaved) or two 8-byte halves at i
 * and i + rotary_dim / 2, as rope_store places them. */
template <int DT>
__global__ void __launch_bounds__(256) fmm_rope_vec_kernel(const void *t, const int32_t *pos, void *y, int64_t rows,
                                                           int32_t n, const kiln_fusedmm_rope rope)
{
    KTL_SCOPE(0);
    kcu_after_prior(t, pos, rows, n);
    constexpr int PER = DT == KILN_DTYPE_F32 ? 4 : 8, ES = 16 / PER, P = PER / 2;
    const int32_t nv = n / PER;
    const int64_t total = rows * nv;
    for (int64_t v = (int64_t)blockIdx.x * 256 + threadIdx.x; v < total; v += (int64_t)gridDim.x * 256) {
        const int64_t m = v / nv;
        const int32_t c0 = (int32_t)(v % nv) * PER, h = c0 / rope.head_dim, o = c0 % rope.head_dim;
        const uint4 u = __ldg((const uint4 *)((const char *)t + (m * n + c0) * ES));
        char *yr = (char *)y + m * n * ES;
        if (h >= rope.rotated_heads || o >= rope.rotary_dim) {
            *(uint4 *)(yr + c0 * ES) = u;
            continue;
        }
        const float p = (float)pos[m];
        const int32_t i0 = o / 2, base = h * rope.head_dim;
        uint4 il;
        uint2 lo, hi;
#pragma unroll
        for (int q = 0; q < P; q++) {
            float sn, cs, y0, y1;
            rope_cos_sin(DT, p, rope.inv_freq[i0 + q], &cs, &sn);
            rope_rotate(DT, kiln_elem_load_f32(&u, DT, 2 * q), kiln_elem_load_f32(&u, DT, 2 * q + 1), cs, sn, &y0, &y1);
            if (rope.interleaved) {
                kiln_elem_store_f32(&il, DT, 2 * q, y0);
                kiln_elem_store_f32(&il, DT, 2 * q + 1, y1);
            } else {
                kiln_elem_store_f32(&lo, DT, q, y0);
                kiln_elem_store_f32(&hi, DT, q, y1);
            }
        }
        if (rope.interleaved) {
            *(uint4 *)(yr + (base + 2 * i0) * ES) = il;
        } else {
            *(uint2 *)(yr + (base + i0) * ES) = lo;
            *(uint2 *)(yr + (base + i0 + rope.rotary_dim / 2) * ES) = hi;
        }
    }
}

/* The 16-byte epilogues from 128 rows on; below, where a step is latency,
 * the one-element kernels (a sine and cosine, or an exponential, a thread
 * instead of four or eight in a chain: at one token kiln/RoPE's 16-byte
 * kernel cost the 8B FP8 decode 2%). KILN_FMM_EPILOGUE=scalar or vec
 * takes that one for every shape (to time both, and for the op tests);
 * read at each launch (a graph keeps its capture's). */
bool fmm_epilogue_vec(int64_t rows)
{
    const char *e = getenv("KILN_FMM_EPILOGUE");
    if (e && strcmp(e, "scalar") == 0)
        return false;
    return rows >= 128 || (e && strcmp(e, "vec") == 0);
}

/* The heuristic's algorithm by problem: prefill runs the same few shapes
 * every step, and the heuristic costs host time at each launch. */
struct algo_slot {
    int used;
    int32_t dtype, d_dtype, n, k;
    int64_t rows, ld;
    uint32_t align;
    cublasLtMatmulAlgo_t algo;
};
constexpr int kSlots = 64;
algo_slot slots[kSlots];
std::mutex slots_lock;

/* The largest power of two up to 256 dividing every address. */
uint32_t align_of(uintptr_t a)
{
    a |= 256;
    return (uint32_t)(a & (~a + 1));
}

cudaDataType_t lt_type(int32_t dt)
{
    return dt == KILN_DTYPE_F16 ? CUDA_R_16F : dt == KILN_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* d [rows, n] = src [rows, k] · wᵀ (+ c [rows, n] when c is not NULL, in
 * cuBLASLt's epilogue: the residual add), src and w of dtype dt, c and d
 * of dtype ddt (dt, or f32 for an f32 residual stream), rows of c and d
 * ld elements apart, computed column-major as dᵀ = op(W)ᵀ · srcᵀ. Returns
 * a cuBLAS status (0: launched), or -1 when cuBLASLt has no kernel. */
int lt_gemm(int32_t dt, int32_t ddt, const void *src, const void *w, const void *c, void *d, int64_t rows, int32_t n,
            int32_t k, int64_t ld, void *lt_ws, cudaStream_t s)
{
    const cudaDataType_t ty = lt_type(dt);
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
    const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    /* exact f32 (no TF32) so an f32 engine agrees with the CPU reference */
    cublasStatus_t st = cublasLtMatmulDescInit(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&la, ty, (uint64_t)k, (uint64_t)n, k);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&lb, ty, (uint64_t)k, (uint64_t)rows, k);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&lc, lt_type(ddt), (uint64_t)n, (uint64_t)rows, ld);
    if (st != CUBLAS_STATUS_SUCCESS)
        return (int)st;
    const uintptr_t es = dt == KILN_DTYPE_F32 ? 4 : 2, des = ddt == KILN_DTYPE_F32 ? 4 : 2;
    const uint32_t align = align_of((uintptr_t)src | (uintptr_t)w | (uintptr_t)c | (uintptr_t)d | (uintptr_t)k * es |
                                    (uintptr_t)n * es | (uintptr_t)ld * des);
    cublasLtMatmulAlgo_t algo;
    int have = 0, at = -1;
    {
        std::lock_guard<std::mutex> g(slots_lock);
        for (int i = 0; i < kSlots && !have; i++) {
            const algo_slot &sl = slots[i];
            if (sl.used && sl.dtype == dt && sl.d_dtype == ddt && sl.n == n && sl.k == k && sl.rows == rows &&
                sl.ld == ld && sl.align == align) {
                algo = sl.algo;
                have = 1;
            } else if (!sl.used && at < 0) {
                at = i;
            }
        }
    }
    if (!have) {
        cublasLtMatmulPreferenceOpaque_t pref;
        const size_t ws = KILN_FUSEDMM_LT_WORKSPACE;
        st = cublasLtMatmulPreferenceInit(&pref);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        const cublasLtMatmulPreferenceAttributes_t al[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
            st = cublasLtMatmulPreferenceSetAttribute(&pref, al[i], &align, sizeof align);
        if (st != CUBLAS_STATUS_SUCCESS)
            return (int)st;
        cublasLtMatmulHeuristicResult_t h;
        int found = 0;
        st = cublasLtMatmulAlgoGetHeuristic(fmm_lt, &desc, &la, &lb, &lc, &lc, &pref, 1, &h, &found);
        if (st != CUBLAS_STATUS_SUCCESS || found < 1)
            return -1;
        algo = h.algo;
        std::lock_guard<std::mutex> g(slots_lock);
        if (at >= 0 && !slots[at].used)
            slots[at] = algo_slot{1, dt, ddt, n, k, rows, ld, align, algo};
    }
    const float one = 1.0f, beta = c ? 1.0f : 0.0f;
    return (int)cublasLtMatmul(fmm_lt, &desc, &one, w, &la, src, &lb, &beta, c ? c : d, &lc, d, &lc, &algo, lt_ws,
                               KILN_FUSEDMM_LT_WORKSPACE, s);
}

template <int DT> int epilogue_path(const kiln_fusedmm_cuda_args *a, const void *t, cudaStream_t s);

template <int DT> int gemm_path(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    char *ws = (char *)a->workspace;
    const void *src = a->x;
    if (a->norm_weight) {
        void *xn = ws;
        int e = kiln_rmsnorm_cuda(a->x, NULL, a->norm_weight, NULL, xn, a->x_dtype, DT, DT, DT, a->rows, a->k,
                                  a->epsilon, NULL, NULL, 0.0f, s);
        if (e)
            return e;
        src = xn;
    }
    const size_t es = DT == KILN_DTYPE_F32 ? 4 : 2;
    /* the residual add in the GEMM's epilogue (beta = 1): no kernel of its
     * own and no pass over the product */
    const int direct = a->epilogue == KILN_FUSEDMM_NONE || a->epilogue == KILN_FUSEDMM_RESIDUAL;
    void *t = direct ? a->y : ws + kiln_fusedmm_workspace_t(a->rows, a->k);
    void *lt_ws = ws + kiln_fusedmm_workspace_lt(a->rows, a->n, a->k, es);
    int st = lt_gemm(DT, direct ? a->y_dtype : DT, src, a->w, a->epilogue == KILN_FUSEDMM_RESIDUAL ? a->residual : NULL,
                     t, a->rows, a->n, a->k, a->n, lt_ws, s);
    if (st)
        return st < 0 ? KILN_FUSEDMM_NO_ALGO : 10000 + st;
    if (direct)
        return 0;
    return epilogue_path<DT>(a, t, s);
}

/* RoPE or SwiGLU from t, the GEMM's result in DT, into a->y. */
template <int DT> int epilogue_path(const kiln_fusedmm_cuda_args *a, const void *t, cudaStream_t s)
{
    const int64_t count = a->rows * (a->n / 2);
    const int per = DT == KILN_DTYPE_F32 ? 4 : 8;
    if (fmm_epilogue_vec(a->rows) && (((uintptr_t)t | (uintptr_t)a->y) & 15) == 0) {
        const int rope = a->epilogue == KILN_FUSEDMM_ROPE;
        const int64_t vecs = rope ? a->rows * (a->n / per) : count / per, blocks = (vecs + 255) / 256;
        const dim3 grid((unsigned)(blocks < 132 * 16 ? blocks : 132 * 16));
        if (rope && a->n % per == 0 && a->rope.head_dim % per == 0 && a->rope.rotary_dim % per == 0)
            return (int)kcu_launch_cfg(fmm_rope_vec_kernel<DT>, grid, dim3(256), s, (const void *)t, a->positions, a->y,
                                       a->rows, a->n, a->rope);
        if (!rope && count % per == 0)
            return (int)kcu_launch_cfg(fmm_swiglu_vec_kernel<DT>, grid, dim3(256), s, (const uint4 *)t, (uint4 *)a->y,
                                       vecs);
    }
    const int64_t blocks = (count + 255) / 256;
    const dim3 grid((unsigned)(blocks < 132 * 16 ? blocks : 132 * 16));
    if (a->epilogue == KILN_FUSEDMM_ROPE)
        return (int)kcu_launch_cfg(fmm_rope_kernel<DT>, grid, dim3(256), s, (const void *)t, a->positions, a->y,
                                   a->rows, a->n, a->rope);
    return (int)kcu_launch_cfg(fmm_swiglu_kernel<DT>, grid, dim3(256), s, (const void *)t, a->y, count);
}

} /* namespace */

int fmm_epilogue_launch(const kiln_fusedmm_cuda_args *a, const void *t, cudaStream_t s)
{
    switch (a->dtype) {
    case KILN_DTYPE_F16: return epilogue_path<KILN_DTYPE_F16>(a, t, s);
    case KILN_DTYPE_BF16: return epilogue_path<KILN_DTYPE_BF16>(a, t, s);
    default: return epilogue_path<KILN_DTYPE_F32>(a, t, s);
    }
}

extern "C" int kiln_fusedmm_cuda_init(void)
{
    std::call_once(fmm_lt_once, [] { fmm_lt_status = (int)cublasLtCreate(&fmm_lt); });
    return fmm_lt_status == 0 ? 0 : 10000 + fmm_lt_status;
}

extern "C" int kiln_fusedmm_gemm_cuda(int32_t dtype, const void *x, const void *w, void *y, int64_t rows, int32_t n,
                                      int32_t k, int64_t ldy, void *lt_workspace, void *stream)
{
    if (rows <= 0 || n <= 0)
        return 0;
    int e = kiln_fusedmm_cuda_init();
    if (e)
        return e;
    const int st = lt_gemm(dtype, dtype, x, w, NULL, y, rows, n, k, ldy, lt_workspace, (cudaStream_t)stream);
    return st < 0 ? KILN_FUSEDMM_NO_ALGO : st ? 10000 + st : 0;
}

extern "C" int kiln_fusedmm_cuda(const kiln_fusedmm_cuda_args *a, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (a->rows <= 0 || a->n <= 0)
        return 0;
    if (a->w_scale)
        return fmm_fp8_cuda(a, s);
    const int64_t e = a->dtype == KILN_DTYPE_F32 ? 4 : 8;
    const uintptr_t addr = (uintptr_t)a->x | (uintptr_t)a->w | (uintptr_t)a->norm_weight;
    /* the GEMV's forms: the norm before no epilogue or SwiGLU, the residual add without it */
    const int form = a->epilogue == KILN_FUSEDMM_RESIDUAL ? !a->norm_weight : a->norm_weight != NULL;
    /* the stream's dtype: x's with the norm, y's with the residual add */
    const int32_t stream_dt = a->norm_weight ? a->x_dtype : a->y_dtype;
    if (form && (a->rows == 1 || a->rows == 2 || a->rows == 4 || a->rows == 8) && a->k % e == 0 && addr % 16 == 0 &&
        (stream_dt == a->dtype || stream_dt == KILN_DTYPE_F32)) {
        switch (a->dtype) {
        case KILN_DTYPE_F16: return (int)gemv_stream<KILN_DTYPE_F16>(a, stream_dt, s);
        case KILN_DTYPE_BF16: return (int)gemv_stream<KILN_DTYPE_BF16>(a, stream_dt, s);
        default: return (int)gemv_stream<KILN_DTYPE_F32>(a, stream_dt, s);
        }
    }
    int e0 = kiln_fusedmm_cuda_init();
    if (e0)
        return e0;
    const size_t es = a->dtype == KILN_DTYPE_F32 ? 4 : 2;
    if (!a->workspace || a->workspace_size < kiln_fusedmm_workspace(a->rows, a->n, a->k, es))
        return (int)cudaErrorInvalidValue;
    switch (a->dtype) {
    case KILN_DTYPE_F16: return gemm_path<KILN_DTYPE_F16>(a, s);
    case KILN_DTYPE_BF16: return gemm_path<KILN_DTYPE_BF16>(a, s);
    default: return gemm_path<KILN_DTYPE_F32>(a, s);
    }
}

extern "C" const char *kiln_fusedmm_cuda_error(int code)
{
    static thread_local char buf[96];
    if (code == KILN_FUSEDMM_NO_ALGO)
        snprintf(buf, sizeof buf, "cuBLASLt has no algorithm for this GEMM");
    else if (code >= 10000)
        snprintf(buf, sizeof buf, "cuBLASLt status %d", code - 10000);
    else
        snprintf(buf, sizeof buf, "CUDA error %d (%s)", code, cudaGetErrorString((cudaError_t)code));
    return buf;
}
