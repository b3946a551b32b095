/* FusedMatMul on CUDA (the semantics are fusedmm.c's):
 *  - 1, 2, 4 or 8 rows of x (decode; the graph buckets pad to these): one
 *    GEMV kernel built like src/backend/cuda/gemv.cu (4 warps split K, 2
 *    weight rows a block, 16-byte streaming loads, the first weight loads
 *    issued before the PDL wait) with the rest of the fused layer inside:
 *    with the RMSNorm prologue each block first sums the squares of its x
 *    rows (K values, read from L2) and normalizes x as it loads it; the
 *    epilogue adds the residual, or (weight rows interleaved gate, up)
 *    combines the block's two rows into silu(gate) * up, or (the weight's
 *    rotated pairs adjacent) rotates the block's pair as RoPE does. The
 *    intermediate tensors (the norm's output, gate/up) never reach memory.
 *  - any other row count (prefill): the unfused kernels: RMSNorm into the
 *    workspace (rmsnorm_cuda.cu), cuBLASLt's GEMM (f32 accumulation, TN),
 *    then one elementwise kernel for the epilogue. */
#include <mutex>
#include <stdio.h>
#include <type_traits>

#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"

#include <cublasLt.h>

namespace
{

constexpr int kWarps = 4;
constexpr int kRows = 2; /* weight rows per block: one gate/up pair with the SwiGLU epilogue */
constexpr int kUnroll = 4;

cublasLtHandle_t fmm_lt;
int fmm_lt_status = -1;
std::once_flag fmm_lt_once;

/* 16-byte load that skips L1 allocation: the weight is read exactly once
 * (as gemv.cu's). */
__device__ __forceinline__ uint4 load_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ float silu_times(int t, float g, float u)
{
    const float s = kcu_round_float(t, __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))));
    return __fmul_rn(s, u);
}

/* 1. the fused GEMV ------------------------------------------------------------------------ */

/* x [M, k], w [n, k], nw [k] (norm), res and y [M, n] (y [M, n / 2] with
 * SwiGLU), all of dtype DT, k a multiple of the vector width, x, w and nw
 * 16-byte aligned. */
/* The rotation of the pair (a, b) = (p0, p1) of row m as kiln/RoPE
 * computes it: pair i of head h, stored at its place in the packed row. */
template <int DT>
__device__ __forceinline__ void rope_store(const kiln_fusedmm_rope &rope, const int32_t *pos, void *y, int64_t m,
                                           int64_t n, int64_t row0, float p0, float p1)
{
    const int64_t h = row0 / rope.head_dim, o = row0 % rope.head_dim;
    int64_t a = row0, b = row0 + 1;
    if (h < rope.rotated_heads && o < rope.rotary_dim) {
        const int i = (int)(o / 2), half = rope.rotary_dim / 2;
        a = h * rope.head_dim + (rope.interleaved ? 2 * i : i);
        b = h * rope.head_dim + (rope.interleaved ? 2 * i + 1 : i + half);
        float s, c;
        sincosf(__fmul_rn((float)pos[m], rope.inv_freq[i]), &s, &c);
        c = kcu_round_float(DT, c);
        s = kcu_round_float(DT, s);
        const float y0 = __fsub_rn(kcu_round_float(DT, __fmul_rn(p0, c)), kcu_round_float(DT, __fmul_rn(p1, s)));
        const float y1 = __fadd_rn(kcu_round_float(DT, __fmul_rn(p1, c)), kcu_round_float(DT, __fmul_rn(p0, s)));
        p0 = y0, p1 = y1;
    }
    kcu_store_float(y, DT, m * n + a, p0);
    kcu_store_float(y, DT, m * n + b, p1);
}

struct no_rope {
};

/* The rotation reaches the kernel by value only in the rope form. */
template <int EPI>
using rope_arg = typename std::conditional<EPI == KILN_FUSEDMM_ROPE, kiln_fusedmm_rope, no_rope>::type;

template <int DT, int M, int NORM, int EPI>
__global__ void __launch_bounds__(kWarps * 32)
    fmm_gemv_kernel(const void *x, const void *w, const void *nw, const void *res, void *y, int32_t n, int32_t k,
                    float eps, const rope_arg<EPI> rope)
{
    constexpr int E = DT == KILN_DTYPE_F32 ? 4 : 8; /* elements per 16-byte vector */
    constexpr int ES = 16 / E;                      /* bytes per element */
    constexpr int STEP = 32 * E;
    __shared__ float part[kWarps][M][kRows];
    __shared__ float sq[kWarps][M];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t row0 = (int64_t)blockIdx.x * kRows;
    const int64_t kq = ((int64_t)k / E + kWarps - 1) / kWarps * E;
    const int64_t k0 = wid * kq, k1 = k0 + kq < k ? k0 + kq : k;
    const char *xb = (const char *)x, *nb = (const char *)nw;

    const char *wr[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++)
        wr[r] = (const char *)w + (row0 + r < n ? row0 + r : n - 1) * (int64_t)k * ES;
    /* the first vectors of w before the wait: w is a constant */
    uint4 buf[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        const int64_t kk = k0 + (int64_t)u * STEP + lane * E;
#pragma unroll
        for (int r = 0; r < kRows; r++)
            buf[u][r] = kk < k1 ? load_stream(wr[r] + kk * ES) : make_uint4(0, 0, 0, 0);
    }
    kcu_after_prior(x, res, n, k);

    /* the RMSNorm statistics of each row over all of k, as rmsnorm.c */
    float inv[M];
#pragma unroll
    for (int m = 0; m < M; m++)
        inv[m] = 1.0f;
    if (NORM) {
        float ss[M];
#pragma unroll
        for (int m = 0; m < M; m++)
            ss[m] = 0.0f;
        for (int64_t v = threadIdx.x; v < k / E; v += kWarps * 32)
#pragma unroll
            for (int m = 0; m < M; m++) {
                const uint4 xv = __ldg((const uint4 *)(xb + ((int64_t)m * k + v * E) * ES));
#pragma unroll
                for (int e = 0; e < E; e++) {
                    const float f = kcu_load_float(&xv, DT, e);
                    ss[m] = __fadd_rn(ss[m], __fmul_rn(f, f));
                }
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

    float acc[M][kRows];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < kRows; r++)
            acc[m][r] = 0.0f;
    for (int64_t base = k0; base < k1; base += (int64_t)kUnroll * STEP) {
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int64_t kk = base + (int64_t)u * STEP + lane * E;
            if (kk < k1) {
                float wf[kRows][E], nf[E] = {};
#pragma unroll
                for (int r = 0; r < kRows; r++)
#pragma unroll
                    for (int e = 0; e < E; e++)
                        wf[r][e] = kcu_load_float(&buf[u][r], DT, e);
                if (NORM) {
                    const uint4 nv = __ldg((const uint4 *)(nb + kk * ES));
#pragma unroll
                    for (int e = 0; e < E; e++)
                        nf[e] = kcu_load_float(&nv, DT, e);
                }
#pragma unroll
                for (int m = 0; m < M; m++) {
                    const uint4 xv = __ldg((const uint4 *)(xb + ((int64_t)m * k + kk) * ES));
                    float xf[E];
#pragma unroll
                    for (int e = 0; e < E; e++) {
                        xf[e] = kcu_load_float(&xv, DT, e);
                        /* the norm's output as RMSNorm stores it: the
                         * normalized value rounded, times the weight, rounded */
                        if (NORM)
                            xf[e] =
                                kcu_round_float(DT, __fmul_rn(kcu_round_float(DT, __fmul_rn(xf[e], inv[m])), nf[e]));
                    }
#pragma unroll
                    for (int r = 0; r < kRows; r++)
#pragma unroll
                        for (int e = 0; e < E; e++)
                            acc[m][r] = fmaf(xf[e], wf[r][e], acc[m][r]);
                }
            }
            const int64_t next = kk + (int64_t)kUnroll * STEP;
#pragma unroll
            for (int r = 0; r < kRows; r++)
                buf[u][r] = next < k1 ? load_stream(wr[r] + next * ES) : make_uint4(0, 0, 0, 0);
        }
    }

#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            const float v = kcu_warp_sum(acc[m][r]);
            if (lane == 0)
                part[wid][m][r] = v;
        }
    __syncthreads();
    if constexpr (EPI == KILN_FUSEDMM_ROPE) {
        /* rows row0 and row0 + 1: a rotated pair (n is even) */
        if (threadIdx.x < M && row0 < n) {
            const int m = threadIdx.x;
            float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
            for (int j = 0; j < kWarps; j++) {
                p0 += part[j][m][0];
                p1 += part[j][m][1];
            }
            rope_store<DT>(rope, (const int32_t *)res, y, m, n, row0, kcu_round_float(DT, p0), kcu_round_float(DT, p1));
        }
    } else if (EPI == KILN_FUSEDMM_SWIGLU) {
        /* rows row0 (gate) and row0 + 1 (up) of the interleaved weight */
        if (threadIdx.x < M && row0 < n) {
            const int m = threadIdx.x;
            float g = 0.0f, u = 0.0f;
#pragma unroll
            for (int j = 0; j < kWarps; j++) {
                g += part[j][m][0];
                u += part[j][m][1];
            }
            kcu_store_float(y, DT, (int64_t)m * (n / 2) + row0 / 2,
                            silu_times(DT, kcu_round_float(DT, g), kcu_round_float(DT, u)));
        }
    } else if (threadIdx.x < M * kRows) {
        const int m = threadIdx.x / kRows, r = threadIdx.x % kRows;
        if (row0 + r < n) {
            float v = 0.0f;
#pragma unroll
            for (int j = 0; j < kWarps; j++)
                v += part[j][m][r];
            const int64_t at = (int64_t)m * n + row0 + r;
            if (EPI == KILN_FUSEDMM_RESIDUAL)
                v = __fadd_rn(kcu_round_float(DT, v), kcu_load_float(res, DT, at));
            kcu_store_float(y, DT, at, v);
        }
    }
}

template <int DT, int M, int NORM, int EPI> cudaError_t gemv_launch(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    rope_arg<EPI> rope;
    const void *res = a->residual;
    if constexpr (EPI == KILN_FUSEDMM_ROPE) {
        rope = a->rope;
        res = a->positions;
    }
    return kcu_launch_cfg(fmm_gemv_kernel<DT, M, NORM, EPI>, dim3((unsigned)((a->n + kRows - 1) / kRows)),
                          dim3(kWarps * 32), s, a->x, a->w, a->norm_weight, res, a->y, a->n, a->k, a->epsilon, rope);
}

/* The four forms a decoder layer uses; the others take the GEMM path. */
template <int DT, int M> cudaError_t gemv_mode(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    if (a->epilogue == KILN_FUSEDMM_ROPE)
        return gemv_launch<DT, M, 1, KILN_FUSEDMM_ROPE>(a, s);
    if (a->epilogue == KILN_FUSEDMM_SWIGLU)
        return gemv_launch<DT, M, 1, KILN_FUSEDMM_SWIGLU>(a, s);
    if (a->epilogue == KILN_FUSEDMM_RESIDUAL)
        return gemv_launch<DT, M, 0, KILN_FUSEDMM_RESIDUAL>(a, s);
    return gemv_launch<DT, M, 1, KILN_FUSEDMM_NONE>(a, s);
}

template <int DT> cudaError_t gemv_rows(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    switch (a->rows) {
    case 1: return gemv_mode<DT, 1>(a, s);
    case 2: return gemv_mode<DT, 2>(a, s);
    case 4: return gemv_mode<DT, 4>(a, s);
    default: return gemv_mode<DT, 8>(a, s);
    }
}

/* 2. prefill: RMSNorm, cuBLASLt, epilogue ----------------------------------------------------- */

/* The rope epilogue over t [rows, n], the GEMM's result in DT: one
 * thread a pair of columns. */
template <int DT>
__global__ void __launch_bounds__(256)
    fmm_rope_kernel(const void *t, const int32_t *pos, void *y, int64_t rows, int32_t n, const kiln_fusedmm_rope rope)
{
    kcu_after_prior(t, pos, rows, n);
    const int64_t pairs = rows * (n / 2);
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < pairs; i += (int64_t)gridDim.x * 256) {
        const int64_t m = i / (n / 2), row0 = 2 * (i % (n / 2));
        rope_store<DT>(rope, pos, y, m, n, row0, kcu_load_float(t, DT, m * n + row0),
                       kcu_load_float(t, DT, m * n + row0 + 1));
    }
}

/* y = t + res (residual) or y[r, c] = silu(t[r, 2c]) * t[r, 2c + 1]
 * (SwiGLU over the interleaved product), t the GEMM's result in DT. */
template <int DT, int EPI>
__global__ void __launch_bounds__(256) fmm_epilogue_kernel(const void *t, const void *res, void *y, int64_t count)
{
    kcu_after_prior(t, res, count, DT);
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < count; i += (int64_t)gridDim.x * 256) {
        if (EPI == KILN_FUSEDMM_SWIGLU)
            kcu_store_float(y, DT, i, silu_times(DT, kcu_load_float(t, DT, 2 * i), kcu_load_float(t, DT, 2 * i + 1)));
        else
            kcu_store_float(y, DT, i, __fadd_rn(kcu_load_float(t, DT, i), kcu_load_float(res, DT, i)));
    }
}

/* The heuristic's algorithm by problem: prefill runs the same few shapes
 * every step, and the heuristic costs host time at each launch. */
struct algo_slot {
    int used;
    int32_t dtype, n, k;
    int64_t rows;
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

/* d [rows, n] = src [rows, k] · wᵀ, all of dtype dt, computed column-major
 * as dᵀ = op(W)ᵀ · srcᵀ. Returns a cuBLAS status (0: launched), or -1 when
 * cuBLASLt has no kernel. */
int lt_gemm(int32_t dt, const void *src, const void *w, void *d, int64_t rows, int32_t n, int32_t k, void *lt_ws,
            cudaStream_t s)
{
    const cudaDataType_t ty = dt == KILN_DTYPE_F16 ? CUDA_R_16F : dt == KILN_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
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
        st = cublasLtMatrixLayoutInit(&lc, ty, (uint64_t)n, (uint64_t)rows, n);
    if (st != CUBLAS_STATUS_SUCCESS)
        return (int)st;
    const uintptr_t es = dt == KILN_DTYPE_F32 ? 4 : 2;
    const uint32_t align =
        align_of((uintptr_t)src | (uintptr_t)w | (uintptr_t)d | (uintptr_t)k * es | (uintptr_t)n * es);
    cublasLtMatmulAlgo_t algo;
    int have = 0, at = -1;
    {
        std::lock_guard<std::mutex> g(slots_lock);
        for (int i = 0; i < kSlots && !have; i++) {
            const algo_slot &sl = slots[i];
            if (sl.used && sl.dtype == dt && sl.n == n && sl.k == k && sl.rows == rows && sl.align == align) {
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
            slots[at] = algo_slot{1, dt, n, k, rows, align, algo};
    }
    const float one = 1.0f, zero = 0.0f;
    return (int)cublasLtMatmul(fmm_lt, &desc, &one, w, &la, src, &lb, &zero, d, &lc, d, &lc, &algo, lt_ws,
                               KILN_FUSEDMM_LT_WORKSPACE, s);
}

template <int DT> int gemm_path(const kiln_fusedmm_cuda_args *a, cudaStream_t s)
{
    char *ws = (char *)a->workspace;
    const void *src = a->x;
    if (a->norm_weight) {
        void *xn = ws;
        int e = kiln_rmsnorm_cuda(a->x, NULL, a->norm_weight, NULL, xn, DT, DT, a->rows, a->k, a->epsilon, s);
        if (e)
            return e;
        src = xn;
    }
    const size_t es = DT == KILN_DTYPE_F32 ? 4 : 2;
    void *t = a->epilogue == KILN_FUSEDMM_NONE ? a->y : ws + kiln_fusedmm_workspace_t(a->rows, a->k);
    void *lt_ws = ws + kiln_fusedmm_workspace_lt(a->rows, a->n, a->k, es);
    int st = lt_gemm(DT, src, a->w, t, a->rows, a->n, a->k, lt_ws, s);
    if (st)
        return st < 0 ? KILN_FUSEDMM_NO_ALGO : 10000 + st;
    if (a->epilogue == KILN_FUSEDMM_NONE)
        return 0;
    const int64_t count = a->rows * (a->epilogue == KILN_FUSEDMM_RESIDUAL ? a->n : a->n / 2);
    const int64_t blocks = (count + 255) / 256;
    const dim3 grid((unsigned)(blocks < 132 * 16 ? blocks : 132 * 16));
    if (a->epilogue == KILN_FUSEDMM_ROPE)
        return (int)kcu_launch_cfg(fmm_rope_kernel<DT>, grid, dim3(256), s, (const void *)t, a->positions, a->y,
                                   a->rows, a->n, a->rope);
    if (a->epilogue == KILN_FUSEDMM_SWIGLU)
        return (int)kcu_launch_cfg(fmm_epilogue_kernel<DT, KILN_FUSEDMM_SWIGLU>, grid, dim3(256), s, (const void *)t,
                                   a->residual, a->y, count);
    return (int)kcu_launch_cfg(fmm_epilogue_kernel<DT, KILN_FUSEDMM_RESIDUAL>, grid, dim3(256), s, (const void *)t,
                               a->residual, a->y, count);
}

} /* namespace */

extern "C" int kiln_fusedmm_cuda_init(void)
{
    std::call_once(fmm_lt_once, [] { fmm_lt_status = (int)cublasLtCreate(&fmm_lt); });
    return fmm_lt_status == 0 ? 0 : 10000 + fmm_lt_status;
}

extern "C" int kiln_fusedmm_cuda(const kiln_fusedmm_cuda_args *a, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (a->rows <= 0 || a->n <= 0)
        return 0;
    const int64_t e = a->dtype == KILN_DTYPE_F32 ? 4 : 8;
    const uintptr_t addr = (uintptr_t)a->x | (uintptr_t)a->w | (uintptr_t)a->norm_weight;
    /* the GEMV's forms: the norm before no epilogue or SwiGLU, the residual add without it */
    const int form = a->epilogue == KILN_FUSEDMM_RESIDUAL ? !a->norm_weight : a->norm_weight != NULL;
    if (form && (a->rows == 1 || a->rows == 2 || a->rows == 4 || a->rows == 8) && a->k % e == 0 && addr % 16 == 0) {
        switch (a->dtype) {
        case KILN_DTYPE_F16: return (int)gemv_rows<KILN_DTYPE_F16>(a, s);
        case KILN_DTYPE_BF16: return (int)gemv_rows<KILN_DTYPE_BF16>(a, s);
        default: return (int)gemv_rows<KILN_DTYPE_F32>(a, s);
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
