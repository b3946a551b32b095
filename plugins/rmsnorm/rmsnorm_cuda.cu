/* RMSNorm and AddRMSNorm on CUDA: one block per row (grid-stride over
 * rows), f32 statistics, the same roundings as rmsnorm.c: the sum of the
 * add rounded to the storage dtype, the normalized value rounded before
 * the weight multiply. Only the order of the sum of squares differs. */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"

#define RMS_THREADS 256

__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_kernel(const void *x, const void *res, const void *w, void *sum, void *y, int t, int wt, int64_t rows,
                   int64_t h, float eps)
{
    __shared__ float part[RMS_THREADS / 32];
    kcu_after_prior(x, w, rows, t);
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        int64_t base = row * h;
        float ss = 0.0f;
        for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
            float v = kcu_load_float(x, t, base + i);
            if (res) {
                v = kcu_round_float(t, __fadd_rn(v, kcu_load_float(res, t, base + i)));
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
            kcu_store_float(y, t, base + i, __fmul_rn(n, kcu_load_float(w, wt, i)));
        }
    }
}

/* The common case, rows of at most RMS_THREADS * RMS_MAX_VEC 16-byte
 * vectors (8192 bf16/f16 or 4096 f32 values) with 16-byte aligned rows:
 * each thread loads its vectors of x (and of the residual) into registers
 * up front, so a row costs two memory latencies instead of one per element
 * the thread owns (the loop above: measured 16 us a row at h = 2048 on the
 * H200, this one a few). Same roundings; the sum of squares is added in
 * another order. */
#define RMS_MAX_VEC 4

template <int DT>
__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_vec_kernel(const void *x, const void *res, const void *w, void *sum, void *y, int wt, int wvec,
                       int64_t rows, int64_t h, float eps)
{
    constexpr int E = DT == KILN_DTYPE_F32 ? 4 : 8; /* values per 16-byte vector */
    __shared__ float part[RMS_THREADS / 32];
    const int64_t nvec = h / E;
    /* With `wvec` (the weight in DT, 16-byte aligned) this thread's weight
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
        const uint4 *xr = (const uint4 *)x + row * nvec;
        uint4 v[RMS_MAX_VEC], r[RMS_MAX_VEC];
#pragma unroll
        for (int j = 0; j < RMS_MAX_VEC; j++) {
            const int64_t k = threadIdx.x + (int64_t)j * RMS_THREADS;
            if (k < nvec) {
                v[j] = xr[k];
                if (res)
                    r[j] = ((const uint4 *)res + row * nvec)[k];
            }
        }
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < RMS_MAX_VEC; j++) {
            const int64_t k = threadIdx.x + (int64_t)j * RMS_THREADS;
            if (k < nvec) {
                if (res) {
#pragma unroll
                    for (int e = 0; e < E; e++)
                        kcu_store_float(&v[j], DT, e,
                                        __fadd_rn(kcu_load_float(&v[j], DT, e), kcu_load_float(&r[j], DT, e)));
                    ((uint4 *)sum + row * nvec)[k] = v[j];
                }
#pragma unroll
                for (int e = 0; e < E; e++) {
                    const float f = kcu_load_float(&v[j], DT, e);
                    ss = __fadd_rn(ss, __fmul_rn(f, f));
                }
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
#pragma unroll
        for (int j = 0; j < RMS_MAX_VEC; j++) {
            const int64_t k = threadIdx.x + (int64_t)j * RMS_THREADS;
            if (k < nvec) {
                uint4 o;
#pragma unroll
                for (int e = 0; e < E; e++) {
                    const float n = kcu_round_float(DT, __fmul_rn(kcu_load_float(&v[j], DT, e), inv));
                    const float wf = wvec ? kcu_load_float(&wr[j], DT, e) : kcu_load_float(w, wt, k * E + e);
                    kcu_store_float(&o, DT, e, __fmul_rn(n, wf));
                }
                ((uint4 *)y + row * nvec)[k] = o;
            }
        }
    }
}

extern "C" int kiln_rmsnorm_cuda(const void *x, const void *residual, const void *weight, void *sum, void *y,
                                 int32_t dtype, int32_t weight_dtype, int64_t rows, int64_t h, float epsilon,
                                 void *stream)
{
    if (rows <= 0)
        return 0;
    unsigned blocks = (unsigned)(rows < 65535 ? rows : 65535);
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t e = dtype == KILN_DTYPE_F32 ? 4 : 8;
    const uintptr_t addr = (uintptr_t)x | (uintptr_t)residual | (uintptr_t)sum | (uintptr_t)y;
    const int wvec = weight_dtype == dtype && (uintptr_t)weight % 16 == 0;
    if (h % e == 0 && h / e <= (int64_t)RMS_THREADS * RMS_MAX_VEC && addr % 16 == 0) {
        if (dtype == KILN_DTYPE_BF16)
            return (int)kcu_launch_cfg(rmsnorm_vec_kernel<KILN_DTYPE_BF16>, dim3(blocks), dim3(RMS_THREADS), st, x,
                                       residual, weight, sum, y, (int)weight_dtype, wvec, rows, h, epsilon);
        if (dtype == KILN_DTYPE_F16)
            return (int)kcu_launch_cfg(rmsnorm_vec_kernel<KILN_DTYPE_F16>, dim3(blocks), dim3(RMS_THREADS), st, x,
                                       residual, weight, sum, y, (int)weight_dtype, wvec, rows, h, epsilon);
        if (dtype == KILN_DTYPE_F32)
            return (int)kcu_launch_cfg(rmsnorm_vec_kernel<KILN_DTYPE_F32>, dim3(blocks), dim3(RMS_THREADS), st, x,
                                       residual, weight, sum, y, (int)weight_dtype, wvec, rows, h, epsilon);
    }
    return (int)kcu_launch_cfg(rmsnorm_kernel, dim3(blocks), dim3(RMS_THREADS), st, x, residual, weight, sum, y,
                               (int)dtype, (int)weight_dtype, rows, h, epsilon);
}
