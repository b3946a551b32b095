/* Matmul: C = op(A) · op(B) over the last two axes, batch axes broadcast.
 *
 * Fast path: OpenBLAS sgemm on f32 (f16/bf16 operands are widened into
 * scratch first). When B has no batch of its own and A is not transposed,
 * the batches of A are rows of one tall GEMM, which is the shape of every
 * linear layer, cut into tiles of rows (or columns) spread across the
 * pool; batches otherwise are spread across the pool, one sgemm each.
 * OpenBLAS itself runs single-threaded (blas_single). Reference path: naive loops, f64 sums. */
#include "backend/cpu/cpu_internal.h"
#include "backend/matmul_shape.h"

#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

/* ---- reference ------------------------------------------------------------------------ */

static void mm_reference(const kiln_cpu_args *a, const kiln_matmul_shape *s)
{
    const kiln_exec_tensor *A = &a->inputs[0], *B = &a->inputs[1], *C = &a->outputs[0];
    for (int64_t b = 0; b < s->batches; b++) {
        int64_t ao, bo;
        kiln_matmul_batch_offsets(s, b, &ao, &bo);
        for (int64_t i = 0; i < s->m; i++)
            for (int64_t j = 0; j < s->n; j++) {
                double acc = 0.0;
                for (int64_t p = 0; p < s->k; p++) {
                    int64_t ia = ao + (s->ta ? p * s->lda + i : i * s->lda + p);
                    int64_t ib = bo + (s->tb ? j * s->ldb + p : p * s->ldb + j);
                    acc += (double)kiln_load_f32(A->data, A->dtype, ia) * (double)kiln_load_f32(B->data, B->dtype, ib);
                }
                kiln_store_f32(C->data, C->dtype, (b * s->m + i) * s->n + j, (float)acc);
            }
    }
}

/* ---- few rows against a whole weight matrix ---------------------------------------------
 * Decode steps multiply one (or a few) rows by a large B. That is bound by
 * reading B once, so B is read in its storage dtype and widened a block at
 * a time instead of being copied to f32 first, and the output columns are
 * split across the pool. */

#define MM_FEW_ROWS 8

typedef struct gemv_job {
    const kiln_matmul_shape *s;
    int64_t m;      /* rows of A, batches folded */
    const float *a; /* [m, k] */
    const void *b;  /* [k, n], or [n, k] when s->tb */
    kiln_dtype bt;
    float *c; /* [m, n] */
} gemv_job;

static const float *widen_block(float *buf, const void *src, kiln_dtype t, int64_t off, int64_t n)
{
    if (t == KILN_DTYPE_F32)
        return (const float *)src + off;
    cpu_widen(buf, (const uint16_t *)src + off, t, n);
    return buf;
}

CPU_SIMD static float dot_f32(const float *x, const float *y, int64_t n)
{
    cpu_v8 s0 = {0}, s1 = {0}, a, b, c, d;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        cpu_ld8(a, x + i);
        cpu_ld8(b, y + i);
        cpu_ld8(c, x + i + 8);
        cpu_ld8(d, y + i + 8);
        s0 += a * b;
        s1 += c * d;
    }
    for (; i + 8 <= n; i += 8) {
        cpu_ld8(a, x + i);
        cpu_ld8(b, y + i);
        s0 += a * b;
    }
    s0 += s1;
    float t = ((s0[0] + s0[1]) + (s0[2] + s0[3])) + ((s0[4] + s0[5]) + (s0[6] + s0[7]));
    for (; i < n; i++)
        t += x[i] * y[i];
    return t;
}

/* Dot products straight from f16/bf16 weights: widening in registers saves
 * a store and reload of every weight on the decode path. */
CPU_SIMD static float dot_bf16(const float *x, const uint16_t *w, int64_t n)
{
    cpu_v8 s0 = {0}, s1 = {0}, a, b, c, d;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        cpu_ld8(a, x + i);
        cpu_ld8(c, x + i + 8);
        cpu_bf16x8((float *)&b, w + i);
        cpu_bf16x8((float *)&d, w + i + 8);
        s0 += a * b;
        s1 += c * d;
    }
    s0 += s1;
    float t = ((s0[0] + s0[1]) + (s0[2] + s0[3])) + ((s0[4] + s0[5]) + (s0[6] + s0[7]));
    for (; i < n; i++)
        t += x[i] * kiln_bf16_to_f32(w[i]);
    return t;
}

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) static float dot_f16_f16c(const float *x, const uint16_t *w, int64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i)));
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8)));
        s0 = _mm256_add_ps(s0, _mm256_mul_ps(_mm256_loadu_ps(x + i), b));
        s1 = _mm256_add_ps(s1, _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), d));
    }
    float l[8];
    _mm256_storeu_ps(l, _mm256_add_ps(s0, s1));
    float t = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; i < n; i++)
        t += x[i] * kiln_f16_to_f32(w[i]);
    return t;
}
#endif

CPU_SIMD static void axpy_f32(float *acc, float a, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        cpu_v8 u, v;
        cpu_ld8(u, acc + i);
        cpu_ld8(v, x + i);
        u += a * v;
        cpu_st8(acc + i, u);
    }
    for (; i < n; i++)
        acc[i] += a * x[i];
}

/* B stored [n, k]: each output column is a dot product with a row of B. */
static void gemv_rows_of_b(void *p, int64_t begin, int64_t end)
{
    const gemv_job *j = p;
    int64_t k = j->s->k, n = j->s->n;
    float buf[KILN_CPU_BLOCK];
    int direct = j->bt == KILN_DTYPE_BF16;
#if defined(__x86_64__)
    int f16c = j->bt == KILN_DTYPE_F16 && cpu_have_f16c();
    direct |= f16c;
#endif
    if (direct) {
        for (int64_t col = begin; col < end; col++) {
            const uint16_t *w = (const uint16_t *)j->b + col * k;
            for (int64_t r = 0; r < j->m; r++) {
#if defined(__x86_64__)
                if (f16c) {
                    j->c[r * n + col] = dot_f16_f16c(j->a + r * k, w, k);
                    continue;
                }
#endif
                j->c[r * n + col] = dot_bf16(j->a + r * k, w, k);
            }
        }
        return;
    }
    for (int64_t col = begin; col < end; col++) {
        float acc[MM_FEW_ROWS] = {0};
        for (int64_t k0 = 0; k0 < k; k0 += KILN_CPU_BLOCK) {
            int64_t len = k - k0 < KILN_CPU_BLOCK ? k - k0 : KILN_CPU_BLOCK;
            const float *w = widen_block(buf, j->b, j->bt, col * k + k0, len);
            for (int64_t r = 0; r < j->m; r++)
                acc[r] += dot_f32(j->a + r * k + k0, w, len);
        }
        for (int64_t r = 0; r < j->m; r++)
            j->c[r * n + col] = acc[r];
    }
}

/* B stored [k, n]: a block of output columns accumulates k scaled rows. */
static void gemv_cols_of_b(void *p, int64_t begin, int64_t end)
{
    const gemv_job *j = p;
    int64_t k = j->s->k, n = j->s->n;
    float buf[KILN_CPU_BLOCK], acc[MM_FEW_ROWS][KILN_CPU_BLOCK];
    for (int64_t blk = begin; blk < end; blk++) {
        int64_t n0 = blk * KILN_CPU_BLOCK, len = n - n0 < KILN_CPU_BLOCK ? n - n0 : KILN_CPU_BLOCK;
        for (int64_t r = 0; r < j->m; r++)
            memset(acc[r], 0, (size_t)len * sizeof(float));
        for (int64_t kk = 0; kk < k; kk++) {
            const float *w = widen_block(buf, j->b, j->bt, kk * n + n0, len);
            for (int64_t r = 0; r < j->m; r++)
                axpy_f32(acc[r], j->a[r * k + kk], w, len);
        }
        for (int64_t r = 0; r < j->m; r++)
            memcpy(j->c + r * n + n0, acc[r], (size_t)len * sizeof(float));
    }
}

/* ---- fast path ----------------------------------------------------------------------------- */

typedef struct mm_job {
    const kiln_matmul_shape *s;
    const float *a, *b;
    float *c;
} mm_job;

static void mm_gemm(const kiln_matmul_shape *s, int64_t m, const float *a, const float *b, float *c)
{
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, (int)m, (int)s->n,
                (int)s->k, 1.0f, a, (int)s->lda, b, (int)s->ldb, 0.0f, c, (int)s->n);
}

/* OpenBLAS runs single-threaded and kiln's pool splits each GEMM into
 * tiles, every thread calling sgemm on its own: --threads then bounds all
 * the work, and no second set of threads (OpenBLAS's spin while they wait)
 * competes with the pool's. Measured on this project's 2-core VM (f32
 * SmolLM2-135M engine, 512-token prefill, four alternating runs under the
 * load of other builds): medians of about 1100 tok/s split by the pool
 * against 290 with OpenBLAS's own two threads. OpenBLAS's count is
 * process-wide. */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void blas_single(void) { openblas_set_num_threads(1); }

/* A tile: MM_TILE_ROWS rows of C, or, when there are too few rows to give
 * every thread some, MM_TILE_COLS columns. */
#define MM_TILE_ROWS 16
#define MM_TILE_COLS 64

typedef struct mm_tiles {
    const kiln_matmul_shape *s;
    int64_t m; /* rows of A (batches folded); A is not transposed */
    const float *a, *b;
    float *c;
    int by_rows;
} mm_tiles;

static void mm_tile_run(void *p, int64_t begin, int64_t end)
{
    const mm_tiles *t = p;
    const kiln_matmul_shape *s = t->s;
    CBLAS_TRANSPOSE tb = s->tb ? CblasTrans : CblasNoTrans;
    if (t->by_rows) {
        int64_t r0 = begin * MM_TILE_ROWS, r1 = end * MM_TILE_ROWS < t->m ? end * MM_TILE_ROWS : t->m;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, (int)(r1 - r0), (int)s->n, (int)s->k, 1.0f, t->a + r0 * s->lda,
                    (int)s->lda, t->b, (int)s->ldb, 0.0f, t->c + r0 * s->n, (int)s->n);
    } else {
        int64_t n0 = begin * MM_TILE_COLS, n1 = end * MM_TILE_COLS < s->n ? end * MM_TILE_COLS : s->n;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, (int)t->m, (int)(n1 - n0), (int)s->k, 1.0f, t->a, (int)s->lda,
                    s->tb ? t->b + n0 * s->ldb : t->b + n0, (int)s->ldb, 0.0f, t->c + n0, (int)s->n);
    }
}

static void mm_batches(void *p, int64_t begin, int64_t end)
{
    const mm_job *j = p;
    for (int64_t b = begin; b < end; b++) {
        int64_t ao, bo;
        kiln_matmul_batch_offsets(j->s, b, &ao, &bo);
        mm_gemm(j->s, j->s->m, j->a + ao, j->b + bo, j->c + b * j->s->m * j->s->n);
    }
}

/* The operand as f32: in place, or widened into *scratch. */
static kiln_status mm_as_f32(const kiln_cpu_args *a, const kiln_exec_tensor *t, float **scratch, const float **out)
{
    if (t->dtype == KILN_DTYPE_F32) {
        *out = t->data;
        return KILN_OK;
    }
    int64_t n = kiln_exec_count(&t->dims);
    *scratch = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!*scratch)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\": out of memory widening a matmul operand",
                         cpu_layer_name(a));
    cpu_convert(cpu_pool(a), *scratch, KILN_DTYPE_F32, t->data, t->dtype, n);
    *out = *scratch;
    return KILN_OK;
}

static kiln_status mm_fast(const kiln_cpu_args *a, const kiln_matmul_shape *s)
{
    const char *name = cpu_layer_name(a);
    if (s->m > INT_MAX || s->n > INT_MAX || s->k > INT_MAX || s->lda > INT_MAX || s->ldb > INT_MAX ||
        s->batches * s->m > INT_MAX)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": matmul dims exceed the BLAS int range", name);
    const kiln_exec_tensor *C = &a->outputs[0];
    int64_t c_count = s->batches * s->m * s->n;
    /* B is shared by every batch and A's batches are contiguous rows. */
    int fold = s->b_batches == 1 && !s->ta && s->a_batches == s->batches;
    /* Measured on AVX2: the direct kernel beats OpenBLAS up to 4 f32 rows;
     * for f16/bf16 B it also saves widening all of B. */
    int64_t rows = s->batches * s->m;
    int few_rows = fold && (a->inputs[1].dtype == KILN_DTYPE_F32 ? rows <= 4 : rows <= MM_FEW_ROWS);
    float *sa = NULL, *sb = NULL, *sc = NULL;
    const float *fa, *fb = NULL;
    kiln_status st = mm_as_f32(a, &a->inputs[0], &sa, &fa);
    if (st == KILN_OK && !few_rows)
        st = mm_as_f32(a, &a->inputs[1], &sb, &fb);
    float *fc = C->data;
    if (st == KILN_OK && C->dtype != KILN_DTYPE_F32) {
        fc = sc = malloc((size_t)(c_count > 0 ? c_count : 1) * sizeof(float));
        if (!sc)
            st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "layer \"%s\": out of memory for the matmul result", name);
    }
    if (st != KILN_OK)
        goto done;

    if (s->k == 0) {
        memset(fc, 0, (size_t)c_count * sizeof(float));
    } else if (few_rows) {
        gemv_job j = {
            .s = s, .m = s->batches * s->m, .a = fa, .b = a->inputs[1].data, .bt = a->inputs[1].dtype, .c = fc};
        kiln_threadpool *pool = s->n * s->k < KILN_CPU_PARALLEL_MIN ? NULL : cpu_pool(a);
        if (s->tb)
            kiln_threadpool_run(pool, s->n, gemv_rows_of_b, &j);
        else
            kiln_threadpool_run(pool, (s->n + KILN_CPU_BLOCK - 1) / KILN_CPU_BLOCK, gemv_cols_of_b, &j);
    } else if (fold) {
        pthread_once(&blas_once, blas_single);
        kiln_threadpool *pool = cpu_pool(a);
        mm_tiles t = {.s = s, .m = s->batches * s->m, .a = fa, .b = fb, .c = fc};
        t.by_rows = t.m >= 2 * MM_TILE_ROWS * kiln_threadpool_size(pool);
        int64_t tiles = t.by_rows ? (t.m + MM_TILE_ROWS - 1) / MM_TILE_ROWS : (s->n + MM_TILE_COLS - 1) / MM_TILE_COLS;
        kiln_threadpool_run(pool, tiles, mm_tile_run, &t);
    } else {
        pthread_once(&blas_once, blas_single);
        mm_job j = {.s = s, .a = fa, .b = fb, .c = fc};
        kiln_threadpool_run(cpu_pool(a), s->batches, mm_batches, &j);
    }
    if (sc && st == KILN_OK)
        cpu_convert(cpu_pool(a), C->data, C->dtype, sc, KILN_DTYPE_F32, c_count);
done:
    free(sa);
    free(sb);
    free(sc);
    return st;
}

kiln_status cpu_run_matmul(const kiln_cpu_args *a)
{
    const char *name = cpu_layer_name(a);
    if (a->layer->n_inputs != 2 || a->layer->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": matmul needs 2 inputs, 1 output", name);
    if (!kiln_dtype_is_float(a->inputs[0].dtype) || !kiln_dtype_is_float(a->inputs[1].dtype) ||
        !kiln_dtype_is_float(a->outputs[0].dtype))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": matmul of %s and %s into %s", name,
                         kiln_dtype_name(a->inputs[0].dtype), kiln_dtype_name(a->inputs[1].dtype),
                         kiln_dtype_name(a->outputs[0].dtype));
    kiln_matmul_shape s;
    KILN_TRY(kiln_matmul_shape_init(cpu_layer_name(a), a->layer, &a->inputs[0].dims, &a->inputs[1].dims,
                                    &a->outputs[0].dims, &s));
    if (s.batches == 0 || s.m == 0 || s.n == 0)
        return KILN_OK;
    if (a->reference) {
        mm_reference(a, &s);
        return KILN_OK;
    }
    return mm_fast(a, &s);
}
