/* QuantMatMul on CUDA: y = x · Wᵀ with W in ggml blocks (Q8_0, Q4_0, Q4_1,
 * and the K formats Q4_K, Q5_K, Q6_K),
 * dequantized with the same f32 operations as qmatmul.c (a multiply, then
 * the add of Q4_1's min: never an FMA), products accumulated in f32, y
 * rounded once to its dtype.
 *
 * Few rows of x (decode): a GEMV that reads the weight bytes once. Each
 * block owns QMM_COLS weight rows and splits k among its warps (so even a
 * 2048-row matrix gives 512 blocks, enough loads in flight to cover the
 * memory latency); per step a warp stages 32 blocks of each row into shared
 * memory with coalesced 16-byte loads (rows of k / 32 blocks are 16-byte
 * multiples whenever k is a multiple of 256; byte loads otherwise), then
 * lane i dequantizes block i of every row and multiplies it with the
 * matching 32 values of up to QMM_GROUP rows of x, which are read once for
 * all QMM_COLS weight rows. Warp shuffles, then shared memory, sum the
 * partial products.
 *
 * The K formats (super-blocks of 256) have a GEMV of their own
 * (qmm_kgemv_kernel, one warp per weight row).
 *
 * Many rows (prefill): a plain tiled kernel, 64 x-rows by 64 weight rows
 * per block, 32 values of k per step dequantized into shared memory: the
 * weights are read rows / 64 times instead of rows / 4. */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"
#include "core/ggml_block.h"

#define QMM_WARPS 8
#define QMM_COLS 4  /* weight rows per warp */
#define QMM_GROUP 4 /* x rows per pass over the weights in the GEMV */
#define QMM_GEMV_MAX_ROWS 16
#define QMM_TILE 64

enum { QMM_Q4_0 = 2, QMM_Q4_1 = 3, QMM_Q8_0 = 8, QMM_Q4_K = 12, QMM_Q5_K = 13, QMM_Q6_K = 14 };

/* Bytes and values of a block. */
template <int TYPE> struct qmm_fmt {
    static constexpr int bytes = TYPE == QMM_Q8_0   ? 34
                                 : TYPE == QMM_Q4_0 ? 18
                                 : TYPE == QMM_Q4_1 ? 20
                                 : TYPE == QMM_Q4_K ? 144
                                 : TYPE == QMM_Q5_K ? 176
                                                    : 210;
    static constexpr int values = TYPE == QMM_Q4_K || TYPE == QMM_Q5_K || TYPE == QMM_Q6_K ? 256 : 32;
};

/* Weight e (0..255) of the K-format super-block at b, with the roundings
 * of src/core/ggml_block.h (the CPU reference): (d · sc) · q − dmin · m,
 * or Q6_K's (d · sc) · q, each product rounded on its own (no FMA). */
template <int TYPE> __device__ __forceinline__ float qmm_kweight(const uint8_t *b, int e)
{
    if (TYPE == QMM_Q6_K)
        return __fmul_rn(__fmul_rn(kiln_ggml_f16_at(b + 208), (float)(int8_t)b[192 + e / 16]),
                         (float)kiln_ggml_q6k_value(b, e));
    const int j = e >> 5, l = e & 31;
    int sc, m;
    kiln_ggml_kscale(b + 4, j, &sc, &m);
    const float ds = __fmul_rn(kiln_ggml_f16_at(b), (float)sc), dm = __fmul_rn(kiln_ggml_f16_at(b + 2), (float)m);
    const uint8_t *qs = b + (TYPE == QMM_Q4_K ? 16 : 48) + 32 * (j >> 1);
    int q = (j & 1) ? qs[l] >> 4 : qs[l] & 0x0F;
    if (TYPE == QMM_Q5_K)
        q |= ((b[16 + l] >> j) & 1) << 4;
    return __fsub_rn(__fmul_rn(ds, (float)q), dm);
}

/* Weight kk of a row of blocks (any format). */
template <int TYPE> __device__ __forceinline__ float qmm_weight_at(const uint8_t *row, int64_t kk);

/* Weight j (0..31) of the block at b. */
template <int TYPE> __device__ __forceinline__ float qmm_weight(const uint8_t *b, int j)
{
    float d = kcu_f16_f32((uint16_t)(b[0] | b[1] << 8));
    if (TYPE == QMM_Q8_0)
        return __fmul_rn(d, (float)(int8_t)b[2 + j]);
    if (TYPE == QMM_Q4_0) {
        int q = j < 16 ? (b[2 + j] & 0x0F) : (b[2 + j - 16] >> 4);
        return __fmul_rn(d, (float)(q - 8));
    }
    float m = kcu_f16_f32((uint16_t)(b[2] | b[3] << 8));
    int q = j < 16 ? (b[4 + j] & 0x0F) : (b[4 + j - 16] >> 4);
    return __fadd_rn(__fmul_rn(d, (float)q), m);
}

template <int TYPE> __device__ __forceinline__ float qmm_weight_at(const uint8_t *row, int64_t kk)
{
    constexpr int BB = qmm_fmt<TYPE>::bytes, QV = qmm_fmt<TYPE>::values;
    if constexpr (QV == 256)
        return qmm_kweight<TYPE>(row + (kk / 256) * BB, (int)(kk % 256));
    else
        return qmm_weight<TYPE>(row + (kk / 32) * BB, (int)(kk % 32));
}

/* The 32 weights of the block at b. */
template <int TYPE> __device__ __forceinline__ void qmm_block(const uint8_t *b, float *w)
{
    float d = kcu_f16_f32((uint16_t)(b[0] | b[1] << 8));
    if (TYPE == QMM_Q8_0) {
#pragma unroll
        for (int j = 0; j < 32; j++)
            w[j] = __fmul_rn(d, (float)(int8_t)b[2 + j]);
    } else if (TYPE == QMM_Q4_0) {
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = __fmul_rn(d, (float)((b[2 + j] & 0x0F) - 8));
            w[j + 16] = __fmul_rn(d, (float)((b[2 + j] >> 4) - 8));
        }
    } else {
        float m = kcu_f16_f32((uint16_t)(b[2] | b[3] << 8));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = __fadd_rn(__fmul_rn(d, (float)(b[4 + j] & 0x0F)), m);
            w[j + 16] = __fadd_rn(__fmul_rn(d, (float)(b[4 + j] >> 4)), m);
        }
    }
}

/* The 32 values of x from element `off` (a multiple of 32) as f32: 16-byte
 * loads when x is 16-byte aligned (then so is every such run). */
template <int XT> __device__ __forceinline__ void qmm_load_x(const void *x, int64_t off, bool xvec, float *xv)
{
    if (!xvec) {
#pragma unroll
        for (int j = 0; j < 32; j++)
            xv[j] = kcu_load_float(x, XT, off + j);
    } else if (XT == KILN_DTYPE_F32) {
        const float4 *p = (const float4 *)((const float *)x + off);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 v = p[i];
            xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
        }
    } else {
        const uint4 *p = (const uint4 *)((const uint16_t *)x + off);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 v = p[i];
            const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                uint16_t lo = (uint16_t)(u[e] & 0xffffu), hi = (uint16_t)(u[e] >> 16);
                xv[8 * i + 2 * e] = XT == KILN_DTYPE_F16 ? kcu_f16_f32(lo) : kcu_bf16_f32(lo);
                xv[8 * i + 2 * e + 1] = XT == KILN_DTYPE_F16 ? kcu_f16_f32(hi) : kcu_bf16_f32(hi);
            }
        }
    }
}

template <int TYPE, int XT>
__global__ void __launch_bounds__(QMM_WARPS * 32)
    qmm_gemv_kernel(const void *x, const uint8_t *w, void *y, int64_t rows, int n, int k)
{
    KTL_SCOPE(0);
    constexpr int BB = qmm_fmt<TYPE>::bytes;
    __shared__ __align__(16) uint8_t stage[QMM_WARPS][QMM_COLS][32 * BB];
    __shared__ float part[QMM_WARPS][QMM_COLS][QMM_GROUP];
    kcu_after_prior(x, w, rows, n);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nb = k / 32;
    const size_t row_bytes = (size_t)nb * BB;
    const bool vec = row_bytes % 16 == 0 && (uintptr_t)w % 16 == 0, xvec = (uintptr_t)x % 16 == 0;
    for (int64_t c0 = (int64_t)blockIdx.x * QMM_COLS; c0 < n; c0 += (int64_t)gridDim.x * QMM_COLS) {
        const int ncols = n - c0 < QMM_COLS ? (int)(n - c0) : QMM_COLS;
        for (int64_t r0 = 0; r0 < rows; r0 += QMM_GROUP) {
            const int g = rows - r0 < QMM_GROUP ? (int)(rows - r0) : QMM_GROUP;
            float acc[QMM_COLS][QMM_GROUP] = {};
            /* split-K: warp i takes chunks i, i + QMM_WARPS, ... of 32 blocks */
            for (int b0 = warp * 32; b0 < nb; b0 += QMM_WARPS * 32) {
                const int nbk = nb - b0 < 32 ? nb - b0 : 32, bytes = nbk * BB;
                __syncwarp();
                for (int c = 0; c < ncols; c++) {
                    const uint8_t *src = w + (size_t)(c0 + c) * row_bytes + (size_t)b0 * BB;
                    if (vec)
                        for (int i = lane; i < bytes / 16; i += 32)
                            ((uint4 *)stage[warp][c])[i] = __ldg((const uint4 *)src + i);
                    else
                        for (int i = lane; i < bytes; i += 32)
                            stage[warp][c][i] = __ldg(src + i);
                }
                __syncwarp();
                if (lane >= nbk)
                    continue;
                const int64_t kb = (int64_t)(b0 + lane) * 32;
#pragma unroll
                for (int r = 0; r < QMM_GROUP; r++) {
                    if (r >= g)
                        break;
                    float xv[32];
                    qmm_load_x<XT>(x, (r0 + r) * k + kb, xvec, xv);
#pragma unroll
                    for (int c = 0; c < QMM_COLS; c++) {
                        if (c >= ncols)
                            break;
                        float wv[32];
                        qmm_block<TYPE>(stage[warp][c] + lane * BB, wv);
                        float s = 0.0f;
#pragma unroll
                        for (int j = 0; j < 32; j++)
                            s = fmaf(wv[j], xv[j], s);
                        acc[c][r] += s;
                    }
                }
            }
            /* lanes, then warps */
#pragma unroll
            for (int c = 0; c < QMM_COLS; c++)
#pragma unroll
                for (int r = 0; r < QMM_GROUP; r++) {
                    float s = kcu_warp_sum(acc[c][r]);
                    if (lane == 0)
                        part[warp][c][r] = s;
                }
            __syncthreads();
            if (threadIdx.x < QMM_COLS * QMM_GROUP) {
                const int c = threadIdx.x / QMM_GROUP, r = threadIdx.x % QMM_GROUP;
                float s = 0.0f;
                for (int i = 0; i < QMM_WARPS; i++)
                    s += part[i][c][r];
                if (c < ncols && r < g)
                    kcu_store_float(y, XT, (r0 + r) * n + c0 + c, s);
            }
            __syncthreads(); /* part is reused by the next group */
        }
    }
}

template <int TYPE, int XT>
__global__ void __launch_bounds__(256)
    qmm_tiled_kernel(const void *x, const uint8_t *w, void *y, int64_t rows, int n, int k)
{
    KTL_SCOPE(0);
    constexpr int BB = qmm_fmt<TYPE>::bytes, QV = qmm_fmt<TYPE>::values;
    __shared__ float xs[32][QMM_TILE + 4], ws[32][QMM_TILE + 4];
    kcu_after_prior(x, w, rows, n);
    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, nb = k / 32;
    const size_t row_bytes = (size_t)(k / QV) * BB;
    const int64_t tiles_n = (n + QMM_TILE - 1) / QMM_TILE, tiles = (rows + QMM_TILE - 1) / QMM_TILE * tiles_n;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const int64_t r0 = tile / tiles_n * QMM_TILE, c0 = tile % tiles_n * QMM_TILE;
        float acc[4][4] = {};
        for (int b = 0; b < nb; b++) {
            __syncthreads();
            for (int e = tid; e < 32 * QMM_TILE; e += 256) {
                int r = e / 32, kk = e % 32;
                xs[kk][r] = r0 + r < rows ? kcu_load_float(x, XT, (r0 + r) * k + (int64_t)b * 32 + kk) : 0.0f;
            }
            for (int e = tid; e < 32 * QMM_TILE; e += 256) {
                int c = e / 32, j = e % 32;
                ws[j][c] =
                    c0 + c < n ? qmm_weight_at<TYPE>(w + (size_t)(c0 + c) * row_bytes, (int64_t)b * 32 + j) : 0.0f;
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
                int64_t r = r0 + ty * 4 + i, c = c0 + tx * 4 + j;
                if (r < rows && c < n)
                    kcu_store_float(y, XT, r * n + c, acc[i][j]);
            }
    }
}

/* K formats, few rows of x: one warp per weight row, one super-block of
 * 256 values per step, lane l dequantizing values 8l .. 8l + 7 (inside one
 * sub-block) once for up to QMM_KROWS rows of x. A first kernel, not yet
 * tuned for bandwidth: the super-block's bytes are read by the warp
 * through L1 rather than staged with vector loads. */
#define QMM_KROWS 8
template <int TYPE, int XT>
__global__ void __launch_bounds__(128)
    qmm_kgemv_kernel(const void *x, const uint8_t *w, void *y, int64_t rows, int n, int k)
{
    KTL_SCOPE(0);
    constexpr int BB = qmm_fmt<TYPE>::bytes;
    kcu_after_prior(x, w, rows, n);
    const int lane = threadIdx.x & 31, nb = k / 256;
    for (int64_t c = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5); c < n; c += (int64_t)gridDim.x * 4) {
        const uint8_t *wr = w + c * (int64_t)nb * BB;
        for (int64_t r0 = 0; r0 < rows; r0 += QMM_KROWS) {
            const int g = rows - r0 < QMM_KROWS ? (int)(rows - r0) : QMM_KROWS;
            float acc[QMM_KROWS] = {};
            for (int ib = 0; ib < nb; ib++) {
                float wv[8];
#pragma unroll
                for (int t = 0; t < 8; t++)
                    wv[t] = qmm_kweight<TYPE>(wr + (int64_t)ib * BB, lane * 8 + t);
#pragma unroll
                for (int r = 0; r < QMM_KROWS; r++) {
                    if (r >= g)
                        break;
                    const int64_t off = (r0 + r) * k + (int64_t)ib * 256 + lane * 8;
#pragma unroll
                    for (int t = 0; t < 8; t++)
                        acc[r] = fmaf(wv[t], kcu_load_float(x, XT, off + t), acc[r]);
                }
            }
#pragma unroll
            for (int r = 0; r < QMM_KROWS; r++) {
                const float s = kcu_warp_sum(acc[r]);
                if (lane == 0 && r < g)
                    kcu_store_float(y, XT, (r0 + r) * n + c, s);
            }
        }
    }
}

template <int TYPE, int XT>
static cudaError_t qmm_launch(const void *x, const uint8_t *w, void *y, int64_t rows, int n, int k, cudaStream_t s)
{
    if constexpr (qmm_fmt<TYPE>::values == 256) {
        if (rows <= QMM_GEMV_MAX_ROWS) {
            int64_t want = (n + 3) / 4;
            return kcu_launch_cfg(qmm_kgemv_kernel<TYPE, XT>, dim3((unsigned)(want < 65535 ? want : 65535)), dim3(128),
                                  s, x, w, y, rows, n, k);
        }
    } else if (rows <= QMM_GEMV_MAX_ROWS) {
        int64_t want = (n + QMM_COLS - 1) / QMM_COLS;
        return kcu_launch_cfg(qmm_gemv_kernel<TYPE, XT>, dim3((unsigned)(want < 65535 ? want : 65535)),
                              dim3(QMM_WARPS * 32), s, x, w, y, rows, n, k);
    }
    int64_t tiles = (rows + QMM_TILE - 1) / QMM_TILE * ((n + QMM_TILE - 1) / QMM_TILE);
    return kcu_launch_cfg(qmm_tiled_kernel<TYPE, XT>, dim3((unsigned)(tiles < 65535 ? tiles : 65535)), dim3(256), s, x,
                          w, y, rows, n, k);
}

template <int TYPE>
static cudaError_t qmm_dispatch_x(int32_t dtype, const void *x, const uint8_t *w, void *y, int64_t rows, int n, int k,
                                  cudaStream_t s)
{
    switch (dtype) {
    case KILN_DTYPE_F16: return qmm_launch<TYPE, KILN_DTYPE_F16>(x, w, y, rows, n, k, s);
    case KILN_DTYPE_BF16: return qmm_launch<TYPE, KILN_DTYPE_BF16>(x, w, y, rows, n, k, s);
    default: return qmm_launch<TYPE, KILN_DTYPE_F32>(x, w, y, rows, n, k, s);
    }
}

extern "C" int kiln_qmatmul_cuda(int32_t type, const void *x, const uint8_t *w, void *y, int32_t dtype, int64_t rows,
                                 int32_t n, int32_t k, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (rows <= 0 || n <= 0)
        return 0;
    switch (type) {
    case QMM_Q8_0: return (int)qmm_dispatch_x<QMM_Q8_0>(dtype, x, w, y, rows, n, k, s);
    case QMM_Q4_0: return (int)qmm_dispatch_x<QMM_Q4_0>(dtype, x, w, y, rows, n, k, s);
    case QMM_Q4_K: return (int)qmm_dispatch_x<QMM_Q4_K>(dtype, x, w, y, rows, n, k, s);
    case QMM_Q5_K: return (int)qmm_dispatch_x<QMM_Q5_K>(dtype, x, w, y, rows, n, k, s);
    case QMM_Q6_K: return (int)qmm_dispatch_x<QMM_Q6_K>(dtype, x, w, y, rows, n, k, s);
    default: return (int)qmm_dispatch_x<QMM_Q4_1>(dtype, x, w, y, rows, n, k, s);
    }
}
