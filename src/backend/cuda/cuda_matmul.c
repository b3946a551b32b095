/* Matmul through cuBLASLt: the three tiers are cuBLASLt's kernels, the
 * launch on a stream (mm_launch) and the op entry (cuda_run_matmul), plus
 * the build-time tactic tuner. */
#ifdef KILN_HAVE_CUDA

#include "backend/cuda/cuda_ops.h"
#include "backend/matmul_shape.h"

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
 * column-major C^T = op(B)^T · op(A)^T, so B is cuBLASLt's first operand. */
typedef struct mm_plan {
    void *ws; /* cuBLASLt workspace and its size */
    size_t ws_size;
    cublasLtMatmulDescOpaque_t desc;
    cublasLtMatrixLayoutOpaque_t la, lb, lc; /* lb: kiln's B (first), la: kiln's A */
    int32_t n_algos;
    cublasLtMatmulHeuristicResult_t algos[KILN_CUDA_MATMUL_CANDIDATES];
} mm_plan;

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

/* m rows of A against B, `batch` problems with the given element strides;
 * `align` holds the byte alignment of A, B and C as launched (cuBLASLt's
 * heuristic otherwise assumes 256 and may pick kernels that need it). */
static kiln_status mm_plan_init(const char *name, kiln_cuda_device *dev, mm_plan *p, const kiln_matmul_shape *s,
                                int64_t m, kiln_dtype at, kiln_dtype bt, kiln_dtype ct, int64_t batch, int64_t sa,
                                int64_t sb, const uint32_t *align)
{
    if ((at != bt) || (at == KILN_DTYPE_F32 && ct != KILN_DTYPE_F32) ||
        (at != KILN_DTYPE_F32 && ct != at && ct != KILN_DTYPE_F32))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": matmul of %s and %s into %s is not supported on CUDA",
                         name, kiln_dtype_name(at), kiln_dtype_name(bt), kiln_dtype_name(ct));
    if (batch > INT32_MAX)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "layer \"%s\": matmul batch %lld is too large", name,
                         (long long)batch);
    /* exact f32 (no TF32) so results agree with the CPU reference */
    LT_CHECK(name, cublasLtMatmulDescInit(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opb = s->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = s->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(name, cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof opb));
    LT_CHECK(name, cublasLtMatmulDescSetAttribute(&p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof opa));
    KILN_TRY(mm_layout(name, &p->lb, mm_type(bt), s->tb ? s->k : s->n, s->tb ? s->n : s->k, s->ldb, batch, sb));
    KILN_TRY(mm_layout(name, &p->la, mm_type(at), s->ta ? m : s->k, s->ta ? s->k : m, s->lda, batch, sa));
    KILN_TRY(mm_layout(name, &p->lc, mm_type(ct), s->n, m, s->n, batch, m * s->n));
    cublasLtMatmulPreferenceOpaque_t pref;
    LT_CHECK(name, cublasLtMatmulPreferenceInit(&pref));
    size_t ws = p->ws_size;
    LT_CHECK(name,
             cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* cuBLASLt's A is kiln's B (see mm_plan) */
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[1],
                                                        sizeof align[1]));
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[0],
                                                        sizeof align[0]));
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2],
                                                        sizeof align[2]));
    LT_CHECK(name, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2],
                                                        sizeof align[2]));
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(dev->lt, &p->desc, &p->lb, &p->la, &p->lc, &p->lc, &pref,
                                                       KILN_CUDA_MATMUL_CANDIDATES, p->algos, &found);
    if (hs != CUBLAS_STATUS_SUCCESS || found < 1)
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "layer \"%s\": cuBLASLt has no algorithm for this %s matmul (status %d)", name,
                         kiln_dtype_name(at), (int)hs);
    p->n_algos = found;
    return KILN_OK;
}

static kiln_status mm_launch(const char *name, kiln_cuda_device *dev, mm_plan *p, int32_t algo, const void *A,
                             const void *B, void *C, cudaStream_t stream)
{
    const float one = 1.0f, zero = 0.0f;
    LT_CHECK(name, cublasLtMatmul(dev->lt, &p->desc, &one, B, &p->lb, A, &p->la, &zero, C, &p->lc, C, &p->lc,
                                  &p->algos[algo].algo, p->ws, p->ws_size, stream));
    return KILN_OK;
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
    mm_plan p;
    int64_t tactic = a->layer->tactic;
    /* the context's own workspace when the plan gave the layer one, so
     * contexts on different streams never share cuBLASLt scratch */
    if (a->workspace && a->layer->workspace > 0) {
        p.ws = a->workspace;
        p.ws_size = a->layer->workspace;
    } else {
        p.ws = a->device->lt_workspace;
        p.ws_size = KILN_CUDA_CUBLASLT_WORKSPACE;
    }
    uintptr_t astep = 0, bstep = 0;
    for (int32_t i = 0; i < s.nb; i++) {
        astep |= (uintptr_t)s.as[i] * ae;
        bstep |= (uintptr_t)s.bs[i] * be;
    }
    const uint32_t align[3] = {mm_align((uintptr_t)A->data, astep), mm_align((uintptr_t)B->data, bstep),
                               mm_align((uintptr_t)C->data, (uintptr_t)(s.m * s.n) * ce)};
    if (s.b_batches == 1 && !s.ta && s.a_batches == s.batches && mm_uniform(&s, s.as, &sa) &&
        (s.batches == 1 || sa == s.m * s.k)) {
        /* B shared and A's batches contiguous: one tall GEMM */
        KILN_TRY(mm_plan_init(name, a->device, &p, &s, s.batches * s.m, A->dtype, B->dtype, C->dtype, 1, 0, 0, align));
        return mm_launch(name, a->device, &p, tactic >= 0 && tactic < p.n_algos ? (int32_t)tactic : 0, A->data, B->data,
                         C->data, stream);
    }
    if (mm_uniform(&s, s.as, &sa) && mm_uniform(&s, s.bs, &sb)) {
        KILN_TRY(mm_plan_init(name, a->device, &p, &s, s.m, A->dtype, B->dtype, C->dtype, s.batches, sa, sb, align));
        return mm_launch(name, a->device, &p, tactic >= 0 && tactic < p.n_algos ? (int32_t)tactic : 0, A->data, B->data,
                         C->data, stream);
    }
    KILN_TRY(mm_plan_init(name, a->device, &p, &s, s.m, A->dtype, B->dtype, C->dtype, 1, 0, 0, align));
    int32_t algo = tactic >= 0 && tactic < p.n_algos ? (int32_t)tactic : 0;
    for (int64_t b = 0; b < s.batches; b++) {
        int64_t ao, bo;
        kiln_matmul_batch_offsets(&s, b, &ao, &bo);
        KILN_TRY(mm_launch(name, a->device, &p, algo, (const char *)A->data + (size_t)ao * ae,
                           (const char *)B->data + (size_t)bo * be, (char *)C->data + (size_t)(b * s.m * s.n) * ce,
                           stream));
    }
    return KILN_OK;
}

#define TUNE_REPS 5

kiln_status kiln_cuda_matmul_tune(kiln_cuda_device *dev, const kiln_layer *layer, const kiln_exec_tensor *a,
                                  const kiln_exec_tensor *b, const kiln_exec_tensor *c, int64_t *tactic)
{
    const char *name = layer && layer->name ? layer->name : "?";
    if (!dev || !layer || !a || !b || !c || !tactic)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_cuda_matmul_tune: missing argument");
    kiln_matmul_shape s;
    KILN_TRY(kiln_matmul_shape_init(name, layer, &a->dims, &b->dims, &c->dims, &s));
    *tactic = -1;
    if (s.batches == 0 || s.m == 0 || s.n == 0 || s.k == 0)
        return KILN_OK;
    /* time one problem of the shape: the tall GEMM when batches fold,
     * else one batch (the strided-batch and looped paths repeat it) */
    int fold = s.b_batches == 1 && !s.ta && s.a_batches == s.batches;
    int64_t sa = 0, sb = 0, m = fold ? s.batches * s.m : s.m, batch = 1;
    if (!fold && mm_uniform(&s, s.as, &sa) && mm_uniform(&s, s.bs, &sb))
        batch = s.batches;
    mm_plan p;
    p.ws = dev->lt_workspace;
    p.ws_size = KILN_CUDA_CUBLASLT_WORKSPACE;
    const uint32_t align[3] = {256, 256, 256}; /* cudaMalloc'd scratch, as arena tensors usually are */
    KILN_TRY(mm_plan_init(name, dev, &p, &s, m, a->dtype, b->dtype, c->dtype, batch, sa, sb, align));
    if (p.n_algos == 1) {
        *tactic = 0;
        return KILN_OK;
    }
    size_t ab = (size_t)kiln_exec_count(&a->dims) * kiln_dtype_size(a->dtype);
    size_t bb = (size_t)kiln_exec_count(&b->dims) * kiln_dtype_size(b->dtype);
    size_t cb = (size_t)(batch * m * s.n) * kiln_dtype_size(c->dtype);
    void *da = NULL, *db = NULL, *dc = NULL;
    cudaStream_t stream = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    kiln_status st = KILN_OK;
    cudaError_t e = cudaMalloc(&da, ab);
    if (e == cudaSuccess)
        e = cudaMalloc(&db, bb);
    if (e == cudaSuccess)
        e = cudaMalloc(&dc, cb);
    if (e == cudaSuccess)
        e = cudaMemset(da, 0, ab);
    if (e == cudaSuccess)
        e = cudaMemset(db, 0, bb);
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
    float best = -1.0f;
    for (int32_t i = 0; i < p.n_algos; i++) {
        /* a candidate that fails to run is skipped, not fatal */
        if (mm_launch(name, dev, &p, i, da, db, dc, stream) != KILN_OK)
            continue;
        e = cudaEventRecord(e0, stream);
        for (int r = 0; r < TUNE_REPS && e == cudaSuccess; r++)
            if (mm_launch(name, dev, &p, i, da, db, dc, stream) != KILN_OK)
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
            e = cudaSuccess;
            continue;
        }
        if (best < 0.0f || ms < best) {
            best = ms;
            *tactic = i;
        }
    }
    if (best < 0.0f)
        st = kiln_fail(KILN_ERROR_BACKEND, "layer \"%s\": no cuBLASLt candidate ran", name);
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
