/* RoPE on CUDA. Grid: x = token (strided), y = group of heads; a block's
 * thread i rotates pair i % half of head (group * per + i / half), with
 * half = rotary_dim / 2 and per = ROPE_THREADS / half heads a group, so
 * each thread computes its angle's sine and cosine once for all the heads
 * it rotates in the token, not once per head. Both values of a pair are
 * read before either is written, so y may alias x. When y is not x, the
 * last y-slice of the grid copies what is not rotated (the v heads of a
 * packed row, dims past rotary_dim). Angles are position * inv_freq in
 * f32, the frequencies computed on the host exactly as the CPU reference
 * uses them; cos and sin and every product are rounded to the storage
 * dtype as in rope.c. */
#include <stdlib.h>
#include <string.h>

#include "plugin_cuda.h"

#include "backend/cuda/cuda_common.cuh"
#include "rope/rope_math.cuh"

#define ROPE_THREADS 256
#define ROPE_VEC_THREADS 128

__global__ void __launch_bounds__(ROPE_THREADS) rope_kernel(const kiln_rope_cuda_args a, int32_t groups)
{
    KTL_SCOPE(0);
    kcu_after_prior(a.x, a.pos, a.tokens, a.dtype);
    const int t = a.dtype, half = a.rotary_dim / 2, per = ROPE_THREADS / half;
    const int64_t width = (int64_t)a.row_heads * a.head_dim;
    if ((int)blockIdx.y == groups) {
        /* the copy slice: dims [rotated ? rotary_dim : 0, head_dim) of every head */
        const int keep = a.head_dim - a.rotary_dim;
        const int64_t n_rot = (int64_t)a.rotated_heads * keep,
                      n = n_rot + (int64_t)(a.row_heads - a.rotated_heads) * a.head_dim;
        for (int64_t tok = blockIdx.x; tok < a.tokens; tok += gridDim.x)
            for (int64_t i = threadIdx.x; i < n; i += ROPE_THREADS) {
                int64_t off = i < n_rot ? (i / keep) * a.head_dim + a.rotary_dim + i % keep
                                        : (int64_t)a.rotated_heads * a.head_dim + (i - n_rot);
                kcu_store_float(a.y, t, tok * width + off, kcu_load_float(a.x, t, tok * width + off));
            }
        return;
    }
    const int j = threadIdx.x % half, h = blockIdx.y * per + threadIdx.x / half;
    if (threadIdx.x >= per * half || h >= a.rotated_heads)
        return;
    const float inv = a.inv_freq[j];
    for (int64_t tok = blockIdx.x; tok < a.tokens; tok += gridDim.x) {
        const int64_t base = tok * width + (int64_t)h * a.head_dim;
        const int64_t ia = base + (a.interleaved ? 2 * j : j), ib = base + (a.interleaved ? 2 * j + 1 : j + half);
        float x0 = kcu_load_float(a.x, t, ia), x1 = kcu_load_float(a.x, t, ib), c, s, y0, y1;
        rope_cos_sin(t, (float)a.pos[tok], inv, &c, &s);
        rope_rotate(t, x0, x1, c, s, &y0, &y1);
        kcu_store_float(a.y, t, ia, y0);
        kcu_store_float(a.y, t, ib, y1);
    }
}

/* The same rotation in 16-byte vectors (PER elements of DT each), a
 * block a token: thread (c, hl) takes vector c of the rotated part of
 * heads hl, hl + HL, ..., so its pairs' sines and cosines are computed
 * once for all of them. Without IL (pairs j and j + half) a vector of
 * each half holds PER pairs, with IL (pairs 2j and 2j + 1) one vector
 * PER / 2. When y is not x the block then copies what is not rotated, a
 * vector a thread. Below 256 tokens grid.y splits each token's heads
 * (and the copy) over that many blocks. The same roundings as rope_kernel. The scalar kernel,
 * one element a load and a sine and cosine per head, ran at about a
 * sixth of the memory's bandwidth at 1,024 tokens of the 8B (ncu: 44 us
 * for 12.6 MB in and out). */
template <int DT, bool IL>
__global__ void __launch_bounds__(ROPE_VEC_THREADS) rope_vec_kernel(const kiln_rope_cuda_args a, int copy)
{
    KTL_SCOPE(0);
    kcu_after_prior(a.x, a.pos, a.tokens, a.dtype);
    constexpr int PER = DT == KILN_DTYPE_F32 ? 4 : 8, P = IL ? PER / 2 : PER, ES = 16 / PER;
    const int half = a.rotary_dim / 2, C = (IL ? a.rotary_dim : half) / PER;
    const int c = threadIdx.x % C, hl = threadIdx.x / C, HL = ROPE_VEC_THREADS / C, hy = (int)blockIdx.y;
    const int64_t width = (int64_t)a.row_heads * a.head_dim;
    const char *x = (const char *)a.x;
    char *y = (char *)a.y;
    for (int64_t tok = blockIdx.x; tok < a.tokens; tok += gridDim.x) {
        if (hl < HL && hl + hy * HL < a.rotated_heads) {
            const float pos = (float)a.pos[tok];
            float cs[P], sn[P];
#pragma unroll
            for (int p = 0; p < P; p++)
                rope_cos_sin(DT, pos, a.inv_freq[c * P + p], &cs[p], &sn[p]);
            for (int h = hl + hy * HL; h < a.rotated_heads; h += HL * (int)gridDim.y) {
                const int64_t at0 = tok * width + (int64_t)h * a.head_dim + c * PER, at1 = IL ? at0 : at0 + half;
                const uint4 u0 = __ldg((const uint4 *)(x + at0 * ES)),
                            u1 = IL ? u0 : __ldg((const uint4 *)(x + at1 * ES));
                uint4 o0 = u0, o1 = u1;
#pragma unroll
                for (int p = 0; p < P; p++) {
                    /* the pair's elements: e0 of u0 and e1 of u1 */
                    const int e0 = IL ? 2 * p : p, e1 = IL ? 2 * p + 1 : p;
                    float y0, y1;
                    rope_rotate(DT, kiln_elem_load_f32(&u0, DT, e0), kiln_elem_load_f32(&u1, DT, e1), cs[p], sn[p], &y0,
                                &y1);
                    if (IL) {
                        kiln_elem_store_f32(&o0, DT, e0, y0);
                        kiln_elem_store_f32(&o0, DT, e1, y1);
                    } else {
                        kiln_elem_store_f32(&o0, DT, e0, y0);
                        kiln_elem_store_f32(&o1, DT, e1, y1);
                    }
                }
                *(uint4 *)(y + at0 * ES) = o0;
                if (!IL)
                    *(uint4 *)(y + at1 * ES) = o1;
            }
        }
        if (copy) {
            /* the dims past rotary_dim of the rotated heads, then the other heads whole */
            const int kv = (a.head_dim - a.rotary_dim) / PER;
            const int64_t n_rot = (int64_t)a.rotated_heads * kv,
                          n = n_rot + (int64_t)(a.row_heads - a.rotated_heads) * (a.head_dim / PER);
            for (int64_t i = threadIdx.x + hy * ROPE_VEC_THREADS; i < n; i += ROPE_VEC_THREADS * gridDim.y) {
                const int64_t off = i < n_rot ? (i / kv) * a.head_dim + a.rotary_dim + (i % kv) * PER
                                              : (int64_t)a.rotated_heads * a.head_dim + (i - n_rot) * PER;
                *(uint4 *)(y + (tok * width + off) * ES) = __ldg((const uint4 *)(x + (tok * width + off) * ES));
            }
        }
    }
}

/* Which kernel: the 16-byte one from ROPE_VEC_MIN_TOKENS tokens on, the
 * scalar one below, where a step is latency, not bytes, and the scalar
 * kernel's one sine and cosine a thread (against eight in a chain) wins:
 * 8B FP8 decode on the H200 358.5 tok/s with it against 350.5 with the
 * 16-byte kernel at one token. KILN_ROPE=scalar or vec takes that one for
 * every shape the 16-byte kernel can run (to time both, and for the op
 * tests); read at each launch (a graph keeps its capture's). */
#define ROPE_VEC_MIN_TOKENS 128

static bool rope_use_vec(int64_t tokens)
{
    const char *e = getenv("KILN_ROPE");
    if (e && strcmp(e, "scalar") == 0)
        return false;
    return tokens >= ROPE_VEC_MIN_TOKENS || (e && strcmp(e, "vec") == 0);
}

template <int DT> static cudaError_t rope_vec_launch(const kiln_rope_cuda_args *a, int copy, cudaStream_t s)
{
    /* few tokens (decode): the heads over grid.y too, a pass of HL heads a
     * block, so a token's passes run side by side instead of one after
     * another in one block */
    const int per = DT == KILN_DTYPE_F32 ? 4 : 8;
    const int hl = ROPE_VEC_THREADS / ((a->interleaved ? a->rotary_dim : a->rotary_dim / 2) / per);
    const unsigned ny = a->tokens >= 256 ? 1u : (unsigned)((a->rotated_heads + hl - 1) / hl);
    const dim3 grid((unsigned)(a->tokens < 65535 ? a->tokens : 65535), ny > 0 ? ny : 1u);
    return a->interleaved ? kcu_launch_cfg(rope_vec_kernel<DT, true>, grid, dim3(ROPE_VEC_THREADS), s, *a, copy)
                          : kcu_launch_cfg(rope_vec_kernel<DT, false>, grid, dim3(ROPE_VEC_THREADS), s, *a, copy);
}

extern "C" int kiln_rope_cuda(const kiln_rope_cuda_args *a, void *stream)
{
    const int half = a->rotary_dim / 2;
    if (a->tokens <= 0 || half < 1 || half > ROPE_THREADS)
        return a->tokens <= 0 ? 0 : (int)cudaErrorInvalidValue;
    const int copy_vec = a->x != a->y;
    const int vper = a->dtype == KILN_DTYPE_F32 ? 4 : 8, vrot = a->interleaved ? a->rotary_dim : half;
    if (rope_use_vec(a->tokens) && (((uintptr_t)a->x | (uintptr_t)a->y) & 15) == 0 && a->head_dim % vper == 0 &&
        vrot % vper == 0 && vrot / vper <= ROPE_VEC_THREADS) {
        switch (a->dtype) {
        case KILN_DTYPE_F32: return (int)rope_vec_launch<KILN_DTYPE_F32>(a, copy_vec, (cudaStream_t)stream);
        case KILN_DTYPE_F16: return (int)rope_vec_launch<KILN_DTYPE_F16>(a, copy_vec, (cudaStream_t)stream);
        case KILN_DTYPE_BF16: return (int)rope_vec_launch<KILN_DTYPE_BF16>(a, copy_vec, (cudaStream_t)stream);
        default: break;
        }
    }
    const int per = ROPE_THREADS / half;
    const int32_t groups = (a->rotated_heads + per - 1) / per;
    const int copy = a->x != a->y && (a->rotary_dim < a->head_dim || a->row_heads > a->rotated_heads);
    unsigned tok_blocks = (unsigned)(a->tokens < 65535 ? a->tokens : 65535);
    return (int)kcu_launch_cfg(rope_kernel, dim3(tok_blocks, (unsigned)(groups + copy)), dim3(ROPE_THREADS),
                               (cudaStream_t)stream, *a, groups);
}
