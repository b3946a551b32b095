/* WeightOnlyMatMul on CUDA: y = x · Wᵀ with W in int8 (w = s · q) or int4
 * (w = s · (q − z)), layouts in woq.c. Products accumulate in f32 and y is
 * rounded once to its dtype.
 *
 * Few rows of x (decode, rows <= WOQ_GEMV_MAX_ROWS): a GEMV built like the
 * bf16 one (src/backend/cuda/gemv.cu), since at these shapes the matmul is
 * one pass over the weight bytes: each block owns ROWS weight rows, its
 * warps split k into contiguous parts, every lane reads 16 bytes of each
 * row per load (32 int4 or 16 int8 weights, always inside one group as
 * groups are multiples of 32) with kUnroll loads in flight, and the first
 * loads of the constant weights, scales and zeros are issued before the
 * wait on the previous kernel (PDL). Dequantization stays in registers: a
 * quantized value becomes a float by OR-ing it into the mantissa of 2^23
 * and subtracting 2^23 + zero in one exact add (no integer-to-float
 * conversion, which issues at a quarter of the FMA rate); a 16-byte
 * vector's products with x are summed unscaled and multiplied by its
 * group's scale once.
 *
 * Many rows (prefill): a tiled kernel, 64 x-rows by 64 weight rows per
 * block, each step of 32 along k dequantized into shared memory with the
 * CPU's formula: the weights are read rows / 64 times. */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"

#define WOQ_GEMV_MAX_ROWS 8
#define WOQ_TILE 64

namespace
{

constexpr int kWarps = 4;
constexpr int kUnroll = 2;

/* Weights per 16-byte vector. */
template <int BITS> struct woq_vec {
    static constexpr int E = BITS == 4 ? 32 : 16;
    static constexpr int ROWS = BITS == 4 ? 4 : 2; /* weight rows per block */
};

/* 16-byte load that skips L1 allocation: the weights are read once. */
__device__ __forceinline__ uint4 woq_load_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* The E values of x from element `off` as f32; x rows are 16-byte aligned
 * (checked by the launcher) and off is a multiple of E. */
template <int XT, int E> __device__ __forceinline__ void woq_load_x(const void *x, int64_t off, float *xf)
{
    if (XT == KILN_DTYPE_F32) {
        const float4 *p = reinterpret_cast<const float4 *>((const float *)x + off);
#pragma unroll
        for (int i = 0; i < E / 4; i++) {
            float4 v = __ldg(p + i);
            xf[4 * i] = v.x, xf[4 * i + 1] = v.y, xf[4 * i + 2] = v.z, xf[4 * i + 3] = v.w;
        }
    } else {
        const uint4 *p = reinterpret_cast<const uint4 *>((const uint16_t *)x + off);
#pragma unroll
        for (int i = 0; i < E / 8; i++) {
            uint4 v = __ldg(p + i);
            const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (XT == KILN_DTYPE_BF16) {
                    xf[8 * i + 2 * e] = __uint_as_float(u[e] << 16);
                    xf[8 * i + 2 * e + 1] = __uint_as_float(u[e] & 0xffff0000u);
                } else {
                    float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&u[e]));
                    xf[8 * i + 2 * e] = f.x;
                    xf[8 * i + 2 * e + 1] = f.y;
                }
            }
        }
    }
}

/* The E weights of a vector as exact floats q − z (int8: q), unscaled.
 * 0x4B000000 | b is the float 2^23 + b for b < 2^23; int8 bytes are
 * offset by 128 (XOR 0x80) to make them unsigned first. */
template <int BITS> __device__ __forceinline__ void woq_unpack(const uint4 &v, float zf, float *w)
{
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (BITS == 4) {
#pragma unroll
            for (int j = 0; j < 8; j++)
                w[8 * i + j] = __uint_as_float(0x4B000000u | ((u[i] >> (4 * j)) & 0xFu)) - zf;
        } else {
            const uint32_t t = u[i] ^ 0x80808080u;
#pragma unroll
            for (int j = 0; j < 4; j++)
                w[4 * i + j] = __uint_as_float(__byte_perm(t, 0x4B00u, 0x5440u | (uint32_t)j)) - zf;
        }
    }
}

/* One block computes ROWS consecutive rows of y for all m (<= M) rows of
 * x. The loads of the first kUnroll vectors of each row (and their scales
 * and zeros) precede the PDL wait: they are constants. */
template <int XT, int BITS, int M>
__global__ void __launch_bounds__(kWarps * 32)
    woq_gemv_kernel(const void *__restrict__ x, const uint8_t *__restrict__ q, const float *__restrict__ scales,
                    const uint8_t *__restrict__ zeros, void *__restrict__ y, int32_t m, int32_t n, int32_t k,
                    int32_t group)
{
    constexpr int E = woq_vec<BITS>::E, ROWS = woq_vec<BITS>::ROWS, STEP = 32 * E;
    __shared__ float part[kWarps][M][ROWS];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t row0 = (int64_t)blockIdx.x * ROWS, ng = k / group, row_bytes = (int64_t)k * BITS / 8;
    const int64_t kq = ((int64_t)k / E + kWarps - 1) / kWarps * E;
    const int64_t k0 = wid * kq, k1 = k0 + kq < k ? k0 + kq : k;

    /* rows past n read the last row: loaded, never stored */
    int64_t rr[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++)
        rr[r] = row0 + r < n ? row0 + r : n - 1;
    uint4 buf[kUnroll][ROWS];
    float sbuf[kUnroll][ROWS], zbuf[kUnroll][ROWS];
    const float zbase = BITS == 4 ? 8388608.0f : 8388736.0f; /* 2^23, and 2^23 + 128 for int8 */
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        const int64_t kk = k0 + (int64_t)u * STEP + lane * E;
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const bool in = kk < k1;
            const int64_t g = rr[r] * ng + (in ? kk / group : 0);
            buf[u][r] = in ? woq_load_stream(q + rr[r] * row_bytes + kk * BITS / 8) : make_uint4(0, 0, 0, 0);
            sbuf[u][r] = in ? __ldg(scales + g) : 0.0f;
            zbuf[u][r] = zbase + (BITS == 4 && in ? (float)__ldg(zeros + g) : 0.0f);
        }
    }
    kcu_after_prior(x, y, k, n);

    float acc[M][ROWS];
#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            acc[i][r] = 0.0f;
    for (int64_t base = k0; base < k1; base += (int64_t)kUnroll * STEP) {
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int64_t kk = base + (int64_t)u * STEP + lane * E;
            if (kk < k1) {
#pragma unroll
                for (int r = 0; r < ROWS; r++) {
                    float w[E];
                    woq_unpack<BITS>(buf[u][r], zbuf[u][r], w);
#pragma unroll
                    for (int i = 0; i < M; i++) {
                        if (i < m) {
                            float xf[E];
                            woq_load_x<XT, E>(x, (int64_t)i * k + kk, xf);
                            float s = 0.0f;
#pragma unroll
                            for (int e = 0; e < E; e++)
                                s = fmaf(w[e], xf[e], s);
                            acc[i][r] = fmaf(sbuf[u][r], s, acc[i][r]);
                        }
                    }
                }
            }
            /* refill this slot with the vector kUnroll loads ahead */
            const int64_t next = kk + (int64_t)kUnroll * STEP;
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                const bool in = next < k1;
                const int64_t g = rr[r] * ng + (in ? next / group : 0);
                buf[u][r] = in ? woq_load_stream(q + rr[r] * row_bytes + next * BITS / 8) : make_uint4(0, 0, 0, 0);
                sbuf[u][r] = in ? __ldg(scales + g) : 0.0f;
                zbuf[u][r] = zbase + (BITS == 4 && in ? (float)__ldg(zeros + g) : 0.0f);
            }
        }
    }

#pragma unroll
    for (int i = 0; i < M; i++)
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float v = kcu_warp_sum(acc[i][r]);
            if (lane == 0)
                part[wid][i][r] = v;
        }
    __syncthreads();
    for (int t = threadIdx.x; t < M * ROWS; t += kWarps * 32) {
        const int i = t / ROWS, r = t % ROWS;
        if (i < m && row0 + r < n) {
            float v = 0.0f;
#pragma unroll
            for (int j = 0; j < kWarps; j++)
                v += part[j][i][r];
            kcu_store_float(y, XT, (int64_t)i * n + row0 + r, v);
        }
    }
}

/* Weight (c, kk) with the CPU's formula: one multiply of s and q − z. */
template <int BITS>
__device__ __forceinline__ float woq_weight(const uint8_t *q, const float *scales, const uint8_t *zeros, int64_t c,
                                            int64_t kk, int32_t k, int32_t group)
{
    const int64_t g = c * (k / group) + kk / group;
    if (BITS == 8)
        return __fmul_rn(scales[g], (float)(int8_t)q[c * k + kk]);
    const uint8_t b = q[c * (k / 2) + kk / 2];
    const int v = kk & 1 ? b >> 4 : b & 0x0F;
    return __fmul_rn(scales[g], (float)(v - zeros[g]));
}

template <int XT, int BITS>
__global__ void __launch_bounds__(256)
    woq_tiled_kernel(const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y, int64_t rows,
                     int32_t n, int32_t k, int32_t group)
{
    __shared__ float xs[32][WOQ_TILE + 4], ws[32][WOQ_TILE + 4];
    kcu_after_prior(x, q, rows, n);
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int64_t tiles_n = (n + WOQ_TILE - 1) / WOQ_TILE, tiles = (rows + WOQ_TILE - 1) / WOQ_TILE * tiles_n;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t r0 = tile / tiles_n * WOQ_TILE, c0 = tile % tiles_n * WOQ_TILE;
        float acc[4][4] = {};
        for (int64_t k0 = 0; k0 < k; k0 += 32) {
            __syncthreads();
            for (int e = tid; e < 32 * WOQ_TILE; e += 256) {
                const int r = e / 32, kk = e % 32;
                xs[kk][r] = r0 + r < rows ? kcu_load_float(x, XT, (r0 + r) * k + k0 + kk) : 0.0f;
                ws[kk][r] = c0 + r < n ? woq_weight<BITS>(q, scales, zeros, c0 + r, k0 + kk, k, group) : 0.0f;
            }
            __syncthreads();
#pragma unroll 8
            for (int kk = 0; kk < 32; kk++) {
                float xr[4], wr[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    xr[i] = xs[kk][ty * 4 + i];
                    wr[i] = ws[kk][tx * 4 + i];
                }
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        acc[i][j] = fmaf(xr[i], wr[j], acc[i][j]);
            }
        }
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) {
                const int64_t r = r0 + ty * 4 + i, c = c0 + tx * 4 + j;
                if (r < rows && c < n)
                    kcu_store_float(y, XT, r * n + c, acc[i][j]);
            }
    }
}

template <int XT, int BITS, int M>
cudaError_t woq_gemv(const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y, int32_t m,
                     int32_t n, int32_t k, int32_t group, cudaStream_t s)
{
    constexpr int ROWS = woq_vec<BITS>::ROWS;
    return kcu_launch_cfg(woq_gemv_kernel<XT, BITS, M>, dim3((unsigned)(((int64_t)n + ROWS - 1) / ROWS)),
                          dim3(kWarps * 32), s, x, q, scales, zeros, y, m, n, k, group);
}

template <int XT, int BITS>
cudaError_t woq_launch(const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y,
                       int64_t rows, int32_t n, int32_t k, int32_t group, cudaStream_t s)
{
    /* the GEMV reads x and w 16 bytes at a time: k is a multiple of 32, so
     * the rows are 16-byte multiples and only the base pointers matter */
    if (rows <= WOQ_GEMV_MAX_ROWS && ((uintptr_t)x | (uintptr_t)q) % 16 == 0) {
        const int32_t m = (int32_t)rows;
        if (m == 1)
            return woq_gemv<XT, BITS, 1>(x, q, scales, zeros, y, m, n, k, group, s);
        if (m == 2)
            return woq_gemv<XT, BITS, 2>(x, q, scales, zeros, y, m, n, k, group, s);
        if (m <= 4)
            return woq_gemv<XT, BITS, 4>(x, q, scales, zeros, y, m, n, k, group, s);
        return woq_gemv<XT, BITS, 8>(x, q, scales, zeros, y, m, n, k, group, s);
    }
    const int64_t tiles = (rows + WOQ_TILE - 1) / WOQ_TILE * ((n + WOQ_TILE - 1) / WOQ_TILE);
    return kcu_launch_cfg(woq_tiled_kernel<XT, BITS>, dim3((unsigned)(tiles < 65535 ? tiles : 65535)), dim3(256), s, x,
                          q, scales, zeros, y, rows, n, k, group);
}

template <int BITS>
cudaError_t woq_dispatch(int32_t dtype, const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros,
                         void *y, int64_t rows, int32_t n, int32_t k, int32_t group, cudaStream_t s)
{
    switch (dtype) {
    case KILN_DTYPE_F16: return woq_launch<KILN_DTYPE_F16, BITS>(x, q, scales, zeros, y, rows, n, k, group, s);
    case KILN_DTYPE_BF16: return woq_launch<KILN_DTYPE_BF16, BITS>(x, q, scales, zeros, y, rows, n, k, group, s);
    default: return woq_launch<KILN_DTYPE_F32, BITS>(x, q, scales, zeros, y, rows, n, k, group, s);
    }
}

} /* namespace */

extern "C" int kiln_woq_matmul_cuda(int32_t bits, int32_t group, const void *x, const void *q, const void *scales,
                                    const void *zeros, void *y, int32_t dtype, int64_t rows, int32_t n, int32_t k,
                                    void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (rows <= 0 || n <= 0)
        return 0;
    const uint8_t *qb = (const uint8_t *)q, *zb = (const uint8_t *)zeros;
    const float *sc = (const float *)scales;
    return bits == 4 ? (int)woq_dispatch<4>(dtype, x, qb, sc, zb, y, rows, n, k, group, s)
                     : (int)woq_dispatch<8>(dtype, x, qb, sc, zb, y, rows, n, k, group, s);
}
