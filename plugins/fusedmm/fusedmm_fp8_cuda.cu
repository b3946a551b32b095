/* FusedMatMul over E4M3 weights on CUDA (weights = fp8; the semantics are
 * fusedmm.c's: kiln/Fp8MatMul's product inside the fused layer):
 *  - 1, 2, 4 or 8 rows of x (decode): one GEMV kernel built like
 *    Fp8MatMul's decode GEMV (plugins/fp8/fp8_cuda.cu: 4 warps split k,
 *    16-byte streaming loads of 16 codes, the first issued before the PDL
 *    wait, each thread's weight scale loaded before it too) with the rest
 *    of the layer inside. Each block first takes each x row's statistics
 *    over all of k (x from L2): with the norm the sum of squares, then the
 *    max |h| of the normalized row h as RMSNorm rounds it, else max |x|
 *    (no max pass with a static x_amax from calibration: the sums of
 *    squares alone); then it rounds h (or x) times 448 / max to E4M3 as
 *    it multiplies, as
 *    Fp8MatMul's fused GEMV does, and applies the epilogue (RoPE of a
 *    rotated pair, SwiGLU of a gate/up pair, or the residual add) to the
 *    scaled sums. An FP8 decoder layer is so four of these and the
 *    attention, where the unfused one is nine kernels (AddRMSNorm with
 *    quantize = fp8, Fp8MatMul, RoPE, attention, Fp8MatMul, AddRMSNorm,
 *    Fp8MatMul, SwiGLU with quantize = fp8, Fp8MatMul).
 *  - any other row count (prefill): RMSNorm with quantize = fp8 (or
 *    Fp8MatMul's quantization of x) into the workspace, Fp8MatMul's GEMM
 *    (cuBLASLt, the scales in its epilogue) into the product in the dtype,
 *    then RoPE or SwiGLU (fusedmm_cuda.cu's kernels); the residual add in
 *    the GEMM's epilogue too (beta = 1) where cuBLASLt has that form,
 *    else a kernel after it (KILN_FMM_FP8_ADD=kernel: always). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fp8/fp8_quant.cuh"
#include "fusedmm_epilogue.cuh"
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"

#include <cuda_fp8.h>

namespace
{

constexpr int kWarps = 4;
constexpr int kUnroll = 2;

/* The 16 values of the norm's output h from element j on (x f, already
 * loaded, of dtype S; nf the norm weight's 16 values): RMSNorm's
 * operations and roundings (fusedmm.c's reference). */
template <int DT, int S> __device__ __forceinline__ void norm16(float *f, const float *nf, float inv)
{
#pragma unroll
    for (int e = 0; e < 16; e++)
        f[e] = kcu_round_float(DT, __fmul_rn(kcu_round_float(S, __fmul_rn(f[e], inv)), nf[e]));
}

/* The 16 values f times qinv as E4M3 values (exact floats): the
 * hardware's saturating round-to-nearest-even, Fp8MatMul's codes. */
__device__ __forceinline__ void quantize16(float *f, float qinv)
{
#pragma unroll
    for (int e = 0; e < 16; e += 2) {
        const __nv_fp8x2_storage_t q = __nv_cvt_float2_to_fp8x2(
            make_float2(__fmul_rn(f[e], qinv), __fmul_rn(f[e + 1], qinv)), __NV_SATFINITE, __NV_E4M3);
        __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(q, __NV_E4M3);
        const float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&hr));
        f[e] = v.x;
        f[e + 1] = v.y;
    }
}

/* x [M, k] (dtype S with the norm, else DT), w E4M3 [n, k] with scales sw
 * [n], nw [k] in DT (the norm), res and y [M, n] in S with the residual
 * epilogue (y [M, n / 2] in DT with SwiGLU, [M, n] in DT with RoPE, in ydt
 * without an epilogue). Each block computes R rows of y for the M rows of
 * x; its warps split k into quarters. k is a multiple of 16; x, w and nw
 * are 16-byte aligned; res and y may be one tensor (the residual stream
 * updated in place: each element is read and written by one thread). */
template <int DT, int S, int M, int R, int NORM, int EPI>
__global__ void __launch_bounds__(kWarps * 32)
    fmm8_gemv_kernel(const void *__restrict__ x, const uint8_t *__restrict__ w, const float *__restrict__ sw,
                     const void *__restrict__ nw, const void *res, void *y, int32_t n, int32_t k, float eps, int ydt,
                     float amax, const rope_arg<EPI> rope)
{
    KTL_SCOPE(0);
    constexpr int E = 16, STEP = 32 * E;
    constexpr int XS = NORM ? S : DT; /* x's dtype */
    constexpr bool PAIRS = EPI == KILN_FUSEDMM_ROPE || EPI == KILN_FUSEDMM_SWIGLU;
    constexpr int PER = PAIRS ? R / 2 : R; /* outputs a row of x in this block */
    __shared__ float part[kWarps][M][R];
    __shared__ float red[kWarps][M]; /* max |h| (or |x|) of each warp's share */
    __shared__ float sq[kWarps][M];  /* the norm's sums of squares */
    (void)sq;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t row0 = (int64_t)blockIdx.x * R;
    const int32_t kq = (k / E + kWarps - 1) / kWarps * E;
    const int32_t k0 = wid * kq, k1 = k0 + kq < k ? k0 + kq : k;
    /* rows past n read the last row: loaded, never stored */
    const uint8_t *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        wr[r] = w + (row0 + r < n ? row0 + r : n - 1) * (int64_t)k + k0 + lane * E;
    uint4 buf[kUnroll][R];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        const int32_t kk = k0 + u * STEP + lane * E;
#pragma unroll
        for (int r = 0; r < R; r++)
            buf[u][r] = kk < k1 ? kcu_load_stream(wr[r] + u * STEP) : make_uint4(0, 0, 0, 0);
    }
    /* this thread's output (a pair of W rows with RoPE and SwiGLU) and
     * its weight scales, before the wait: constants */
    const int em = threadIdx.x / PER, ep = threadIdx.x % PER;
    const int64_t erow = row0 + (PAIRS ? 2 * ep : ep);
    const bool eout = threadIdx.x < M * PER && erow < n && (!PAIRS || erow + 1 < n);
    const float esw0 = eout ? sw[erow] : 0.0f, esw1 = PAIRS && eout ? sw[erow + 1] : 0.0f;
    kcu_after_prior(x, res, n, k);

    /* the epilogue's operand, its round trip beside the products */
    float ev = 0.0f;
    if constexpr (EPI == KILN_FUSEDMM_RESIDUAL) {
        if (eout)
            ev = kcu_load_float(res, S, (int64_t)em * n + erow);
    } else if constexpr (EPI == KILN_FUSEDMM_ROPE) {
        if (threadIdx.x < M * PER)
            ev = (float)((const int32_t *)res)[em];
    }

    /* the norm's 1 / rms of each row over all of k (fusedmm.c's) */
    float inv[M];
#pragma unroll
    for (int m = 0; m < M; m++)
        inv[m] = 1.0f;
    if constexpr (NORM) {
#pragma unroll
        for (int m = 0; m < M; m++) {
            float ss = 0.0f;
#pragma unroll 4
            for (int32_t j = threadIdx.x * E; j < k; j += kWarps * 32 * E) {
                float f[E];
                fp8_load_x16<XS>(x, (int64_t)m * k + j, f);
#pragma unroll
                for (int e = 0; e < E; e++)
                    ss = __fadd_rn(ss, __fmul_rn(f[e], f[e]));
            }
            ss = kcu_warp_sum(ss);
            if (lane == 0)
                sq[wid][m] = ss;
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

    /* each row's max |h| (|x| without the norm), as Fp8MatMul takes it;
     * none with a static amax (the field x_amax, the same for every block) */
    const bool dyn = !(amax > 0.0f);
#pragma unroll
    for (int m = 0; m < M && dyn; m++) {
        float a = 0.0f;
#pragma unroll 4
        for (int32_t j = threadIdx.x * E; j < k; j += kWarps * 32 * E) {
            float f[E];
            fp8_load_x16<XS>(x, (int64_t)m * k + j, f);
            if constexpr (NORM) {
                float nf[E];
                fp8_load_x16<DT>(nw, j, nf);
                norm16<DT, S>(f, nf, inv[m]);
            }
#pragma unroll
            for (int e = 0; e < E; e++)
                a = fmaxf(a, fabsf(f[e]));
        }
        for (int o = 16; o > 0; o >>= 1)
            a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        if (lane == 0)
            red[wid][m] = a;
    }
    if (dyn)
        __syncthreads();
    float qinv[M];
#pragma unroll
    for (int m = 0; m < M; m++) {
        float a = amax;
        if (dyn) {
            a = red[0][m];
#pragma unroll
            for (int j = 1; j < kWarps; j++)
                a = fmaxf(a, red[j][m]);
        }
        qinv[m] = a > 0.0f ? __fdiv_rn(KILN_E4M3_MAX, a) : 0.0f;
    }

    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[m][r] = 0.0f;
    for (int32_t base = k0; base < k1; base += kUnroll * STEP) {
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int32_t kk = base + u * STEP + lane * E;
            if (kk < k1) {
                float nf[E];
                if constexpr (NORM)
                    fp8_load_x16<DT>(nw, kk, nf);
                if constexpr (M <= 2) {
                    /* x's E4M3 values first, shared by the R rows */
                    float xf[M][E];
#pragma unroll
                    for (int m = 0; m < M; m++) {
                        fp8_load_x16<XS>(x, (int64_t)m * k + kk, xf[m]);
                        if constexpr (NORM)
                            norm16<DT, S>(xf[m], nf, inv[m]);
                        quantize16(xf[m], qinv[m]);
                    }
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float wf[E];
                        fp8_unpack(buf[u][r], wf);
#pragma unroll
                        for (int m = 0; m < M; m++)
#pragma unroll
                            for (int e = 0; e < E; e++)
                                acc[m][r] = fmaf(xf[m][e], wf[e], acc[m][r]);
                    }
                } else {
                    /* more rows of x: the R weight vectors first, then
                     * one row of x at a time (registers) */
                    float wf[R][E];
#pragma unroll
                    for (int r = 0; r < R; r++)
                        fp8_unpack(buf[u][r], wf[r]);
#pragma unroll
                    for (int m = 0; m < M; m++) {
                        float xf[E];
                        fp8_load_x16<XS>(x, (int64_t)m * k + kk, xf);
                        if constexpr (NORM)
                            norm16<DT, S>(xf, nf, inv[m]);
                        quantize16(xf, qinv[m]);
#pragma unroll
                        for (int r = 0; r < R; r++)
#pragma unroll
                            for (int e = 0; e < E; e++)
                                acc[m][r] = fmaf(xf[e], wf[r][e], acc[m][r]);
                    }
                }
            }
            /* past k1 the slot keeps its old words: never used */
            if (kk + kUnroll * STEP < k1)
#pragma unroll
                for (int r = 0; r < R; r++)
                    buf[u][r] = kcu_load_stream(wr[r] + (u + kUnroll) * STEP);
        }
#pragma unroll
        for (int r = 0; r < R; r++)
            wr[r] += kUnroll * STEP;
    }
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            const float v = kcu_warp_sum(acc[m][r]);
            if (lane == 0)
                part[wid][m][r] = v;
        }
    __syncthreads();
    if (!eout)
        return;
    /* row em's x scale, max / 448, as Fp8MatMul's */
    float a = amax;
    if (dyn) {
        a = red[0][em];
#pragma unroll
        for (int j = 1; j < kWarps; j++)
            a = fmaxf(a, red[j][em]);
    }
    const float sx = __fdiv_rn(a, KILN_E4M3_MAX);
    const int c0 = PAIRS ? 2 * ep : ep;
    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
    for (int j = 0; j < kWarps; j++) {
        v0 += part[j][em][c0];
        if constexpr (PAIRS)
            v1 += part[j][em][c0 + 1];
    }
    /* the product as Fp8MatMul stores it: (Σ xq · wq) · sx · sw */
    const float p0 = __fmul_rn(__fmul_rn(v0, sx), esw0);
    if constexpr (EPI == KILN_FUSEDMM_ROPE) {
        const float p1 = __fmul_rn(__fmul_rn(v1, sx), esw1);
        rope_store<DT>(rope, ev, y, em, n, erow, kcu_round_float(DT, p0), kcu_round_float(DT, p1));
    } else if constexpr (EPI == KILN_FUSEDMM_SWIGLU) {
        const float p1 = __fmul_rn(__fmul_rn(v1, sx), esw1);
        kcu_store_float(y, DT, (int64_t)em * (n / 2) + erow / 2,
                        silu_times(DT, kcu_round_float(DT, p0), kcu_round_float(DT, p1)));
    } else if constexpr (EPI == KILN_FUSEDMM_RESIDUAL) {
        kcu_store_float(y, S, (int64_t)em * n + erow, __fadd_rn(kcu_round_float(DT, p0), ev));
    } else {
        kcu_store_float(y, ydt, (int64_t)em * n + erow, p0);
    }
}

/* 8 weight rows a block for one or two rows of x, 4 past that
 * (registers), as Fp8MatMul's GEMV. */
template <int DT, int S, int M, int NORM, int EPI>
cudaError_t gemv_launch(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    constexpr int R = M <= 2 ? 8 : 4;
    rope_arg<EPI> rope;
    const void *res = a->residual;
    if constexpr (EPI == KILN_FUSEDMM_ROPE) {
        rope = a->rope;
        res = a->positions;
    }
    const dim3 grid((unsigned)(((int64_t)a->n + R - 1) / R));
    return kcu_launch_cfg(fmm8_gemv_kernel<DT, S, M, R, NORM, EPI>, grid, dim3(kWarps * 32), s, a->x,
                          (const uint8_t *)a->w, a->w_scale, a->norm_weight, res, a->y, a->n, a->k, a->epsilon,
                          (int)a->y_dtype, a->x_amax, rope);
}

/* The four forms a decoder layer uses (the caller checked the form). */
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

/* y [count] in S = res in S + t in DT: the prefill path's residual add. */
template <int DT, int S>
__global__ void __launch_bounds__(256) fmm8_add_kernel(const void *t, const void *res, void *y, int64_t count)
{
    KTL_SCOPE(0);
    kcu_after_prior(t, y, count, DT);
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < count; i += (int64_t)gridDim.x * 256)
        kcu_store_float(y, S, i, __fadd_rn(kcu_load_float(t, DT, i), kcu_load_float(res, S, i)));
}

/* KILN_FMM_FP8_ADD=kernel keeps the residual add of the GEMM path in a
 * kernel of its own (to time both, and for the op tests); read at each
 * launch (a graph keeps its capture's). */
bool fp8_add_in_gemm(void)
{
    const char *e = getenv("KILN_FMM_FP8_ADD");
    return !(e && strcmp(e, "kernel") == 0);
}

/* Any row count: x quantized into the workspace (by the norm, or as
 * Fp8MatMul quantizes it), Fp8MatMul's product, then the epilogue. */
template <int DT> int gemm_path(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    const size_t es = DT == KILN_DTYPE_F32 ? 4 : 2;
    char *ws = (char *)a->workspace;
    uint8_t *q = (uint8_t *)(ws + kiln_fusedmm_fp8_workspace_codes(a->rows, a->n, a->k, es));
    float *sx = (float *)(ws + kiln_fusedmm_fp8_workspace_scales(a->rows, a->n, a->k, es));
    void *fws = ws + kiln_fusedmm_fp8_workspace_matmul(a->rows, a->n, a->k, es);
    int e = a->norm_weight ? kiln_rmsnorm_cuda(a->x, NULL, a->norm_weight, NULL, ws, a->x_dtype, DT, DT, DT, a->rows,
                                               a->k, a->epsilon, q, sx, a->x_amax, s)
                           : kiln_fp8_quantize_cuda(a->x, a->x_dtype, q, sx, a->rows, a->k, a->x_amax, s);
    if (e)
        return e;
    /* the residual add in the GEMM's epilogue (beta = 1; the product not
     * rounded to DT before the add, as in the GEMM path over weights in
     * the dtype) where cuBLASLt has that form, else a kernel after it */
    if (a->epilogue == KILN_FUSEDMM_RESIDUAL && fp8_add_in_gemm()) {
        e = kiln_fp8_matmul_q8_add_cuda(q, sx, a->w, a->w_scale, a->residual, a->y, a->y_dtype, a->rows, a->n, a->k,
                                        fws, kiln_fp8_workspace(a->rows, a->n, a->k), s);
        if (e != KILN_FP8_NO_ADD)
            return e;
    }
    /* the product straight into y without an epilogue (in y's dtype) */
    const int direct = a->epilogue == KILN_FUSEDMM_NONE;
    void *t = direct ? a->y : ws + kiln_fusedmm_workspace_t(a->rows, a->k);
    e = kiln_fp8_matmul_q8_cuda(q, sx, a->w, a->w_scale, t, direct ? a->y_dtype : DT, a->rows, a->n, a->k, fws,
                                kiln_fp8_workspace(a->rows, a->n, a->k), s);
    if (e || direct)
        return e;
    if (a->epilogue != KILN_FUSEDMM_RESIDUAL)
        return fmm_epilogue_launch(a, t, s);
    const int64_t count = a->rows * a->n, blocks = (count + 255) / 256;
    const dim3 grid((unsigned)(blocks < 132 * 16 ? blocks : 132 * 16));
    if (a->y_dtype == KILN_DTYPE_F32 && DT != KILN_DTYPE_F32)
        return (int)kcu_launch_cfg(fmm8_add_kernel<DT, KILN_DTYPE_F32>, grid, dim3(256), s, (const void *)t,
                                   a->residual, a->y, count);
    return (int)kcu_launch_cfg(fmm8_add_kernel<DT, DT>, grid, dim3(256), s, (const void *)t, a->residual, a->y, count);
}

} /* namespace */

int fmm_fp8_cuda(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    const uintptr_t addr = (uintptr_t)a->x | (uintptr_t)a->w | (uintptr_t)a->norm_weight;
    /* the GEMV's forms: the norm before no epilogue, SwiGLU or RoPE; the
     * residual add without it */
    const int form = a->epilogue == KILN_FUSEDMM_RESIDUAL ? !a->norm_weight : a->norm_weight != NULL;
    /* the stream's dtype: x's with the norm, y's with the residual add */
    const int32_t stream_dt = a->norm_weight ? a->x_dtype : a->y_dtype;
    if (form && (a->rows == 1 || a->rows == 2 || a->rows == 4 || a->rows == 8) && a->k % 16 == 0 && addr % 16 == 0 &&
        (a->dtype == KILN_DTYPE_BF16 || a->dtype == KILN_DTYPE_F16) &&
        (stream_dt == a->dtype || stream_dt == KILN_DTYPE_F32)) {
        const bool f32 = stream_dt == KILN_DTYPE_F32;
        if (a->dtype == KILN_DTYPE_BF16)
            return (int)(f32 ? gemv_rows<KILN_DTYPE_BF16, KILN_DTYPE_F32>(a, s)
                             : gemv_rows<KILN_DTYPE_BF16, KILN_DTYPE_BF16>(a, s));
        return (int)(f32 ? gemv_rows<KILN_DTYPE_F16, KILN_DTYPE_F32>(a, s)
                         : gemv_rows<KILN_DTYPE_F16, KILN_DTYPE_F16>(a, s));
    }
    int e = kiln_fp8_cuda_init();
    if (e)
        return e;
    const size_t es = a->dtype == KILN_DTYPE_F32 ? 4 : 2;
    if (!a->workspace || a->workspace_size < kiln_fusedmm_fp8_workspace(a->rows, a->n, a->k, es))
        return (int)cudaErrorInvalidValue;
    switch (a->dtype) {
    case KILN_DTYPE_F16: return gemm_path<KILN_DTYPE_F16>(a, s);
    case KILN_DTYPE_BF16: return gemm_path<KILN_DTYPE_BF16>(a, s);
    default: return gemm_path<KILN_DTYPE_F32>(a, s);
    }
}
