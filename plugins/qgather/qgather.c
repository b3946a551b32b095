/* QuantGather (kiln/QuantGather/1): rows of a table kept in a ggml block
 * format, picked by index and dequantized to f32 — the token embedding of
 * a native engine, which thus stays as small as in the GGUF (and, with
 * tied embeddings, is the same constant the output projection's
 * QuantMatMul reads) instead of an f32 copy 4-8 times its size. A step
 * reads one row per token, so dequantizing them costs nothing next to the
 * matmuls. The rows come out exactly as ggml defines the format (the
 * host's ggml_dequantize), i.e. the values an f32 embedding converted at
 * build time would hold.
 *
 * Inputs:  table: u8, [N, K / block * block_bytes]: N rows of blocks, the
 *                 bytes of a GGUF tensor with ne = {K, N} as stored.
 *          ids:   i32, [T]: rows to gather, each in [0, N).
 * Output:  f32, [T, K].
 * Fields:  format (string): a ggml block format the host dequantizes
 *          (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K ... Q6_K, as far as
 *          host->ggml_dequantize supports it); n, k (i32): N and K, K a
 *          multiple of the format's block; panels (i32, optional, default
 *          0): 1 where the table is in QuantMatMul's row-panel layout
 *          (qmatmul/qmatmul_cpu.h: the tied output projection of a CPU
 *          engine reads it so), each row gathered back from its panel
 *          before it is dequantized.
 * Blob v2: four int32: ggml type number, n, k, panels (v1: the first three).
 *
 * CPU only: the builder uses it for CPU engines. */
#include <stddef.h>
#include <stdint.h>

#include "plugin_util.h"
#include "qmatmul/qmatmul_cpu.h"

#define NAME "QuantGather"
#define BLOB_VERSION 2u

/* Block geometry of the ggml formats (the GGUF specification's table). */
static const struct {
    const char *name;
    int32_t type, block, bytes;
} formats[] = {
    {"Q4_0", 2, 32, 18},    {"Q4_1", 3, 32, 20},    {"Q5_0", 6, 32, 22},    {"Q5_1", 7, 32, 24},
    {"Q8_0", 8, 32, 34},    {"Q2_K", 10, 256, 84},  {"Q3_K", 11, 256, 110}, {"Q4_K", 12, 256, 144},
    {"Q5_K", 13, 256, 176}, {"Q6_K", 14, 256, 210},
};
#define N_FORMATS ((int)(sizeof formats / sizeof formats[0]))

typedef struct qg_params {
    int32_t type, n, k;
    int32_t panels; /* 1: the table is in panels (v1 blobs: 0) */
} qg_params;

/* Blob bytes of each schema version (v1 lacks panels). */
static const size_t blob_sizes[BLOB_VERSION] = {offsetof(qg_params, panels), sizeof(qg_params)};

typedef struct qgather {
    kiln_plugin base;
    qg_params p;
    int32_t f; /* index in formats */
} qgather;

static const kiln_host_api *host;
static const kiln_plugin_ops qg_ops;

static int format_of_type(int32_t type)
{
    for (int i = 0; i < N_FORMATS; i++)
        if (formats[i].type == type)
            return i;
    return -1;
}

/* An older host's table ends before ggml_dequantize. */
static int host_dequantizes(void)
{
    return host->struct_size >= offsetof(kiln_host_api, ggml_dequantize) + sizeof host->ggml_dequantize &&
           host->ggml_dequantize;
}

static kiln_status qg_new(const qg_params *p, kiln_plugin **out)
{
    int f = format_of_type(p->type);
    if (f < 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": ggml type %d is not a block format it knows", p->type);
    if (!host_dequantizes())
        return host->fail(KILN_ERROR_UNSUPPORTED, NAME ": this kiln host cannot dequantize ggml blocks");
    /* n = 0: only asks whether the host knows the format */
    uint8_t byte = 0;
    float value = 0.0f;
    kiln_status s = host->ggml_dequantize((uint32_t)p->type, &byte, 0, &value);
    if (s != KILN_OK)
        return s;
    if (p->n <= 0 || p->k <= 0 || p->k % formats[f].block != 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": n = %d and k = %d must be positive, k a multiple of %d",
                          p->n, p->k, formats[f].block);
    const qmm_format *qf = kiln_qmm_format(p->type);
    if (p->panels != 0 && (p->panels != 1 || !qf || !kiln_qmm_panel_format(qf) || p->n % QMM_PANEL_ROWS != 0 ||
                           (int64_t)p->k / formats[f].block * formats[f].bytes > QMM_PANEL_ROW_BYTES))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          NAME ": panels = %d: 1 takes a format with QuantMatMul's panels, n (%d) a multiple of %d and "
                               "rows of at most %d bytes; 0 the stored layout",
                          p->panels, p->n, QMM_PANEL_ROWS, QMM_PANEL_ROW_BYTES);
    qgather *q = calloc(1, sizeof *q);
    if (!q)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, NAME ": out of memory");
    q->base.struct_size = sizeof q->base;
    q->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    q->base.ops = &qg_ops;
    q->p = *p;
    q->f = f;
    *out = &q->base;
    return KILN_OK;
}

static int64_t row_bytes(const qgather *q) { return (int64_t)q->p.k / formats[q->f].block * formats[q->f].bytes; }

static int32_t qg_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status qg_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                    kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    const qgather *q = (const qgather *)self;
    if (n_in != 2 || in[0].rank != 2 || in[1].rank != 1)
        return host->fail(KILN_ERROR_SHAPE, NAME ": expects table [N, row bytes] and ids [T]");
    int64_t v;
    if (host->expr_is_constant(eb, in[0].d[0], &v) && v != q->p.n)
        return host->fail(KILN_ERROR_SHAPE, NAME ": table has %lld rows, n is %d", (long long)v, q->p.n);
    if (host->expr_is_constant(eb, in[0].d[1], &v) && v != row_bytes(q))
        return host->fail(KILN_ERROR_SHAPE, NAME ": table rows are %lld bytes, %d values of %s take %lld", (long long)v,
                          q->p.k, formats[q->f].name, (long long)row_bytes(q));
    out[0].rank = 2;
    out[0].d[0] = in[1].d[0];
    out[0].d[1] = host->expr_constant(eb, q->p.k);
    return KILN_OK;
}

static kiln_status qg_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                    int32_t n_out)
{
    out[0] = KILN_DTYPE_F32;
    return KILN_OK;
}

static int32_t qg_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *d, int32_t n_in,
                           int32_t n_out)
{
    return backend == KILN_BACKEND_CPU && n_in == 2 && n_out == 1 && d[0].dtype == KILN_DTYPE_U8 &&
           d[1].dtype == KILN_DTYPE_I32 && d[2].dtype == KILN_DTYPE_F32;
}

typedef struct qg_job {
    const qgather *q;
    const uint8_t *table;
    const int32_t *ids;
    float *out;
} qg_job;

static void qg_rows(void *arg, int64_t begin, int64_t end)
{
    const qg_job *j = arg;
    int64_t rb = row_bytes(j->q), k = j->q->p.k;
    uint8_t row[QMM_PANEL_ROW_BYTES]; /* qg_new bounds a row in panels */
    for (int64_t t = begin; t < end; t++) {
        const uint8_t *src = j->table + (int64_t)j->ids[t] * rb;
        if (j->q->p.panels) {
            kiln_qmm_panel_rows(kiln_qmm_format(j->q->p.type), j->table, (size_t)rb, j->ids[t], 1, row);
            src = row;
        }
        host->ggml_dequantize((uint32_t)j->q->p.type, src, k, j->out + t * k);
    }
}

static kiln_status qg_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_desc,
                              const void *const *in, int32_t n_in, const kiln_tensor_desc *out_desc, void *const *out,
                              int32_t n_out, void *workspace, void *stream)
{
    const qgather *q = (const qgather *)self;
    if (in_desc[0].dims.d[0] != q->p.n || in_desc[0].dims.d[1] != row_bytes(q))
        return host->fail(KILN_ERROR_SHAPE, NAME ": table is not [%d, %lld]", q->p.n, (long long)row_bytes(q));
    int64_t T = in_desc[1].dims.d[0];
    const int32_t *ids = in[1];
    /* checked before any row is read: a bad id is an error, never a read
     * outside the table */
    for (int64_t t = 0; t < T; t++)
        if (ids[t] < 0 || ids[t] >= q->p.n)
            return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": id %d at %lld is outside [0, %d)", ids[t],
                              (long long)t, q->p.n);
    qg_job job = {q, in[0], ids, out[0]};
    host->parallel_for(stream, T, qg_rows, &job);
    return KILN_OK;
}

static kiln_status qg_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    return plugin_pod_serialize(host, NAME, &((const qgather *)self)->p, sizeof(qg_params), buf, size);
}

static kiln_status qg_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return plugin_pod_clone(host, self, sizeof(qgather), out);
}

static void qg_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops qg_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
    .num_outputs = qg_num_outputs,
    .output_shapes = qg_output_shapes,
    .output_dtypes = qg_output_dtypes,
    .supports = qg_supports,
    .enqueue = qg_enqueue,
    .serialize = qg_serialize,
    .clone = qg_clone,
    .destroy = qg_destroy,
};

static kiln_status qg_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    const kiln_field *fmt = plugin_field(f, n, "format");
    const char *s = fmt ? fmt->data : "";
    qg_params p = {-1, plugin_field_i32(f, n, "n", 0), plugin_field_i32(f, n, "k", 0),
                   plugin_field_i32(f, n, "panels", 0)};
    for (int i = 0; i < N_FORMATS; i++)
        if (strcmp(s, formats[i].name) == 0)
            p.type = formats[i].type;
    if (p.type < 0)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, NAME ": format \"%s\" is not a ggml block format", s);
    return qg_new(&p, out);
}

static kiln_status qg_deserialize(const kiln_plugin_creator *c, uint32_t version, const void *blob, size_t size,
                                  kiln_plugin **out)
{
    qg_params p = {0};
    kiln_status s = plugin_pod_read_blob(host, NAME, BLOB_VERSION, blob_sizes, version, blob, size, &p);
    if (s != KILN_OK)
        return s;
    return qg_new(&p, out);
}

static const int32_t zero_i32 = 0;

static const kiln_field_spec qg_fields[] = {
    PLUGIN_FIELD_REQUIRED("format", KILN_FIELD_STRING, "ggml block format of the table: Q8_0, Q4_0, Q4_K, ..."),
    PLUGIN_FIELD_REQUIRED("n", KILN_FIELD_I32, "rows of the table"),
    PLUGIN_FIELD_REQUIRED("k", KILN_FIELD_I32, "values per row, a multiple of the format's block"),
    PLUGIN_FIELD_OPTIONAL("panels", KILN_FIELD_I32, &zero_i32,
                          "1: the table is in QuantMatMul's 16-row panels, 0: as stored"),
};

static const kiln_plugin_creator qg_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = NAME,
    .version = "1",
    .plugin_namespace = "kiln",
    .fields = qg_fields,
    .n_fields = sizeof qg_fields / sizeof qg_fields[0],
    .blob_version = BLOB_VERSION,
    .create = qg_create,
    .deserialize = qg_deserialize,
    .description = "rows of a table in a ggml block format, gathered by index and dequantized to f32",
};

kiln_status kiln_qgather_register(const kiln_host_api *h, kiln_registry *reg)
{
    host = h;
    return h->register_creator(reg, &qg_creator);
}
