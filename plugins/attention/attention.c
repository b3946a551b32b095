/* Paged causal attention (kiln/PagedAttention/1): appends this step's keys
 * and values to a paged KV cache, then attends every new query token to all
 * earlier tokens of its own sequence. Prefill and decode are the same call;
 * sequences of different lengths are packed one after another without
 * padding; grouped-query and multi-query attention map each query head to
 * kv head h / (n_heads / n_kv_heads).
 *
 * Inputs:
 *   0 q            [T, n_heads * head_dim]      new tokens of all sequences, packed
 *   1 k            [T, n_kv_heads * head_dim]
 *   2 v            [T, n_kv_heads * head_dim]
 *   3 kv_cache     [n_blocks, 2, n_kv_heads, block_size, head_dim]  written in place:
 *                  the caller binds it and keeps it across steps; nothing
 *                  but this op writes it while a step runs (the CUDA decode
 *                  reads cached keys before waiting on the previous kernel).
 *                  f32, f16, bf16, or u8 holding FP8 E4M3 codes (an FP8
 *                  cache): new keys and values are rounded to the nearest
 *                  E4M3 value, ties to even, scale 1, saturating at ±448
 *                  (NaN stays NaN; core/fp8.h), and every key read back,
 *                  this step's too, is the rounded one
 *   4 block_table  i32 [S, max_blocks]  cache block of each sequence's j-th block
 *   5 seq_lens     i32 [S]   tokens in each sequence after this step
 *   6 query_start  i32 [S+1] offsets of each sequence's new tokens in q (0, ..., T)
 *                  (4-6 are step inputs, written by no kernel of the step)
 * Output: [T, n_heads * head_dim], dtype of q.
 * Fields: n_heads, n_kv_heads, head_dim, block_size (i32, required);
 *         scale (f32, default 0 = 1/sqrt(head_dim));
 *         packed_qkv (i32, default 0): 1 = q, k and v come as one packed input
 *         qkv [T, (n_heads + 2 * n_kv_heads) * head_dim] (q heads, then k
 *         heads, then v heads of each token, as one fused QKV matmul writes
 *         them), so the inputs are (qkv, kv_cache, block_table, seq_lens,
 *         query_start).
 * Blob v2: the fields as 4-byte values in that order; v1 (without
 * packed_qkv) is still read.
 *
 * The new token j of sequence s sits at position seq_lens[s] - n_new + j and
 * sees positions 0..itself. Softmax runs online in f32 over tiles of keys
 * (no scratch memory); tasks of (token, head) are spread over the pool.
 *
 * CUDA (attention_cuda.cu, when built with nvcc): the same semantics for
 * f32, f16 and bf16 with the cache in the dtype of q or FP8; decode splits long
 * sequences over the workspace (workspace_size). The metadata lives on the
 * device, so it is not checked on the host there: inconsistent metadata
 * gives NaN outputs instead of an error (never an access out of bounds).
 */
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp8.h"
#include "plugin_util.h"

#ifdef KILN_HAVE_CUDA
#include "plugin_cuda.h"
#endif

#define NAME "PagedAttention"
#define BLOB_VERSION 2u
#define ATTN_MAX_HEAD_DIM 512

static const kiln_host_api *host;

typedef struct attn_params {
    int32_t n_heads, n_kv_heads, head_dim, block_size;
    float scale;
    int32_t packed_qkv;
} attn_params;

/* Blob bytes of each schema version (v1 lacks packed_qkv). */
static const size_t blob_sizes[BLOB_VERSION] = {offsetof(attn_params, packed_qkv), sizeof(attn_params)};

typedef struct attention {
    kiln_plugin base;
    attn_params p;
    float e4m3[256]; /* the value of each E4M3 code: an FP8 cache read through a table */
} attention;

static const kiln_plugin_ops attention_ops;

static kiln_status attention_new(const attn_params *p, kiln_plugin **out)
{
    if (p->n_heads < 1 || p->n_kv_heads < 1 || p->n_heads % p->n_kv_heads)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": n_heads %d must be a positive multiple of n_kv_heads %d",
                          p->n_heads, p->n_kv_heads);
    if (p->head_dim < 1 || p->head_dim > ATTN_MAX_HEAD_DIM)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": head_dim %d must be in [1, %d]", p->head_dim,
                          ATTN_MAX_HEAD_DIM);
    if (p->block_size < 1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": block_size %d must be >= 1", p->block_size);
    if (!(p->scale >= 0.0f) || !isfinite(p->scale))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": scale must be >= 0");
    if (p->packed_qkv != 0 && p->packed_qkv != 1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": packed_qkv %d must be 0 or 1", p->packed_qkv);
    attention *a = calloc(1, sizeof *a);
    if (!a)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    a->base.struct_size = sizeof a->base;
    a->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    a->base.ops = &attention_ops;
    a->p = *p;
    if (a->p.scale == 0.0f)
        a->p.scale = 1.0f / sqrtf((float)p->head_dim);
    for (int c = 0; c < 256; c++)
        a->e4m3[c] = kiln_e4m3_to_f32((uint8_t)c);
    *out = &a->base;
    return KILN_OK;
}

static int32_t attention_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status attention_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                           kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    const attn_params *p = &((const attention *)self)->p;
    static const int32_t ranks[7] = {2, 2, 2, 5, 2, 1, 1}, packed_ranks[5] = {2, 5, 2, 1, 1};
    int32_t want_in = p->packed_qkv ? 5 : 7, meta = p->packed_qkv ? 1 : 3; /* meta: index of kv_cache */
    if (n_in != want_in)
        return host->fail(
            KILN_ERROR_SHAPE,
            p->packed_qkv ? NAME ": expects 5 inputs (qkv, kv_cache, block_table, seq_lens, query_start), got %d"
                          : NAME ": expects 7 inputs (q, k, v, kv_cache, block_table, seq_lens, query_start), got %d",
            n_in);
    for (int i = 0; i < n_in; i++)
        if (in[i].rank != (p->packed_qkv ? packed_ranks[i] : ranks[i]))
            return host->fail(KILN_ERROR_SHAPE, NAME ": input %d has rank %d, expected %d", i, in[i].rank,
                              p->packed_qkv ? packed_ranks[i] : ranks[i]);
    int64_t v, q_width = (int64_t)p->n_heads * p->head_dim, kv_width = (int64_t)p->n_kv_heads * p->head_dim;
    const int64_t want[3] = {p->packed_qkv ? q_width + 2 * kv_width : q_width, kv_width, kv_width};
    for (int i = 0; i < meta; i++)
        if (host->expr_is_constant(eb, in[i].d[1], &v) && v != want[i])
            return host->fail(KILN_ERROR_SHAPE, NAME ": input %d has width %lld, expected %lld", i, (long long)v,
                              (long long)want[i]);
    const int64_t cache[4] = {2, p->n_kv_heads, p->block_size, p->head_dim};
    for (int i = 0; i < 4; i++)
        if (host->expr_is_constant(eb, in[meta].d[i + 1], &v) && v != cache[i])
            return host->fail(KILN_ERROR_SHAPE, NAME ": kv_cache dim %d is %lld, expected %lld", i + 1, (long long)v,
                              (long long)cache[i]);
    out[0] = in[0];
    out[0].d[1] = host->expr_constant(eb, q_width);
    return KILN_OK;
}

static kiln_status attention_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                           int32_t n_out)
{
    out[0] = in[0];
    return KILN_OK;
}

static int32_t attention_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d,
                                  int32_t n_in, int32_t n_out)
{
    const attn_params *p = &((const attention *)self)->p;
    int32_t meta = p->packed_qkv ? 1 : 3; /* index of kv_cache */
    if (!(PLUGIN_BUILTIN_BACKENDS & KILN_BACKEND_BIT(backend)) || n_in != meta + 4 || n_out != 1)
        return 0;
    /* the CUDA kernels keep the cache in the activations' dtype or in FP8 */
    if (backend != KILN_BACKEND_CPU && d[meta].dtype != d[0].dtype && d[meta].dtype != KILN_DTYPE_U8)
        return 0;
    if (!plugin_is_float(d[meta].dtype) && d[meta].dtype != KILN_DTYPE_U8)
        return 0;
    for (int i = 0; i < meta; i++)
        if (!plugin_is_float(d[i].dtype))
            return 0;
    for (int i = 1; i < meta; i++)
        if (d[i].dtype != d[0].dtype)
            return 0;
    return d[meta + 1].dtype == KILN_DTYPE_I32 && d[meta + 2].dtype == KILN_DTYPE_I32 &&
           d[meta + 3].dtype == KILN_DTYPE_I32 && d[n_in].dtype == d[0].dtype;
}

typedef struct attn_job {
    const attn_params *p;
    kiln_dtype t, ct;      /* activation and cache dtypes (u8: E4M3 codes) */
    const float *e4m3;     /* the value of each E4M3 code */
    const void *q, *k, *v; /* head 0 of token 0 */
    int64_t q_ld, kv_ld;   /* elements from one token's row to the next */
    void *cache, *out;
    const int32_t *table, *seq_lens, *qstart;
    int64_t n_seqs, max_blocks;
    /* the work split (attn_plan): query heads of one kv head taken
     * together, and the first `span` keys cut into n_chunks chunks
     * (chunk_begin) whose partial results wait in `part` (NULL: one
     * chunk, written straight to out) */
    int64_t n_sub, sub, n_chunks, span;
    float *part;
    /* AVX-512 kernels: kv heads a decode row task takes together (1 in a
     * step that also has tiles of several tokens); with chunks in a step
     * of decode rows only, the chunks done of each (token, row task),
     * whose last merges them (NULL: a merge pass runs after) */
    int64_t row_kv, rows_only;
    atomic_int *done;
    /* the AVX-512 kernels may run: built in, the CPU has them and
     * KILN_ATTENTION_ISA is not "c" (read once a call) */
    int avx512;
} attn_job;

static void attn_merge(void *arg, int64_t begin, int64_t end);

/* Sequence holding packed token t: the last s with qstart[s] <= t. */
static int64_t seq_of(const attn_job *j, int64_t t)
{
    int64_t lo = 0, hi = j->n_seqs - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (j->qstart[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Chunk c of the keys: from chunk_begin(j, c) to chunk_end(j, c), near
 * equal shares of the span in whole 16-key tiles; the last runs on past
 * the span (to every key). */
static int64_t chunk_begin(const attn_job *j, int64_t c) { return c * j->span / j->n_chunks / 16 * 16; }
static int64_t chunk_end(const attn_job *j, int64_t c)
{
    return c + 1 < j->n_chunks ? chunk_begin(j, c + 1) : INT64_MAX;
}

static int64_t position_of(const attn_job *j, int64_t s, int64_t t)
{
    int64_t n_new = j->qstart[s + 1] - j->qstart[s];
    return j->seq_lens[s] - n_new + (t - j->qstart[s]);
}

/* Element index of (block, kind 0=k/1=v, kv head, slot, dim 0) in the cache. */
static int64_t cache_index(const attn_job *j, int64_t s, int64_t pos, int kind, int64_t kvh)
{
    const attn_params *p = j->p;
    int64_t block = j->table[s * j->max_blocks + pos / p->block_size];
    return (((block * 2 + kind) * p->n_kv_heads + kvh) * p->block_size + pos % p->block_size) * p->head_dim;
}

#ifdef PLUGIN_AVX512
/* n f32 values to f16 (round to nearest even, as kiln_f32_to_f16: NaN
 * stays NaN with its top payload bits), 16 at a time by vcvtps2ph. */
PLUGIN_AVX512_FN static void attn_f32_to_f16(uint16_t *dst, const float *src, int64_t n)
{
    int64_t d = 0;
    for (; d + 16 <= n; d += 16)
        _mm256_storeu_si256((__m256i *)(dst + d),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; d < n; d++)
        dst[d] = host->float_to_half(src[d]);
}
#endif

static void attn_append(void *arg, int64_t begin, int64_t end)
{
    const attn_job *j = arg;
    const attn_params *p = j->p;
    for (int64_t t = begin; t < end; t++) {
        int64_t s = seq_of(j, t), pos = position_of(j, s, t);
        for (int64_t h = 0; h < p->n_kv_heads; h++) {
            int64_t src = t * j->kv_ld + h * p->head_dim;
            int64_t kdst = cache_index(j, s, pos, 0, h), vdst = cache_index(j, s, pos, 1, h);
#ifdef PLUGIN_AVX512
            if (j->avx512 && j->t == KILN_DTYPE_F32 && j->ct == KILN_DTYPE_F16) { /* vcvtps2ph */
                attn_f32_to_f16((uint16_t *)j->cache + kdst, (const float *)j->k + src, p->head_dim);
                attn_f32_to_f16((uint16_t *)j->cache + vdst, (const float *)j->v + src, p->head_dim);
                continue;
            }
#endif
            if (j->ct == KILN_DTYPE_U8) {
                uint8_t *c = j->cache;
                for (int64_t d = 0; d < p->head_dim; d++) {
                    c[kdst + d] = kiln_f32_to_e4m3(plugin_load(host, j->k, j->t, src + d));
                    c[vdst + d] = kiln_f32_to_e4m3(plugin_load(host, j->v, j->t, src + d));
                }
                continue;
            }
            for (int64_t d = 0; d < p->head_dim; d++) {
                plugin_store(host, j->cache, j->ct, kdst + d, plugin_load(host, j->k, j->t, src + d));
                plugin_store(host, j->cache, j->ct, vdst + d, plugin_load(host, j->v, j->t, src + d));
            }
        }
    }
}

/* q · k over one cache row: eight partial sums, which the compiler keeps
 * in vector registers (an in-order sum cannot be vectorized). */
__attribute__((always_inline)) static inline float dot_row(const float *q, const float *k, int64_t n)
{
    float part[8] = {0};
    int64_t d = 0;
    for (; d + 8 <= n; d += 8)
        for (int i = 0; i < 8; i++)
            part[i] += q[d + i] * k[d + i];
    for (; d < n; d++)
        part[0] += q[d] * k[d];
    return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

/* Eight floats in a vector register (two on a baseline x86-64): local to
 * the kernels below, never passed or returned, which would change the
 * calling convention between the clones. */
typedef float attn_v8 __attribute__((vector_size(32)));

/* acc += sum over i < n of w[i] * rows[i] (rows hd apart), 32 dims at a
 * time kept in registers across the rows: four independent sums (one would
 * wait on the add's latency every row), the accumulator stored once per
 * tile. */
__attribute__((always_inline)) static inline void axpy_tile(float *restrict acc, const float *restrict w,
                                                            const float *restrict rows, int64_t n, int64_t hd)
{
    int64_t d = 0;
    for (; d + 32 <= hd; d += 32) {
        attn_v8 r0, r1, r2, r3, x;
        memcpy(&r0, acc + d, 32);
        memcpy(&r1, acc + d + 8, 32);
        memcpy(&r2, acc + d + 16, 32);
        memcpy(&r3, acc + d + 24, 32);
        for (int64_t i = 0; i < n; i++) {
            const float *row = rows + i * hd + d;
            attn_v8 wi = {0};
            wi += w[i];
            memcpy(&x, row, 32);
            r0 += wi * x;
            memcpy(&x, row + 8, 32);
            r1 += wi * x;
            memcpy(&x, row + 16, 32);
            r2 += wi * x;
            memcpy(&x, row + 24, 32);
            r3 += wi * x;
        }
        memcpy(acc + d, &r0, 32);
        memcpy(acc + d + 8, &r1, 32);
        memcpy(acc + d + 16, &r2, 32);
        memcpy(acc + d + 24, &r3, 32);
    }
    for (; d < hd; d++) {
        float r = acc[d];
        for (int64_t i = 0; i < n; i++)
            r += w[i] * rows[i * hd + d];
        acc[d] = r;
    }
}

/* out[i] = q · rows[i] for i < n (rows hd apart): four rows at a time,
 * each with its own sum, so the adds of one do not wait on another's. */
__attribute__((always_inline)) static inline void dot_tile(float *restrict out, const float *restrict q,
                                                           const float *restrict rows, int64_t n, int64_t hd)
{
    int64_t i = 0;
    if (hd % 8 == 0)
        for (; i + 4 <= n; i += 4) {
            attn_v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, qv, x;
            const float *r = rows + i * hd;
            for (int64_t d = 0; d < hd; d += 8) {
                memcpy(&qv, q + d, 32);
                memcpy(&x, r + d, 32);
                s0 += qv * x;
                memcpy(&x, r + hd + d, 32);
                s1 += qv * x;
                memcpy(&x, r + 2 * hd + d, 32);
                s2 += qv * x;
                memcpy(&x, r + 3 * hd + d, 32);
                s3 += qv * x;
            }
            out[i] = ((s0[0] + s0[4]) + (s0[1] + s0[5])) + ((s0[2] + s0[6]) + (s0[3] + s0[7]));
            out[i + 1] = ((s1[0] + s1[4]) + (s1[1] + s1[5])) + ((s1[2] + s1[6]) + (s1[3] + s1[7]));
            out[i + 2] = ((s2[0] + s2[4]) + (s2[1] + s2[5])) + ((s2[2] + s2[6]) + (s2[3] + s2[7]));
            out[i + 3] = ((s3[0] + s3[4]) + (s3[1] + s3[5])) + ((s3[2] + s3[6]) + (s3[3] + s3[7]));
        }
    for (; i < n; i++)
        out[i] = dot_row(q, rows + i * hd, hd);
}

/* n cache rows from `base` (contiguous: one block's slots) as f32: in
 * place, or widened into buf. */
static inline const float *cache_rows(const attn_job *j, int64_t base, int64_t n, float *buf)
{
    if (j->ct == KILN_DTYPE_F32)
        return (const float *)j->cache + base;
    if (j->ct == KILN_DTYPE_U8) {
        for (int64_t d = 0; d < n * j->p->head_dim; d++)
            buf[d] = j->e4m3[((const uint8_t *)j->cache)[base + d]];
        return buf;
    }
    for (int64_t d = 0; d < n * j->p->head_dim; d++)
        buf[d] = plugin_load(host, j->cache, j->ct, base + d);
    return buf;
}

/* Keys scored at once: their scores stay on the stack, the running max
 * and the rescale of the accumulators move once per tile, not per key, and
 * a tile never crosses a cache block (its rows are contiguous). */
#define ATTN_TILE 32
/* Query heads of one kv head attended together: each k and v row read
 * from the cache serves all of them. */
#define ATTN_SUB 8
/* Decode steps of up to ATTN_SPLIT_TOKENS tokens split the keys into up
 * to ATTN_SPLITS near-equal chunks of whole 16-key tiles, ATTN_MIN_CHUNK
 * keys a chunk on average, so that even one sequence with few kv heads
 * gives every thread work in near-equal shares (chunk_begin); partial
 * results are merged after. Each chunk costs its own start (its first
 * tile's rows are not prefetched, its queries set up) and a share of the
 * merge: on two cores 4 chunks ran the decode attention of SmolLM2 and of
 * the 1B 5-14% faster than 8, and 8 faster than 16 (bench/README-llm.md,
 * ninth session). At most 16 (attn_merge16 holds a chunk a lane). */
#define ATTN_SPLIT_TOKENS 8
#define ATTN_SPLITS 4
#define ATTN_MIN_CHUNK 32
_Static_assert(ATTN_SPLITS <= 16, "attn_merge16 takes up to 16 chunks");

/* e^z for the softmax's z <= 0: 0 below -87, where expf would return a
 * subnormal (or 0) through libm's slow underflow path, and the subnormal
 * would make every later FMA that reads it slow too. */
static inline float attn_exp(float z) { return z < -87.0f ? 0.0f : expf(z); }

/* Softmax state of one query head over some keys. */
typedef struct attn_acc {
    float m, l, acc[ATTN_MAX_HEAD_DIM];
} attn_acc;

static size_t part_floats(const attn_params *p) { return (size_t)p->head_dim + 2; }

/* One task: token t, query heads [h0, h0 + ng) of kv head kvh (a sub-group
 * of its group), keys [k_begin, k_end) of the token's sequence. */
PLUGIN_SIMD static void attn_task(const attn_job *j, int64_t t, int64_t kvh, int64_t h0, int64_t ng, int64_t k_begin,
                                  int64_t k_end, attn_acc *st)
{
    const attn_params *p = j->p;
    const int64_t hd = p->head_dim, bs = p->block_size;
    float q[ATTN_SUB][ATTN_MAX_HEAD_DIM], score[ATTN_SUB][ATTN_TILE], buf[ATTN_TILE * ATTN_MAX_HEAD_DIM];
    int64_t s = seq_of(j, t);
    for (int64_t g = 0; g < ng; g++) {
        int64_t qbase = t * j->q_ld + (h0 + g) * hd;
        /* the scale folded into q: one multiply per dim, not per key */
        for (int64_t d = 0; d < hd; d++) {
            q[g][d] = plugin_load(host, j->q, j->t, qbase + d) * p->scale;
            st[g].acc[d] = 0.0f;
        }
        st[g].m = -INFINITY;
        st[g].l = 0.0f;
    }
    for (int64_t k0 = k_begin; k0 < k_end;) {
        int64_t n = bs - k0 % bs;
        if (n > k_end - k0)
            n = k_end - k0;
        if (n > ATTN_TILE)
            n = ATTN_TILE;
        int64_t kb = cache_index(j, s, k0, 0, kvh), vb = cache_index(j, s, k0, 1, kvh);
        const float *kt = cache_rows(j, kb, n, buf);
        for (int64_t g = 0; g < ng; g++)
            dot_tile(score[g], q[g], kt, n, hd);
        for (int64_t g = 0; g < ng; g++) {
            float tile_max = -INFINITY;
            for (int64_t i = 0; i < n; i++)
                tile_max = score[g][i] > tile_max ? score[g][i] : tile_max;
            if (tile_max > st[g].m) {
                /* exp(-inf) = 0 clears the empty accumulator of the first tile */
                float correction = attn_exp(st[g].m - tile_max);
                st[g].l *= correction;
                for (int64_t d = 0; d < hd; d++)
                    st[g].acc[d] *= correction;
                st[g].m = tile_max;
            }
            for (int64_t i = 0; i < n; i++) {
                score[g][i] = attn_exp(score[g][i] - st[g].m);
                st[g].l += score[g][i];
            }
        }
        const float *vt = cache_rows(j, vb, n, buf);
        for (int64_t g = 0; g < ng; g++)
            axpy_tile(st[g].acc, score[g], vt, n, hd);
        k0 += n;
    }
}

/* Tasks are (token, sub-group of a kv head's query heads[, key chunk]). */
static void attn_tasks(void *arg, int64_t begin, int64_t end)
{
    const attn_job *j = arg;
    const attn_params *p = j->p;
    const int64_t hd = p->head_dim, group = p->n_heads / p->n_kv_heads;
    attn_acc st[ATTN_SUB];
    for (int64_t task = begin; task < end; task++) {
        int64_t c = task % j->n_chunks, rest = task / j->n_chunks;
        int64_t sg = rest % j->n_sub, t = rest / j->n_sub;
        int64_t kvh = sg / (j->n_sub / p->n_kv_heads), sub = sg % (j->n_sub / p->n_kv_heads);
        int64_t h0 = kvh * group + sub * j->sub, ng = group - sub * j->sub < j->sub ? group - sub * j->sub : j->sub;
        int64_t keys = position_of(j, seq_of(j, t), t) + 1;
        int64_t k_begin = chunk_begin(j, c), k_end = chunk_end(j, c) < keys ? chunk_end(j, c) : keys;
        if (k_begin >= k_end) {
            /* a chunk past this token's keys: an empty partial */
            for (int64_t g = 0; g < ng; g++)
                j->part[((t * p->n_heads + h0 + g) * j->n_chunks + c) * part_floats(p) + 1] = 0.0f;
            continue;
        }
        attn_task(j, t, kvh, h0, ng, k_begin, k_end, st);
        for (int64_t g = 0; g < ng; g++) {
            if (!j->part) {
                int64_t obase = (t * p->n_heads + h0 + g) * hd;
                for (int64_t d = 0; d < hd; d++)
                    plugin_store(host, j->out, j->t, obase + d, st[g].acc[d] / st[g].l);
                continue;
            }
            float *pp = j->part + ((t * p->n_heads + h0 + g) * j->n_chunks + c) * part_floats(p);
            pp[0] = st[g].m;
            pp[1] = st[g].l;
            memcpy(pp + 2, st[g].acc, (size_t)hd * sizeof(float));
        }
    }
}

/* ---- prefill tiles (AVX-512) ------------------------------------------------------------
 * Steps with f32 q, k and v, an f32 or f16 cache, a head_dim of 64 or 128 and query
 * groups of at most 16 heads: a task takes the query heads of one kv head
 * for ATTN_LANES / group consecutive tokens of one sequence (and, in a
 * decode step, one chunk of its keys), one query row per lane of a 512-bit register
 * (q transposed once, [dim][lane]). Each tile of 16 keys costs 16 · hd
 * FMAs for the scores (a key's dims broadcast against q's lanes) and as
 * many for the values, the online softmax runs lane by lane on whole
 * registers, and e^x is a polynomial on registers instead of a libm call
 * per score. A decode row (one token of a sequence in the tile) takes
 * attn_row instead, keys in the lanes. The cache may be f32, f16 or FP8
 * (its rows widened to f32 a tile at a time). Chunks' partial results are
 * merged by attn_merge16. KILN_ATTENTION_ISA=c runs the portable kernel
 * above instead (the tests compare both with a double-precision
 * reference, and the decode rows with the portable kernel). */
#ifdef PLUGIN_AVX512
#define ATTN_AVX512 1
#define ATTN_LANES 16
/* Loops over lanes and dims of constant count, unrolled so that their
 * registers stay registers. */
#define UNROLLED_FOR(i, n) _Pragma("GCC unroll 16") for (int i = 0; i < (n); i++)

/* 16 E4M3 codes as f32: code c has the f16 bits (c & 0x7F) << 7 (sign at
 * bit 15) times 2^8 (the exponent biases differ by 8 and f16 holds every
 * E4M3 subnormal); NaN (S.1111.111) set apart. */
PLUGIN_AVX512_FN static inline __m512 attn_e4m3x16(const uint8_t *src)
{
    const __m512i low7 = _mm512_set1_epi32(0x7F), sign = _mm512_set1_epi32(0x80);
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)src));
    __m512i mag = _mm512_and_si512(c, low7);
    __m512i h = _mm512_or_si512(_mm512_slli_epi32(mag, 7), _mm512_slli_epi32(_mm512_and_si512(c, sign), 8));
    __m512 x = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)), _mm512_set1_ps(256.0f));
    return _mm512_mask_mov_ps(x, _mm512_cmpeq_epi32_mask(mag, low7), _mm512_set1_ps(NAN));
}

/* ATTN_LANES rows of hd values from cache element `base` (n of them real,
 * the rest zeros) as f32 in dst: f16 widened exactly by vcvtph2ps. */
PLUGIN_AVX512_FN static inline void attn_rows_f32(const attn_job *j, int64_t base, int64_t n, int64_t hd, float *dst)
{
    if (j->ct == KILN_DTYPE_F16) {
        const uint16_t *src = (const uint16_t *)j->cache + base;
        for (int64_t e = 0; e < n * hd; e += 16)
            _mm512_storeu_ps(dst + e, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + e))));
    } else if (j->ct == KILN_DTYPE_U8) {
        /* E4M3 code c has the f16 bits (c & 0x7F) << 7 (sign at bit 15)
         * times 2^8: the exponent biases differ by 8 and f16 holds every
         * E4M3 subnormal; NaN (S.1111.111) set apart */
        const uint8_t *src = (const uint8_t *)j->cache + base;
        for (int64_t e = 0; e < n * hd; e += 16)
            _mm512_storeu_ps(dst + e, attn_e4m3x16(src + e));
    } else {
        memcpy(dst, (const float *)j->cache + base, sizeof(float) * (size_t)(n * hd));
    }
    memset(dst + n * hd, 0, sizeof(float) * (size_t)((ATTN_LANES - n) * hd));
}

/* The next tile of keys from k0 (at most ATTN_LANES, never past k_end or
 * the end of k0's block, so its rows are contiguous): its length, and its
 * K and V rows as f32 — in place for a whole f32 tile, else widened from
 * f16 and padded with zero rows into kbuf and vbuf. */
PLUGIN_AVX512_FN static inline int64_t attn_tile_rows(const attn_job *j, int64_t s, int64_t kvh, int64_t k0,
                                                      int64_t k_end, int64_t hd, float *kbuf, float *vbuf,
                                                      const float **K, const float **V)
{
    const int64_t bs = j->p->block_size;
    int64_t n = bs - k0 % bs;
    n = n < k_end - k0 ? n : k_end - k0;
    n = n < ATTN_LANES ? n : ATTN_LANES;
    if (j->ct != KILN_DTYPE_F32 || n < ATTN_LANES) {
        attn_rows_f32(j, cache_index(j, s, k0, 0, kvh), n, hd, kbuf);
        attn_rows_f32(j, cache_index(j, s, k0, 1, kvh), n, hd, vbuf);
        *K = kbuf, *V = vbuf;
    } else {
        *K = (const float *)j->cache + cache_index(j, s, k0, 0, kvh);
        *V = (const float *)j->cache + cache_index(j, s, k0, 1, kvh);
    }
    return n;
}

/* Sixteen vectors to one: lane i of the result is v[i]'s lanes folded by
 * OP (attn_sum16: the sum, attn_max16: the largest). A tree of unpacks and
 * 128-bit shuffles, 45 instructions where sixteen horizontal folds would
 * take about twice as many. One body, two instances, so that each keeps
 * its one instruction per step. */
#define ATTN_FOLD16(NAME, OP) \
    PLUGIN_AVX512_FN static inline __m512 NAME(const __m512 *v) \
    { \
        __m512 a[8], b[4], c[2]; \
        /* pairs: [x0 OP x2, y0 OP y2, x1 OP x3, y1 OP y3] in each 128-bit lane */ \
        UNROLLED_FOR (i, 8) \
            a[i] = OP(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1])); \
        /* quads: [x, y, z, w] per 128-bit lane, each a lane's fold of four */ \
        UNROLLED_FOR (i, 4) { \
            __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(a[2 * i]), _mm512_castps_pd(a[2 * i + 1])); \
            __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(a[2 * i]), _mm512_castps_pd(a[2 * i + 1])); \
            b[i] = OP(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi)); \
        } \
        /* across the 128-bit lanes: even with odd ones, twice */ \
        UNROLLED_FOR (i, 2) \
            c[i] = OP(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88), \
                      _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xDD)); \
        return OP(_mm512_shuffle_f32x4(c[0], c[1], 0x88), _mm512_shuffle_f32x4(c[0], c[1], 0xDD)); \
    }
ATTN_FOLD16(attn_sum16, _mm512_add_ps)
ATTN_FOLD16(attn_max16, _mm512_max_ps)

/* attn_merge on AVX-512, for up to 16 chunks and a head_dim that is a
 * multiple of 16: each (token, query head)'s chunk maxima and sums in one
 * vector, their weights one e^x, the partial outputs summed 16 dims at a
 * time. Chunks past a token's keys (sum 0) left out. */
PLUGIN_AVX512_FN static void attn_merge16(const attn_job *j, int64_t begin, int64_t end)
{
    const attn_params *p = j->p;
    const int64_t hd = p->head_dim, nc = j->n_chunks, pf = (int64_t)part_floats(p);
    const __mmask16 chunks = (__mmask16)((1u << nc) - 1u);
    const __m512i stride = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32((int)pf));
    float w[16] __attribute__((aligned(64)));
    for (int64_t th = begin; th < end; th++) {
        const float *pp = j->part + th * nc * pf;
        __m512 ms = _mm512_mask_i32gather_ps(_mm512_set1_ps(-INFINITY), chunks, stride, pp, 4);
        __m512 ls = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), chunks, stride, pp + 1, 4);
        __mmask16 live = _mm512_cmp_ps_mask(ls, _mm512_setzero_ps(), _CMP_GT_OQ);
        float m = _mm512_mask_reduce_max_ps(live, ms);
        __m512 wv = _mm512_maskz_mov_ps(live, plugin_exp16(_mm512_sub_ps(ms, _mm512_set1_ps(m))));
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(_mm512_mul_ps(wv, ls)));
        _mm512_store_ps(w, wv);
        float *o = (float *)j->out + th * hd;
        for (int64_t d = 0; d < hd; d += 16) {
            __m512 acc = _mm512_setzero_ps();
            for (int64_t c = 0; c < nc; c++)
                if (live >> c & 1)
                    acc = _mm512_fmadd_ps(_mm512_set1_ps(w[c]), _mm512_loadu_ps(pp + c * pf + 2 + d), acc);
            _mm512_storeu_ps(o + d, _mm512_mul_ps(acc, inv));
        }
    }
}

static void attn_merge16_tasks(void *arg, int64_t begin, int64_t end) { attn_merge16(arg, begin, end); }

/* 16 cache values from element e of base as f32: the cache's kind K is
 * 0 (f32), 1 (f16, widened by vcvtph2ps) or 2 (FP8 E4M3 codes, as
 * attn_rows_f32 widens them); ATTN_ES its element bytes. */
#define ATTN_ES(K) ((K) == 1 ? 2 : (K) == 2 ? 1 : 4)
#define ATTN_LOAD16(K, base, e) \
    ((K) == 1   ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)(base) + (e)))) \
     : (K) == 2 ? attn_e4m3x16((const uint8_t *)(base) + (e)) \
                : _mm512_loadu_ps((const float *)(base) + (e)))

/* Heads whose outputs a V pass holds in registers: NB heads of 64 dims (4
 * vectors each) and the row's 4 vectors, at most 28 of the 32 registers. */
#define ATTN_VHEADS 6

/* o[g] = o[g] * cs[g] + sum over rows i < n of pw[g][i] * V[i], for the NB
 * heads from g0, dims [dh, dh + 64) of V rows HD apart at vp (cache kind
 * K): each row's 64 values loaded (and widened) once for all NB heads. */
#define ATTN_VBLOCK(HD, K, NB) \
    do { \
        __m512 o[NB][4]; \
        UNROLLED_FOR (b, NB) \
            UNROLLED_FOR (v, 4) \
                o[b][v] = _mm512_mul_ps(_mm512_load_ps(os[g0 + b] + dh + 16 * v), _mm512_set1_ps(cs[g0 + b])); \
        for (int64_t i = 0; i < n; i++) { \
            if (vn) \
                for (int64_t off = 0; off < (HD)*ATTN_ES(K); off += 64) \
                    _mm_prefetch(vn + i * (HD)*ATTN_ES(K) + off, _MM_HINT_T0); \
            __m512 x[4]; \
            UNROLLED_FOR (v, 4) \
                x[v] = ATTN_LOAD16(K, vp, i * (HD) + dh + 16 * v); \
            UNROLLED_FOR (b, NB) { \
                __m512 w = _mm512_set1_ps(pw[g0 + b][i]); \
                UNROLLED_FOR (v, 4) \
                    o[b][v] = _mm512_fmadd_ps(w, x[v], o[b][v]); \
            } \
        } \
        UNROLLED_FOR (b, NB) \
            UNROLLED_FOR (v, 4) \
                _mm512_store_ps(os[g0 + b] + dh + 16 * v, o[b][v]); \
    } while (0)

/* One decode row: token t of sequence s, the query heads of kv heads
 * [kv0, kv0 + nkv) (H = nkv · group <= ATTN_LANES heads), the keys of
 * chunk c, a tile of up to 16 keys (one block's) at a time, keys in the
 * lanes. Per tile: each kv head's K rows widened once into kbuf, and per
 * query head 16 dot products of partial-sum vectors folded into one vector
 * of 16 scores (attn_sum16); then the softmax of all H heads at once —
 * their tile maxima folded into one vector (attn_max16), one e^x for every
 * head's rescale, the running sums kept as vectors (folded once a chunk);
 * then each kv head's V rows, each widened once and summed into up to
 * ATTN_VHEADS heads' outputs held in registers (64 dims at a time). A task
 * reads its chunk front to back, a block's keys for all its kv heads and
 * then their values, and asks for the next tile's rows while it computes
 * this one's. */
#define ATTN_ROW_FN(NAME, HD, K) \
    PLUGIN_AVX512_FN static void NAME(const attn_job *j, int64_t s, int64_t t, int64_t kv0, int64_t nkv, int64_t c) \
    { \
        const attn_params *p = j->p; \
        const int64_t G = p->n_heads / p->n_kv_heads, h0 = kv0 * G, H = nkv * G, bs = p->block_size; \
        enum { NV = (HD) / 16 }; \
        float qs[ATTN_LANES][HD] __attribute__((aligned(64))), os[ATTN_LANES][HD] __attribute__((aligned(64))); \
        float kbuf[ATTN_LANES * (HD)] __attribute__((aligned(64))); \
        float sc[ATTN_LANES][ATTN_LANES] __attribute__((aligned(64))); \
        float pw[ATTN_LANES][ATTN_LANES] __attribute__((aligned(64))); \
        float ls[ATTN_LANES][ATTN_LANES] __attribute__((aligned(64))); \
        float ms[ATTN_LANES] __attribute__((aligned(64))), cs[ATTN_LANES] __attribute__((aligned(64))); \
        const float *q = (const float *)j->q + t * j->q_ld + h0 * (HD); \
        const __m512 scale = _mm512_set1_ps(p->scale); \
        for (int64_t g = 0; g < ATTN_LANES; g++) { \
            /* rows past H: finite scores, so the fold of maxima stays finite there */ \
            _mm512_store_ps(sc[g], _mm512_setzero_ps()); \
            _mm512_store_ps(ls[g], _mm512_setzero_ps()); \
        } \
        for (int64_t g = 0; g < H; g++) \
            UNROLLED_FOR (v, NV) { \
                _mm512_store_ps(qs[g] + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(q + g * (HD) + 16 * v), scale)); \
                _mm512_store_ps(os[g] + 16 * v, _mm512_setzero_ps()); \
            } \
        __m512 m = _mm512_set1_ps(-INFINITY); /* lane g: head g's running max */ \
        const int64_t keys = position_of(j, s, t) + 1; \
        const int64_t k_end = keys < chunk_end(j, c) ? keys : chunk_end(j, c); \
        const int64_t kv_tasks = (p->n_kv_heads + j->row_kv - 1) / j->row_kv; \
        for (int64_t k0 = chunk_begin(j, c); k0 < k_end;) { \
            int64_t n = bs - k0 % bs; \
            n = n < k_end - k0 ? n : k_end - k0; \
            n = n < ATTN_LANES ? n : ATTN_LANES; \
            const __mmask16 real = (__mmask16)((1u << n) - 1u); \
            /* this tile's, the next one's and the one after's rows of kv head 0's \
             * K (a tile lies in one block: one table lookup a tile) */ \
            const int64_t k2 = k0 + n + ATTN_LANES, kvstep = bs * (HD)*ATTN_ES(K); \
            const char *t0 = (const char *)j->cache + cache_index(j, s, k0, 0, 0) * ATTN_ES(K); \
            const char *t1 = \
                k0 + n < k_end ? (const char *)j->cache + cache_index(j, s, k0 + n, 0, 0) * ATTN_ES(K) : NULL; \
            const char *t2 = k2 < k_end ? (const char *)j->cache + cache_index(j, s, k2, 0, 0) * ATTN_ES(K) : NULL; \
            for (int64_t kvh = kv0; kvh < kv0 + nkv; kvh++) { \
                const void *kp = t0 + kvh * kvstep; \
                /* the next tile's K rows asked of L1 as this one's are read (its \
                 * V rows in the V pass), and the K and V rows of the tile after \
                 * it of L2: a block's runs are too short for the hardware \
                 * prefetcher (3-5% less time with the cache in DRAM than the \
                 * next tile alone, bench/README-llm.md) */ \
                const char *kn = t1 ? t1 + kvh * kvstep : NULL; \
                const char *kn2 = t2 ? t2 + kvh * kvstep : NULL; \
                const char *vn2 = t2 ? t2 + (p->n_kv_heads + kvh) * kvstep : NULL; \
                const float *kr = kbuf; \
                if ((K) == 0 && n == ATTN_LANES) { /* f32 rows read in place */ \
                    kr = kp; \
                    for (int64_t off = 0; off < ATTN_LANES * (HD)*4; off += 64) { \
                        if (kn) \
                            _mm_prefetch(kn + off, _MM_HINT_T0); \
                        if (kn2) { \
                            _mm_prefetch(kn2 + off, _MM_HINT_T1); \
                            _mm_prefetch(vn2 + off, _MM_HINT_T1); \
                        } \
                    } \
                } else { \
                    for (int64_t e = 0; e < n * (HD); e += 16) { \
                        if (kn && (e * ATTN_ES(K)) % 64 == 0) \
                            _mm_prefetch(kn + e * ATTN_ES(K), _MM_HINT_T0); \
                        if (kn2 && (e * ATTN_ES(K)) % 64 == 0) { \
                            _mm_prefetch(kn2 + e * ATTN_ES(K), _MM_HINT_T1); \
                            _mm_prefetch(vn2 + e * ATTN_ES(K), _MM_HINT_T1); \
                        } \
                        _mm512_store_ps(kbuf + e, ATTN_LOAD16(K, kp, e)); \
                    } \
                    /* the padding rows' scores are masked, but read: keep them defined */ \
                    for (int64_t e = n * (HD); e < ATTN_LANES * (HD); e += 16) \
                        _mm512_store_ps(kbuf + e, _mm512_setzero_ps()); \
                } \
                for (int64_t g = (kvh - kv0) * G; g < (kvh - kv0 + 1) * G; g++) { \
                    __m512 part[ATTN_LANES]; \
                    UNROLLED_FOR (i, ATTN_LANES) { \
                        part[i] = _mm512_mul_ps(_mm512_load_ps(qs[g]), _mm512_loadu_ps(kr + i * (HD))); \
                        UNROLLED_FOR (v, NV - 1) \
                            part[i] = _mm512_fmadd_ps(_mm512_load_ps(qs[g] + 16 * (v + 1)), \
                                                      _mm512_loadu_ps(kr + i * (HD) + 16 * (v + 1)), part[i]); \
                    } \
                    _mm512_store_ps(sc[g], _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), real, attn_sum16(part))); \
                } \
            } \
            { \
                /* every head's softmax step at once; exp(-inf) = 0 clears the \
                 * empty accumulators of the first tile */ \
                __m512 rows[ATTN_LANES]; \
                UNROLLED_FOR (g, ATTN_LANES) \
                    rows[g] = _mm512_load_ps(sc[g]); \
                __m512 mx = _mm512_max_ps(m, attn_max16(rows)); \
                _mm512_store_ps(cs, plugin_exp16(_mm512_sub_ps(m, mx))); \
                _mm512_store_ps(ms, mx); \
                m = mx; \
            } \
            for (int64_t g = 0; g < H; g++) { \
                __m512 pv = plugin_exp16(_mm512_sub_ps(_mm512_load_ps(sc[g]), _mm512_set1_ps(ms[g]))); \
                _mm512_store_ps(pw[g], pv); \
                _mm512_store_ps(ls[g], _mm512_fmadd_ps(_mm512_load_ps(ls[g]), _mm512_set1_ps(cs[g]), pv)); \
            } \
            /* the values after every kv head's keys: a block is read front to back */ \
            for (int64_t kvh = kv0; kvh < kv0 + nkv; kvh++) { \
                const void *vp = t0 + (p->n_kv_heads + kvh) * kvstep; \
                const char *vn = t1 ? t1 + (p->n_kv_heads + kvh) * kvstep : NULL; \
                for (int64_t dh = 0; dh < (HD); dh += 64) \
                    for (int64_t g0 = (kvh - kv0) * G; g0 < (kvh - kv0 + 1) * G; g0 += ATTN_VHEADS) { \
                        int64_t nb = (kvh - kv0 + 1) * G - g0; \
                        switch (nb < ATTN_VHEADS ? nb : ATTN_VHEADS) { \
                        case 1: ATTN_VBLOCK(HD, K, 1); break; \
                        case 2: ATTN_VBLOCK(HD, K, 2); break; \
                        case 3: ATTN_VBLOCK(HD, K, 3); break; \
                        case 4: ATTN_VBLOCK(HD, K, 4); break; \
                        case 5: ATTN_VBLOCK(HD, K, 5); break; \
                        default: ATTN_VBLOCK(HD, K, 6); break; \
                        } \
                        vn = NULL; \
                    } \
            } \
            k0 += n; \
        } \
        _mm512_store_ps(ms, m); \
        for (int64_t g = 0; g < H; g++) { \
            float l = _mm512_reduce_add_ps(_mm512_load_ps(ls[g])); \
            if (j->part) { \
                float *pp = j->part + ((t * p->n_heads + h0 + g) * j->n_chunks + c) * part_floats(p); \
                pp[0] = ms[g]; \
                pp[1] = l; \
                memcpy(pp + 2, os[g], sizeof(float) * (HD)); \
                continue; \
            } \
            float *o = (float *)j->out + (t * p->n_heads + h0 + g) * (HD); \
            const __m512 inv = _mm512_set1_ps(1.0f / l); \
            UNROLLED_FOR (v, NV) \
                _mm512_storeu_ps(o + 16 * v, _mm512_mul_ps(_mm512_load_ps(os[g] + 16 * v), inv)); \
        } \
        /* the last chunk of these heads to finish merges them (the add \
         * orders the other chunks' partial results before the merge's reads) */ \
        if (j->done && atomic_fetch_add(&j->done[t * kv_tasks + kv0 / j->row_kv], 1) == j->n_chunks - 1) \
            attn_merge16(j, t * p->n_heads + h0, t * p->n_heads + h0 + H); \
    }

ATTN_ROW_FN(attn_row_64_f32, 64, 0)
ATTN_ROW_FN(attn_row_128_f32, 128, 0)
ATTN_ROW_FN(attn_row_64_f16, 64, 1)
ATTN_ROW_FN(attn_row_128_f16, 128, 1)
ATTN_ROW_FN(attn_row_64_fp8, 64, 2)
ATTN_ROW_FN(attn_row_128_fp8, 128, 2)

/* One task: tokens [t0, t0 + nt) of sequence s, the query heads of kv
 * head kvh (lane = token · group + head), head_dim HD, the keys of chunk
 * c (all of them when j->part is NULL; else the partial results go there
 * for attn_merge). */
#define ATTN_TILE_FN(NAME, HD) \
    PLUGIN_AVX512_FN static void NAME(const attn_job *j, int64_t s, int64_t t0, int64_t nt, int64_t kvh, int64_t c) \
    { \
        const attn_params *p = j->p; \
        const int64_t G = p->n_heads / p->n_kv_heads, lanes = nt * G; \
        float qt[HD][ATTN_LANES] __attribute__((aligned(64))), ot[HD][ATTN_LANES] __attribute__((aligned(64))); \
        float kpad[ATTN_LANES * (HD)], vpad[ATTN_LANES * (HD)]; \
        int32_t pos[ATTN_LANES]; \
        const float *q = j->q; \
        for (int64_t lane = 0; lane < ATTN_LANES; lane++) { \
            int64_t t = t0 + (lane < lanes ? lane : lanes - 1) / G, h = kvh * G + lane % G; \
            pos[lane] = (int32_t)position_of(j, s, t); \
            for (int64_t d = 0; d < (HD); d++) { \
                qt[d][lane] = lane < lanes ? q[t * j->q_ld + h * (HD) + d] * p->scale : 0.0f; \
                ot[d][lane] = 0.0f; \
            } \
        } \
        const __m512i vpos = _mm512_loadu_si512(pos); \
        const int64_t first = position_of(j, s, t0), keys = position_of(j, s, t0 + nt - 1) + 1; \
        const __m512 ninf = _mm512_set1_ps(-INFINITY); \
        __m512 m = ninf, l = _mm512_setzero_ps(); \
        const int64_t k_end = keys < chunk_end(j, c) ? keys : chunk_end(j, c); \
        for (int64_t k0 = chunk_begin(j, c); k0 < k_end;) { \
            /* a short tile's padding rows: their scores masked below */ \
            const float *K, *V; \
            const int64_t n = attn_tile_rows(j, s, kvh, k0, k_end, HD, kpad, vpad, &K, &V); \
            __m512 sc[ATTN_LANES]; \
            UNROLLED_FOR (i, ATTN_LANES) \
                sc[i] = _mm512_setzero_ps(); \
            for (int64_t d = 0; d < (HD); d++) { \
                __m512 qd = _mm512_load_ps(qt[d]); \
                UNROLLED_FOR (i, ATTN_LANES) \
                    sc[i] = _mm512_fmadd_ps(qd, _mm512_set1_ps(K[i * (HD) + d]), sc[i]); \
            } \
            if (k0 + ATTN_LANES - 1 > first || n < ATTN_LANES) \
                UNROLLED_FOR (i, ATTN_LANES) { \
                    __mmask16 hide = \
                        i < n ? _mm512_cmpgt_epi32_mask(_mm512_set1_epi32((int)(k0 + i)), vpos) : (__mmask16)0xFFFF; \
                    sc[i] = _mm512_mask_mov_ps(sc[i], hide, ninf); \
                } \
            __m512 mx = m; \
            UNROLLED_FOR (i, ATTN_LANES) \
                mx = _mm512_max_ps(mx, sc[i]); \
            __m512 corr = plugin_exp16(_mm512_sub_ps(m, mx)), sum = _mm512_setzero_ps(); \
            UNROLLED_FOR (i, ATTN_LANES) { \
                sc[i] = plugin_exp16(_mm512_sub_ps(sc[i], mx)); \
                sum = _mm512_add_ps(sum, sc[i]); \
            } \
            l = _mm512_fmadd_ps(l, corr, sum); \
            m = mx; \
            /* eight dims at a time: eight independent FMA chains */ \
            for (int64_t d = 0; d < (HD); d += 8) { \
                __m512 o[8]; \
                UNROLLED_FOR (e, 8) \
                    o[e] = _mm512_mul_ps(_mm512_load_ps(ot[d + e]), corr); \
                UNROLLED_FOR (i, ATTN_LANES) \
                    UNROLLED_FOR (e, 8) \
                        o[e] = _mm512_fmadd_ps(sc[i], _mm512_set1_ps(V[i * (HD) + d + e]), o[e]); \
                UNROLLED_FOR (e, 8) \
                    _mm512_store_ps(ot[d + e], o[e]); \
            } \
            k0 += n; \
        } \
        float inv[ATTN_LANES]; \
        if (j->part) { \
            float ms[ATTN_LANES], ls[ATTN_LANES]; \
            _mm512_storeu_ps(ms, m); \
            _mm512_storeu_ps(ls, l); \
            for (int64_t lane = 0; lane < lanes; lane++) { \
                int64_t h = (t0 + lane / G) * p->n_heads + kvh * G + lane % G; \
                float *pp = j->part + (h * j->n_chunks + c) * part_floats(p); \
                pp[0] = ms[lane]; \
                pp[1] = ls[lane]; \
                for (int64_t d = 0; d < (HD); d++) \
                    pp[2 + d] = ot[d][lane]; \
            } \
            return; \
        } \
        _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), l)); \
        float *out = j->out; \
        for (int64_t lane = 0; lane < lanes; lane++) { \
            float *o = out + ((t0 + lane / G) * p->n_heads + kvh * G + lane % G) * (HD); \
            for (int64_t d = 0; d < (HD); d++) \
                o[d] = ot[d][lane] * inv[lane]; \
        } \
    }

ATTN_TILE_FN(attn_tile_64, 64)
ATTN_TILE_FN(attn_tile_128, 128)

/* Tasks are (tile of a sequence's tokens, kv head, key chunk); the tiles
 * of sequence s follow those of the sequences before it. */
static void attn_tile_tasks(void *arg, int64_t begin, int64_t end)
{
    const attn_job *j = arg;
    const attn_params *p = j->p;
    const int64_t per = ATTN_LANES / (p->n_heads / p->n_kv_heads);
    const int64_t kv_tasks = (p->n_kv_heads + j->row_kv - 1) / j->row_kv;
    for (int64_t task = begin; task < end; task++) {
        int64_t c = task % j->n_chunks, rest = task / j->n_chunks;
        int64_t tile = rest / kv_tasks, kvh = rest % kv_tasks * j->row_kv, s = 0, before = 0;
        for (; s < j->n_seqs; s++) {
            int64_t n = (j->qstart[s + 1] - j->qstart[s] + per - 1) / per;
            if (tile < before + n)
                break;
            before += n;
        }
        int64_t t0 = j->qstart[s] + (tile - before) * per, nt = j->qstart[s + 1] - t0;
        nt = nt < per ? nt : per;
        if (nt == 1) {
            int64_t nkv = p->n_kv_heads - kvh < j->row_kv ? p->n_kv_heads - kvh : j->row_kv;
            if (j->ct == KILN_DTYPE_F16)
                (p->head_dim == 64 ? attn_row_64_f16 : attn_row_128_f16)(j, s, t0, kvh, nkv, c);
            else if (j->ct == KILN_DTYPE_U8)
                (p->head_dim == 64 ? attn_row_64_fp8 : attn_row_128_fp8)(j, s, t0, kvh, nkv, c);
            else
                (p->head_dim == 64 ? attn_row_64_f32 : attn_row_128_f32)(j, s, t0, kvh, nkv, c);
        } else
            (p->head_dim == 64 ? attn_tile_64 : attn_tile_128)(j, s, t0, nt, kvh, c);
    }
}

/* The tiles of this step times its kv heads' tasks (a step of one new
 * token per sequence takes up to ATTN_LANES query heads a task: j->row_kv
 * kv heads), or 0 where the portable kernel runs. */
static int64_t attn_tile_count(attn_job *j, int64_t tokens)
{
    const attn_params *p = j->p;
    int64_t group = p->n_heads / p->n_kv_heads;
    if (j->t != KILN_DTYPE_F32 || (j->ct != KILN_DTYPE_F32 && j->ct != KILN_DTYPE_F16 && j->ct != KILN_DTYPE_U8) ||
        group > ATTN_LANES || (p->head_dim != 64 && p->head_dim != 128) || !j->avx512)
        return 0;
    int64_t per = ATTN_LANES / group, tiles = 0;
    j->rows_only = 1;
    for (int64_t s = 0; s < j->n_seqs; s++) {
        tiles += (j->qstart[s + 1] - j->qstart[s] + per - 1) / per;
        j->rows_only = j->rows_only && j->qstart[s + 1] - j->qstart[s] == 1;
    }
    j->row_kv = j->rows_only ? (per < p->n_kv_heads ? per : p->n_kv_heads) : 1;
    return tiles * ((p->n_kv_heads + j->row_kv - 1) / j->row_kv);
}
#endif

/* Merges the key chunks of each (token, query head). */
static void attn_merge(void *arg, int64_t begin, int64_t end)
{
    const attn_job *j = arg;
    const attn_params *p = j->p;
    const int64_t hd = p->head_dim;
    float acc[ATTN_MAX_HEAD_DIM];
    for (int64_t th = begin; th < end; th++) {
        const float *pp = j->part + th * j->n_chunks * part_floats(p);
        float m = -INFINITY, l = 0.0f;
        for (int64_t c = 0; c < j->n_chunks; c++)
            if (pp[c * part_floats(p) + 1] > 0.0f && pp[c * part_floats(p)] > m)
                m = pp[c * part_floats(p)];
        for (int64_t d = 0; d < hd; d++)
            acc[d] = 0.0f;
        for (int64_t c = 0; c < j->n_chunks; c++) {
            const float *pc = pp + c * part_floats(p);
            if (!(pc[1] > 0.0f))
                continue;
            float w = attn_exp(pc[0] - m);
            l += w * pc[1];
            for (int64_t d = 0; d < hd; d++)
                acc[d] += w * pc[2 + d];
        }
        for (int64_t d = 0; d < hd; d++)
            plugin_store(host, j->out, j->t, th * hd + d, acc[d] / l);
    }
}

/* How a step's attention is cut into tasks, and the workspace floats the
 * chunks' partial results need (0: none). */
static size_t attn_plan(const attn_params *p, int64_t tokens, int64_t max_keys, int64_t *n_sub, int64_t *sub,
                        int64_t *n_chunks, int64_t *span)
{
    int64_t group = p->n_heads / p->n_kv_heads;
    *sub = group < ATTN_SUB ? group : ATTN_SUB;
    *n_sub = p->n_kv_heads * ((group + *sub - 1) / *sub);
    *span = max_keys > 0 ? max_keys : 1;
    *n_chunks = max_keys / ATTN_MIN_CHUNK < ATTN_SPLITS ? max_keys / ATTN_MIN_CHUNK : ATTN_SPLITS;
    if (tokens > ATTN_SPLIT_TOKENS || *n_chunks <= 1) {
        *n_chunks = 1;
        return 0;
    }
    return (size_t)tokens * (size_t)p->n_heads * (size_t)*n_chunks * part_floats(p);
}

/* Checks the batch metadata so the kernels never index out of bounds. */
static kiln_status attention_check(const attn_job *j, int64_t tokens, int64_t n_blocks)
{
    const attn_params *p = j->p;
    if (j->qstart[0] != 0 || j->qstart[j->n_seqs] != tokens)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": query_start must run from 0 to %lld tokens, got %d to %d", (long long)tokens,
                          j->qstart[0], j->qstart[j->n_seqs]);
    for (int64_t s = 0; s < j->n_seqs; s++) {
        int64_t n_new = (int64_t)j->qstart[s + 1] - j->qstart[s];
        if (n_new < 0 || j->seq_lens[s] < n_new || j->seq_lens[s] > j->max_blocks * p->block_size)
            return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                              NAME ": sequence %lld has %lld new tokens and length %d (max %lld)", (long long)s,
                              (long long)n_new, j->seq_lens[s], (long long)(j->max_blocks * p->block_size));
        for (int64_t b = 0; b * p->block_size < j->seq_lens[s]; b++) {
            int32_t block = j->table[s * j->max_blocks + b];
            if (block < 0 || block >= n_blocks)
                return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                                  NAME ": sequence %lld block %lld is %d, outside the cache's %lld blocks",
                                  (long long)s, (long long)b, block, (long long)n_blocks);
        }
    }
    return KILN_OK;
}

/* The CPU attention of T tokens whose q, k and v rows start at q, k and v and
 * are q_ld and kv_ld elements apart: separate tensors and the packed qkv
 * row are the same call. */
static kiln_status attention_run(const attention *a, kiln_dtype t, const void *q, const void *k, const void *v,
                                 int64_t q_ld, int64_t kv_ld, int64_t tokens, const kiln_tensor_desc *cache_desc,
                                 void *cache, const kiln_tensor_desc *table_desc, const int32_t *table,
                                 const int32_t *seq_lens, const int32_t *qstart, void *out, void *workspace,
                                 void *stream)
{
    const attn_params *p = &a->p;
    attn_job job = {p,
                    t,
                    cache_desc->dtype,
                    a->e4m3,
                    q,
                    k,
                    v,
                    q_ld,
                    kv_ld,
                    cache,
                    out,
                    table,
                    seq_lens,
                    qstart,
                    table_desc->dims.d[0],
                    table_desc->dims.d[1],
                    0,
                    0,
                    0,
                    0,
                    NULL,
                    1,
                    0,
                    NULL,
                    0};
    kiln_status s = attention_check(&job, tokens, cache_desc->dims.d[0]);
    if (s != KILN_OK)
        return s;
#ifdef PLUGIN_AVX512
    const char *isa = getenv("KILN_ATTENTION_ISA");
    job.avx512 = !(isa && strcmp(isa, "c") == 0) && plugin_has_avx512();
#endif
    host->parallel_for(stream, tokens, attn_append, &job);
    int64_t max_keys = 1;
    for (int64_t i = 0; i < job.n_seqs; i++)
        max_keys = seq_lens[i] > max_keys ? seq_lens[i] : max_keys;
    if (attn_plan(p, tokens, max_keys, &job.n_sub, &job.sub, &job.n_chunks, &job.span) > 0 && workspace)
        job.part = workspace;
    else
        attn_plan(p, ATTN_SPLIT_TOKENS + 1, max_keys, &job.n_sub, &job.sub, &job.n_chunks, &job.span);
#ifdef ATTN_AVX512
    int64_t tile_tasks = attn_tile_count(&job, tokens);
    if (tile_tasks > 0 && job.part && job.rows_only) {
        /* decode rows only: each group's last chunk merges (one pass over
         * the pool fewer a layer); the counters follow the partial results */
        job.done =
            (atomic_int *)(job.part + (size_t)tokens * (size_t)p->n_heads * (size_t)job.n_chunks * part_floats(p));
        for (int64_t i = 0; i < tile_tasks; i++)
            atomic_init(&job.done[i], 0);
    }
    if (tile_tasks > 0) {
        host->parallel_for(stream, tile_tasks * job.n_chunks, attn_tile_tasks, &job);
        if (job.part && !job.done)
            host->parallel_for(stream, tokens * p->n_heads, attn_merge16_tasks, &job);
        return KILN_OK;
    }
#endif
    host->parallel_for(stream, tokens * job.n_sub * job.n_chunks, attn_tasks, &job);
    if (job.part)
        host->parallel_for(stream, tokens * p->n_heads, attn_merge, &job);
    return KILN_OK;
}

static kiln_status attention_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                                     const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc,
                                     void *const *out, int32_t n_out, void *workspace, void *stream)
{
    const attn_params *p = &((const attention *)self)->p;
    int32_t meta = p->packed_qkv ? 1 : 3; /* index of kv_cache */
    int64_t tokens = in_desc[0].dims.d[0];
    int64_t q_width = (int64_t)p->n_heads * p->head_dim, kv_width = (int64_t)p->n_kv_heads * p->head_dim;
    const kiln_dims *cd = &in_desc[meta].dims;
    int shapes_ok = cd->d[1] == 2 && cd->d[2] == p->n_kv_heads && cd->d[3] == p->block_size && cd->d[4] == p->head_dim;
    if (p->packed_qkv)
        shapes_ok = shapes_ok && in_desc[0].dims.d[1] == q_width + 2 * kv_width;
    else
        shapes_ok = shapes_ok && in_desc[0].dims.d[1] == q_width && in_desc[1].dims.d[0] == tokens &&
                    in_desc[2].dims.d[0] == tokens && in_desc[1].dims.d[1] == kv_width &&
                    in_desc[2].dims.d[1] == kv_width;
    if (!shapes_ok)
        return host->fail(KILN_ERROR_SHAPE, NAME ": q, k, v or kv_cache shapes do not match the plugin's fields");
    int64_t n_seqs = in_desc[meta + 1].dims.d[0];
    if (n_seqs < 1 || in_desc[meta + 2].dims.d[0] != n_seqs || in_desc[meta + 3].dims.d[0] != n_seqs + 1)
        return host->fail(KILN_ERROR_SHAPE,
                          NAME ": block_table, seq_lens and query_start disagree on the number of sequences");
    void *cache = (void *)(uintptr_t)in[meta];
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        if (in_desc[meta].dtype != in_desc[0].dtype && in_desc[meta].dtype != KILN_DTYPE_U8)
            return host->fail(KILN_ERROR_UNSUPPORTED,
                              NAME ": on CUDA the kv_cache must have the dtype of q or be u8 (FP8)");
        size_t es = plugin_float_size(in_desc[0].dtype);
        const char *q = in[0];
        kiln_attention_cuda_args a = {.q = q,
                                      .k = in[1],
                                      .v = in[2],
                                      .q_ld = q_width,
                                      .k_ld = kv_width,
                                      .v_ld = kv_width,
                                      .cache = cache,
                                      .out = out[0],
                                      .table = in[meta + 1],
                                      .seq_lens = in[meta + 2],
                                      .qstart = in[meta + 3],
                                      .workspace = workspace,
                                      .tokens = tokens,
                                      .n_seqs = n_seqs,
                                      .max_blocks = in_desc[meta + 1].dims.d[1],
                                      .n_blocks = cd->d[0],
                                      .n_heads = p->n_heads,
                                      .n_kv_heads = p->n_kv_heads,
                                      .head_dim = p->head_dim,
                                      .block_size = p->block_size,
                                      .scale = p->scale,
                                      .dtype = in_desc[0].dtype,
                                      .cache_dtype = in_desc[meta].dtype};
        if (p->packed_qkv) {
            a.k = q + q_width * es;
            a.v = q + (q_width + kv_width) * es;
            a.q_ld = a.k_ld = a.v_ld = q_width + 2 * kv_width;
        }
        int e = kiln_attention_cuda(&a, stream);
        if (e != 0)
            return host->fail(KILN_ERROR_BACKEND, NAME ": CUDA launch failed: %s", kiln_attention_cuda_error(e));
        return KILN_OK;
    }
#endif
    if (p->packed_qkv) {
        const char *qkv = in[0];
        size_t es = plugin_float_size(in_desc[0].dtype);
        return attention_run((const attention *)self, in_desc[0].dtype, qkv, qkv + q_width * es,
                             qkv + (q_width + kv_width) * es, q_width + 2 * kv_width, q_width + 2 * kv_width, tokens,
                             &in_desc[1], cache, &in_desc[2], in[2], in[3], in[4], out[0], workspace, stream);
    }
    return attention_run((const attention *)self, in_desc[0].dtype, in[0], in[1], in[2], q_width, kv_width, tokens,
                         &in_desc[3], cache, &in_desc[4], in[4], in[5], in[6], out[0], workspace, stream);
}

/* Split partial results of decode steps: the CPU's (attn_plan) and, in
 * a build with CUDA, the CUDA decode's; the larger of the two. */
static size_t attention_workspace_size(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                                       const kiln_tensor_desc *out, int32_t n_out)
{
    const attn_params *p = &((const attention *)self)->p;
    int32_t meta = p->packed_qkv ? 1 : 3;
    if (n_in != meta + 4 || in[0].dims.rank != 2 || in[meta + 1].dims.rank != 2)
        return 0;
    /* A step's chunks number min(ATTN_SPLITS, keys / ATTN_MIN_CHUNK) at
     * most, which the plan of that many keys reaches. */
    int64_t tokens = in[0].dims.d[0], n_sub, sub, n_chunks, span, keys = in[meta + 1].dims.d[1] * p->block_size;
    keys = keys < ATTN_SPLITS * ATTN_MIN_CHUNK ? keys : ATTN_SPLITS * ATTN_MIN_CHUNK;
    int64_t split = tokens < ATTN_SPLIT_TOKENS ? tokens : ATTN_SPLIT_TOKENS;
    size_t cpu = attn_plan(p, split, keys, &n_sub, &sub, &n_chunks, &span) * sizeof(float);
    if (cpu > 0) /* and the chunk counters of a step of decode rows (attn_job.done) */
        cpu += (size_t)split * (size_t)p->n_kv_heads * sizeof(atomic_int);
#ifdef KILN_HAVE_CUDA
    size_t cuda = kiln_attention_cuda_workspace(tokens, in[meta + 1].dims.d[0], in[meta + 1].dims.d[1], p->n_heads,
                                                p->n_kv_heads, p->head_dim, p->block_size);
    return cuda > cpu ? cuda : cpu;
#else
    return cpu;
#endif
}

static kiln_status attention_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    const attention *a = (const attention *)self;
    return plugin_pod_serialize(host, NAME, &a->p, sizeof a->p, buf, size);
}

static kiln_status attention_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return plugin_pod_clone(host, self, sizeof(attention), out);
}

static void attention_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops attention_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = PLUGIN_BUILTIN_BACKENDS,
    .num_outputs = attention_num_outputs,
    .output_shapes = attention_output_shapes,
    .output_dtypes = attention_output_dtypes,
    .supports = attention_supports,
    .workspace_size = attention_workspace_size,
    .enqueue = attention_enqueue,
    .serialize = attention_serialize,
    .clone = attention_clone,
    .destroy = attention_destroy,
};

static kiln_status attention_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    attn_params p = {plugin_field_i32(f, n, "n_heads", 0),  plugin_field_i32(f, n, "n_kv_heads", 0),
                     plugin_field_i32(f, n, "head_dim", 0), plugin_field_i32(f, n, "block_size", 0),
                     plugin_field_f32(f, n, "scale", 0.0f), plugin_field_i32(f, n, "packed_qkv", 0)};
    return attention_new(&p, out);
}

static kiln_status attention_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                         kiln_plugin **out)
{
    attn_params p = {0};
    kiln_status s = plugin_pod_read_blob(host, NAME, BLOB_VERSION, blob_sizes, version, blob, size, &p);
    if (s != KILN_OK)
        return s;
    return attention_new(&p, out);
}

static const float zero_f32 = 0.0f;
static const int32_t zero_i32 = 0;

static const kiln_field_spec attention_fields[] = {
    PLUGIN_FIELD_REQUIRED("n_heads", KILN_FIELD_I32, "query heads"),
    PLUGIN_FIELD_REQUIRED("n_kv_heads", KILN_FIELD_I32, "key/value heads (divides n_heads)"),
    PLUGIN_FIELD_REQUIRED("head_dim", KILN_FIELD_I32, "dims per head"),
    PLUGIN_FIELD_REQUIRED("block_size", KILN_FIELD_I32, "tokens per KV-cache block"),
    PLUGIN_FIELD_OPTIONAL("scale", KILN_FIELD_F32, &zero_f32, "score scale; 0 = 1/sqrt(head_dim)"),
    PLUGIN_FIELD_OPTIONAL("packed_qkv", KILN_FIELD_I32, &zero_i32,
                          "1 = one packed qkv input [T, (n_heads + 2*n_kv_heads)*head_dim] instead of q, k, v"),
};

static const kiln_plugin_creator attention_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = attention_fields,
    .n_fields = (int32_t)(sizeof attention_fields / sizeof attention_fields[0]),
    .blob_version = BLOB_VERSION,
    .create = attention_create,
    .deserialize = attention_deserialize,
    .description = "causal attention over a paged KV cache: prefill and decode, GQA/MQA, packed sequences",
};

kiln_status kiln_attention_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    return h->register_creator(reg, &attention_creator);
}
