/* Reduction and softmax kernels: one warp per output line. Sums are f64
 * like the CPU reference, so a result does not depend on the order. */
#include "backend/cuda/cuda_common.cuh"

#include <kiln/network.h>

__device__ __forceinline__ float kcu_pick(int is_max, float b, float v)
{
    return (is_max ? v > b : v < b) || v != v ? v : b;
}

/* One warp per output element; sums in f64 like the CPU reference, so the
 * result does not depend on the order. */
__global__ void kcu_reduce_kernel(const kcu_reduce_args a)
{
    KTL_SCOPE(0);
    kcu_after_prior();
    const int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const int is_sum = a.op == KILN_REDUCE_SUM || a.op == KILN_REDUCE_MEAN;
    const int is_max = a.op == KILN_REDUCE_MAX;
    for (int64_t u = warp; u < a.n_out; u += warps) {
        int64_t base = kcu_map_off(a.kept, u);
        double sum = 0.0;
        float best = is_max ? -INFINITY : INFINITY;
        for (int64_t j = lane; j < a.rcount; j += 32) {
            float v = kcu_load(a.in, a.in_dtype, base + kcu_map_off(a.red, j));
            if (is_sum)
                sum += v;
            else
                best = kcu_pick(is_max, best, v);
        }
        for (int o = 16; o > 0; o >>= 1) {
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
            best = kcu_pick(is_max, best, __shfl_xor_sync(0xffffffffu, best, o));
        }
        if (lane == 0) {
            float v = a.op == KILN_REDUCE_SUM    ? (float)sum
                      : a.op == KILN_REDUCE_MEAN ? (float)(sum / (double)a.rcount)
                                                 : best;
            kcu_store(a.out, a.out_dtype, u, v);
        }
    }
}

extern "C" int kcu_launch_reduce(const kcu_reduce_args *a, int32_t sms, void *stream)
{
    if (a->n_out <= 0)
        return cudaSuccess;
    return (int)kcu_launch(kcu_reduce_kernel, kcu_blocks(a->n_out * 32, sms, 1), (cudaStream_t)stream, *a);
}

/* One warp per line: max, sum of exp (f32), then exp(x - max) / sum. */
__global__ void kcu_softmax_kernel(const void *in, int in_dtype, void *out, int out_dtype, int64_t lines, int64_t len,
                                   int64_t inner)
{
    KTL_SCOPE(0);
    kcu_after_prior();
    const int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t u = warp; u < lines; u += warps) {
        int64_t base = (u / inner) * len * inner + u % inner;
        float m = -INFINITY;
        for (int64_t j = lane; j < len; j += 32) {
            float v = kcu_load(in, in_dtype, base + j * inner);
            m = v > m ? v : m;
        }
        for (int o = 16; o > 0; o >>= 1) {
            float t = __shfl_xor_sync(0xffffffffu, m, o);
            m = t > m ? t : m;
        }
        float sum = 0.0f;
        for (int64_t j = lane; j < len; j += 32)
            sum += expf(kcu_load(in, in_dtype, base + j * inner) - m);
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        float inv = 1.0f / sum;
        for (int64_t j = lane; j < len; j += 32)
            kcu_store(out, out_dtype, base + j * inner, expf(kcu_load(in, in_dtype, base + j * inner) - m) * inv);
    }
}

extern "C" int kcu_launch_softmax(const void *in, int32_t in_dtype, void *out, int32_t out_dtype, int64_t lines,
                                  int64_t len, int64_t inner, int32_t sms, void *stream)
{
    if (lines <= 0 || len <= 0)
        return cudaSuccess;
    return (int)kcu_launch(kcu_softmax_kernel, kcu_blocks(lines * 32, sms, 1), (cudaStream_t)stream, in, (int)in_dtype,
                           out, (int)out_dtype, lines, len, inner);
}
