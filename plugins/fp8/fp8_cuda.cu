/* Fp8MatMul on CUDA (the semantics are fp8.c's):
 *  1. each row of x is quantized to E4M3 with its dynamic scale, one block
 *     a row (max |x| by a block reduction, then the same f32 operations as
 *     the CPU);
 *  2. up to KILN_FP8_GEMV_MAX_ROWS rows (decode): by default one kernel
 *     that does step 1 itself (fp8_gemv_kernel's FUSED); else a GEMV over the E4M3
 *     weights built like the bf16 one (src/backend/cuda/gemv.cu): 16-byte
 *     loads, split-K over warps, the first weight loads before the PDL
 *     wait; E4M3 pairs become floats through the hardware's fp8x2 → f16x2
 *     conversion, exact, and are summed in f32;
 *  3. more rows (prefill, batched decode): cuBLASLt's FP8 GEMM, W as the
 *     transposed first operand (the TN layout Hopper's FP8 kernels take),
 *     f32 accumulation, the per-channel and per-token scales applied by
 *     cuBLASLt's epilogue (outer-vector scaling: element (i, j) of the
 *     product times W's scale i and x's scale j) and y written in its
 *     dtype. Where that form has no kernel (cuBLASLt before 12.9), or with
 *     KILN_FP8_GEMM=f32, the product goes to an f32 result in the
 *     workspace and one more kernel scales and rounds it: 8 bytes more an
 *     element of y through memory (at 1,024 rows of the 8B's layers about
 *     a third of the GEMMs' own time). Where cuBLASLt offers no kernel at
 *     all (n not a multiple of 4), the GEMV runs over groups of rows. */
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"
#include "core/fp8.h"
#include "fp8_quant.cuh"

#include <cublasLt.h>
#include <cuda_fp8.h>

namespace
{

constexpr int kWarps = 4;
constexpr int kUnroll = 2;

cublasLtHandle_t fp8_lt;
int fp8_lt_status = -1;
std::once_flag fp8_lt_once;

/* 1. quantization ------------------------------------------------------------------------- */

template <int XT>
__global__ void __launch_bounds__(256) fp8_quantize_kernel(const void *x, uint8_t *xq, float *sx, int32_t k, float amax)
{
    KTL_SCOPE(0);
    kcu_after_prior(x, xq, k, 0);
    const int64_t r = blockIdx.x;
    float a = 0.0f;
    for (int32_t i = threadIdx.x; i < k; i += 256)
        a = fmaxf(a, fabsf(kcu_load_float(x, XT, r * k + i)));
    const float inv = fp8_row_scale(a, amax, sx + r);
    for (int32_t i = threadIdx.x; i < k; i += 256)
        xq[r * k + i] = kiln_f32_to_e4m3(__fmul_rn(kcu_load_float(x, XT, r * k + i), inv));
}

/* 2. GEMV ----------------------------------------------------------------------------------- */

/* fp8_quantize_kernel in 16-byte pieces (x 16-byte aligned; k is a multiple of 16):
 * a thread holds up to V pieces of 16 elements in registers, so x is read
 * once, and writes each piece's 16 codes in one store. The conversion is
 * the hardware's saturating round-to-nearest-even (fp8_gemv_kernel's, the
 * same codes as kiln_f32_to_e4m3 for every value of |x| · 448 / max |x|).
 * The scalar kernel above, one element a load, ran at about a quarter of
 * the memory's bandwidth at 1,024 rows (ncu: 14 us at k = 4,096, 42 us at
 * 14,336), a tenth of an 8B FP8 decode step at that batch. */
template <int XT, int V>
__global__ void __launch_bounds__(256)
    fp8_quantize_vec_kernel(const void *x, uint8_t *xq, float *sx, int32_t k, float amax)
{
    KTL_SCOPE(0);
    kcu_after_prior(x, xq, k, 0);
    const int64_t r = blockIdx.x;
    const int32_t pieces = k / 16;
    float f[V][16];
    float a = 0.0f;
#pragma unroll
    for (int v = 0; v < V; v++) {
        if ((int32_t)threadIdx.x + v * 256 < pieces) {
            fp8_load_x16<XT>(x, r * k + ((int64_t)threadIdx.x + v * 256) * 16, f[v]);
#pragma unroll
            for (int e = 0; e < 16; e++)
                a = fmaxf(a, fabsf(f[v][e]));
        }
    }
    const float inv = fp8_row_scale(a, amax, sx + r);
#pragma unroll
    for (int v = 0; v < V; v++) {
        if ((int32_t)threadIdx.x + v * 256 < pieces) {
            *reinterpret_cast<uint4 *>(xq + r * k + ((int64_t)threadIdx.x + v * 256) * 16) = make_uint4(
                fp8_pack4(f[v], inv), fp8_pack4(f[v] + 4, inv), fp8_pack4(f[v] + 8, inv), fp8_pack4(f[v] + 12, inv));
        }
    }
}

/* KILN_FP8_QUANT=scalar keeps fp8_quantize_kernel for every k, to time
 * both; read at each launch (a graph keeps its capture's). */
bool fp8_quantize_scalar(void)
{
    const char *e = getenv("KILN_FP8_QUANT");
    return e && strcmp(e, "scalar") == 0;
}

/* Quantizes x's rows into xq and sx: the 16-byte kernel where x is aligned
 * and a row fits in its registers (k <= 32,768), else the scalar one.
 * amax > 0: a static max |x| for every row (Fp8MatMul's x_amax). */
template <int XT>
cudaError_t fp8_quantize(const void *x, uint8_t *xq, float *sx, int64_t rows, int32_t k, float amax, cudaStream_t s)
{
    const dim3 grid((unsigned)rows), block(256);
    const int32_t per = (k / 16 + 255) / 256; /* pieces a thread */
    if ((uintptr_t)x % 16 != 0 || (uintptr_t)xq % 16 != 0 || k % 16 != 0 || per > 8 || fp8_quantize_scalar())
        return kcu_launch_cfg(fp8_quantize_kernel<XT>, grid, block, s, x, xq, sx, k, amax);
    if (per <= 1)
        return kcu_launch_cfg(fp8_quantize_vec_kernel<XT, 1>, grid, block, s, x, xq, sx, k, amax);
    if (per <= 2)
        return kcu_launch_cfg(fp8_quantize_vec_kernel<XT, 2>, grid, block, s, x, xq, sx, k, amax);
    if (per <= 4)
        return kcu_launch_cfg(fp8_quantize_vec_kernel<XT, 4>, grid, block, s, x, xq, sx, k, amax);
    return kcu_launch_cfg(fp8_quantize_vec_kernel<XT, 8>, grid, block, s, x, xq, sx, k, amax);
}

/* The decode GEMV: m (<= M) rows of x against R weight rows a block, y =
 * Σ xq · wq · sx · sw. With FUSED (the default for decode rows) x is the
 * layer's input and the kernel quantizes it itself: one kernel instead of
 * fp8_quantize_kernel then this one, whose separate launch and small
 * blocks held the 8B's FP8 decode to about half its floor. Each block then
 * takes each row's max |x| over all of k (x is in L1/L2, the weights
 * already requested before the PDL wait) and rounds x times 448 / max to
 * E4M3 as it multiplies — the CPU's f32 operations (fp8.c), the rounding
 * by the hardware's saturating round-to-nearest-even conversion — shared
 * by the R rows. Without FUSED x holds fp8_quantize_kernel's codes and sx
 * its scales. */
template <int XT, int M, int R, bool FUSED>
__global__ void __launch_bounds__(kWarps * 32)
    fp8_gemv_kernel(const void *__restrict__ x, const float *__restrict__ sx_in, const uint8_t *__restrict__ w,
                    const float *__restrict__ sw, void *__restrict__ y, int32_t m, int32_t n, int32_t k, float amax)
{
    KTL_SCOPE(0);
    constexpr int E = 16, STEP = 32 * E;
    /* FUSED with a static amax (Fp8MatMul's x_amax) takes no max |x| pass:
     * the products start right after the wait */
    const bool dyn = FUSED && !(amax > 0.0f);
    __shared__ float part[kWarps][M][R];
    __shared__ float red[kWarps][M];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    /* the block's warps share its R rows, each a quarter of k (one or two
     * warps a group of 8 rows, each more of k, measured slower on the H200:
     * 0.744 / 0.739 of copy at 28672x4096 against 0.786, 0.558 / 0.402 at
     * 4096x14336 against 0.602) */
    const int64_t row0 = (int64_t)blockIdx.x * R;
    /* 32-bit k offsets (k is an int32): one compare a bound check */
    const int32_t kq = (k / E + kWarps - 1) / kWarps * E;
    const int32_t k0 = wid * kq, k1 = k0 + kq < k ? k0 + kq : k;
    /* each row's pointer to this lane's next group of kUnroll loads: the
     * loads take it plus a constant offset (no address arithmetic a load) */
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
    /* this thread's element of y (one a thread at most) and its weight
     * scale, loaded before the wait: an engine constant, so it need not
     * wait for the previous kernel, and its L2 round trip no longer ends
     * every block (H200, 8B FP8 decode 357.3 tok/s against 352.3 with the
     * load in the epilogue) */
    static_assert(M * R <= kWarps * 32, "one element of y a thread");
    const int ei = threadIdx.x / R, er = threadIdx.x % R;
    const int64_t erow = row0 + er;
    const bool eout = threadIdx.x < M * R && erow < n;
    const float esw = eout ? sw[erow] : 0.0f;
    kcu_after_prior(x, y, k, n);

    /* each row's scale, as fp8_quantize_kernel computes it */
    float inv[M], sx[M];
#pragma unroll
    for (int i = 0; i < M; i++) {
        float a = 0.0f;
        if (dyn && i < m) {
            /* 16 elements a thread a pass (k is a multiple of 16): at k =
             * 14,336 seven 16-byte loads in flight where one element a
             * load took 112 in a chain, all of it between the PDL wait
             * and the first product (+4% on the 28672x4096 GEMV, +6% on
             * 4096x14336, +4% on 1B and 8B FP8 decode) */
#pragma unroll 4
            for (int64_t j = (int64_t)threadIdx.x * E; j < k; j += kWarps * 32 * E) {
                float f[E];
                fp8_load_x16<XT>(x, (int64_t)i * k + j, f);
#pragma unroll
                for (int e = 0; e < E; e++)
                    a = fmaxf(a, fabsf(f[e]));
            }
        }
        for (int o = 16; dyn && o > 0; o >>= 1)
            a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        if (dyn && lane == 0)
            red[wid][i] = a;
    }
    if (dyn)
        __syncthreads();
#pragma unroll
    for (int i = 0; i < M; i++) {
        if (!FUSED) {
            inv[i] = 0.0f;
            sx[i] = i < m ? sx_in[i] : 0.0f;
            continue;
        }
        float a = amax;
        if (dyn) {
            a = red[0][i];
#pragma unroll
            for (int j = 1; j < kWarps; j++)
                a = fmaxf(a, red[j][i]);
        }
        inv[i] = a > 0.0f ? __fdiv_rn(KILN_E4M3_MAX, a) : 0.0f;
        sx[i] = __fdiv_rn(a, KILN_E4M3_MAX);
    }

    float acc[M][R];
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[i][r] = 0.0f;
    for (int32_t base = k0; base < k1; base += kUnroll * STEP) {
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int32_t kk = base + u * STEP + lane * E;
            if (kk < k1) {
                /* x's E4M3 values (exact floats), shared by the R rows */
                float xf[M][E];
#pragma unroll
                for (int i = 0; i < M; i++) {
                    if (i >= m)
                        continue;
                    if (!FUSED) {
                        fp8_unpack(__ldg(reinterpret_cast<const uint4 *>((const uint8_t *)x + (int64_t)i * k + kk)),
                                   xf[i]);
                        continue;
                    }
                    fp8_load_x16<XT>(x, (int64_t)i * k + kk, xf[i]);
#pragma unroll
                    for (int e = 0; e < E; e += 2) {
                        const __nv_fp8x2_storage_t q = __nv_cvt_float2_to_fp8x2(
                            make_float2(__fmul_rn(xf[i][e], inv[i]), __fmul_rn(xf[i][e + 1], inv[i])), __NV_SATFINITE,
                            __NV_E4M3);
                        __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(q, __NV_E4M3);
                        const float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&hr));
                        xf[i][e] = v.x;
                        xf[i][e + 1] = v.y;
                    }
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float wf[E];
                    fp8_unpack(buf[u][r], wf);
#pragma unroll
                    for (int i = 0; i < M; i++)
                        if (i < m)
#pragma unroll
                            for (int e = 0; e < E; e++)
                                acc[i][r] = fmaf(xf[i][e], wf[e], acc[i][r]);
                }
            }
            /* past k1 the slot keeps its old words: the product above skips
             * them (no zeroing: 4 moves a row and load fewer) */
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
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v = kcu_warp_sum(acc[i][r]);
            if (lane == 0)
                part[wid][i][r] = v;
        }
    __syncthreads();
    if (eout && ei < m) {
        float v = 0.0f;
#pragma unroll
        for (int j = 0; j < kWarps; j++)
            v += part[j][ei][er];
        kcu_store_float(y, XT, (int64_t)ei * n + erow, __fmul_rn(__fmul_rn(v, sx[ei]), esw));
    }
}

/* m (1..KILN_FP8_GEMV_MAX_ROWS) rows of x through fp8_gemv_kernel: 8
 * weight rows a block for one or two rows of x, 4 past that (registers).
 * FUSED: x is the layer's input, quantized by the kernel; else x holds
 * E4M3 codes and sx their scales. */
template <int XT, bool FUSED>
cudaError_t fp8_gemv(const void *x, const float *sx, const uint8_t *w, const float *sw, void *y, int32_t m, int32_t n,
                     int32_t k, float amax, cudaStream_t s)
{
    auto launch = [&](auto kernel, int rows_a_block) {
        return kcu_launch_cfg(kernel, dim3((unsigned)(((int64_t)n + rows_a_block - 1) / rows_a_block)),
                              dim3(kWarps * 32), s, x, sx, w, sw, y, m, n, k, amax);
    };
    return m == 1   ? launch(fp8_gemv_kernel<XT, 1, 8, FUSED>, 8)
           : m == 2 ? launch(fp8_gemv_kernel<XT, 2, 8, FUSED>, 8)
           : m <= 4 ? launch(fp8_gemv_kernel<XT, 4, 4, FUSED>, 4)
                    : launch(fp8_gemv_kernel<XT, 8, 4, FUSED>, 4);
}

/* KILN_FP8_GEMV=split keeps the decode path of two kernels (quantize, then
 * GEMV) to time both; read at each launch (a graph keeps its capture's). */
bool fp8_use_fused(void)
{
    const char *e = getenv("KILN_FP8_GEMV");
    return !(e && strcmp(e, "split") == 0);
}

/* Rows [0, rows) in groups of up to 8 through the GEMV; y's rows are n
 * elements of XT apart. */
template <int XT>
cudaError_t fp8_gemv_rows(const uint8_t *xq, const float *sx, const uint8_t *w, const float *sw, void *y, int64_t rows,
                          int32_t n, int32_t k, cudaStream_t s)
{
    const size_t es = XT == KILN_DTYPE_F32 ? 4 : 2;
    for (int64_t r0 = 0; r0 < rows; r0 += KILN_FP8_GEMV_MAX_ROWS) {
        const int32_t m = (int32_t)(rows - r0 < KILN_FP8_GEMV_MAX_ROWS ? rows - r0 : KILN_FP8_GEMV_MAX_ROWS);
        const uint8_t *xr = xq + r0 * k;
        void *yr = (char *)y + (size_t)(r0 * n) * es;
        cudaError_t e = fp8_gemv<XT, false>(xr, sx + r0, w, sw, yr, m, n, k, 0.0f, s);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

/* 3. GEMM epilogue ----------------------------------------------------------------------- */

template <int XT>
__global__ void __launch_bounds__(256)
    fp8_scale_kernel(const float *d, const float *sx, const float *sw, void *y, int64_t rows, int32_t n)
{
    KTL_SCOPE(0);
    kcu_after_prior(d, y, rows, n);
    const int64_t total = rows * n;
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < total; i += (int64_t)gridDim.x * 256)
        kcu_store_float(y, XT, i, __fmul_rn(__fmul_rn(d[i], sx[i / n]), sw[i % n]));
}

/* KILN_FP8_GEMM=f32 keeps the f32 result and the scale kernel past the
 * GEMV's rows, to time both; read at each launch (a graph keeps its
 * capture's). */
bool fp8_use_vec(void)
{
    const char *e = getenv("KILN_FP8_GEMM");
    return !(e && strcmp(e, "f32") == 0);
}

/* KILN_FP8_GEMM_PIECES=0 runs the GEMM of a wide weight over all rows at
 * once instead of in pieces of 2,048; read at each launch. */
bool fp8_use_pieces(void)
{
    const char *e = getenv("KILN_FP8_GEMM_PIECES");
    return !(e && strcmp(e, "0") == 0);
}

/* KILN_FP8_FAST_ACCUM=1 lets cuBLASLt's FP8 GEMM accumulate in the tensor
 * cores' own precision instead of promoting partial sums to f32 every few
 * k-steps (CUBLASLT_MATMUL_DESC_FAST_ACCUM; Transformer Engine's forward
 * GEMMs run so): faster, with an error of about 1e-3 of the sum at k in
 * the thousands. On an H100 the calibrated 8B prefill of 2,048 tokens
 * went from 57,100 to 61,400-62,000 tok/s with it (bench/README.md,
 * thirtieth session); opt-in while no quality row on a real model says
 * what it costs; read at each launch. */
bool fp8_fast_accum(void)
{
    const char *e = getenv("KILN_FP8_FAST_ACCUM");
    return e && strcmp(e, "1") == 0;
}

cudaDataType_t fp8_cuda_type(int xt)
{
    return xt == KILN_DTYPE_BF16 ? CUDA_R_16BF : xt == KILN_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* The algorithm cuBLASLt's heuristic gives the GEMM of one shape and
 * form, kept so that eager prefill steps (dozens of these GEMMs a step,
 * rows varying with the batch) ask it once per shape rather than at
 * every launch. found < 0: the heuristic offered none (remembered too).
 * Full: the heuristic runs again for shapes not in it. */
struct fp8_plan {
    int64_t rows;
    int32_t n, k, dtype, device, found;
    cublasLtMatmulAlgo_t algo;
};
constexpr int kPlans = 512;
fp8_plan fp8_plans[kPlans];
int fp8_n_plans;
std::mutex fp8_plans_lock;

/* cuBLASLt: y [rows, n] (row-major, `dt`) = Xq · Wᵀ, computed column-major
 * as yᵀ [n, rows] = op(W)ᵀ · Xqᵀ with W [k, n] column-major transposed (the
 * TN layout Hopper's FP8 kernels take). With sx and sw y is diag(sx) · Xq
 * · Wᵀ · diag(sw): W's scales are the outer vector of op(A)'s n rows, x's
 * of B's `rows` columns (cuBLASLt 12.9's outer-vector scaling); without
 * them (the f32 result) it is the plain product. With c non-NULL (of y's
 * type and layout) y = c + that, added by cuBLASLt's epilogue (beta = 1:
 * a residual add). Returns a cuBLAS status (0: launched), or -1 when
 * cuBLASLt has no kernel of this form. */
int fp8_lt_matmul(const uint8_t *xq, const uint8_t *w, const float *sx, const float *sw, const void *c, void *y,
                  cudaDataType_t dt, int64_t rows, int32_t n, int32_t k, void *lt_ws, cudaStream_t s)
{
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
    const cublasOperation_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    const int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    const size_t ws = KILN_FP8_LT_WORKSPACE;
    const bool scaled = sx && sw;
    cublasStatus_t st = cublasLtMatmulDescInit(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (st == CUBLAS_STATUS_SUCCESS && scaled)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof vec);
    if (st == CUBLAS_STATUS_SUCCESS && scaled)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec);
    if (st == CUBLAS_STATUS_SUCCESS && scaled)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw);
    if (st == CUBLAS_STATUS_SUCCESS && scaled)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx);
    const int8_t fast = fp8_fast_accum() ? 1 : 0;
    if (st == CUBLAS_STATUS_SUCCESS && fast)
        st = cublasLtMatmulDescSetAttribute(&desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&la, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, k);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&lb, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)rows, k);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatrixLayoutInit(&lc, dt, (uint64_t)n, (uint64_t)rows, n);
    if (st != CUBLAS_STATUS_SUCCESS)
        return scaled && st == CUBLAS_STATUS_INVALID_VALUE ? -1 : (int)st; /* a cuBLASLt without the attribute */
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess)
        return -1;
    /* the plain product's plans are told apart by a negative dtype, the
     * fast accumulation's and the residual add's by bits above the dtypes */
    const int32_t form = (scaled ? (int32_t)dt : -1 - (int32_t)dt) ^ (fast ? 1 << 20 : 0) ^ (c ? 1 << 21 : 0);
    fp8_plan plan = {rows, n, k, form, device, 0, {}};
    {
        std::lock_guard<std::mutex> g(fp8_plans_lock);
        for (int i = 0; i < fp8_n_plans && !plan.found; i++) {
            const fp8_plan &c = fp8_plans[i];
            if (c.rows == rows && c.n == n && c.k == k && c.dtype == form && c.device == device)
                plan = c;
        }
    }
    if (!plan.found) {
        cublasLtMatmulPreferenceOpaque_t pref;
        cublasLtMatmulHeuristicResult_t algo;
        int found = 0;
        st = cublasLtMatmulPreferenceInit(&pref);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        if (st != CUBLAS_STATUS_SUCCESS)
            return (int)st;
        st = cublasLtMatmulAlgoGetHeuristic(fp8_lt, &desc, &la, &lb, &lc, &lc, &pref, 1, &algo, &found);
        plan.found = st == CUBLAS_STATUS_SUCCESS && found >= 1 ? 1 : -1;
        if (plan.found > 0)
            plan.algo = algo.algo;
        std::lock_guard<std::mutex> g(fp8_plans_lock);
        if (fp8_n_plans < kPlans)
            fp8_plans[fp8_n_plans++] = plan;
    }
    if (plan.found < 0)
        return -1;
    const float one = 1.0f, beta = c ? 1.0f : 0.0f;
    return (int)cublasLtMatmul(fp8_lt, &desc, &one, w, &la, xq, &lb, &beta, c ? c : y, &lc, y, &lc, &plan.algo, lt_ws,
                               ws, s);
}

/* y = the product of x's E4M3 rows xq (scales sx) and W: cuBLASLt's GEMM
 * past the GEMV's rows (with its scaling epilogue, else the f32 result and
 * fp8_scale_kernel), the GEMV for the rest. */
template <int XT>
int fp8_run_q8(const uint8_t *xq, const float *sx, const uint8_t *w, const float *sw, void *y, int64_t rows, int32_t n,
               int32_t k, char *ws, cudaStream_t s)
{
    if (rows > KILN_FP8_GEMV_MAX_ROWS && n % 4 == 0 && fp8_use_vec()) {
        void *lt_ws = ws + kiln_fp8_workspace_result(rows, k);
        /* wide weights in pieces of 2,048 rows: cuBLASLt's one algorithm
         * for them runs 6-8% slower past 2,048 rows (H200, 28672x4096: 1,374
         * TFLOP/s at 2,048 rows, 1,295 at 4,096, 1,267 at 8,192; the
         * narrower 8B shapes hold or gain: bench/README.md, twenty-fourth
         * session); KILN_FP8_GEMM_PIECES=0 runs them whole */
        const int64_t piece = n >= 16384 && fp8_use_pieces() ? 2048 : rows;
        const size_t ys = (size_t)n * (XT == KILN_DTYPE_F32 ? 4 : 2);
        int st = 0;
        for (int64_t r = 0; r < rows && st == 0; r += piece)
            st = fp8_lt_matmul(xq + r * k, w, sx + r, sw, NULL, (char *)y + (size_t)r * ys, fp8_cuda_type(XT),
                               rows - r < piece ? rows - r : piece, n, k, lt_ws, s);
        if (st >= 0)
            return st ? 10000 + st : 0;
        /* -1: no kernel of that form here (the first piece: nothing ran):
         * the f32 result and fp8_scale_kernel */
    }
    if (rows > KILN_FP8_GEMV_MAX_ROWS && n % 4 == 0) {
        float *d = (float *)(ws + kiln_fp8_workspace_result(rows, k));
        void *lt_ws = (char *)d + kiln_fp8_align((size_t)(rows * n) * sizeof(float));
        int st = fp8_lt_matmul(xq, w, NULL, NULL, NULL, d, CUDA_R_32F, rows, n, k, lt_ws, s);
        if (st > 0)
            return 10000 + st;
        if (st == 0) {
            const int64_t blocks = (rows * n + 255) / 256;
            return (int)kcu_launch_cfg(fp8_scale_kernel<XT>, dim3((unsigned)(blocks < 65535 ? blocks : 65535)),
                                       dim3(256), s, (const float *)d, (const float *)sx, sw, y, rows, n);
        }
    }
    return (int)fp8_gemv_rows<XT>(xq, sx, w, sw, y, rows, n, k, s);
}

template <int XT>
int fp8_run(const void *x, const uint8_t *w, const float *sw, void *y, int64_t rows, int32_t n, int32_t k, float amax,
            char *ws, cudaStream_t s)
{
    if (rows <= KILN_FP8_GEMV_MAX_ROWS && (uintptr_t)x % 16 == 0 && fp8_use_fused())
        return (int)fp8_gemv<XT, true>(x, NULL, w, sw, y, (int32_t)rows, n, k, amax, s);
    uint8_t *xq = (uint8_t *)ws;
    float *sx = (float *)(ws + kiln_fp8_workspace_scales(rows, k));
    cudaError_t e = fp8_quantize<XT>(x, xq, sx, rows, k, amax, s);
    return e != cudaSuccess ? (int)e : fp8_run_q8<XT>(xq, sx, w, sw, y, rows, n, k, ws, s);
}

} /* namespace */

extern "C" int kiln_fp8_cuda_init(void)
{
    std::call_once(fp8_lt_once, [] { fp8_lt_status = (int)cublasLtCreate(&fp8_lt); });
    return fp8_lt_status == 0 ? 0 : 10000 + fp8_lt_status;
}

/* The entry points' common part: -1 when there is nothing to do, else 0
 * to go on or the error. `bases`: the pointers the GEMV loads 16 bytes at
 * a time from, or-ed (k is a multiple of 16, so only the bases matter). */
static int fp8_entry(int64_t rows, int32_t n, int32_t k, const void *workspace, size_t workspace_size, uintptr_t bases)
{
    if (rows <= 0 || n <= 0)
        return -1;
    int e = kiln_fp8_cuda_init();
    if (e)
        return e;
    if (!workspace || workspace_size < kiln_fp8_workspace(rows, n, k) || bases % 16 || rows > INT32_MAX)
        return (int)cudaErrorInvalidValue;
    return 0;
}

extern "C" int kiln_fp8_matmul_cuda(const void *x, const void *w, const void *w_scale, void *y, int32_t dtype,
                                    int64_t rows, int32_t n, int32_t k, float amax, void *workspace,
                                    size_t workspace_size, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const int e = fp8_entry(rows, n, k, workspace, workspace_size, (uintptr_t)w);
    if (e)
        return e < 0 ? 0 : e;
    const uint8_t *wb = (const uint8_t *)w;
    const float *sw = (const float *)w_scale;
    char *ws = (char *)workspace;
    switch (dtype) {
    case KILN_DTYPE_F16: return fp8_run<KILN_DTYPE_F16>(x, wb, sw, y, rows, n, k, amax, ws, s);
    case KILN_DTYPE_BF16: return fp8_run<KILN_DTYPE_BF16>(x, wb, sw, y, rows, n, k, amax, ws, s);
    default: return fp8_run<KILN_DTYPE_F32>(x, wb, sw, y, rows, n, k, amax, ws, s);
    }
}

extern "C" int kiln_fp8_matmul_q8_cuda(const void *xq, const void *x_scale, const void *w, const void *w_scale, void *y,
                                       int32_t y_dtype, int64_t rows, int32_t n, int32_t k, void *workspace,
                                       size_t workspace_size, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const int e = fp8_entry(rows, n, k, workspace, workspace_size, (uintptr_t)w | (uintptr_t)xq);
    if (e)
        return e < 0 ? 0 : e;
    const uint8_t *xb = (const uint8_t *)xq, *wb = (const uint8_t *)w;
    const float *sx = (const float *)x_scale, *sw = (const float *)w_scale;
    char *ws = (char *)workspace;
    switch (y_dtype) {
    case KILN_DTYPE_F16: return fp8_run_q8<KILN_DTYPE_F16>(xb, sx, wb, sw, y, rows, n, k, ws, s);
    case KILN_DTYPE_BF16: return fp8_run_q8<KILN_DTYPE_BF16>(xb, sx, wb, sw, y, rows, n, k, ws, s);
    default: return fp8_run_q8<KILN_DTYPE_F32>(xb, sx, wb, sw, y, rows, n, k, ws, s);
    }
}

extern "C" int kiln_fp8_matmul_q8_add_cuda(const void *xq, const void *x_scale, const void *w, const void *w_scale,
                                           const void *residual, void *y, int32_t y_dtype, int64_t rows, int32_t n,
                                           int32_t k, void *workspace, size_t workspace_size, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    const int e = fp8_entry(rows, n, k, workspace, workspace_size, (uintptr_t)w | (uintptr_t)xq);
    if (e)
        return e < 0 ? 0 : e;
    if (rows <= KILN_FP8_GEMV_MAX_ROWS || n % 4 != 0 || !fp8_use_vec())
        return KILN_FP8_NO_ADD;
    /* one GEMM over all rows: the residual's pieces would need their own
     * plans, and the adds are narrow (n below 16,384) in a decoder layer */
    const size_t ws_at = kiln_fp8_workspace_result(rows, k);
    const int st =
        fp8_lt_matmul((const uint8_t *)xq, (const uint8_t *)w, (const float *)x_scale, (const float *)w_scale, residual,
                      y, fp8_cuda_type(y_dtype), rows, n, k, (char *)workspace + ws_at, s);
    return st < 0 ? KILN_FP8_NO_ADD : st ? 10000 + st : 0;
}

extern "C" int kiln_fp8_quantize_cuda(const void *x, int32_t dtype, uint8_t *q, float *scale, int64_t rows, int32_t k,
                                      float amax, void *stream)
{
    if (rows <= 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    switch (dtype) {
    case KILN_DTYPE_F16: return (int)fp8_quantize<KILN_DTYPE_F16>(x, q, scale, rows, k, amax, s);
    case KILN_DTYPE_BF16: return (int)fp8_quantize<KILN_DTYPE_BF16>(x, q, scale, rows, k, amax, s);
    default: return (int)fp8_quantize<KILN_DTYPE_F32>(x, q, scale, rows, k, amax, s);
    }
}

extern "C" const char *kiln_fp8_cuda_error(int code)
{
    static thread_local char buf[96];
    if (code >= 10000)
        snprintf(buf, sizeof buf, "cuBLASLt status %d", code - 10000);
    else
        snprintf(buf, sizeof buf, "CUDA error %d (%s)", code, cudaGetErrorString((cudaError_t)code));
    return buf;
}
