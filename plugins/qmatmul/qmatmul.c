/* QuantMatMul (kiln/QuantMatMul/1): y = x · Wᵀ with W kept in a ggml block
 * format, so a decode step reads the quantized bytes (about 4.5-8.5 bits
 * per weight) instead of f32 weights. Each weight is dequantized on the fly
 * exactly as ggml defines the block (and as kiln_ggml_dequantize does).
 *
 * On the CPU each row of x is first quantized to 8-bit blocks of 32 (as
 * ggml's Q8_0/Q8_1 activations: d = max|x| / 127, q = round(x / d)) and
 * each block's products are an integer dot product, scaled once per block
 * and accumulated in f32 (AVX-512 VNNI or AVX2 where the CPU has them,
 * else portable C). This is llama.cpp's arithmetic for these formats; the
 * error it adds is at most d/2 · Σ|w| per block. KILN_QMATMUL_F32ACT=1
 * selects the f32-activation path instead (the weights dequantized and
 * multiplied by x in f32), which the CUDA kernels implement and which the
 * GPU op tests use as their reference.
 *
 * Inputs:  x: f32, f16 or bf16, [..., K].
 *          w: u8, [N, K / 32 * block_bytes]: N rows of ggml blocks, the
 *             bytes of a GGUF tensor with ne = {K, N} as stored.
 * Output:  y: dtype of x, [..., N]. With f16/bf16 the products are still
 *          accumulated in f32 and y is rounded once (the CPU converts up
 *          to QMM_HALF_ROWS rows of x at a time in the workspace and y
 *          back), as a bf16 linear layer does.
 * Fields:  format (string): "Q8_0", "Q4_0" or "Q4_1"; n, k (i32): N and K,
 *          K a multiple of 32.
 * Blob v1: three int32: ggml type number (8, 2, 3), n, k.
 *
 * The CUDA kernels are in qmatmul_cuda.cu.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>

#include "plugin_cuda.h"
#include "plugin_util.h"

#define NAME "QuantMatMul"
#define BLOB_VERSION 1u
#define QK 32 /* elements per block in all three formats */

enum { GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8 };

typedef struct qmm_params {
    int32_t type, n, k;
} qmm_params;

typedef struct qmm {
    kiln_plugin base;
    qmm_params p;
} qmm;

/* One block of 32 quantized activations: x ≈ d · q; ds = d · Σq (for
 * the min term of Q4_1). */
typedef struct q8x {
    float d, ds;
    int8_t q[QK];
} q8x;

static const kiln_host_api *host;
static const kiln_plugin_ops qmm_ops;

static size_t block_bytes(int32_t type) { return type == GGML_Q8_0 ? 34 : type == GGML_Q4_0 ? 18 : 20; }

static kiln_status qmm_new(const qmm_params *p, kiln_plugin **out)
{
    if (p->type != GGML_Q8_0 && p->type != GGML_Q4_0 && p->type != GGML_Q4_1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": ggml type %d is not Q8_0, Q4_0 or Q4_1", p->type);
    if (p->n <= 0 || p->k <= 0 || p->k % QK != 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": n = %d and k = %d must be positive, k a multiple of %d",
                          p->n, p->k, QK);
    qmm *q = calloc(1, sizeof *q);
    if (!q)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    q->base.struct_size = sizeof q->base;
    q->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    q->base.ops = &qmm_ops;
    q->p = *p;
    *out = &q->base;
    return KILN_OK;
}

static int32_t qmm_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status qmm_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                     kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    const qmm_params *p = &((const qmm *)self)->p;
    if (n_in != 2 || in[0].rank < 1 || in[1].rank != 2)
        return host->fail(KILN_ERROR_SHAPE, NAME ": expects x [..., K] and w [N, row bytes]");
    int64_t v, row = (int64_t)p->k / QK * (int64_t)block_bytes(p->type);
    if (host->expr_is_constant(eb, in[0].d[in[0].rank - 1], &v) && v != p->k)
        return host->fail(KILN_ERROR_SHAPE, NAME ": x has %lld columns, k is %d", (long long)v, p->k);
    if (host->expr_is_constant(eb, in[1].d[0], &v) && v != p->n)
        return host->fail(KILN_ERROR_SHAPE, NAME ": w has %lld rows, n is %d", (long long)v, p->n);
    if (host->expr_is_constant(eb, in[1].d[1], &v) && v != row)
        return host->fail(KILN_ERROR_SHAPE, NAME ": w rows are %lld bytes, %d values of this format take %lld",
                          (long long)v, p->k, (long long)row);
    out[0] = in[0];
    out[0].d[in[0].rank - 1] = host->expr_constant(eb, p->n);
    return KILN_OK;
}

static kiln_status qmm_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                     int32_t n_out)
{
    out[0] = in[0];
    return KILN_OK;
}

static int32_t qmm_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                            int32_t n_out)
{
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    backend_ok = backend_ok || backend == KILN_BACKEND_CUDA;
#endif
    return backend_ok && n_in == 2 && n_out == 1 && plugin_is_float(d[0].dtype) && d[1].dtype == KILN_DTYPE_U8 &&
           d[2].dtype == d[0].dtype;
}

/* f16/bf16 on the CPU: x and y converted through f32 copies of this many
 * rows at a time, which keeps the workspace small (the builder reserves it
 * whatever the backend) while a chunk still shares each dequantized weight
 * chunk among many rows. */
#define QMM_HALF_ROWS 16
/* Rows of f32 x quantized at a time: the workspace holds their blocks. */
#define QMM_Q8_ROWS 64

static size_t qmm_workspace_size(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                                 const kiln_tensor_desc *out, int32_t n_out)
{
    const qmm_params *p = &((const qmm *)self)->p;
    int64_t rows = plugin_desc_count(&in[0]) / p->k;
    /* f32: QMM_Q8_ROWS rows of quantized x. f16/bf16: QMM_HALF_ROWS rows of
     * f32 x and y, which also hold that many rows of quantized x (5 bytes
     * per 4 values) and their f32 y. */
    if (in[0].dtype == KILN_DTYPE_F32)
        return (size_t)(rows < QMM_Q8_ROWS ? rows : QMM_Q8_ROWS) * (size_t)(p->k / QK) * sizeof(q8x);
    return (size_t)(rows < QMM_HALF_ROWS ? rows : QMM_HALF_ROWS) * ((size_t)p->k + (size_t)p->n) * sizeof(float);
}

/* One block: 32 weights, dequantized with ggml's formulas (the same
 * float operations as kiln_ggml_dequantize, so w is bit-identical). */
static void dequant_block(int32_t type, const uint8_t *b, float *w)
{
    float d = host->half_to_float((uint16_t)(b[0] | b[1] << 8));
    if (type == GGML_Q8_0) {
        for (int j = 0; j < 32; j++)
            w[j] = d * (float)(int8_t)b[2 + j];
    } else if (type == GGML_Q4_0) {
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)((b[2 + j] & 0x0F) - 8);
            w[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    } else {
        float m = host->half_to_float((uint16_t)(b[2] | b[3] << 8));
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)(b[4 + j] & 0x0F) + m;
            w[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
    }
}

/* Dot product of one row of blocks with x, in order (the reference). */
static float dot_scalar(int32_t type, const uint8_t *row, size_t bb, const float *x, int32_t nb)
{
    float acc = 0, w[QK];
    for (int32_t i = 0; i < nb; i++, row += bb, x += QK) {
        dequant_block(type, row, w);
        for (int j = 0; j < QK; j++)
            acc += w[j] * x[j];
    }
    return acc;
}

/* f32 dot of n values, in order. */
static float dotf_scalar(const float *a, const float *b, int32_t n)
{
    float acc = 0;
    for (int32_t i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

/* ggml's Q8 activation formula, in portable C (the kernels share it). */
static void quantize_block(const float *x, q8x *b)
{
    float amax = 0;
    for (int j = 0; j < QK; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < QK; j++) {
        b->q[j] = (int8_t)roundf(x[j] * id);
        sum += b->q[j];
    }
    b->d = d;
    b->ds = d * (float)sum;
}

/* One row of blocks dotted with quantized x (the reference): an exact
 * integer sum per block, then dw · dx · sum (+ m · dx · Σq) in f32. */
static float qdot_scalar(int32_t type, const uint8_t *row, size_t bb, const q8x *x, int32_t nb)
{
    float acc = 0;
    for (int32_t i = 0; i < nb; i++, row += bb, x++) {
        float dw = host->half_to_float((uint16_t)(row[0] | row[1] << 8));
        int32_t s = 0;
        if (type == GGML_Q8_0) {
            for (int j = 0; j < QK; j++)
                s += (int8_t)row[2 + j] * x->q[j];
        } else {
            const uint8_t *qs = row + (type == GGML_Q4_1 ? 4 : 2);
            int32_t off = type == GGML_Q4_0 ? 8 : 0;
            for (int j = 0; j < 16; j++)
                s += ((qs[j] & 0x0F) - off) * x->q[j] + ((qs[j] >> 4) - off) * x->q[j + 16];
        }
        acc += dw * x->d * (float)s;
        if (type == GGML_Q4_1)
            acc += host->half_to_float((uint16_t)(row[2] | row[3] << 8)) * x->ds;
    }
    return acc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define QMM_AVX2 1

/* 8 quantized values (int32 lanes) times d (+ m): a multiply then an add,
 * never an FMA, so each weight rounds as in the scalar formula. */
__attribute__((target("avx2,fma,f16c"))) static inline __m256 deq8(__m256i q, __m256 d, __m256 m, int has_min)
{
    __m256 w = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
    return has_min ? _mm256_add_ps(w, m) : w;
}

__attribute__((target("avx2,fma,f16c"))) static float dot_avx2(int32_t type, const uint8_t *row, size_t bb,
                                                               const float *x, int32_t nb)
{
    /* four accumulators: one FMA chain per block each, not two */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps();
    const int has_min = type == GGML_Q4_1;
    for (int32_t i = 0; i < nb; i++, row += bb, x += QK) {
        /* Rows lie back to back, so this runs ahead into the next ones;
         * without it a thread streams weights at a fraction of the read
         * bandwidth here (measured: 1.9 vs 4+ GB/s). Past the last row it
         * only touches addresses it never reads, which cannot fault. */
        _mm_prefetch((const char *)row + 1024, _MM_HINT_T0);
        /* d and m by F16C (exact, like any f16 -> f32): a call through the
         * host table here would spill every ymm register per block */
        __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(
            (int)((uint32_t)row[0] | (uint32_t)row[1] << 8 | (uint32_t)row[2] << 16 | (uint32_t)row[3] << 24)));
        __m256 d = _mm256_broadcastss_ps(dm);
        __m256 m = _mm256_broadcastss_ps(_mm_shuffle_ps(dm, dm, 1));
        __m256i q[4];
        if (type == GGML_Q8_0) {
            for (int j = 0; j < 4; j++)
                q[j] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + 2 + 8 * j)));
        } else {
            __m128i bytes = _mm_loadu_si128((const __m128i *)(row + (has_min ? 4 : 2)));
            __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
            __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
            q[0] = _mm256_cvtepu8_epi32(lo);
            q[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8));
            q[2] = _mm256_cvtepu8_epi32(hi);
            q[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8));
            if (!has_min)
                for (int j = 0; j < 4; j++)
                    q[j] = _mm256_sub_epi32(q[j], _mm256_set1_epi32(8));
        }
        acc0 = _mm256_fmadd_ps(deq8(q[0], d, m, has_min), _mm256_loadu_ps(x), acc0);
        acc1 = _mm256_fmadd_ps(deq8(q[1], d, m, has_min), _mm256_loadu_ps(x + 8), acc1);
        acc2 = _mm256_fmadd_ps(deq8(q[2], d, m, has_min), _mm256_loadu_ps(x + 16), acc2);
        acc3 = _mm256_fmadd_ps(deq8(q[3], d, m, has_min), _mm256_loadu_ps(x + 24), acc3);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* n is a multiple of 32. */
__attribute__((target("avx2,fma,f16c"))) static float dotf_avx2(const float *a, const float *b, int32_t n)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps();
    for (int32_t i = 0; i < n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* The 32 weights of one block as bytes in x's order, and x's 32 bytes
 * with the weights' signs moved onto them: |w| (u8) · sign(w)·q (s8) is
 * w · q whichever integer instruction multiplies them. Q4_0's -8 is taken
 * off first so that all three formats go through the same signed product;
 * Q4_1's weights stay unsigned (0..15) and need no sign. */
__attribute__((target("avx2,fma,f16c"))) static inline __m256i weight_bytes(int32_t type, const uint8_t *row)
{
    if (type == GGML_Q8_0)
        return _mm256_loadu_si256((const __m256i *)(row + 2));
    __m128i bytes = _mm_loadu_si128((const __m128i *)(row + (type == GGML_Q4_1 ? 4 : 2)));
    __m256i w = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
    w = _mm256_and_si256(w, _mm256_set1_epi8(0x0F));
    return type == GGML_Q4_0 ? _mm256_sub_epi8(w, _mm256_set1_epi8(8)) : w;
}

__attribute__((target("avx2,fma,f16c"))) static inline float hsum8(__m256 s)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* The dot loop of one ISA and one format (TYPE a constant, so each
 * kernel has no format branches); PRODUCT turns (|w| or w as u8, x as s8)
 * into 8 int32 partial sums of a block. maddubs adds pairs into int16
 * without overflow here: |w| <= 128 and |q| <= 127. Two blocks per
 * iteration on two accumulators. */
#define QDOT_BLOCK(TYPE, PRODUCT, ACC, R, X) \
    do { \
        __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128( \
            (int)((uint32_t)(R)[0] | (uint32_t)(R)[1] << 8 | (uint32_t)(R)[2] << 16 | (uint32_t)(R)[3] << 24))); \
        __m256i w = weight_bytes(TYPE, R), q = _mm256_loadu_si256((const __m256i *)(X)->q); \
        __m256i u = TYPE == GGML_Q4_1 ? w : _mm256_sign_epi8(w, w); \
        __m256i v = TYPE == GGML_Q4_1 ? q : _mm256_sign_epi8(q, w); \
        ACC = _mm256_fmadd_ps(_mm256_cvtepi32_ps(PRODUCT), _mm256_set1_ps(_mm_cvtss_f32(dm) * (X)->d), ACC); \
        if (TYPE == GGML_Q4_1) \
            accm += _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)) * (X)->ds; \
    } while (0)

#define QDOT_FN(NAME, TARGET, TYPE, PRODUCT) \
    __attribute__((target(TARGET))) static float NAME(int32_t type, const uint8_t *row, size_t bb, const q8x *x, \
                                                      int32_t nb) \
    { \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(); \
        float accm = 0; \
        int32_t i = 0; \
        for (; i + 1 < nb; i += 2, row += 2 * bb, x += 2) { \
            _mm_prefetch((const char *)row + 1024, _MM_HINT_T0); \
            QDOT_BLOCK(TYPE, PRODUCT, acc0, row, x); \
            QDOT_BLOCK(TYPE, PRODUCT, acc1, row + bb, x + 1); \
        } \
        if (i < nb) \
            QDOT_BLOCK(TYPE, PRODUCT, acc0, row, x); \
        return hsum8(_mm256_add_ps(acc0, acc1)) + accm; \
    }

/* Four rows of x against one weight row (prefill): each block's weights
 * are unpacked once for the four. The rows of x are nb blocks apart. */
#define QDOT4_FN(NAME, TARGET, TYPE, PRODUCT) \
    __attribute__((target(TARGET))) static void NAME(const uint8_t *row, size_t bb, const q8x *x, int32_t nb, \
                                                     float *out) \
    { \
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()}; \
        float accm[4] = {0, 0, 0, 0}; \
        for (int32_t i = 0; i < nb; i++, row += bb) { \
            __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128( \
                (int)((uint32_t)row[0] | (uint32_t)row[1] << 8 | (uint32_t)row[2] << 16 | (uint32_t)row[3] << 24))); \
            float dw = _mm_cvtss_f32(dm), mw = _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)); \
            __m256i w = weight_bytes(TYPE, row); \
            __m256i u = TYPE == GGML_Q4_1 ? w : _mm256_sign_epi8(w, w); \
            for (int r = 0; r < 4; r++) { \
                const q8x *xr = x + (int64_t)r * nb + i; \
                __m256i q = _mm256_loadu_si256((const __m256i *)xr->q); \
                __m256i v = TYPE == GGML_Q4_1 ? q : _mm256_sign_epi8(q, w); \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(PRODUCT), _mm256_set1_ps(dw * xr->d), acc[r]); \
                if (TYPE == GGML_Q4_1) \
                    accm[r] += mw * xr->ds; \
            } \
        } \
        for (int r = 0; r < 4; r++) \
            out[r] = hsum8(acc[r]) + accm[r]; \
    }

#define AVX2_TARGET "avx2,fma,f16c"
#define AVX2_PRODUCT _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1))
/* VNNI: one instruction for the u8 · s8 products summed by fours. */
#define VNNI_TARGET "avx2,fma,f16c,avx512f,avx512vl,avx512vnni"
#define VNNI_PRODUCT _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, v)
QDOT_FN(qdot_avx2_q8_0, AVX2_TARGET, GGML_Q8_0, AVX2_PRODUCT)
QDOT_FN(qdot_avx2_q4_0, AVX2_TARGET, GGML_Q4_0, AVX2_PRODUCT)
QDOT_FN(qdot_avx2_q4_1, AVX2_TARGET, GGML_Q4_1, AVX2_PRODUCT)
QDOT_FN(qdot_vnni_q8_0, VNNI_TARGET, GGML_Q8_0, VNNI_PRODUCT)
QDOT_FN(qdot_vnni_q4_0, VNNI_TARGET, GGML_Q4_0, VNNI_PRODUCT)
QDOT_FN(qdot_vnni_q4_1, VNNI_TARGET, GGML_Q4_1, VNNI_PRODUCT)
QDOT4_FN(qdot4_avx2_q8_0, AVX2_TARGET, GGML_Q8_0, AVX2_PRODUCT)
QDOT4_FN(qdot4_avx2_q4_0, AVX2_TARGET, GGML_Q4_0, AVX2_PRODUCT)
QDOT4_FN(qdot4_avx2_q4_1, AVX2_TARGET, GGML_Q4_1, AVX2_PRODUCT)
QDOT4_FN(qdot4_vnni_q8_0, VNNI_TARGET, GGML_Q8_0, VNNI_PRODUCT)
QDOT4_FN(qdot4_vnni_q4_0, VNNI_TARGET, GGML_Q4_0, VNNI_PRODUCT)
QDOT4_FN(qdot4_vnni_q4_1, VNNI_TARGET, GGML_Q4_1, VNNI_PRODUCT)
#undef QDOT4_FN
#undef QDOT_FN
#undef QDOT_BLOCK
#endif

typedef float (*dot_fn)(int32_t, const uint8_t *, size_t, const float *, int32_t);
typedef float (*dotf_fn)(const float *, const float *, int32_t);
typedef float (*qdot_fn)(int32_t, const uint8_t *, size_t, const q8x *, int32_t);
typedef void (*qdot4_fn)(const uint8_t *, size_t, const q8x *, int32_t, float *);

typedef struct qmm_job {
    int32_t type, nb;
    size_t bb;
    int64_t rows, k, n;
    const float *x;
    const q8x *xq;
    const uint8_t *w;
    float *y;
    dot_fn dot;
    dotf_fn dotf;
    qdot_fn qdot;
    qdot4_fn qdot4; /* NULL: rows one at a time */
} qmm_job;

/* From this many rows of x on (prefill), a chunk of a weight row is
 * dequantized once into f32 and reused by every row, instead of being
 * dequantized again per row. */
#define QMM_BATCH_ROWS 4
#define QMM_CHUNK_BLOCKS 8

/* Output columns [begin, end): each weight row is read once and stays in
 * L1 while every row of x passes over it. */
static void qmm_range(void *arg, int64_t begin, int64_t end)
{
    const qmm_job *j = arg;
    float w[QMM_CHUNK_BLOCKS * QK];
    for (int64_t c = begin; c < end; c++) {
        const uint8_t *wr = j->w + (size_t)c * (size_t)j->nb * j->bb;
        if (j->rows < QMM_BATCH_ROWS) {
            for (int64_t r = 0; r < j->rows; r++)
                j->y[r * j->n + c] = j->dot(j->type, wr, j->bb, j->x + r * j->k, j->nb);
            continue;
        }
        for (int64_t r = 0; r < j->rows; r++)
            j->y[r * j->n + c] = 0;
        for (int32_t b0 = 0; b0 < j->nb; b0 += QMM_CHUNK_BLOCKS) {
            int32_t nbk = j->nb - b0 < QMM_CHUNK_BLOCKS ? j->nb - b0 : QMM_CHUNK_BLOCKS;
            for (int32_t i = 0; i < nbk; i++)
                dequant_block(j->type, wr + (size_t)(b0 + i) * j->bb, w + i * QK);
            for (int64_t r = 0; r < j->rows; r++)
                j->y[r * j->n + c] += j->dotf(w, j->x + r * j->k + (int64_t)b0 * QK, nbk * QK);
        }
    }
}

/* Output columns [begin, end) over quantized x: the weight row stays in L1
 * while every row of x passes over it. */
static void qmm_range_q8(void *arg, int64_t begin, int64_t end)
{
    const qmm_job *j = arg;
    for (int64_t c = begin; c < end; c++) {
        const uint8_t *wr = j->w + (size_t)c * (size_t)j->nb * j->bb;
        int64_t r = 0;
        float y4[4];
        for (; j->qdot4 && r + 4 <= j->rows; r += 4) {
            j->qdot4(wr, j->bb, j->xq + r * j->nb, j->nb, y4);
            for (int i = 0; i < 4; i++)
                j->y[(r + i) * j->n + c] = y4[i];
        }
        for (; r < j->rows; r++)
            j->y[r * j->n + c] = j->qdot(j->type, wr, j->bb, j->xq + r * j->nb, j->nb);
    }
}

/* KILN_QMATMUL_ISA picks the kernels: "c" the portable reference, "avx2"
 * AVX2 without VNNI, anything else the best the CPU has (tests check
 * each). F16C through cpuid leaf 1 (ECX bit 29): clang's
 * __builtin_cpu_supports does not know it. */
static const char *isa(void)
{
    const char *e = getenv("KILN_QMATMUL_ISA");
    return e ? e : "";
}

static int use_f32_activations(void)
{
    const char *e = getenv("KILN_QMATMUL_F32ACT");
    return e && e[0] == '1';
}

#ifdef QMM_AVX2
/* What the CPU has, asked once (cpuid traps to the hypervisor in a VM):
 * bit 0 AVX2+FMA+F16C, bit 1 AVX-512 VL+VNNI. */
static int cpu_features(void)
{
    static _Atomic int cached = -1;
    int f = cached;
    if (f < 0) {
        unsigned a, b, c, d;
        int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
                   (c >> 29 & 1);
        f = avx2 | (avx2 && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) << 1;
        cached = f;
    }
    return f;
}

static int use_avx2(void) { return strcmp(isa(), "c") != 0 && (cpu_features() & 1); }

static int use_vnni(void) { return use_avx2() && strcmp(isa(), "avx2") != 0 && (cpu_features() & 2); }
#endif

static kiln_status qmm_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                               const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc, void *const *out,
                               int32_t n_out, void *workspace, void *stream)
{
    const qmm_params *p = &((const qmm *)self)->p;
    const kiln_dims *xd = &in_desc[0].dims, *wd = &in_desc[1].dims;
    int64_t nb = p->k / QK, bb = (int64_t)block_bytes(p->type);
    if (xd->rank < 1 || xd->d[xd->rank - 1] != p->k || wd->rank != 2 || wd->d[0] != p->n || wd->d[1] != nb * bb)
        return host->fail(KILN_ERROR_SHAPE, NAME ": x's last dim must be k = %d and w [%d, %lld]", p->k, p->n,
                          (long long)(nb * bb));
    kiln_dtype t = in_desc[0].dtype;
    int64_t rows = plugin_desc_count(&in_desc[0]) / p->k;
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        int e = rows > 0 ? kiln_qmatmul_cuda(p->type, in[0], in[1], out[0], (int32_t)t, rows, p->n, p->k, stream) : 0;
        return e ? host->fail(KILN_ERROR_BACKEND, NAME ": kernel launch failed (cuda error %d)", e) : KILN_OK;
    }
#endif
    qmm_job job = {p->type, (int32_t)nb, (size_t)bb, rows,       p->k,        p->n,        in[0],
                   NULL,    in[1],       out[0],     dot_scalar, dotf_scalar, qdot_scalar, NULL};
#ifdef QMM_AVX2
    if (use_avx2()) {
        job.dot = dot_avx2;
        job.dotf = dotf_avx2;
        int vnni = use_vnni();
        job.qdot = p->type == GGML_Q8_0   ? (vnni ? qdot_vnni_q8_0 : qdot_avx2_q8_0)
                   : p->type == GGML_Q4_0 ? (vnni ? qdot_vnni_q4_0 : qdot_avx2_q4_0)
                                          : (vnni ? qdot_vnni_q4_1 : qdot_avx2_q4_1);
        job.qdot4 = p->type == GGML_Q8_0   ? (vnni ? qdot4_vnni_q8_0 : qdot4_avx2_q8_0)
                    : p->type == GGML_Q4_0 ? (vnni ? qdot4_vnni_q4_0 : qdot4_avx2_q4_0)
                                           : (vnni ? qdot4_vnni_q4_1 : qdot4_avx2_q4_1);
    }
#endif
    if (rows == 0)
        return KILN_OK;
    if (!use_f32_activations()) {
        if (!workspace)
            return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": no workspace for the quantized activations");
        int64_t chunk = t == KILN_DTYPE_F32 ? QMM_Q8_ROWS : QMM_HALF_ROWS;
        q8x *xq = workspace;
        float tmp[QK];
        for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
            int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
            for (int64_t b = 0; b < nr * nb; b++) {
                const float *src = (const float *)in[0] + r0 * p->k + b * QK;
                if (t != KILN_DTYPE_F32) {
                    for (int j = 0; j < QK; j++)
                        tmp[j] = plugin_load(host, in[0], t, r0 * p->k + b * QK + j);
                    src = tmp;
                }
                quantize_block(src, xq + b);
            }
            job.rows = nr, job.xq = xq;
            job.y = t == KILN_DTYPE_F32 ? (float *)out[0] + r0 * p->n : (float *)(xq + nr * nb);
            host->parallel_for(stream, p->n, qmm_range_q8, &job);
            if (t != KILN_DTYPE_F32)
                for (int64_t i = 0; i < nr * p->n; i++)
                    plugin_store(host, out[0], t, r0 * p->n + i, job.y[i]);
        }
        return KILN_OK;
    }
    if (t == KILN_DTYPE_F32) {
        host->parallel_for(stream, p->n, qmm_range, &job);
        return KILN_OK;
    }
    float *xf = workspace;
    for (int64_t r0 = 0; r0 < rows; r0 += QMM_HALF_ROWS) {
        int64_t nr = rows - r0 < QMM_HALF_ROWS ? rows - r0 : QMM_HALF_ROWS;
        for (int64_t i = 0; i < nr * p->k; i++)
            xf[i] = plugin_load(host, in[0], t, r0 * p->k + i);
        job.rows = nr, job.x = xf, job.y = xf + nr * p->k;
        host->parallel_for(stream, p->n, qmm_range, &job);
        for (int64_t i = 0; i < nr * p->n; i++)
            plugin_store(host, out[0], t, r0 * p->n + i, job.y[i]);
    }
    return KILN_OK;
}

static kiln_status qmm_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    return plugin_pod_serialize(host, NAME, &((const qmm *)self)->p, sizeof(qmm_params), buf, size);
}

static kiln_status qmm_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return plugin_pod_clone(host, self, sizeof(qmm), out);
}

static void qmm_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops qmm_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = PLUGIN_BUILTIN_BACKENDS,
    .num_outputs = qmm_num_outputs,
    .output_shapes = qmm_output_shapes,
    .output_dtypes = qmm_output_dtypes,
    .supports = qmm_supports,
    .workspace_size = qmm_workspace_size,
    .enqueue = qmm_enqueue,
    .serialize = qmm_serialize,
    .clone = qmm_clone,
    .destroy = qmm_destroy,
};

static kiln_status qmm_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    const kiln_field *fmt = plugin_field(f, n, "format");
    const char *s = fmt ? fmt->data : "";
    qmm_params p = {strcmp(s, "Q8_0") == 0   ? GGML_Q8_0
                    : strcmp(s, "Q4_0") == 0 ? GGML_Q4_0
                    : strcmp(s, "Q4_1") == 0 ? GGML_Q4_1
                                             : -1,
                    plugin_field_i32(f, n, "n", 0), plugin_field_i32(f, n, "k", 0)};
    if (p.type < 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": format \"%s\" is not Q8_0, Q4_0 or Q4_1", s);
    return qmm_new(&p, out);
}

static kiln_status qmm_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                   kiln_plugin **out)
{
    kiln_status s = plugin_pod_check_blob(host, NAME, BLOB_VERSION, version, size, sizeof(qmm_params));
    if (s != KILN_OK)
        return s;
    qmm_params p;
    memcpy(&p, blob, sizeof p);
    return qmm_new(&p, out);
}

static const kiln_field_spec qmm_fields[] = {
    PLUGIN_FIELD_REQUIRED("format", KILN_FIELD_STRING, "ggml block format of w: Q8_0, Q4_0 or Q4_1"),
    PLUGIN_FIELD_REQUIRED("n", KILN_FIELD_I32, "output features (rows of w)"),
    PLUGIN_FIELD_REQUIRED("k", KILN_FIELD_I32, "input features, a multiple of 32"),
};

static const kiln_plugin_creator qmm_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = qmm_fields,
    .n_fields = sizeof qmm_fields / sizeof qmm_fields[0],
    .blob_version = BLOB_VERSION,
    .create = qmm_create,
    .deserialize = qmm_deserialize,
    .description = "x · Wᵀ with W in a ggml block format (Q8_0, Q4_0, Q4_1), dequantized on the fly",
};

kiln_status kiln_qmatmul_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    return h->register_creator(reg, &qmm_creator);
}
