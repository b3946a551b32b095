/* QuantMatMul (kiln/QuantMatMul/1): y = x · Wᵀ with W kept in a ggml block
 * format (or F16/BF16), so a step reads the stored bytes (about 4.5-8.5
 * bits per weight for the quantized formats) instead of f32 weights.
 *
 * On the CPU (qmatmul_cpu.c) the quantized formats multiply 8-bit
 * activations: each row of x is quantized to blocks (of 32, or of 256 for
 * the K formats: d = max|x| / 127, q = round(x / d), ggml's Q8_0/Q8_K),
 * every block's products are an exact integer sum scaled once in f32
 * (AVX-512 VNNI or AVX2 where the CPU has them, else portable C): llama.cpp's
 * arithmetic for these formats; the error it adds is at most d/2 · Σ|w|
 * per activation block. KILN_QMATMUL_F32ACT=1 selects the f32-activation
 * path instead (the weights dequantized exactly as the GGUF reader does and
 * multiplied by x in f32), which the CUDA kernels implement and which the
 * GPU op tests use as their reference. F16 and BF16 weights always take
 * f32 activations, converted in registers. KILN_QMATMUL_ISA=c|avx2|avx512
 * forces a kernel set (tests run each; avx512: VNNI without the kernels
 * that need VBMI or GFNI).
 *
 * Many rows of x (prefill) run as a tiled GEMM. With AVX-512 VNNI
 * (kiln_qmm_gemm_pick): the rows of x are quantized once, in parallel, in
 * the GEMM layout; threads take tiles of QMM_GEMM_LANES weight rows, each
 * unpacked once into bytes and per-sub-block scales (qmatmul_cpu.h) and
 * multiplied by every row of x, eight at a time. Elsewhere: threads take
 * ranges of weight rows; within a range QMM_TILE weight rows at a time
 * stay in L1 while every group of four rows of x passes over them, each
 * weight block unpacked once for the four.
 *
 * Inputs:  x: f32, f16 or bf16, [..., K].
 *          w: u8, [N, K / block * block_bytes]: N rows of ggml blocks, the
 *             bytes of a GGUF tensor with ne = {K, N} as stored.
 * Output:  y: dtype of x, [..., N]. With f16/bf16 the products are still
 *          accumulated in f32 and y is rounded once (the CPU converts up
 *          to QMM_HALF_ROWS rows of x at a time in the workspace and y
 *          back), as a bf16 linear layer does.
 * Fields:  format (string): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K,
 *          F16 or BF16; n, k (i32): N and K, K a multiple of 32 (256 for
 *          the K formats).
 *          panels (i32, optional, default 0): 1 where w holds Q8_0, Q4_0,
 *          Q4_1, Q4_K or Q6_K rows in the row-panel layout of
 *          qmatmul_cpu.h (CPU only; n a multiple of 16): what the LLM
 *          builder writes for CPU engines, whose decode GEMV then reads 16
 *          rows a block column.
 * Blob v2: four int32: ggml type number (8, 2, 3, 6, 7, 12, 13, 14, 1,
 *          30), n, k, and the rows of x the workspace holds for the tiled
 *          GEMM (QMM_GEMM_ROWS); v3 adds a fifth, 1 where the workspace
 *          also holds one row of x packed for the decode GEMV of Q4_0 and
 *          Q4_1; v4 a sixth, panels. v1 (the first three), v2 and v3 are
 *          still read: such an engine, whose workspace was sized before
 *          the GEMM (v1) or the GEMV (v2), runs the kernels it was sized
 *          for.
 *
 * The CUDA kernels (qmatmul_cuda.cu) cover Q8_0, Q4_0, Q4_1, Q4_K, Q5_K
 * and Q6_K; the LLM builder expands the other formats for CUDA engines.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "plugin_cuda.h"
#include "plugin_util.h"
#include "qmatmul/qmatmul_cpu.h"

#define NAME "QuantMatMul"
#define BLOB_VERSION 4u

typedef struct qmm_params {
    int32_t type, n, k;
    /* rows of x whose GEMM-layout activations the workspace holds; 0 (a v1
     * blob, built before the tiled GEMM): the four-row kernels only */
    int32_t gemm_rows;
    /* 1: the workspace also holds one row of x packed for the decode GEMV
     * (qmatmul_cpu.h); 0 (v1 and v2 blobs, sized before it): not used */
    int32_t gemv_x;
    /* 1: w is in the row-panel layout (qmatmul_cpu.h); 0 (and v1-v3
     * blobs): as stored */
    int32_t panels;
} qmm_params;

/* Blob bytes of each schema version (v1 lacks gemm_rows, v2 gemv_x, v3 panels). */
static const size_t blob_sizes[BLOB_VERSION] = {offsetof(qmm_params, gemm_rows), offsetof(qmm_params, gemv_x),
                                                offsetof(qmm_params, panels), sizeof(qmm_params)};

typedef struct qmm {
    kiln_plugin base;
    qmm_params p;
} qmm;

static const kiln_host_api *host;
static const kiln_plugin_ops qmm_ops;

/* Rows of x the tiled GEMM takes at a time (a 512-token prompt in one
 * pass over the weights), and the fewest it is used for: unpacking a tile
 * costs about as much as eight rows of x through it (measured: with 8 rows
 * the four-row kernels were 8% faster). */
#define QMM_GEMM_ROWS 512
#define QMM_GEMM_MIN_ROWS 16

#define FORMAT_LIST "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16 or BF16"


static int64_t row_bytes(const qmm_format *f, int32_t k) { return (int64_t)k / f->block * f->bytes; }

static kiln_status qmm_new(const qmm_params *p, kiln_plugin **out)
{
    const qmm_format *f = kiln_qmm_format(p->type);
    if (!f)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": ggml type %d is not " FORMAT_LIST, p->type);
    int32_t kb = f->block > 32 ? f->block : 32;
    if (p->n <= 0 || p->k <= 0 || p->k % kb != 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": n = %d and k = %d must be positive, k a multiple of %d for %s", p->n, p->k, kb,
                          f->name);
    if (p->gemv_x != 0 && p->gemv_x != 1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": gemv_x = %d is not 0 or 1", p->gemv_x);
    if (p->panels != 0 && (p->panels != 1 || !kiln_qmm_panel_format(f) || p->n % QMM_PANEL_ROWS != 0 ||
                           row_bytes(f, p->k) > QMM_PANEL_ROW_BYTES))
        return host->fail(
            KILN_ERROR_INVALID_ARGUMENT,
            NAME
            ": panels = %d: 1 takes Q8_0, Q4_0, Q4_1, Q4_K or Q6_K with n (%d) a multiple of %d and rows of at most "
            "%d bytes; 0 the stored layout",
            p->panels, p->n, QMM_PANEL_ROWS, QMM_PANEL_ROW_BYTES);
    if (p->gemm_rows < 0 || p->gemm_rows > QMM_GEMM_ROWS)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": gemm_rows = %d is not in 0..%d", p->gemm_rows,
                          QMM_GEMM_ROWS);
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
    int64_t v, row = row_bytes(kiln_qmm_format(p->type), p->k);
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

#ifdef KILN_HAVE_CUDA
/* The CUDA kernels read Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K. */
static int cuda_format(int32_t type)
{
    return type == QMM_Q8_0 || type == QMM_Q4_0 || type == QMM_Q4_1 || type == QMM_Q4_K || type == QMM_Q5_K ||
           type == QMM_Q6_K;
}
#endif

static int32_t qmm_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                            int32_t n_out)
{
    int backend_ok = backend == KILN_BACKEND_CPU;
#ifdef KILN_HAVE_CUDA
    const qmm_params *p = &((const qmm *)self)->p;
    backend_ok = backend_ok || (backend == KILN_BACKEND_CUDA && cuda_format(p->type) && !p->panels);
#endif
    return backend_ok && n_in == 2 && n_out == 1 && plugin_is_float(d[0].dtype) && d[1].dtype == KILN_DTYPE_U8 &&
           d[2].dtype == d[0].dtype;
}

/* f16/bf16 on the CPU: x and y converted through f32 copies of this many
 * rows at a time, which keeps the workspace small (the builder reserves it
 * whatever the backend) while a chunk still shares each weight block among
 * many rows. */
#define QMM_HALF_ROWS 16
/* Rows of f32 x quantized at a time: the workspace holds their blocks. */
#define QMM_Q8_ROWS 64
/* Weight rows that stay in L1 while groups of four rows of x pass over
 * them (prefill): 8 rows of k = 4096 are 18-34 KiB in the 4-bit formats. */
#define QMM_TILE 8

/* Workspace per chunk of rows: their quantized activations, then (f16/bf16
 * x) their f32 x and f32 y; for the tiled GEMM (f32 x) up to gemm_rows
 * rows in its layout. */
static size_t qmm_workspace_size(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                                 const kiln_tensor_desc *out, int32_t n_out)
{
    const qmm_params *p = &((const qmm *)self)->p;
    int64_t rows = plugin_desc_count(&in[0]) / p->k;
    int64_t chunk = in[0].dtype == KILN_DTYPE_F32 ? QMM_Q8_ROWS : QMM_HALF_ROWS;
    size_t per_row = kiln_qmm_act_row_bytes(kiln_qmm_format(p->type), p->k);
    if (in[0].dtype != KILN_DTYPE_F32)
        per_row += ((size_t)p->k + (size_t)p->n) * sizeof(float);
    /* + the decode GEMV's packed row of x */
    size_t legacy = (size_t)(rows < chunk ? rows : chunk) * per_row + (p->gemv_x ? kiln_qmm_gemv4_x_bytes(p->k) : 0);
    if (in[0].dtype != KILN_DTYPE_F32 || p->gemm_rows == 0 || kiln_qmm_format(p->type)->act_block == 0)
        return legacy;
    int64_t gr = rows < p->gemm_rows ? rows : p->gemm_rows;
    size_t gemm = (size_t)((gr + QMM_GEMM_PANEL - 1) / QMM_GEMM_PANEL) *
                  kiln_qmm_gemm_panel_bytes(kiln_qmm_format(p->type), p->k);
    return gemm > legacy ? gemm : legacy;
}

typedef struct qmm_job {
    int32_t type, k, panels;
    int64_t rows, n;
    size_t wrow, xs; /* bytes per weight row and per row of x as the kernels read it */
    const uint8_t *w;
    const void *x;
    float *y;
    qmm_kernels ks;
    const float *xf; /* f32 rows to quantize into q */
    void *q;
    qmm_gemv4_fn gemv4; /* one row of x: the decode GEMV over x packed at xg */
    const void *xg;
    qmm_panel_fn panel; /* one row of x, w in panels: the panel GEMV */
} qmm_job;

/* Panels [begin, end) of one row of x by the panel GEMV. */
static void qmm_panel_range(void *arg, int64_t begin, int64_t end)
{
    const qmm_job *j = arg;
    j->panel(j->w + (size_t)(begin * QMM_PANEL_ROWS) * j->wrow, j->wrow, end - begin, j->k, j->q,
             j->y + begin * QMM_PANEL_ROWS);
}

/* Output columns [begin, end) of one row of x by the decode GEMV. */
static void qmm_gemv4_range(void *arg, int64_t begin, int64_t end)
{
    const qmm_job *j = arg;
    j->gemv4(j->w + (size_t)begin * j->wrow, j->wrow, end - begin, j->k, j->xg, j->y + begin);
}

/* Output columns [begin, end) in tiles of QMM_TILE weight rows; each tile
 * meets every row of x, four at a time. A weight in panels is read as
 * stored rows, a tile's worth at a time on the stack. */
static void qmm_range(void *arg, int64_t begin, int64_t end)
{
    const qmm_job *j = arg;
    float o[4];
    uint8_t rows[QMM_PANEL_ROW_BYTES];
    int64_t tile = QMM_TILE;
    if (j->panels && tile * (int64_t)j->wrow > QMM_PANEL_ROW_BYTES)
        tile = QMM_PANEL_ROW_BYTES / (int64_t)j->wrow; /* >= 1: qmm_new bounds wrow */
    for (int64_t c0 = begin; c0 < end; c0 += tile) {
        int64_t c1 = c0 + tile < end ? c0 + tile : end, r = 0;
        const uint8_t *w = j->w + (size_t)c0 * j->wrow;
        if (j->panels) {
            kiln_qmm_panel_rows(kiln_qmm_format(j->type), j->w, j->wrow, c0, c1 - c0, rows);
            w = rows;
        }
        for (; r + 4 <= j->rows; r += 4)
            for (int64_t c = c0; c < c1; c++) {
                j->ks.four(j->type, w + (size_t)(c - c0) * j->wrow, (const char *)j->x + (size_t)r * j->xs, j->xs, j->k,
                           o);
                for (int i = 0; i < 4; i++)
                    j->y[(r + i) * j->n + c] = o[i];
            }
        for (; r < j->rows; r++)
            for (int64_t c = c0; c < c1; c++)
                j->ks.one(j->type, w + (size_t)(c - c0) * j->wrow, (const char *)j->x + (size_t)r * j->xs, j->xs, j->k,
                          j->y + r * j->n + c);
    }
}

/* Quantizes rows [begin, end) of f32 x for the four-row kernels. */
static void qmm_quantize_rows(void *arg, int64_t begin, int64_t end)
{
    const qmm_job *j = arg;
    const qmm_format *f = kiln_qmm_format(j->type);
    for (int64_t r = begin; r < end; r++)
        kiln_qmm_quantize_row(f, j->ks.quant, j->xf + r * j->k, j->k, (char *)j->q + (size_t)r * j->xs);
}

typedef struct gemm_job {
    const qmm_format *f;
    int32_t k, n, panels;
    int64_t rows;
    size_t wrow, panel; /* bytes per weight row and per panel of x */
    const uint8_t *w;
    const float *xf;
    void *x; /* rows in the GEMM layout */
    float *y;
    qmm_gemm_fn gemm;
    qmm_quant_fn quant;
} gemm_job;

/* Rows [begin, end) of x into their panels; rows past j->rows pad the last. */
static void gemm_quantize_rows(void *arg, int64_t begin, int64_t end)
{
    const gemm_job *j = arg;
    for (int64_t r = begin; r < end; r++)
        kiln_qmm_gemm_quantize_row(j->f, j->quant, r < j->rows ? j->xf + r * j->k : NULL, j->k,
                                   (char *)j->x + (size_t)(r / QMM_GEMM_PANEL) * j->panel,
                                   (int32_t)(r % QMM_GEMM_PANEL));
}

/* Tiles [begin, end) of QMM_GEMM_LANES weight rows, each against every row. */
static void gemm_tiles(void *arg, int64_t begin, int64_t end)
{
    const gemm_job *j = arg;
    for (int64_t t = begin; t < end; t++) {
        int64_t c0 = t * QMM_GEMM_LANES;
        int32_t n_w = (int32_t)(j->n - c0 < QMM_GEMM_LANES ? j->n - c0 : QMM_GEMM_LANES);
        j->gemm(j->f->type, j->w + (size_t)c0 * j->wrow, j->wrow, n_w, j->panels, j->k, j->x, j->rows, j->y + c0, j->n);
    }
}

static const char *env_or_empty(const char *name)
{
    const char *e = getenv(name);
    return e ? e : "";
}

static kiln_status qmm_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                               const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc, void *const *out,
                               int32_t n_out, void *workspace, void *stream)
{
    const qmm_params *p = &((const qmm *)self)->p;
    const qmm_format *f = kiln_qmm_format(p->type);
    const kiln_dims *xd = &in_desc[0].dims, *wd = &in_desc[1].dims;
    int64_t wrow = row_bytes(f, p->k);
    if (xd->rank < 1 || xd->d[xd->rank - 1] != p->k || wd->rank != 2 || wd->d[0] != p->n || wd->d[1] != wrow)
        return host->fail(KILN_ERROR_SHAPE, NAME ": x's last dim must be k = %d and w [%d, %lld]", p->k, p->n,
                          (long long)wrow);
    kiln_dtype t = in_desc[0].dtype;
    int64_t rows = plugin_desc_count(&in_desc[0]) / p->k;
#ifdef KILN_HAVE_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        if (!cuda_format(p->type))
            return host->fail(KILN_ERROR_UNSUPPORTED, NAME ": no CUDA kernel for %s", f->name);
        int e = rows > 0 ? kiln_qmatmul_cuda(p->type, in[0], in[1], out[0], (int32_t)t, rows, p->n, p->k, stream) : 0;
        return e ? host->fail(KILN_ERROR_BACKEND, NAME ": kernel launch failed (cuda error %d)", e) : KILN_OK;
    }
#endif
    if (rows == 0)
        return KILN_OK;
    const char *isa = env_or_empty("KILN_QMATMUL_ISA");
    int f32act = env_or_empty("KILN_QMATMUL_F32ACT")[0] == '1';
    qmm_job job = {p->type, p->k, p->panels, 0,    p->n, (size_t)wrow, 0,    in[1],
                   NULL,    NULL, {0},       NULL, NULL, NULL,         NULL, NULL};
    kiln_qmm_kernels_pick(f, isa, f32act, &job.ks);
    qmm_gemm_fn gemm = NULL;
    if (t == KILN_DTYPE_F32 && !f32act && p->gemm_rows > 0 && rows >= QMM_GEMM_MIN_ROWS)
        gemm = kiln_qmm_gemm_pick(f, isa);
    if (gemm) {
        if (!workspace)
            return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": no workspace for the quantized activations");
        gemm_job gj = {f,     p->k, p->n,      p->panels, 0,    (size_t)wrow, kiln_qmm_gemm_panel_bytes(f, p->k),
                       in[1], NULL, workspace, NULL,      gemm, job.ks.quant};
        for (int64_t r0 = 0; r0 < rows; r0 += p->gemm_rows) {
            gj.rows = rows - r0 < p->gemm_rows ? rows - r0 : p->gemm_rows;
            gj.xf = (const float *)in[0] + r0 * p->k;
            gj.y = (float *)out[0] + r0 * p->n;
            host->parallel_for(stream, (gj.rows + QMM_GEMM_PANEL - 1) / QMM_GEMM_PANEL * QMM_GEMM_PANEL,
                               gemm_quantize_rows, &gj);
            host->parallel_for(stream, (p->n + QMM_GEMM_LANES - 1) / QMM_GEMM_LANES, gemm_tiles, &gj);
        }
        return KILN_OK;
    }
    size_t qrow = job.ks.f32_act ? 0 : kiln_qmm_act_row_bytes(f, p->k);
    if ((qrow || t != KILN_DTYPE_F32) && !workspace)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": no workspace for the converted activations");
    int64_t chunk = t == KILN_DTYPE_F32 ? QMM_Q8_ROWS : QMM_HALF_ROWS;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        /* workspace: nr quantized rows, then (f16/bf16) nr rows of f32 x and y */
        float *xf = (float *)in[0] + r0 * p->k, *yf = NULL;
        if (t != KILN_DTYPE_F32) {
            xf = (float *)((char *)workspace + (size_t)nr * kiln_qmm_act_row_bytes(f, p->k));
            yf = xf + nr * p->k;
            for (int64_t i = 0; i < nr * p->k; i++)
                xf[i] = plugin_load(host, in[0], t, r0 * p->k + i);
        }
        if (qrow) {
            job.x = job.q = workspace, job.xs = qrow, job.xf = xf;
            host->parallel_for(stream, nr, qmm_quantize_rows, &job);
        } else {
            job.x = xf, job.xs = (size_t)p->k * sizeof(float);
        }
        job.rows = nr;
        job.y = t == KILN_DTYPE_F32 ? (float *)out[0] + r0 * p->n : yf;
        job.panel = nr == 1 && qrow && p->panels ? kiln_qmm_panel_pick(f, isa, job.ks.f32_act) : NULL;
        job.gemv4 = nr == 1 && qrow && p->gemv_x && !p->panels ? kiln_qmm_gemv4_pick(f, isa, job.ks.f32_act) : NULL;
        if (job.panel) {
            host->parallel_for(stream, p->n / QMM_PANEL_ROWS, qmm_panel_range, &job);
        } else if (job.gemv4) {
            /* after the quantized row and (f16/bf16 x) the row's f32 x and y,
             * in the room qmm_workspace_size adds for it */
            void *xg =
                (char *)workspace + qrow + (t != KILN_DTYPE_F32 ? ((size_t)p->k + (size_t)p->n) * sizeof(float) : 0);
            kiln_qmm_gemv4_pack_x(job.q, p->k, xg);
            job.xg = xg;
            host->parallel_for(stream, p->n, qmm_gemv4_range, &job);
        } else {
            host->parallel_for(stream, p->n, qmm_range, &job);
        }
        if (t != KILN_DTYPE_F32)
            for (int64_t i = 0; i < nr * p->n; i++)
                plugin_store(host, out[0], t, r0 * p->n + i, yf[i]);
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
    const qmm_format *qf = kiln_qmm_format_named(s);
    if (!qf)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": format \"%s\" is not " FORMAT_LIST, s);
    qmm_params p = {qf->type, plugin_field_i32(f, n, "n", 0),     plugin_field_i32(f, n, "k", 0), QMM_GEMM_ROWS,
                    1,        plugin_field_i32(f, n, "panels", 0)};
    return qmm_new(&p, out);
}

static kiln_status qmm_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                   kiln_plugin **out)
{
    qmm_params p = {0};
    kiln_status s = plugin_pod_read_blob(host, NAME, BLOB_VERSION, blob_sizes, version, blob, size, &p);
    if (s != KILN_OK)
        return s;
    return qmm_new(&p, out);
}

static const int32_t zero_i32 = 0;

static const kiln_field_spec qmm_fields[] = {
    PLUGIN_FIELD_REQUIRED("format", KILN_FIELD_STRING, "format of w: " FORMAT_LIST),
    PLUGIN_FIELD_REQUIRED("n", KILN_FIELD_I32, "output features (rows of w)"),
    PLUGIN_FIELD_REQUIRED("k", KILN_FIELD_I32, "input features, a multiple of 32 (256 for the K formats)"),
    PLUGIN_FIELD_OPTIONAL(
        "panels", KILN_FIELD_I32, &zero_i32,
        "1: w is in 16-row panels (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K; CPU; n a multiple of 16), 0: as stored"),
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
    .description = "x · Wᵀ with W in a ggml block format (" FORMAT_LIST "), decoded on the fly",
};

kiln_status kiln_qmatmul_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    return h->register_creator(reg, &qmm_creator);
}
