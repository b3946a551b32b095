/* SwiGLU on CUDA: one thread per output element (grid-stride), silu in
 * f32 with the IEEE exp and division of the CPU reference, rounded to the
 * storage dtype before the multiply as swiglu.c does. */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"

#define SWIGLU_THREADS 256

__global__ void __launch_bounds__(SWIGLU_THREADS)
    swiglu_kernel(const void *gate, const void *up, void *y, int t, int64_t rows, int64_t width, int64_t ld)
{
    kcu_after_prior(gate, up, rows, t);
    int64_t n = rows * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / width, c = i - r * width, src = r * ld + c;
        float g = kcu_load_float(gate, t, src);
        float s = kcu_round_float(t, __fdiv_rn(g, __fadd_rn(1.0f, expf(-g))));
        kcu_store_float(y, t, i, __fmul_rn(s, kcu_load_float(up, t, src)));
    }
}

extern "C" int kiln_swiglu_cuda(const void *gate, const void *up, void *y, int32_t dtype, int64_t rows, int64_t width,
                                int64_t ld, void *stream)
{
    int64_t n = rows * width;
    if (n <= 0)
        return 0;
    int64_t want = (n + SWIGLU_THREADS - 1) / SWIGLU_THREADS;
    unsigned blocks = (unsigned)(want < 132 * 16 ? want : 132 * 16);
    return (int)kcu_launch_cfg(swiglu_kernel, dim3(blocks), dim3(SWIGLU_THREADS), (cudaStream_t)stream, gate, up, y,
                               (int)dtype, rows, width, ld);
}
