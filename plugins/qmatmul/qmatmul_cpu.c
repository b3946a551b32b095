/* QuantMatMul's CPU kernels. Every kernel computes one weight row against
 * one or four rows of x; the four-row kernels unpack each weight block
 * once for the four (prefill).
 *
 * 8-bit activations (the default for the quantized formats): each block's
 * products are an exact integer sum, scaled once per block in f32:
 *  - 32-element formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) against 32-value
 *    activation blocks: Σ w·x ≈ dw · dx · Σ q·qx (+ m · dx · Σ qx);
 *  - K formats against 256-value blocks: the sub-block scales multiply the
 *    integer sums in integer arithmetic, so the super-block needs one f32
 *    scaling: (d · dx) · Σ sc · Σ q·qx - (dmin · dx) · Σ m · Σ qx (Q4_K,
 *    Q5_K), (d · dx) · Σ sc · Σ (q - 32)·qx (Q6_K).
 * This is llama.cpp's arithmetic for these formats. The portable C kernels
 * are the reference the AVX2 / VNNI ones are tested against.
 *
 * f32 activations (F16, BF16, or KILN_QMATMUL_F32ACT=1): weights decoded
 * to f32 (core/ggml_block.h, bit-identical to the GGUF reader's
 * dequantization; F16/BF16 converted in registers) and multiplied in f32. */
#include "qmatmul/qmatmul_cpu.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/ggml_block.h"

static const qmm_format formats[] = {
    {QMM_Q8_0, "Q8_0", 32, 34, 32},    {QMM_Q4_0, "Q4_0", 32, 18, 32},    {QMM_Q4_1, "Q4_1", 32, 20, 32},
    {QMM_Q5_0, "Q5_0", 32, 22, 32},    {QMM_Q5_1, "Q5_1", 32, 24, 32},    {QMM_Q4_K, "Q4_K", 256, 144, 256},
    {QMM_Q5_K, "Q5_K", 256, 176, 256}, {QMM_Q6_K, "Q6_K", 256, 210, 256}, {QMM_F16, "F16", 32, 64, 0},
    {QMM_BF16, "BF16", 32, 64, 0},
};
#define N_FORMATS (sizeof formats / sizeof formats[0])

const qmm_format *kiln_qmm_format(int32_t type)
{
    for (size_t i = 0; i < N_FORMATS; i++)
        if (formats[i].type == type)
            return &formats[i];
    return NULL;
}

const qmm_format *kiln_qmm_format_named(const char *name)
{
    for (size_t i = 0; i < N_FORMATS; i++)
        if (strcmp(formats[i].name, name) == 0)
            return &formats[i];
    return NULL;
}

/* ---- activations -------------------------------------------------------------------- */

size_t kiln_qmm_act_row_bytes(const qmm_format *f, int32_t k)
{
    if (f->act_block == 32)
        return (size_t)(k / 32) * sizeof(qmm_q8);
    if (f->act_block == 256)
        return (size_t)(k / 256) * sizeof(qmm_q8k);
    return 0;
}

/* n values at d = max|x| / 127, q = round(x / d) (halves away from
 * zero); returns d. The portable reference of the AVX-512 quantizer. */
static float quantize_values(const float *x, int32_t n, int8_t *q)
{
    float amax = 0;
    for (int j = 0; j < n; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < n; j++)
        q[j] = (int8_t)roundf(x[j] * id);
    return d;
}

void kiln_qmm_quantize_row(const qmm_format *f, qmm_quant_fn quant, const float *x, int32_t k, void *out)
{
    if (f->act_block == 32) {
        qmm_q8 *b = out;
        for (int32_t i = 0; i < k / 32; i++, b++, x += 32) {
            b->d = quant(x, 32, b->q);
            int32_t sum = 0;
            for (int j = 0; j < 32; j++)
                sum += b->q[j];
            b->ds = b->d * (float)sum;
        }
    } else {
        qmm_q8k *b = out;
        for (int32_t i = 0; i < k / 256; i++, b++, x += 256) {
            b->d = quant(x, 256, b->q);
            for (int g = 0; g < 16; g++) {
                int32_t sum = 0;
                for (int j = 0; j < 16; j++)
                    sum += b->q[16 * g + j];
                b->bsums[g] = (int16_t)sum;
            }
        }
    }
}

/* ---- the GEMM layout of x (qmatmul_cpu.h) ------------------------------------------ */

int32_t kiln_qmm_gemm_sub(const qmm_format *f) { return f->type == QMM_Q6_K ? 16 : 32; }

size_t kiln_qmm_gemm_panel_bytes(const qmm_format *f, int32_t k)
{
    return QMM_GEMM_PANEL * ((size_t)k + 2 * sizeof(float) * (size_t)(k / kiln_qmm_gemm_sub(f)));
}

void kiln_qmm_gemm_quantize_row(const qmm_format *f, qmm_quant_fn quant, const float *x, int32_t k, void *panel,
                                int32_t slot)
{
    const int32_t sub = kiln_qmm_gemm_sub(f), nsub = k / sub, P = QMM_GEMM_PANEL;
    uint8_t *q = panel;
    float *xd = (float *)(q + (size_t)P * (size_t)k), *xsum = xd + (size_t)P * (size_t)nsub;
    int8_t qb[256];
    for (int32_t b = 0; b < k; b += f->act_block) {
        float d = 0;
        if (x)
            d = quant(x + b, f->act_block, qb);
        else
            memset(qb, 0, sizeof qb);
        for (int32_t e = 0; e < f->act_block; e += 4)
            memcpy(q + ((size_t)(b + e) / 4 * P + (size_t)slot) * 4, qb + e, 4);
        for (int32_t j = 0; j < f->act_block / sub; j++) {
            int32_t sum = 0;
            for (int e = 0; e < sub; e++)
                sum += qb[j * sub + e];
            xd[(size_t)(b / sub + j) * P + (size_t)slot] = d;
            xsum[(size_t)(b / sub + j) * P + (size_t)slot] = d * (float)sum;
        }
    }
}

/* ---- the row-panel layout (qmatmul_cpu.h) ---------------------------------------- */

/* A block's fields in the order a panel's block column holds them: `size`
 * bytes at `at` in the stored block, interleaved `unit` bytes a row. */
typedef struct panel_field {
    int16_t at, size, unit;
} panel_field;

typedef struct panel_layout {
    int32_t type, n_fields;
    panel_field fields[4];
} panel_layout;

static const panel_layout panel_layouts[] = {
    {QMM_Q8_0, 2, {{2, 32, 4}, {0, 2, 2}}},
    {QMM_Q4_0, 2, {{2, 16, 4}, {0, 2, 2}}},
    {QMM_Q4_1, 3, {{4, 16, 4}, {0, 2, 2}, {2, 2, 2}}},
    /* quants, the twelve bytes of 6-bit scales and mins, d, dmin */
    {QMM_Q4_K, 4, {{16, 128, 4}, {4, 12, 4}, {0, 2, 2}, {2, 2, 2}}},
    /* low 4 bits, high 2 bits, the sixteen int8 scales, d */
    {QMM_Q6_K, 4, {{0, 128, 4}, {128, 64, 4}, {192, 16, 4}, {208, 2, 2}}},
};

static const panel_layout *panel_layout_of(int32_t type)
{
    for (size_t i = 0; i < sizeof panel_layouts / sizeof panel_layouts[0]; i++)
        if (panel_layouts[i].type == type)
            return &panel_layouts[i];
    return NULL;
}

int kiln_qmm_panel_format(const qmm_format *f) { return panel_layout_of(f->type) != NULL; }

/* Block `lane` of a block column, as stored, into block. */
static void panel_get(const panel_layout *l, const uint8_t *column, int lane, uint8_t *block)
{
    for (int i = 0; i < l->n_fields; i++) {
        const panel_field *fl = &l->fields[i];
        for (int v = 0; v < fl->size / fl->unit; v++, column += QMM_PANEL_ROWS * fl->unit)
            memcpy(block + fl->at + fl->unit * v, column + fl->unit * lane, (size_t)fl->unit);
    }
}

/* The stored block into its lane of a block column. */
static void panel_put(const panel_layout *l, uint8_t *column, int lane, const uint8_t *block)
{
    for (int i = 0; i < l->n_fields; i++) {
        const panel_field *fl = &l->fields[i];
        for (int v = 0; v < fl->size / fl->unit; v++, column += QMM_PANEL_ROWS * fl->unit)
            memcpy(column + fl->unit * lane, block + fl->at + fl->unit * v, (size_t)fl->unit);
    }
}

void kiln_qmm_panel_block(const qmm_format *f, const uint8_t *w, size_t wrow, int64_t r, int32_t b, uint8_t *out)
{
    const int64_t lane = r % QMM_PANEL_ROWS;
    const uint8_t *c = w + (size_t)(r - lane) * wrow + (size_t)b * QMM_PANEL_ROWS * (size_t)f->bytes;
    panel_get(panel_layout_of(f->type), c, (int)lane, out);
}

void kiln_qmm_panel_rows(const qmm_format *f, const uint8_t *w, size_t wrow, int64_t r0, int64_t count, uint8_t *out)
{
    const int32_t nb = (int32_t)(wrow / (size_t)f->bytes);
    for (int64_t r = r0; r < r0 + count; r++)
        for (int32_t b = 0; b < nb; b++, out += f->bytes)
            kiln_qmm_panel_block(f, w, wrow, r, b, out);
}

void kiln_qmm_panel_pack(const qmm_format *f, const uint8_t *w, int64_t n, int32_t k, uint8_t *out)
{
    const panel_layout *l = panel_layout_of(f->type);
    const int32_t nb = k / f->block;
    const size_t wrow = (size_t)nb * (size_t)f->bytes;
    for (int64_t p = 0; p < n; p += QMM_PANEL_ROWS)
        for (int32_t b = 0; b < nb; b++)
            for (int r = 0; r < QMM_PANEL_ROWS; r++)
                panel_put(l, out + (size_t)p * wrow + (size_t)b * QMM_PANEL_ROWS * (size_t)f->bytes, r,
                          w + (size_t)(p + r) * wrow + (size_t)b * (size_t)f->bytes);
}

/* ---- portable C: the reference ---------------------------------------------------- */

/* Weight j of a 32-element block as an integer q with w = d·q + c. */
static int q32_value(int32_t type, const uint8_t *b, int j)
{
    switch (type) {
    case QMM_Q8_0: return (int8_t)b[2 + j];
    case QMM_Q4_0: return (j < 16 ? b[2 + j] & 0x0F : b[2 + j - 16] >> 4) - 8;
    case QMM_Q4_1: return j < 16 ? b[4 + j] & 0x0F : b[4 + j - 16] >> 4;
    case QMM_Q5_0: return kiln_ggml_q5_value(b + 2, b + 6, j) - 16;
    default: return kiln_ggml_q5_value(b + 4, b + 8, j); /* Q5_1 */
    }
}

static float q32_dot_c(int32_t type, const uint8_t *w, const qmm_q8 *x, int32_t k)
{
    const qmm_format *f = kiln_qmm_format(type);
    const int has_min = type == QMM_Q4_1 || type == QMM_Q5_1;
    float acc = 0;
    for (int32_t i = 0; i < k / 32; i++, w += f->bytes, x++) {
        int32_t s = 0;
        for (int j = 0; j < 32; j++)
            s += q32_value(type, w, j) * x->q[j];
        acc += kiln_ggml_f16_at(w) * x->d * (float)s;
        if (has_min)
            acc += kiln_ggml_f16_at(w + 2) * x->ds;
    }
    return acc;
}

static float qk_dot_c(int32_t type, const uint8_t *w, const qmm_q8k *x, int32_t k)
{
    const qmm_format *f = kiln_qmm_format(type);
    float acc = 0;
    for (int32_t i = 0; i < k / 256; i++, w += f->bytes, x++) {
        int32_t isum = 0, msum = 0;
        if (type == QMM_Q6_K) {
            for (int e = 0; e < 256; e++)
                isum += (int8_t)w[192 + e / 16] * kiln_ggml_q6k_value(w, e) * x->q[e];
            acc += kiln_ggml_f16_at(w + 208) * x->d * (float)isum;
            continue;
        }
        const uint8_t *qs = w + (type == QMM_Q5_K ? 48 : 16), *qh = w + 16;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            kiln_ggml_kscale(w + 4, j, &sc, &m);
            int32_t s = 0, sx = 0;
            for (int l = 0; l < 32; l++) {
                int q = (j & 1) ? qs[32 * (j >> 1) + l] >> 4 : qs[32 * (j >> 1) + l] & 0x0F;
                if (type == QMM_Q5_K)
                    q |= ((qh[l] >> j) & 1) << 4;
                s += q * x->q[32 * j + l];
                sx += x->q[32 * j + l];
            }
            isum += sc * s;
            msum += m * sx;
        }
        acc += kiln_ggml_f16_at(w) * x->d * (float)isum - kiln_ggml_f16_at(w + 2) * x->d * (float)msum;
    }
    return acc;
}

static void qdot_c(int32_t type, const uint8_t *w, const void *x, size_t xs, int32_t k, float *out)
{
    *out = kiln_qmm_format(type)->act_block == 32 ? q32_dot_c(type, w, x, k) : qk_dot_c(type, w, x, k);
}

/* Elements [e0, e0 + n) of a weight row in f32, n = min(256, k - e0):
 * whole blocks, since e0 is a multiple of 256. */
static int32_t dequant_chunk(int32_t type, const uint8_t *w, int32_t e0, int32_t k, float *y)
{
    const qmm_format *f = kiln_qmm_format(type);
    int32_t n = k - e0 < 256 ? k - e0 : 256;
    const uint8_t *b = w + (size_t)(e0 / f->block) * (size_t)f->bytes;
    for (int32_t e = 0; e < n; e += f->block, b += f->bytes) {
        switch (type) {
        case QMM_Q8_0: kiln_ggml_block_q8_0(b, y + e); break;
        case QMM_Q4_0: kiln_ggml_block_q4_0(b, y + e); break;
        case QMM_Q4_1: kiln_ggml_block_q4_1(b, y + e); break;
        case QMM_Q5_0: kiln_ggml_block_q5_0(b, y + e); break;
        case QMM_Q5_1: kiln_ggml_block_q5_1(b, y + e); break;
        case QMM_Q4_K: kiln_ggml_block_q4_k(b, y + e); break;
        case QMM_Q5_K: kiln_ggml_block_q5_k(b, y + e); break;
        case QMM_Q6_K: kiln_ggml_block_q6_k(b, y + e); break;
        case QMM_F16:
            for (int j = 0; j < 32; j++)
                y[e + j] = kiln_f16_to_f32((uint16_t)(b[2 * j] | b[2 * j + 1] << 8));
            break;
        default: /* BF16 */
            for (int j = 0; j < 32; j++)
                y[e + j] = kiln_bf16_to_f32((uint16_t)(b[2 * j] | b[2 * j + 1] << 8));
            break;
        }
    }
    return n;
}

/* f32 dot of n values, in order. */
static float dotf_c(const float *a, const float *b, int32_t n)
{
    float acc = 0;
    for (int32_t i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

/* f32 activations: the weight row decoded 256 at a time and shared by the
 * R rows of x. */
#define F32ACT_FN(NAME, ATTR, DOTF, R) \
    ATTR static void NAME(int32_t type, const uint8_t *w, const void *x, size_t xs, int32_t k, float *out) \
    { \
        float buf[256], acc[R] = {0}; \
        for (int32_t e0 = 0, n; e0 < k; e0 += n) { \
            n = dequant_chunk(type, w, e0, k, buf); \
            for (int r = 0; r < R; r++) \
                acc[r] += DOTF(buf, (const float *)((const char *)x + (size_t)r * xs) + e0, n); \
        } \
        for (int r = 0; r < R; r++) \
            out[r] = acc[r]; \
    }

F32ACT_FN(f32act_c_1, , dotf_c, 1)

/* Four rows through the one-row reference. */
static void qdot_c_4(int32_t type, const uint8_t *w, const void *x, size_t xs, int32_t k, float *out)
{
    for (int r = 0; r < 4; r++)
        qdot_c(type, w, (const char *)x + (size_t)r * xs, xs, k, out + r);
}

static void f32act_c_4(int32_t type, const uint8_t *w, const void *x, size_t xs, int32_t k, float *out)
{
    for (int r = 0; r < 4; r++)
        f32act_c_1(type, w, (const char *)x + (size_t)r * xs, xs, k, out + r);
}

/* ---- AVX2 and AVX-512 VNNI ---------------------------------------------------------- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define QMM_X86 1

#define AVX2_TARGET "avx2,fma,f16c"
#define VNNI_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define INLINE_AVX2 __attribute__((target(AVX2_TARGET), always_inline)) static inline
/* Loops over rows, sub-blocks and vectors have constant trip counts: fully
 * unrolled, their accumulators and unpacked weights stay in registers. */
#define UNROLLED_FOR(i, n) _Pragma("GCC unroll 16") for (int i = 0; i < (n); i++)

/* d (and m) of a block from its first 4 bytes, by F16C (exact). */
INLINE_AVX2 __m128 f16x2(const uint8_t *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)u));
}

/* One f16 (Q6_K's d, the last 2 bytes of its block). */
INLINE_AVX2 float f16x1(const uint8_t *p)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)p[0] | (uint32_t)p[1] << 8))));
}

INLINE_AVX2 float hsum8(__m256 s)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* 0x10 in byte j where bit j of the 32-bit little-endian qh is set. */
INLINE_AVX2 __m256i q5_high_bits(const uint8_t *qh)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    __m256i v =
        _mm256_shuffle_epi8(_mm256_set1_epi32((int)h),
                            _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* The 32 integer weights of a 32-element block as bytes in x's order:
 * signed for Q8_0, Q4_0, Q5_0 (offsets taken off), unsigned 0..31 for
 * Q4_1 and Q5_1 (their min is added apart). */
INLINE_AVX2 __m256i q32_bytes(int32_t type, const uint8_t *b)
{
    if (type == QMM_Q8_0)
        return _mm256_loadu_si256((const __m256i *)(b + 2));
    int qs = type == QMM_Q4_0 ? 2 : type == QMM_Q4_1 ? 4 : type == QMM_Q5_0 ? 6 : 8;
    __m128i bytes = _mm_loadu_si128((const __m128i *)(b + qs));
    __m256i w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), _mm256_set1_epi8(0x0F));
    if (type == QMM_Q5_0 || type == QMM_Q5_1)
        w = _mm256_or_si256(w, q5_high_bits(b + (type == QMM_Q5_0 ? 2 : 4)));
    if (type == QMM_Q4_0)
        w = _mm256_sub_epi8(w, _mm256_set1_epi8(8));
    if (type == QMM_Q5_0)
        w = _mm256_sub_epi8(w, _mm256_set1_epi8(16));
    return w;
}

/* Σ u·v by fours into 8 int32 lanes, u unsigned and v signed bytes. The
 * signed formats move the weights' signs onto x first: |w| · sign(w)·q
 * is w · q whichever instruction multiplies. */
#define AVX2_PRODUCT(u, v) _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1))
#define VNNI_PRODUCT(u, v) _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, v)

/* One 32-element weight block against R blocks of x. */
#define Q32_BLOCK(TYPE, PRODUCT, R, ACC, B, X, I) \
    do { \
        const int is_signed_ = TYPE == QMM_Q8_0 || TYPE == QMM_Q4_0 || TYPE == QMM_Q5_0; \
        __m128 dm_ = f16x2(B); \
        float dw_ = _mm_cvtss_f32(dm_), mw_ = _mm_cvtss_f32(_mm_shuffle_ps(dm_, dm_, 1)); \
        __m256i w_ = q32_bytes(TYPE, B); \
        __m256i u_ = is_signed_ ? _mm256_sign_epi8(w_, w_) : w_; \
        UNROLLED_FOR (r_, R) { \
            const qmm_q8 *xr_ = (const qmm_q8 *)((const char *)(X) + (size_t)r_ * xs) + (I); \
            __m256i q_ = _mm256_loadu_si256((const __m256i *)xr_->q); \
            __m256i v_ = is_signed_ ? _mm256_sign_epi8(q_, w_) : q_; \
            ACC[r_] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(PRODUCT(u_, v_)), _mm256_set1_ps(dw_ * xr_->d), ACC[r_]); \
            if (TYPE == QMM_Q4_1 || TYPE == QMM_Q5_1) \
                accm[r_] += mw_ * xr_->ds; \
        } \
    } while (0)

/* Bytes of weights asked for ahead of the two blocks a step reads: the
 * SmolLM2 LM head (Q8_0, 30 MB) took 2.1-2.4 ms a decode step at 1,024,
 * 1.6-1.9 at 3,072 (2,048 and 4,096 in between). */
#define QMM_Q32_AHEAD 3072

/* Two blocks a step on two sets of accumulators (two FMA chains). */
#define Q32_FN(NAME, TARGET, TYPE, PRODUCT, R) \
    __attribute__((target(TARGET))) static void NAME(int32_t type, const uint8_t *w, const void *x, size_t xs, \
                                                     int32_t k, float *out) \
    { \
        const size_t bb = TYPE == QMM_Q8_0   ? 34 \
                          : TYPE == QMM_Q4_0 ? 18 \
                          : TYPE == QMM_Q4_1 ? 20 \
                          : TYPE == QMM_Q5_0 ? 22 \
                                             : 24; \
        __m256 acc0[R], acc1[R]; \
        float accm[R]; \
        UNROLLED_FOR (r, R) \
            acc0[r] = acc1[r] = _mm256_setzero_ps(), accm[r] = 0; \
        int32_t nb = k / 32, i = 0; \
        for (; i + 1 < nb; i += 2, w += 2 * bb) { \
            _mm_prefetch((const char *)w + QMM_Q32_AHEAD, _MM_HINT_T0); \
            Q32_BLOCK(TYPE, PRODUCT, R, acc0, w, x, i); \
            Q32_BLOCK(TYPE, PRODUCT, R, acc1, w + bb, x, i + 1); \
        } \
        if (i < nb) \
            Q32_BLOCK(TYPE, PRODUCT, R, acc0, w, x, i); \
        UNROLLED_FOR (r, R) \
            out[r] = hsum8(_mm256_add_ps(acc0[r], acc1[r])) + accm[r]; \
    }

/* The K kernels' integer step over two sub-blocks of 32 (u0, u1: weights
 * as unsigned bytes; x: the 64 activations; s0, s1: int16 sub-scales by
 * lane): acc + Σ (u·x summed by pairs) · s. AVX2 on 256-bit halves; VNNI
 * on one 512-bit register (vpdpwssd), its two halves added at the end. */
#define AVX2_KACC __m256i
#define AVX2_KZERO _mm256_setzero_si256()
#define AVX2_KPACC(acc, u, v, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), s))
#define AVX2_KPAIR(acc, u0, u1, x, s0, s1) \
    AVX2_KPACC(AVX2_KPACC(acc, u0, _mm256_loadu_si256((const __m256i *)(x)), s0), u1, \
               _mm256_loadu_si256((const __m256i *)((x) + 32)), s1)
#define AVX2_KREDUCE(acc) (acc)
#define VNNI_KACC __m512i
#define VNNI_KZERO _mm512_setzero_si512()
#define JOIN512(a, b) _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1)
#define VNNI_KPAIR(acc, u0, u1, x, s0, s1) \
    _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(JOIN512(u0, u1), _mm512_loadu_si512((const void *)(x))), \
                        JOIN512(s0, s1))
#define VNNI_KREDUCE(acc) _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1))

/* The eight 6-bit scales and mins of Q4_K/Q5_K (kiln_ggml_kscale) four at
 * a time: bytes 0..3 hold the low ones, bytes 8..11 the low nibbles of
 * the high ones and bytes 0..7 their top two bits. */
INLINE_AVX2 void kq_scales(const uint8_t *s, uint8_t *sc, uint8_t *mn)
{
    uint32_t a, b, c;
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    uint32_t sl = a & 0x3f3f3f3fu, sh = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
    uint32_t ml = b & 0x3f3f3f3fu, mh = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
    memcpy(sc, &sl, 4);
    memcpy(sc + 4, &sh, 4);
    memcpy(mn, &ml, 4);
    memcpy(mn + 4, &mh, 4);
}

/* Q4_K / Q5_K against R rows of 256-value activation blocks. */
#define Q45K_FN(NAME, TARGET, TYPE, ISA, R) \
    __attribute__((target(TARGET))) static void NAME(int32_t type, const uint8_t *w, const void *x, size_t xs, \
                                                     int32_t k, float *out) \
    { \
        const size_t bb = TYPE == QMM_Q5_K ? 176 : 144; \
        const __m256i lo4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1); \
        __m256 acc[R]; \
        UNROLLED_FOR (r, R) \
            acc[r] = _mm256_setzero_ps(); \
        for (int32_t i = 0; i < k / 256; i++, w += bb) { \
            UNROLLED_FOR (o, (int)(bb + 63) / 64) \
                _mm_prefetch((const char *)w + 1024 + 64 * o, _MM_HINT_T0); \
            const qmm_q8k *xr[R]; \
            ISA##_KACC isum[R]; \
            UNROLLED_FOR (r, R) \
                xr[r] = (const qmm_q8k *)((const char *)x + (size_t)r * xs) + i, isum[r] = ISA##_KZERO; \
            uint8_t sc[8], mn[8]; \
            kq_scales(w + 4, sc, mn); \
            /* the 8 scales as int16 in both halves; sub-block j's broadcast by one shuffle */ \
            __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc))); \
            const uint8_t *qs = w + (TYPE == QMM_Q5_K ? 48 : 16); \
            __m256i qh = TYPE == QMM_Q5_K ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256(); \
            UNROLLED_FOR (g, 4) { \
                __m256i bytes = _mm256_loadu_si256((const __m256i *)(qs + 32 * g)); \
                __m256i lo = _mm256_and_si256(bytes, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), lo4); \
                if (TYPE == QMM_Q5_K) { \
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4)); \
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4)); \
                    qh = _mm256_srli_epi16(qh, 2); \
                } \
                __m256i sa = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0404 * g))); \
                __m256i sb = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0302 + 0x0404 * g))); \
                UNROLLED_FOR (r, R) \
                    isum[r] = ISA##_KPAIR(isum[r], lo, hi, xr[r]->q + 64 * g, sa, sb); \
            } \
            /* mins: 16 int16 (each twice) against the 16 sums by 16 */ \
            __m128i m8 = _mm_loadl_epi64((const __m128i *)mn); \
            __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)); \
            __m128 dm = f16x2(w); \
            float d = _mm_cvtss_f32(dm), dmin = _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1)); \
            UNROLLED_FOR (r, R) { \
                __m256i msum = _mm256_madd_epi16(m16, _mm256_loadu_si256((const __m256i *)xr[r]->bsums)); \
                acc[r] = \
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(ISA##_KREDUCE(isum[r])), _mm256_set1_ps(d * xr[r]->d), acc[r]); \
                acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_set1_ps(dmin * xr[r]->d), acc[r]); \
            } \
        } \
        UNROLLED_FOR (r, R) \
            out[r] = hsum8(acc[r]); \
    }

/* Q6_K: 6-bit values 0..63 (unsigned, so no sign trick), the offset 32
 * taken off afterwards as 32 · Σ sc · Σ qx by 16. */
#define Q6K_FN(NAME, TARGET, ISA, R) \
    __attribute__((target(TARGET))) static void NAME(int32_t type, const uint8_t *w, const void *x, size_t xs, \
                                                     int32_t k, float *out) \
    { \
        const __m256i lo4 = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30); \
        const __m256i pair = _mm256_set_epi8(3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 1, 0, 1, 0, 1, 0, 1, 0, \
                                             1, 0, 1, 0, 1, 0, 1, 0); \
        __m256 acc[R]; \
        UNROLLED_FOR (r, R) \
            acc[r] = _mm256_setzero_ps(); \
        for (int32_t i = 0; i < k / 256; i++, w += 210) { \
            UNROLLED_FOR (o, 4) \
                _mm_prefetch((const char *)w + 1024 + 64 * o, _MM_HINT_T0); \
            const qmm_q8k *xr[R]; \
            ISA##_KACC isum[R]; \
            UNROLLED_FOR (r, R) \
                xr[r] = (const qmm_q8k *)((const char *)x + (size_t)r * xs) + i, isum[r] = ISA##_KZERO; \
            const int8_t *sc = (const int8_t *)(w + 192); \
            __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)); \
            UNROLLED_FOR (h, 2) { \
                __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * h)); \
                __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32)); \
                __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h)); \
                __m256i q[4] = { \
                    _mm256_or_si256(_mm256_and_si256(ql0, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2)), \
                    _mm256_or_si256(_mm256_and_si256(ql1, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2)), \
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), lo4), _mm256_and_si256(qh, hi2)), \
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), lo4), \
                                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2))}; \
                /* scales 2t and 2t + 1 (t = 4h + s) over the low and high 16 values of sub-block s */ \
                __m256i s16[4]; \
                UNROLLED_FOR (s, 4) \
                    s16[s] = \
                        _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(4 * h + s)), pair); \
                UNROLLED_FOR (s, 2) \
                    UNROLLED_FOR (r, R) \
                        isum[r] = ISA##_KPAIR(isum[r], q[2 * s], q[2 * s + 1], xr[r]->q + 128 * h + 64 * s, \
                                              s16[2 * s], s16[2 * s + 1]); \
            } \
            float d = f16x1(w + 208); \
            UNROLLED_FOR (r, R) { \
                __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)xr[r]->bsums)); \
                __m256i s = _mm256_sub_epi32(ISA##_KREDUCE(isum[r]), _mm256_slli_epi32(off, 5)); \
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * xr[r]->d), acc[r]); \
            } \
        } \
        UNROLLED_FOR (r, R) \
            out[r] = hsum8(acc[r]); \
    }

/* 8 F16 / BF16 weights to f32 in registers (both conversions exact). */
INLINE_AVX2 __m256 load8_f16(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
INLINE_AVX2 __m256 load8_bf16(const uint8_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* F16 / BF16 weights against R rows of f32 x, V vectors of 8 a step (V
 * accumulators per row: independent FMA chains). */
#define F16_FN(NAME, LOAD8, R, V) \
    __attribute__((target(AVX2_TARGET))) static void NAME(int32_t type, const uint8_t *w, const void *x, size_t xs, \
                                                          int32_t k, float *out) \
    { \
        __m256 acc[R][V]; \
        UNROLLED_FOR (r, R) \
            UNROLLED_FOR (v, V) \
                acc[r][v] = _mm256_setzero_ps(); \
        for (int32_t i = 0; i < k; i += 8 * V) { \
            _mm_prefetch((const char *)w + 2 * i + 1024, _MM_HINT_T0); \
            __m256 wv[V]; \
            UNROLLED_FOR (v, V) \
                wv[v] = LOAD8(w + 2 * (i + 8 * v)); \
            UNROLLED_FOR (r, R) { \
                const float *xr = (const float *)((const char *)x + (size_t)r * xs) + i; \
                UNROLLED_FOR (v, V) \
                    acc[r][v] = _mm256_fmadd_ps(wv[v], _mm256_loadu_ps(xr + 8 * v), acc[r][v]); \
            } \
        } \
        UNROLLED_FOR (r, R) { \
            __m256 s = _mm256_setzero_ps(); \
            UNROLLED_FOR (v, V) \
                s = _mm256_add_ps(s, acc[r][v]); \
            out[r] = hsum8(s); \
        } \
    }

/* n a multiple of 32. */
__attribute__((target(AVX2_TARGET))) static float dotf_avx2(const float *a, const float *b, int32_t n)
{
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps();
    for (int32_t i = 0; i < n; i += 32) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
    }
    return hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

F32ACT_FN(f32act_avx2_1, __attribute__((target(AVX2_TARGET))), dotf_avx2, 1)
F32ACT_FN(f32act_avx2_4, __attribute__((target(AVX2_TARGET))), dotf_avx2, 4)

#define Q32_SET(FMT, TYPE) \
    Q32_FN(q32_avx2_##FMT##_1, AVX2_TARGET, TYPE, AVX2_PRODUCT, 1) \
    Q32_FN(q32_avx2_##FMT##_4, AVX2_TARGET, TYPE, AVX2_PRODUCT, 4) \
    Q32_FN(q32_vnni_##FMT##_1, VNNI_TARGET, TYPE, VNNI_PRODUCT, 1) \
    Q32_FN(q32_vnni_##FMT##_4, VNNI_TARGET, TYPE, VNNI_PRODUCT, 4)
Q32_SET(q8_0, QMM_Q8_0)
Q32_SET(q4_0, QMM_Q4_0)
Q32_SET(q4_1, QMM_Q4_1)
Q32_SET(q5_0, QMM_Q5_0)
Q32_SET(q5_1, QMM_Q5_1)
Q45K_FN(qk_avx2_q4_k_1, AVX2_TARGET, QMM_Q4_K, AVX2, 1)
Q45K_FN(qk_avx2_q4_k_4, AVX2_TARGET, QMM_Q4_K, AVX2, 4)
Q45K_FN(qk_vnni_q4_k_1, VNNI_TARGET, QMM_Q4_K, VNNI, 1)
Q45K_FN(qk_vnni_q4_k_4, VNNI_TARGET, QMM_Q4_K, VNNI, 4)
Q45K_FN(qk_avx2_q5_k_1, AVX2_TARGET, QMM_Q5_K, AVX2, 1)
Q45K_FN(qk_avx2_q5_k_4, AVX2_TARGET, QMM_Q5_K, AVX2, 4)
Q45K_FN(qk_vnni_q5_k_1, VNNI_TARGET, QMM_Q5_K, VNNI, 1)
Q45K_FN(qk_vnni_q5_k_4, VNNI_TARGET, QMM_Q5_K, VNNI, 4)
Q6K_FN(qk_avx2_q6_k_1, AVX2_TARGET, AVX2, 1)
Q6K_FN(qk_avx2_q6_k_4, AVX2_TARGET, AVX2, 4)
Q6K_FN(qk_vnni_q6_k_1, VNNI_TARGET, VNNI, 1)
Q6K_FN(qk_vnni_q6_k_4, VNNI_TARGET, VNNI, 4)
F16_FN(f16_avx2_1, load8_f16, 1, 4)
F16_FN(f16_avx2_4, load8_f16, 4, 2)
F16_FN(bf16_avx2_1, load8_bf16, 1, 4)
F16_FN(bf16_avx2_4, load8_bf16, 4, 2)

/* Per format (in the order of formats[]): AVX2 one/four, VNNI one/four. */
static const qmm_kernel simd[N_FORMATS][4] = {
    {q32_avx2_q8_0_1, q32_avx2_q8_0_4, q32_vnni_q8_0_1, q32_vnni_q8_0_4},
    {q32_avx2_q4_0_1, q32_avx2_q4_0_4, q32_vnni_q4_0_1, q32_vnni_q4_0_4},
    {q32_avx2_q4_1_1, q32_avx2_q4_1_4, q32_vnni_q4_1_1, q32_vnni_q4_1_4},
    {q32_avx2_q5_0_1, q32_avx2_q5_0_4, q32_vnni_q5_0_1, q32_vnni_q5_0_4},
    {q32_avx2_q5_1_1, q32_avx2_q5_1_4, q32_vnni_q5_1_1, q32_vnni_q5_1_4},
    {qk_avx2_q4_k_1, qk_avx2_q4_k_4, qk_vnni_q4_k_1, qk_vnni_q4_k_4},
    {qk_avx2_q5_k_1, qk_avx2_q5_k_4, qk_vnni_q5_k_1, qk_vnni_q5_k_4},
    {qk_avx2_q6_k_1, qk_avx2_q6_k_4, qk_vnni_q6_k_1, qk_vnni_q6_k_4},
    {f16_avx2_1, f16_avx2_4, f16_avx2_1, f16_avx2_4},
    {bf16_avx2_1, bf16_avx2_4, bf16_avx2_1, bf16_avx2_4},
};

/* ---- the tiled GEMM (AVX-512 VNNI; qmatmul_cpu.h) --------------------------------- */

/* Values of a weight tile unpacked at a time: 16 KiB of u and 8 KiB of
 * scales stay in L1 while groups of x rows pass over them. */
#define GEMM_KC 1024

typedef struct gemm_tile {
    uint32_t u[GEMM_KC / 4][QMM_GEMM_LANES]; /* four u of each weight row */
    float sc[GEMM_KC / 16][QMM_GEMM_LANES], mn[GEMM_KC / 16][QMM_GEMM_LANES];
} gemm_tile;

/* Values [e0, e0 + n) of one weight row as unsigned bytes u and, per
 * sub-block, sc and mn with w = sc · u + mn (the formulas of
 * core/ggml_block.h with the offsets moved into mn). */
__attribute__((target(VNNI_TARGET))) static void gemm_unpack(int32_t type, const uint8_t *w, int32_t e0, int32_t n,
                                                             uint8_t *u, float *sc, float *mn)
{
    const qmm_format *f = kiln_qmm_format(type);
    const uint8_t *b = w + (size_t)(e0 / f->block) * (size_t)f->bytes;
    if (f->block == 32) {
        const int off = type == QMM_Q8_0 ? 128 : type == QMM_Q4_0 ? 8 : type == QMM_Q5_0 ? 16 : 0;
        for (int32_t e = 0; e < n; e += 32, b += f->bytes, u += 32) {
            __m256i v = _mm256_add_epi8(q32_bytes(type, b), _mm256_set1_epi8((char)off));
            _mm256_storeu_si256((__m256i *)u, v);
            __m128 dm = f16x2(b);
            float d = _mm_cvtss_f32(dm);
            *sc++ = d;
            *mn++ = off ? -(float)off * d : _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1));
        }
        return;
    }
    const __m256i lo4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1), hi2 = _mm256_set1_epi8(0x30);
    for (int32_t e = 0; e < n; e += 256, b += f->bytes, u += 256) {
        if (type == QMM_Q6_K) {
            for (int h = 0; h < 2; h++) {
                __m256i ql0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
                __m256i ql1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
                __m256i *o = (__m256i *)(u + 128 * h);
                _mm256_storeu_si256(
                    o, _mm256_or_si256(_mm256_and_si256(ql0, lo4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2)));
                _mm256_storeu_si256(o + 1, _mm256_or_si256(_mm256_and_si256(ql1, lo4),
                                                           _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2)));
                _mm256_storeu_si256(o + 2, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), lo4),
                                                           _mm256_and_si256(qh, hi2)));
                _mm256_storeu_si256(o + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), lo4),
                                                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2)));
            }
            float d = f16x1(b + 208);
            for (int t = 0; t < 16; t++) {
                float ds = d * (float)(int8_t)b[192 + t];
                *sc++ = ds;
                *mn++ = -32.0f * ds;
            }
            continue;
        }
        uint8_t s6[8], m6[8];
        kq_scales(b + 4, s6, m6);
        __m128 dm = f16x2(b);
        float d = _mm_cvtss_f32(dm), dmin = _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 1));
        const uint8_t *qs = b + (type == QMM_Q5_K ? 48 : 16);
        __m256i qh = type == QMM_Q5_K ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256i bytes = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i lo = _mm256_and_si256(bytes, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), lo4);
            if (type == QMM_Q5_K) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
                qh = _mm256_srli_epi16(qh, 2);
            }
            _mm256_storeu_si256((__m256i *)(u + 64 * g), lo);
            _mm256_storeu_si256((__m256i *)(u + 64 * g + 32), hi);
        }
        for (int j = 0; j < 8; j++) {
            *sc++ = d * (float)s6[j];
            *mn++ = -(dmin * (float)m6[j]);
        }
    }
}

/* Sixteen registers of sixteen 32-bit values, rows to columns: unpack
 * pairs of rows by 32 and 64 bits within each 128-bit lane, then move
 * the lanes (a 4 x 4 transpose of 128-bit blocks). */
__attribute__((target(VNNI_TARGET), always_inline)) static inline void transpose16(__m512i r[16])
{
    __m512i t[16];
    UNROLLED_FOR (i, 8) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    UNROLLED_FOR (i, 4) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* r[4i + e], 128-bit lane L: rows 4i..4i+3 of column 4L + e */
    UNROLLED_FOR (e, 4) {
        __m512i x0 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0x44), x1 = _mm512_shuffle_i32x4(r[e], r[4 + e], 0xEE);
        __m512i x2 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0x44);
        __m512i x3 = _mm512_shuffle_i32x4(r[8 + e], r[12 + e], 0xEE);
        t[e] = _mm512_shuffle_i32x4(x0, x2, 0x88);
        t[4 + e] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
        t[8 + e] = _mm512_shuffle_i32x4(x1, x3, 0x88);
        t[12 + e] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
    }
    UNROLLED_FOR (i, 16)
        r[i] = t[i];
}

/* Byte j of every 32-bit lane of v, zero-extended to the lane (vpshufb
 * indexes bytes within each 128-bit quarter: lane i's byte j is 4i + j). */
#define LANE_BYTE(v, j) \
    _mm512_shuffle_epi8(v, _mm512_set4_epi32((int)(0x8080800Cu | (uint32_t)(j)), (int)(0x80808008u | (uint32_t)(j)), \
                                             (int)(0x80808004u | (uint32_t)(j)), (int)(0x80808000u | (uint32_t)(j))))

/* Q4_K's eight 6-bit scales and mins (kq_scales) for the 16 rows of a
 * panel: a, b, c the column's three scale vectors (bytes 0-3, 4-7, 8-11
 * of each row); sc[h] and mn[h] hold sub-blocks 4h..4h+3 in each lane's
 * bytes. */
__attribute__((target(VNNI_TARGET), always_inline)) static inline void q4k_panel_scales(__m512i a, __m512i b, __m512i c,
                                                                                        __m512i sc[2], __m512i mn[2])
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi8(0x3F), m30 = _mm512_set1_epi8(0x30);
    sc[0] = _mm512_and_si512(a, m6);
    sc[1] = _mm512_or_si512(_mm512_and_si512(c, m4), _mm512_and_si512(_mm512_srli_epi32(a, 2), m30));
    mn[0] = _mm512_and_si512(b, m6);
    mn[1] =
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), m4), _mm512_and_si512(_mm512_srli_epi32(b, 2), m30));
}

/* Q6_K's 6-bit values from a panel's low-bit vectors l0 (of ql0), l1 (of
 * ql1) and high-bit vector qh of the same i: v[t] holds values 32t + 4i..
 * of the half (the one-row kernel's q[0..3]). */
__attribute__((target(VNNI_TARGET), always_inline)) static inline void q6k_panel_values(__m512i l0, __m512i l1,
                                                                                        __m512i qh, __m512i v[4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    v[0] = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30));
    v[1] = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30));
    v[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(qh, m30));
    v[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                           _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30));
}

/* A GEMM tile straight from one panel (its 16 rows are the tile's lanes,
 * and a panel's quant vectors are already four values a lane): values
 * [e0, e0 + n) as u, sc and mn of gemm_unpack, without the per-row
 * unpack and the transposes. */
__attribute__((target(VNNI_TARGET))) static void gemm_unpack_panel(int32_t type, const uint8_t *w, int32_t e0,
                                                                   int32_t n, gemm_tile *t)
{
    const qmm_format *f = kiln_qmm_format(type);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const uint8_t *c = w + (size_t)(e0 / f->block) * QMM_PANEL_ROWS * (size_t)f->bytes;
    for (int32_t bb = 0; bb < n / f->block; bb++, c += QMM_PANEL_ROWS * (size_t)f->bytes) {
        if (type == QMM_Q8_0) {
            /* u = q + 128 (the sign bit flipped), w = d · u - 128 · d */
            for (int v = 0; v < 8; v++)
                _mm512_storeu_si512(t->u[8 * bb + v], _mm512_xor_si512(_mm512_loadu_si512((const void *)(c + 64 * v)),
                                                                       _mm512_set1_epi8((char)0x80)));
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 512)));
            _mm512_storeu_ps(t->sc[bb], d);
            _mm512_storeu_ps(t->mn[bb], _mm512_mul_ps(d, _mm512_set1_ps(-128.0f)));
        } else if (type == QMM_Q4_0 || type == QMM_Q4_1) {
            for (int s = 0; s < 4; s++) {
                __m512i q = _mm512_loadu_si512((const void *)(c + 64 * s));
                _mm512_storeu_si512(t->u[8 * bb + s], _mm512_and_si512(q, m4));
                _mm512_storeu_si512(t->u[8 * bb + 4 + s], _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
            }
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 256)));
            _mm512_storeu_ps(t->sc[bb], d);
            _mm512_storeu_ps(t->mn[bb], type == QMM_Q4_1
                                            ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 288)))
                                            : _mm512_mul_ps(d, _mm512_set1_ps(-8.0f)));
        } else if (type == QMM_Q4_K) {
            for (int g = 0; g < 4; g++)
                for (int i = 0; i < 8; i++) {
                    __m512i q = _mm512_loadu_si512((const void *)(c + 64 * (8 * g + i)));
                    _mm512_storeu_si512(t->u[64 * bb + 16 * g + i], _mm512_and_si512(q, m4));
                    _mm512_storeu_si512(t->u[64 * bb + 16 * g + 8 + i], _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
                }
            __m512i sc[2], mn[2];
            q4k_panel_scales(_mm512_loadu_si512((const void *)(c + 2048)), _mm512_loadu_si512((const void *)(c + 2112)),
                             _mm512_loadu_si512((const void *)(c + 2176)), sc, mn);
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 2240)));
            __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 2272)));
            UNROLLED_FOR (j, 8) {
                _mm512_storeu_ps(t->sc[8 * bb + j], _mm512_mul_ps(d, _mm512_cvtepi32_ps(LANE_BYTE(sc[j / 4], j % 4))));
                _mm512_storeu_ps(t->mn[8 * bb + j], _mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), dmin),
                                                                  _mm512_cvtepi32_ps(LANE_BYTE(mn[j / 4], j % 4))));
            }
        } else { /* Q6_K: sub-blocks of 16 */
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < 8; i++) {
                    __m512i v[4];
                    q6k_panel_values(_mm512_loadu_si512((const void *)(c + 64 * (16 * h + i))),
                                     _mm512_loadu_si512((const void *)(c + 64 * (16 * h + 8 + i))),
                                     _mm512_loadu_si512((const void *)(c + 2048 + 64 * (8 * h + i))), v);
                    for (int q = 0; q < 4; q++)
                        _mm512_storeu_si512(t->u[64 * bb + 32 * h + 8 * q + i], v[q]);
                }
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 3328)));
            UNROLLED_FOR (j, 16) {
                __m512i sv = _mm512_loadu_si512((const void *)(c + 3072 + 64 * (j / 4)));
                __m512 ds = _mm512_mul_ps(
                    d, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(sv, 24 - 8 * (j % 4)), 24)));
                _mm512_storeu_ps(t->sc[16 * bb + j], ds);
                _mm512_storeu_ps(t->mn[16 * bb + j], _mm512_mul_ps(ds, _mm512_set1_ps(-32.0f)));
            }
        }
    }
}

/* The tile's n_w weight rows, values [e0, e0 + n), interleaved; lanes past
 * n_w are zero. Each row is unpacked on its own, then sixteen rows of
 * sixteen 32-bit groups at a time are transposed in registers; a panel
 * (always 16 rows) is unpacked as it lies. */
__attribute__((target(VNNI_TARGET))) static void gemm_unpack_tile(int32_t type, const uint8_t *w, size_t wrow,
                                                                  int32_t n_w, int32_t e0, int32_t n, int32_t sub,
                                                                  int panel, gemm_tile *t)
{
    if (panel) {
        gemm_unpack_panel(type, w, e0, n, t);
        return;
    }
    /* rows of u and of the scales, padded to whole groups of 64 bytes */
    uint8_t u[QMM_GEMM_LANES][GEMM_KC] __attribute__((aligned(64)));
    float sc[QMM_GEMM_LANES][GEMM_KC / 16] __attribute__((aligned(64)));
    float mn[QMM_GEMM_LANES][GEMM_KC / 16] __attribute__((aligned(64)));
    for (int32_t c = 0; c < QMM_GEMM_LANES; c++) {
        if (c < n_w) {
            gemm_unpack(type, w + (size_t)c * wrow, e0, n, u[c], sc[c], mn[c]);
        } else {
            memset(u[c], 0, sizeof u[c]);
            memset(sc[c], 0, sizeof sc[c]);
            memset(mn[c], 0, sizeof mn[c]);
        }
    }
    __m512i r[16];
    for (int32_t g = 0; g < (n + 63) / 64; g++) {
        UNROLLED_FOR (c, 16)
            r[c] = _mm512_load_si512(u[c] + 64 * g);
        transpose16(r);
        UNROLLED_FOR (i, 16)
            _mm512_storeu_si512(t->u[16 * g + i], r[i]);
    }
    for (int32_t g = 0; g < (n / sub + 15) / 16; g++) {
        UNROLLED_FOR (c, 16)
            r[c] = _mm512_castps_si512(_mm512_load_ps(sc[c] + 16 * g));
        transpose16(r);
        UNROLLED_FOR (i, 16)
            _mm512_storeu_si512(t->sc[16 * g + i], r[i]);
        UNROLLED_FOR (c, 16)
            r[c] = _mm512_castps_si512(_mm512_load_ps(mn[c] + 16 * g));
        transpose16(r);
        UNROLLED_FOR (i, 16)
            _mm512_storeu_si512(t->mn[16 * g + i], r[i]);
    }
}

/* One panel of x against the tile's values [e0, e0 + n) of k: the first
 * `valid` of its rows of y (ldy apart, the lanes of mask) set, or added to
 * when add. Per sub-block: SUB / 4 vpdpbusd per row, then its scaling. */
#define GEMM_PANEL_FN(NAME, SUB) \
    __attribute__((target(VNNI_TARGET))) static void NAME(const gemm_tile *t, int32_t n, const uint8_t *panel, \
                                                          int32_t e0, int32_t k, float *y, int64_t ldy, int valid, \
                                                          __mmask16 mask, int add) \
    { \
        enum { P = QMM_GEMM_PANEL }; \
        const int32_t nsub = k / (SUB), j0 = e0 / (SUB); \
        const int32_t *q = (const int32_t *)panel + (size_t)(e0 / 4) * P; \
        const float *xd = (const float *)(panel + (size_t)P * (size_t)k) + (size_t)j0 * P; \
        const float *xsum = xd + (size_t)nsub * P; \
        __m512 acc[P]; \
        UNROLLED_FOR (r, P) \
            acc[r] = _mm512_setzero_ps(); \
        for (int32_t j = 0; j < n / (SUB); j++, xd += P, xsum += P) { \
            __m512i is[P]; \
            UNROLLED_FOR (r, P) \
                is[r] = _mm512_setzero_si512(); \
            UNROLLED_FOR (s, (SUB) / 4) { \
                __m512i wv = _mm512_loadu_si512(t->u[j * ((SUB) / 4) + s]); \
                UNROLLED_FOR (r, P) \
                    is[r] = _mm512_dpbusd_epi32(is[r], wv, _mm512_set1_epi32(q[r])); \
                q += P; \
            } \
            __m512 sc = _mm512_loadu_ps(t->sc[j]), mn = _mm512_loadu_ps(t->mn[j]); \
            UNROLLED_FOR (r, P) { \
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r]), _mm512_mul_ps(sc, _mm512_set1_ps(xd[r])), acc[r]); \
                acc[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xsum[r]), acc[r]); \
            } \
        } \
        UNROLLED_FOR (r, P) { \
            if (r >= valid) \
                break; \
            float *yr = y + r * ldy; \
            _mm512_mask_storeu_ps(yr, mask, add ? _mm512_add_ps(acc[r], _mm512_maskz_loadu_ps(mask, yr)) : acc[r]); \
        } \
    }

GEMM_PANEL_FN(gemm_panel_32, 32)
GEMM_PANEL_FN(gemm_panel_16, 16)

__attribute__((target(VNNI_TARGET))) static void gemm_vnni(int32_t type, const uint8_t *w, size_t wrow, int32_t n_w,
                                                           int panel, int32_t k, const void *x, int64_t rows, float *y,
                                                           int64_t ldy)
{
    gemm_tile t;
    const qmm_format *f = kiln_qmm_format(type);
    const int32_t sub = kiln_qmm_gemm_sub(f);
    const size_t pb = kiln_qmm_gemm_panel_bytes(f, k);
    const __mmask16 mask = (__mmask16)((1u << n_w) - 1u);
    for (int32_t e0 = 0; e0 < k; e0 += GEMM_KC) {
        int32_t n = k - e0 < GEMM_KC ? k - e0 : GEMM_KC;
        gemm_unpack_tile(type, w, wrow, n_w, e0, n, sub, panel, &t);
        for (int64_t r = 0; r < rows; r += QMM_GEMM_PANEL) {
            const uint8_t *panel = (const uint8_t *)x + (size_t)(r / QMM_GEMM_PANEL) * pb;
            int valid = rows - r < QMM_GEMM_PANEL ? (int)(rows - r) : QMM_GEMM_PANEL;
            (sub == 16 ? gemm_panel_16 : gemm_panel_32)(&t, n, panel, e0, k, y + r * ldy, ldy, valid, mask, e0 > 0);
        }
    }
}

/* quantize_values with AVX-512, n a multiple of 16, bit for bit: the same
 * max, scale and product, and roundf's rounding (halves away from zero)
 * from the truncation and the exact remainder. */
__attribute__((target(VNNI_TARGET))) static float quant_avx512(const float *x, int32_t n, int8_t *q)
{
    __m512 m = _mm512_setzero_ps();
    for (int32_t j = 0; j < n; j += 16)
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    float amax = _mm512_reduce_max_ps(m);
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512 vid = _mm512_set1_ps(id), half = _mm512_set1_ps(0.5f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u), one = _mm512_set1_epi32(0x3f800000);
    for (int32_t j = 0; j < n; j += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + j), vid);
        __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(v, t)), half, _CMP_GE_OQ);
        __m512 step = _mm512_castsi512_ps(_mm512_or_si512(one, _mm512_and_si512(sign, _mm512_castps_si512(v))));
        t = _mm512_mask_add_ps(t, up, t, step);
        _mm_storeu_si128((__m128i *)(q + j), _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(t)));
    }
    return d;
}

/* ---- the decode GEMV for Q4_0 and Q4_1 (AVX-512 VBMI + VNNI; qmatmul_cpu.h) -------------- */

#define VBMI_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi"

void kiln_qmm_gemv4_pack_x(const void *xq, int32_t k, void *out)
{
    const qmm_q8 *x = xq;
    qmm_gemv4_x *g = out;
    int32_t nb = k / 32;
    memset(g, 0, sizeof *g * (size_t)((nb + 3) / 4));
    for (int32_t b = 0; b < nb; b++) {
        qmm_gemv4_x *gi = g + b / 4;
        int j = b % 4;
        memcpy(gi->lo + 16 * j, x[b].q, 16);
        memcpy(gi->hi + 16 * j, x[b].q + 16, 16);
        for (int l = 0; l < 4; l++)
            gi->d[4 * j + l] = x[b].d;
        gi->s[4 * j] = x[b].ds;
    }
}

/* One group of four blocks at WG: bytes 0..63 under AMASK and 64..79
 * under BMASK (masked loads: a row's last group reads zeros past the
 * row's end, never the memory there), the permutes iq and isc. */
#define GEMV4_GROUP(HAS_MIN, WG, AMASK, BMASK, XG, ACC, ACCM) \
    do { \
        __m512i a_ = _mm512_maskz_loadu_epi8(AMASK, (WG)); \
        __m512i b_ = _mm512_castsi128_si512(_mm_maskz_loadu_epi8(BMASK, (WG) + 64)); \
        __m512i q_ = _mm512_permutex2var_epi8(a_, iq, b_); \
        __m512i lo_ = _mm512_and_si512(q_, m4), hi_ = _mm512_and_si512(_mm512_srli_epi16(q_, 4), m4); \
        __m512i is_ = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo_, _mm512_loadu_si512((XG)->lo)); \
        is_ = _mm512_dpbusd_epi32(is_, hi_, _mm512_loadu_si512((XG)->hi)); \
        __m512i sc_ = _mm512_permutex2var_epi8(a_, isc, b_); \
        __m512 dw_ = _mm512_cvtph_ps(_mm512_castsi512_si256(sc_)); \
        ACC = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is_), _mm512_mul_ps(dw_, _mm512_loadu_ps((XG)->d)), ACC); \
        ACCM = _mm512_fmadd_ps(HAS_MIN ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(sc_, 1)) : dw_, \
                               _mm512_loadu_ps((XG)->s), ACCM); \
    } while (0)

/* Bytes of weights asked for ahead of their use, every line of them (a
 * step reads 2·4·BB bytes, under three lines): on the 2-core host the
 * layers' GEMVs went from 6.3-6.8 to 4.6-5.0 ms a SmolLM2 decode step
 * against one line per step 1,024 bytes ahead; 1,536 and 3,072 were
 * slower than 2,048, and L2 hints (T1) too. */
#define QMM_GEMV4_AHEAD 2048

/* Weight rows [0, n_rows) against x packed by kiln_qmm_gemv4_pack_x.
 * Q4_0's w = d·(q − 8) is Q4_1's form with m = −8·d: its min sums are
 * taken with d and multiplied by −8 at the end (exact, a power of two). */
#define GEMV4_FN(NAME, BB, QOFF, HAS_MIN) \
    __attribute__((target(VBMI_TARGET))) static void NAME(const uint8_t *w, size_t wrow, int64_t n_rows, int32_t k, \
                                                          const void *xg, float *y) \
    { \
        uint8_t iqb[64] __attribute__((aligned(64))), iscb[64] __attribute__((aligned(64))); \
        for (int j = 0; j < 4; j++) \
            for (int i = 0; i < 16; i++) \
                iqb[16 * j + i] = (uint8_t)((BB)*j + (QOFF) + i); \
        for (int l = 0; l < 16; l++) \
            for (int e = 0; e < 2; e++) { \
                iscb[2 * l + e] = (uint8_t)((BB) * (l / 4) + e); \
                iscb[32 + 2 * l + e] = (uint8_t)((BB) * (l / 4) + (HAS_MIN ? 2 : 0) + e); \
            } \
        const __m512i iq = _mm512_load_si512(iqb), isc = _mm512_load_si512(iscb), m4 = _mm512_set1_epi8(0x0F); \
        const int32_t nb = k / 32, full = nb / 4, tail = nb % 4; \
        const __mmask64 all = ~(__mmask64)0, tail_a = ((__mmask64)1 << ((BB)*tail)) - 1; \
        const __mmask16 full_b = (__mmask16)((1u << (4 * (BB)-64)) - 1); \
        const qmm_gemv4_x *x = xg; \
        for (int64_t r = 0; r < n_rows; r++) { \
            const uint8_t *wr = w + (size_t)r * wrow; \
            __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(); \
            __m512 accm0 = _mm512_setzero_ps(), accm1 = _mm512_setzero_ps(); \
            int32_t g = 0; \
            for (; g + 1 < full; g += 2) { \
                UNROLLED_FOR (o, 3) \
                    _mm_prefetch((const char *)wr + 4 * (BB)*g + QMM_GEMV4_AHEAD + 64 * o, _MM_HINT_T0); \
                GEMV4_GROUP(HAS_MIN, wr + 4 * (BB)*g, all, full_b, x + g, acc0, accm0); \
                GEMV4_GROUP(HAS_MIN, wr + 4 * (BB) * (g + 1), all, full_b, x + g + 1, acc1, accm1); \
            } \
            if (g < full) { \
                GEMV4_GROUP(HAS_MIN, wr + 4 * (BB)*g, all, full_b, x + g, acc0, accm0); \
                g++; \
            } \
            if (tail) \
                GEMV4_GROUP(HAS_MIN, wr + 4 * (BB)*g, tail_a, 0, x + g, acc1, accm1); \
            __m512 accm = _mm512_add_ps(accm0, accm1); \
            if (!(HAS_MIN)) \
                accm = _mm512_mul_ps(accm, _mm512_set1_ps(-8.0f)); \
            y[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), accm)); \
        } \
    }

GEMV4_FN(gemv4_q4_0, 18, 2, 0)
GEMV4_FN(gemv4_q4_1, 20, 4, 1)

/* ---- the panel GEMV (AVX-512 VNNI; qmatmul_cpu.h) ----------------------------------------- */

/* Four quantized activations at p in every 32-bit lane (a broadcast load). */
__attribute__((target(VNNI_TARGET), always_inline)) static inline __m512i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* Bytes of panels asked for ahead of the column being read (every line):
 * into L1 a few columns ahead, and into L2 QMM_PANEL_FAR bytes ahead,
 * far enough to cover DRAM's latency: two threads read from DRAM at
 * 0.78-0.88 of a plain read's rate with the near requests alone, at
 * 0.94-1.02 with both (medians by format; 8-32 KiB measured alike). */
#define QMM_PANEL_AHEAD 2048
#define QMM_PANEL_FAR 16384

/* 16 rows a panel, one lane a row: per block column the four quant
 * vectors' low and high nibbles against x's quant bytes 0..15 and 16..31
 * (four at a time, broadcast), then the column's 16 d (and m) converted
 * at once. Q4_0's w = d·(q − 8) is Q4_1's form with m = −8·d, as in the
 * GEMV above. Two sets of f32 accumulators for odd and even columns. */
#define PANEL_FN(NAME, BB, HAS_MIN) \
    __attribute__((target(VNNI_TARGET))) static void NAME(const uint8_t *w, size_t wrow, int64_t n_panels, int32_t k, \
                                                          const void *xq, float *y) \
    { \
        const qmm_q8 *x = xq; \
        const int32_t nb = k / 32; \
        const __m512i m4 = _mm512_set1_epi8(0x0F); \
        for (int64_t p = 0; p < n_panels; p++) { \
            const uint8_t *c = w + (size_t)p * QMM_PANEL_ROWS * wrow; \
            __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}; \
            __m512 accm[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}; \
            for (int32_t b = 0; b < nb; b++, c += QMM_PANEL_ROWS * (BB)) { \
                UNROLLED_FOR (o, (QMM_PANEL_ROWS * (BB) + 63) / 64) { \
                    _mm_prefetch((const char *)c + QMM_PANEL_AHEAD + 64 * o, _MM_HINT_T0); \
                    _mm_prefetch((const char *)c + QMM_PANEL_FAR + 64 * o, _MM_HINT_T1); \
                } \
                __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512(); \
                UNROLLED_FOR (s, 4) { \
                    __m512i q = _mm512_loadu_si512((const void *)(c + 64 * s)); \
                    lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(q, m4), bcast4(x[b].q + 4 * s)); \
                    hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4), \
                                             bcast4(x[b].q + 16 + 4 * s)); \
                } \
                __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 256))); \
                __m512 m = HAS_MIN ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 288))) : d; \
                acc[b & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), \
                                             _mm512_mul_ps(d, _mm512_set1_ps(x[b].d)), acc[b & 1]); \
                accm[b & 1] = _mm512_fmadd_ps(m, _mm512_set1_ps(x[b].ds), accm[b & 1]); \
            } \
            __m512 am = _mm512_add_ps(accm[0], accm[1]); \
            if (!(HAS_MIN)) \
                am = _mm512_mul_ps(am, _mm512_set1_ps(-8.0f)); \
            _mm512_storeu_ps(y + p * QMM_PANEL_ROWS, _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), am)); \
        } \
    }

PANEL_FN(panel_q4_0, 18, 0)
PANEL_FN(panel_q4_1, 20, 1)

/* Q8_0 in panels: eight vectors of each row's 32 int8 quants four at a
 * time, then the rows' d. vpdpbusd multiplies unsigned bytes, so the
 * weights are offset by 128 (a sign-bit flip) and 128 · Σ q of x's block
 * taken off the exact sum. */
__attribute__((target(VNNI_TARGET))) static void panel_q8_0(const uint8_t *w, size_t wrow, int64_t n_panels, int32_t k,
                                                            const void *xq, float *y)
{
    const qmm_q8 *x = xq;
    const int32_t nb = k / 32;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    int32_t xsum[QMM_PANEL_ROW_BYTES / 34]; /* 128 · Σ q of each of x's blocks (qmm_new bounds the row) */
    for (int32_t b = 0; b < nb; b++) {
        int32_t t = 0;
        for (int j = 0; j < 32; j++)
            t += x[b].q[j];
        xsum[b] = 128 * t;
    }
    for (int64_t p = 0; p < n_panels; p++) {
        const uint8_t *c = w + (size_t)p * QMM_PANEL_ROWS * wrow;
        __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int32_t b = 0; b < nb; b++, c += QMM_PANEL_ROWS * 34) {
            UNROLLED_FOR (o, 9) {
                _mm_prefetch((const char *)c + QMM_PANEL_AHEAD + 64 * o, _MM_HINT_T0);
                _mm_prefetch((const char *)c + QMM_PANEL_FAR + 64 * o, _MM_HINT_T1);
            }
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            UNROLLED_FOR (v, 4) {
                s0 = _mm512_dpbusd_epi32(s0, _mm512_xor_si512(_mm512_loadu_si512((const void *)(c + 64 * v)), flip),
                                         bcast4(x[b].q + 4 * v));
                s1 = _mm512_dpbusd_epi32(s1,
                                         _mm512_xor_si512(_mm512_loadu_si512((const void *)(c + 256 + 64 * v)), flip),
                                         bcast4(x[b].q + 16 + 4 * v));
            }
            __m512i is = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(xsum[b]));
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 512)));
            acc[b & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(d, _mm512_set1_ps(x[b].d)), acc[b & 1]);
        }
        _mm512_storeu_ps(y + p * QMM_PANEL_ROWS, _mm512_add_ps(acc[0], acc[1]));
    }
}

/* Q4_K in panels: a block column is 32 quant vectors (vector t: bytes
 * 4t..4t+3 of each row's 128; low nibbles of t = 8g + i are values
 * 64g + 4i.., high ones 64g + 32 + 4i..), then three vectors of the rows'
 * twelve scale bytes, then their d and dmin. Per sub-block j of 32 values
 * an exact integer sum S_j a lane, then Σ sc_j · S_j and Σ m_j · (its
 * sums of x) in integers, scaled once: llama.cpp's arithmetic, as the
 * one-row kernel. A high nibble is taken as 16 times its value (the byte
 * and 0xF0: one instruction, no shift), its sub-block's products summed
 * apart and divided by 16 at the column's end (exact: every term is a
 * multiple of 16). The mins meet x's sums by vpdpbusd: each sum of 32 x
 * (|s| <= 32 · 127) split as 128 · hi + lo, two int8 with lo >= 0. */
__attribute__((target(VNNI_TARGET))) static void panel_q4_k(const uint8_t *w, size_t wrow, int64_t n_panels, int32_t k,
                                                            const void *xq, float *y)
{
    const qmm_q8k *x = xq;
    const int32_t nb = k / 256;
    /* per block: lo of sub-blocks 0-3, 4-7, then hi of 0-3, 4-7, four int8 a word */
    int32_t xs[QMM_PANEL_ROW_BYTES / 144][4];
    for (int32_t b = 0; b < nb; b++) {
        int8_t t[16];
        for (int j = 0; j < 8; j++) {
            int s = x[b].bsums[2 * j] + x[b].bsums[2 * j + 1];
            t[j] = (int8_t)(s & 127);
            t[8 + j] = (int8_t)((s - (s & 127)) / 128);
        }
        memcpy(xs[b], t, 16);
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t p = 0; p < n_panels; p++) {
        const uint8_t *c = w + (size_t)p * QMM_PANEL_ROWS * wrow;
        __m512 acc = _mm512_setzero_ps();
        for (int32_t b = 0; b < nb; b++, c += QMM_PANEL_ROWS * 144) {
            const qmm_q8k *xb = x + b;
            /* the scales as in kq_scales, each lane's four bytes at a time */
            __m512i a = _mm512_loadu_si512((const void *)(c + 2048)), bm = _mm512_loadu_si512((const void *)(c + 2112));
            __m512i cc = _mm512_loadu_si512((const void *)(c + 2176));
            __m512i sc[2], mn[2];
            q4k_panel_scales(a, bm, cc, sc, mn);
            __m512i isum = _mm512_setzero_si512(), isum16 = _mm512_setzero_si512();
            UNROLLED_FOR (g, 4) {
                /* the next column, a quarter of its 36 lines a sub-block pair */
                UNROLLED_FOR (l, 9) {
                    _mm_prefetch((const char *)c + QMM_PANEL_ROWS * 144 + 576 * g + 64 * l, _MM_HINT_T0);
                    _mm_prefetch((const char *)c + QMM_PANEL_FAR + 576 * g + 64 * l, _MM_HINT_T1);
                }
                __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
                UNROLLED_FOR (i, 8) {
                    __m512i q = _mm512_loadu_si512((const void *)(c + 64 * (8 * g + i)));
                    lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(q, m4), bcast4(xb->q + 64 * g + 4 * i));
                    hi = _mm512_dpbusd_epi32(hi, _mm512_andnot_si512(m4, q), bcast4(xb->q + 64 * g + 32 + 4 * i));
                }
                /* sub-blocks 2g and 2g + 1: scale bytes 2g, 2g + 1 of the low or high four */
                isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(lo, LANE_BYTE(sc[g / 2], 2 * (g % 2))));
                isum16 = _mm512_add_epi32(isum16, _mm512_mullo_epi32(hi, LANE_BYTE(sc[g / 2], 2 * (g % 2) + 1)));
            }
            isum = _mm512_add_epi32(isum, _mm512_srai_epi32(isum16, 4));
            __m512i mlo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), mn[0], _mm512_set1_epi32(xs[b][0]));
            __m512i mhi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), mn[0], _mm512_set1_epi32(xs[b][2]));
            mlo = _mm512_dpbusd_epi32(mlo, mn[1], _mm512_set1_epi32(xs[b][1]));
            mhi = _mm512_dpbusd_epi32(mhi, mn[1], _mm512_set1_epi32(xs[b][3]));
            __m512i msum = _mm512_add_epi32(mlo, _mm512_slli_epi32(mhi, 7));
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 2240)));
            __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 2272)));
            __m512 dx = _mm512_set1_ps(xb->d);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, dx), acc);
            acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, dx), acc);
        }
        _mm512_storeu_ps(y + p * QMM_PANEL_ROWS, acc);
    }
}

/* GF(2) affine matrix (vgf2p8affineqb) moving bit `from` of each byte to
 * bit `to`: row `to` of the matrix is byte 7 - to of the qword. */
#define GF_BIT(from, to) ((1ull << (from)) << (8 * (7 - (to))))
#define GF_AFFINE(v, m) _mm512_gf2p8affine_epi64_epi8(v, _mm512_set1_epi64((long long)(m)), 0)
#define GFNI_TARGET VNNI_TARGET ",gfni"

/* q6k_panel_values with GFNI: each value one bit-matrix move (any bits of
 * a byte to any others, the rest zero) and one vpternlogd, where shifts
 * and masks take four instructions; 9 instructions for the four values
 * instead of 17. */
__attribute__((target(GFNI_TARGET), always_inline)) static inline void q6k_panel_values_gfni(__m512i l0, __m512i l1,
                                                                                             __m512i qh, __m512i v[4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const uint64_t high_nibble = GF_BIT(4, 0) | GF_BIT(5, 1) | GF_BIT(6, 2) | GF_BIT(7, 3);
    /* vpternlogd: (a & c) | b is 0xEC, a | (b & c) is 0xF8 */
    v[0] = _mm512_ternarylogic_epi32(l0, GF_AFFINE(qh, GF_BIT(0, 4) | GF_BIT(1, 5)), m4, 0xEC);
    v[1] = _mm512_ternarylogic_epi32(l1, GF_AFFINE(qh, GF_BIT(2, 4) | GF_BIT(3, 5)), m4, 0xEC);
    v[2] = _mm512_ternarylogic_epi32(GF_AFFINE(l0, high_nibble), qh, m30, 0xF8);
    v[3] = _mm512_ternarylogic_epi32(GF_AFFINE(l1, high_nibble), _mm512_srli_epi16(qh, 2), m30, 0xF8);
}

/* Q6_K in panels: a block column is 32 vectors of the low 4 bits (vector
 * 16h + i: bytes 4i.. of ql0 = ql[64h..], 16h + 8 + i: of ql1 = ql[64h +
 * 32..]), 16 of the high 2 bits (8h + i: bytes 4i.. of qh[32h..]), four of
 * the sixteen int8 scales, then the rows' d. Half h, i: four vectors of
 * 6-bit values (ql0/ql1 low and high nibbles with qh's bit pairs, as the
 * one-row kernel) at values 128h + 32v + 4i, sub-block 8h + 2v + i / 4.
 * The offset 32 comes off by starting each sub-block's sum at -32 · (x's
 * sum by 16). VALUES: q6k_panel_values, or its GFNI form. */
#define PANEL_Q6K_FN(NAME, TARGET, VALUES) \
    __attribute__((target(TARGET))) static void NAME(const uint8_t *w, size_t wrow, int64_t n_panels, int32_t k, \
                                                     const void *xq, float *y) \
    { \
        const qmm_q8k *x = xq; \
        const int32_t nb = k / 256; \
        int32_t off[QMM_PANEL_ROW_BYTES / 210][16]; /* -32 · x's sums by 16 */ \
        for (int32_t b = 0; b < nb; b++) \
            for (int j = 0; j < 16; j++) \
                off[b][j] = -32 * x[b].bsums[j]; \
        for (int64_t p = 0; p < n_panels; p++) { \
            const uint8_t *c = w + (size_t)p * QMM_PANEL_ROWS * wrow; \
            __m512 acc = _mm512_setzero_ps(); \
            for (int32_t b = 0; b < nb; b++, c += QMM_PANEL_ROWS * 210) { \
                const qmm_q8k *xb = x + b; \
                __m512i isum = _mm512_setzero_si512(); \
                UNROLLED_FOR (h, 2) { \
                    /* the next column, half of its 53 lines a half */ \
                    UNROLLED_FOR (l, 27) { \
                        _mm_prefetch((const char *)c + QMM_PANEL_ROWS * 210 + 1728 * h + 64 * l, _MM_HINT_T0); \
                        _mm_prefetch((const char *)c + QMM_PANEL_FAR + 1728 * h + 64 * l, _MM_HINT_T1); \
                    } \
                    __m512i sj[8]; \
                    UNROLLED_FOR (j, 8) \
                        sj[j] = _mm512_set1_epi32(off[b][8 * h + j]); \
                    UNROLLED_FOR (i, 8) { \
                        __m512i v[4]; \
                        VALUES(_mm512_loadu_si512((const void *)(c + 64 * (16 * h + i))), \
                               _mm512_loadu_si512((const void *)(c + 64 * (16 * h + 8 + i))), \
                               _mm512_loadu_si512((const void *)(c + 2048 + 64 * (8 * h + i))), v); \
                        UNROLLED_FOR (t, 4) \
                            sj[2 * t + i / 4] = _mm512_dpbusd_epi32(sj[2 * t + i / 4], v[t], \
                                                                    bcast4(xb->q + 128 * h + 32 * t + 4 * i)); \
                    } \
                    /* sub-block 8h + j: its sum · sc_j, sc_j byte j % 4 of scale vector 2h + j / 4 */ \
                    UNROLLED_FOR (j, 8) { \
                        __m512i sv = _mm512_loadu_si512((const void *)(c + 3072 + 64 * (2 * h + j / 4))); \
                        __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(sv, 24 - 8 * (j % 4)), 24); \
                        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(sj[j], sc)); \
                    } \
                } \
                __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(c + 3328))); \
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, _mm512_set1_ps(xb->d)), acc); \
            } \
            _mm512_storeu_ps(y + p * QMM_PANEL_ROWS, acc); \
        } \
    }

PANEL_Q6K_FN(panel_q6_k, VNNI_TARGET, q6k_panel_values)
PANEL_Q6K_FN(panel_q6_k_gfni, GFNI_TARGET, q6k_panel_values_gfni)

/* What the CPU has, asked once (cpuid traps to the hypervisor in a VM):
 * bit 0 AVX2+FMA+F16C, bit 1 AVX-512 VL+BW+VNNI, bit 2 that and GFNI. F16C through cpuid leaf 1
 * (ECX bit 29): clang's __builtin_cpu_supports does not know it. */
static int cpu_features(void)
{
    static _Atomic int cached = -1;
    int f = cached;
    if (f < 0) {
        unsigned a, b, c, d;
        int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __get_cpuid(1, &a, &b, &c, &d) &&
                   (c >> 29 & 1);
        f = avx2 | (avx2 && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vnni"))
                       << 1;
        /* GFNI through cpuid leaf 7 (ECX bit 8), for the same reason */
        if ((f & 2) && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 8 & 1))
            f |= 4;
        cached = f;
    }
    return f;
}
#endif

void kiln_qmm_kernels_pick(const qmm_format *f, const char *isa, int f32_act, qmm_kernels *out)
{
    out->f32_act = f32_act || f->act_block == 0;
    out->quant = quantize_values;
    out->one = out->f32_act ? f32act_c_1 : qdot_c;
    out->four = out->f32_act ? f32act_c_4 : qdot_c_4;
#ifdef QMM_X86
    int feat = cpu_features();
    if (strcmp(isa, "c") == 0 || !(feat & 1))
        return;
    int vnni = strcmp(isa, "avx2") != 0 && (feat & 2);
    if (out->f32_act && f->act_block != 0) {
        out->one = f32act_avx2_1;
        out->four = f32act_avx2_4;
        return;
    }
    const qmm_kernel *k = simd[f - formats];
    if (vnni)
        out->quant = quant_avx512;
    out->one = k[vnni ? 2 : 0];
    out->four = k[vnni ? 3 : 1];
#endif
}

qmm_gemv4_fn kiln_qmm_gemv4_pick(const qmm_format *f, const char *isa, int f32_act)
{
#ifdef QMM_X86
    static _Atomic int vbmi = -1;
    if (vbmi < 0)
        vbmi = (cpu_features() & 2) && __builtin_cpu_supports("avx512vbmi");
    if (f32_act || !vbmi || strcmp(isa, "c") == 0 || strcmp(isa, "avx2") == 0 || strcmp(isa, "avx512") == 0)
        return NULL;
    if (f->type == QMM_Q4_0)
        return gemv4_q4_0;
    if (f->type == QMM_Q4_1)
        return gemv4_q4_1;
#endif
    return NULL;
}

qmm_panel_fn kiln_qmm_panel_pick(const qmm_format *f, const char *isa, int f32_act)
{
#ifdef QMM_X86
    if (f32_act || !(cpu_features() & 2) || strcmp(isa, "c") == 0 || strcmp(isa, "avx2") == 0)
        return NULL;
    if (f->type == QMM_Q8_0)
        return panel_q8_0;
    if (f->type == QMM_Q4_0)
        return panel_q4_0;
    if (f->type == QMM_Q4_1)
        return panel_q4_1;
    if (f->type == QMM_Q4_K)
        return panel_q4_k;
    if (f->type == QMM_Q6_K)
        return (cpu_features() & 4) && strcmp(isa, "avx512") != 0 ? panel_q6_k_gfni : panel_q6_k;
#endif
    return NULL;
}

qmm_gemm_fn kiln_qmm_gemm_pick(const qmm_format *f, const char *isa)
{
#ifdef QMM_X86
    if (f->act_block != 0 && strcmp(isa, "c") != 0 && strcmp(isa, "avx2") != 0 && (cpu_features() & 2))
        return gemm_vnni;
#endif
    return NULL;
}
