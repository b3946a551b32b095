/* PagedAttention on the GPU: the same semantics as the CPU reference in
 * attention.c (cache write, then causal attention of each new token to
 * its sequence's cached and new tokens), f32 softmax statistics and f32
 * accumulation for every storage dtype. An FP8 cache (cache_dtype u8:
 * E4M3 codes) is written by kat_write, which rounds each value as
 * core/fp8.h does (satfinite, ties to even), and read as E4M3 widened to
 * f32 (or to f16/bf16 for the tensor cores, exactly) right after the
 * loads: by kat_pipe (8 codes a lane where a 16-bit cache gives 8
 * values, so a stage holds twice the keys), kat_prefill (the tiles
 * converted on their way to shared memory instead of cp.async) and
 * kat_generic (f32 activations, other head dims). kat_decode does not
 * take it (the FP8 cache always runs kat_pipe), nor does the fused cache
 * write: the new keys are read back rounded from the cache, as on the CPU.
 *
 * One step is one to three launches, all taking part in programmatic
 * dependent launch (kcu_launch_cfg, kcu_after_prior):
 *   1. kat_write: each new token's k and v rows into the paged cache
 *      (kat_decode does it itself when the k and v rows are aligned).
 *   2. attention, one of
 *      - kat_prefill (f16/bf16, head_dim 64 or 128, more tokens than
 *        sequences): flash attention on tensor cores (mma.sync
 *        m16n8k16), a CTA per 64 query rows of one sequence and one kv
 *        head (a row: a new token and one query head of the group), keys
 *        in tiles of 64 read from the paged cache into shared memory,
 *        online softmax in registers; the score matrix never exists;
 *      - kat_dmma (the same layouts, 16-bit activations, a step whose
 *        sequences times kv heads reach 256; kat_use_dmma): a
 *        CTA per (token, kv head), the head group's query heads as the
 *        rows of a tensor-core m-tile, no splits;
 *      - kat_pipe (head_dim 64 or 128, 16-byte aligned rows; the decode
 *        of fewer sequences, and of f32 activations): a CTA per (token,
 *        kv head, up to 8 query heads of it, split), so the query heads
 *        of one KV head share every K/V load.
 *        Each warp streams whole K and V rows of its keys into shared
 *        memory through a 4-stage cp.async pipeline (12 KB in flight per
 *        warp) and runs its own online softmax; warps merge at the end.
 *        The grid's G splits come from shapes (tokens, longest possible
 *        sequence: none when the tokens fill the GPU; at most a cluster's
 *        16 where clusters run), and each token runs only as many as its
 *        actual length fills (KAT_PIPE_SPLIT_KEYS keys at least each), so
 *        a graph captured for a bucket serves every context length. Splits
 *        merge in a cluster (G <= 16) or through kat_combine. The loads of
 *        the first stages of cached keys are issued before the wait on the
 *        previous kernel (kat_pipe says why that is safe);
 *      - kat_decode (KILN_ATTENTION_DECODE=split, to compare): a CTA per
 *        (token, kv head, up to 8 query heads of it, split), so the query
 *        heads of one KV head share every K/V load; the keys are cut into
 *        tiles and split z takes tiles z, z + G, z + 2G, ... (flash
 *        decoding), so one long sequence still fills the GPU. The G splits
 *        of a (token, head group) form one thread-block cluster and merge
 *        their partials through distributed shared memory at the end, so
 *        a decode step is one launch whatever the context length;
 *      - kat_generic: any head_dim, dtype or alignment, a CTA per (token,
 *        head, split), one key per thread: slow, for what the fast kernels
 *        do not take (e.g. the tiny test models' head_dim 16).
 *   3. kat_combine, when G > 1 splits ran outside a cluster (kat_generic,
 *      kat_pipe with G > 16 (KILN_ATTENTION_PIPE_CAP=0) or
 *      KILN_ATTENTION_CLUSTER=0): merges the
 *      per-split partial (max, sum, output) from the workspace; after
 *      kat_pipe it reads the step's metadata before its wait, as kat_pipe
 *      does.
 * G is chosen on the host from shapes alone (tokens, max_blocks, heads),
 * never from seq_lens or query_start, so a step can be captured in a CUDA
 * graph; splits past a sequence's tiles (kat_pipe: past what its length
 * fills) do no work (in a cluster they only join the merge).
 *
 * Inconsistent metadata (query_start not running 0..T, a length past the
 * table, a block outside the cache) cannot be reported from the device: the
 * kernels never index out of bounds, skip the cache write of such tokens
 * and write NaN for their outputs (the CPU path returns an error instead).
 * Scores live in the log2 domain (scale * log2(e) folded in) so the
 * softmax uses exp2. */
#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"
#include "core/fp8.h"
#include "fp8/fp8_quant.cuh"

#include <cooperative_groups.h>
#include <type_traits>
#include <cuda_bf16.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace cg = cooperative_groups;

#define KAT_THREADS 128      /* every kernel: 4 warps */
#define KAT_TARGET_CTAS 1584 /* decode CTAs to aim for: 4 waves of 3 resident per SM on 132 SMs */
#define KAT_MAX_SPLITS 128   /* == KAT_THREADS: kat_combine gives each split a thread */
#define KAT_MAX_CLUSTER 16   /* splits merged in one cluster (Hopper's largest, non-portable) */
#define KAT_CLUSTER_CTAS 256 /* decode CTAs to aim for with clusters: about two per SM */
#define KAT_GENERIC_TILE 128 /* keys per tile of kat_generic: one per thread */
#define KAT_LOG2E 1.4426950408889634f

static_assert(KAT_MAX_SPLITS == KAT_THREADS, "kat_combine weighs one split per thread");

/* The two halves of kcu_after_prior, for kat_pipe's reads before the wait
 * (see there why they are safe). */
__device__ __forceinline__ void kat_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void kat_wait_prior()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    ktl_waited();
}

/* ---- metadata ----------------------------------------------------------------------- */

/* Where packed token t belongs: its sequence and position, and whether the
 * metadata around it is consistent (else the rest is meaningless). */
struct kat_tok {
    int64_t s, pos;
    int64_t first, n_old; /* the sequence's first new token in the packing; its cached tokens */
    int valid;
};

/* Sequence s's token t, checked as attention_check checks it. */
__device__ __forceinline__ kat_tok kat_token_in(const kiln_attention_cuda_args &a, int64_t t, int64_t s, int64_t first,
                                                int64_t next, int64_t len)
{
    kat_tok k;
    const int64_t n_new = next - first, j = t - first;
    k.s = s;
    k.first = first;
    k.n_old = len - n_new;
    k.valid = j >= 0 && j < n_new && len >= n_new && len <= a.max_blocks * a.block_size;
    k.pos = k.n_old + j;
    return k;
}

/* The last s with qstart[s] <= t (the CPU's seq_of), then the checks that
 * concern this token. In a decode step token t is sequence t's only one:
 * that is tried first, with loads that do not wait on each other. */
__device__ __forceinline__ kat_tok kat_token(const kiln_attention_cuda_args &a, int64_t t)
{
    if (t < a.n_seqs) {
        int64_t first = a.qstart[t], next = a.qstart[t + 1], len = a.seq_lens[t];
        if ((first == t) & (next == t + 1))
            return kat_token_in(a, t, t, first, next, len);
    }
    int64_t lo = 0, hi = a.n_seqs - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (a.qstart[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return kat_token_in(a, t, lo, a.qstart[lo], a.qstart[lo + 1], a.seq_lens[lo]);
}

/* Element offset of the K row of (sequence s, position pos, kv head) in
 * the cache (its V row is n_kv_heads * block_size * head_dim further), or
 * -1 when the table names a block outside the cache. */
__device__ __forceinline__ int64_t kat_krow(const kiln_attention_cuda_args &a, int64_t s, int64_t pos, int64_t kvh)
{
    /* the block and the row in it by a 32-bit division where pos fits (a
     * 64-bit one is a long software routine, and kat_prefill takes a row a
     * key) */
    int64_t bi, r;
    if (pos >= 0 && pos <= INT32_MAX) {
        const int32_t p32 = (int32_t)pos, q = p32 / a.block_size;
        bi = q, r = p32 - q * a.block_size;
    } else {
        bi = pos / a.block_size, r = pos % a.block_size;
    }
    int64_t block = a.table[s * a.max_blocks + bi];
    if (block < 0 || block >= a.n_blocks)
        return -1;
    return (((block * 2) * a.n_kv_heads + kvh) * a.block_size + r) * a.head_dim;
}

__device__ __forceinline__ int64_t kat_vdelta(const kiln_attention_cuda_args &a)
{
    return (int64_t)a.n_kv_heads * a.block_size * a.head_dim;
}

__device__ __forceinline__ float kat_nan() { return __int_as_float(0x7fc00000); }

/* Split partials in the workspace: for (token, head, split) the f32
 * output row (unnormalized, head_dim), then (max, sum) pairs after all
 * rows. */
struct kat_parts {
    float *o, *ml;
};

__device__ __forceinline__ kat_parts kat_parts_of(const kiln_attention_cuda_args &a, int32_t splits)
{
    kat_parts p;
    p.o = (float *)a.workspace;
    p.ml = p.o + a.tokens * a.n_heads * splits * a.head_dim;
    return p;
}

/* ---- block reductions (KAT_THREADS threads; scratch of 4 floats) ------------------ */

__device__ __forceinline__ float kat_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Every thread gets the result; syncs twice so `red` can be reused at once. */
__device__ __forceinline__ float kat_block_max(float v, float *red)
{
    v = kat_warp_max(v);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    __syncthreads();
    return r;
}

__device__ __forceinline__ float kat_block_sum(float v, float *red)
{
    v = kcu_warp_sum(v);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float r = (red[0] + red[1]) + (red[2] + red[3]);
    __syncthreads();
    return r;
}

/* ---- 1. cache write ------------------------------------------------------------------- */

/* A CTA per token: its k and v rows of every kv head into the cache, 16
 * bytes at a time when `vec` (rows and cache 16-byte aligned), else one
 * element of `es` bytes at a time. */
__global__ void __launch_bounds__(KAT_THREADS) kat_write(kiln_attention_cuda_args a, int32_t es, int32_t vec)
{
    KTL_SCOPE(0);
    kcu_after_prior();
    int64_t t = blockIdx.x;
    kat_tok k = kat_token(a, t);
    if (!k.valid)
        return;
    const int64_t D = a.head_dim, vd = kat_vdelta(a);
    if (a.cache_dtype == KILN_DTYPE_U8 && vec) {
        /* FP8, 16-byte rows of f16/bf16: 8 values a thread, converted by the
         * hardware's saturating round-to-nearest-even, which gives
         * kiln_f32_to_e4m3's codes (the quantizers of fp8_quant.cuh convert
         * the same way, and their op tests compare bytes with the CPU) */
        uint8_t *c = (uint8_t *)a.cache;
        const int32_t per_row = (int32_t)(D / 8), total = per_row * (int32_t)a.n_kv_heads;
        for (int32_t i = threadIdx.x; i < total; i += blockDim.x) {
            const int32_t h = i / per_row, u = i - h * per_row;
            const int64_t dst = kat_krow(a, k.s, k.pos, h);
            if (dst < 0)
                return;
            const uint4 kx = ((const uint4 *)((const char *)a.k + (t * a.k_ld + h * D) * es))[u];
            const uint4 vx = ((const uint4 *)((const char *)a.v + (t * a.v_ld + h * D) * es))[u];
            float f[8];
#pragma unroll
            for (int e = 0; e < 8; e++)
                f[e] = kiln_elem_load_f32(&kx, a.dtype, e);
            *(uint2 *)(c + dst + 8 * u) = make_uint2(fp8_pack4(f, 1.0f), fp8_pack4(f + 4, 1.0f));
#pragma unroll
            for (int e = 0; e < 8; e++)
                f[e] = kiln_elem_load_f32(&vx, a.dtype, e);
            *(uint2 *)(c + dst + vd + 8 * u) = make_uint2(fp8_pack4(f, 1.0f), fp8_pack4(f + 4, 1.0f));
        }
        return;
    }
    if (a.cache_dtype == KILN_DTYPE_U8) { /* FP8: each value rounded to E4M3 (core/fp8.h) */
        uint8_t *c = (uint8_t *)a.cache;
        for (int64_t i = threadIdx.x; i < D * a.n_kv_heads; i += blockDim.x) {
            int64_t h = i / D, d = i % D, dst = kat_krow(a, k.s, k.pos, h);
            if (dst < 0)
                return;
            c[dst + d] = kiln_f32_to_e4m3(kcu_load_float(a.k, a.dtype, t * a.k_ld + h * D + d));
            c[dst + vd + d] = kiln_f32_to_e4m3(kcu_load_float(a.v, a.dtype, t * a.v_ld + h * D + d));
        }
        return;
    }
    const int64_t units = vec ? D * es / 16 : D, total = units * a.n_kv_heads;
    for (int64_t i = threadIdx.x; i < total; i += blockDim.x) {
        int64_t h = i / units, u = i % units;
        int64_t dst = kat_krow(a, k.s, k.pos, h);
        if (dst < 0)
            return;
        const char *ks = (const char *)a.k + (t * a.k_ld + h * D) * es;
        const char *vs = (const char *)a.v + (t * a.v_ld + h * D) * es;
        char *kd = (char *)a.cache + dst * es, *vdst = (char *)a.cache + (dst + vd) * es;
        if (vec) {
            ((uint4 *)kd)[u] = ((const uint4 *)ks)[u];
            ((uint4 *)vdst)[u] = ((const uint4 *)vs)[u];
        } else if (es == 2) {
            ((uint16_t *)kd)[u] = ((const uint16_t *)ks)[u];
            ((uint16_t *)vdst)[u] = ((const uint16_t *)vs)[u];
        } else {
            ((uint32_t *)kd)[u] = ((const uint32_t *)ks)[u];
            ((uint32_t *)vdst)[u] = ((const uint32_t *)vs)[u];
        }
    }
}

/* ---- storage types ------------------------------------------------------------------- */

/* Two E4M3 codes (the first in the low byte) as f32, through the f16
 * conversion instruction: every E4M3 value is an f16 value. */
__device__ __forceinline__ float2 kat_e4m3x2(uint32_t c)
{
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(c & 0xffffu), __NV_E4M3);
    return __half22float2(*(const __half2 *)&h);
}

/* Element i of the cache as f32, whatever it holds. */
__device__ __forceinline__ float kat_cache_load(const kiln_attention_cuda_args &a, int64_t i)
{
    if (a.cache_dtype == KILN_DTYPE_U8)
        return kat_e4m3x2(((const uint8_t *)a.cache)[i]).x;
    return kcu_load_float(a.cache, a.dtype, i);
}

/* N E4M3 codes (N = 4 or 8, the bytes at p, aligned to N) as f32. */
template <int N> __device__ __forceinline__ void kat_e4m3_unpack(const void *p, float *f)
{
    uint32_t w[2];
    if (N == 8) {
        const uint2 u = *(const uint2 *)p;
        w[0] = u.x, w[1] = u.y;
    } else {
        w[0] = *(const uint32_t *)p, w[1] = 0;
    }
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        const float2 x = kat_e4m3x2(w[i / 2] >> (16 * (i % 2)));
        f[2 * i] = x.x, f[2 * i + 1] = x.y;
    }
}

template <int DT> struct kat_type;
template <> struct kat_type<KILN_DTYPE_F32> {
    static constexpr int per = 4; /* elements per 16 bytes */
    static __device__ __forceinline__ void unpack(const uint4 &u, float *f)
    {
        f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z),
        f[3] = __uint_as_float(u.w);
    }
    static __device__ __forceinline__ void store(void *p, int64_t i, float v) { ((float *)p)[i] = v; }
};
template <> struct kat_type<KILN_DTYPE_F16> {
    static constexpr int per = 8;
    static __device__ __forceinline__ void unpack(const uint4 &u, float *f)
    {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 x = __half22float2(*(const __half2 *)&w[i]);
            f[2 * i] = x.x, f[2 * i + 1] = x.y;
        }
    }
    static __device__ __forceinline__ void store(void *p, int64_t i, float v)
    {
        ((uint16_t *)p)[i] = kiln_f32_to_f16(v);
    }
};
template <> struct kat_type<KILN_DTYPE_BF16> {
    static constexpr int per = 8;
    static __device__ __forceinline__ void unpack(const uint4 &u, float *f)
    {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ void store(void *p, int64_t i, float v)
    {
        ((uint16_t *)p)[i] = kiln_f32_to_bf16(v);
    }
};

/* ---- 2b. decode: split paged attention, query heads of a kv head together ----------- */

/* Thread layout of kat_decode for storage DT and head_dim D: a row of D
 * elements is NV 16-byte vectors, read by LPR lanes (VPL vectors each, lane
 * l taking vectors l, l + LPR, ...: coalesced); a warp reads RPW rows at a
 * time, the CTA RPS; a tile is TILE keys, NS rows per thread, so that at
 * most 8 vectors of K (and of V) per thread are in flight. */
template <int DT, int D> struct kat_shape {
    static constexpr int PER = kat_type<DT>::per;
    static constexpr int NV = D / PER;
    static constexpr int LPR = NV < 32 ? NV : 32;
    static constexpr int VPL = NV / LPR;
    static constexpr int RPW = 32 / LPR;
    static constexpr int RPS = RPW * (KAT_THREADS / 32);
    static constexpr int TILE = 8 * RPS / VPL < 64 ? 8 * RPS / VPL : 64;
    static constexpr int NS = TILE / RPS;
    static_assert(NV % LPR == 0 && TILE % RPS == 0 && TILE % 32 == 0, "kat_decode layout");
};

/* Merges the splits of one (token, head group) that form a thread-block
 * cluster (its size along z): s_o holds this CTA's unnormalized output
 * rows (ng x D), s_m / s_l its softmax max and sum per head. Only the
 * first n CTAs of the cluster took keys (the others' partials are empty:
 * max -inf, sum and output 0, which would add exact zeros), so only they
 * are read. After a cluster barrier, CTA r < n merges output elements r,
 * r + n, ... reading those splits' partials from their shared memory
 * (distributed shared memory), and writes them: no workspace and no
 * combine launch. A second barrier keeps each CTA's shared memory alive
 * until all have read it; every CTA of the cluster takes part in both. */
template <int DT, int D>
__device__ __forceinline__ void kat_cluster_combine(const kiln_attention_cuda_args &a, float *s_o, float *s_m,
                                                    float *s_l, int ng, int64_t row0, int threads, int n)
{
    cg::cluster_group cl = cg::this_cluster();
    const int r = (int)cl.block_rank();
    cl.sync();
    for (int i = r + n * (int)threadIdx.x; r < n && i < ng * D; i += n * threads) {
        const int g = i / D;
        float M = -INFINITY;
        for (int z = 0; z < n; z++)
            M = fmaxf(M, cl.map_shared_rank(s_m, z)[g]);
        const float Mu = M == -INFINITY ? 0.0f : M;
        float L = 0.0f, O = 0.0f;
        for (int z = 0; z < n; z++) {
            float w = exp2f(cl.map_shared_rank(s_m, z)[g] - Mu);
            L = fmaf(cl.map_shared_rank(s_l, z)[g], w, L);
            O = fmaf(cl.map_shared_rank(s_o, z)[i], w, O);
        }
        kat_type<DT>::store(a.out, row0 * D + i, O / L);
    }
    cl.sync();
}

/* The end of kat_decode in a cluster: each CTA sums its warps' rows into
 * s_red[0] and marks a bad split (NaN sum), then kat_cluster_combine. */
template <int DT, int D, int HG>
__device__ __forceinline__ void kat_cluster_merge(const kiln_attention_cuda_args &a, float (*s_red)[HG][D], float *s_m,
                                                  float *s_l, int bad, int ng, int64_t row0)
{
    for (int i = threadIdx.x; i < ng * D; i += KAT_THREADS) {
        int g = i / D, d = i % D;
        s_red[0][g][d] = (s_red[0][g][d] + s_red[1][g][d]) + (s_red[2][g][d] + s_red[3][g][d]);
    }
    if (bad && threadIdx.x < HG)
        s_l[threadIdx.x] = kat_nan();
    kat_cluster_combine<DT, D>(a, &s_red[0][0][0], s_m, s_l, ng, row0, KAT_THREADS,
                               (int)cg::this_cluster().num_blocks());
}

/* Grid: x = token, y = kv head * n_hg + group of HG query heads, z =
 * split (G = gridDim.z).
 *
 * With `fused` (k and v rows 16-byte aligned) no kat_write ran before: the
 * CTA (token, kv head, first group, split 0) writes the token's k and v
 * rows into the cache, and every CTA reads the step's new positions from
 * the k and v inputs instead of the cache, so no CTA waits on another's
 * write. One launch fewer per decode step. */
template <int DT, int D, int HG>
__global__ void __launch_bounds__(KAT_THREADS, HG <= 4 ? 3 : 2)
    kat_decode(kiln_attention_cuda_args a, int32_t fused, int32_t cluster)
{
    KTL_SCOPE(0);
    typedef kat_shape<DT, D> L;
    constexpr int PER = L::PER, LPR = L::LPR, VPL = L::VPL, RPW = L::RPW, RPS = L::RPS, TILE = L::TILE, NS = L::NS;
    __shared__ float s_p[2][HG][TILE]; /* scores, then probabilities; double-buffered by tile */
    __shared__ float s_corr[2][HG];
    __shared__ float s_m[HG], s_l[HG];
    __shared__ float s_red[KAT_THREADS / 32][HG][D];

    kcu_after_prior();
    const int G = gridDim.z, z = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gq = a.n_heads / a.n_kv_heads, n_hg = (gq + HG - 1) / HG;
    const int kvh = blockIdx.y / n_hg, h0 = kvh * gq + (blockIdx.y % n_hg) * HG;
    const int ng = min(HG, kvh * gq + gq - h0);
    const int64_t t = blockIdx.x;
    kat_tok k = kat_token(a, t);
    const int64_t nk = k.pos + 1, n_tiles = (nk + TILE - 1) / TILE;
    if (!k.valid) { /* a whole cluster leaves here together */
        if (G == 1 || (cluster && z == 0))
            for (int i = threadIdx.x; i < ng * D; i += KAT_THREADS)
                kat_type<DT>::store(a.out, (t * a.n_heads + h0) * D + i, kat_nan());
        return;
    }
    const int64_t n_old = fused ? k.n_old : nk; /* keys from here on come from the inputs */
    if (fused && z == 0 && blockIdx.y % n_hg == 0) {
        int64_t dst = kat_krow(a, k.s, k.pos, kvh);
        constexpr int U = D / PER; /* 16-byte units of a row */
        if (dst >= 0 && threadIdx.x < 2 * U) {
            int kind = threadIdx.x / U, u = threadIdx.x % U;
            const uint4 *src = (const uint4 *)((const char *)(kind ? a.v : a.k) +
                                               (t * (kind ? a.v_ld : a.k_ld) + (int64_t)kvh * D) * (16 / PER));
            ((uint4 *)((char *)a.cache + (dst + kind * kat_vdelta(a)) * (16 / PER)))[u] = src[u];
        }
    }
    if (z >= n_tiles && !cluster) /* in a cluster it takes part in the merge */
        return;

    /* this lane's dims: vectors (lane % LPR) + v * LPR of the row */
    const int sub = lane / LPR, lv = lane % LPR;
    float q[HG][VPL * PER], acc[HG][VPL * PER];
#pragma unroll
    for (int g = 0; g < HG; g++)
#pragma unroll
        for (int v = 0; v < VPL; v++) {
            uint4 u = make_uint4(0, 0, 0, 0);
            if (g < ng)
                u = *(const uint4 *)((const char *)a.q +
                                     ((t * a.q_ld + (int64_t)(h0 + g) * D) + (lv + v * LPR) * PER) * (16 / PER));
            kat_type<DT>::unpack(u, &q[g][v * PER]);
#pragma unroll
            for (int e = 0; e < PER; e++)
                acc[g][v * PER + e] = 0.0f;
        }
    if (threadIdx.x < HG) {
        s_m[threadIdx.x] = -INFINITY;
        s_l[threadIdx.x] = 0.0f;
    }
    const float sl2 = a.scale * KAT_LOG2E;
    const int64_t vd = kat_vdelta(a);
    const char *cache = (const char *)a.cache;
    int bad = 0, buf = 0;

    /* off[i], the source of row i: >= 0 its K row's element offset in the
     * cache (V is vd further), -1 a bad block, -2 past the keys, <= -3 new
     * token -3 - off of the step's k and v inputs (fused) */
    const char *kin = (const char *)a.k + (k.first * a.k_ld + (int64_t)kvh * D) * (16 / PER);
    const char *vin = (const char *)a.v + (k.first * a.v_ld + (int64_t)kvh * D) * (16 / PER);
    /* Row sources and K vectors of tile `tl` (rows past the keys: -2 and
     * zeros, no load). The next tile's are loaded while this tile's V is
     * in flight and its softmax runs, so a CTA waits on one memory latency
     * per tile, not two. */
    uint4 kr[NS][VPL];
    int64_t off[NS];
    auto load_k = [&](int64_t tl) {
        const int64_t k0 = tl * TILE;
#pragma unroll
        for (int i = 0; i < NS; i++) {
            int64_t kp = k0 + i * RPS + warp * RPW + sub;
            int64_t o = kp < nk ? kat_krow(a, k.s, kp, kvh) : -2;
            off[i] = o >= 0 && kp >= n_old ? -3 - (kp - n_old) : o;
            bad |= off[i] == -1;
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                int64_t e = (lv + v * LPR) * PER;
                kr[i][v] = off[i] >= 0    ? __ldg((const uint4 *)(cache + (off[i] + e) * (16 / PER)))
                           : off[i] <= -3 ? *(const uint4 *)(kin + ((-3 - off[i]) * a.k_ld + e) * (16 / PER))
                                          : make_uint4(0, 0, 0, 0);
            }
        }
    };
    load_k(z);
    for (int64_t tile = z; tile < n_tiles; tile += G, buf ^= 1) {
        uint4 vr[NS][VPL];
#pragma unroll
        for (int i = 0; i < NS; i++) {
            float part[HG];
#pragma unroll
            for (int g = 0; g < HG; g++)
                part[g] = 0.0f;
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                float kf[PER];
                kat_type<DT>::unpack(kr[i][v], kf);
#pragma unroll
                for (int g = 0; g < HG; g++)
#pragma unroll
                    for (int e = 0; e < PER; e++)
                        part[g] = fmaf(q[g][v * PER + e], kf[e], part[g]);
            }
#pragma unroll
            for (int g = 0; g < HG; g++) {
#pragma unroll
                for (int o = LPR / 2; o > 0; o >>= 1)
                    part[g] += __shfl_xor_sync(0xffffffffu, part[g], o);
            }
            if (lv == 0) {
                int r = i * RPS + warp * RPW + sub;
#pragma unroll
                for (int g = 0; g < HG; g++)
                    s_p[buf][g][r] = off[i] >= 0 || off[i] <= -3 ? part[g] * sl2 : -INFINITY;
            }
        }
        /* V is read once the scores are out of K's registers; its latency,
         * and the next tile's K, hide behind the softmax */
#pragma unroll
        for (int i = 0; i < NS; i++)
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                int64_t e = (lv + v * LPR) * PER;
                vr[i][v] = off[i] >= 0    ? __ldg((const uint4 *)(cache + (off[i] + vd + e) * (16 / PER)))
                           : off[i] <= -3 ? *(const uint4 *)(vin + ((-3 - off[i]) * a.v_ld + e) * (16 / PER))
                                          : make_uint4(0, 0, 0, 0);
            }
        load_k(tile + G);
        __syncthreads();
        /* online softmax: warp w updates heads w, w + 4 */
        for (int g = warp; g < HG; g += KAT_THREADS / 32) {
            float sv[TILE / 32], mt = -INFINITY;
#pragma unroll
            for (int i = 0; i < TILE / 32; i++) {
                sv[i] = s_p[buf][g][lane + 32 * i];
                mt = fmaxf(mt, sv[i]);
            }
            mt = kat_warp_max(mt);
            float m_old = s_m[g], m_new = fmaxf(m_old, mt);
            /* a tile whose keys all sit in bad blocks: keep the state finite */
            float m_use = m_new == -INFINITY ? 0.0f : m_new, sum = 0.0f;
#pragma unroll
            for (int i = 0; i < TILE / 32; i++) {
                float p = exp2f(sv[i] - m_use);
                s_p[buf][g][lane + 32 * i] = p;
                sum += p;
            }
            sum = kcu_warp_sum(sum);
            if (lane == 0) {
                float c = exp2f(m_old - m_use);
                s_corr[buf][g] = c;
                s_l[g] = s_l[g] * c + sum;
                s_m[g] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < HG; g++) {
            float c = s_corr[buf][g];
#pragma unroll
            for (int e = 0; e < VPL * PER; e++)
                acc[g][e] *= c;
        }
#pragma unroll
        for (int i = 0; i < NS; i++) {
            int r = i * RPS + warp * RPW + sub;
#pragma unroll
            for (int v = 0; v < VPL; v++) {
                float vf[PER];
                kat_type<DT>::unpack(vr[i][v], vf);
#pragma unroll
                for (int g = 0; g < HG; g++) {
                    float p = s_p[buf][g][r];
#pragma unroll
                    for (int e = 0; e < PER; e++)
                        acc[g][v * PER + e] = fmaf(p, vf[e], acc[g][v * PER + e]);
                }
            }
        }
    }

    /* sum the rows each lane group accumulated: within the warp, then across warps */
#pragma unroll
    for (int g = 0; g < HG; g++)
#pragma unroll
        for (int e = 0; e < VPL * PER; e++)
#pragma unroll
            for (int o = LPR; o < 32; o <<= 1)
                acc[g][e] += __shfl_xor_sync(0xffffffffu, acc[g][e], o);
    if (sub == 0)
#pragma unroll
        for (int g = 0; g < HG; g++)
#pragma unroll
            for (int v = 0; v < VPL; v++)
#pragma unroll
                for (int e = 0; e < PER; e++)
                    s_red[warp][g][(lv + v * LPR) * PER + e] = acc[g][v * PER + e];
    bad = __syncthreads_or(bad);
    if (cluster) {
        kat_cluster_merge<DT, D, HG>(a, s_red, s_m, s_l, bad, ng, t * a.n_heads + h0);
        return;
    }
    kat_parts parts = kat_parts_of(a, G);
    for (int i = threadIdx.x; i < ng * D; i += KAT_THREADS) {
        int g = i / D, d = i % D;
        float o = (s_red[0][g][d] + s_red[1][g][d]) + (s_red[2][g][d] + s_red[3][g][d]);
        int64_t row = t * a.n_heads + h0 + g;
        if (G == 1) {
            kat_type<DT>::store(a.out, row * D + d, bad ? kat_nan() : o / s_l[g]);
        } else {
            parts.o[(row * G + z) * D + d] = o;
            if (d == 0) {
                parts.ml[(row * G + z) * 2] = s_m[g];
                parts.ml[(row * G + z) * 2 + 1] = bad ? kat_nan() : s_l[g];
            }
        }
    }
}

/* ---- 2c. generic: any head_dim, dtype and alignment --------------------------------- */

#define KAT_GENERIC_DIMS 4 /* dims per thread: head_dim <= 4 * KAT_THREADS (512) */

/* Grid: x = token, y = query head, z = split. Thread j scores key j of the
 * tile; thread d accumulates dims d, d + 128, ... */
__global__ void __launch_bounds__(KAT_THREADS) kat_generic(kiln_attention_cuda_args a)
{
    KTL_SCOPE(0);
    __shared__ float s_q[KAT_GENERIC_DIMS * KAT_THREADS];
    __shared__ float s_p[KAT_GENERIC_TILE];
    __shared__ int64_t s_off[KAT_GENERIC_TILE];
    __shared__ float s_red[4];

    kcu_after_prior();
    const int G = gridDim.z, z = blockIdx.z, D = a.head_dim, dt = a.dtype;
    const int64_t t = blockIdx.x, h = blockIdx.y, kvh = h / (a.n_heads / a.n_kv_heads);
    kat_tok k = kat_token(a, t);
    const int64_t nk = k.pos + 1, n_tiles = (nk + KAT_GENERIC_TILE - 1) / KAT_GENERIC_TILE;
    if (!k.valid) {
        if (G == 1)
            for (int d = threadIdx.x; d < D; d += KAT_THREADS)
                kcu_store_float(a.out, (t * a.n_heads + h) * D + d, dt, kat_nan());
        return;
    }
    if (z >= n_tiles)
        return;
    for (int d = threadIdx.x; d < D; d += KAT_THREADS)
        s_q[d] = kcu_load_float(a.q, dt, t * a.q_ld + h * D + d);
    float acc[KAT_GENERIC_DIMS] = {0.0f, 0.0f, 0.0f, 0.0f};
    float m = -INFINITY, l = 0.0f;
    const float sl2 = a.scale * KAT_LOG2E;
    const int64_t vd = kat_vdelta(a);
    int bad = 0;
    __syncthreads();
    for (int64_t tile = z; tile < n_tiles; tile += G) {
        int64_t kp = tile * KAT_GENERIC_TILE + threadIdx.x;
        int64_t off = kp < nk ? kat_krow(a, k.s, kp, kvh) : -2;
        bad |= off == -1;
        float s = -INFINITY;
        if (off >= 0) {
            float dot = 0.0f;
            for (int d = 0; d < D; d++)
                dot = fmaf(s_q[d], kat_cache_load(a, off + d), dot);
            s = dot * sl2;
        }
        s_off[threadIdx.x] = off;
        float m_new = fmaxf(m, kat_block_max(s, s_red));
        float m_use = m_new == -INFINITY ? 0.0f : m_new;
        float p = exp2f(s - m_use), c = exp2f(m - m_use);
        s_p[threadIdx.x] = p;
        l = l * c + kat_block_sum(p, s_red); /* its syncs also publish s_p and s_off */
        m = m_new;
        int n = (int)min((int64_t)KAT_GENERIC_TILE, nk - tile * KAT_GENERIC_TILE);
#pragma unroll
        for (int i = 0; i < KAT_GENERIC_DIMS; i++)
            acc[i] *= c;
        for (int j = 0; j < n; j++) {
            int64_t vrow = s_off[j] + vd;
            float pj = s_p[j];
            if (s_off[j] < 0)
                continue;
#pragma unroll
            for (int i = 0; i < KAT_GENERIC_DIMS; i++) {
                int d = threadIdx.x + i * KAT_THREADS;
                if (d < D)
                    acc[i] = fmaf(pj, kat_cache_load(a, vrow + d), acc[i]);
            }
        }
        __syncthreads();
    }
    bad = __syncthreads_or(bad);
    int64_t row = t * a.n_heads + h;
    kat_parts parts = kat_parts_of(a, G);
#pragma unroll
    for (int i = 0; i < KAT_GENERIC_DIMS; i++) {
        int d = threadIdx.x + i * KAT_THREADS;
        if (d >= D)
            continue;
        if (G == 1) {
            kcu_store_float(a.out, dt, row * D + d, bad ? kat_nan() : acc[i] / l);
        } else {
            parts.o[(row * G + z) * D + d] = acc[i];
            if (d == 0) {
                parts.ml[(row * G + z) * 2] = m;
                parts.ml[(row * G + z) * 2 + 1] = bad ? kat_nan() : l;
            }
        }
    }
}

/* ---- 3. combine the splits --------------------------------------------------------- */

/* Grid: x = token, y = query head. The splits that ran for a token are the
 * first min(G, tiles) (tiles of `tile` keys); thread i weighs split i.
 * With `early` (kat_pipe's KAT_PIPE_EARLY, whose reasoning applies) the
 * step's metadata is read before the wait on the kernel before, and the
 * first KAT_COMBINE_AHEAD partial outputs of each thread's element are
 * loaded beside the (max, sum) pairs: one round trip after the wait
 * instead of three. */
#define KAT_COMBINE_AHEAD 8
__global__ void __launch_bounds__(KAT_THREADS)
    kat_combine(kiln_attention_cuda_args a, int32_t G, int32_t tile, int32_t early)
{
    KTL_SCOPE(0);
    __shared__ float s_w[KAT_MAX_SPLITS];
    __shared__ float s_red[4];
    const int D = a.head_dim;
    const int64_t t = blockIdx.x, row = t * a.n_heads + blockIdx.y;
    if (early)
        kat_launch_dependents();
    else
        kcu_after_prior();
    kat_tok k = kat_token(a, t);
    if (early)
        kat_wait_prior();
    if (!k.valid) {
        for (int d = threadIdx.x; d < D; d += KAT_THREADS)
            kcu_store_float(a.out, a.dtype, row * D + d, kat_nan());
        return;
    }
    const int64_t n_tiles = (k.pos + 1 + tile - 1) / tile;
    const int n = (int)min((int64_t)G, n_tiles);
    kat_parts parts = kat_parts_of(a, G);
    const int i = threadIdx.x;
    float ahead[KAT_COMBINE_AHEAD];
#pragma unroll
    for (int j = 0; j < KAT_COMBINE_AHEAD; j++)
        ahead[j] = j < n && i < D ? parts.o[(row * G + j) * D + i] : 0.0f;
    float mi = i < n ? parts.ml[(row * G + i) * 2] : -INFINITY;
    float li = i < n ? parts.ml[(row * G + i) * 2 + 1] : 0.0f;
    float M = kat_block_max(mi, s_red);
    float w = i < n ? exp2f(mi - M) : 0.0f;
    s_w[i] = w;
    float total = kat_block_sum(li * w, s_red);
    for (int d = threadIdx.x; d < D; d += KAT_THREADS) {
        float o = 0.0f;
        int j = 0;
        if (d == i) /* the first pass: its first partials are loaded */
#pragma unroll
            for (; j < KAT_COMBINE_AHEAD; j++)
                o = fmaf(s_w[j], ahead[j], o); /* s_w[j] and ahead[j] are 0 past n */
        for (; j < n; j++)
            o = fmaf(s_w[j], parts.o[(row * G + j) * D + d], o);
        kcu_store_float(a.out, a.dtype, row * D + d, o / total);
    }
}

/* ---- 2a. prefill: flash attention on tensor cores ----------------------------------- */

/* kat_prefill (the narrow form) takes 64 query rows a CTA, 16 a warp, and
 * keys in tiles of 64; kat_prefill_wide (below) 128 rows, for long prompts.
 * What held it (ncu, 2,048 tokens at the 8B shape: issue slots 35% busy,
 * 0.5 eligible warps a scheduler at 2 CTAs an SM, the integer pipe the
 * busiest, 40% of the stalls on fixed-latency dependencies) was integer
 * work and dependency chains around the mma: a 64-bit division a key for
 * its cache row (kat_krow), the loads' address arithmetic, 64-bit causal
 * masks, and the row maxima and sums as serial chains; without them the
 * kernel took 285 us instead of 344. It now runs 3 CTAs an SM (168
 * registers, 64 bytes of spill loads a thread at head_dim 128) instead of
 * 2 (226 registers): 12 warps an SM to hide those chains (H200: 2,048
 * tokens 228 against 249 us, 64 prompts of 128 166 against 190; 512
 * tokens 46 against 44). */
template <int DT> struct kat_mma;
template <> struct kat_mma<KILN_DTYPE_F16> {
    static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    /* lo goes to the lower half: the element of the smaller column */
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __half2 h = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&h;
    }
};
template <> struct kat_mma<KILN_DTYPE_BF16> {
    static __device__ __forceinline__ void run(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&h;
    }
};

__device__ __forceinline__ void kat_cp_async16(void *smem, const void *src, int bytes)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(bytes) : "memory");
}

__device__ __forceinline__ void kat_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/* Eight cache values from element `off` (off < 0: zeros) into 16 bytes of
 * shared memory at dst, as DT: by cp.async from a cache in DT, by a load
 * and a conversion from E4M3 codes (F8; exact: f16 and bf16 hold every
 * E4M3 value), whose store the kernel's barriers publish as they do the
 * cp.async groups' data. */
template <int DT, bool F8>
__device__ __forceinline__ void kat_prefill_load(uint16_t *dst, const void *cache, int64_t off)
{
    if (!F8) {
        kat_cp_async16(dst, off >= 0 ? (const uint16_t *)cache + off : cache, off >= 0 ? 16 : 0);
        return;
    }
    uint4 u = make_uint4(0, 0, 0, 0);
    if (off >= 0) {
        float f[8];
        kat_e4m3_unpack<8>((const uint8_t *)cache + off, f);
        u = make_uint4(kat_mma<DT>::pack(f[0], f[1]), kat_mma<DT>::pack(f[2], f[3]), kat_mma<DT>::pack(f[4], f[5]),
                       kat_mma<DT>::pack(f[6], f[7]));
    }
    *(uint4 *)dst = u;
}

template <int N> __device__ __forceinline__ void kat_cp_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Four 8x8 16-bit matrices: thread l gets, of matrix i (rows at the
 * addresses of threads 8i..8i+7), the elements (l/4, 2(l%4)) and
 * (l/4, 2(l%4)+1) in r[i]. */
__device__ __forceinline__ void kat_ldmatrix(uint32_t *r, const void *smem)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* The same, transposed: thread l gets (2(l%4), l/4) and (2(l%4)+1, l/4). */
__device__ __forceinline__ void kat_ldmatrix_t(uint32_t *r, const void *smem)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* Which (sequence, tile) CTA x takes: tiles numbered sequence by sequence
 * (ceil(n_new * gq / bq) each), found by a block-wide prefix sum over
 * the sequences. Returns the sequence, or -1 when x is past the last tile. */
__device__ int64_t kat_find_tile(const kiln_attention_cuda_args &a, int64_t x, int64_t gq, int64_t bq,
                                 int64_t *tile_out)
{
    __shared__ int64_t s_warp[KAT_THREADS / 32];
    __shared__ int64_t s_found[2];
    const int64_t S = a.n_seqs, per = (S + KAT_THREADS - 1) / KAT_THREADS;
    const int64_t lo = threadIdx.x * per, hi = min(lo + per, S);
    int64_t cnt = 0;
    for (int64_t s = lo; s < hi; s++) {
        int64_t n = (int64_t)a.qstart[s + 1] - a.qstart[s];
        n = n < 0 ? 0 : n > a.tokens ? a.tokens : n;
        cnt += (n * gq + bq - 1) / bq;
    }
    if (threadIdx.x == 0)
        s_found[0] = -1;
    /* inclusive scan within the warp, then warp totals */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t inc = cnt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int64_t y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o)
            inc += y;
    }
    if (lane == 31)
        s_warp[warp] = inc;
    __syncthreads();
    int64_t base = inc - cnt;
    for (int w = 0; w < warp; w++)
        base += s_warp[w];
    for (int64_t s = lo; s < hi; s++) {
        int64_t n = (int64_t)a.qstart[s + 1] - a.qstart[s];
        n = n < 0 ? 0 : n > a.tokens ? a.tokens : n;
        int64_t nt = (n * gq + bq - 1) / bq;
        if (x >= base && x < base + nt) {
            s_found[0] = s;
            s_found[1] = x - base;
        }
        base += nt;
    }
    __syncthreads();
    *tile_out = s_found[1];
    return s_found[0];
}

/* ---- the prefill kernels' common parts ---- */

/* The tile a prefill CTA takes: its sequence s, kv head, first row m0 (of
 * the sequence's n_new * gq rows, token-major) and rows, and the
 * positions of its first and last rows' tokens. */
struct kat_ptile {
    int64_t s, kvh, gq, first, n_new, len, m0, rows, p_first, p_last;
    /* element offset of row m in a [tokens, n_heads * d] tensor with rows ld apart */
    __device__ __forceinline__ int64_t row(int64_t m, int64_t ld, int64_t d) const
    {
        return (first + (m0 + m) / gq) * ld + (kvh * gq + (m0 + m) % gq) * d;
    }
    /* the position of row m's token in its sequence */
    __device__ __forceinline__ int64_t pos(int64_t m) const { return len - n_new + (m0 + m) / gq; }
};

/* Finds this CTA's tile of BQ rows (grid as kat_prefill_grid makes it;
 * by_tile: one dimension, tile-major, else x = tile, y = kv head); the
 * longest tiles of a sequence come first. False when there is nothing to
 * do: past the last tile, or inconsistent metadata, whose rows get NaN. */
template <int DT, int D>
__device__ bool kat_prefill_begin(const kiln_attention_cuda_args &a, int32_t by_tile, int64_t bq, kat_ptile &t)
{
    int64_t tile_in_seq;
    t.gq = a.n_heads / a.n_kv_heads;
    t.kvh = by_tile ? blockIdx.x % a.n_kv_heads : blockIdx.y;
    t.s = kat_find_tile(a, by_tile ? blockIdx.x / a.n_kv_heads : blockIdx.x, t.gq, bq, &tile_in_seq);
    if (t.s < 0)
        return false;
    t.first = a.qstart[t.s], t.n_new = (int64_t)a.qstart[t.s + 1] - t.first, t.len = a.seq_lens[t.s];
    const int64_t n_qt = (t.n_new * t.gq + bq - 1) / bq;
    t.m0 = (n_qt - 1 - tile_in_seq) * bq;
    t.rows = min(bq, t.n_new * t.gq - t.m0);
    if (t.first < 0 || t.first + t.n_new > a.tokens || t.len < t.n_new || t.len > a.max_blocks * a.block_size) {
        if (t.first >= 0 && t.first + t.n_new <= a.tokens)
            for (int i = threadIdx.x; i < t.rows * D; i += KAT_THREADS)
                kat_type<DT>::store(a.out, t.row(i / D, (int64_t)a.n_heads * D, D) + i % D, kat_nan());
        return false;
    }
    t.p_first = t.pos(0), t.p_last = t.pos(t.rows - 1);
    return true;
}

/* The causal mask on one m-tile's scores of a tile of BK keys from k0: a
 * key is masked when its offset in the tile passes the row's position's
 * (rows pos_a and pos_b: lane rows l/4 and l/4 + 8; 32-bit offsets). */
template <int BK>
__device__ __forceinline__ void kat_prefill_mask(float (&sc)[BK / 8][4], int64_t pos_a, int64_t pos_b, int64_t k0,
                                                 int tig)
{
    const int pa = (int)min(pos_a - k0, (int64_t)BK), pb = (int)min(pos_b - k0, (int64_t)BK);
#pragma unroll
    for (int j = 0; j < BK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (j * 8 + tig * 2 + (e & 1) > (e < 2 ? pa : pb))
                sc[j][e] = -INFINITY;
}

/* One m-tile's online softmax over a tile of raw scores (masked keys
 * -inf): the max first, as trees (a few dependent steps, not BK / 4), then
 * one FFMA and one exp2 a score (the scale sl2 > 0, the plugin's contract,
 * folded into the exponent); running maxima m in the log2 domain and sums
 * l of the thread's two rows, the accumulators o rescaled, and the
 * probabilities packed for P V. */
template <int DT, int BK, int ND, bool LAZY = false>
__device__ __forceinline__ void kat_prefill_softmax(float (&sc)[BK / 8][4], float sl2, float &m_a, float &m_b,
                                                    float &l_a, float &l_b, float (&o)[ND][4],
                                                    uint32_t (&pf)[BK / 16][4])
{
    float mxa[BK / 8], mxb[BK / 8];
#pragma unroll
    for (int j = 0; j < BK / 8; j++) {
        mxa[j] = fmaxf(sc[j][0], sc[j][1]);
        mxb[j] = fmaxf(sc[j][2], sc[j][3]);
    }
#pragma unroll
    for (int w = 1; w < BK / 8; w *= 2)
#pragma unroll
        for (int j = 0; j + w < BK / 8; j += 2 * w) {
            mxa[j] = fmaxf(mxa[j], mxa[j + w]);
            mxb[j] = fmaxf(mxb[j], mxb[j + w]);
        }
    float mx_a = mxa[0], mx_b = mxb[0];
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    const float mn_a = fmaxf(m_a, mx_a * sl2), mn_b = fmaxf(m_b, mx_b * sl2);
    const float mu_a = mn_a == -INFINITY ? 0.0f : mn_a, mu_b = mn_b == -INFINITY ? 0.0f : mn_b;
    const float c_a = exp2f(m_a - mu_a), c_b = exp2f(m_b - mu_b);
    m_a = mn_a, m_b = mn_b;
    l_a *= c_a, l_b *= c_b;
    /* LAZY (tiles of few keys, where rescaling o costs as much as the
     * tile's mma): only when some row of the warp has a new maximum; a
     * factor of exactly 1 leaves o as it is */
    if (!LAZY || __any_sync(0xffffffffu, c_a != 1.0f || c_b != 1.0f))
#pragma unroll
        for (int n = 0; n < ND; n++) {
            o[n][0] *= c_a, o[n][1] *= c_a;
            o[n][2] *= c_b, o[n][3] *= c_b;
        }
    float sa[BK / 8], sb[BK / 8];
#pragma unroll
    for (int j = 0; j < BK / 8; j++) {
        const float p0 = exp2f(fmaf(sc[j][0], sl2, -mu_a)), p1 = exp2f(fmaf(sc[j][1], sl2, -mu_a));
        const float p2 = exp2f(fmaf(sc[j][2], sl2, -mu_b)), p3 = exp2f(fmaf(sc[j][3], sl2, -mu_b));
        sa[j] = p0 + p1, sb[j] = p2 + p3;
        pf[j / 2][(j & 1) * 2] = kat_mma<DT>::pack(p0, p1);
        pf[j / 2][(j & 1) * 2 + 1] = kat_mma<DT>::pack(p2, p3);
    }
#pragma unroll
    for (int w = 1; w < BK / 8; w *= 2)
#pragma unroll
        for (int j = 0; j + w < BK / 8; j += 2 * w) {
            sa[j] += sa[j + w];
            sb[j] += sb[j + w];
        }
    l_a += sa[0], l_b += sb[0];
}

/* O += P V for MT m-tiles: keys 16kk.. as the k dimension, V (rows LDS
 * elements apart in shared memory) read transposed, each fragment once for
 * the MT m-tiles. */
template <int DT, int D, int BK, int MT, int LDS>
__device__ __forceinline__ void kat_prefill_pv(const uint16_t *sV, int lane, const uint32_t (&pf)[MT][BK / 16][4],
                                               float (&o)[MT][D / 8][4])
{
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++)
#pragma unroll
        for (int np = 0; np < D / 16; np++) {
            uint32_t b[4];
            const int mi = lane >> 3, ri = lane & 7;
            kat_ldmatrix_t(b, &sV[(kk * 16 + ri + (mi & 1) * 8) * LDS + np * 16 + (mi >> 1) * 8]);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                kat_mma<DT>::run(o[mt][2 * np], pf[mt][kk], b[0], b[1]);
                kat_mma<DT>::run(o[mt][2 * np + 1], pf[mt][kk], b[2], b[3]);
            }
        }
}

/* The output rows of MT m-tiles (lane rows ra[mt] and rb[mt]): o over the
 * row sums l (summed over the row's four lanes), NaN for a bad block. */
template <int DT, int D, int MT>
__device__ __forceinline__ void kat_prefill_store(const kiln_attention_cuda_args &a, const kat_ptile &t,
                                                  const float (&o)[MT][D / 8][4], const float *l_a, const float *l_b,
                                                  const int *ra, const int *rb, bool bad, int tig)
{
    uint16_t *out = (uint16_t *)a.out;
    const int64_t out_ld = (int64_t)a.n_heads * D;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float la = l_a[mt], lb = l_b[mt];
#pragma unroll
        for (int off = 1; off < 4; off <<= 1) {
            la += __shfl_xor_sync(0xffffffffu, la, off);
            lb += __shfl_xor_sync(0xffffffffu, lb, off);
        }
        const float ia = bad ? kat_nan() : 1.0f / la, ib = bad ? kat_nan() : 1.0f / lb;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            const int col = n * 8 + tig * 2;
            if (ra[mt] < t.rows)
                *(uint32_t *)&out[t.row(ra[mt], out_ld, D) + col] =
                    kat_mma<DT>::pack(o[mt][n][0] * ia, o[mt][n][1] * ia);
            if (rb[mt] < t.rows)
                *(uint32_t *)&out[t.row(rb[mt], out_ld, D) + col] =
                    kat_mma<DT>::pack(o[mt][n][2] * ib, o[mt][n][3] * ib);
        }
    }
}

/* Grid: tiles (an upper bound of the tiles over all sequences) by kv
 * heads, tile-major in one dimension (by_tile; kat_prefill_grid says
 * why), or x = tile and y = kv head. The rows of a sequence are its (new
 * token, query head of the kv head) pairs, token-major, so the query heads
 * of a group share every K/V tile and a decode sequence in a mixed step
 * costs one K/V pass, not one per head. F8: the cache holds E4M3 codes,
 * widened to DT on their way into shared memory (kat_prefill_load). Warp
 * w owns rows 16w..16w + 15 of the tile (MT = 1 m-tile; the loops over
 * m-tiles are kat_prefill_wide's); in the mma fragments lane l holds rows
 * l/4 and l/4 + 8 and columns 2(l%4), +1. */
template <int DT, int D, bool F8>
__global__ void __launch_bounds__(KAT_THREADS, 3) kat_prefill(kiln_attention_cuda_args a, int32_t by_tile)
{
    KTL_SCOPE(0);
    constexpr int LDS = D + 8; /* smem row pitch (elements): 16-byte rows, no bank conflicts */
    constexpr int KC = D / 16; /* k-steps of QK^T */
    constexpr int ND = D / 8;  /* n-tiles of the output */
    constexpr int MT = 1, BQ = 64, BK = 64;
    __shared__ __align__(16) uint16_t sK[BK * LDS];
    __shared__ __align__(16) uint16_t sV[BK * LDS];
    __shared__ int64_t s_off[2][BK]; /* K row offsets of the keys of tiles kt (kt & 1) and kt + 1 */
    __shared__ int s_bad;

    kcu_after_prior();
    if (threadIdx.x == 0)
        s_bad = 0; /* published by kat_find_tile's barriers */
    kat_ptile t;
    if (!kat_prefill_begin<DT, D>(a, by_tile, BQ, t))
        return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tig = lane & 3;
    /* this thread's two rows: ra and rb = ra + 8 */
    const int ra[MT] = {warp * 16 + gr}, rb[MT] = {warp * 16 + gr + 8};
    const int64_t pos_a = t.pos(ra[0]), pos_b = t.pos(rb[0]);

    uint32_t qa[KC][4];
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        const uint32_t *qr_a = (const uint32_t *)((const uint16_t *)a.q + t.row(ra[0], a.q_ld, D) + kc * 16);
        const uint32_t *qr_b = (const uint32_t *)((const uint16_t *)a.q + t.row(rb[0], a.q_ld, D) + kc * 16);
        qa[kc][0] = ra[0] < t.rows ? qr_a[tig] : 0u;
        qa[kc][1] = rb[0] < t.rows ? qr_b[tig] : 0u;
        qa[kc][2] = ra[0] < t.rows ? qr_a[4 + tig] : 0u;
        qa[kc][3] = rb[0] < t.rows ? qr_b[4 + tig] : 0u;
    }
    float o[MT][ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
        o[0][n][0] = o[0][n][1] = o[0][n][2] = o[0][n][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a[MT] = {0.0f}, l_b[MT] = {0.0f};
    const float sl2 = a.scale * KAT_LOG2E;
    const int64_t vd = kat_vdelta(a);

    /* Pipeline: K of tile kt + 1 loads during P V of tile kt, V of tile kt
     * during Q K^T of tile kt; one cp.async group each, so wait_group 1
     * waits for K(kt) while V(kt) may still fly. Rows past p_last and bad
     * blocks are zero-filled (garbage times a zero probability could be
     * NaN). */
    const int64_t n_kt = (t.p_last + BK) / BK;
    if (threadIdx.x < BK) {
        int64_t off = threadIdx.x <= t.p_last ? kat_krow(a, t.s, threadIdx.x, t.kvh) : -2;
        if (off == -1)
            s_bad = 1;
        s_off[0][threadIdx.x] = off;
    }
    __syncthreads();
    /* a thread's 16-byte pieces of a tile: column lc of rows lr, lr + LRS, ... */
    constexpr int LRS = KAT_THREADS / (D / 8);
    const int lr = threadIdx.x / (D / 8), lc = (threadIdx.x % (D / 8)) * 8;
#pragma unroll
    for (int r = lr; r < BK; r += LRS) {
        int64_t off = s_off[0][r];
        kat_prefill_load<DT, F8>(&sK[r * LDS + lc], a.cache, off >= 0 ? off + lc : -1);
    }
    kat_cp_commit();
    for (int64_t kt = 0; kt < n_kt; kt++) {
        const int64_t k0 = kt * BK;
        const int cur = (int)(kt & 1);
#pragma unroll
        for (int r = lr; r < BK; r += LRS) {
            int64_t off = s_off[cur][r];
            kat_prefill_load<DT, F8>(&sV[r * LDS + lc], a.cache, off >= 0 ? off + vd + lc : -1);
        }
        kat_cp_commit();
        if (kt + 1 < n_kt && threadIdx.x < BK) {
            int64_t kp = k0 + BK + threadIdx.x, off = kp <= t.p_last ? kat_krow(a, t.s, kp, t.kvh) : -2;
            if (off == -1)
                s_bad = 1;
            s_off[cur ^ 1][threadIdx.x] = off;
        }
        kat_cp_wait<1>();
        __syncthreads();

        /* S = Q K^T for this warp's 16 rows and the tile's BK keys; k-steps
         * outside, key groups inside: consecutive mma are independent */
        float sc[BK / 8][4];
#pragma unroll
        for (int j = 0; j < BK / 8; j++)
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < KC; kc += 2)
#pragma unroll
            for (int j = 0; j < BK / 8; j++) {
                /* keys 8j..8j+7 by dims 16kc..16kc+31: the B fragments of k-steps kc and kc + 1 */
                uint32_t b[4];
                kat_ldmatrix(b, &sK[(j * 8 + (lane & 7)) * LDS + (lane >> 3) * 8 + kc * 16]);
                kat_mma<DT>::run(sc[j], qa[kc], b[0], b[1]);
                kat_mma<DT>::run(sc[j], qa[kc + 1], b[2], b[3]);
            }
        /* the causal mask where the tile reaches past the first row's position */
        if (k0 + BK - 1 > t.p_first)
            kat_prefill_mask<BK>(sc, pos_a, pos_b, k0, tig);
        uint32_t pf[MT][BK / 16][4];
        kat_prefill_softmax<DT, BK, ND>(sc, sl2, m_a, m_b, l_a[0], l_b[0], o[0], pf[0]);

        kat_cp_wait<0>();
        __syncthreads(); /* V(kt) is in; every warp is done with sK */
        if (kt + 1 < n_kt) {
#pragma unroll
            for (int r = lr; r < BK; r += LRS) {
                int64_t off = s_off[cur ^ 1][r];
                kat_prefill_load<DT, F8>(&sK[r * LDS + lc], a.cache, off >= 0 ? off + lc : -1);
            }
            kat_cp_commit();
        }
        kat_prefill_pv<DT, D, BK, MT, LDS>(sV, lane, pf, o);
        __syncthreads();
    }
    kat_prefill_store<DT, D, MT>(a, t, o, l_a, l_b, ra, rb, s_bad != 0, tig);
}

/* kat_prefill_wide's layout: Q's tile and two stages of K and V tiles in
 * dynamic shared memory, rows D + 8 elements apart (16-byte aligned,
 * ldmatrix without bank conflicts). */
template <int D, int MT, int BK> struct kat_prefill_cfg {
    static constexpr int LDS = D + 8;
    static constexpr int BQ = 64 * MT;
    static constexpr size_t SMEM = (size_t)(BQ + 4 * BK) * LDS * 2;
};

/* The wide form, for long prompts (kat_launch_prefill chooses): 128 query
 * rows a CTA, two m-tiles of 16 a warp that share every K and V fragment
 * read from shared memory (FlashAttention-2's block), keys in tiles of 64.
 * Grid and rows as kat_prefill's; warp w owns rows 64mt + 16w..64mt + 16w
 * + 15 for each m-tile mt < MT.
 *
 * The keys come through two stages of shared memory: the loads of tile
 * kt + 1 are issued as tile kt's work starts, so they have the whole of it
 * (Q K^T, softmax, P V) to land, and K and V are separate cp.async groups,
 * so Q K^T waits only for K. Q is read from shared memory by ldmatrix at
 * each k-step, not held in registers (64 registers that two m-tiles
 * cannot spare). Tiles wholly at or before the first row's position run
 * without the causal mask (a separate instantiation of the tile's body),
 * and the scale is folded into the exponent (one FFMA a score: scale > 0
 * is the plugin's contract). F8: as kat_prefill (those loads are not
 * asynchronous; the barriers publish them). At head_dim 128 ptxas spills
 * about 190 bytes a thread (255 registers); it is still the faster form
 * from about a thousand tokens a sequence (bench/README.md, twenty-third
 * session). */
template <int DT, int D, bool F8, int MT = 2, int BK = 64>
__global__ void __launch_bounds__(KAT_THREADS, 2) kat_prefill_wide(kiln_attention_cuda_args a, int32_t by_tile)
{
    KTL_SCOPE(0);
    typedef kat_prefill_cfg<D, MT, BK> C;
    constexpr int LDS = C::LDS, BQ = C::BQ;
    constexpr int KC = D / 16; /* k-steps of QK^T */
    constexpr int ND = D / 8;  /* n-tiles of the output */
    extern __shared__ __align__(16) unsigned char kat_psmem[];
    uint16_t *const sQ = (uint16_t *)kat_psmem;
    uint16_t *const sKV = sQ + BQ * LDS; /* stage st: K at sKV + 2 st BK LDS, V BK LDS after it */
    __shared__ int64_t s_off[2][BK];     /* K row offsets of the keys of tiles kt (kt & 1) and kt + 1 */
    __shared__ int s_bad;

    kcu_after_prior();
    if (threadIdx.x == 0)
        s_bad = 0; /* published by kat_find_tile's barriers */
    kat_ptile t;
    if (!kat_prefill_begin<DT, D>(a, by_tile, BQ, t))
        return;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tig = lane & 3;
    /* this thread's two rows of each m-tile mt: ra[mt] and rb[mt] = ra[mt] + 8, and their positions */
    int ra[MT], rb[MT];
    int64_t pos_a[MT], pos_b[MT];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        ra[mt] = mt * 64 + warp * 16 + gr, rb[mt] = ra[mt] + 8;
        pos_a[mt] = t.pos(ra[mt]), pos_b[mt] = t.pos(rb[mt]);
    }

    /* a thread's 16-byte pieces of a tile: column lc of rows lr, lr + LRS, ... */
    constexpr int LRS = KAT_THREADS / (D / 8);
    const int lr = threadIdx.x / (D / 8), lc = (threadIdx.x % (D / 8)) * 8;
    const int64_t vd = kat_vdelta(a);
    const int64_t n_kt = (t.p_last + BK) / BK;
    const int64_t n_plain = (t.p_first + 1) / BK; /* tiles every row sees whole: no mask */
    /* the K row offsets of tile kt's keys into slot kt & 1 (threads < BK) */
    auto offsets = [&](int64_t kt) {
        if (threadIdx.x < BK) {
            const int64_t kp = kt * BK + threadIdx.x, off = kp <= t.p_last ? kat_krow(a, t.s, kp, t.kvh) : -2;
            if (off == -1)
                s_bad = 1;
            s_off[kt & 1][threadIdx.x] = off;
        }
    };
    /* tile kt's K (v = 0) or V (v = 1) into its stage, one cp.async group */
    auto load = [&](int64_t kt, int v) {
        uint16_t *dst = sKV + ((kt & 1) * 2 + v) * BK * LDS;
        const int64_t add = v ? vd + lc : lc;
#pragma unroll
        for (int r = lr; r < BK; r += LRS) {
            const int64_t off = s_off[kt & 1][r];
            kat_prefill_load<DT, F8>(&dst[r * LDS + lc], a.cache, off >= 0 ? off + add : -1);
        }
        kat_cp_commit();
    };
    offsets(0);
    if (n_kt > 1)
        offsets(1);
    __syncthreads();
    /* Q's tile (rows past `rows` zero), then K and V of tile 0: groups {Q, K0}, {V0} */
    for (int r = lr; r < BQ; r += LRS)
        kat_cp_async16(&sQ[r * LDS + lc], r < t.rows ? (const uint16_t *)a.q + t.row(r, a.q_ld, D) + lc : a.q,
                       r < t.rows ? 16 : 0);
    load(0, 0);
    load(0, 1);

    float o[MT][ND][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < ND; n++)
            o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    float m_a[MT], m_b[MT], l_a[MT], l_b[MT]; /* running maxima in the log2 domain (scaled), sums */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        m_a[mt] = m_b[mt] = -INFINITY, l_a[mt] = l_b[mt] = 0.0f;
    const float sl2 = a.scale * KAT_LOG2E;

    auto tile = [&](int64_t kt, auto masked) {
        const int64_t k0 = kt * BK;
        const uint16_t *sK = sKV + (kt & 1) * 2 * BK * LDS, *sV = sK + BK * LDS;
        const bool next = kt + 1 < n_kt;
        /* pending: {K(kt)}, {V(kt)}: K(kt) in, and every warp is past P V of
         * tile kt - 1, so the other stage is free */
        kat_cp_wait<1>();
        __syncthreads();
        if (next) {
            load(kt + 1, 0);
            load(kt + 1, 1);
        }
        if (kt + 2 < n_kt)
            offsets(kt + 2); /* slot kt & 1: tile kt's loads were issued a tile ago */

        /* S = Q K^T for this warp's 16 * MT rows and the tile's BK keys */
        float sc[MT][BK / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int j = 0; j < BK / 8; j++)
                sc[mt][j][0] = sc[mt][j][1] = sc[mt][j][2] = sc[mt][j][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < KC; kc += 2) {
            /* the A fragments of k-steps kc and kc + 1 of each m-tile */
            uint32_t qf[MT][2][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    kat_ldmatrix(qf[mt][h], &sQ[(mt * 64 + warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS +
                                                (kc + h) * 16 + (lane >> 4) * 8]);
#pragma unroll
            for (int j = 0; j < BK / 8; j++) {
                /* keys 8j..8j+7 by dims 16kc..16kc+31: the B fragments of k-steps kc and kc + 1 */
                uint32_t b[4];
                kat_ldmatrix(b, &sK[(j * 8 + (lane & 7)) * LDS + (lane >> 3) * 8 + kc * 16]);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    kat_mma<DT>::run(sc[mt][j], qf[mt][0], b[0], b[1]);
                    kat_mma<DT>::run(sc[mt][j], qf[mt][1], b[2], b[3]);
                }
            }
        }
        uint32_t pf[MT][BK / 16][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            if (decltype(masked)::value)
                kat_prefill_mask<BK>(sc[mt], pos_a[mt], pos_b[mt], k0, tig);
            kat_prefill_softmax<DT, BK, ND>(sc[mt], sl2, m_a[mt], m_b[mt], l_a[mt], l_b[mt], o[mt], pf[mt]);
        }

        /* pending: {V(kt)} and, with a next tile, {K(kt+1)}, {V(kt+1)} */
        if (next)
            kat_cp_wait<2>();
        else
            kat_cp_wait<0>();
        __syncthreads();
        kat_prefill_pv<DT, D, BK, MT, LDS>(sV, lane, pf, o);
    };
    int64_t kt = 0;
    for (; kt < n_plain; kt++)
        tile(kt, std::false_type());
    for (; kt < n_kt; kt++)
        tile(kt, std::true_type());
    kat_prefill_store<DT, D, MT>(a, t, o, l_a, l_b, ra, rb, s_bad != 0, tig);
}

/* ---- 2d. decode, pipelined: whole rows of K and V through shared memory --------------- */

/* KAT_PIPE_CTAS: the CTAs to aim for when splitting, four per SM on 132
 * SMs (attention_bench --sweep on the H200: batch 64 at 8192 context in
 * 767 us against 876 at two per SM, every other case equal). */
#define KAT_PIPE_STAGES 4          /* cp.async stages per warp: three in flight while one is used */
#define KAT_PIPE_STAGES_FEW 3      /* KILN_ATTENTION_PIPE_STAGES=3: a fourth CTA per SM (see kat_pipe_stages) */
#define KAT_PIPE_STAGE_BYTES 4096  /* K and V bytes of one stage of one warp */
#define KAT_PIPE_SPLIT_KEYS 64     /* fewest keys a split takes by default (see kat_pipe_keys) */
#define KAT_PIPE_SPLIT_KEYS_MIN 16 /* the smallest CTA stage (f32, head_dim 128): the workspace's bound */
#define KAT_PIPE_CTAS 528
#define KAT_PIPE_CTAS_MAX 1056 /* the most KILN_ATTENTION_PIPE_CTAS may ask for (the workspace's) */
#define KAT_MAX_DEVICES 64     /* devices whose kat_pipe smem limit is remembered as set */
#define KAT_PIPE_EARLY 1       /* kat_pipe's opts: cached keys' loads before the wait */
#define KAT_PIPE_STAGE_BLOCK 2 /* one table read a warp stage where the block size allows */

/* Layout of kat_pipe for activations DT and head_dim D: a row is NV
 * vectors of PER elements (16 bytes of q), read by LPR lanes, a warp reads
 * RPW rows at a time, and a stage is ROWS rows of K and of V, NP passes of
 * RPW rows. A vector of the cache is VB bytes: 16 in DT, PER with F8 (E4M3
 * codes, one byte each: a stage holds twice the rows). Lane (sub, lv)
 * copies vector lv of rows sub, sub + RPW, ... of a stage into shared
 * memory and is the only one to read them back, so cp.async.wait_group
 * alone orders the copy before the use: no barrier in the loop. */
template <int DT, int D, bool F8 = false> struct kat_pipe_shape {
    static constexpr int PER = kat_type<DT>::per;
    static constexpr int NV = D / PER;
    static constexpr int VB = F8 ? PER : 16;
    static constexpr int LPR = NV;
    static constexpr int RPW = 32 / LPR;
    static constexpr int ROWS = KAT_PIPE_STAGE_BYTES / (2 * NV * VB);
    static constexpr int NP = ROWS / RPW;
    static constexpr int CTA_ROWS = ROWS * (KAT_THREADS / 32); /* keys of one stage of all warps */
    static_assert(NV <= 32 && 32 % NV == 0 && ROWS % RPW == 0, "kat_pipe layout");
};

/* cp.async of VB bytes (16, 8 or 4; n = 0: zeros), and the same copy done
 * by the lane itself. */
template <int VB> __device__ __forceinline__ void kat_cp_async(void *smem, const void *src, int n)
{
    if (VB == 16) {
        kat_cp_async16(smem, src, n);
        return;
    }
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(s), "l"(src), "n"(VB), "r"(n) : "memory");
}

template <int VB> __device__ __forceinline__ void kat_copy(void *dst, const void *src, int n)
{
    if (VB == 16)
        *(uint4 *)dst = n ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
    else if (VB == 8)
        *(uint2 *)dst = n ? *(const uint2 *)src : make_uint2(0, 0);
    else
        *(uint32_t *)dst = n ? *(const uint32_t *)src : 0u;
}

/* A cache vector of kat_pipe from shared memory as PER f32 values. */
template <int DT, bool F8> __device__ __forceinline__ void kat_pipe_unpack(const unsigned char *p, float *f)
{
    if (F8)
        kat_e4m3_unpack<kat_type<DT>::per>(p, f);
    else
        kat_type<DT>::unpack(*(const uint4 *)p, f);
}

/* The splits that run for a token of nk keys when G were launched: from
 * the actual length, `keys` (a multiple of the CTA stage, so that each
 * split gets at least one stage) at least each, so a short sequence in a
 * step planned for long ones is not cut into pieces too small to fill the
 * pipeline. kat_combine with tile `keys` counts the same. */
__device__ __forceinline__ int kat_pipe_splits(int64_t nk, int G, int keys)
{
    int64_t g = (nk + keys - 1) / keys;
    return (int)(g < G ? g : G);
}

/* Sums HG values over the N lanes of an aligned lane group (lane index
 * lv in it) and leaves each lane the total of one of them, value lv /
 * (N / HG): the first log2(HG) butterfly steps halve the values each lane
 * carries (a lane keeps one half and sends the other), the rest add the
 * one left. HG - 1 + log2(N / HG) shuffles instead of HG * log2(N). */
template <int HG, int N> __device__ __forceinline__ float kat_reduce_scatter(float *v, int lv)
{
    static_assert(HG <= N && N <= 32, "kat_reduce_scatter");
#pragma unroll
    for (int c = HG, o = N / 2; c > 1; c /= 2, o /= 2) {
        const bool upper = (lv & o) != 0;
#pragma unroll
        for (int i = 0; i < c / 2; i++) {
            const float send = upper ? v[i] : v[i + c / 2], keep = upper ? v[i + c / 2] : v[i];
            v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
    }
#pragma unroll
    for (int o = N / HG / 2; o > 0; o /= 2)
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], o);
    return v[0];
}

/* Grid: x = token, y = kv head * n_hg + group of HG query heads, z =
 * split (G = gridDim.z; the first kat_pipe_splits(keys, G) take a
 * contiguous range of keys each, the others only take part in a cluster
 * merge). Each warp runs its own online softmax over stages w, w + 4, ...
 * of its split (each lane group over its rows, each lane keeping the state
 * of one query head: the scores' reduction ends scattered over the lanes,
 * kat_reduce_scatter, and the probabilities are fetched by shuffles for
 * P.V), S - 1 stages of cp.async in flight (S = KAT_PIPE_STAGES: a CTA
 * keeps 48 KB of K and V loads in flight); warps and lane groups merge
 * once at the end. `fused` and the handling of
 * inconsistent metadata are kat_decode's. The output: written directly
 * (G == 1), merged in the cluster (`cluster`), or partials for kat_combine. */
template <int DT, int D, int HG, int S, bool F8, int NW = KAT_THREADS / 32>
__global__ void __launch_bounds__(NW * 32, NW == 1   ? (HG <= 4 ? 16 : 8)
                                           : HG <= 4 ? (S < KAT_PIPE_STAGES ? 4 : 3)
                                                     : 2)
    kat_pipe(kiln_attention_cuda_args a, int32_t fused_in, int32_t cluster, int32_t split_keys, int32_t opts)
{
    KTL_SCOPE(0);
    typedef kat_pipe_shape<DT, D, F8> L;
    constexpr int PER = L::PER, NV = L::NV, LPR = L::LPR, RPW = L::RPW, ROWS = L::ROWS, NP = L::NP, VB = L::VB;
    constexpr int CES = F8 ? 1 : 16 / PER; /* bytes of a cache element */
    /* an FP8 cache is written by kat_write and read back rounded, new keys
     * too (as the CPU reads them), so never fused */
    const int32_t fused = F8 ? 0 : fused_in;
    /* NW warps a CTA: 4 by default; 1 (KILN_ATTENTION_PIPE_WARPS=1, one
     * split only) gives each (token, head group) a warp of its own, with
     * no barrier and no merge between warps, for many short sequences */
    constexpr int W = NW, THREADS = NW * 32, CTA_ROWS = ROWS * NW;
    static_assert(THREADS >= 2 * NV, "the fused cache write takes a thread a vector of k and of v");
    extern __shared__ __align__(16) unsigned char kat_smem[];
    __shared__ float s_mw[W][HG], s_lw[W][HG], s_m[HG], s_l[HG];

    /* With `early`, what no kernel of this step writes is read before the
     * wait on the previous kernel: the metadata, and the first S - 1
     * stages of the keys cached by earlier steps
     * (positions below k.n_old), so those loads fly while the previous
     * kernel (the qkv projection) still runs and only q and the new keys'
     * rows are read after the wait. Why that is safe under programmatic
     * dependent launch: this kernel may start once every CTA of the
     * previous one has passed its launch_dependents, which kiln's kernels
     * do first (kcu_after_prior), so that kernel, and the ones before it
     * that started the same way, may still run; what is read before the
     * wait must therefore be written by no kernel of the stream not known
     * to be finished. kiln/PagedAttention's contract (attention.c) gives
     * that: block_table, seq_lens and query_start are step inputs, and
     * kv_cache is bound by the caller and kept across steps, written only
     * by this plugin's cache write (kat_write, or the fused write below),
     * at positions k.n_old and later, which are read after the wait. The
     * LLM runtime copies the inputs before a step's kernels and waits for
     * each step to end before the next (kiln_llm_step_run). Whatever is
     * written (output, cache, workspace) and whatever the previous kernel
     * makes (q, k, v) comes after the wait. Without `early` everything
     * does, as before. */
    const bool early = (opts & KAT_PIPE_EARLY) != 0;
    if (early)
        kat_launch_dependents();
    else
        kcu_after_prior();
    const int G = gridDim.z, z = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int gq = a.n_heads / a.n_kv_heads, n_hg = (gq + HG - 1) / HG;
    const int kvh = blockIdx.y / n_hg, h0 = kvh * gq + (blockIdx.y % n_hg) * HG;
    const int ng = min(HG, kvh * gq + gq - h0);
    const int64_t t = blockIdx.x, row0 = t * a.n_heads + h0;
    kat_tok k = kat_token(a, t);
    const int64_t nk = k.valid ? k.pos + 1 : 0; /* an invalid token reads no keys */
    const int64_t n_old = fused ? k.n_old : nk; /* keys from here on come from the inputs */
    const int ge = kat_pipe_splits(nk, G, split_keys);
    /* this split's keys [k0, k1): its even share of whole CTA stages */
    const int64_t stages = (nk + CTA_ROWS - 1) / CTA_ROWS, zc = z < ge ? z : ge;
    const int64_t k0 = ge ? min(zc * stages / ge * CTA_ROWS, nk) : 0;
    const int64_t k1 = ge ? min((zc + (z < ge)) * stages / ge * CTA_ROWS, nk) : 0;
    const int64_t n_st = (k1 - k0 + ROWS - 1) / ROWS; /* warp stages of the split */
    const int n_my = (int)(n_st > warp ? (n_st - warp + W - 1) / W : 0);
    const int sub = lane / LPR, lv = lane % LPR;
    const int64_t vd = kat_vdelta(a);
    const char *cache = (const char *)a.cache;
    const char *kin = (const char *)a.k + (k.first * a.k_ld + (int64_t)kvh * D + lv * PER) * (16 / PER);
    const char *vin = (const char *)a.v + (k.first * a.v_ld + (int64_t)kvh * D + lv * PER) * (16 / PER);
    const int32_t *table = a.table + k.s * a.max_blocks;
    /* a split past the keys outside a cluster writes nothing (the cache
     * write and an invalid token's NaN output are split 0's): it leaves
     * before the wait, so its slot on the SM is free while the previous
     * kernel ends and the next one starts */
    if (early && !cluster && z > 0 && z >= ge)
        return;
    unsigned char *mine = kat_smem + (size_t)warp * S * KAT_PIPE_STAGE_BYTES;
    int bad = 0;
    /* the first key of this warp's j-th stage */
    auto stage_key = [&](int j) { return k0 + ((int64_t)j * W + warp) * ROWS; };
    /* Where this lane's K and V vectors of key kp (< k1) come from: 16
     * bytes each, or 0 for a block outside the cache (zeros, NaN outputs). */
    auto source = [&](int64_t kp, const char *&ks, const char *&vs) {
        if (kp >= n_old) {
            ks = kin + (kp - n_old) * a.k_ld * (16 / PER);
            vs = vin + (kp - n_old) * a.v_ld * (16 / PER);
            return 16;
        }
        const int32_t blk = __ldg(&table[(int32_t)kp / a.block_size]);
        if (blk < 0 || blk >= a.n_blocks) {
            bad = 1;
            return 0;
        }
        const int64_t o =
            (((int64_t)blk * 2 * a.n_kv_heads + kvh) * a.block_size + (int32_t)kp % a.block_size) * D + lv * PER;
        ks = cache + o * CES;
        vs = cache + (o + vd) * CES;
        return VB;
    };
    /* With a block size that is a multiple of ROWS (and
     * KAT_PIPE_STAGE_BLOCK), the ROWS keys of a warp stage, which starts
     * at a multiple of ROWS, lie in one block: one table read and one
     * address a stage instead of one a row, a sixth or so of the loop's
     * instructions at 8 keys a stage (64-bit address arithmetic and a
     * division by the block size per row), which the many short
     * sequences of continuous batching, bound by instruction issue rather
     * than by memory, pay on every key. */
    const bool stage_block = (opts & KAT_PIPE_STAGE_BLOCK) && a.block_size % ROWS == 0;
    /* cp.async of stage j into slot j % S: K and V of this lane's rows
     * (past the split's keys: zeros, masked later); `ahead` (before the
     * wait) leaves out the rows of this step's keys */
    auto issue = [&](int j, bool ahead) {
        unsigned char *sk = mine + (j % S) * KAT_PIPE_STAGE_BYTES, *sv = sk + KAT_PIPE_STAGE_BYTES / 2;
        const int64_t kb = stage_key(j);
        const char *bk = cache; /* with stage_block: this lane's vector of the stage's first row */
        int bn = 0;
        if (stage_block && kb < n_old && kb < k1) {
            const int32_t blk = __ldg(&table[(int32_t)kb / a.block_size]);
            if (blk >= 0 && blk < a.n_blocks) {
                bk =
                    cache + ((((int64_t)blk * 2 * a.n_kv_heads + kvh) * a.block_size + (int32_t)kb % a.block_size) * D +
                             lv * PER) *
                                CES;
                bn = VB;
            } else {
                bad = 1; /* as source() would for the stage's first key */
            }
        }
#pragma unroll
        for (int i = 0; i < NP; i++) {
            const int64_t kp = kb + i * RPW + sub;
            if (ahead && kp >= k.n_old && kp < k1)
                continue;
            const char *ks = cache, *vs = cache;
            int n = 0;
            if (kp < k1 && stage_block && kp < n_old) {
                n = bn;
                if (n) {
                    ks = bk + (int64_t)(i * RPW + sub) * D * CES;
                    vs = ks + vd * CES;
                }
            } else if (kp < k1) {
                n = source(kp, ks, vs);
            }
            const int r = (i * RPW + sub) * NV + lv;
            kat_cp_async<VB>(sk + r * VB, ks, n);
            kat_cp_async<VB>(sv + r * VB, vs, n);
        }
    };
    /* This loop, the one over this step's rows and the stage loop stay
     * rolled: the code after the wait runs once a step, its instructions
     * fetched from L2 (ncu: a quarter of the stall cycles on instruction
     * fetch when issue() was inlined once a stage, 7.5 K instructions in
     * all), and at a short context each runs a few times at most. */
#pragma unroll 1
    for (int j = 0; j < S - 1; j++) {
        if (j < n_my)
            issue(j, early);
        kat_cp_commit(); /* empty groups keep the count: stage j is group j */
    }
    /* the fused cache write: lane u of the first 2 * NV threads of split 0
     * writes vector u of the new key's k (then v) row. Its cache row comes
     * from the table, a step input, so it is found before the wait; the
     * row is loaded right after it and stored only after the merge below,
     * so that no warp waits on that load (nothing in this kernel reads the
     * row back from the cache: keys from n_old on come from k and v) */
    char *fw_dst = NULL;
    const uint4 *fw_src = NULL;
    if (fused && k.valid && z == 0 && blockIdx.y % n_hg == 0 && threadIdx.x < 2 * NV) {
        const int64_t dst = kat_krow(a, k.s, k.pos, kvh);
        if (dst >= 0) {
            const int kind = threadIdx.x / NV, u = threadIdx.x % NV;
            fw_src = (const uint4 *)((const char *)(kind ? a.v : a.k) +
                                     (t * (kind ? a.v_ld : a.k_ld) + (int64_t)kvh * D) * (16 / PER)) +
                     u;
            fw_dst = (char *)a.cache + ((dst + kind * kat_vdelta(a)) * (16 / PER)) + u * 16;
        }
    }
    if (early)
        kat_wait_prior();
    if (!k.valid) { /* a whole cluster leaves here together */
        if (G == 1 || (cluster && z == 0))
            for (int i = threadIdx.x; i < ng * D; i += THREADS)
                kat_type<DT>::store(a.out, row0 * D + i, kat_nan());
        return;
    }
    const uint4 fw = fw_src ? *fw_src : make_uint4(0, 0, 0, 0);
    ktl_mark(0);
    if (z >= ge) { /* no keys, nothing issued: in a cluster that merges it only joins the barriers */
        if (cluster && ge > 1) {
            cg::this_cluster().sync();
            cg::this_cluster().sync();
        }
        return;
    }
    /* after kat_reduce_scatter lane lv holds query head lv / HS; the lanes
     * of this lane group that hold head g are head_lane + g * HS + ... */
    constexpr int HS = LPR / HG;
    const int head_lane = sub * LPR;
    float q[HG][PER], acc[HG][PER], m_own = -INFINITY, l_own = 0.0f;
#pragma unroll
    for (int g = 0; g < HG; g++) {
        uint4 u = make_uint4(0, 0, 0, 0);
        if (g < ng)
            u = *(const uint4 *)((const char *)a.q + ((t * a.q_ld + (int64_t)(h0 + g) * D) + lv * PER) * (16 / PER));
        kat_type<DT>::unpack(u, q[g]);
#pragma unroll
        for (int e = 0; e < PER; e++)
            acc[g][e] = 0.0f;
    }
    /* the rows `early` left out of the first stages (this step's keys),
     * loaded by the lane that reads them back: its own stores come before
     * its reads, so no cp.async group needs to cover them */
    if (early)
#pragma unroll 1
        for (int j = 0; j < S - 1 && j < n_my; j++) {
            unsigned char *sk = mine + (j % S) * KAT_PIPE_STAGE_BYTES, *sv = sk + KAT_PIPE_STAGE_BYTES / 2;
#pragma unroll 1
            for (int i = 0; i < NP; i++) {
                const int64_t kp = stage_key(j) + i * RPW + sub;
                if (kp < k.n_old || kp >= k1)
                    continue;
                const char *ks = cache, *vs = cache;
                const int n = source(kp, ks, vs);
                const int r = (i * RPW + sub) * NV + lv;
                kat_copy<VB>(sk + r * VB, ks, n);
                kat_copy<VB>(sv + r * VB, vs, n);
            }
        }
    ktl_mark(1);
    const float sl2 = a.scale * KAT_LOG2E;
#pragma unroll 1
    for (int j = 0; j < n_my; j++) {
        if (j + S - 1 < n_my)
            issue(j + S - 1, false); /* into the slot stage j - 1 used: this lane is done with it */
        kat_cp_commit();
        kat_cp_wait<S - 1>();
        const unsigned char *sk = mine + (j % S) * KAT_PIPE_STAGE_BYTES, *sv = sk + KAT_PIPE_STAGE_BYTES / 2;
        const int64_t kb = stage_key(j);
        /* scores: lane (sub, lv) ends with the whole dot product of its
         * rows for query head hd (kat_reduce_scatter) */
        float p[NP];
#pragma unroll
        for (int i = 0; i < NP; i++) {
            const int r = (i * RPW + sub) * NV + lv;
            float kf[PER], d[HG];
            kat_pipe_unpack<DT, F8>(sk + r * VB, kf);
#pragma unroll
            for (int g = 0; g < HG; g++) {
                d[g] = 0.0f;
#pragma unroll
                for (int e = 0; e < PER; e++)
                    d[g] = fmaf(q[g][e], kf[e], d[g]);
            }
            const float x = kat_reduce_scatter<HG, LPR>(d, lv);
            p[i] = kb + i * RPW + sub < k1 ? x * sl2 : -INFINITY;
        }
        /* online softmax of head hd over this lane group's rows */
        float mt = p[0];
#pragma unroll
        for (int i = 1; i < NP; i++)
            mt = fmaxf(mt, p[i]);
        const float mn = fmaxf(m_own, mt), mu = mn == -INFINITY ? 0.0f : mn, c = exp2f(m_own - mu);
        m_own = mn;
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < NP; i++) {
            p[i] = exp2f(p[i] - mu);
            sum += p[i];
        }
        l_own = fmaf(l_own, c, sum);
        /* every lane weighs V for all heads: each head's factors from a lane that has them */
#pragma unroll
        for (int g = 0; g < HG; g++) {
            const float cg = HG == 1 ? c : __shfl_sync(0xffffffffu, c, head_lane + g * HS);
#pragma unroll
            for (int e = 0; e < PER; e++)
                acc[g][e] *= cg;
        }
#pragma unroll
        for (int i = 0; i < NP; i++) {
            const int r = (i * RPW + sub) * NV + lv;
            float vf[PER];
            kat_pipe_unpack<DT, F8>(sv + r * VB, vf);
#pragma unroll
            for (int g = 0; g < HG; g++) {
                const float pg = HG == 1 ? p[i] : __shfl_sync(0xffffffffu, p[i], head_lane + g * HS);
#pragma unroll
                for (int e = 0; e < PER; e++)
                    acc[g][e] = fmaf(pg, vf[e], acc[g][e]);
            }
        }
    }
    kat_cp_wait<0>();
    ktl_mark(2);

    /* merge the lane groups of the warp, then the warps (through the
     * pipeline's shared memory, free now) */
    float *s_o = (float *)kat_smem; /* [W][HG][D], then [HG][D] merged */
    float m[HG], l[HG];
#pragma unroll
    for (int g = 0; g < HG; g++) {
        m[g] = HG == 1 ? m_own : __shfl_sync(0xffffffffu, m_own, head_lane + g * HS);
        l[g] = HG == 1 ? l_own : __shfl_sync(0xffffffffu, l_own, head_lane + g * HS);
    }
#pragma unroll
    for (int g = 0; g < HG; g++) {
        float M = m[g];
#pragma unroll
        for (int o = LPR; o < 32; o <<= 1)
            M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        const float w = exp2f(m[g] - (M == -INFINITY ? 0.0f : M));
        float lg = l[g] * w;
#pragma unroll
        for (int o = LPR; o < 32; o <<= 1)
            lg += __shfl_xor_sync(0xffffffffu, lg, o);
#pragma unroll
        for (int e = 0; e < PER; e++) {
            float x = acc[g][e] * w;
#pragma unroll
            for (int o = LPR; o < 32; o <<= 1)
                x += __shfl_xor_sync(0xffffffffu, x, o);
            acc[g][e] = x;
        }
        m[g] = M;
        l[g] = lg;
    }
    __syncthreads(); /* every warp is done with its slots */
    if (sub == 0)
#pragma unroll
        for (int g = 0; g < HG; g++)
#pragma unroll
            for (int e = 0; e < PER; e++)
                s_o[(warp * HG + g) * D + lv * PER + e] = acc[g][e];
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < HG; g++) {
            s_mw[warp][g] = m[g];
            s_lw[warp][g] = l[g];
        }
    bad = __syncthreads_or(bad);
    if (fw_dst)
        *(uint4 *)fw_dst = fw;
    ktl_mark(3);
    if (threadIdx.x < HG) {
        const int g = threadIdx.x;
        float M = s_mw[0][g];
        for (int w = 1; w < W; w++)
            M = fmaxf(M, s_mw[w][g]);
        float lg = 0.0f;
        for (int w = 0; w < W; w++)
            lg = fmaf(s_lw[w][g], exp2f(s_mw[w][g] - (M == -INFINITY ? 0.0f : M)), lg);
        s_m[g] = M;
        s_l[g] = bad ? kat_nan() : lg;
    }
    float *s_out = s_o + W * HG * D;
#pragma unroll 1
    for (int i = threadIdx.x; i < ng * D; i += THREADS) {
        const int g = i / D;
        float M = s_mw[0][g];
        for (int w = 1; w < W; w++)
            M = fmaxf(M, s_mw[w][g]);
        const float Mu = M == -INFINITY ? 0.0f : M;
        float o = 0.0f;
        for (int w = 0; w < W; w++)
            o = fmaf(s_o[(w * HG) * D + i], exp2f(s_mw[w][g] - Mu), o);
        s_out[i] = o;
    }
    __syncthreads();
    if (cluster && ge > 1) {
        kat_cluster_combine<DT, D>(a, s_out, s_m, s_l, ng, row0, THREADS, ge);
        return;
    }
    /* one split (of one, or the only one of its cluster that took keys,
     * the others having left without a barrier): the output as it is */
    kat_parts parts = kat_parts_of(a, G);
#pragma unroll 1
    for (int i = threadIdx.x; i < ng * D; i += THREADS) {
        const int g = i / D, d = i % D;
        const int64_t row = row0 + g;
        if (G == 1 || cluster) {
            kat_type<DT>::store(a.out, row * D + d, s_out[i] / s_l[g]);
        } else {
            parts.o[(row * G + z) * D + d] = s_out[i];
            if (d == 0) {
                parts.ml[(row * G + z) * 2] = s_m[g];
                parts.ml[(row * G + z) * 2 + 1] = s_l[g];
            }
        }
    }
}

/* ---- host: plans and launches --------------------------------------------------------- */

/* Query heads a kat_decode CTA takes. */
static int kat_hg(int32_t n_heads, int32_t n_kv_heads)
{
    int gq = n_heads / n_kv_heads;
    return gq == 1 ? 1 : gq <= 4 ? 4 : 8;
}

static int kat_decode_tile(int32_t dtype, int32_t head_dim)
{
    if (dtype == KILN_DTYPE_F32)
        return head_dim == 64 ? kat_shape<KILN_DTYPE_F32, 64>::TILE : kat_shape<KILN_DTYPE_F32, 128>::TILE;
    return head_dim == 64 ? kat_shape<KILN_DTYPE_BF16, 64>::TILE : kat_shape<KILN_DTYPE_BF16, 128>::TILE;
}

/* Splits for `ctas` CTAs per token: enough CTAs for several waves (equal
 * CTAs in one wave and a bit leave most of the GPU idle in the bit), no
 * more splits than tiles of the longest possible sequence, and as even as
 * the tiles allow. */
static int32_t kat_splits(int64_t tokens, int64_t ctas, int64_t max_ctx, int64_t tile)
{
    int64_t base = tokens * ctas, g = (KAT_TARGET_CTAS + base - 1) / base, tiles = (max_ctx + tile - 1) / tile;
    if (g > KAT_MAX_SPLITS)
        g = KAT_MAX_SPLITS;
    if (g >= tiles)
        return (int32_t)(tiles < 1 ? 1 : tiles);
    int64_t per = (tiles + g - 1) / g; /* tiles per split */
    g = (tiles + per - 1) / per;
    return (int32_t)(g < 1 ? 1 : g);
}

/* Splits kat_pipe is launched with for `ctas` CTAs per token: about
 * `target` CTAs in all, one when the tokens alone give that many (a large
 * batch: no merge at all), at most KAT_MAX_SPLITS and no more than the
 * longest possible sequence has pieces of `keys`. The device runs only as
 * many as the actual length fills (kat_pipe_splits). */
static int32_t kat_pipe_grid_splits(int64_t tokens, int64_t ctas, int64_t max_ctx, int64_t target, int64_t keys)
{
    int64_t g = (target + tokens * ctas - 1) / (tokens * ctas);
    const int64_t pieces = (max_ctx + keys - 1) / keys;
    g = g < pieces ? g : pieces;
    g = g < KAT_MAX_SPLITS ? g : KAT_MAX_SPLITS;
    return (int32_t)(g < 1 ? 1 : g);
}

static size_t kat_parts_bytes(int64_t tokens, int32_t n_heads, int32_t head_dim, int32_t g)
{
    return g > 1 ? (size_t)tokens * (size_t)n_heads * (size_t)g * ((size_t)head_dim + 2) * sizeof(float) : 0;
}

extern "C" size_t kiln_attention_cuda_workspace(int64_t tokens, int64_t n_seqs, int64_t max_blocks, int32_t n_heads,
                                                int32_t n_kv_heads, int32_t head_dim, int32_t block_size)
{
    if (tokens < 1 || n_kv_heads < 1 || n_heads % n_kv_heads)
        return 0;
    const int64_t max_ctx = max_blocks * block_size, hg = kat_hg(n_heads, n_kv_heads);
    const int64_t fast_ctas = (int64_t)n_kv_heads * ((n_heads / n_kv_heads + hg - 1) / hg);
    /* G * t only grows while G > 1, i.e. while t * ctas < KAT_TARGET_CTAS */
    size_t most = 0;
    for (int64_t t = 1; t <= tokens && t <= KAT_TARGET_CTAS; t++) {
        size_t b = kat_parts_bytes(t, n_heads, head_dim, kat_splits(t, n_heads, max_ctx, KAT_GENERIC_TILE));
        most = b > most ? b : most;
        for (int dt = 0; dt < 2; dt++) { /* the f32 tiles are the smaller: more splits */
            int tile = kat_decode_tile(dt ? KILN_DTYPE_F32 : KILN_DTYPE_BF16, head_dim == 64 ? 64 : 128);
            b = kat_parts_bytes(t, n_heads, head_dim, kat_splits(t, fast_ctas, max_ctx, tile));
            most = b > most ? b : most;
        }
        b = kat_parts_bytes(t, n_heads, head_dim,
                            kat_pipe_grid_splits(t, fast_ctas, max_ctx, KAT_PIPE_CTAS_MAX, KAT_PIPE_SPLIT_KEYS_MIN));
        most = b > most ? b : most;
    }
    return most;
}

static int kat_aligned(const void *p, int64_t ld, size_t es)
{
    return ((uintptr_t)p & 15) == 0 && ((size_t)ld * es) % 16 == 0;
}

/* Launches kat_decode<DT, D, HG> with G splits: as one cluster of G CTAs
 * per (token, head group) when `cluster` (the splits merge in distributed
 * shared memory), else G independent CTAs whose partials kat_combine
 * merges (or none when G is 1). */
template <int DT, int D, int HG>
static cudaError_t kat_launch_decode_hg(const kiln_attention_cuda_args &a, int32_t g, int32_t fused, int32_t cluster,
                                        cudaStream_t st)
{
    const int n_hg = (a.n_heads / a.n_kv_heads + HG - 1) / HG;
    cudaLaunchAttribute attr[2];
    int n = 0;
    if (kcu_pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = 1;
        attr[n].val.clusterDim.y = 1;
        attr[n++].val.clusterDim.z = (unsigned)g;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)a.tokens, (unsigned)(a.n_kv_heads * n_hg), (unsigned)g);
    cfg.blockDim = dim3(KAT_THREADS);
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = (unsigned)n;
    if (cluster) {
        /* Once per cluster size: more than 8 CTAs a cluster is Hopper's
         * non-portable size, and a size the device cannot place at all
         * is reported as cudaErrorNotSupported (the caller falls back to
         * the combine path) instead of failing the launch. */
        static int8_t ok[KAT_MAX_CLUSTER + 1];
        if (!ok[g]) {
            cudaError_t e = cudaSuccess;
            if (g > 8)
                e = cudaFuncSetAttribute(kat_decode<DT, D, HG>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
            int clusters = 0;
            cudaLaunchConfig_t probe = cfg;
            probe.stream = NULL; /* a query, nothing enqueued (may run during a capture) */
            if (e == cudaSuccess)
                e = cudaOccupancyMaxActiveClusters(&clusters, kat_decode<DT, D, HG>, &probe);
            ok[g] = e == cudaSuccess && clusters > 0 ? 1 : -1;
            (void)cudaGetLastError();
        }
        if (ok[g] < 0)
            return cudaErrorNotSupported;
    }
    return cudaLaunchKernelEx(&cfg, kat_decode<DT, D, HG>, a, fused, cluster);
}

template <int DT, int D>
static cudaError_t kat_launch_decode(const kiln_attention_cuda_args &a, int hg, int32_t g, int32_t fused,
                                     int32_t cluster, cudaStream_t st)
{
    if (hg == 1)
        return kat_launch_decode_hg<DT, D, 1>(a, g, fused, cluster, st);
    if (hg == 4)
        return kat_launch_decode_hg<DT, D, 4>(a, g, fused, cluster, st);
    return kat_launch_decode_hg<DT, D, 8>(a, g, fused, cluster, st);
}

template <int DT>
static cudaError_t kat_launch_decode_dt(const kiln_attention_cuda_args &a, int hg, int32_t g, int32_t fused,
                                        int32_t cluster, cudaStream_t st)
{
    return a.head_dim == 64 ? kat_launch_decode<DT, 64>(a, hg, g, fused, cluster, st)
                            : kat_launch_decode<DT, 128>(a, hg, g, fused, cluster, st);
}

/* What a kat_pipe launch was planned with (kat_run_pipe): g splits, as
 * clusters of g when `cluster`; the kernel's fused, split_keys and opts;
 * its pipeline's stages. */
struct kat_pipe_plan {
    int32_t g, fused, cluster, keys, opts, stages, warps;
};

/* ---- 2b. decode of many sequences on the tensor cores ----------------------------------- */

#define KAT_DMMA_BK 16 /* keys of a warp's tile */

/* kat_dmma's shared memory: each warp's S stages of a K tile and a V tile
 * (BK rows of RB bytes, PITCH apart: 16 more than a row, so that the
 * fragment reads below meet no bank conflict in the E4M3 form). */
template <int D, bool F8> struct kat_dmma_cfg {
    static constexpr int RB = F8 ? D : 2 * D;
    static constexpr int PITCH = RB + 16;
    static constexpr int S = F8 ? 3 : 2;
    static constexpr int STAGE = 2 * KAT_DMMA_BK * PITCH;
    static constexpr size_t SMEM = (size_t)(KAT_THREADS / 32) * S * STAGE;
    static_assert(SMEM >= (size_t)(KAT_THREADS / 32) * 16 * (2 + D) * 4, "kat_dmma's merge area");
};

/* Two E4M3 codes (the first in the low byte of c) as a pair of DT values,
 * the first in the lower half: exact for f16 and bf16. */
template <int DT> __device__ __forceinline__ uint32_t kat_e4m3x2_pair(uint32_t c)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(c & 0xffffu), __NV_E4M3);
    if constexpr (DT == KILN_DTYPE_F16)
        return (uint32_t)h.x | (uint32_t)h.y << 16;
    const float2 f = __half22float2(*(const __half2 *)&h);
    return kat_mma<KILN_DTYPE_BF16>::pack(f.x, f.y);
}

/* A decode step (each token attends its sequence's keys 0..pos, all in the
 * cache: kat_write ran before) with a CTA per (token, kv head). The kv
 * head's gq query heads are the rows of one m-tile (rows past gq zero);
 * warp w takes the 16-key tiles w, w + 4, ... through S stages of
 * cp.async, and the four warps' softmax states merge at the end. Each
 * thread's fragments are whole 16-byte pieces of shared memory: a dot
 * product does not care which dimension a fragment position stands for
 * as long as Q and K agree, so thread (gr, tig) takes dimensions
 * [tig D/4, (tig + 1) D/4) of Q row gr (and gr + 8) and of its K row,
 * k-step kc being 4kc..4kc + 3 of them; in P V, column n of n-tile nt is
 * dimension n D/8 + nt, so a thread's V fragments are the D/8 dimensions
 * from gr D/8 of keys 2tig, 2tig + 1, 2tig + 8 and 2tig + 9. F8: E4M3
 * codes widened in registers (to DT for Q K^T; to f16 for P V, exact for
 * the codes and finer than bf16 for probabilities in [0, 1]). MINB: the
 * CTAs an SM the registers are fitted for (3: 151-165 registers at head
 * dim 128, no spills; 4, an FP8 cache's opt-in form: 128 registers with
 * 24 bytes spilled, its 55 KB of shared memory fitting 4 CTAs). */
template <int DT, int D, bool F8, int MINB = 3>
__global__ void __launch_bounds__(KAT_THREADS, MINB) kat_dmma(kiln_attention_cuda_args a, int32_t allow_q16)
{
    KTL_SCOPE(0);
    typedef kat_dmma_cfg<D, F8> C;
    constexpr int BK = KAT_DMMA_BK, KC = D / 16, ND = D / 8, CPR = C::RB / 16, NWARP = KAT_THREADS / 32;
    constexpr int PDT = F8 ? KILN_DTYPE_F16 : DT; /* P V's inputs */
    constexpr int ES = F8 ? 1 : 2;                /* bytes of a cache element */
    extern __shared__ __align__(16) unsigned char kat_dsmem[];
    kcu_after_prior();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tig = lane & 3;
    const int gq = a.n_heads / a.n_kv_heads, kvh = blockIdx.y;
    const int64_t t = blockIdx.x, row0 = t * a.n_heads + (int64_t)kvh * gq;
    const kat_tok k = kat_token(a, t);
    if (!k.valid) {
        for (int i = threadIdx.x; i < gq * D; i += KAT_THREADS)
            kat_type<DT>::store(a.out, row0 * D + i, kat_nan());
        return;
    }
    /* 32-bit key positions: the launch asks that a table's keys fit */
    const int32_t nk = (int32_t)k.pos + 1;
    const int n_tiles = (nk + BK - 1) / BK, n_my = n_tiles > warp ? (n_tiles - warp + NWARP - 1) / NWARP : 0;
    unsigned char *mine = kat_dsmem + (size_t)warp * C::S * C::STAGE;
    const int32_t *table = a.table + k.s * a.max_blocks;
    const char *cache = (const char *)a.cache;
    const int64_t vd = kat_vdelta(a) * ES; /* bytes from a K row to its V row */
    const int32_t bs = (int32_t)a.block_size;
    const bool one_block = bs % BK == 0;
    /* this lane's 16-byte pieces of a tile: column cc of rows r0, r0 + RSTEP, ... */
    constexpr int RSTEP = 32 / CPR, NPC = BK / RSTEP;
    const int r0 = lane / CPR, cc = lane % CPR;
    int bad = 0;
    /* cp.async of the warp's tile j (keys from (warp + 4j) BK) into slot j % S */
    auto issue = [&](int j) {
        unsigned char *dk = mine + (j % C::S) * C::STAGE + r0 * C::PITCH + cc * 16, *dv = dk + BK * C::PITCH;
        const int32_t kb = (warp + NWARP * j) * BK;
        if (one_block) { /* the tile lies in one block: one table read, rows RB bytes apart */
            const int32_t blk = __ldg(&table[kb / bs]);
            const bool ok = blk >= 0 && blk < a.n_blocks;
            bad |= !ok;
            const char *src =
                cache + (((int64_t)blk * 2 * a.n_kv_heads + kvh) * bs + kb % bs) * (D * ES) + r0 * C::RB + cc * 16;
#pragma unroll
            for (int i = 0; i < NPC; i++) {
                const bool in = ok && kb + r0 + i * RSTEP < nk;
                kat_cp_async16(dk + i * RSTEP * C::PITCH, in ? src + i * RSTEP * C::RB : cache, in ? 16 : 0);
                kat_cp_async16(dv + i * RSTEP * C::PITCH, in ? src + i * RSTEP * C::RB + vd : cache, in ? 16 : 0);
            }
            return;
        }
#pragma unroll 1
        for (int i = 0; i < NPC; i++) { /* a table read a row */
            const int32_t kp = kb + r0 + i * RSTEP;
            int64_t off = kp < nk ? kat_krow(a, k.s, kp, kvh) : -1;
            bad |= kp < nk && off < 0;
            const bool in = off >= 0;
            const char *src = in ? cache + off * ES + cc * 16 : cache;
            kat_cp_async16(dk + i * RSTEP * C::PITCH, src, in ? 16 : 0);
            kat_cp_async16(dv + i * RSTEP * C::PITCH, in ? src + vd : cache, in ? 16 : 0);
        }
    };
#pragma unroll 1
    for (int j = 0; j < C::S - 1; j++) {
        if (j < n_my)
            issue(j);
        kat_cp_commit(); /* empty groups keep the count: tile j is group j */
    }
    /* Q rows gr and gr + 8, this thread's D/4 dimensions (zeros past gq) */
    uint32_t qa[KC][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = gr + 8 * h;
        const uint4 *qp =
            (const uint4 *)((const uint16_t *)a.q + t * a.q_ld + ((int64_t)kvh * gq + r) * D + tig * (D / 4));
#pragma unroll
        for (int i = 0; i < D / 32; i++) {
            const uint4 u = r < gq ? qp[i] : make_uint4(0, 0, 0, 0);
            qa[2 * i][h] = u.x, qa[2 * i][2 + h] = u.y;
            qa[2 * i + 1][h] = u.z, qa[2 * i + 1][2 + h] = u.w;
        }
    }
    /* An E4M3 cache under bf16 activations: Q K^T in f16 (K's codes widen
     * to f16 in one instruction a pair, to bf16 in four), Q converted once:
     * exact for every bf16 value of magnitude 2^-14 ..< 65,504, within
     * 2^-25 below that (f16's subnormals), and not taken when a Q value of
     * the warp (the same Q rows in every warp of the CTA) reaches 65,504
     * or is NaN, or with KILN_ATTENTION_DMMA_Q16=0 (allow_q16 0) */
    constexpr bool Q16 = F8 && DT == KILN_DTYPE_BF16;
    bool q16 = false;
    if constexpr (Q16) {
        bool big = false;
#pragma unroll
        for (int kc = 0; kc < KC; kc++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&qa[kc][e]);
                big |= !(fabsf(f.x) < 65504.0f) || !(fabsf(f.y) < 65504.0f);
            }
        q16 = allow_q16 && !__any_sync(0xffffffffu, big);
        if (q16)
#pragma unroll
            for (int kc = 0; kc < KC; kc++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&qa[kc][e]);
                    qa[kc][e] = kat_mma<KILN_DTYPE_F16>::pack(f.x, f.y);
                }
    }
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
    const float sl2 = a.scale * KAT_LOG2E;
#pragma unroll 1
    for (int j = 0; j < n_my; j++) {
        if (j + C::S - 1 < n_my)
            issue(j + C::S - 1); /* into the slot tile j - 1 used: every lane is done with it */
        kat_cp_commit();
        kat_cp_wait<C::S - 1>();
        __syncwarp(); /* the other lanes' copies of tile j are visible */
        const unsigned char *sk = mine + (j % C::S) * C::STAGE, *sv = sk + BK * C::PITCH;
        const int32_t kb = (warp + NWARP * j) * BK;
        /* S = Q K^T: n-tile jj is keys 8jj..8jj + 7, this thread's row gr of
         * it; K widened to QT (DT, or f16 where Q was made f16 above) */
        float sc[2][4];
        auto qk = [&](auto qt) {
            constexpr int QT = decltype(qt)::value;
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                uint32_t kw[2 * KC]; /* pairs of dimensions (2p, 2p + 1) of the thread's D/4 */
                const unsigned char *kr = sk + (jj * 8 + gr) * C::PITCH + tig * (C::RB / 4);
#pragma unroll
                for (int i = 0; i < C::RB / 64; i++) {
                    const uint4 u = *(const uint4 *)(kr + 16 * i);
                    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        if constexpr (F8) {
                            kw[8 * i + 2 * q] = kat_e4m3x2_pair<QT>(w[q]);
                            kw[8 * i + 2 * q + 1] = kat_e4m3x2_pair<QT>(w[q] >> 16);
                        } else {
                            kw[4 * i + q] = w[q];
                        }
                    }
                }
                sc[jj][0] = sc[jj][1] = sc[jj][2] = sc[jj][3] = 0.0f;
#pragma unroll
                for (int kc = 0; kc < KC; kc++)
                    kat_mma<QT>::run(sc[jj], qa[kc], kw[2 * kc], kw[2 * kc + 1]);
            }
        };
        if constexpr (Q16) {
            if (q16)
                qk(std::integral_constant<int, KILN_DTYPE_F16>{});
            else
                qk(std::integral_constant<int, DT>{});
        } else {
            qk(std::integral_constant<int, DT>{});
        }
        if (kb + BK > nk) /* keys past the sequence (the last tile) */
#pragma unroll
            for (int jj = 0; jj < 2; jj++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (kb + jj * 8 + 2 * tig + (e & 1) >= nk)
                        sc[jj][e] = -INFINITY;
        uint32_t pf[1][4];
        kat_prefill_softmax<PDT, BK, ND, true>(sc, sl2, m_a, m_b, l_a, l_b, o, pf);
        /* O += P V: keys 2tig, 2tig + 1, 2tig + 8, 2tig + 9, dimensions gr D/8 .. */
        constexpr int VW = C::RB / 32; /* 32-bit words of a thread's piece of a V row */
        uint32_t v[4][VW];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const unsigned char *vp = sv + (2 * tig + (r & 1) + 8 * (r >> 1)) * C::PITCH + gr * (C::RB / 8);
            if constexpr (VW % 4 == 0) {
#pragma unroll
                for (int i = 0; i < VW / 4; i++) {
                    const uint4 u = *(const uint4 *)(vp + 16 * i);
                    v[r][4 * i] = u.x, v[r][4 * i + 1] = u.y, v[r][4 * i + 2] = u.z, v[r][4 * i + 3] = u.w;
                }
            } else {
                const uint2 u = *(const uint2 *)vp;
                v[r][0] = u.x, v[r][VW - 1] = u.y;
            }
        }
#pragma unroll
        for (int nt = 0; nt < ND; nt++) {
            uint32_t b0, b1;
            if constexpr (F8) {
                const int w = nt / 4, by = nt % 4, sel = by | (4 + by) << 4;
                b0 = kat_e4m3x2_pair<KILN_DTYPE_F16>(__byte_perm(v[0][w], v[1][w], sel));
                b1 = kat_e4m3x2_pair<KILN_DTYPE_F16>(__byte_perm(v[2][w], v[3][w], sel));
            } else {
                const int w = nt / 2, sel = nt % 2 ? 0x7632 : 0x5410;
                b0 = __byte_perm(v[0][w], v[1][w], sel);
                b1 = __byte_perm(v[2][w], v[3][w], sel);
            }
            kat_mma<PDT>::run(o[nt], pf[0], b0, b1);
        }
        __syncwarp(); /* every lane is done with the slot before it is refilled */
    }
    kat_cp_wait<0>();
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
    }
    /* merge the warps: (m, l) of 16 rows, then the rows < gq of o */
    __syncthreads(); /* every warp is done with its stages */
    float *s_ml = (float *)kat_dsmem, *s_o = s_ml + NWARP * 16 * 2;
    if (tig == 0) {
        s_ml[(warp * 16 + gr) * 2] = m_a, s_ml[(warp * 16 + gr) * 2 + 1] = l_a;
        s_ml[(warp * 16 + gr + 8) * 2] = m_b, s_ml[(warp * 16 + gr + 8) * 2 + 1] = l_b;
    }
#pragma unroll
    for (int nt = 0; nt < ND; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = gr + 8 * (e >> 1);
            if (r < gq)
                s_o[(warp * gq + r) * D + (2 * tig + (e & 1)) * ND + nt] = o[nt][e];
        }
    bad = __syncthreads_or(bad);
    for (int i = threadIdx.x; i < gq * D; i += KAT_THREADS) {
        const int r = i / D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < NWARP; w++)
            M = fmaxf(M, s_ml[(w * 16 + r) * 2]);
        const float Mu = M == -INFINITY ? 0.0f : M;
        float L = 0.0f, O = 0.0f;
#pragma unroll
        for (int w = 0; w < NWARP; w++) {
            const float f = exp2f(s_ml[(w * 16 + r) * 2] - Mu);
            L = fmaf(s_ml[(w * 16 + r) * 2 + 1], f, L);
            O = fmaf(s_o[(w * gq + r) * D + i % D], f, O);
        }
        kat_type<DT>::store(a.out, row0 * D + i, bad ? kat_nan() : O / L);
    }
}

/* Launches kat_pipe<DT, D, HG, S, F8> for plan p (cudaErrorNotSupported
 * when the device cannot place its clusters). */
/* Lets `kernel` take `bytes` of dynamic shared memory (past the default
 * 48 KB), once per device: ok[] remembers the devices where it is set. */
template <typename K> static cudaError_t kat_allow_smem(K kernel, size_t bytes, int8_t *ok)
{
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess)
        return e;
    if (dev >= 0 && dev < KAT_MAX_DEVICES && ok[dev])
        return cudaSuccess;
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess && dev >= 0 && dev < KAT_MAX_DEVICES)
        ok[dev] = 1;
    return e;
}

template <int DT, int D, int HG, int S, bool F8, int NW = KAT_THREADS / 32>
static cudaError_t kat_launch_pipe_hg(const kiln_attention_cuda_args &a, const kat_pipe_plan &p, cudaStream_t st)
{
    const int32_t g = p.g, cluster = p.cluster;
    const size_t smem = (size_t)S * KAT_PIPE_STAGE_BYTES * NW;
    const int n_hg = (a.n_heads / a.n_kv_heads + HG - 1) / HG;
    /* once per device: the pipeline's shared memory is past the default 48 KB */
    static int8_t smem_ok[KAT_MAX_DEVICES];
    cudaError_t e = kat_allow_smem(kat_pipe<DT, D, HG, S, F8, NW>, smem, smem_ok);
    if (e != cudaSuccess)
        return e;
    cudaLaunchAttribute attr[2];
    int n = 0;
    if (kcu_pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = 1;
        attr[n].val.clusterDim.y = 1;
        attr[n++].val.clusterDim.z = (unsigned)g;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)a.tokens, (unsigned)(a.n_kv_heads * n_hg), (unsigned)g);
    cfg.blockDim = dim3(NW * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = (unsigned)n;
    if (cluster) {
        static int8_t ok[KAT_MAX_CLUSTER + 1]; /* as in kat_launch_decode_hg */
        if (!ok[g]) {
            e = cudaSuccess;
            if (g > 8)
                e = cudaFuncSetAttribute(kat_pipe<DT, D, HG, S, F8, NW>, cudaFuncAttributeNonPortableClusterSizeAllowed,
                                         1);
            int clusters = 0;
            cudaLaunchConfig_t probe = cfg;
            probe.stream = NULL;
            if (e == cudaSuccess)
                e = cudaOccupancyMaxActiveClusters(&clusters, kat_pipe<DT, D, HG, S, F8, NW>, &probe);
            ok[g] = e == cudaSuccess && clusters > 0 ? 1 : -1;
            (void)cudaGetLastError();
        }
        if (ok[g] < 0)
            return cudaErrorNotSupported;
    }
    return cudaLaunchKernelEx(&cfg, kat_pipe<DT, D, HG, S, F8, NW>, a, p.fused, cluster, p.keys, p.opts);
}

template <int DT, int D, bool F8>
static cudaError_t kat_launch_pipe(const kiln_attention_cuda_args &a, int hg, const kat_pipe_plan &p, cudaStream_t st)
{
    /* a warp a CTA (kat_run_pipe plans it with 3 stages, groups of up to 4
     * heads, and where one warp can write the new key's row) */
    if constexpr (DT != KILN_DTYPE_F32 || D == 64)
        if (p.warps == 1 && hg != 8)
            return hg == 1 ? kat_launch_pipe_hg<DT, D, 1, KAT_PIPE_STAGES_FEW, F8, 1>(a, p, st)
                           : kat_launch_pipe_hg<DT, D, 4, KAT_PIPE_STAGES_FEW, F8, 1>(a, p, st);
    const int few = p.stages == KAT_PIPE_STAGES_FEW; /* groups of 8 heads keep 4 stages: registers allow 2 CTAs */
    if (hg == 1)
        return few ? kat_launch_pipe_hg<DT, D, 1, KAT_PIPE_STAGES_FEW, F8>(a, p, st)
                   : kat_launch_pipe_hg<DT, D, 1, KAT_PIPE_STAGES, F8>(a, p, st);
    if (hg == 4)
        return few ? kat_launch_pipe_hg<DT, D, 4, KAT_PIPE_STAGES_FEW, F8>(a, p, st)
                   : kat_launch_pipe_hg<DT, D, 4, KAT_PIPE_STAGES, F8>(a, p, st);
    return kat_launch_pipe_hg<DT, D, 8, KAT_PIPE_STAGES, F8>(a, p, st);
}

static cudaError_t kat_launch_pipe_any(const kiln_attention_cuda_args &a, int hg, const kat_pipe_plan &p,
                                       cudaStream_t st)
{
    const int d64 = a.head_dim == 64;
    if (a.cache_dtype == KILN_DTYPE_U8) /* f16 or bf16 activations (kiln_attention_cuda) */
        return a.dtype == KILN_DTYPE_F16 ? (d64 ? kat_launch_pipe<KILN_DTYPE_F16, 64, true>(a, hg, p, st)
                                                : kat_launch_pipe<KILN_DTYPE_F16, 128, true>(a, hg, p, st))
                                         : (d64 ? kat_launch_pipe<KILN_DTYPE_BF16, 64, true>(a, hg, p, st)
                                                : kat_launch_pipe<KILN_DTYPE_BF16, 128, true>(a, hg, p, st));
    switch (a.dtype) {
    case KILN_DTYPE_F32:
        return d64 ? kat_launch_pipe<KILN_DTYPE_F32, 64, false>(a, hg, p, st)
                   : kat_launch_pipe<KILN_DTYPE_F32, 128, false>(a, hg, p, st);
    case KILN_DTYPE_F16:
        return d64 ? kat_launch_pipe<KILN_DTYPE_F16, 64, false>(a, hg, p, st)
                   : kat_launch_pipe<KILN_DTYPE_F16, 128, false>(a, hg, p, st);
    default:
        return d64 ? kat_launch_pipe<KILN_DTYPE_BF16, 64, false>(a, hg, p, st)
                   : kat_launch_pipe<KILN_DTYPE_BF16, 128, false>(a, hg, p, st);
    }
}

/* Keys of one CTA stage of kat_pipe (f16 lays out as bf16). */
static int32_t kat_pipe_cta_rows(int32_t dtype, int32_t cache_dtype, int32_t head_dim)
{
    if (cache_dtype == KILN_DTYPE_U8)
        return head_dim == 64 ? kat_pipe_shape<KILN_DTYPE_BF16, 64, true>::CTA_ROWS
                              : kat_pipe_shape<KILN_DTYPE_BF16, 128, true>::CTA_ROWS;
    if (dtype == KILN_DTYPE_F32)
        return head_dim == 64 ? kat_pipe_shape<KILN_DTYPE_F32, 64>::CTA_ROWS
                              : kat_pipe_shape<KILN_DTYPE_F32, 128>::CTA_ROWS;
    return head_dim == 64 ? kat_pipe_shape<KILN_DTYPE_BF16, 64>::CTA_ROWS
                          : kat_pipe_shape<KILN_DTYPE_BF16, 128>::CTA_ROWS;
}

/* Splits as a cluster for `ctas` CTAs per token: the smallest power of two
 * that gives about two CTAs per SM over the step, at most
 * KAT_MAX_CLUSTER and no more than the tiles of the longest sequence (1:
 * no splitting, the CTA writes its output itself). Shapes alone decide, so
 * a captured graph serves every context length: splits past a sequence's
 * tiles only join the merge. */
static int32_t kat_cluster_splits(int64_t tokens, int64_t ctas, int64_t max_ctx, int64_t tile)
{
    const int64_t tiles = (max_ctx + tile - 1) / tile;
    int32_t g = 1;
    while (g < KAT_MAX_CLUSTER && tokens * ctas * g < KAT_CLUSTER_CTAS && 2 * g <= tiles)
        g *= 2;
    return g;
}

/* KILN_ATTENTION_CLUSTER=0 selects the split-and-combine path (timing
 * both, testing both, and a way out should a driver refuse the clusters);
 * read at each launch (a graph keeps what its capture chose). */
static int kat_cluster_refused; /* a cluster launch failed once: never again in this process */

static int kat_use_cluster(void)
{
    const char *e = getenv("KILN_ATTENTION_CLUSTER");
    return !kat_cluster_refused && !(e && strcmp(e, "0") == 0);
}

/* KILN_ATTENTION_DECODE=split selects kat_decode (with its clusters or
 * split and combine) instead of kat_pipe for decode, to time both in one
 * run; read at each launch. */
static int kat_use_pipe(void)
{
    const char *e = getenv("KILN_ATTENTION_DECODE");
    return !(e && strcmp(e, "split") == 0);
}

/* Whether a step runs kat_dmma: the fast kernels' layouts, f16/bf16
 * activations, as many tokens as sequences, 2 to 16 query heads a kv
 * head, tables of fewer than 2^31 keys, and a step of at least
 * KAT_DMMA_MIN_CTAS sequences x kv heads (32 sequences at the 8B's 8 kv
 * heads), where kat_pipe's dot products on the CUDA cores bound it by
 * issue. Fewer sequences stay with kat_pipe, whose splits fill the GPU
 * (kat_dmma has none: at batch 1 the 8B bf16 decode read 172.4 tok/s
 * with it against 192.2 on an H100). On an H100 (bench/README.md,
 * thirtieth session) the attention of 32 sequences of 256..2048 keys took
 * 70.9 us with kat_dmma against 73.3 (bf16 cache) and 52.1 against 71.8
 * (FP8 cache), of 66 sequences 125 against 143 and 79 against 120; the
 * 8B's output tok/s gained 2.5% (bf16) and 5.9% (FP8 cache) at 1,024
 * sequences of 128..256 keys and 2.6% at ~280 of 1,000..2,000 (bf16).
 * Below 32 sequences it was not measured. KILN_ATTENTION_DECODE=mma
 * takes it at any batch, =pipe (or =split) never; read at each launch (a
 * graph keeps its capture's). */
#define KAT_DMMA_MIN_CTAS 256
static int kat_use_dmma(const kiln_attention_cuda_args &a, int fast)
{
    const int64_t gq = a.n_heads / a.n_kv_heads;
    if (!fast || a.dtype == KILN_DTYPE_F32 || a.tokens != a.n_seqs || gq < 2 || gq > 16 ||
        a.max_blocks * a.block_size > INT32_MAX - KAT_DMMA_BK) /* its key positions are 32-bit */
        return 0;
    const char *e = getenv("KILN_ATTENTION_DECODE");
    if (e && strcmp(e, "mma") == 0)
        return 1;
    if (e && (strcmp(e, "pipe") == 0 || strcmp(e, "split") == 0))
        return 0;
    return a.tokens * a.n_kv_heads >= KAT_DMMA_MIN_CTAS;
}

/* The CTAs kat_pipe aims for when it splits: KAT_PIPE_CTAS, or
 * KILN_ATTENTION_PIPE_CTAS (8..KAT_PIPE_CTAS_MAX; attention_bench --sweep
 * times several); read at each launch (a graph keeps its capture's). */
static int64_t kat_pipe_target(void)
{
    const char *e = getenv("KILN_ATTENTION_PIPE_CTAS");
    long v = e ? strtol(e, NULL, 10) : 0;
    return v >= 8 && v <= KAT_PIPE_CTAS_MAX ? v : KAT_PIPE_CTAS;
}

/* Whether environment variable `name` is "0" (a default-on choice turned
 * off); read at each launch (a graph keeps its capture's). */
static int kat_env_off(const char *name)
{
    const char *e = getenv(name);
    return e && strcmp(e, "0") == 0;
}

/* The fewest keys a kat_pipe split takes: KAT_PIPE_SPLIT_KEYS, or
 * KILN_ATTENTION_PIPE_SPLIT_KEYS (16..8192), rounded up to whole CTA
 * stages so that every split that runs has one. Was 256, which left a
 * context of 136 keys (bf16, head_dim 128) to one CTA per kv head reading
 * all of it four or five warp stages deep after its wait; at 64 it is
 * three CTAs of one or two stages a warp, every load issued at once (and
 * with `early` before the wait), the merge in their cluster; from 1,024
 * keys on at batch 1 the grid's splits (16) decide as before. */
static int32_t kat_pipe_keys(const kiln_attention_cuda_args &a)
{
    const char *e = getenv("KILN_ATTENTION_PIPE_SPLIT_KEYS");
    long v = e ? strtol(e, NULL, 10) : 0;
    const int32_t keys = v >= KAT_PIPE_SPLIT_KEYS_MIN && v <= 8192 ? (int32_t)v : KAT_PIPE_SPLIT_KEYS;
    const int32_t stage = kat_pipe_cta_rows(a.dtype, a.cache_dtype, a.head_dim);
    return (keys + stage - 1) / stage * stage;
}

/* The cp.async stages of each kat_pipe warp: KAT_PIPE_STAGES_FEW (3) for
 * groups of up to 4 query heads (kat_launch_pipe_any) when the step's
 * (token, head group) CTAs alone are at least two grids of the split
 * target (many sequences: continuous batching), else KAT_PIPE_STAGES (4);
 * KILN_ATTENTION_PIPE_STAGES=3 or 4 forces either. 3 stages are 48 KB of
 * shared memory a CTA instead of 64 and at most 128 registers a thread (no
 * spills at sm_90), so 4 CTAs fit an SM instead of 3. Many short
 * sequences (1024 of 128..256 keys: every sequence one CTA of 4-8 warp
 * stages a warp) are bound by instruction latency with 12 warps an SM, not
 * by memory: 16 hide more of it, with the same 144 KB of loads in flight
 * per SM. attention_bench on the H200 (graph time, sixteenth session):
 * 1024 sequences of 128..256 keys 313 us against 338, 512 of 1000..2000
 * 867 against 896; a few long sequences keep 4 (their splits are the
 * grid, and deeper pipelines serve them). */
static int32_t kat_pipe_stages(const kiln_attention_cuda_args &a, int64_t ctas)
{
    const char *e = getenv("KILN_ATTENTION_PIPE_STAGES");
    if (e && strcmp(e, "3") == 0)
        return KAT_PIPE_STAGES_FEW;
    if (e && strcmp(e, "4") == 0)
        return KAT_PIPE_STAGES;
    return (int64_t)a.tokens * ctas >= 2 * kat_pipe_target() ? KAT_PIPE_STAGES_FEW : KAT_PIPE_STAGES;
}

/* Warps of a kat_pipe CTA: 4, or 1 with KILN_ATTENTION_PIPE_WARPS=1 where
 * the step runs one split (many sequences), a group of at most 4 query
 * heads, and not f32 at head_dim 128 (the fused cache write's 64 vectors).
 * With 4 warps a CTA, 1,024 sequences of 128..256 keys read their KV at
 * 0.6 of the copy bandwidth (313 us a layer) and at about 10 keys took
 * 117 us (ncu, an 8B FP8 decode step at batch 1,024): each warp has one
 * or two stages of 8 keys, so the CTA's fixed chain (metadata, q, the
 * merge of its warps, two barriers) is most of its time. A warp of its
 * own takes all of a sequence's stages, the chain paid once a sequence.
 * Written in the twenty-first session, after its device time: op tests
 * and attention_bench's `w1` row run it, the H200 has not yet. Read at
 * each launch (a graph keeps its capture's). */
static int32_t kat_pipe_warps(const kiln_attention_cuda_args &a, int hg, int32_t g)
{
    const char *e = getenv("KILN_ATTENTION_PIPE_WARPS");
    const int f32_128 = a.cache_dtype != KILN_DTYPE_U8 && a.dtype == KILN_DTYPE_F32 && a.head_dim == 128;
    return e && strcmp(e, "1") == 0 && g == 1 && hg != 8 && !f32_128 ? 1 : KAT_THREADS / 32;
}

/* The most splits kat_pipe's grid plans where clusters run:
 * KAT_MAX_CLUSTER, or KILN_ATTENTION_PIPE_CAP (2..16; 0: no cap). A
 * cluster is placed only when its CTAs fit in one GPC at once, which may
 * hold back a cluster of 16 while the previous kernel still fills the SMs
 * (the early loads wait for it too); 8 places sooner, at the price of half
 * the CTAs on one long sequence. */
static int32_t kat_pipe_cap(void)
{
    const char *e = getenv("KILN_ATTENTION_PIPE_CAP");
    char *end = NULL;
    long v = e ? strtol(e, &end, 10) : -1;
    if (e && (end == e || *end)) /* not a number: the default */
        v = -1;
    return v >= 2 && v <= KAT_MAX_CLUSTER ? (int32_t)v : 0;
}

/* kat_pipe for a step (fast shapes, not prefill), then kat_combine when
 * its splits did not merge in clusters. KILN_ATTENTION_PIPE_CAP=N (2..16)
 * caps the grid's splits at N where clusters run, so that a batch of one in
 * an engine built for 8,448 tokens merges in a cluster instead of paying a
 * kat_combine launch; measured on the H200 (attention_bench, graph time) the
 * cap of 16 gained nothing at 136 and 1,024 keys (7.0 / 9.1 us either way)
 * and cost 1.7 us at 8,192 keys (27.4 against 25.7), so by default the
 * grid is uncapped (rows pipe and cap8 of attention_bench).
 * KILN_ATTENTION_PIPE_EARLY=0 keeps every read after the wait, and
 * KILN_ATTENTION_PIPE_STAGE_BLOCK=0 reads the block table for every key
 * (kat_pipe's opts, as before). */
static cudaError_t kat_run_pipe(const kiln_attention_cuda_args &a, int32_t fused, cudaStream_t st)
{
    const int hg = kat_hg(a.n_heads, a.n_kv_heads);
    const int64_t ctas = (int64_t)a.n_kv_heads * ((a.n_heads / a.n_kv_heads + hg - 1) / hg);
    kat_pipe_plan p;
    p.keys = kat_pipe_keys(a);
    p.g = kat_pipe_grid_splits(a.tokens, ctas, a.max_blocks * a.block_size, kat_pipe_target(), p.keys);
    p.fused = fused;
    p.stages = kat_pipe_stages(a, ctas);
    p.opts = (kat_env_off("KILN_ATTENTION_PIPE_EARLY") ? 0 : KAT_PIPE_EARLY) |
             (kat_env_off("KILN_ATTENTION_PIPE_STAGE_BLOCK") ? 0 : KAT_PIPE_STAGE_BLOCK);
    p.cluster = p.g > 1 && kat_use_cluster();
    const int32_t cap = kat_pipe_cap();
    if (p.cluster && cap && p.g > cap)
        p.g = cap;
    p.cluster = p.cluster && p.g <= KAT_MAX_CLUSTER;
    p.warps = kat_pipe_warps(a, hg, p.g);
    if (p.warps == 1)
        p.stages = KAT_PIPE_STAGES_FEW;
    cudaError_t e = cudaErrorNotSupported;
    if (p.cluster) {
        e = kat_launch_pipe_any(a, hg, p, st);
        if (e == cudaSuccess)
            return e;
        /* clusters of this size cannot run here: split and combine, from now on */
        (void)cudaGetLastError();
        kat_cluster_refused = 1;
        p.cluster = 0;
    }
    if (p.g > 1 && !a.workspace)
        return cudaErrorInvalidValue;
    e = kat_launch_pipe_any(a, hg, p, st);
    if (e != cudaSuccess || p.g == 1)
        return e;
    return kcu_launch_cfg(kat_combine, dim3((unsigned)a.tokens, (unsigned)a.n_heads), dim3(KAT_THREADS), st, a, p.g,
                          p.keys, (int32_t)(p.opts & KAT_PIPE_EARLY));
}

/* The grid of a prefill launch: at most sum(ceil(n_new * gq / BQ)) <=
 * (T * gq + (BQ - 1) * min(S, T)) / BQ tiles, by kv head. Tile-major in
 * one dimension, so the CTAs start in the order of their tiles and the
 * longest tiles of every kv head come first (a whole kv head's tiles,
 * longest to shortest, before the next head's left the longest ones of the
 * last heads to a late wave: one prompt of 2,048 tokens, narrow form, 245
 * against 286 us on the H200); KILN_ATTENTION_PREFILL_ORDER=head gives
 * that order back (x = tile, y = kv head), to compare. */
static dim3 kat_prefill_grid(const kiln_attention_cuda_args &a, int64_t bq, int32_t *by_tile)
{
    const int64_t busy = a.n_seqs < a.tokens ? a.n_seqs : a.tokens, gq = a.n_heads / a.n_kv_heads;
    const int64_t tiles = (a.tokens * gq + (bq - 1) * busy + bq - 1) / bq;
    const char *e = getenv("KILN_ATTENTION_PREFILL_ORDER");
    *by_tile = !(e && !strcmp(e, "head"));
    return *by_tile ? dim3((unsigned)(tiles * a.n_kv_heads)) : dim3((unsigned)tiles, (unsigned)a.n_kv_heads);
}

#define KAT_WIDE_TOKENS 1024 /* new tokens a sequence from which kat_prefill_wide runs (head_dim 128) */

/* The prefill's form: kat_prefill_wide where the step's sequences have
 * KAT_WIDE_TOKENS new tokens each on average at head_dim 128, else
 * kat_prefill (H200, 8B shape, attention_bench, narrow against wide: one
 * prompt of 512 tokens 46 against 61 us, of 2,048 228 against 219, of
 * 8,192 2,842 against 2,545; 64 prompts of 128 166 against 301). From
 * shapes only, as the decode plans are. KILN_ATTENTION_PREFILL=narrow or
 * wide forces one (read at each launch). */
template <int DT, int D, bool F8>
static cudaError_t kat_launch_prefill_d(const kiln_attention_cuda_args &a, cudaStream_t st)
{
    const char *env = getenv("KILN_ATTENTION_PREFILL");
    const bool wide = env && !strcmp(env, "wide")     ? true
                      : env && !strcmp(env, "narrow") ? false
                                                      : D == 128 && a.tokens >= KAT_WIDE_TOKENS * a.n_seqs;
    int32_t by_tile;
    if (!wide) {
        const dim3 grid = kat_prefill_grid(a, 64, &by_tile);
        return kcu_launch_cfg(kat_prefill<DT, D, F8>, grid, dim3(KAT_THREADS), st, a, by_tile);
    }
    typedef kat_prefill_cfg<D, 2, 64> C;
    static int8_t smem_ok[KAT_MAX_DEVICES];
    cudaError_t e = kat_allow_smem(kat_prefill_wide<DT, D, F8>, C::SMEM, smem_ok);
    if (e != cudaSuccess)
        return e;
    const dim3 grid = kat_prefill_grid(a, C::BQ, &by_tile);
    return kcu_launch_smem(kat_prefill_wide<DT, D, F8>, grid, dim3(KAT_THREADS), C::SMEM, st, a, by_tile);
}

template <int DT> static cudaError_t kat_launch_prefill(const kiln_attention_cuda_args &a, int f8, cudaStream_t st)
{
    if (f8)
        return a.head_dim == 64 ? kat_launch_prefill_d<DT, 64, true>(a, st)
                                : kat_launch_prefill_d<DT, 128, true>(a, st);
    return a.head_dim == 64 ? kat_launch_prefill_d<DT, 64, false>(a, st) : kat_launch_prefill_d<DT, 128, false>(a, st);
}

/* kat_dmma over the step's tokens by kv heads, its registers fitted for
 * MINB CTAs an SM. */
template <int DT, int D, bool F8, int MINB>
static cudaError_t kat_launch_dmma_d(const kiln_attention_cuda_args &a, cudaStream_t st)
{
    typedef kat_dmma_cfg<D, F8> C;
    static int8_t smem_ok[KAT_MAX_DEVICES];
    cudaError_t e = kat_allow_smem(kat_dmma<DT, D, F8, MINB>, C::SMEM, smem_ok);
    if (e != cudaSuccess)
        return e;
    /* KILN_ATTENTION_DMMA_Q16=0: Q K^T in bf16 under an FP8 cache too (read at each launch) */
    const char *env = getenv("KILN_ATTENTION_DMMA_Q16");
    const int32_t allow_q16 = !(env && strcmp(env, "0") == 0);
    return kcu_launch_smem(kat_dmma<DT, D, F8, MINB>, dim3((unsigned)a.tokens, (unsigned)a.n_kv_heads),
                           dim3(KAT_THREADS), C::SMEM, st, a, allow_q16);
}

/* KILN_ATTENTION_DMMA_CTAS=4: an FP8 cache at head dim 128 through the
 * form fitted for 4 CTAs an SM instead of 3 (a third more of the cache in
 * flight at many short sequences, where kat_dmma read 59% of the copy
 * bandwidth on an H100; not yet measured); read at each launch. */
static int kat_dmma_four(void)
{
    const char *e = getenv("KILN_ATTENTION_DMMA_CTAS");
    return e && strcmp(e, "4") == 0;
}

template <int DT> static cudaError_t kat_launch_dmma(const kiln_attention_cuda_args &a, int f8, cudaStream_t st)
{
    if (f8 && a.head_dim == 128 && kat_dmma_four())
        return kat_launch_dmma_d<DT, 128, true, 4>(a, st);
    if (f8)
        return a.head_dim == 64 ? kat_launch_dmma_d<DT, 64, true, 3>(a, st)
                                : kat_launch_dmma_d<DT, 128, true, 3>(a, st);
    return a.head_dim == 64 ? kat_launch_dmma_d<DT, 64, false, 3>(a, st) : kat_launch_dmma_d<DT, 128, false, 3>(a, st);
}

extern "C" int kiln_attention_cuda(const kiln_attention_cuda_args *ap, void *stream)
{
    const kiln_attention_cuda_args &a = *ap;
    cudaStream_t st = (cudaStream_t)stream;
    if (a.tokens < 1)
        return (int)cudaSuccess;
    const size_t es = a.dtype == KILN_DTYPE_F32 ? 4 : 2;
    const int64_t D = a.head_dim, max_ctx = a.max_blocks * a.block_size;
    /* an FP8 cache (E4M3 codes) with f16 or bf16 activations takes the fast
     * kernels (kat_prefill, kat_pipe; kat_write rounds the new rows), with
     * f32 ones kat_generic */
    const int f8 = a.cache_dtype == KILN_DTYPE_U8;
    const int cache16 = ((uintptr_t)a.cache & 15) == 0 && (D * (f8 ? 1 : es)) % 16 == 0;
    const int kv16 = kat_aligned(a.k, a.k_ld, es) && kat_aligned(a.v, a.v_ld, es);
    const int fast = (D == 64 || D == 128) && cache16 && kat_aligned(a.q, a.q_ld, es) && ((uintptr_t)a.out & 3) == 0 &&
                     !(f8 && a.dtype == KILN_DTYPE_F32);
    const int prefill = fast && a.dtype != KILN_DTYPE_F32 && a.tokens > a.n_seqs;
    const int dmma = !prefill && kat_use_dmma(a, fast);
    const int32_t fused = fast && !prefill && !dmma && kv16 && !f8; /* kat_pipe writes the cache itself */
    cudaError_t e = cudaSuccess;
    if (!fused)
        e = kcu_launch_cfg(kat_write, dim3((unsigned)a.tokens), dim3(KAT_THREADS), st, a, (int32_t)es,
                           (int32_t)(cache16 && kv16 && (!f8 || es == 2)));
    if (e != cudaSuccess)
        return (int)e;

    if (prefill) {
        return (int)(a.dtype == KILN_DTYPE_F16 ? kat_launch_prefill<KILN_DTYPE_F16>(a, f8, st)
                                               : kat_launch_prefill<KILN_DTYPE_BF16>(a, f8, st));
    }

    if (dmma)
        return (int)(a.dtype == KILN_DTYPE_F16 ? kat_launch_dmma<KILN_DTYPE_F16>(a, f8, st)
                                               : kat_launch_dmma<KILN_DTYPE_BF16>(a, f8, st));
    if (fast && (kat_use_pipe() || f8)) /* kat_decode reads no FP8 cache */
        return (int)kat_run_pipe(a, fused, st);
    int32_t g, tile;
    if (fast) {
        int hg = kat_hg(a.n_heads, a.n_kv_heads);
        int64_t ctas = (int64_t)a.n_kv_heads * ((a.n_heads / a.n_kv_heads + hg - 1) / hg);
        tile = kat_decode_tile(a.dtype, a.head_dim);
        int32_t cluster = kat_use_cluster();
        for (int attempt = 0; attempt < 2; attempt++) {
            g = cluster ? kat_cluster_splits(a.tokens, ctas, max_ctx, tile) : kat_splits(a.tokens, ctas, max_ctx, tile);
            if (g > 1 && !cluster && !a.workspace)
                return (int)cudaErrorInvalidValue;
            const int32_t cl = g > 1 && cluster;
            switch (a.dtype) {
            case KILN_DTYPE_F32: e = kat_launch_decode_dt<KILN_DTYPE_F32>(a, hg, g, fused, cl, st); break;
            case KILN_DTYPE_F16: e = kat_launch_decode_dt<KILN_DTYPE_F16>(a, hg, g, fused, cl, st); break;
            default: e = kat_launch_decode_dt<KILN_DTYPE_BF16>(a, hg, g, fused, cl, st); break;
            }
            if (!cl || e == cudaSuccess)
                break;
            /* clusters of this size cannot run here (or the launch refused
             * them): split and combine, from now on */
            (void)cudaGetLastError();
            kat_cluster_refused = 1;
            cluster = 0;
        }
        if (cluster)
            return (int)e;
    } else {
        tile = KAT_GENERIC_TILE;
        g = kat_splits(a.tokens, a.n_heads, max_ctx, tile);
        if (g > 1 && !a.workspace)
            return (int)cudaErrorInvalidValue;
        e = kcu_launch_cfg(kat_generic, dim3((unsigned)a.tokens, (unsigned)a.n_heads, (unsigned)g), dim3(KAT_THREADS),
                           st, a);
    }
    if (e != cudaSuccess || g == 1)
        return (int)e;
    return (int)kcu_launch_cfg(kat_combine, dim3((unsigned)a.tokens, (unsigned)a.n_heads), dim3(KAT_THREADS), st, a, g,
                               tile, (int32_t)0);
}

extern "C" const char *kiln_attention_cuda_error(int code) { return cudaGetErrorString((cudaError_t)code); }
