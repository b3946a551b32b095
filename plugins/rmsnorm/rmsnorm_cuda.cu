/* RMSNorm and AddRMSNorm on CUDA: one block per row (grid-stride over
 * rows), f32 statistics, the same roundings as rmsnorm.c: the sum of the
 * add rounded to x's dtype, the normalized value rounded to x's dtype
 * before the weight multiply, the product to y's. Only the order of the
 * sum of squares differs. x (and sum), the residual, y and the weight
 * each have a dtype of their own: a bf16 or f16 engine keeps its residual
 * stream in f32 (docs/llm.md). */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"
#include "fp8/fp8_quant.cuh"

#define RMS_THREADS 256

__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_kernel(const void *x, const void *res, const void *w, void *sum, void *y, int t, int rt, int yt, int wt,
                   int64_t rows, int64_t h, float eps)
{
    KTL_SCOPE(0);
    __shared__ float part[RMS_THREADS / 32];
    kcu_after_prior(x, w, rows, t);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int64_t base = row * h;
        float ss = 0.0f;
        for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
            float v = kcu_load_float(x, t, base + i);
            if (res) {
                v = kcu_round_float(t, __fadd_rn(v, kcu_load_float(res, rt, base + i)));
                kcu_store_float(sum, t, base + i, v);
            }
            ss = __fadd_rn(ss, __fmul_rn(v, v));
        }
        ss = kcu_warp_sum(ss);
        if ((threadIdx.x & 31) == 0)
            part[threadIdx.x >> 5] = ss;
        __syncthreads();
        float total = 0.0f;
        for (int k = 0; k < RMS_THREADS / 32; k++)
            total += part[k];
        __syncthreads(); /* part is reused by the next row */
        float inv = 1.0f / sqrtf(total / (float)h + eps);
        for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
            /* the sum as this thread stored it (right even when sum is x) */
            float v = kcu_load_float(res ? sum : x, t, base + i);
            float n = kcu_round_float(t, __fmul_rn(v, inv));
            kcu_store_float(y, yt, base + i, __fmul_rn(n, kcu_load_float(w, wt, i)));
        }
    }
}

/* The common case, rows of at most RMS_THREADS * RMS_MAX_VEC vectors of E
 * values (8192 values when y is bf16/f16, 4096 in f32) with 16-byte
 * aligned rows, x in y's dtype or in f32 and the residual in y's: each
 * thread loads its vectors of x (and of the residual) into registers up
 * front, so a row costs two memory latencies instead of one per element
 * the thread owns (the loop above: measured 16 us a row at h = 2048 on the
 * H200, this one a few). Same roundings; the sum of squares is added in
 * another order. */
#define RMS_MAX_VEC 4

/* E values of dtype T from the E-value vector v of p (16-byte loads: two
 * when T is f32 and E is 8), and the reverse. */
template <int T, int E> __device__ __forceinline__ void rms_load(const void *p, int64_t v, float *f)
{
    constexpr int PER = T == KILN_DTYPE_F32 ? 4 : 8;
    static_assert(E % PER == 0, "a vector is whole 16-byte loads");
#pragma unroll
    for (int q = 0; q < E / PER; q++) {
        const uint4 u = ((const uint4 *)p)[v * (E / PER) + q];
#pragma unroll
        for (int e = 0; e < PER; e++)
            f[q * PER + e] = kcu_load_float(&u, T, e);
    }
}

template <int T, int E> __device__ __forceinline__ void rms_store(void *p, int64_t v, const float *f)
{
    constexpr int PER = T == KILN_DTYPE_F32 ? 4 : 8;
#pragma unroll
    for (int q = 0; q < E / PER; q++) {
        uint4 u;
#pragma unroll
        for (int e = 0; e < PER; e++)
            kcu_store_float(&u, T, e, f[q * PER + e]);
        ((uint4 *)p)[v * (E / PER) + q] = u;
    }
}

/* Q8 (quantize = fp8): y's values, rounded to YT, stay in registers and
 * leave as E4M3 codes q and a scale a row (fp8_quant.cuh), as kiln/Fp8MatMul
 * would quantize the stored y: one pass over the row instead of the norm's
 * store and the quantization's load and store. */
template <int XT, int YT, bool Q8>
__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_vec_kernel(const void *x, const void *res, const void *w, void *sum, void *y, int wt, int wvec,
                       int64_t rows, int64_t h, float eps, uint8_t *q, float *q_scale, float amax)
{
    KTL_SCOPE(0);
    /* values per vector: one 16-byte vector of y (and of the residual) */
    constexpr int E = YT == KILN_DTYPE_F32 ? 4 : 8;
    __shared__ float part[RMS_THREADS / 32];
    const int64_t nvec = h / E;
    /* With `wvec` (the weight in YT, 16-byte aligned) this thread's weight
     * vectors are loaded before the wait on the previous kernel: the
     * weight is a constant, and its latency would otherwise follow the
     * reduction on every row's critical path. */
    uint4 wr[RMS_MAX_VEC];
#pragma unroll
    for (int j = 0; j < RMS_MAX_VEC; j++) {
        const int64_t k = threadIdx.x + (int64_t)j * RMS_THREADS;
        wr[j] = wvec && k < nvec ? __ldg((const uint4 *)w + k) : make_uint4(0, 0, 0, 0);
    }
    kcu_after_prior(x, w, rows, wt);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const char *xr = (const char *)x + row * h * (XT == KILN_DTYPE_F32 ? 4 : 2);
        float v[RMS_MAX_VEC][E];
#pragma unroll
        for (int j = 0; j < RMS_MAX_VEC; j++) {
            const int64_t k = threadIdx.x + (int64_t)j * RMS_THREADS;
            if (k < nvec) {
                rms_load<XT, E>(xr, k, v[j]);
                if (res) {
                    float r[E];
                    rms_load<YT, E>((const char *)res + row * h * (YT == KILN_DTYPE_F32 ? 4 : 2), k, r);
#pragma unroll
                    for (int e = 0; e < E; e++)
                        v[j][e] = kcu_round_float(XT, __fadd_rn(v[j][e], r[e]));
                    rms_store<XT, E>((char *)sum + row * h * (XT == KILN_DTYPE_F32 ? 4 : 2), k, v[j]);
                }
            }
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < RMS_MAX_VEC; j++) {
            const int64_t k = threadIdx.x + (int64_t)j * RMS_THREADS;
            if (k < nvec) {
#pragma unroll
                for (int e = 0; e < E; e++)
                    ss = __fadd_rn(ss, __fmul_rn(v[j][e], v[j][e]));
            }
        }
        ss = kcu_warp_sum(ss);
        if ((threadIdx.x & 31) == 0)
            part[threadIdx.x >> 5] = ss;
        __syncthreads();
        float total = 0.0f;
        for (int k = 0; k < RMS_THREADS / 32; k++)
            total += part[k];
        __syncthreads(); /* part is reused by the next row */
        const float inv = 1.0f / sqrtf(total / (float)h + eps);
        if constexpr (Q8) {
            float a = 0.0f;
#pragma unroll
            for (int j = 0; j < RMS_MAX_VEC; j++) {
                const int64_t k = threadIdx.x + (int64_t)j * RMS_THREADS;
                if (k < nvec) {
#pragma unroll
                    for (int e = 0; e < E; e++) {
                        const float n = kcu_round_float(XT, __fmul_rn(v[j][e], inv));
                        const float wf = wvec ? kcu_load_float(&wr[j], YT, e) : kcu_load_float(w, wt, k * E + e);
                        v[j][e] = kcu_round_float(YT, __fmul_rn(n, wf));
                        a = fmaxf(a, fabsf(v[j][e]));
                    }
                }
            }
            const float qi = fp8_row_scale(a, amax, q_scale + row);
#pragma unroll
            for (int j = 0; j < RMS_MAX_VEC; j++) {
                const int64_t k = threadIdx.x + (int64_t)j * RMS_THREADS;
                if (k < nvec) {
                    uint8_t *qr = q + row * h + k * E;
                    if constexpr (E == 8)
                        *reinterpret_cast<uint2 *>(qr) = make_uint2(fp8_pack4(v[j], qi), fp8_pack4(v[j] + 4, qi));
                    else
                        *reinterpret_cast<uint32_t *>(qr) = fp8_pack4(v[j], qi);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < RMS_MAX_VEC; j++) {
                const int64_t k = threadIdx.x + (int64_t)j * RMS_THREADS;
                if (k < nvec) {
                    uint4 o;
#pragma unroll
                    for (int e = 0; e < E; e++) {
                        const float n = kcu_round_float(XT, __fmul_rn(v[j][e], inv));
                        const float wf = wvec ? kcu_load_float(&wr[j], YT, e) : kcu_load_float(w, wt, k * E + e);
                        kcu_store_float(&o, YT, e, __fmul_rn(n, wf));
                    }
                    ((uint4 *)y + row * nvec)[k] = o;
                }
            }
        }
    }
}

extern "C" int kiln_rmsnorm_cuda(const void *x, const void *residual, const void *weight, void *sum, void *y,
                                 int32_t x_dtype, int32_t residual_dtype, int32_t y_dtype, int32_t weight_dtype,
                                 int64_t rows, int64_t h, float epsilon, uint8_t *q, float *q_scale, float amax,
                                 void *stream)
{
    if (rows <= 0)
        return 0;
    unsigned blocks = (unsigned)(rows < 65535 ? rows : 65535);
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t e = y_dtype == KILN_DTYPE_F32 ? 4 : 8;
    const uintptr_t addr = (uintptr_t)x | (uintptr_t)residual | (uintptr_t)sum | (q ? (uintptr_t)q : (uintptr_t)y);
    const int wvec = weight_dtype == y_dtype && (uintptr_t)weight % 16 == 0;
    /* the vector kernel's pairs: x in y's dtype, or an f32 x (the residual
     * stream) with a bf16 or f16 y; the residual in y's dtype */
    const int pair = x_dtype == y_dtype || (x_dtype == KILN_DTYPE_F32 && y_dtype != KILN_DTYPE_F32);
    if (pair && (!residual || residual_dtype == y_dtype) && h % e == 0 && h / e <= (int64_t)RMS_THREADS * RMS_MAX_VEC &&
        addr % 16 == 0) {
#define RMS_VEC(XT, YT) \
    if (x_dtype == XT && y_dtype == YT) \
        return q ? (int)kcu_launch_cfg(rmsnorm_vec_kernel<XT, YT, true>, dim3(blocks), dim3(RMS_THREADS), st, x, \
                                       residual, weight, sum, y, (int)weight_dtype, wvec, rows, h, epsilon, q, \
                                       q_scale, amax) \
                 : (int)kcu_launch_cfg(rmsnorm_vec_kernel<XT, YT, false>, dim3(blocks), dim3(RMS_THREADS), st, x, \
                                       residual, weight, sum, y, (int)weight_dtype, wvec, rows, h, epsilon, \
                                       (uint8_t *)NULL, (float *)NULL, 0.0f);
        RMS_VEC(KILN_DTYPE_BF16, KILN_DTYPE_BF16)
        RMS_VEC(KILN_DTYPE_F16, KILN_DTYPE_F16)
        RMS_VEC(KILN_DTYPE_F32, KILN_DTYPE_F32)
        RMS_VEC(KILN_DTYPE_F32, KILN_DTYPE_BF16)
        RMS_VEC(KILN_DTYPE_F32, KILN_DTYPE_F16)
#undef RMS_VEC
    }
    /* elsewhere y is stored (with q: in the caller's scratch) and then quantized */
    const int err =
        (int)kcu_launch_cfg(rmsnorm_kernel, dim3(blocks), dim3(RMS_THREADS), st, x, residual, weight, sum, y,
                            (int)x_dtype, (int)residual_dtype, (int)y_dtype, (int)weight_dtype, rows, h, epsilon);
    if (err || !q)
        return err;
    return h > INT32_MAX ? (int)cudaErrorInvalidValue
                         : kiln_fp8_quantize_cuda(y, y_dtype, q, q_scale, rows, (int32_t)h, amax, stream);
}
