/* WeightOnlyMatMul on CUDA: y = x · Wᵀ with W in int8 (w = s · q) or int4
 * (w = s · (q − z)), layouts in woq.c. Products accumulate in f32 and y is
 * rounded once to its dtype.
 *
 * Few rows of x (decode, rows <= KILN_WOQ_GEMV_MAX_ROWS), bf16 or f16 x, groups
 * that are multiples of a chunk (128 int4 or 64 int8 weights): a GEMV on
 * the tensor cores (woq_pipe_kernel; woq_tc_kernel, its predecessor, by
 * KILN_WOQ_GEMV=tc). At these shapes the matmul is one pass
 * over the weight bytes, and a GEMV that dequantizes and multiplies in f32
 * issues about 8 instructions a 4-bit weight in its loop (SASS), which
 * leaves it issue-bound far below the memory (0.23 of the copy floor on
 * the H200, bench/README.md).
 * Here a 4-bit value becomes a 16-bit float operand with a shift and one
 * LOP3 per two weights (placed into the mantissa of a power of two, so the
 * operand is exactly MAG + v), and one mma.m16n8k16 multiplies 16 weight
 * rows by 16 k by the 8 rows of x (B; rows past m repeat row 0 and are
 * not stored) with f32 accumulation: about 2.3 instructions a weight in
 * woq_tc_kernel's loop (SASS: 149 for a lane's chunk of 2 x 32 int4
 * weights), about 2 in woq_pipe_kernel's with 32 rows a warp (249 for 4 x
 * 32). The offset MAG and the zero point are taken out per chunk in f32
 * with Σ x, which a mma with ones for A gives (or, in woq_pipe_kernel's
 * tiles with a sum row, a row of zero weights, whose sums are MAG Σ x),
 * and the group's scale multiplies the chunk's sum. Precision: x keeps
 * its own 16 bits and the weight operands are exact, so every product is
 * exact and the sums are f32 (the tensor cores' adds); the one loss
 * against f32 arithmetic is that the partial sums carry MAG · Σ x (MAG
 * 128 for bf16, 64 for f16; 17 MAG + 128 for int8's two nibbles) until it
 * is subtracted, an absolute error of a few f32 ulps of MAG · Σ|x| per
 * chunk: about 1e-5 of y for random data, far below the rounding of y to
 * bf16 (2^-9) or f16 (2^-11). An infinite x gives NaN where the f32
 * reference may give an infinity.
 * What held woq_tc_kernel to 0.34-0.46 of the copy floor at the 8B int4
 * shapes, by this reasoning (not measured: no profile of it was taken),
 * is the bytes in flight: it held its next chunks in registers, 3 KB a
 * warp at 16 warps an SM, and ptxas issued each iteration's loads after
 * its products, so a warp waited on memory every chunk, and its blocks of
 * a few chunks a warp retired and started in several waves. At about 4.2
 * TB/s and an assumed 1-1.5 us of DRAM latency under load, the memory
 * needs 4-7 MB in flight (30-50 KB an SM) at every moment.
 * woq_pipe_kernel streams the weights through a ring in shared memory by
 * cp.async instead: 8 KB a warp always requested (up to 128 KB an SM, 8-17
 * MB on the GPU at the 8B shapes), and sizes its grid to one wave of the
 * blocks the GPU holds, so all of them request their first 8 KB before
 * the wait on the previous kernel and none waits for blocks to retire.
 * Its loop issues about 2 instructions a weight (0.12 a weight byte with
 * 32-row tiles): at 4.2 TB/s an SM takes 16 bytes a cycle, 2 of its 4
 * issue slots a cycle.
 *
 * Otherwise (f32 x, which 16-bit operands would round far past the f32
 * tolerance; groups that are not multiples of a chunk; or
 * KILN_WOQ_GEMV=f32): a GEMV in f32 built like the bf16 one
 * (src/backend/cuda/gemv.cu): each block owns ROWS weight rows, its warps
 * split k into contiguous parts, every lane reads 16 bytes of each row per
 * load (32 int4 or 16 int8 weights, always inside one group as groups are
 * multiples of 32) with kUnroll loads in flight. A quantized value becomes
 * a float by OR-ing it into the mantissa of 2^23 and subtracting 2^23 +
 * zero in one exact add (no integer-to-float conversion, which issues at a
 * quarter of the FMA rate); a 16-byte vector's products with x are summed
 * unscaled and multiplied by its group's scale once.
 *
 * Both GEMVs issue their first loads of the constant weights, scales and
 * zeros before the wait on the previous kernel (PDL).
 *
 * 9 to 32 rows with 16-bit x and the tensor-core GEMV's groups (batched
 * decode, short chunks): that GEMV over groups of 8 rows, each pass
 * reading the 0.5 (int4) or 1 (int8) bytes a weight again at about 0.45
 * of the copy bandwidth (bench/README.md), so about 1.1 (2.2) bytes a
 * weight at copy speed; the GEMM path below moves 4.5 bytes a weight for
 * int4 (0.5 read + 2 written + 2 read by the GEMM; int8 5) near copy
 * speed: 4 passes cost about as much (KILN_WOQ_LOOP_MAX_ROWS; kiln_bench's
 * rows at 32 and 33 show the hand-over).
 *
 * More rows (prefill), or f32 x past 8 rows: W is dequantized in slices
 * (all of it when its 16-bit copy fits in KILN_WOQ_SLICE_BYTES) into the
 * workspace in x's dtype, each weight the CPU's f32 value s · (q − z) or
 * s · q rounded once to bf16/f16 (f32 x: kept exactly), and cuBLASLt
 * multiplies each slice (FusedMatMul's GEMM, f32 accumulation) into its
 * columns of y (where it offers no kernel for the layout, the GEMV runs
 * over groups of 8 rows instead). The cost against the GEMM, at
 * Llama-3.1-8B's down projection (n 4096, k 14336, int4) and 2,048 rows
 * on the H200: the dequantization
 * moves 29 MB + 117 MB ≈ 147 MB, about 35 us at ~4.2 TB/s; the GEMM is
 * 2 · 2048 · 4096 · 14336 = 241 GFLOP, about 0.37 ms at ~650 TFLOP/s:
 * under 10 %. At 128 rows the GEMM (7.5 GFLOP) is bound by reading the
 * 117 MB copy instead, and the step costs about 4.5 bytes a weight:
 * ~0.07 ms, where the old tiled f32 kernel took milliseconds.
 * Precision: rounding w to bf16 (f16) is a relative error of at most
 * 2^-8 (2^-11) per product, uniform within that, so for products of
 * random signs ‖Δy‖ / ‖y‖ is at most about 2^-8 / √3 ≈ 2.3e-3 (2.8e-4):
 * the size of the rounding of y itself, and the rounding any bf16 (f16)
 * checkpoint's weights already carry. (Exact 16-bit operands would need
 * the scales out of the GEMM, i.e. a GEMM of our own.) */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


namespace
{

constexpr int kWarps = 4;
constexpr int kUnroll = 2;

/* Weights per 16-byte vector. */
template <int BITS> struct woq_vec {
    static constexpr int E = BITS == 4 ? 32 : 16;
    static constexpr int ROWS = BITS == 4 ? 4 : 2; /* weight rows per block */
};

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
    KTL_SCOPE(0);
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
            buf[u][r] = in ? kcu_load_stream(q + rr[r] * row_bytes + kk * BITS / 8) : make_uint4(0, 0, 0, 0);
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
                buf[u][r] = in ? kcu_load_stream(q + rr[r] * row_bytes + next * BITS / 8) : make_uint4(0, 0, 0, 0);
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

/* ---- the tensor-core GEMV (bf16 and f16 x) ---------------------------------------------- */

/* A warp owns 16 x RT weight rows; in mma.m16n8k16's fragments lane
 * 4g + t holds weight rows g and g + 8 of each 16 and x row g (a column
 * of B), and the k slots 2t, 2t + 1, 2t + 8, 2t + 9 of each mma. Which
 * physical k a slot stands for is free as long as A and B agree and it
 * depends on t alone: lane (g, t) takes the 16 bytes at t * 16 of the
 * chunk (4 lanes x 16 bytes = 64 bytes of each row: 128 int4 or 64 int8
 * weights) and the x values at the same k. */
static_assert(KILN_WOQ_GEMV_MAX_ROWS <= 8, "the x rows are the 8 columns of the mma");
constexpr int kTcMaxWarps = 16; /* warps of a block, splitting k */
constexpr int kTcTarget = 4096; /* warps a launch aims for (the k split grows until it has them) */
constexpr int kTcInFlight = 3;  /* chunks a lane has in flight with 16 rows a warp (2 with 32) */
constexpr int kTcPrefetch = 8;  /* chunks ahead of a load its L2 prefetch goes (KILN_WOQ_GEMV_PREFETCH) */

/* The value through an empty asm: the compiler keeps it in a register
 * instead of recomputing it at each use. */
__device__ __forceinline__ uint32_t woq_pin(uint32_t v)
{
    asm volatile("" : "+r"(v));
    return v;
}

template <typename P> __device__ __forceinline__ const P *woq_pin(const P *p)
{
    uint64_t v = (uint64_t)p;
    asm volatile("" : "+l"(v));
    return (const P *)v;
}

/* A lane's 16 bytes of a chunk, not kept in L1, with L2 fetching the
 * 256 bytes around them from memory: the warp's next 3 chunks of the row
 * (its run of k is contiguous). ptxas issues a loop iteration's loads at
 * its end, after all its mma (seen in the SASS, with or without register
 * pressure), so a warp waits a load latency each iteration: with the
 * 256-byte fetches and an L2 prefetch further ahead (woq_prefetch) most of
 * those loads hit L2. */
__device__ __forceinline__ uint4 woq_load_chunk(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* An L2 prefetch of a chunk further ahead: no register waits for it. */
__device__ __forceinline__ void woq_prefetch(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/* (a & b) ^ c in one LOP3: written as C, the compiler splits it in two
 * when b and c are both immediates. */
__device__ __forceinline__ uint32_t woq_and_xor(uint32_t a, uint32_t b, uint32_t c)
{
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* Dequantization into mma operands, per x dtype: a nibble v goes into the
 * mantissa of a 16-bit float whose exponent makes the nibble's last bit
 * worth 1, so the operand is exactly MAG + v with one LOP3 (mask, then
 * XOR with the magic: the magic's bits lie outside the mask, and an XOR
 * inside it flips the sign bit of int8's high nibble). Pair j of a 32-bit
 * word holds nibbles j and j + 4 (its low and high half). bf16: v at
 * mantissa bits 0-3 of 128.0. f16: v at bits 4-7 of 64.0 (bits 0-3 of
 * 1024.0 would work too, but a smaller MAG loses less in the offset
 * subtraction, see the header). */
template <int XT> struct woq_tc;
template <> struct woq_tc<KILN_DTYPE_BF16> {
    static constexpr float MAG = 128.0f;
    static constexpr uint32_t MAGIC = 0x43004300u, MASK = 0x000f000fu, FLIP = 0x00080008u, ONE = 0x3f803f80u;
    static __device__ __forceinline__ uint32_t pair(uint32_t w, int j, uint32_t mask, uint32_t c)
    {
        return woq_and_xor(w >> (4 * j), mask, c);
    }
    static __device__ __forceinline__ void mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
};
template <> struct woq_tc<KILN_DTYPE_F16> {
    static constexpr float MAG = 64.0f;
    static constexpr uint32_t MAGIC = 0x54005400u, MASK = 0x00f000f0u, FLIP = 0x00800080u, ONE = 0x3c003c00u;
    static __device__ __forceinline__ uint32_t pair(uint32_t w, int j, uint32_t mask, uint32_t c)
    {
        return woq_and_xor(j == 0 ? w << 4 : w >> (4 * j - 4), mask, c);
    }
    static __device__ __forceinline__ void mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
};

__device__ __forceinline__ uint32_t woq_word(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* The lane's x for a chunk: CK / 8 16-byte vectors at xc (4 for int4, 32
 * k; 2 for int8, 16 k). */
template <int BITS> struct woq_xvec {
    static constexpr int N = BITS == 4 ? 4 : 2;
};

template <int BITS> __device__ __forceinline__ void woq_load_xv(const uint4 *xc, uint4 (&xv)[woq_xvec<BITS>::N])
{
#pragma unroll
    for (int i = 0; i < woq_xvec<BITS>::N; i++)
        xv[i] = __ldg(xc + i);
}

/* One chunk of a warp's 16 x RT weight rows: w holds the lane's 16 bytes
 * of rows g and g + 8 of each 16, sc and of their group's scale and
 * offset (MAG + z; int8: 17 MAG + 128), xv the lane's x (woq_load_xv).
 * The chunk's sums, scaled once, go into acc as woq_tc_kernel's comment
 * derives. Σ x comes from a mma with ones for A, or (SUMROW) from the
 * warp's last row (row 15 of the last 16), whose weight bytes are zero:
 * its operands are all MAG, so its sums are MAG Σ x, exact to divide
 * (lanes 28-31 hold it; a shuffle brings it to the others), which saves
 * the mma with ones (2 of 6 mma a 16-row chunk). */
template <int XT, int BITS, int RT, bool SUMROW>
__device__ __forceinline__ void woq_tc_chunk(const uint4 (&w)[RT][2], const float (&sc)[RT][2],
                                             const float (&of)[RT][2], const uint4 (&xv)[woq_xvec<BITS>::N],
                                             uint32_t one, uint32_t mask, uint32_t lo, uint32_t hi, float (&acc)[RT][4])
{
    using T = woq_tc<XT>;
    float dz[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d[RT][4], dh[RT][4];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            d[rt][e] = dh[rt][e] = 0.0f;
    if (BITS == 4) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* x k 8i..8i+7 of the lane's 32; pairs (j, j + 4) as the nibbles */
            const uint4 v = xv[i];
            const uint32_t b0 = __byte_perm(v.x, v.z, 0x5410), b1 = __byte_perm(v.x, v.z, 0x7632);
            const uint32_t b2 = __byte_perm(v.y, v.w, 0x5410), b3 = __byte_perm(v.y, v.w, 0x7632);
            if (!SUMROW) {
                T::mma(dz, one, one, one, one, b0, b1);
                T::mma(dz, one, one, one, one, b2, b3);
            }
#pragma unroll
            for (int rt = 0; rt < RT; rt++) {
                const uint32_t wa = woq_word(w[rt][0], i), wb = woq_word(w[rt][1], i);
                T::mma(d[rt], T::pair(wa, 0, mask, lo), T::pair(wb, 0, mask, lo), T::pair(wa, 1, mask, lo),
                       T::pair(wb, 1, mask, lo), b0, b1);
                T::mma(d[rt], T::pair(wa, 2, mask, lo), T::pair(wb, 2, mask, lo), T::pair(wa, 3, mask, lo),
                       T::pair(wb, 3, mask, lo), b2, b3);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* x k 4i..4i+3 of the lane's 16; pairs (j, j + 2): nibble pairs 0 and 1 are
             * bytes 0 and 2 (low, high nibbles), pairs 2 and 3 bytes 1 and 3 */
            const uint4 v = xv[i / 2];
            const uint32_t xa = i & 1 ? v.z : v.x, xb = i & 1 ? v.w : v.y;
            const uint32_t b0 = __byte_perm(xa, xb, 0x5410), b1 = __byte_perm(xa, xb, 0x7632);
            if (!SUMROW)
                T::mma(dz, one, one, one, one, b0, b1);
#pragma unroll
            for (int rt = 0; rt < RT; rt++) {
                const uint32_t wa = woq_word(w[rt][0], i), wb = woq_word(w[rt][1], i);
                T::mma(d[rt], T::pair(wa, 0, mask, lo), T::pair(wb, 0, mask, lo), T::pair(wa, 2, mask, lo),
                       T::pair(wb, 2, mask, lo), b0, b1);
                T::mma(dh[rt], T::pair(wa, 1, mask, hi), T::pair(wb, 1, mask, hi), T::pair(wa, 3, mask, hi),
                       T::pair(wb, 3, mask, hi), b0, b1);
            }
        }
    }
    /* d: rows g (e 0, 1) and g + 8 (e 2, 3), x rows 2t + (e & 1); the sum
     * row is row 15 of d[RT - 1] (its low nibbles for int8: MAG + 0), held
     * by lane 28 + t as e 2 and 3 */
    if (SUMROW) {
        const int src = 28 + (int)(threadIdx.x & 3);
        dz[0] = __shfl_sync(0xffffffffu, d[RT - 1][2], src) * (1.0f / T::MAG);
        dz[1] = __shfl_sync(0xffffffffu, d[RT - 1][3], src) * (1.0f / T::MAG);
    }
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float v = BITS == 4 ? d[rt][e] : fmaf(16.0f, dh[rt][e], d[rt][e]);
            acc[rt][e] = fmaf(sc[rt][e >> 1], fmaf(-of[rt][e >> 1], dz[e & 1], v), acc[rt][e]);
        }
}

/* One block: 16 x RT weight rows (blockIdx.x) for the m <= 8 rows of x;
 * its warps split the chunks of k into contiguous runs and add up in
 * shared memory. Each chunk lies in one group (group % chunk == 0, checked
 * by the launcher), so its sums are scaled once: per chunk the mma sums
 * D = Σ (MAG + v) x over the unscaled operands, and a mma with ones for A
 * gives S = Σ x of the same k, shared by every row. Then
 *   int4: Σ (q − z) x = D − (MAG + z) S
 *   int8: q = 16 (h ^ 8) + l − 128 for the nibbles h, l of its byte, so
 *         Σ q x = 16 D_h + D_l − (17 MAG + 128) S,
 * in f32, times the group's scale. The first chunks of the
 * constant weights, scales and zeros are loaded before the PDL wait. */
template <int XT, int BITS, int RT>
__global__ void __launch_bounds__(kTcMaxWarps * 32)
    woq_tc_kernel(const void *__restrict__ x, const uint8_t *__restrict__ q, const float *__restrict__ scales,
                  const uint8_t *__restrict__ zeros, void *__restrict__ y, int32_t m, int32_t n, int32_t k,
                  int32_t group, int32_t pf)
{
    KTL_SCOPE(0);
    using T = woq_tc<XT>;
    constexpr int CK = BITS == 4 ? 128 : 64, U = RT == 1 ? kTcInFlight : 2;
    __shared__ float part[kTcMaxWarps][RT * 4][32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int64_t row_bytes = (int64_t)k * BITS / 8, ng = k / group, row0 = (int64_t)blockIdx.x * 16 * RT;
    const int nch = k / CK, cpw = (nch + warps - 1) / warps;
    const int c0 = wid * cpw < nch ? wid * cpw : nch, c1 = c0 + cpw < nch ? c0 + cpw : nch;

    /* rows past n read the last row: loaded, never stored. The pointers and
     * constants the loop uses are pinned (woq_pin): left to itself, the
     * compiler recomputed them at every chunk, a third of the loop's
     * instructions. */
    const uint8_t *qr[RT][2], *zr[RT][2];
    const float *sr[RT][2];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = row0 + 16 * rt + 8 * h + g < n ? row0 + 16 * rt + 8 * h + g : n - 1;
            qr[rt][h] = woq_pin(q + row * row_bytes + t * 16);
            sr[rt][h] = woq_pin(scales + row * ng);
            zr[rt][h] = BITS == 4 ? woq_pin(zeros + row * ng) : zeros; /* int8 has none */
        }
    const uint32_t one = woq_pin(T::ONE), mask = woq_pin(T::MASK), lo = woq_pin(T::MAGIC),
                   hi = woq_pin(T::MAGIC ^ T::FLIP);
    uint4 buf[U][RT][2];
    float sb[U][RT][2], ob[U][RT][2]; /* the chunk's scale and offset (MAG + z; int8: 17 MAG + 128) */
    const float off8 = 17.0f * T::MAG + 128.0f;
    /* chunks are loaded in order, c0, c0 + 1, ...: the group of the next one
     * is counted along instead of divided out at each load */
    const int cpg = group / CK;
    int gl = c0 / cpg, rl = c0 - gl * cpg;
    /* with each chunk's loads, an L2 prefetch of the chunk pf ahead (the
     * run's last one near its end) */
    auto load = [&](int u, int c, bool valid) {
        if (valid) {
            const uint32_t ahead = (uint32_t)(c + pf < c1 ? c + pf : c1 - 1) * 64u;
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    buf[u][rt][h] = woq_load_chunk(qr[rt][h] + (uint32_t)c * 64u);
                    if (pf > 0)
                        woq_prefetch(qr[rt][h] + ahead);
                    sb[u][rt][h] = __ldg(sr[rt][h] + gl);
                    ob[u][rt][h] = BITS == 4 ? T::MAG + (float)__ldg(zr[rt][h] + gl) : off8;
                }
        }
        if (++rl == cpg) {
            rl = 0;
            gl++;
        }
    };
#pragma unroll
    for (int u = 0; u < U; u++)
        load(u, c0 + u, c0 + u < c1);
    kcu_after_prior(x, y, k, n);

    /* lanes whose x row is past m read row 0 (no branch, no masking): their
     * columns of the products are not stored */
    const uint4 *xr =
        woq_pin(reinterpret_cast<const uint4 *>((const uint16_t *)x + (int64_t)(g < m ? g : 0) * k + t * (CK / 4)));
    float acc[RT][4];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[rt][e] = 0.0f;
    auto process = [&](int u, int c) {
        uint4 xv[woq_xvec<BITS>::N];
        woq_load_xv<BITS>(xr + (uint32_t)c * (CK / 8), xv);
        woq_tc_chunk<XT, BITS, RT, false>(buf[u], sb[u], ob[u], xv, one, mask, lo, hi, acc);
    };
    /* each slot is refilled with the chunk U ahead once used: no tests
     * while that chunk is inside the warp's run, then a tail with them */
    int c = c0;
    for (; c + 2 * U <= c1; c += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            process(u, c + u);
            load(u, c + U + u, true);
        }
    }
    for (; c < c1; c += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c + u < c1)
                process(u, c + u);
            load(u, c + U + u, c + U + u < c1);
        }
    }

#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            part[wid][rt * 4 + e][lane] = acc[rt][e];
    __syncthreads();
    for (int i = threadIdx.x; i < RT * 4 * 32; i += blockDim.x) {
        const int l = i & 31, j = i >> 5, e = j & 3;
        const int col = 2 * (l & 3) + (e & 1);
        const int64_t row = row0 + 16 * (j >> 2) + (l >> 2) + 8 * (e >> 1);
        if (col < m && row < n) {
            float v = 0.0f;
            for (int w = 0; w < warps; w++)
                v += part[w][j][l];
            kcu_store_float(y, XT, (int64_t)col * n + row, v);
        }
    }
}

/* ---- the pipelined tensor-core GEMV (the default) ------------------------------------------- */

/* A warp's weight chunks in flight: kPipeStages 16-row chunks with 16 rows
 * a warp, half as many 32-row ones (8 KB a warp either way). */
constexpr int kPipeStages = 8;
constexpr int kPipeMaxSplit = 16; /* warps of a block, splitting k */

/* 16 bytes from global to shared memory without a register (cp.async,
 * not kept in L1), with L2 fetching the 256 bytes around them: the
 * warp's next chunks of the row. */
__device__ __forceinline__ void woq_cp16(void *smem, const void *src)
{
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(smem)),
                 "l"(src)
                 : "memory");
}

__device__ __forceinline__ void woq_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/* Until at most N of the thread's cp.async groups are still in flight. */
template <int N> __device__ __forceinline__ void woq_cp_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* woq_tc_kernel's arithmetic (woq_tc_chunk) with the weights streamed
 * through shared memory: each lane copies its own 16 bytes of rows g and
 * g + 8 of a chunk into a ring of S stages (cp.async; it alone reads them
 * back, so no barrier), so a warp keeps S chunks (8 KB) in flight without
 * holding them in registers, and the next load never waits for ptxas's
 * placement of loads after the products (woq_tc_kernel's stall). The
 * group's scale and offset ride in registers beside each stage. A block
 * is `split` warps over one tile of 16 x RT weight rows, or (SR) 16 x RT
 * - 1 and woq_tc_chunk's sum row (zeros in its ring slots, never loaded
 * or stored), each a contiguous run of its chunks; the launcher
 * picks split so that the grid fits the GPU in one wave where it can:
 * every warp's first S chunks are requested before the wait on the
 * previous kernel, and no warp waits for a block to retire. A chunk's x
 * is requested before the wait for its weights. Dynamic shared memory:
 * split x S x RT KB of ring, then (split > 1) the warps' partial sums. */
template <int XT, int BITS, int RT, bool SR>
__global__ void __launch_bounds__(kPipeMaxSplit * 32, 1)
    woq_pipe_kernel(const void *__restrict__ x, const uint8_t *__restrict__ q, const float *__restrict__ scales,
                    const uint8_t *__restrict__ zeros, void *__restrict__ y, int32_t m, int32_t n, int32_t k,
                    int32_t group)
{
    KTL_SCOPE(0);
    using T = woq_tc<XT>;
    constexpr int CK = BITS == 4 ? 128 : 64, S = kPipeStages / RT, RR = 16 * RT - SR; /* rows a tile */
    extern __shared__ uint4 woq_smem[];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int64_t row_bytes = (int64_t)k * BITS / 8, ng = k / group, row0 = (int64_t)blockIdx.x * RR;
    const int nch = k / CK, cpw = (nch + warps - 1) / warps;
    const int c0 = wid * cpw < nch ? wid * cpw : nch, c1 = c0 + cpw < nch ? c0 + cpw : nch;
    /* stage u, row half (rt, h): 32 lanes x 16 bytes; the sum row's slots
     * (lanes 28-31 of the last half) hold zeros throughout */
    uint4 *ring = woq_smem + (size_t)wid * S * RT * 2 * 32 + lane;
    const bool sum_lane = SR && g == 7;
    if (sum_lane)
#pragma unroll
        for (int u = 0; u < S; u++)
            ring[((u * RT + RT - 1) * 2 + 1) * 32] = make_uint4(0, 0, 0, 0);

    const uint8_t *qr[RT][2], *zr[RT][2];
    const float *sr[RT][2];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            /* rows past n (and the sum row's scales) read the last row:
             * loaded, never stored */
            const int64_t row = row0 + 16 * rt + 8 * h + g < n ? row0 + 16 * rt + 8 * h + g : n - 1;
            qr[rt][h] = woq_pin(q + row * row_bytes + t * 16);
            sr[rt][h] = woq_pin(scales + row * ng);
            zr[rt][h] = BITS == 4 ? woq_pin(zeros + row * ng) : zeros; /* int8 has none */
        }
    const uint32_t mask = woq_pin(T::MASK), lo = woq_pin(T::MAGIC), hi = woq_pin(T::MAGIC ^ T::FLIP),
                   one = SR ? 0u : woq_pin(T::ONE);
    float sb[S][RT][2], ob[S][RT][2];
    const float off8 = 17.0f * T::MAG + 128.0f;
    /* chunks are requested in order: the group of the next one is counted
     * along instead of divided out */
    const int cpg = group / CK;
    int gl = c0 / cpg, rl = c0 - gl * cpg;
    /* chunk c into stage u with its scales and offsets; one cp.async group
     * a call, empty past the run, so that wait_group<S - 1> always means
     * "the oldest requested chunk has landed" */
    auto request = [&](int u, int c) {
        if (c < c1) {
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if (rt < RT - 1 || h == 0 || !sum_lane)
                        woq_cp16(ring + ((u * RT + rt) * 2 + h) * 32, qr[rt][h] + (int64_t)c * 64);
                    sb[u][rt][h] = __ldg(sr[rt][h] + gl);
                    ob[u][rt][h] = BITS == 4 ? T::MAG + (float)__ldg(zr[rt][h] + gl) : off8;
                }
        }
        woq_cp_commit();
        if (++rl == cpg) {
            rl = 0;
            gl++;
        }
    };
#pragma unroll
    for (int u = 0; u < S; u++)
        request(u, c0 + u);
    kcu_after_prior(x, y, k, n);

    /* lanes whose x row is past m read row 0 (the same 64 bytes as its own
     * lanes: no more L1 traffic than skipping it); their columns of the
     * products are not stored */
    const uint4 *xr =
        woq_pin(reinterpret_cast<const uint4 *>((const uint16_t *)x + (int64_t)(g < m ? g : 0) * k + t * (CK / 4)));
    float acc[RT][4];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[rt][e] = 0.0f;
    for (int c = c0; c < c1; c += S) {
#pragma unroll
        for (int u = 0; u < S; u++) {
            if (c + u < c1) {
                uint4 xv[woq_xvec<BITS>::N], w[RT][2];
                woq_load_xv<BITS>(xr + (int64_t)(c + u) * (CK / 8), xv);
                woq_cp_wait<S - 1>();
#pragma unroll
                for (int rt = 0; rt < RT; rt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        w[rt][h] = ring[((u * RT + rt) * 2 + h) * 32];
                woq_tc_chunk<XT, BITS, RT, SR>(w, sb[u], ob[u], xv, one, mask, lo, hi, acc);
                /* the stage is free: its bytes went into the products above */
                request(u, c + u + S);
            }
        }
    }

    /* d's layout: lane (g, t) holds rows g (e 0, 1) and g + 8 (e 2, 3) of
     * each 16, x rows 2t + (e & 1); row RR is the sum row (SR) */
    if (warps == 1) {
#pragma unroll
        for (int rt = 0; rt < RT; rt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = 2 * t + (e & 1), r = 16 * rt + g + 8 * (e >> 1);
                if (col < m && r < RR && row0 + r < n)
                    kcu_store_float(y, XT, (int64_t)col * n + row0 + r, acc[rt][e]);
            }
        return;
    }
    float *part = reinterpret_cast<float *>(woq_smem + (size_t)warps * S * RT * 2 * 32);
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            part[(wid * RT * 4 + rt * 4 + e) * 32 + lane] = acc[rt][e];
    __syncthreads();
    for (int i = threadIdx.x; i < RT * 4 * 32; i += blockDim.x) {
        const int l = i & 31, j = i >> 5, e = j & 3;
        const int col = 2 * (l & 3) + (e & 1), r = 16 * (j >> 2) + (l >> 2) + 8 * (e >> 1);
        if (col < m && r < RR && row0 + r < n) {
            float v = 0.0f;
            for (int w = 0; w < warps; w++)
                v += part[(w * RT * 4 + j) * 32 + l];
            kcu_store_float(y, XT, (int64_t)col * n + row0 + r, v);
        }
    }
}

/* The prefill path's dequantization: weight rows [0, vecs / (k / E)) of
 * q into w, [rows, k] of OT. A warp takes 32 consecutive 16-byte vectors
 * of q (E weights each, inside one group) per step of a grid-stride loop,
 * one a lane; each weight is the CPU's f32 value, s · (q − z) or s · q in
 * one rounded multiply of exact operands (woq_unpack), then rounded to OT
 * once (to nearest even; f32: kept). A lane's E outputs are contiguous
 * (32 to 128 bytes), so stored directly each 16-byte store of the warp
 * would cover every other half of 32 sectors: they go through shared
 * memory and leave as 16-byte stores of consecutive lanes, whole sectors.
 * The wait on the previous kernel comes first: it may still read the
 * workspace this writes (the previous layer's GEMM). */
template <int OT, int BITS>
__global__ void __launch_bounds__(256)
    woq_dequant_kernel(const uint8_t *__restrict__ q, const float *__restrict__ scales,
                       const uint8_t *__restrict__ zeros, void *__restrict__ w, int64_t vecs, int32_t k, int32_t group)
{
    KTL_SCOPE(0);
    constexpr int E = woq_vec<BITS>::E, CPV = E * (OT == KILN_DTYPE_F32 ? 4 : 2) / 16; /* 16-byte outputs a vector */
    __shared__ uint4 stage[8][32 * CPV];
    kcu_after_prior(q, w, vecs, k);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int64_t vpr = k / E, ng = k / group;
    const float zbase = BITS == 4 ? 8388608.0f : 8388736.0f; /* as the GEMV's */
    uint4 *st = stage[wid], *out = reinterpret_cast<uint4 *>(w);
    for (int64_t base = ((int64_t)blockIdx.x * 8 + wid) * 32; base < vecs; base += (int64_t)gridDim.x * 256) {
        const int64_t v = base + lane;
        if (v < vecs) {
            const int64_t r = v / vpr, g = r * ng + (v - r * vpr) * E / group;
            const uint4 b = kcu_load_stream(q + v * 16);
            float f[E];
            woq_unpack<BITS>(b, zbase + (BITS == 4 ? (float)__ldg(zeros + g) : 0.0f), f);
            const float sc = __ldg(scales + g);
            uint32_t h[CPV * 4];
#pragma unroll
            for (int e = 0; e < E; e++)
                f[e] = __fmul_rn(sc, f[e]);
#pragma unroll
            for (int i = 0; i < CPV * 4; i++) {
                if constexpr (OT == KILN_DTYPE_F32) {
                    h[i] = __float_as_uint(f[i]);
                } else if constexpr (OT == KILN_DTYPE_BF16) {
                    const __nv_bfloat162 p = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
                    h[i] = *reinterpret_cast<const uint32_t *>(&p);
                } else {
                    const __half2 p = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
                    h[i] = *reinterpret_cast<const uint32_t *>(&p);
                }
            }
#pragma unroll
            for (int c = 0; c < CPV; c++)
                st[lane * CPV + c] = make_uint4(h[4 * c], h[4 * c + 1], h[4 * c + 2], h[4 * c + 3]);
        }
        __syncwarp();
        const int64_t chunks = (vecs - base < 32 ? vecs - base : 32) * CPV;
#pragma unroll
        for (int c = lane; c < 32 * CPV; c += 32)
            if (c < chunks)
                out[base * CPV + c] = st[c];
        __syncwarp();
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

/* KILN_WOQ_GEMV selects the GEMV for rows <= KILN_WOQ_GEMV_MAX_ROWS, for timing
 * them in one run and testing each: "f32" the f32 one for every x dtype;
 * "tc16", "tc32" the older tensor-core one (woq_tc_kernel) with that many
 * rows a warp, "tc" with its own choice; "pipe16", "pipe32" the pipelined
 * one (woq_pipe_kernel) with that many rows a warp; else (unset) the
 * pipelined one with its choice of rows. KILN_WOQ_GEMV_SPLIT (1 to 16)
 * sets either tensor-core one's warps a block (its k split),
 * KILN_WOQ_GEMV_SUMROW (0 or 1) whether the pipelined one's tiles carry
 * the sum row (woq_pipe_launch),
 * KILN_WOQ_GEMV_PREFETCH the older one's L2 prefetch distance in chunks
 * (0: none, at most 64). Read at each launch (a graph keeps what its
 * capture chose). */
enum { WOQ_F32 = -1, WOQ_PIPE = 0, WOQ_TC = 1 };
static int woq_gemv_choice(int *rt)
{
    const char *e = getenv("KILN_WOQ_GEMV");
    *rt = 0;
    if (!e)
        return WOQ_PIPE;
    if (!strcmp(e, "f32"))
        return WOQ_F32;
    const int tc = !strncmp(e, "tc", 2);
    const char *rows = e + (tc ? 2 : !strncmp(e, "pipe", 4) ? 4 : 0);
    *rt = !strcmp(rows, "16") ? 1 : !strcmp(rows, "32") ? 2 : 0;
    return tc ? WOQ_TC : WOQ_PIPE;
}

/* The pipelined GEMV's dynamic shared memory for a block of `warps`
 * warps: their rings, and their partial sums where they split k. */
static size_t woq_pipe_smem(int warps, int rt)
{
    return (size_t)warps * kPipeStages * 1024 + (warps > 1 ? (size_t)warps * (size_t)rt * 512 : 0);
}

constexpr int kPipeMaxDevices = 16;

/* How many blocks of 1 to kPipeMaxSplit warps of a pipelined kernel one
 * SM holds at once (bps[warps]), and the SMs. */
struct woq_pipe_occ {
    int sms;
    int bps[kPipeMaxSplit + 1];
};

/* woq_pipe_occ of woq_pipe_kernel<XT, BITS, RT, SR> on the current device,
 * found once a device (the first call also lets the kernel use shared
 * memory past the default 48 KB); sms 0 and *err set on failure. */
template <int XT, int BITS, int RT, bool SR> static woq_pipe_occ woq_pipe_occupancy(cudaError_t *err)
{
    static woq_pipe_occ known[kPipeMaxDevices];
    woq_pipe_occ o = {};
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess && dev >= 0 && dev < kPipeMaxDevices && known[dev].sms > 0)
        return known[dev];
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(woq_pipe_kernel<XT, BITS, RT, SR>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)woq_pipe_smem(kPipeMaxSplit, RT));
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&o.sms, cudaDevAttrMultiProcessorCount, dev);
    for (int w = 1; w <= kPipeMaxSplit && e == cudaSuccess; w++)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o.bps[w], woq_pipe_kernel<XT, BITS, RT, SR>, w * 32,
                                                          woq_pipe_smem(w, RT));
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* reported through *err, not to the next launch's check */
        *err = e;
        return woq_pipe_occ{};
    }
    if (dev >= 0 && dev < kPipeMaxDevices)
        known[dev] = o;
    return o;
}

/* The k split of `tiles` blocks over nch chunks: the most warps a block
 * (at most kPipeMaxSplit, each with 2 chunks or more) with which every
 * block is resident at once, then as few as give the same run length
 * (1 where even single warps take more than one wave). */
static int woq_pipe_split(const woq_pipe_occ &o, int64_t tiles, int64_t nch)
{
    int64_t split = 1;
    for (int w = 2; w <= kPipeMaxSplit && w <= nch / 2; w++)
        if (tiles <= (int64_t)o.bps[w] * o.sms)
            split = w;
    const int64_t cpw = (nch + split - 1) / split;
    return (int)((nch + cpw - 1) / cpw);
}

/* Warps resident at once with `split` warps a block over `tiles` blocks. */
static int64_t woq_pipe_warps(const woq_pipe_occ &o, int64_t tiles, int split)
{
    const int64_t fit = (int64_t)o.bps[split] * o.sms;
    return (tiles < fit ? tiles : fit) * split;
}

template <int XT, int BITS, int RT, bool SR>
cudaError_t woq_pipe_run(const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y, int32_t m,
                         int32_t n, int32_t k, int32_t group, int64_t tiles, int split, cudaStream_t s)
{
    return kcu_launch_smem(woq_pipe_kernel<XT, BITS, RT, SR>, dim3((unsigned)tiles), dim3((unsigned)split * 32),
                           woq_pipe_smem(split, RT), s, x, q, scales, zeros, y, m, n, k, group);
}

/* The pipelined GEMV with its tile and k split (woq_pipe_split): one
 * wave of blocks, so that every warp's first loads are requested at its
 * start and none waits for a block to retire (a block of a second wave
 * would stream its tile alone after the first: the launch's time twice
 * over). 32 rows a warp issue about 4/5 of the instructions a weight byte
 * of 16 (half the x loads, byte permutes and Σ x a weight; SASS: 249
 * against 156 a 16-row chunk for int4), so 16 are taken only where they
 * give twice the warps (bytes in flight) or more. The sum row (SR) saves
 * a third of the mma, but where its extra tiles cost warps (n 4096: 133
 * tiles of 31 rows fit one 8-warp block an SM, 128 of 32 one of 16) the
 * tile is whole; KILN_WOQ_GEMV_SUMROW=0 or 1 forces it. On an H200 (132
 * SMs): int4 28672 x 4096 is 925 tiles of 31 rows x 2 warps of 16
 * chunks, 6144 x 4096 199 x 8 warps of 4, 4096 x 14336 128 tiles of 32
 * rows x 16 warps of 7. */
template <int XT, int BITS, bool SR>
cudaError_t woq_pipe_rt(const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y, int32_t m,
                        int32_t n, int32_t k, int32_t group, int rt, int64_t tiles, int split, cudaStream_t s)
{
    if (rt == 2)
        return woq_pipe_run<XT, BITS, 2, SR>(x, q, scales, zeros, y, m, n, k, group, tiles, split, s);
    return woq_pipe_run<XT, BITS, 1, SR>(x, q, scales, zeros, y, m, n, k, group, tiles, split, s);
}

template <int XT, int BITS>
cudaError_t woq_pipe_launch(const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y,
                            int32_t m, int32_t n, int32_t k, int32_t group, int rt, cudaStream_t s)
{
    constexpr int CK = BITS == 4 ? 128 : 64;
    cudaError_t e = cudaSuccess;
    /* [16- or 32-row tiles][without, with the sum row] */
    const woq_pipe_occ occ[2][2] = {
        {woq_pipe_occupancy<XT, BITS, 1, false>(&e), woq_pipe_occupancy<XT, BITS, 1, true>(&e)},
        {woq_pipe_occupancy<XT, BITS, 2, false>(&e), woq_pipe_occupancy<XT, BITS, 2, true>(&e)}};
    if (e != cudaSuccess)
        return e;
    const int64_t nch = k / CK;
    int64_t tiles[2][2], warps[2][2];
    int split[2][2];
    for (int r = 0; r < 2; r++)
        for (int sr = 0; sr < 2; sr++) {
            const int64_t rows = 16 * (r + 1) - sr;
            tiles[r][sr] = ((int64_t)n + rows - 1) / rows;
            split[r][sr] = woq_pipe_split(occ[r][sr], tiles[r][sr], nch);
            warps[r][sr] = woq_pipe_warps(occ[r][sr], tiles[r][sr], split[r][sr]);
        }
    const char *env_sr = getenv("KILN_WOQ_GEMV_SUMROW"), *env_split = getenv("KILN_WOQ_GEMV_SPLIT");
    int sr1 = warps[0][1] >= warps[0][0], sr2 = warps[1][1] >= warps[1][0];
    if (env_sr && (!strcmp(env_sr, "0") || !strcmp(env_sr, "1")))
        sr1 = sr2 = env_sr[0] == '1';
    if (rt == 0)
        rt = warps[0][sr1] >= 2 * warps[1][sr2] ? 1 : 2;
    const int sr = rt == 2 ? sr2 : sr1;
    int sp = split[rt - 1][sr];
    if (env_split && atoi(env_split) >= 1 && atoi(env_split) <= kPipeMaxSplit)
        sp = atoi(env_split);
    if (sr)
        return woq_pipe_rt<XT, BITS, true>(x, q, scales, zeros, y, m, n, k, group, rt, tiles[rt - 1][1], sp, s);
    return woq_pipe_rt<XT, BITS, false>(x, q, scales, zeros, y, m, n, k, group, rt, tiles[rt - 1][0], sp, s);
}

/* The tensor-core GEMV: 32 rows a warp (fewer x loads and mma with ones
 * per weight) where that still gives kTcTarget warps with a k split of 2,
 * else 16; the k split doubles (up to kTcMaxWarps warps of a block, each
 * with 4 chunks or more) until the launch has kTcTarget warps: short runs
 * of k per warp kept the memory busy for the bf16 GEMV (gemv.cu).
 * Occupancy: about 100-128 registers a thread (ptxas), 16 warps an SM,
 * each with 16 rows x 64 bytes x kTcInFlight chunks (or 32 rows x 2) in
 * flight: 48-64 KB an SM. */
template <int XT, int BITS>
cudaError_t woq_tc_launch(const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y,
                          int32_t m, int32_t n, int32_t k, int32_t group, int rt, cudaStream_t s)
{
    constexpr int CK = BITS == 4 ? 128 : 64;
    const int64_t nch = k / CK, tiles32 = ((int64_t)n + 31) / 32;
    if (rt == 0)
        rt = tiles32 * 2 >= kTcTarget ? 2 : 1;
    const int64_t tiles = rt == 2 ? tiles32 : ((int64_t)n + 15) / 16;
    int warps = 1;
    while (warps < kTcMaxWarps && tiles * warps < kTcTarget && 8 * warps <= nch)
        warps *= 2;
    const char *split = getenv("KILN_WOQ_GEMV_SPLIT"), *ahead = getenv("KILN_WOQ_GEMV_PREFETCH");
    if (split && atoi(split) >= 1 && atoi(split) <= kTcMaxWarps)
        warps = atoi(split);
    const int32_t pf = ahead && atoi(ahead) >= 0 && atoi(ahead) <= 64 ? atoi(ahead) : kTcPrefetch;
    if (rt == 2)
        return kcu_launch_cfg(woq_tc_kernel<XT, BITS, 2>, dim3((unsigned)tiles), dim3(warps * 32), s, x, q, scales,
                              zeros, y, m, n, k, group, pf);
    return kcu_launch_cfg(woq_tc_kernel<XT, BITS, 1>, dim3((unsigned)tiles), dim3(warps * 32), s, x, q, scales, zeros,
                          y, m, n, k, group, pf);
}

/* m <= KILN_WOQ_GEMV_MAX_ROWS rows of x (16-byte aligned, as q) through
 * a GEMV. */
template <int XT, int BITS>
cudaError_t woq_gemv_launch(const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y,
                            int32_t m, int32_t n, int32_t k, int32_t group, cudaStream_t s)
{
    if constexpr (XT != KILN_DTYPE_F32) {
        int rt = 0;
        const int choice = woq_gemv_choice(&rt);
        if (group % (BITS == 4 ? 128 : 64) == 0 && choice == WOQ_PIPE)
            return woq_pipe_launch<XT, BITS>(x, q, scales, zeros, y, m, n, k, group, rt, s);
        if (group % (BITS == 4 ? 128 : 64) == 0 && choice == WOQ_TC)
            return woq_tc_launch<XT, BITS>(x, q, scales, zeros, y, m, n, k, group, rt, s);
    }
    if (m == 1)
        return woq_gemv<XT, BITS, 1>(x, q, scales, zeros, y, m, n, k, group, s);
    if (m == 2)
        return woq_gemv<XT, BITS, 2>(x, q, scales, zeros, y, m, n, k, group, s);
    if (m <= 4)
        return woq_gemv<XT, BITS, 4>(x, q, scales, zeros, y, m, n, k, group, s);
    return woq_gemv<XT, BITS, 8>(x, q, scales, zeros, y, m, n, k, group, s);
}

/* The GEMV over groups of up to 8 rows of x and y (k is a multiple of
 * 32, so x's rows stay 16-byte aligned). */
template <int XT, int BITS>
cudaError_t woq_gemv_groups(const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y,
                            int64_t rows, int32_t n, int32_t k, int32_t group, cudaStream_t s)
{
    constexpr size_t es = XT == KILN_DTYPE_F32 ? 4 : 2;
    for (int64_t r0 = 0; r0 < rows; r0 += KILN_WOQ_GEMV_MAX_ROWS) {
        const int32_t m = (int32_t)(rows - r0 < KILN_WOQ_GEMV_MAX_ROWS ? rows - r0 : KILN_WOQ_GEMV_MAX_ROWS);
        const cudaError_t e = woq_gemv_launch<XT, BITS>((const char *)x + (size_t)(r0 * k) * es, q, scales, zeros,
                                                        (char *)y + (size_t)(r0 * n) * es, m, n, k, group, s);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

/* The GEMV over groups of rows where kiln_woq_gemv_rows allows; else each
 * slice of W dequantized into the workspace and multiplied by cuBLASLt
 * into its columns of y (rows n apart), or, where cuBLASLt offers no
 * kernel for the layout, the GEMV over groups of rows after all. */
template <int XT, int BITS>
int woq_launch(const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y, int64_t rows,
               int32_t n, int32_t k, int32_t group, void *ws, size_t ws_size, cudaStream_t s)
{
    constexpr size_t es = XT == KILN_DTYPE_F32 ? 4 : 2;
    const bool aligned = ((uintptr_t)x | (uintptr_t)q) % 16 == 0;
    if (rows <= kiln_woq_gemv_rows(BITS, group, es) && aligned)
        return (int)woq_gemv_groups<XT, BITS>(x, q, scales, zeros, y, rows, n, k, group, s);
    /* the workspace of the most rows, whatever rows is here */
    if (!ws || ws_size < kiln_woq_cuda_workspace(BITS, group, INT64_MAX, n, k, es))
        return (int)cudaErrorInvalidValue;
    if ((uintptr_t)q % 16)
        return (int)cudaErrorMisalignedAddress;
    const int64_t slice = kiln_woq_slice_rows(n, k, es), ng = k / group, row_bytes = (int64_t)k * BITS / 8;
    void *lt_ws = (char *)ws + ((size_t)(slice * k) * es + 255) / 256 * 256;
    for (int64_t n0 = 0; n0 < n; n0 += slice) {
        const int32_t nc = (int32_t)(n - n0 < slice ? n - n0 : slice);
        const int64_t vecs = (int64_t)nc * k / woq_vec<BITS>::E;
        cudaError_t e =
            kcu_launch_cfg(woq_dequant_kernel<XT, BITS>, dim3(kcu_blocks(vecs, 0, 1)), dim3(256), s, q + n0 * row_bytes,
                           scales + n0 * ng, BITS == 4 ? zeros + n0 * ng : zeros, ws, vecs, k, group);
        if (e != cudaSuccess)
            return (int)e;
        const int st = kiln_fusedmm_gemm_cuda(XT, x, ws, (char *)y + (size_t)n0 * es, rows, nc, k, n, lt_ws, s);
        if (st == KILN_FUSEDMM_NO_ALGO && aligned)
            return (int)woq_gemv_groups<XT, BITS>(x, q, scales, zeros, y, rows, n, k, group, s);
        if (st)
            return st;
    }
    return 0;
}

template <int BITS>
int woq_dispatch(int32_t dtype, const void *x, const uint8_t *q, const float *scales, const uint8_t *zeros, void *y,
                 int64_t rows, int32_t n, int32_t k, int32_t group, void *ws, size_t ws_size, cudaStream_t s)
{
    switch (dtype) {
    case KILN_DTYPE_F16:
        return woq_launch<KILN_DTYPE_F16, BITS>(x, q, scales, zeros, y, rows, n, k, group, ws, ws_size, s);
    case KILN_DTYPE_BF16:
        return woq_launch<KILN_DTYPE_BF16, BITS>(x, q, scales, zeros, y, rows, n, k, group, ws, ws_size, s);
    default: return woq_launch<KILN_DTYPE_F32, BITS>(x, q, scales, zeros, y, rows, n, k, group, ws, ws_size, s);
    }
}

} /* namespace */

extern "C" int kiln_woq_matmul_cuda(int32_t bits, int32_t group, const void *x, const void *q, const void *scales,
                                    const void *zeros, void *y, int32_t dtype, int64_t rows, int32_t n, int32_t k,
                                    void *workspace, size_t workspace_size, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (rows <= 0 || n <= 0)
        return 0;
    const uint8_t *qb = (const uint8_t *)q, *zb = (const uint8_t *)zeros;
    const float *sc = (const float *)scales;
    return bits == 4 ? woq_dispatch<4>(dtype, x, qb, sc, zb, y, rows, n, k, group, workspace, workspace_size, s)
                     : woq_dispatch<8>(dtype, x, qb, sc, zb, y, rows, n, k, group, workspace, workspace_size, s);
}

/* Every pipelined GEMV's set-up for one x dtype and width. */
template <int XT, int BITS> static void woq_pipe_init(cudaError_t *e)
{
    (void)woq_pipe_occupancy<XT, BITS, 1, false>(e);
    (void)woq_pipe_occupancy<XT, BITS, 1, true>(e);
    (void)woq_pipe_occupancy<XT, BITS, 2, false>(e);
    (void)woq_pipe_occupancy<XT, BITS, 2, true>(e);
}

extern "C" int kiln_woq_cuda_init(void)
{
    cudaError_t e = cudaSuccess;
    woq_pipe_init<KILN_DTYPE_BF16, 4>(&e);
    woq_pipe_init<KILN_DTYPE_BF16, 8>(&e);
    woq_pipe_init<KILN_DTYPE_F16, 4>(&e);
    woq_pipe_init<KILN_DTYPE_F16, 8>(&e);
    return (int)e;
}

extern "C" const char *kiln_woq_cuda_error(int code)
{
    if (code >= 10000)
        return kiln_fusedmm_cuda_error(code);
    static thread_local char buf[96];
    snprintf(buf, sizeof buf, "CUDA error %d (%s)", code, cudaGetErrorString((cudaError_t)code));
    return buf;
}
