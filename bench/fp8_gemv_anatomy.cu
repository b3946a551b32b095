/* fp8_gemv_anatomy: where the FP8 decode GEMV (plugins/fp8/fp8_cuda.cu,
 * fp8_gemv_kernel: 0.77 of the copy floor at 28672x4096, 0.61 at
 * 4096x14336, where the bf16 GEMV reaches 0.93) loses its bandwidth.
 * Each variant streams the same E4M3 matrix W [n, k] once a launch and
 * does a part of the real kernel's work on it, so the steps between
 * variants say what each part costs (bench/README.md, nineteenth session,
 * has the forms tried whole):
 *
 *   rows-xor R U    fp8_gemv_kernel's layout: R rows a block, 4 warps each
 *                   a quarter of k, a lane 16 bytes a load (512 contiguous
 *                   bytes a warp load), U loads a lane and row in flight,
 *                   ld.global.nc.L1::no_allocate; the words are xor-ed, no
 *                   arithmetic: the layout's memory ceiling
 *   rows-fma R U    the same with E4M3 pairs → f16x2 → f32 and an f32
 *                   multiply-add a weight against x held in registers:
 *                   fp8_gemv_kernel's arithmetic without its x path
 *   rows-hfma2 R U  E4M3 pairs → f16x2 and one f16x2 multiply-add a pair
 *                   (x scaled by 2^-8 so no product overflows f16), the
 *                   f16 sums added to f32 every 16 weights
 *   ring-xor R U    rows-xor's loads through shared memory by cp.async.cg
 *                   (each lane its own 16-byte slots, no barrier)
 *   mma-xor S       the tensor cores' fragment layout: 16 rows a block,
 *                   lane (g, c) loads rows g and g + 8, 64 bytes of a row a
 *                   warp load, S loads a lane and row in flight; xor-ed
 *   mma S           the same through mma.sync m16n8k32 E4M3 against x's
 *                   codes held in registers
 *   fma 8 2 +PARTS  rows-fma 8 2 with fp8_gemv_kernel's other parts added
 *                   one at a time (rows_kernel's PARTS: x's codes from
 *                   global memory, the PDL launch and wait, the max |x|
 *                   prologue, the fused quantization of x), up to the
 *                   whole of the real kernel's work (the twentieth
 *                   session's question: which of them costs its 0.78 /
 *                   0.59 against rows-fma's 0.95 / 0.86)
 *   kernel fused    the plugin's own decode path (kiln_fp8_matmul_cuda, one
 *   kernel split    row of bf16 x, y in bf16) in this harness, by default
 *                   and with KILN_FP8_GEMV=split: the twenty-first
 *                   session's fullest PARTS row read 0.92 / 0.76 where
 *                   kiln_bench read the kernel at 0.79 / 0.60, so these
 *                   rows say whether the rest is in the kernel or in how
 *                   the two benches time it
 *
 * Time: a CUDA graph of 20 launches over 3 copies of W (more bytes than
 * the 50 MB L2), median of 7 replays; the floor is W's bytes at the
 * bandwidth of a 1 GiB device-to-device copy measured in the same run
 * (read + written bytes), as kiln_bench counts it.
 * Build: part of the CUDA build (bench/CMakeLists.txt). */
#include "backend/cuda/cuda_common.cuh"
#include "plugin_cuda.h"

#include <cuda_fp8.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call) \
    do { \
        cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) { \
            fprintf(stderr, "fp8_gemv_anatomy: %s: %s\n", #call, cudaGetErrorString(e_)); \
            exit(1); \
        } \
    } while (0)

namespace
{

constexpr int kWarps = 4;
constexpr int kCopies = 3, kLaunches = 20, kReplays = 7;

/* Each warp's per-row partial sums, summed over the block's warps into y. */
template <int R> __device__ __forceinline__ void finish(float (&acc)[R], float *y, int64_t row0, int n)
{
    __shared__ float part[kWarps][R];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const float v = kcu_warp_sum(acc[r]);
        if (lane == 0)
            part[wid][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < R && row0 + threadIdx.x < n)
        y[row0 + threadIdx.x] =
            part[0][threadIdx.x] + part[1][threadIdx.x] + part[2][threadIdx.x] + part[3][threadIdx.x];
}

enum { XOR, FMA, HFMA2 };

template <int MODE, int R>
__device__ __forceinline__ void consume(const uint4 &v, const float (&xf)[16], const __half2 (&xh)[8], float (&acc)[R],
                                        uint32_t (&h)[R], int r)
{
    if (MODE == XOR) {
        h[r] ^= v.x ^ v.y ^ v.z ^ v.w;
        return;
    }
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
    if (MODE == FMA) {
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                __half2_raw p = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[i] >> (16 * j)), __NV_E4M3);
                const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&p));
                acc[r] = fmaf(xf[4 * i + 2 * j], f.x, acc[r]);
                acc[r] = fmaf(xf[4 * i + 2 * j + 1], f.y, acc[r]);
            }
        return;
    }
    __half2 s = __float2half2_rn(0.0f);
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            __half2_raw p = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[i] >> (16 * j)), __NV_E4M3);
            s = __hfma2(*reinterpret_cast<const __half2 *>(&p), xh[2 * i + j], s);
        }
    const float2 f = __half22float2(s);
    acc[r] += f.x + f.y;
}

/* The real kernel's parts, added to rows-fma one at a time (PARTS):
 * XG     x's E4M3 codes loaded from global memory each step (k bytes, as
 *        fp8_gemv_kernel without FUSED reads them), not held in registers
 * PDL    launched with programmatic dependent launch, waiting after the
 *        first loads (griddepcontrol), as every kiln kernel is
 * PRO    the FUSED prologue: max |x| over a bf16 x of k elements by the
 *        block, then its E4M3 scale
 * XQ     the FUSED x path: 16 bf16 of x loaded each step, times the scale
 *        and rounded to E4M3 and back (needs PRO) */
enum { XG = 1, PDL = 2, PRO = 4, XQ = 8 };

/* 16 bf16 elements of x from element i (16-byte aligned) as floats. */
__device__ __forceinline__ void load_bf16x16(const void *x, int64_t i, float (&f)[16])
{
    const uint4 *p = reinterpret_cast<const uint4 *>((const __nv_bfloat16 *)x + i);
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const uint4 v = __ldg(p + j);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u[h]));
            f[8 * j + 2 * h] = g.x, f[8 * j + 2 * h + 1] = g.y;
        }
    }
}

/* x's 16 elements at kk for the products: from global codes (XG), from
 * bf16 quantized by inv (XQ), else the register copy. */
template <int PARTS>
__device__ __forceinline__ void x_step(const void *x, int64_t kk, float inv, const float (&reg)[16], float (&xf)[16])
{
    if (PARTS & XG) {
        const uint4 c = __ldg(reinterpret_cast<const uint4 *>((const uint8_t *)x + kk));
        const uint32_t u[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
        for (int e = 0; e < 8; e++) {
            __half2_raw p = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u[e / 2] >> (16 * (e & 1))), __NV_E4M3);
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&p));
            xf[2 * e] = f.x, xf[2 * e + 1] = f.y;
        }
    } else if (PARTS & XQ) {
        float f[16];
        load_bf16x16(x, kk, f);
#pragma unroll
        for (int e = 0; e < 16; e += 2) {
            const __nv_fp8x2_storage_t q = __nv_cvt_float2_to_fp8x2(
                make_float2(__fmul_rn(f[e], inv), __fmul_rn(f[e + 1], inv)), __NV_SATFINITE, __NV_E4M3);
            __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(q, __NV_E4M3);
            const float2 g = __half22float2(*reinterpret_cast<const __half2 *>(&hr));
            xf[e] = g.x, xf[e + 1] = g.y;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 16; e++)
            xf[e] = reg[e];
    }
}

template <int MODE, int R, int U, int PARTS = 0>
__global__ void __launch_bounds__(kWarps * 32) rows_kernel(const uint8_t *__restrict__ w, float *__restrict__ y, int n,
                                                           int k, float xs, const void *__restrict__ x)
{
    constexpr int E = 16, STEP = 32 * E;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t row0 = (int64_t)blockIdx.x * R;
    const int64_t kq = ((int64_t)k / E + kWarps - 1) / kWarps * E;
    const int64_t k0 = wid * kq, k1 = k0 + kq < k ? k0 + kq : k;
    const uint8_t *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        wr[r] = w + (row0 + r < n ? row0 + r : n - 1) * (int64_t)k;
    uint4 buf[U][R];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t kk = k0 + (int64_t)u * STEP + lane * E;
#pragma unroll
        for (int r = 0; r < R; r++)
            buf[u][r] = kk < k1 ? kcu_load_stream(wr[r] + kk) : make_uint4(0, 0, 0, 0);
    }
    if (PARTS & PDL) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    }
    float inv = 1.0f;
    if (PARTS & PRO) {
        __shared__ float red[kWarps];
        float a = 0.0f;
#pragma unroll 4
        for (int64_t j = (int64_t)threadIdx.x * 16; j < k; j += kWarps * 32 * 16) {
            float f[16];
            load_bf16x16(x, j, f);
#pragma unroll
            for (int e = 0; e < 16; e++)
                a = fmaxf(a, fabsf(f[e]));
        }
        for (int o = 16; o > 0; o >>= 1)
            a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        if (lane == 0)
            red[wid] = a;
        __syncthreads();
        a = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
        inv = a > 0.0f ? __fdiv_rn(448.0f, a) : 0.0f;
    }
    float xf[16];
    __half2 xh[8];
#pragma unroll
    for (int e = 0; e < 16; e++)
        xf[e] = xs * (float)(e + 1 + lane);
#pragma unroll
    for (int e = 0; e < 8; e++)
        xh[e] = __floats2half2_rn(xf[2 * e] * 0.00390625f, xf[2 * e + 1] * 0.00390625f);
    float acc[R];
    uint32_t h[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = 0.0f, h[r] = 0;
    for (int64_t base = k0; base < k1; base += (int64_t)U * STEP) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int64_t kk = base + (int64_t)u * STEP + lane * E;
            if (kk < k1) {
                float xs16[16];
                x_step<PARTS>(x, kk, inv, xf, xs16);
#pragma unroll
                for (int r = 0; r < R; r++)
                    consume<MODE, R>(buf[u][r], xs16, xh, acc, h, r);
            }
            const int64_t next = kk + (int64_t)U * STEP;
#pragma unroll
            for (int r = 0; r < R; r++)
                buf[u][r] = next < k1 ? kcu_load_stream(wr[r] + next) : make_uint4(0, 0, 0, 0);
        }
    }
    if (MODE == XOR)
#pragma unroll
        for (int r = 0; r < R; r++)
            acc[r] = (float)(h[r] & 0xffff);
    finish<R>(acc, y, row0, n);
}

__device__ __forceinline__ void cp16(void *smem, const void *gmem, bool valid)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(a), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}

template <int R, int U>
__global__ void __launch_bounds__(kWarps * 32)
    ring_kernel(const uint8_t *__restrict__ w, float *__restrict__ y, int n, int k)
{
    constexpr int E = 16, STEP = 32 * E;
    __shared__ __align__(16) uint4 ring[kWarps][U][R][32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t row0 = (int64_t)blockIdx.x * R;
    const int64_t kq = ((int64_t)k / E + kWarps - 1) / kWarps * E;
    const int64_t k0 = wid * kq, k1 = k0 + kq < k ? k0 + kq : k;
    const uint8_t *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        wr[r] = w + (row0 + r < n ? row0 + r : n - 1) * (int64_t)k;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t kk = k0 + (int64_t)u * STEP + lane * E;
#pragma unroll
        for (int r = 0; r < R; r++)
            cp16(&ring[wid][u][r][lane], wr[r] + (kk < k1 ? kk : 0), kk < k1);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
    uint32_t h[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        h[r] = 0;
    for (int64_t base = k0; base < k1; base += (int64_t)U * STEP) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            asm volatile("cp.async.wait_group %0;" ::"n"(U - 1) : "memory");
            const int64_t next = base + (int64_t)(u + U) * STEP + lane * E;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const uint4 v = ring[wid][u][r][lane];
                h[r] ^= v.x ^ v.y ^ v.z ^ v.w;
            }
#pragma unroll
            for (int r = 0; r < R; r++)
                cp16(&ring[wid][u][r][lane], wr[r] + (next < k1 ? next : 0), next < k1);
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        acc[r] = (float)(h[r] & 0xffff);
    finish<R>(acc, y, row0, n);
}

template <bool MMA, int S>
__global__ void __launch_bounds__(kWarps * 32)
    mma_kernel(const uint8_t *__restrict__ w, float *__restrict__ y, int n, int k, uint32_t xq)
{
    constexpr int E = 16, STAGE = 4 * E;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int64_t row0 = (int64_t)blockIdx.x * 16;
    const int64_t kq = ((int64_t)k / E + kWarps - 1) / kWarps * E;
    const int64_t k0 = wid * kq, k1 = k0 + kq < k ? k0 + kq : k;
    const uint8_t *wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
        wr[h] = w + (row0 + 8 * h + g < n ? row0 + 8 * h + g : n - 1) * (int64_t)k;
    uint4 buf[S][2];
#pragma unroll
    for (int u = 0; u < S; u++) {
        const int64_t kk = k0 + (int64_t)u * STAGE + c * E;
#pragma unroll
        for (int h = 0; h < 2; h++)
            buf[u][h] = kk < k1 ? kcu_load_stream(wr[h] + kk) : make_uint4(0, 0, 0, 0);
    }
    const uint32_t b = g == 0 ? xq ^ (uint32_t)lane : 0u; /* x's codes: one row of B */
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t hx = 0;
    for (int64_t base = k0; base < k1; base += (int64_t)S * STAGE) {
#pragma unroll
        for (int u = 0; u < S; u++) {
            const int64_t kk = base + (int64_t)u * STAGE + c * E;
            if (MMA) {
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
                asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
                             "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(buf[u][0].x), "r"(buf[u][1].x), "r"(buf[u][0].y), "r"(buf[u][1].y), "r"(b), "r"(b));
                asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
                             "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(buf[u][0].z), "r"(buf[u][1].z), "r"(buf[u][0].w), "r"(buf[u][1].w), "r"(b), "r"(b));
#endif
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[j] += d[j];
            } else {
                hx ^= buf[u][0].x ^ buf[u][0].y ^ buf[u][0].z ^ buf[u][0].w ^ buf[u][1].x ^ buf[u][1].y ^ buf[u][1].z ^
                      buf[u][1].w;
            }
            const int64_t next = kk + (int64_t)S * STAGE;
#pragma unroll
            for (int h = 0; h < 2; h++)
                buf[u][h] = next < k1 ? kcu_load_stream(wr[h] + next) : make_uint4(0, 0, 0, 0);
        }
    }
    float out[16];
#pragma unroll
    for (int r = 0; r < 16; r++)
        out[r] = r == g ? acc[0] + acc[1] + (float)(hx & 0xffff) : r == g + 8 ? acc[2] + acc[3] : 0.0f;
    finish<16>(out, y, row0, n);
}

/* Random E4M3 codes, none of them NaN (0x7f, 0xff). */
__global__ void fill_kernel(uint8_t *w, size_t bytes, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        uint8_t b = (uint8_t)h;
        w[i] = (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
    }
}

__global__ void fill_scale_kernel(float *p, int n, float v)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = v;
}

double copy_gbs(void)
{
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < 6; i++) {
        CHECK(cudaEventRecord(e0));
        CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (i && ms < best)
            best = ms;
    }
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    return 2.0 * (double)bytes / (best * 1e-3) / 1e9;
}

int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* One variant: kLaunches launches in a graph, over the copies of W in
 * turn; the median replay's time a launch, in us. */
template <typename F> float time_us(F launch, uint8_t *const *w)
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < kCopies; i++)
        launch(w[i], s);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kLaunches; i++)
        launch(w[i % kCopies], s);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float t[kReplays];
    CHECK(cudaGraphLaunch(ge, s));
    for (int i = 0; i < kReplays; i++) {
        CHECK(cudaEventRecord(e0, s));
        CHECK(cudaGraphLaunch(ge, s));
        CHECK(cudaEventRecord(e1, s));
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    qsort(t, kReplays, sizeof t[0], cmp_float);
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    CHECK(cudaStreamDestroy(s));
    return t[kReplays / 2] * 1000.0f / kLaunches;
}

} /* namespace */

int main(int argc, char **argv)
{
    if (argc > 1) {
        printf("usage: fp8_gemv_anatomy\n"
               "Times parts of the FP8 decode GEMV's work over an E4M3 matrix at the\n"
               "Llama-3.1-8B decode shapes (28672x4096, 4096x14336) against a device copy\n"
               "(bench/fp8_gemv_anatomy.cu says what each variant does). Needs a CUDA GPU\n"
               "of sm_89 or later.\n");
        return strcmp(argv[1], "--help") && strcmp(argv[1], "-h") ? 2 : 0;
    }
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count < 1) {
        printf("fp8_gemv_anatomy: skipped: no CUDA GPU is available\n");
        return 0;
    }
    const double copy = copy_gbs();
    printf("device copy %.0f GB/s\n%-22s %-12s %9s %9s %8s\n", copy, "variant", "shape", "us", "GB/s", "of copy");
    const int shapes[][2] = {{28672, 4096}, {4096, 14336}};
    float *y;
    CHECK(cudaMalloc(&y, 28672 * sizeof(float)));
    /* x for the PARTS rows: 14,336 bf16 values and as many E4M3 codes
     * (the fill skips the bytes that would make a NaN or an infinity of
     * either) */
    uint8_t *xb, *xc;
    CHECK(cudaMalloc(&xb, 14336 * 2));
    CHECK(cudaMalloc(&xc, 14336));
    fill_kernel<<<64, 256>>>(xc, 14336, 0x1234567u);
    fill_kernel<<<64, 256>>>(xb, 14336 * 2, 0x7654321u);
    for (const auto &sh : shapes) {
        const int n = sh[0], k = sh[1];
        const size_t bytes = (size_t)n * (size_t)k;
        uint8_t *w[kCopies];
        for (int i = 0; i < kCopies; i++) {
            CHECK(cudaMalloc(&w[i], bytes));
            fill_kernel<<<1024, 256>>>(w[i], bytes, 0x9e3779b9u * (uint32_t)(i + 1));
        }
        CHECK(cudaDeviceSynchronize());
        char shape[32];
        snprintf(shape, sizeof shape, "%dx%d", n, k);
        auto row = [&](const char *name, float us) {
            const double gbs = (double)bytes / (us * 1e-6) / 1e9;
            printf("%-22s %-12s %9.1f %9.0f %8.3f\n", name, shape, us, gbs, gbs / copy);
        };
#define ROWS(MODE, R, U, NAME) \
    row(NAME, time_us( \
                  [&](uint8_t *p, cudaStream_t s) { \
                      rows_kernel<MODE, R, U><<<(n + R - 1) / R, kWarps * 32, 0, s>>>(p, y, n, k, 0.001f, xb); \
                  }, \
                  w))
        ROWS(XOR, 8, 2, "rows-xor 8 2");
        ROWS(XOR, 2, 4, "rows-xor 2 4");
        ROWS(XOR, 4, 4, "rows-xor 4 4");
        ROWS(FMA, 8, 2, "rows-fma 8 2");
        ROWS(FMA, 2, 4, "rows-fma 2 4");
        ROWS(FMA, 4, 4, "rows-fma 4 4");
        ROWS(HFMA2, 8, 2, "rows-hfma2 8 2");
        ROWS(HFMA2, 2, 4, "rows-hfma2 2 4");
#undef ROWS
        /* rows-fma 8 2 with the real kernel's parts (rows_kernel's PARTS):
         * PDL launches go through kcu_launch_cfg as kiln's own do */
#define PARTS(P, NAME) \
    row(NAME, time_us( \
                  [&](uint8_t *p, cudaStream_t s) { \
                      const void *xp = ((P)&XG) ? (const void *)xc : (const void *)xb; \
                      if ((P)&PDL) \
                          CHECK(kcu_launch_cfg(rows_kernel<FMA, 8, 2, (P)>, dim3((unsigned)((n + 7) / 8)), \
                                               dim3(kWarps * 32), s, (const uint8_t *)p, y, n, k, 0.001f, xp)); \
                      else \
                          rows_kernel<FMA, 8, 2, (P)><<<(n + 7) / 8, kWarps * 32, 0, s>>>(p, y, n, k, 0.001f, xp); \
                  }, \
                  w))
        PARTS(XG, "fma 8 2 +xg");
        PARTS(PDL, "fma 8 2 +pdl");
        PARTS(PRO, "fma 8 2 +pro");
        PARTS(PRO | XQ, "fma 8 2 +pro+xq");
        PARTS(XG | PDL, "fma 8 2 +xg+pdl");
        PARTS(PRO | XQ | PDL, "fma 8 2 +pro+xq+pdl");
#undef PARTS
        /* the plugin's decode path itself, W's per-row scales 0.01 */
        {
            float *sw;
            void *ybf, *ws;
            const size_t wsz = kiln_fp8_workspace(1, n, k);
            CHECK(cudaMalloc(&sw, (size_t)n * sizeof(float)));
            CHECK(cudaMalloc(&ybf, (size_t)n * 2));
            CHECK(cudaMalloc(&ws, wsz));
            fill_scale_kernel<<<(n + 255) / 256, 256>>>(sw, n, 0.01f);
            CHECK(cudaGetLastError());
            for (int split = 0; split < 2; split++) {
                if (split)
                    setenv("KILN_FP8_GEMV", "split", 1);
                row(split ? "kernel split" : "kernel fused",
                    time_us(
                        [&](uint8_t *p, cudaStream_t s) {
                            const int e =
                                kiln_fp8_matmul_cuda(xb, p, sw, ybf, KILN_DTYPE_BF16, 1, n, k, 0.0f, ws, wsz, s);
                            if (e) {
                                fprintf(stderr, "fp8_gemv_anatomy: kiln_fp8_matmul_cuda: %s\n", kiln_fp8_cuda_error(e));
                                exit(1);
                            }
                        },
                        w));
                unsetenv("KILN_FP8_GEMV");
            }
            CHECK(cudaFree(sw));
            CHECK(cudaFree(ybf));
            CHECK(cudaFree(ws));
        }
        row("ring-xor 8 2",
            time_us(
                [&](uint8_t *p, cudaStream_t s) { ring_kernel<8, 2><<<(n + 7) / 8, kWarps * 32, 0, s>>>(p, y, n, k); },
                w));
        row("ring-xor 2 4",
            time_us(
                [&](uint8_t *p, cudaStream_t s) { ring_kernel<2, 4><<<(n + 1) / 2, kWarps * 32, 0, s>>>(p, y, n, k); },
                w));
#define MMA(ON, S, NAME) \
    row(NAME, time_us( \
                  [&](uint8_t *p, cudaStream_t s) { \
                      mma_kernel<ON, S><<<(n + 15) / 16, kWarps * 32, 0, s>>>(p, y, n, k, 0x38383838u); \
                  }, \
                  w))
        MMA(false, 4, "mma-xor 4");
        MMA(false, 8, "mma-xor 8");
        MMA(true, 4, "mma 4");
        MMA(true, 8, "mma 8");
#undef MMA
        for (int i = 0; i < kCopies; i++)
            CHECK(cudaFree(w[i]));
    }
    CHECK(cudaFree(y));
    CHECK(cudaFree(xb));
    CHECK(cudaFree(xc));
    return 0;
}
