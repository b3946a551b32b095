/* Matmul through cuBLASLt: the three tiers are cuBLASLt's kernels, the
 * launch on a stream (mm_launch) and the op entry (cuda_run_matmul), plus
 * the build-time tactic tuner. */
#ifdef KILN_HAVE_CUDA

#include "backend/cuda/cuda_ops.h"
#include "backend/matmul_shape.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define LT_CHECK(who, call) \
    do { \
        cublasStatus_t lt_s_ = (call); \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS) \
            return kiln_fail(KILN_ERROR_BACKEND, "%s: %s failed: cuBLAS status %d (%s:%d)", (who), #call, (int)lt_s_, \
                             __FILE__, __LINE__); \
    } while (0)

/* When an operand's batch offset is b * stride for every batch b (fully
 * batched or fully broadcast), *stride receives it. */
static int mm_uniform(const kiln_matmul_shape *s, const int64_t *st, int64_t *stride)
{
    int64_t inner = 1, unit = -1;
    for (int32_t i = s->nb - 1; i >= 0; i--) {
        if (s->bd[i] != 1) {
            int64_t u = st[i] / inner;
            if (st[i] % inner != 0 || (unit >= 0 && u != unit))
                return 0;
            unit = u;
        }
        inner *= s->bd[i];
    }
    *stride = unit < 0 ? 0 : unit;
    return 1;
}

static cudaDataType_t mm_type(kiln_dtype t)
{
    return t == KILN_DTYPE_F16 ? CUDA_R_16F : t == KILN_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* One cuBLASLt problem: row-major C[m,n] = op(A)·op(B) is computed as the
 * column-major C^T = op(B)^T · op(A)^T, so B is cuBLASLt's first operand.
 * A plan is the problem and the algorithm chosen for it. */
typedef struct mm_plan {
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc; /* lb: kiln's B (first), la: kiln's A */
    cublasLtMatmulAlgo_t algo;
} mm_plan;

/* What a plan depends on; zeroed before filling so that it compares as bytes. */
typedef struct mm_key {
    int64_t m, n, k, lda, ldb, batch, sa, sb, tactic;
    uint64_t ws_size;
    int32_t ta, tb, at, bt, ct;
    uint32_t align[3];
} mm_key;

#define MM_SLOTS 1024 /* plans cached per device */
#define MM_PROBES 8   /* slots tried from a key's hash before one is replaced */
#define MM_TUNED 64   /* tuned problems remembered by a build's tuner */

typedef struct mm_slot {
    int used;
    mm_key key;
    mm_plan plan;
} mm_slot;

/* Tuning results by problem: layers of one shape are timed once. */
typedef struct mm_tuned {
    mm_key key; /* m: the largest m tuned for; tactic unused */
    int64_t tactic;
} mm_tuned;

struct mm_cache {
    pthread_mutex_t lock;
    int32_t n_tuned;
    mm_tuned tuned[MM_TUNED];
    mm_slot slot[MM_SLOTS];
};

kiln_status kiln_cuda_matmul_cache_create(kiln_cuda_device *dev)
{
    struct mm_cache *c = calloc(1, sizeof *c);
    if (!c)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for the cuBLASLt plan cache");
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        free(c);
        return kiln_fail(KILN_ERROR_BACKEND, "cuBLASLt plan cache: pthread_mutex_init failed");
    }
    dev->mm = c;
    return KILN_OK;
}

void kiln_cuda_matmul_cache_destroy(kiln_cuda_device *dev)
{
    if (!dev->mm)
        return;
    pthread_mutex_destroy(&dev->mm->lock);
    free(dev->mm);
    dev->mm = NULL;
}

static uint64_t mm_hash(const mm_key *k)
{
    const unsigned char *b = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static kiln_status mm_layout(const char *name, cublasLtMatrixLayout_t l, cudaDataType_t t, int64_t rows, int64_t cols,
                             int64_t ld, int64_t batch, int64_t stride)
{
    LT_CHECK(name, cublasLtMatrixLayoutInit(l, t, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        int32_t bc = (int32_t)batch;
        LT_CHECK(name, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        LT_CHECK(name, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                        sizeof stride));
    }
    return KILN_OK;
}

/* The alignment, up to 256 bytes, that every address a + k * step keeps. */
static uint32_t mm_align(uintptr_t a, uintptr_t step)
{
    uintptr_t v = a | step | 256u;
    return (uint32_t)(v & (~v + 1u));
}

/* The problem of key k (its m rows of A against B, `batch` problems with
 * the given element strides) into p's descriptor and layouts. */
static kiln_status mm_problem(const char *name, mm_plan *p, const mm_key *k)
{
    kiln_dtype at = (kiln_dtype)k->at, bt = (kiln_dtype)k->bt, ct = (kiln_dtype)k->ct;
    if ((at != bt) || (at == KILN_DTYPE_F32 && ct != KILN_DTYPE_F32) ||
        (at != KILN_DTYPE_F32 && ct != at && ct != KILN_DTYPE_F32))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": matmul of %s and %s into %s is not supported on CUDA",
                         name, kiln_dtype_name(at), kiln_dtype_name(bt), kiln_dtype_name(ct));
    if (k->batch > INT32_MAX)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": matmul batch %lld is too large", name,
                         (long long)k->batch);
    /* exact f32 (no TF32) so results agree with the CPU reference */
    LT_CHECK(name, cublasLtMatmulDescInit(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(name, cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
    LT_CHECK(name, cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
    KILN_TRY(mm_layout(name, &p->lb, mm_type(bt), k->tb ? k->k : k->n, k->tb ? k->n : k->k, k->ldb, k->batch, k->sb));
    KILN_TRY(mm_layout(name, &p->la, mm_type(at), k->ta ? k->m : k->k, k->ta ? k->k : k->m, k->lda, k->batch, k->sa));
    KILN_TRY(mm_layout(name, &p->lc, mm_type(ct), k->n, k->m, k->n, k->batch, k->m * k->n));
    return KILN_OK;
}

/* The heuristic's candidates for p's problem (*found of them, at least one). */
static kiln_status mm_candidates(const char *name, kiln_cuda_device *dev, mm_plan *p, const mm_key *k,
                                 cublasLtMatmulHeuristicResult_t *algos, int *found)
{
    cublasLtMatmulPreferenceOpaque_t pref;
    LT_CHECK(name, cublasLtMatmulPreferenceInit(&pref));
    size_t ws = (size_t)k->ws_size;
    LT_CHECK(name,
             cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* cuBLASLt's A is kiln's B (see mm_plan) */
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k->align[1],
                                                        sizeof k->align[1]));
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &k->align[0],
                                                        sizeof k->align[0]));
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k->align[2],
                                                        sizeof k->align[2]));
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k->align[2],
                                                        sizeof k->align[2]));
    *found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(dev->lt, &p->desc, &p->lb, &p->la, &p->lc, &p->lc, &pref,
                                                       KILN_CUDA_MATMUL_CANDIDATES, algos, found);
    if (hs != CUBLAS_STATUS_SUCCESS || *found < 1)
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "layer \"%s\": cuBLASLt has no algorithm for this %s matmul (status %d)", name,
                         kiln_dtype_name((kiln_dtype)k->at), (int)hs);
    return KILN_OK;
}

/* Bucket of m rows (cuda_backend.h): the b with 2^(b-1) < m <= 2^b. */
static int32_t mm_bucket(int64_t m)
{
    int32_t b = 0;
    while (b < KILN_CUDA_TACTIC_BUCKETS - 1 && ((int64_t)1 << b) < m)
        b++;
    return b;
}

/* The tuned candidate of k's bucket, when k->tactic names one and
 * cuBLASLt accepts it for k's own m. */
static int mm_tuned_algo(const char *name, kiln_cuda_device *dev, mm_plan *p, const mm_key *k,
                         cublasLtMatmulAlgo_t *algo)
{
    if (k->tactic < 0 || !(k->tactic & KILN_CUDA_TACTIC_TUNED))
        return 0;
    int32_t b = mm_bucket(k->m);
    int idx = (int)((k->tactic >> (4 * b)) & 15);
    if (idx == KILN_CUDA_TACTIC_DEFAULT)
        return 0;
    mm_key kb = *k;
    kb.m = (int64_t)1 << b;
    mm_plan pb;
    cublasLtMatmulHeuristicResult_t algos[KILN_CUDA_MATMUL_CANDIDATES];
    int found = 0;
    if (mm_problem(name, &pb, &kb) != KILN_OK || mm_candidates(name, dev, &pb, &kb, algos, &found) != KILN_OK ||
        idx >= found)
        return 0;
    cublasLtMatmulHeuristicResult_t check;
    memset(&check, 0, sizeof check);
    if (cublasLtMatmulAlgoCheck(dev->lt, &p->desc, &p->lb, &p->la, &p->lc, &p->lc, &algos[idx].algo, &check) !=
            CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > k->ws_size)
        return 0;
    *algo = algos[idx].algo;
    return 1;
}

/* The plan of key k, from the device's cache or made (and cached) now. */
static kiln_status mm_plan_get(const char *name, kiln_cuda_device *dev, const mm_key *k, mm_plan *out)
{
    struct mm_cache *c = dev->mm;
    uint64_t h = mm_hash(k);
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < MM_PROBES; i++) {
        mm_slot *sl = &c->slot[(h + (uint64_t)i) % MM_SLOTS];
        if (sl->used && memcmp(&sl->key, k, sizeof *k) == 0) {
            *out = sl->plan;
            pthread_mutex_unlock(&c->lock);
            return KILN_OK;
        }
    }
    pthread_mutex_unlock(&c->lock);
    mm_plan p;
    KILN_TRY(mm_problem(name, &p, k));
    if (!mm_tuned_algo(name, dev, &p, k, &p.algo)) {
        cublasLtMatmulHeuristicResult_t algos[KILN_CUDA_MATMUL_CANDIDATES];
        int found = 0;
        KILN_TRY(mm_candidates(name, dev, &p, k, algos, &found));
        p.algo = algos[0].algo;
    }
    pthread_mutex_lock(&c->lock);
    mm_slot *dst = &c->slot[h % MM_SLOTS];
    for (int i = 0; i < MM_PROBES; i++) {
        mm_slot *sl = &c->slot[(h + (uint64_t)i) % MM_SLOTS];
        if (!sl->used) {
            dst = sl;
            break;
        }
    }
    dst->used = 1;
    dst->key = *k;
    dst->plan = p;
    pthread_mutex_unlock(&c->lock);
    *out = p;
    return KILN_OK;
}

/* The key of s's problem at m rows, `batch` problems `sa`/`sb` apart. */
static mm_key mm_key_of(const kiln_matmul_shape *s, int64_t m, kiln_dtype at, kiln_dtype bt, kiln_dtype ct,
                        int64_t batch, int64_t sa, int64_t sb, const uint32_t *align, int64_t tactic, size_t ws_size)
{
    mm_key k;
    memset(&k, 0, sizeof k);
    k.m = m, k.n = s->n, k.k = s->k, k.lda = s->lda, k.ldb = s->ldb;
    k.batch = batch, k.sa = sa, k.sb = sb, k.tactic = tactic, k.ws_size = ws_size;
    k.ta = s->ta, k.tb = s->tb, k.at = (int32_t)at, k.bt = (int32_t)bt, k.ct = (int32_t)ct;
    memcpy(k.align, align, sizeof k.align);
    return k;
}

static kiln_status mm_launch(const char *name, kiln_cuda_device *dev, mm_plan *p, const void *A, const void *B, void *C,
                             void *ws, size_t ws_size, cudaStream_t stream)
{
    const float one = 1.0f, zero = 0.0f;
    LT_CHECK(name, cublasLtMatmul(dev->lt, &p->desc, &one, B, &p->lb, A, &p->la, &zero, C, &p->lc, C, &p->lc, &p->algo,
                                  ws, ws_size, stream));
    return KILN_OK;
}

/* Whether s runs as one tall GEMM (B shared, A's batches contiguous);
 * *sa receives A's batch stride. */
static int mm_folds(const kiln_matmul_shape *s, int64_t *sa)
{
    return s->b_batches == 1 && !s->ta && s->a_batches == s->batches && mm_uniform(s, s->as, sa) &&
           (s->batches == 1 || *sa == s->m * s->k);
}

kiln_status cuda_run_matmul(const kiln_cuda_args *a)
{
    const char *name = layer_name(a);
    if (a->layer->n_inputs != 2 || a->layer->n_outputs != 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "layer \"%s\": matmul needs 2 inputs, 1 output", name);
    const kiln_exec_tensor *A = &a->inputs[0], *B = &a->inputs[1], *C = &a->outputs[0];
    if (!kiln_dtype_is_float(A->dtype) || !kiln_dtype_is_float(B->dtype) || !kiln_dtype_is_float(C->dtype))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": matmul of %s and %s into %s", name,
                         kiln_dtype_name(A->dtype), kiln_dtype_name(B->dtype), kiln_dtype_name(C->dtype));
    kiln_matmul_shape s;
    KILN_TRY(kiln_matmul_shape_init(name, a->layer, &A->dims, &B->dims, &C->dims, &s));
    if (s.batches == 0 || s.m == 0 || s.n == 0)
        return KILN_OK;
    cudaStream_t stream = (cudaStream_t)a->stream;
    if (s.k == 0) {
        CU_CHECK(name,
                 cudaMemsetAsync(C->data, 0, (size_t)(s.batches * s.m * s.n) * kiln_dtype_size(C->dtype), stream));
        return KILN_OK;
    }
    /* A few rows against a weight stored [N, K]: a pass over the weight,
     * which the GEMV kernel streams closer to the memory's rate than
     * cuBLASLt's tiles (bench: decode matmul). KILN_CUDA_GEMV=0 turns it off. */
    if (s.tb && !s.ta && s.batches == 1 && A->dtype == B->dtype && a->device->gemv &&
        kcu_gemv_supported((int32_t)s.m, (int32_t)B->dtype, (int32_t)C->dtype, A->data, s.lda, B->data, C->data, s.n,
                           s.n, s.k)) {
        CU_CHECK(name, (cudaError_t)kcu_gemv((int32_t)s.m, (int32_t)B->dtype, (int32_t)C->dtype, A->data, s.lda,
                                             B->data, C->data, s.n, s.n, s.k, stream));
        return KILN_OK;
    }
    size_t ae = kiln_dtype_size(A->dtype), be = kiln_dtype_size(B->dtype), ce = kiln_dtype_size(C->dtype);
    int64_t sa = 0, sb = 0;
    int64_t tactic = a->layer->tactic;
    /* the context's own workspace when the plan gave the layer one, so
     * contexts on different streams never share cuBLASLt scratch */
    void *ws = a->device->lt_workspace;
    size_t ws_size = KILN_CUDA_CUBLASLT_WORKSPACE;
    if (a->workspace && a->layer->workspace > 0) {
        ws = a->workspace;
        ws_size = a->layer->workspace;
    }
    uintptr_t astep = 0, bstep = 0;
    for (int32_t i = 0; i < s.nb; i++) {
        astep |= (uintptr_t)s.as[i] * ae;
        bstep |= (uintptr_t)s.bs[i] * be;
    }
    const uint32_t align[3] = {mm_align((uintptr_t)A->data, astep), mm_align((uintptr_t)B->data, bstep),
                               mm_align((uintptr_t)C->data, (uintptr_t)(s.m * s.n) * ce)};
    mm_plan p;
    mm_key k;
    if (mm_folds(&s, &sa)) {
        /* B shared and A's batches contiguous: one tall GEMM */
        k = mm_key_of(&s, s.batches * s.m, A->dtype, B->dtype, C->dtype, 1, 0, 0, align, tactic, ws_size);
        KILN_TRY(mm_plan_get(name, a->device, &k, &p));
        return mm_launch(name, a->device, &p, A->data, B->data, C->data, ws, ws_size, stream);
    }
    if (mm_uniform(&s, s.as, &sa) && mm_uniform(&s, s.bs, &sb)) {
        k = mm_key_of(&s, s.m, A->dtype, B->dtype, C->dtype, s.batches, sa, sb, align, tactic, ws_size);
        KILN_TRY(mm_plan_get(name, a->device, &k, &p));
        return mm_launch(name, a->device, &p, A->data, B->data, C->data, ws, ws_size, stream);
    }
    k = mm_key_of(&s, s.m, A->dtype, B->dtype, C->dtype, 1, 0, 0, align, tactic, ws_size);
    KILN_TRY(mm_plan_get(name, a->device, &k, &p));
    for (int64_t b = 0; b < s.batches; b++) {
        int64_t ao, bo;
        kiln_matmul_batch_offsets(&s, b, &ao, &bo);
        KILN_TRY(mm_launch(name, a->device, &p, (const char *)A->data + (size_t)ao * ae,
                           (const char *)B->data + (size_t)bo * be, (char *)C->data + (size_t)(b * s.m * s.n) * ce, ws,
                           ws_size, stream));
    }
    return KILN_OK;
}

#define TUNE_REPS 5

/* Times candidate `i` of key k's problem (operands da, db, dc): the
 * milliseconds of TUNE_REPS launches after one warm-up, or -1 when it
 * does not run. */
static float tune_time(kiln_cuda_device *dev, const mm_plan *pp, const cublasLtMatmulAlgo_t *algo, const void *da,
                       const void *db, void *dc, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1)
{
    mm_plan p = *pp;
    p.algo = *algo;
    if (mm_launch("tuning", dev, &p, da, db, dc, dev->lt_workspace, KILN_CUDA_CUBLASLT_WORKSPACE, stream) != KILN_OK)
        return -1.0f;
    cudaError_t e = cudaEventRecord(e0, stream);
    for (int r = 0; r < TUNE_REPS && e == cudaSuccess; r++)
        if (mm_launch("tuning", dev, &p, da, db, dc, dev->lt_workspace, KILN_CUDA_CUBLASLT_WORKSPACE, stream) !=
            KILN_OK)
            e = cudaErrorLaunchFailure;
    if (e == cudaSuccess)
        e = cudaEventRecord(e1, stream);
    if (e == cudaSuccess)
        e = cudaEventSynchronize(e1);
    float ms = 0.0f;
    if (e == cudaSuccess)
        e = cudaEventElapsedTime(&ms, e0, e1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaStreamSynchronize(stream);
        return -1.0f;
    }
    return ms;
}

kiln_status kiln_cuda_matmul_tune(kiln_cuda_device *dev, const kiln_layer *layer, const kiln_exec_tensor *a,
                                  const kiln_exec_tensor *b, const kiln_exec_tensor *c, int64_t *tactic)
{
    const char *name = layer && layer->name ? layer->name : "?";
    if (!dev || !layer || !a || !b || !c || !tactic)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_matmul_tune: missing argument");
    kiln_matmul_shape s;
    KILN_TRY(kiln_matmul_shape_init(name, layer, &a->dims, &b->dims, &c->dims, &s));
    *tactic = -1;
    int64_t sa = 0;
    /* only the tall-GEMM form is tuned: its buckets are the m it runs at */
    if (s.batches == 0 || s.m == 0 || s.n == 0 || s.k == 0 || !mm_folds(&s, &sa))
        return KILN_OK;
    const int64_t m_top = s.batches * s.m;
    const int32_t top = mm_bucket(m_top);
    const uint32_t align[3] = {256, 256, 256}; /* cudaMalloc'd scratch, as arena tensors usually are */
    mm_key key = mm_key_of(&s, m_top, a->dtype, b->dtype, c->dtype, 1, 0, 0, align, -1, KILN_CUDA_CUBLASLT_WORKSPACE);
    for (int32_t i = 0; i < dev->mm->n_tuned; i++)
        if (memcmp(&dev->mm->tuned[i].key, &key, sizeof key) == 0) {
            *tactic = dev->mm->tuned[i].tactic;
            return KILN_OK;
        }
    /* the GEMV kernel takes these buckets when the layer qualifies
     * (arena tensors are aligned: only the strides matter) */
    const int gemv = s.tb && s.batches == 1 && a->dtype == b->dtype &&
                     kcu_gemv_supported(1, (int32_t)b->dtype, (int32_t)c->dtype, (const void *)(uintptr_t)256, s.lda,
                                        (const void *)(uintptr_t)256, NULL, s.n, s.n, s.k);
    const int64_t m_max = (int64_t)1 << top;
    size_t ab = (size_t)(m_max * s.lda) * kiln_dtype_size(a->dtype);
    size_t bb = (size_t)kiln_exec_count(&b->dims) * kiln_dtype_size(b->dtype);
    size_t cb = (size_t)(m_max * s.n) * kiln_dtype_size(c->dtype);
    void *da = NULL, *db = NULL, *dc = NULL;
    cudaStream_t stream = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    kiln_status st = KILN_OK;
    cudaError_t e = cudaMalloc(&da, ab);
    if (e == cudaSuccess)
        e = cudaMalloc(&db, bb);
    if (e == cudaSuccess)
        e = cudaMalloc(&dc, cb);
    /* not zeros: the tensor cores run measurably faster on them */
    if (e == cudaSuccess)
        e = cudaMemset(da, 0x3c, ab);
    if (e == cudaSuccess)
        e = cudaMemset(db, 0x3b, bb);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaEventCreate(&e0);
    if (e == cudaSuccess)
        e = cudaEventCreate(&e1);
    if (e != cudaSuccess) {
        st = kiln_fail(KILN_ERROR_BACKEND, "layer \"%s\": tuning setup failed: %s", name, cudaGetErrorString(e));
        goto done;
    }
    int64_t t = KILN_CUDA_TACTIC_TUNED;
    for (int32_t bk = 0; bk < KILN_CUDA_TACTIC_BUCKETS; bk++) {
        int64_t nib = KILN_CUDA_TACTIC_DEFAULT;
        if (bk <= top && !(gemv && ((int64_t)1 << bk) <= KCU_GEMV_MAX_M)) {
            mm_key kb = key;
            kb.m = (int64_t)1 << bk;
            mm_plan p;
            cublasLtMatmulHeuristicResult_t algos[KILN_CUDA_MATMUL_CANDIDATES];
            int found = 0;
            st = mm_problem(name, &p, &kb);
            if (st == KILN_OK)
                st = mm_candidates(name, dev, &p, &kb, algos, &found);
            if (st != KILN_OK)
                goto done;
            float best = -1.0f;
            for (int i = 0; i < found; i++) {
                float ms = tune_time(dev, &p, &algos[i].algo, da, db, dc, stream, e0, e1);
                if (ms >= 0.0f && (best < 0.0f || ms < best)) {
                    best = ms;
                    nib = i;
                }
            }
            if (best < 0.0f) {
                st = kiln_fail(KILN_ERROR_BACKEND, "layer \"%s\": no cuBLASLt candidate ran at m = %lld", name,
                               (long long)kb.m);
                goto done;
            }
        }
        t |= nib << (4 * bk);
    }
    *tactic = t;
    if (dev->mm->n_tuned < MM_TUNED) {
        dev->mm->tuned[dev->mm->n_tuned].key = key;
        dev->mm->tuned[dev->mm->n_tuned++].tactic = t;
    }
done:
    if (stream)
        cudaStreamSynchronize(stream);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (stream)
        cudaStreamDestroy(stream);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    return st;
}

#endif
