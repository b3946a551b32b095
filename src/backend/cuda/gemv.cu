/* Matrix-vector products for small token counts: y[m, n] = sum_k x[m, k] * w[n, k]
 * for m < KCU_GEMV_MAX_M, w row-major [N, K] (a weight stored as Hugging Face
 * lays it out, used with transpose_b). At these shapes a matmul is a pass over
 * w, so the kernel is built to stream w at the memory's rate: every lane
 * reads 16 bytes per load with several loads in flight, and the loads of the first chunk of w are issued before the wait on
 * the previous kernel (w is a constant: only x depends on it), so with
 * programmatic dependent launch they overlap that kernel's tail.
 * Products accumulate in f32; the output is rounded once. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

namespace
{

constexpr int kWarps = 4; /* warps per block */

__device__ __forceinline__ void unpack(const uint4 &v, float *f, const __nv_bfloat16 *)
{
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ void unpack(const uint4 &v, float *f, const __half *)
{
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 p = __half22float2(*reinterpret_cast<const __half2 *>(&u[i]));
        f[2 * i] = p.x;
        f[2 * i + 1] = p.y;
    }
}

__device__ __forceinline__ void unpack(const uint4 &v, float *f, const float *)
{
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
}

__device__ __forceinline__ void store(float v, float *p) { *p = v; }
__device__ __forceinline__ void store(float v, __nv_bfloat16 *p) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(float v, __half *p) { *p = __float2half_rn(v); }

/* One block computes ROWS consecutive rows of y for all M rows of x; its
 * kWarps warps split K into contiguous quarters, so each warp's chain of
 * dependent loads is short and a block finishes quickly (a long K per warp,
 * or a few partial waves of large blocks, left the memory idle: measured
 * 0.76-0.88 of the copy floor at decode shapes against 0.93-1.04 for this
 * split, bench/README.md). K is a multiple of the vector width E; rows of x
 * and w and the pointers are 16-byte aligned (kcu_gemv_supported). */
template <typename T, typename TO, int M, int ROWS, int kUnroll>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const T *__restrict__ x, int64_t ldx, const T *__restrict__ w, TO *__restrict__ y, int64_t ldy,
                int32_t n, int32_t k)
{
    KTL_SCOPE(k);
    constexpr int E = 16 / sizeof(T); /* elements per 16-byte vector */
    constexpr int STEP = 32 * E;      /* elements one warp covers per load */
    __shared__ float part[kWarps][M][ROWS];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t row0 = (int64_t)blockIdx.x * ROWS;
    const int64_t kq = ((int64_t)k / E + kWarps - 1) / kWarps * E;
    const int64_t k0 = wid * kq, k1 = k0 + kq < k ? k0 + kq : k;

    /* rows past n read the last row: loaded, never stored */
    const T *wr[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
        wr[r] = w + (row0 + r < n ? row0 + r : n - 1) * (int64_t)k;
    /* the first vectors of w before the wait: w does not depend on the
     * previous kernel, x does */
    uint4 buf[kUnroll][ROWS];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        const int64_t kk = k0 + (int64_t)u * STEP + lane * E;
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            buf[u][r] = kk < k1 ? kcu_load_stream(wr[r] + kk) : make_uint4(0, 0, 0, 0);
    }
    kcu_after_prior();

    float acc[M][ROWS];
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            acc[m][r] = 0.0f;
    for (int64_t base = k0; base < k1; base += (int64_t)kUnroll * STEP) {
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int64_t kk = base + (int64_t)u * STEP + lane * E;
            if (kk < k1) {
                float wf[ROWS][E];
#pragma unroll
                for (int r = 0; r < ROWS; r++)
                    unpack(buf[u][r], wf[r], (const T *)nullptr);
#pragma unroll
                for (int m = 0; m < M; m++) {
                    float xf[E];
                    unpack(__ldg(reinterpret_cast<const uint4 *>(x + m * ldx + kk)), xf, (const T *)nullptr);
#pragma unroll
                    for (int r = 0; r < ROWS; r++)
#pragma unroll
                        for (int e = 0; e < E; e++)
                            acc[m][r] = fmaf(xf[e], wf[r][e], acc[m][r]);
                }
            }
            /* refill this slot with the vector kUnroll loads ahead */
            const int64_t next = kk + (int64_t)kUnroll * STEP;
#pragma unroll
            for (int r = 0; r < ROWS; r++)
                buf[u][r] = next < k1 ? kcu_load_stream(wr[r] + next) : make_uint4(0, 0, 0, 0);
        }
    }

#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float v = acc[m][r];
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, off);
            if (lane == 0)
                part[wid][m][r] = v;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < M * ROWS; i += kWarps * 32) {
        const int m = i / ROWS, r = i % ROWS;
        if (row0 + r < n) {
            float v = 0.0f;
#pragma unroll
            for (int j = 0; j < kWarps; j++)
                v += part[j][m][r];
            store(v, y + m * ldy + row0 + r);
        }
    }
}

int gemv_pdl = 1;
int gemv_rows = 2; /* rows per block of the one-row kernels (kcu_gemv_set_rows) */

/* ROWS rows per block, kUnroll loads per lane and row in flight (ROWS *
 * kUnroll = 8 for every variant). */
template <typename T, typename TO, int M, int ROWS, int kUnroll>
cudaError_t launch_rows(const void *x, int64_t ldx, const void *w, void *y, int64_t ldy, int32_t n, int32_t k,
                        cudaStream_t stream)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(((int64_t)n + ROWS - 1) / ROWS));
    cfg.blockDim = dim3(kWarps * 32);
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = gemv_pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, gemv_kernel<T, TO, M, ROWS, kUnroll>, (const T *)x, ldx, (const T *)w, (TO *)y, ldy,
                              n, k);
}

template <typename T, typename TO, int M>
cudaError_t launch_m(const void *x, int64_t ldx, const void *w, void *y, int64_t ldy, int32_t n, int32_t k,
                     cudaStream_t stream)
{
    if (M == 1 && gemv_rows == 1)
        return launch_rows<T, TO, M, 1, 8>(x, ldx, w, y, ldy, n, k, stream);
    if (M == 1 && gemv_rows == 4)
        return launch_rows<T, TO, M, 4, 2>(x, ldx, w, y, ldy, n, k, stream);
    return launch_rows<T, TO, M, 2, 4>(x, ldx, w, y, ldy, n, k, stream);
}

template <typename T, typename TO>
cudaError_t launch_t(int32_t m, const void *x, int64_t ldx, const void *w, void *y, int64_t ldy, int32_t n, int32_t k,
                     cudaStream_t stream)
{
    switch (m) {
    case 1: return launch_m<T, TO, 1>(x, ldx, w, y, ldy, n, k, stream);
    case 2: return launch_m<T, TO, 2>(x, ldx, w, y, ldy, n, k, stream);
    case 3: return launch_m<T, TO, 3>(x, ldx, w, y, ldy, n, k, stream);
    case 4: return launch_m<T, TO, 4>(x, ldx, w, y, ldy, n, k, stream);
    case 5: return launch_m<T, TO, 5>(x, ldx, w, y, ldy, n, k, stream);
    case 6: return launch_m<T, TO, 6>(x, ldx, w, y, ldy, n, k, stream);
    case 7: return launch_m<T, TO, 7>(x, ldx, w, y, ldy, n, k, stream);
    default: return launch_m<T, TO, 8>(x, ldx, w, y, ldy, n, k, stream);
    }
}

} /* namespace */

extern "C" void kcu_gemv_set_pdl(int32_t on) { gemv_pdl = on != 0; }

extern "C" void kcu_gemv_set_rows(int32_t rows) { gemv_rows = rows == 1 || rows == 4 ? rows : 2; }

extern "C" int32_t kcu_gemv_supported(int32_t m, int32_t wdtype, int32_t ydtype, const void *x, int64_t ldx,
                                      const void *w, const void *y, int64_t ldy, int64_t n, int64_t k)
{
    if (m < 1 || m > KCU_GEMV_MAX_M || n < 1 || k < 1 || n > INT32_MAX || k > INT32_MAX)
        return 0;
    if (wdtype != KILN_DTYPE_F32 && wdtype != KILN_DTYPE_F16 && wdtype != KILN_DTYPE_BF16)
        return 0;
    if (ydtype != wdtype && ydtype != KILN_DTYPE_F32)
        return 0;
    const int64_t esz = wdtype == KILN_DTYPE_F32 ? 4 : 2;
    if ((k * esz) % 16 || (ldx * esz) % 16 || ((uintptr_t)x | (uintptr_t)w) % 16 || ldy < n || ldx < k)
        return 0;
    (void)y;
    return 1;
}

extern "C" int kcu_gemv(int32_t m, int32_t wdtype, int32_t ydtype, const void *x, int64_t ldx, const void *w, void *y,
                        int64_t ldy, int64_t n, int64_t k, void *stream_)
{
    cudaStream_t stream = (cudaStream_t)stream_;
    const int32_t ni = (int32_t)n, ki = (int32_t)k;
    switch (wdtype) {
    case KILN_DTYPE_BF16:
        return ydtype == KILN_DTYPE_F32 ? launch_t<__nv_bfloat16, float>(m, x, ldx, w, y, ldy, ni, ki, stream)
                                        : launch_t<__nv_bfloat16, __nv_bfloat16>(m, x, ldx, w, y, ldy, ni, ki, stream);
    case KILN_DTYPE_F16:
        return ydtype == KILN_DTYPE_F32 ? launch_t<__half, float>(m, x, ldx, w, y, ldy, ni, ki, stream)
                                        : launch_t<__half, __half>(m, x, ldx, w, y, ldy, ni, ki, stream);
    default: return launch_t<float, float>(m, x, ldx, w, y, ldy, ni, ki, stream);
    }
}
