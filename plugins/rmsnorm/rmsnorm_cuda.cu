/* RMSNorm and AddRMSNorm on CUDA: one block per row (grid-stride over
 * rows), f32 statistics, the same roundings as rmsnorm.c: the sum of the
 * add rounded to the storage dtype, the normalized value rounded before
 * the weight multiply. Only the order of the sum of squares differs. */
#include "../plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"

#define RMS_THREADS 256

__global__ void __launch_bounds__(RMS_THREADS) rmsnorm_kernel(const void *x, const void *res, const void *w,
                                                                void *sum, void *y, int t, int wt, int64_t rows,
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

extern "C" int kiln_rmsnorm_cuda(const void *x, const void *residual, const void *weight, void *sum, void *y,
                                 int32_t dtype, int32_t weight_dtype, int64_t rows, int64_t h, float epsilon,
                                 void *stream)
{
    if (rows <= 0)
        return 0;
    unsigned blocks = (unsigned)(rows < 65535 ? rows : 65535);
    return (int)kcu_launch_cfg(rmsnorm_kernel, dim3(blocks), dim3(RMS_THREADS), (cudaStream_t)stream, x, residual,
                               weight, sum, y, (int)dtype, (int)weight_dtype, rows, h, epsilon);
}
