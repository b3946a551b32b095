/* The Llama-family step network (docs/llm.md) and the LLM engine build. */
#include "llm/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "network/network_internal.h"
#include "llm/gguf.h"
#include "llm/jinja.h"
#include "qmatmul/qmatmul_cpu.h"

void kiln_llm_checkpoint_free(kiln_llm_checkpoint *ck)
{
    if (!ck)
        return;
    kiln_tokenizer_free(ck->tokenizer);
    if (ck->free_user)
        ck->free_user(ck->weight_user);
    free(ck->chat_template);
    free(ck->bos_token);
    free(ck->eos_token);
    free(ck->act_amax);
    free(ck);
}

kiln_status kiln_llm_checkpoint_set_chat(kiln_llm_checkpoint *ck, const char *tmpl, size_t len, const char *bos,
                                         const char *eos)
{
    char *t = tmpl ? malloc(len + 1) : NULL, *b = bos ? strdup(bos) : NULL, *e = eos ? strdup(eos) : NULL;
    if ((tmpl && !t) || (bos && !b) || (eos && !e)) {
        free(t), free(b), free(e);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for the chat template");
    }
    if (t) {
        memcpy(t, tmpl, len);
        t[len] = '\0';
    }
    free(ck->chat_template), free(ck->bos_token), free(ck->eos_token);
    ck->chat_template = t;
    ck->bos_token = b;
    ck->eos_token = e;
    return KILN_OK;
}

void kiln_llm_build_options_init(kiln_llm_build_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->struct_size = (uint32_t)sizeof *opt;
    opt->abi_version = KILN_API_VERSION;
    opt->dtype = KILN_DTYPE_F32;
    opt->native = -1;
    opt->max_batch = 8;
    opt->block_size = 16;
    opt->backend = KILN_BACKEND_CPU;
    opt->calibrate_tokens = 2048;
}

kiln_status kiln_llm_config_validate(const kiln_llm_config *c)
{
    const struct {
        const char *name;
        int32_t v;
    } pos[] = {{"vocab_size", c->vocab_size},
               {"hidden_size", c->hidden_size},
               {"n_layers", c->n_layers},
               {"n_heads", c->n_heads},
               {"n_kv_heads", c->n_kv_heads},
               {"head_dim", c->head_dim},
               {"intermediate_size", c->intermediate_size}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0)
            return kiln_fail(KILN_ERROR_FORMAT, "model %s = %d must be positive", pos[i].name, pos[i].v);
    if (c->n_heads % c->n_kv_heads != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "model n_heads %d is not a multiple of n_kv_heads %d", c->n_heads,
                         c->n_kv_heads);
    if (c->head_dim % 2 != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "model head_dim %d is odd", c->head_dim);
    if (c->rope.rotary_dim < 0 || c->rope.rotary_dim > c->head_dim || c->rope.rotary_dim % 2 != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "model rotary_dim %d is not an even number in [0, head_dim %d]",
                         c->rope.rotary_dim, c->head_dim);
    if (!(c->rope.theta > 0))
        return kiln_fail(KILN_ERROR_FORMAT, "model rope theta %g must be positive", c->rope.theta);
    if (!(c->rms_norm_eps >= 0 && c->rms_norm_eps < 1))
        return kiln_fail(KILN_ERROR_FORMAT, "model rms_norm_eps %g is outside [0, 1)", c->rms_norm_eps);
    /* Keep every product the network forms (heads * head_dim, vocab *
     * hidden) far from int32/size_t limits. */
    if ((int64_t)c->n_heads * c->head_dim > (1 << 24) || (int64_t)c->vocab_size * c->hidden_size > (1LL << 40) ||
        (int64_t)c->intermediate_size * c->hidden_size > (1LL << 40))
        return kiln_fail(KILN_ERROR_FORMAT,
                         "model dims are implausibly large (heads %d x head_dim %d, vocab %d, "
                         "hidden %d, intermediate %d)",
                         c->n_heads, c->head_dim, c->vocab_size, c->hidden_size, c->intermediate_size);
    return KILN_OK;
}

static size_t dtype_size(kiln_dtype t) { return t == KILN_DTYPE_F32 ? 4 : 2; }

/* Building state: the network, the options, and progress over the weights. */
typedef struct builder {
    kiln_network *net;
    kiln_llm_checkpoint *ck;
    const kiln_llm_build_options *opt;
    int64_t n_weights, done_weights;
    char name[160];
    char expanded[64];   /* formats expanded for want of a CUDA kernel */
    int fuse;            /* decoder layers of plain weights as kiln/FusedMatMul (fused_layer) */
    kiln_dtype kv_dtype; /* the KV cache's (kiln_llm_build_options.kv_cache resolved) */
    kiln_dtype stream;   /* the residual stream's: f32 (the dtype with KILN_LLM_RESIDUAL=dtype) */
    int fp8_in;          /* FP8 layers take their x quantized by the norm or SwiGLU before them */
    int fuse_head;       /* the final norm and the output projection as one FusedMatMul */
    int fuse_fp8;        /* FP8 decoder layers as kiln/FusedMatMul with E4M3 weights (fused_layer) */
    float x_amax;        /* the static max |x| of the next Fp8MatMul that quantizes its x (0: per token) */
} builder;

static void progress(builder *b, const char *what)
{
    if (b->opt->progress && b->n_weights > 0)
        /* weight conversion is the first half of the bar, the build the rest */
        b->opt->progress(b->opt->progress_user, 0.5 * (double)b->done_weights / (double)b->n_weights, what);
}

static kiln_dims dims1(int64_t a)
{
    kiln_dims d;
    memset(&d, 0, sizeof d);
    d.rank = 1;
    d.d[0] = a;
    return d;
}

static kiln_dims dims2(int64_t a, int64_t b)
{
    kiln_dims d = dims1(a);
    d.rank = 2;
    d.d[1] = b;
    return d;
}

/* Reads weight `hf` (HF name), converted to dtype t, into buf
 * (`bytes` long), after checking its dims against the expected ones. */
static kiln_status read_weight_into(builder *b, const char *hf, int32_t rank, int64_t d0, int64_t d1, kiln_dtype t,
                                    void *buf, size_t bytes)
{
    kiln_dims dims;
    memset(&dims, 0, sizeof dims);
    kiln_status st = b->ck->read_weight(b->ck->weight_user, hf, &dims, b->opt->dtype, NULL, 0);
    if (st == KILN_ERROR_NOT_FOUND)
        return kiln_fail(st, "checkpoint has no tensor \"%s\"", hf);
    KILN_TRY(st);
    if (dims.rank != rank || dims.d[0] != d0 || (rank == 2 && dims.d[1] != d1)) {
        char got[96] = "";
        for (int32_t i = 0; i < dims.rank && i < KILN_MAX_RANK; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)dims.d[i]);
        if (rank == 2)
            return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\" has shape [%s], the config says [%lld, %lld]", hf, got,
                             (long long)d0, (long long)d1);
        return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\" has shape [%s], the config says [%lld]", hf, got,
                         (long long)d0);
    }
    KILN_TRY(b->ck->read_weight(b->ck->weight_user, hf, &dims, t, buf, bytes));
    b->done_weights++;
    progress(b, "converting weights");
    return KILN_OK;
}

/* Weights `hf[0..n)`, each [rows[i], d1] (or [rows[i]] when d1 is 0),
 * stacked along their first axis into one constant `cname`: the fused
 * projections' [Nq + Nk + Nv, K] and [2 * I, K] weights and their biases. */
static kiln_status add_weights_permuted(builder *b, const char *const *hf, const int64_t *rows, int32_t n, int64_t d1,
                                        const char *cname, int rope_pairs, kiln_tensor *out);

static kiln_status add_weights(builder *b, const char *const *hf, const int64_t *rows, int32_t n, int64_t d1,
                               const char *cname, kiln_tensor *out)
{
    return add_weights_permuted(b, hf, rows, n, d1, cname, 0, out);
}

/* Rows of the stacked [Wq; Wk; Wv] (`row` bytes each) reordered for
 * kiln/FusedMatMul's rope epilogue: in each rotated head, output dims j
 * and j + rotary_dim / 2 become rows 2j and 2j + 1 (HF's half-split
 * rotation; GGUF's adjacent pairs are in place already). */
static kiln_status rope_pair_rows(builder *b, unsigned char *w, size_t row)
{
    const kiln_llm_config *c = &b->ck->config;
    const int64_t half = c->rope.rotary_dim / 2, heads = (int64_t)c->n_heads + c->n_kv_heads;
    if (c->rope.interleaved)
        return KILN_OK;
    unsigned char *tmp = malloc((size_t)(2 * half) * row);
    if (!tmp)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory reordering the qkv rows");
    for (int64_t h = 0; h < heads; h++) {
        unsigned char *head = w + (size_t)(h * c->head_dim) * row;
        memcpy(tmp, head, (size_t)(2 * half) * row);
        for (int64_t j = 0; j < half; j++) {
            memcpy(head + (size_t)(2 * j) * row, tmp + (size_t)j * row, row);
            memcpy(head + (size_t)(2 * j + 1) * row, tmp + (size_t)(j + half) * row, row);
        }
    }
    free(tmp);
    return KILN_OK;
}

/* The weights of add_weights_permuted read in dtype t into a new buffer
 * *out (the caller frees it); *total: its rows. */
static kiln_status read_weights_permuted(builder *b, const char *const *hf, const int64_t *rows, int32_t n, int64_t d1,
                                         const char *cname, int rope_pairs, kiln_dtype t, void **out, int64_t *total)
{
    *total = 0;
    for (int32_t i = 0; i < n; i++)
        *total += rows[i];
    size_t es = dtype_size(t), row = (size_t)(d1 ? d1 : 1) * es; /* dims bounded by validation */
    size_t bytes = (size_t)*total * row;
    void *buf = malloc(bytes > 0 ? bytes : 1);
    if (!buf)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for tensor \"%s\" (%zu bytes)", cname, bytes);
    kiln_status st = KILN_OK;
    for (int32_t i = 0, at = 0; i < n && st == KILN_OK; at += (int32_t)rows[i], i++)
        st = read_weight_into(b, hf[i], d1 ? 2 : 1, rows[i], d1, t, (char *)buf + (size_t)at * row,
                              (size_t)rows[i] * row);
    if (st == KILN_OK && rope_pairs)
        st = rope_pair_rows(b, buf, row);
    if (st != KILN_OK)
        free(buf);
    else
        *out = buf;
    return st;
}

/* add_weights, with the rows reordered by rope_pair_rows when rope_pairs. */
static kiln_status add_weights_permuted(builder *b, const char *const *hf, const int64_t *rows, int32_t n, int64_t d1,
                                        const char *cname, int rope_pairs, kiln_tensor *out)
{
    void *buf = NULL;
    int64_t total;
    KILN_TRY(read_weights_permuted(b, hf, rows, n, d1, cname, rope_pairs, b->opt->dtype, &buf, &total));
    kiln_dims dims = d1 ? dims2(total, d1) : dims1(total);
    kiln_status st = kiln_network_add_constant_take(b->net, cname, b->opt->dtype, &dims, buf, out);
    if (st != KILN_OK)
        free(buf);
    return st;
}

/* Reads weight `hf` and adds it as a constant named like it. */
static kiln_status add_weight(builder *b, const char *hf, int32_t rank, int64_t d0, int64_t d1, kiln_tensor *out)
{
    return add_weights(b, &hf, &d0, 1, rank == 2 ? d1 : 0, hf, out);
}

static int has_weight(builder *b, const char *hf)
{
    kiln_dims dims;
    return b->ck->read_weight(b->ck->weight_user, hf, &dims, b->opt->dtype, NULL, 0) == KILN_OK;
}

static kiln_field field_i32(const char *name, const int32_t *v)
{
    return (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_I32, 1, v};
}

static kiln_field field_f32(const char *name, const float *v)
{
    return (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_F32, 1, v};
}

/* A built-in plugin layer with n_out outputs. */
static kiln_status plugin_n(builder *b, const char *name, const char *plugin_name, const kiln_field *fields, int32_t nf,
                            const kiln_tensor *in, int32_t n_in, kiln_tensor *out, int32_t n_out)
{
    int32_t got = 0;
    return kiln_network_add_plugin(b->net, name, plugin_name, "1", "kiln", fields, nf, in, n_in, out, n_out, &got);
}

static kiln_status plugin(builder *b, const char *name, const char *plugin_name, const kiln_field *fields, int32_t nf,
                          const kiln_tensor *in, int32_t n_in, kiln_tensor *out)
{
    return plugin_n(b, name, plugin_name, fields, nf, in, n_in, out, 1);
}

/* Formats kiln/QuantMatMul reads, and whether its CUDA kernels do. */
static const struct {
    uint32_t type;
    int cuda;
} quant_formats[] = {{KILN_GGML_Q8_0, 1}, {KILN_GGML_Q4_0, 1}, {KILN_GGML_Q4_1, 1}, {KILN_GGML_Q5_0, 0},
                     {KILN_GGML_Q5_1, 0}, {KILN_GGML_Q4_K, 1}, {KILN_GGML_Q5_K, 1}, {KILN_GGML_Q6_K, 1},
                     {KILN_GGML_F16, 0},  {KILN_GGML_BF16, 0}};

/* Appends `name` to the comma-separated list `list` (cap bytes) unless there. */
static void list_add(char *list, size_t cap, const char *name)
{
    size_t n = strlen(name), at = 0;
    for (const char *p = list; *p; p += at + (p[at] == ',')) {
        at = strcspn(p, ",");
        if (at == n && memcmp(p, name, n) == 0)
            return;
    }
    snprintf(list + strlen(list), cap - strlen(list), "%s%s", list[0] ? "," : "", name);
}

/* The format index in quant_formats of checkpoint weight `wname` when it
 * is stored in one QuantMatMul reads on the build's backend, else -1. A
 * format without a CUDA kernel in a CUDA build is expanded to the engine
 * dtype like an unquantized weight, and noted in b->expanded. */
static int quant_format(builder *b, const char *wname, const void **data, size_t *size)
{
    uint32_t type;
    if (!b->opt->native || !b->ck->read_quantized ||
        b->ck->read_quantized(b->ck->weight_user, wname, &type, data, size) != KILN_OK)
        return -1;
    for (size_t f = 0; f < sizeof quant_formats / sizeof quant_formats[0]; f++) {
        if (quant_formats[f].type != type)
            continue;
        if (b->opt->backend == KILN_BACKEND_CUDA && !quant_formats[f].cuda) {
            list_add(b->expanded, sizeof b->expanded, kiln_ggml_type_name(type));
            return -1;
        }
        return (int)f;
    }
    return -1;
}

/* Whether checkpoint weight `wname` stays as the checkpoint stores it: in
 * a ggml block format QuantMatMul reads (a native build), or as int4 /
 * int8 words (AWQ, GPTQ) for WeightOnlyMatMul. */
static int stored_quantized(builder *b, const char *wname)
{
    const void *data;
    size_t size;
    kiln_woq_weight qw;
    if (quant_format(b, wname, &data, &size) >= 0)
        return 1;
    if (b->ck->read_woq && b->ck->read_woq(b->ck->weight_user, wname, &qw) == KILN_OK) {
        kiln_woq_free(&qw);
        return 1;
    }
    return 0;
}

/* y = x·Wᵀ through kiln/QuantMatMul named `lname`, W the constant w of
 * `rows` rows of `in_dim` values in block format `fmt` (panels: in the
 * row-panel layout, qmatmul_cpu.h). */
static kiln_status quant_layer(builder *b, const char *fmt, kiln_tensor w, int64_t rows, int64_t in_dim, kiln_tensor x,
                               int32_t panels, const char *lname, kiln_tensor *y)
{
    int32_t nn = (int32_t)rows, k = (int32_t)in_dim;
    kiln_field fields[4] = {{sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "format", KILN_FIELD_STRING, 1, fmt},
                            field_i32("n", &nn),
                            field_i32("k", &k),
                            field_i32("panels", &panels)};
    kiln_tensor in[2] = {x, w};
    KILN_TRY(plugin(b, lname, "QuantMatMul", fields, panels ? 4 : 3, in, 2, y));
    /* the LLMC config lists the formats kept, in first-use order */
    list_add(b->ck->config.quantized, sizeof b->ck->config.quantized, fmt);
    return KILN_OK;
}

/* y = x·Wᵀ through kiln/QuantMatMul named `lname`, with W the checkpoint
 * weights `wname[0..n)` ([out_dim[i], in_dim] each) stacked along their
 * rows in their stored block format as constant `cname` (rows of blocks
 * stack as bytes); *done = 0 (nothing added) when the build is not native
 * or any part is in another format than the first. */
static kiln_status quant_matmul(builder *b, const char *const *wname, const int64_t *out_dim, int32_t n_parts,
                                const char *cname, const char *lname, kiln_tensor x, int64_t in_dim, kiln_tensor *y,
                                int *done)
{
    *done = 0;
    const void *data[3];
    size_t size[3], total = 0;
    int f = -1;
    if (n_parts > 3)
        return KILN_OK;
    for (int32_t i = 0; i < n_parts; i++) {
        int fi = quant_format(b, wname[i], &data[i], &size[i]);
        if (fi < 0 || (i > 0 && fi != f))
            return KILN_OK;
        f = fi;
    }
    uint32_t type = quant_formats[f].type;
    const char *fname = kiln_ggml_type_name(type);
    int64_t block = kiln_ggml_block_elements(type);
    /* QuantMatMul takes whole blocks and k a multiple of 32 (F16/BF16 too) */
    if (in_dim % (block > 32 ? block : 32) != 0)
        return KILN_OK;
    size_t row = (size_t)(in_dim / block) * kiln_ggml_block_bytes(type); /* dims bounded by config validation */
    int64_t rows = 0;
    for (int32_t i = 0; i < n_parts; i++) {
        kiln_dims dims;
        KILN_TRY(b->ck->read_weight(b->ck->weight_user, wname[i], &dims, KILN_DTYPE_F32, NULL, 0));
        if (dims.rank != 2 || dims.d[0] != out_dim[i] || dims.d[1] != in_dim || size[i] != row * (size_t)out_dim[i])
            return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\" (%s, %zu bytes) is not [%lld, %lld]", wname[i], fname,
                             size[i], (long long)out_dim[i], (long long)in_dim);
        rows += out_dim[i];
        total += size[i];
    }
    kiln_dims wd = dims2(rows, (int64_t)row);
    kiln_tensor w;
    /* CPU engines keep Q4_0/Q4_1 in 16-row panels: the decode GEMV reads
     * them at 2-3x the rate of stored blocks (qmatmul_cpu.h) */
    const qmm_format *qf = kiln_qmm_format((int32_t)type);
    int32_t panels = b->opt->backend == KILN_BACKEND_CPU && qf && kiln_qmm_panel_format(qf) &&
                     rows % QMM_PANEL_ROWS == 0 && row <= QMM_PANEL_ROW_BYTES;
    if (n_parts == 1 && !panels) {
        KILN_TRY(kiln_network_add_constant(b->net, cname, KILN_DTYPE_U8, &wd, data[0], &w));
    } else {
        unsigned char *cat = malloc(panels ? 2 * total : total);
        if (!cat)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for tensor \"%s\" (%zu bytes)", cname, total);
        for (size_t i = 0, at = 0; i < (size_t)n_parts; at += size[i], i++)
            memcpy(cat + at, data[i], size[i]);
        if (panels)
            kiln_qmm_panel_pack(qf, cat, rows, (int32_t)in_dim, cat + total);
        kiln_status st = kiln_network_add_constant(b->net, cname, KILN_DTYPE_U8, &wd, panels ? cat + total : cat, &w);
        free(cat);
        KILN_TRY(st);
    }
    KILN_TRY(quant_layer(b, fname, w, rows, in_dim, x, panels, lname, y));
    b->done_weights += n_parts;
    progress(b, "converting weights");
    *done = 1;
    return KILN_OK;
}

/* Weight `wname` ([n, k]) for kiln/WeightOnlyMatMul: as the checkpoint
 * stores it (AWQ, GPTQ), else quantized here by round-to-nearest when
 * `rtn` (the build asks for int8/int4 weights). *got = 0: neither. */
static kiln_status woq_weight(builder *b, const char *wname, int64_t n, int64_t k, int rtn, kiln_woq_weight *w,
                              int *got)
{
    *got = 0;
    if (b->ck->read_woq) {
        kiln_status st = b->ck->read_woq(b->ck->weight_user, wname, w);
        if (st == KILN_OK) {
            if (w->n != n || w->k != k) {
                kiln_woq_free(w);
                return kiln_fail(KILN_ERROR_SHAPE,
                                 "tensor \"%s\" is quantized as [%lld, %lld], the config says [%lld, %lld]", wname,
                                 (long long)w->n, (long long)w->k, (long long)n, (long long)k);
            }
            *got = 1;
            return KILN_OK;
        }
        if (st != KILN_ERROR_NOT_FOUND)
            return st;
    }
    /* k not a multiple of 32 (no Llama-family model has one) stays in dtype */
    if (!rtn || b->opt->weights == KILN_LLM_WEIGHTS_DTYPE || b->opt->weights == KILN_LLM_WEIGHTS_FP8 || k % 32 != 0)
        return KILN_OK;
    float *f = malloc((size_t)n * (size_t)k * sizeof(float)); /* dims bounded by config validation */
    if (!f)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for tensor \"%s\"", wname);
    kiln_status st = read_weight_into(b, wname, 2, n, k, KILN_DTYPE_F32, f, (size_t)n * (size_t)k * sizeof(float));
    int bits = b->opt->weights == KILN_LLM_WEIGHTS_INT8 ? 8 : 4;
    /* the default group: a whole row for int8, 128 for int4; one that
     * does not divide k (SmolLM2's 576 in groups of 128)
     * shrinks to the largest multiple of 32 that does: LLMC's
     * `quantized` lists each size used */
    int32_t group = b->opt->weights_group > 0 ? b->opt->weights_group : bits == 8 ? (int32_t)k : 128;
    while (k % group != 0)
        group -= 32;
    if (st == KILN_OK)
        st = kiln_woq_quantize(f, n, k, bits, group, wname, w);
    free(f);
    if (st == KILN_OK)
        *got = 1;
    return st;
}

/* Adds bytes[0..n) concatenated as one constant `name` [rows, cols]. */
static kiln_status add_concat(builder *b, const char *name, kiln_dtype t, int64_t rows, int64_t cols,
                              const void *const *parts, const size_t *bytes, int32_t n, kiln_tensor *out)
{
    size_t total = 0;
    for (int32_t i = 0; i < n; i++)
        total += bytes[i];
    unsigned char *cat = malloc(total ? total : 1);
    if (!cat)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for tensor \"%s\" (%zu bytes)", name, total);
    for (size_t i = 0, at = 0; i < (size_t)n; at += bytes[i], i++)
        memcpy(cat + at, parts[i], bytes[i]);
    kiln_dims d = dims2(rows, cols);
    kiln_status st = kiln_network_add_constant(b->net, name, t, &d, cat, out);
    free(cat);
    return st;
}

/* E4M3 codes [rows, k] and their per-row scales as the constants `cname`
 * (u8) and `cname`.scale (f32): kiln/Fp8MatMul's W, or FusedMatMul's
 * with weights = fp8. */
static kiln_status add_fp8_constants(builder *b, const char *cname, const uint8_t *codes, const float *scales,
                                     int64_t rows, int64_t k, kiln_tensor *w, kiln_tensor *w_scale)
{
    char name[200];
    kiln_dims d = dims2(rows, k);
    KILN_TRY(kiln_network_add_constant(b->net, cname, KILN_DTYPE_U8, &d, codes, w));
    snprintf(name, sizeof name, "%s.scale", cname);
    d = dims1(rows);
    KILN_TRY(kiln_network_add_constant(b->net, name, KILN_DTYPE_F32, &d, scales, w_scale));
    list_add(b->ck->config.quantized, sizeof b->ck->config.quantized, "fp8");
    return KILN_OK;
}

/* f32 weight rows f [rows, k] quantized to E4M3 per row (as fp8_matmul
 * quantizes) into the constants of add_fp8_constants. */
static kiln_status add_fp8_weight(builder *b, const char *cname, const float *f, int64_t rows, int64_t k,
                                  kiln_tensor *w, kiln_tensor *w_scale)
{
    uint8_t *codes = malloc((size_t)(rows * k));
    float *scales = malloc((size_t)rows * sizeof(float));
    kiln_status st =
        codes && scales ? KILN_OK : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for tensor \"%s\"", cname);
    if (st == KILN_OK)
        st = kiln_fp8_quantize(f, rows, k, cname, codes, scales);
    if (st == KILN_OK)
        st = add_fp8_constants(b, cname, codes, scales, rows, k, w, w_scale);
    free(codes);
    free(scales);
    return st;
}

/* y = x·Wᵀ through kiln/Fp8MatMul named `lname`, with W the weights
 * `wname[0..n)` ([out_dim[i], in_dim] each) quantized to E4M3 per output
 * channel and stacked by rows into the constants `cname` (codes) and
 * `cname`.scale. With xs non-NULL, x is already quantized: E4M3 codes
 * with the row scales *xs (Fp8MatMul's fourth input), y in the engine
 * dtype. *done = 0 when in_dim is not a multiple of 16. */
static kiln_status fp8_matmul(builder *b, const char *const *wname, const int64_t *out_dim, int32_t n_parts,
                              const char *cname, const char *lname, kiln_tensor x, const kiln_tensor *xs,
                              int64_t in_dim, kiln_tensor *y, int *done)
{
    *done = 0;
    if (in_dim % 16 != 0)
        return KILN_OK;
    int64_t rows = 0, maxr = 0;
    for (int32_t i = 0; i < n_parts; i++) {
        rows += out_dim[i];
        maxr = out_dim[i] > maxr ? out_dim[i] : maxr;
    }
    /* dims bounded by config validation */
    uint8_t *codes = malloc((size_t)(rows * in_dim));
    float *scales = malloc((size_t)rows * sizeof(float)), *f = malloc((size_t)(maxr * in_dim) * sizeof(float));
    kiln_status st =
        codes && scales && f ? KILN_OK : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for tensor \"%s\"", cname);
    for (int32_t i = 0, at = 0; i < n_parts && st == KILN_OK; at += (int32_t)out_dim[i], i++) {
        st = read_weight_into(b, wname[i], 2, out_dim[i], in_dim, KILN_DTYPE_F32, f,
                              (size_t)(out_dim[i] * in_dim) * sizeof(float));
        if (st == KILN_OK)
            st = kiln_fp8_quantize(f, out_dim[i], in_dim, wname[i], codes + (size_t)at * (size_t)in_dim, scales + at);
    }
    kiln_tensor in[4] = {x};
    if (xs)
        in[3] = *xs;
    if (st == KILN_OK)
        st = add_fp8_constants(b, cname, codes, scales, rows, in_dim, &in[1], &in[2]);
    int32_t nn = (int32_t)rows, k = (int32_t)in_dim;
    const float amax = b->x_amax;
    kiln_field fields[3] = {field_i32("n", &nn), field_i32("k", &k)};
    /* y's dtype for pre-quantized codes; else a static scale, if any */
    int32_t nf = 2;
    if (xs)
        fields[nf++] = (kiln_field){sizeof(kiln_field),
                                    KILN_PLUGIN_ABI_VERSION,
                                    "output_dtype",
                                    KILN_FIELD_STRING,
                                    1,
                                    kiln_dtype_name(b->opt->dtype)};
    else if (amax > 0.0f)
        fields[nf++] = field_f32("x_amax", &amax);
    if (st == KILN_OK)
        st = plugin(b, lname, "Fp8MatMul", fields, nf, in, xs ? 4 : 3, y);
    if (st == KILN_OK)
        *done = 1;
    free(codes);
    free(scales);
    free(f);
    return st;
}

/* y = x·Wᵀ through kiln/WeightOnlyMatMul named `lname`, with W the
 * weights `wname[0..n)` ([out_dim[i], in_dim] each) quantized (as stored
 * or by round-to-nearest when `rtn`) and stacked by rows into the
 * constants `cname` (q), `cname`.scales and `cname`.zeros. *done = 0
 * (nothing added) when some part is not quantized or the parts differ in
 * bits or group size. */
static kiln_status woq_matmul(builder *b, const char *const *wname, const int64_t *out_dim, int32_t n_parts,
                              const char *cname, const char *lname, kiln_tensor x, int64_t in_dim, int rtn,
                              kiln_tensor *y, int *done)
{
    *done = 0;
    kiln_woq_weight w[3];
    memset(w, 0, sizeof w);
    if (rtn && b->opt->weights == KILN_LLM_WEIGHTS_FP8) {
        /* a checkpoint's own int4 weights stay as stored */
        if (!b->ck->read_woq || b->ck->read_woq(b->ck->weight_user, wname[0], &w[0]) != KILN_OK)
            return fp8_matmul(b, wname, out_dim, n_parts, cname, lname, x, NULL, in_dim, y, done);
        kiln_woq_free(&w[0]);
    }
    kiln_status st = KILN_OK;
    int32_t got = 0;
    int64_t rows = 0;
    for (; got < n_parts && got < 3; got++) {
        int ok = 0;
        st = woq_weight(b, wname[got], out_dim[got], in_dim, rtn, &w[got], &ok);
        if (st != KILN_OK || !ok || w[got].bits != w[0].bits || w[got].group != w[0].group) {
            got += ok;
            goto out;
        }
        rows += out_dim[got];
    }
    const void *qp[3], *sp[3], *zp[3];
    size_t qb[3], sb[3], zb[3];
    for (int32_t i = 0; i < n_parts; i++) {
        qp[i] = w[i].q, sp[i] = w[i].scales, zp[i] = w[i].zeros;
        qb[i] = kiln_woq_q_bytes(&w[i]);
        sb[i] = kiln_woq_groups(&w[i]) * sizeof(float);
        zb[i] = kiln_woq_groups(&w[i]);
    }
    int32_t bits = w[0].bits, group = w[0].group, nn = (int32_t)rows, k = (int32_t)in_dim;
    char name[200];
    kiln_tensor in[4] = {x};
    st = add_concat(b, cname, KILN_DTYPE_U8, rows, in_dim * bits / 8, qp, qb, n_parts, &in[1]);
    snprintf(name, sizeof name, "%s.scales", cname);
    if (st == KILN_OK)
        st = add_concat(b, name, KILN_DTYPE_F32, rows, in_dim / group, sp, sb, n_parts, &in[2]);
    snprintf(name, sizeof name, "%s.zeros", cname);
    if (st == KILN_OK && bits == 4)
        st = add_concat(b, name, KILN_DTYPE_U8, rows, in_dim / group, zp, zb, n_parts, &in[3]);
    kiln_field fields[4] = {field_i32("bits", &bits), field_i32("group_size", &group), field_i32("n", &nn),
                            field_i32("k", &k)};
    if (st == KILN_OK)
        st = plugin(b, lname, "WeightOnlyMatMul", fields, 4, in, bits == 4 ? 4 : 3, y);
    if (st == KILN_OK) {
        char fmt[32];
        if (bits == 8 && group == k)
            snprintf(fmt, sizeof fmt, "int8");
        else
            snprintf(fmt, sizeof fmt, "int%d-g%d", bits, group);
        list_add(b->ck->config.quantized, sizeof b->ck->config.quantized, fmt);
        *done = 1;
    }
out:
    for (int32_t i = 0; i < got && i < 3; i++)
        kiln_woq_free(&w[i]);
    return st;
}

/* y = x·Wᵀ (+ bias) for an HF Linear named `hf` ("model.layers.0.self_attn.q_proj"). */
/* x quantized to E4M3 (codes, scales *xs) reached a matmul that is not
 * kiln/Fp8MatMul: fp8_layer promised it would be. */
static kiln_status fp8_input_lost(const char *lname)
{
    return kiln_fail(KILN_ERROR_INTERNAL, "LLM build: layer \"%s\" got E4M3 activations but is not an FP8 matmul",
                     lname);
}

/* y = x·Wᵀ (+ bias) with W the HF Linear `hf`; with xs non-NULL x is
 * E4M3 codes with the row scales *xs (fp8_layer). */
static kiln_status linear(builder *b, const char *hf, kiln_tensor x, const kiln_tensor *xs, int64_t out_dim,
                          int64_t in_dim, int bias, kiln_tensor *y)
{
    char wname[160], lname[176];
    kiln_tensor w;
    int done;
    snprintf(wname, sizeof wname, "%s.weight", hf);
    snprintf(lname, sizeof lname, "%s.matmul", hf);
    const char *wn = wname;
    if (xs) {
        KILN_TRY(fp8_matmul(b, &wn, &out_dim, 1, wname, lname, x, xs, in_dim, y, &done));
        if (!done)
            return fp8_input_lost(lname);
    } else {
        KILN_TRY(quant_matmul(b, &wn, &out_dim, 1, wname, lname, x, in_dim, y, &done));
    }
    if (!done)
        KILN_TRY(woq_matmul(b, &wn, &out_dim, 1, wname, lname, x, in_dim, 1, y, &done));
    if (!done) {
        KILN_TRY(add_weight(b, wname, 2, out_dim, in_dim, &w));
        KILN_TRY(kiln_network_add_matmul(b->net, lname, x, 0, w, 1, y));
    }
    if (bias) {
        kiln_tensor bt;
        snprintf(wname, sizeof wname, "%s.bias", hf);
        KILN_TRY(add_weight(b, wname, 1, out_dim, 0, &bt));
        snprintf(lname, sizeof lname, "%s.add_bias", hf);
        KILN_TRY(kiln_network_add_binary(b->net, lname, KILN_BINARY_ADD, *y, bt, y));
    }
    return KILN_OK;
}

/* The HF Linears `hf[0..n)` of one input x as one matmul over their
 * weights stacked by rows (`fused`: the stacked weight's name without
 * ".weight", e.g. "model.layers.0.self_attn.qkv_proj"): y holds their
 * outputs side by side in each row. *done = 0 (nothing added) when a
 * native build keeps some parts quantized in different formats (or some
 * quantized and some not): those stay separate matmuls. */
static kiln_status fused_linear(builder *b, const char *const *hf, const int64_t *out_dim, int32_t n, const char *fused,
                                kiln_tensor x, const kiln_tensor *xs, int64_t in_dim, int bias, kiln_tensor *y,
                                int *done)
{
    char wnames[3][160], bnames[3][160], cname[176], lname[176];
    const char *wn[3], *bn[3];
    for (int32_t i = 0; i < n; i++) {
        snprintf(wnames[i], sizeof wnames[i], "%s.weight", hf[i]);
        snprintf(bnames[i], sizeof bnames[i], "%s.bias", hf[i]);
        wn[i] = wnames[i], bn[i] = bnames[i];
    }
    snprintf(cname, sizeof cname, "%s.weight", fused);
    snprintf(lname, sizeof lname, "%s.matmul", fused);
    if (xs) {
        KILN_TRY(fp8_matmul(b, wn, out_dim, n, cname, lname, x, xs, in_dim, y, done));
        if (!*done)
            return fp8_input_lost(lname);
    } else {
        KILN_TRY(quant_matmul(b, wn, out_dim, n, cname, lname, x, in_dim, y, done));
    }
    if (!*done)
        KILN_TRY(woq_matmul(b, wn, out_dim, n, cname, lname, x, in_dim, 1, y, done));
    if (!*done) {
        for (int32_t i = 0; i < n; i++)
            if (stored_quantized(b, wn[i]))
                return KILN_OK;
        kiln_tensor w;
        KILN_TRY(add_weights(b, wn, out_dim, n, in_dim, cname, &w));
        KILN_TRY(kiln_network_add_matmul(b->net, lname, x, 0, w, 1, y));
        *done = 1;
    }
    if (bias) {
        kiln_tensor bt;
        snprintf(cname, sizeof cname, "%s.bias", fused);
        KILN_TRY(add_weights(b, bn, out_dim, n, 0, cname, &bt));
        snprintf(lname, sizeof lname, "%s.add_bias", fused);
        KILN_TRY(kiln_network_add_binary(b->net, lname, KILN_BINARY_ADD, *y, bt, y));
    }
    return KILN_OK;
}

/* Weights `gate` and `up` ([rows, d1] each) as one constant `cname`
 * [2 * rows, d1] whose rows alternate: row 2i is gate's row i, row 2i + 1
 * up's (kiln/FusedMatMul's SwiGLU epilogue finds a pair in one block);
 * read_weights_interleaved reads them so, in dtype t, into a new buffer. */
static kiln_status read_weights_interleaved(builder *b, const char *gate, const char *up, int64_t rows, int64_t d1,
                                            const char *cname, kiln_dtype t, void **out)
{
    size_t es = dtype_size(t), row = (size_t)d1 * es, part = (size_t)rows * row;
    unsigned char *buf = malloc(2 * part), *tmp = malloc(part);
    kiln_status st = buf && tmp ? KILN_OK
                                : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for tensor \"%s\" (%zu bytes)",
                                            cname, 2 * part);
    const char *src[2] = {gate, up};
    for (int h = 0; h < 2 && st == KILN_OK; h++) {
        st = read_weight_into(b, src[h], 2, rows, d1, t, tmp, part);
        for (int64_t r = 0; r < rows && st == KILN_OK; r++)
            memcpy(buf + (size_t)(2 * r + h) * row, tmp + (size_t)r * row, row);
    }
    free(tmp);
    if (st != KILN_OK)
        free(buf);
    else
        *out = buf;
    return st;
}

static kiln_status add_weights_interleaved(builder *b, const char *gate, const char *up, int64_t rows, int64_t d1,
                                           const char *cname, kiln_tensor *out)
{
    void *buf = NULL;
    KILN_TRY(read_weights_interleaved(b, gate, up, rows, d1, cname, b->opt->dtype, &buf));
    kiln_dims dims = dims2(2 * rows, d1);
    kiln_status st = kiln_network_add_constant_take(b->net, cname, b->opt->dtype, &dims, buf, out);
    if (st != KILN_OK)
        free(buf);
    return st;
}

/* Whether checkpoint weight `wname` becomes a constant in the engine
 * dtype (not QuantMatMul, WeightOnlyMatMul or Fp8MatMul). */
static int plain_weight(builder *b, const char *wname)
{
    return b->opt->weights == KILN_LLM_WEIGHTS_DTYPE && !stored_quantized(b, wname);
}

/* y = epilogue(RMSNorm(x) · Wᵀ) (norm_hf non-NULL: HF norm `norm_hf`) or
 * y = residual + x · Wᵀ through kiln/FusedMatMul named `lname`; y in
 * `output_dtype` ("default" or "f32", FusedMatMul's field). With w_scale
 * non-NULL, w is E4M3 codes and *w_scale their row scales (weights =
 * fp8). */
static kiln_status fused_matmul(builder *b, const char *lname, kiln_tensor x, kiln_tensor w, const kiln_tensor *w_scale,
                                int64_t n, int64_t k, const char *norm_hf, const char *epilogue,
                                const kiln_tensor *residual, const char *output_dtype, kiln_tensor *y)
{
    const kiln_llm_config *c = &b->ck->config;
    int32_t nn = (int32_t)n, kk = (int32_t)k, norm = norm_hf != NULL;
    float eps = (float)c->rms_norm_eps;
    kiln_field f[8] = {
        field_i32("n", &nn),
        field_i32("k", &kk),
        field_i32("norm", &norm),
        field_f32("epsilon", &eps),
        {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "epilogue", KILN_FIELD_STRING, 1, epilogue},
        {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "output_dtype", KILN_FIELD_STRING, 1, output_dtype},
        {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "weights", KILN_FIELD_STRING, 1, "fp8"},
        field_f32("x_amax", &b->x_amax)};
    kiln_tensor in[5] = {x, w};
    int32_t n_in = 2;
    if (w_scale)
        in[n_in++] = *w_scale;
    if (norm_hf) {
        char wname[160];
        snprintf(wname, sizeof wname, "%s.weight", norm_hf);
        KILN_TRY(add_weight(b, wname, 1, k, 0, &in[n_in++]));
    }
    if (residual)
        in[n_in++] = *residual;
    /* E4M3 weights: weights = fp8, and a static scale (b->x_amax) if any */
    return plugin(b, lname, "FusedMatMul", f, 6 + (w_scale != NULL) + (w_scale && b->x_amax > 0.0f), in, n_in, y);
}

/* y = RMSNorm(x) with HF weight `hf`.weight; with residual non-NULL the
 * residual add before it is fused in (kiln/AddRMSNorm): *x becomes x +
 * residual and y its norm. x is the residual stream, f32 whatever the
 * engine dtype; y is in the engine dtype, or with ys non-NULL E4M3 codes
 * and their row scales *ys (quantize = fp8: the input of an FP8 layer),
 * with amax > 0 a static scale (calibration). */
static kiln_status rmsnorm(builder *b, const char *hf, kiln_tensor *x, const kiln_tensor *residual, kiln_tensor *y,
                           kiln_tensor *ys, float amax)
{
    const kiln_llm_config *c = &b->ck->config;
    char wname[160];
    kiln_tensor w;
    snprintf(wname, sizeof wname, "%s.weight", hf);
    KILN_TRY(add_weight(b, wname, 1, c->hidden_size, 0, &w));
    float eps = (float)c->rms_norm_eps;
    kiln_field f[4] = {field_f32("epsilon", &eps),
                       {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "output_dtype", KILN_FIELD_STRING, 1,
                        kiln_dtype_name(b->opt->dtype)},
                       {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "quantize", KILN_FIELD_STRING, 1, "fp8"},
                       field_f32("x_amax", &amax)};
    const int32_t nf = ys ? 3 + (amax > 0.0f) : 2, q = ys != NULL;
    kiln_tensor out[3];
    if (!residual) {
        kiln_tensor in[2] = {*x, w};
        KILN_TRY(plugin_n(b, hf, "RMSNorm", f, nf, in, 2, out, 1 + q));
        *y = out[0];
    } else {
        kiln_tensor in[3] = {*x, *residual, w};
        KILN_TRY(plugin_n(b, hf, "AddRMSNorm", f, nf, in, 3, out, 2 + q));
        *x = out[0];
        *y = out[1];
    }
    if (ys)
        *ys = out[1 + (residual != NULL)];
    return KILN_OK;
}

/* A layer of plugin `plugin_name` with the fields `pre` then kiln/RoPE's
 * fields for n_heads heads (and n_kv_heads > 0: the packed qkv row). */
static kiln_status rope_layer(builder *b, const char *name, const char *plugin_name, const kiln_field *pre,
                              int32_t n_pre, const kiln_tensor *in, int32_t n_in, int32_t n_heads, int32_t n_kv_heads,
                              kiln_tensor *y)
{
    const kiln_llm_config *c = &b->ck->config;
    const kiln_llm_rope *r = &c->rope;
    float theta = (float)r->theta, factor = (float)r->factor, lo = (float)r->low_freq_factor,
          hi = (float)r->high_freq_factor;
    int32_t omax = r->original_max_pos > INT32_MAX ? INT32_MAX : (int32_t)r->original_max_pos;
    int32_t rotary = r->rotary_dim, inter = r->interleaved ? 1 : 0;
    const char *scaling = r->scaling == KILN_LLM_ROPE_LLAMA3   ? "llama3"
                          : r->scaling == KILN_LLM_ROPE_LINEAR ? "linear"
                                                               : "none";
    kiln_field f[20]; /* up to 8 of the caller's, then up to 11 of RoPE's */
    int32_t nf = 0;
    for (int32_t i = 0; i < n_pre && i < 8; i++)
        f[nf++] = pre[i];
    f[nf++] = field_i32("n_heads", &n_heads);
    if (n_kv_heads > 0)
        f[nf++] = field_i32("n_kv_heads", &n_kv_heads);
    f[nf++] = field_i32("head_dim", &c->head_dim);
    f[nf++] = field_f32("theta", &theta);
    f[nf++] = field_i32("rotary_dim", &rotary);
    f[nf++] = field_i32("interleaved", &inter);
    f[nf++] = (kiln_field){sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "scaling", KILN_FIELD_STRING, 1, scaling};
    if (r->scaling != KILN_LLM_ROPE_NONE)
        f[nf++] = field_f32("factor", &factor);
    if (r->scaling == KILN_LLM_ROPE_LLAMA3) {
        f[nf++] = field_f32("low_freq_factor", &lo);
        f[nf++] = field_f32("high_freq_factor", &hi);
        f[nf++] = field_i32("original_max_position", &omax);
    }
    return plugin(b, name, plugin_name, f, nf, in, n_in, y);
}

/* RoPE over x of n_heads heads, or with n_kv_heads > 0 over the packed
 * qkv row (n_heads q heads, then the k and v heads). */
static kiln_status rope(builder *b, const char *name, kiln_tensor x, kiln_tensor positions, int32_t n_heads,
                        int32_t n_kv_heads, kiln_tensor *y)
{
    kiln_tensor in[2] = {x, positions};
    return rope_layer(b, name, "RoPE", NULL, 0, in, 2, n_heads, n_kv_heads, y);
}

/* qkv = RoPE(RMSNorm(x) · Wᵀ) through kiln/FusedMatMul's rope epilogue,
 * w the stacked [Wq; Wk; Wv] with its rotated pairs adjacent
 * (rope_pair_rows). */
static kiln_status fused_qkv_rope(builder *b, const char *lname, kiln_tensor x, kiln_tensor w,
                                  const kiln_tensor *w_scale, int64_t n, int64_t k, const char *norm_hf,
                                  kiln_tensor positions, kiln_tensor *qkv)
{
    const kiln_llm_config *c = &b->ck->config;
    int32_t nn = (int32_t)n, kk = (int32_t)k, norm = 1;
    float eps = (float)c->rms_norm_eps;
    kiln_field f[7] = {field_i32("n", &nn),
                       field_i32("k", &kk),
                       field_i32("norm", &norm),
                       field_f32("epsilon", &eps),
                       {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "epilogue", KILN_FIELD_STRING, 1, "rope"},
                       {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "weights", KILN_FIELD_STRING, 1, "fp8"},
                       field_f32("x_amax", &b->x_amax)};
    char wname[160];
    kiln_tensor in[5] = {x, w};
    int32_t n_in = 2;
    if (w_scale)
        in[n_in++] = *w_scale;
    snprintf(wname, sizeof wname, "%s.weight", norm_hf);
    KILN_TRY(add_weight(b, wname, 1, k, 0, &in[n_in++]));
    in[n_in++] = positions;
    return rope_layer(b, lname, "FusedMatMul", f, 5 + (w_scale != NULL) + (w_scale && b->x_amax > 0.0f), in, n_in,
                      c->n_heads, c->n_kv_heads, qkv);
}

typedef struct step_inputs {
    kiln_tensor tokens, positions, block_table, seq_lens, query_start, last_token;
} step_inputs;

static kiln_status add_inputs(builder *b, int32_t max_blocks, step_inputs *in)
{
    kiln_network *net = b->net;
    const kiln_llm_build_options *o = b->opt;
    int32_t prof;
    KILN_TRY(kiln_network_add_profile(net, &prof));
    kiln_dims d;
    struct {
        const char *name;
        kiln_tensor *t;
        int two_d;   /* [S, max_blocks] */
        int64_t add; /* query_start has S + 1 rows */
        int per_seq; /* S rather than T */
    } io[] = {{"tokens", &in->tokens, 0, 0, 0},           {"positions", &in->positions, 0, 0, 0},
              {"block_table", &in->block_table, 1, 0, 1}, {"seq_lens", &in->seq_lens, 0, 0, 1},
              {"query_start", &in->query_start, 0, 1, 1}, {"last_token", &in->last_token, 0, 0, 1}};
    for (size_t i = 0; i < sizeof io / sizeof io[0]; i++) {
        int64_t hi = (io[i].per_seq ? o->max_batch : o->max_tokens) + io[i].add;
        int64_t lo = 1 + io[i].add;
        d = io[i].two_d ? dims2(-1, max_blocks) : dims1(-1);
        KILN_TRY(kiln_network_add_input(net, io[i].name, KILN_DTYPE_I32, &d, io[i].t));
        kiln_dims mn = io[i].two_d ? dims2(lo, max_blocks) : dims1(lo);
        kiln_dims mx = io[i].two_d ? dims2(hi, max_blocks) : dims1(hi);
        KILN_TRY(kiln_network_set_profile_shape(net, prof, io[i].name, &mn, &mn, &mx));
    }
    return KILN_OK;
}

/* A fused layer's matrix `cname`, [d1 columns]: the rows
 * read_weights_permuted gives (gate NULL: hf[0..n), rope_pairs) or
 * read_weights_interleaved (gate, up; rows[0] each), as a constant in the
 * engine dtype, or with ws non-NULL as E4M3 codes with row scales *ws
 * (quantized from f32 as kiln/Fp8MatMul's weights are: a row's scale does
 * not depend on where the row goes). */
static kiln_status fused_weight(builder *b, const char *const *hf, const int64_t *rows, int32_t n, int rope_pairs,
                                const char *gate, const char *up, int64_t d1, const char *cname, kiln_tensor *w,
                                kiln_tensor *ws)
{
    if (!ws)
        return gate ? add_weights_interleaved(b, gate, up, rows[0], d1, cname, w)
                    : add_weights_permuted(b, hf, rows, n, d1, cname, rope_pairs, w);
    void *f = NULL;
    int64_t total = 2 * rows[0];
    KILN_TRY(gate ? read_weights_interleaved(b, gate, up, rows[0], d1, cname, KILN_DTYPE_F32, &f)
                  : read_weights_permuted(b, hf, rows, n, d1, cname, rope_pairs, KILN_DTYPE_F32, &f, &total));
    kiln_status st = add_fp8_weight(b, cname, f, total, d1, w, ws);
    free(f);
    return st;
}

/* The decoder layer of plain weights as four kiln/FusedMatMul layers
 * around RoPE and attention: each norm rides on the matmul after it, each
 * residual add on the matmul before it (the O and down projections write
 * the updated residual stream *x), SwiGLU on the gate/up matmul. With fp8
 * the four matrices are E4M3 codes with per-channel scales (FusedMatMul's
 * weights = fp8; layer_fuses_fp8), and am their inputs' static maxima
 * (calibration; 0s: per row). */
static kiln_status fused_layer(builder *b, const char *p, const step_inputs *in, kiln_tensor cache, kiln_tensor *x,
                               int fp8, const float *am)
{
    const kiln_llm_config *c = &b->ck->config;
    const kiln_llm_build_options *o = b->opt;
    int64_t H = c->hidden_size, I = c->intermediate_size, qd = (int64_t)c->n_heads * c->head_dim,
            kvd = (int64_t)c->n_kv_heads * c->head_dim;
    char hf[3][160], wn[3][160], cname[176], lname[176], norm[128];
    const char *wp[3] = {wn[0], wn[1], wn[2]};
    const int64_t widths[3] = {qd, kvd, kvd};
    const char *parts[3] = {"q_proj", "k_proj", "v_proj"};
    for (int i = 0; i < 3; i++) {
        snprintf(hf[i], sizeof hf[i], "%s.self_attn.%s", p, parts[i]);
        snprintf(wn[i], sizeof wn[i], "%s.weight", hf[i]);
    }
    kiln_tensor w, wsc, qkv, a, m;
    kiln_tensor *ws = fp8 ? &wsc : NULL; /* the E4M3 weights' scales */
    snprintf(norm, sizeof norm, "%s.input_layernorm", p);
    if (!c->qkv_bias) {
        /* RoPE in the GEMV's epilogue: a rotated pair's rows side by side */
        snprintf(cname, sizeof cname, "%s.self_attn.qkv_rope_pairs.weight", p);
        KILN_TRY(fused_weight(b, wp, widths, 3, 1, NULL, NULL, H, cname, &w, ws));
        snprintf(lname, sizeof lname, "%s.self_attn.qkv_proj.norm_matmul_rope", p);
        b->x_amax = am[KILN_LLM_CALIB_QKV];
        KILN_TRY(fused_qkv_rope(b, lname, *x, w, ws, qd + 2 * kvd, H, norm, in->positions, &qkv));
        b->x_amax = 0.0f;
    } else {
        /* (not with fp8: layer_fuses_fp8) */
        snprintf(cname, sizeof cname, "%s.self_attn.qkv_proj.weight", p);
        KILN_TRY(add_weights(b, wp, widths, 3, H, cname, &w));
        snprintf(lname, sizeof lname, "%s.self_attn.qkv_proj.norm_matmul", p);
        KILN_TRY(fused_matmul(b, lname, *x, w, NULL, qd + 2 * kvd, H, norm, "none", NULL, "default", &qkv));
        char bn[3][160];
        const char *bp[3] = {bn[0], bn[1], bn[2]};
        kiln_tensor bt;
        for (int i = 0; i < 3; i++)
            snprintf(bn[i], sizeof bn[i], "%s.bias", hf[i]);
        snprintf(cname, sizeof cname, "%s.self_attn.qkv_proj.bias", p);
        KILN_TRY(add_weights(b, bp, widths, 3, 0, cname, &bt));
        snprintf(lname, sizeof lname, "%s.self_attn.qkv_proj.add_bias", p);
        KILN_TRY(kiln_network_add_binary(b->net, lname, KILN_BINARY_ADD, qkv, bt, &qkv));
        snprintf(lname, sizeof lname, "%s.self_attn.qkv_rope", p);
        KILN_TRY(rope(b, lname, qkv, in->positions, c->n_heads, c->n_kv_heads, &qkv));
    }
    const int32_t one = 1;
    kiln_field f[5] = {field_i32("n_heads", &c->n_heads), field_i32("n_kv_heads", &c->n_kv_heads),
                       field_i32("head_dim", &c->head_dim), field_i32("block_size", &o->block_size),
                       field_i32("packed_qkv", &one)};
    kiln_tensor ain[5] = {qkv, cache, in->block_table, in->seq_lens, in->query_start};
    snprintf(lname, sizeof lname, "%s.self_attn.attention", p);
    KILN_TRY(plugin(b, lname, "PagedAttention", f, 5, ain, 5, &a));

    snprintf(wn[0], sizeof wn[0], "%s.self_attn.o_proj.weight", p);
    KILN_TRY(fused_weight(b, wp, &H, 1, 0, NULL, NULL, qd, wn[0], &w, ws));
    snprintf(lname, sizeof lname, "%s.self_attn.o_proj.matmul_add", p);
    b->x_amax = am[KILN_LLM_CALIB_O];
    KILN_TRY(fused_matmul(b, lname, a, w, ws, H, qd, NULL, "residual", x, "default", x));

    snprintf(wn[0], sizeof wn[0], "%s.mlp.gate_proj.weight", p);
    snprintf(wn[1], sizeof wn[1], "%s.mlp.up_proj.weight", p);
    snprintf(cname, sizeof cname, "%s.mlp.gate_up_interleaved.weight", p);
    KILN_TRY(fused_weight(b, NULL, &I, 2, 0, wn[0], wn[1], H, cname, &w, ws));
    snprintf(lname, sizeof lname, "%s.mlp.gate_up_proj.norm_matmul_swiglu", p);
    snprintf(norm, sizeof norm, "%s.post_attention_layernorm", p);
    b->x_amax = am[KILN_LLM_CALIB_GATE_UP];
    KILN_TRY(fused_matmul(b, lname, *x, w, ws, 2 * I, H, norm, "swiglu", NULL, "default", &m));

    snprintf(wn[0], sizeof wn[0], "%s.mlp.down_proj.weight", p);
    KILN_TRY(fused_weight(b, wp, &H, 1, 0, NULL, NULL, I, wn[0], &w, ws));
    snprintf(lname, sizeof lname, "%s.mlp.down_proj.matmul_add", p);
    b->x_amax = am[KILN_LLM_CALIB_DOWN];
    kiln_status st = fused_matmul(b, lname, m, w, ws, H, I, NULL, "residual", x, "default", x);
    b->x_amax = 0.0f;
    return st;
}

/* Whether layer `p` ("model.layers.N") is built by fused_layer: the build
 * fuses and every matrix of the layer is plain. */
static int layer_fuses(builder *b, const char *p)
{
    static const char *const mats[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                       "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    char wname[160];
    if (!b->fuse)
        return 0;
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        snprintf(wname, sizeof wname, "%s.%s.weight", p, mats[i]);
        if (!plain_weight(b, wname))
            return 0;
    }
    return 1;
}

/* Whether layer `p` is built by fused_layer with E4M3 weights: an FP8
 * build that fuses, with KILN_LLM_FUSE_FP8=1 (b->fuse_fp8; not yet
 * measured on the GPU, so not the default), no q/k/v biases, every
 * matrix's in_dim a multiple of 16 and none kept in a GGUF block format. */
static int layer_fuses_fp8(builder *b, const char *p)
{
    static const char *const mats[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                       "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    const kiln_llm_config *c = &b->ck->config;
    if (!b->fuse || !b->fuse_fp8 || b->opt->weights != KILN_LLM_WEIGHTS_FP8 || c->qkv_bias || c->hidden_size % 16 ||
        c->intermediate_size % 16 || (int64_t)c->n_heads * c->head_dim % 16)
        return 0;
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        char wname[160];
        snprintf(wname, sizeof wname, "%s.%s.weight", p, mats[i]);
        if (stored_quantized(b, wname))
            return 0;
    }
    return 1;
}

/* Whether layer `p`'s q, k, v, gate, up and down projections all become
 * kiln/Fp8MatMul (an FP8 build, weights neither kept in a GGUF block
 * format nor stored int4, in_dims multiples of 16): then the norms and
 * SwiGLU before them hand them E4M3 codes and row scales (b->fp8_in), and
 * no matmul quantizes its x itself. */
static int fp8_layer(builder *b, const char *p)
{
    static const char *const mats[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                       "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    const kiln_llm_config *c = &b->ck->config;
    if (!b->fp8_in || b->opt->weights != KILN_LLM_WEIGHTS_FP8 || c->hidden_size % 16 || c->intermediate_size % 16)
        return 0;
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        char wname[160];
        snprintf(wname, sizeof wname, "%s.%s.weight", p, mats[i]);
        if (stored_quantized(b, wname))
            return 0;
    }
    return 1;
}

/* In a calibration build (ck->probe) the max |x| of each row of x, the
 * input of layer l's FP8 site `site` in an FP8 build, as the f32 output
 * "calib.<l * KILN_LLM_CALIB_SITES + site>" [tokens, 1]; else nothing. */
static kiln_status probe(builder *b, int32_t l, int site, kiln_tensor x)
{
    if (!b->ck->probe)
        return KILN_OK;
    kiln_dtype t;
    int32_t rank;
    KILN_TRY(kiln_network_tensor_info(b->net, x, &t, &rank));
    const int id = (int)(l * KILN_LLM_CALIB_SITES + site);
    char n[64];
    snprintf(n, sizeof n, "calib.%d.abs", id);
    KILN_TRY(kiln_network_add_unary(b->net, n, KILN_UNARY_ABS, x, &x));
    snprintf(n, sizeof n, "calib.%d.max", id);
    KILN_TRY(kiln_network_add_reduce(b->net, n, KILN_REDUCE_MAX, x, 1u << (rank - 1), 1, &x));
    if (t != KILN_DTYPE_F32) {
        snprintf(n, sizeof n, "calib.%d.f32", id);
        KILN_TRY(kiln_network_add_cast(b->net, n, x, KILN_DTYPE_F32, &x));
    }
    snprintf(n, sizeof n, "calib.%d", id);
    return kiln_network_mark_output(b->net, x, n);
}

/* One decoder layer. *x is the residual stream; *pending, when
 * *has_pending, is the previous layer's MLP output not yet added to it:
 * that add is fused with this layer's first norm, and this layer leaves
 * its own MLP output in *pending for the next norm (a layer's two
 * residual adds each ride on the norm that follows them). A fused layer
 * (fused_layer) adds what is pending first and leaves nothing pending. */
static kiln_status add_layer(builder *b, int32_t l, const step_inputs *in, kiln_tensor *x, kiln_tensor *pending,
                             int *has_pending)
{
    const kiln_llm_config *c = &b->ck->config;
    kiln_network *net = b->net;
    const kiln_llm_build_options *o = b->opt;
    char p[64], n[128];
    snprintf(p, sizeof p, "model.layers.%d", l);
    int64_t H = c->hidden_size, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;

    /* the layer's KV cache, bound by the generation runtime */
    kiln_tensor cache;
    kiln_dims cd;
    memset(&cd, 0, sizeof cd);
    cd.rank = 5;
    cd.d[0] = -1, cd.d[1] = 2, cd.d[2] = c->n_kv_heads, cd.d[3] = o->block_size, cd.d[4] = c->head_dim;
    snprintf(n, sizeof n, "kv_cache.%d", l);
    KILN_TRY(kiln_network_add_input(net, n, b->kv_dtype, &cd, &cache));
    kiln_dims mn = cd, mx = cd;
    mn.d[0] = 1;
    mx.d[0] = KILN_LLM_MAX_KV_BLOCKS;
    KILN_TRY(kiln_network_set_profile_shape(net, 0, n, &mn, &mn, &mx));

    /* the static maxima of the layer's FP8 inputs (calibration), or 0s */
    float am[KILN_LLM_CALIB_SITES] = {0};
    if (b->ck->act_amax && o->weights == KILN_LLM_WEIGHTS_FP8)
        memcpy(am, b->ck->act_amax + (size_t)l * KILN_LLM_CALIB_SITES, sizeof am);
    const int fuse_fp8 = layer_fuses_fp8(b, p);
    if (fuse_fp8 || layer_fuses(b, p)) {
        if (*has_pending) {
            kiln_tensor m = *pending;
            if (b->stream != o->dtype) {
                snprintf(n, sizeof n, "%s.residual_f32", p);
                KILN_TRY(kiln_network_add_cast(net, n, m, b->stream, &m));
            }
            snprintf(n, sizeof n, "%s.residual_add", p);
            KILN_TRY(kiln_network_add_binary(net, n, KILN_BINARY_ADD, *x, m, x));
        }
        *has_pending = 0;
        return fused_layer(b, p, in, cache, x, fuse_fp8, am);
    }
    kiln_tensor h, hs, qkv, a;
    const int q8 = fp8_layer(b, p);
    const kiln_tensor *hq = q8 ? &hs : NULL; /* h's row scales: h is E4M3 codes */
    snprintf(n, sizeof n, "%s.input_layernorm", p);
    KILN_TRY(rmsnorm(b, n, x, *has_pending ? pending : NULL, &h, q8 ? &hs : NULL, am[KILN_LLM_CALIB_QKV]));
    KILN_TRY(probe(b, l, KILN_LLM_CALIB_QKV, h));
    *has_pending = 1;
    b->x_amax = am[KILN_LLM_CALIB_QKV]; /* for Fp8MatMuls that quantize h themselves */
    char qn[160], kn[160], vn[160], fused[160];
    snprintf(qn, sizeof qn, "%s.self_attn.q_proj", p);
    snprintf(kn, sizeof kn, "%s.self_attn.k_proj", p);
    snprintf(vn, sizeof vn, "%s.self_attn.v_proj", p);
    snprintf(fused, sizeof fused, "%s.self_attn.qkv_proj", p);
    const char *parts[3] = {qn, kn, vn};
    const int64_t widths[3] = {qd, kvd, kvd};
    int done;
    KILN_TRY(fused_linear(b, parts, widths, 3, fused, h, hq, H, c->qkv_bias, &qkv, &done));
    kiln_field f[5] = {field_i32("n_heads", &c->n_heads), field_i32("n_kv_heads", &c->n_kv_heads),
                       field_i32("head_dim", &c->head_dim), field_i32("block_size", &o->block_size)};
    const int32_t one = 1;
    snprintf(n, sizeof n, "%s.self_attn.attention", p);
    if (done) {
        snprintf(fused, sizeof fused, "%s.self_attn.qkv_rope", p);
        KILN_TRY(rope(b, fused, qkv, in->positions, c->n_heads, c->n_kv_heads, &qkv));
        f[4] = field_i32("packed_qkv", &one);
        kiln_tensor ain[5] = {qkv, cache, in->block_table, in->seq_lens, in->query_start};
        KILN_TRY(plugin(b, n, "PagedAttention", f, 5, ain, 5, &a));
    } else {
        kiln_tensor q, k, v;
        KILN_TRY(linear(b, qn, h, hq, qd, H, c->qkv_bias, &q));
        KILN_TRY(linear(b, kn, h, hq, kvd, H, c->qkv_bias, &k));
        KILN_TRY(linear(b, vn, h, hq, kvd, H, c->qkv_bias, &v));
        snprintf(fused, sizeof fused, "%s.self_attn.q_rope", p);
        KILN_TRY(rope(b, fused, q, in->positions, c->n_heads, 0, &q));
        snprintf(fused, sizeof fused, "%s.self_attn.k_rope", p);
        KILN_TRY(rope(b, fused, k, in->positions, c->n_kv_heads, 0, &k));
        kiln_tensor ain[7] = {q, k, v, cache, in->block_table, in->seq_lens, in->query_start};
        KILN_TRY(plugin(b, n, "PagedAttention", f, 4, ain, 7, &a));
    }
    KILN_TRY(probe(b, l, KILN_LLM_CALIB_O, a));
    b->x_amax = am[KILN_LLM_CALIB_O];
    snprintf(n, sizeof n, "%s.self_attn.o_proj", p);
    KILN_TRY(linear(b, n, a, NULL, H, qd, 0, &a));

    kiln_tensor gu, m, ms;
    snprintf(n, sizeof n, "%s.post_attention_layernorm", p);
    KILN_TRY(rmsnorm(b, n, x, &a, &h, q8 ? &hs : NULL, am[KILN_LLM_CALIB_GATE_UP]));
    KILN_TRY(probe(b, l, KILN_LLM_CALIB_GATE_UP, h));
    b->x_amax = am[KILN_LLM_CALIB_GATE_UP];
    char gn[160], un[160];
    snprintf(gn, sizeof gn, "%s.mlp.gate_proj", p);
    snprintf(un, sizeof un, "%s.mlp.up_proj", p);
    snprintf(fused, sizeof fused, "%s.mlp.gate_up_proj", p);
    const char *mlp_parts[2] = {gn, un};
    const int64_t mlp_widths[2] = {c->intermediate_size, c->intermediate_size};
    KILN_TRY(fused_linear(b, mlp_parts, mlp_widths, 2, fused, h, hq, H, 0, &gu, &done));
    snprintf(n, sizeof n, "%s.mlp.swiglu", p);
    /* in an FP8 layer SwiGLU hands the down projection E4M3 codes */
    const float down_amax = am[KILN_LLM_CALIB_DOWN];
    kiln_field sf[3] = {field_i32("packed", &one),
                        {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "quantize", KILN_FIELD_STRING, 1, "fp8"},
                        field_f32("x_amax", &down_amax)};
    const int32_t nq = q8 ? 1 + (down_amax > 0.0f) : 0; /* quantize and x_amax */
    kiln_tensor so[2];
    memset(so, 0, sizeof so);
    if (done) {
        KILN_TRY(plugin_n(b, n, "SwiGLU", sf, 1 + nq, &gu, 1, so, 1 + q8));
    } else {
        kiln_tensor sin[2];
        KILN_TRY(linear(b, gn, h, hq, c->intermediate_size, H, 0, &sin[0]));
        KILN_TRY(linear(b, un, h, hq, c->intermediate_size, H, 0, &sin[1]));
        KILN_TRY(plugin_n(b, n, "SwiGLU", sf + 1, nq, sin, 2, so, 1 + q8));
    }
    m = so[0], ms = so[1];
    KILN_TRY(probe(b, l, KILN_LLM_CALIB_DOWN, m));
    b->x_amax = down_amax;
    snprintf(n, sizeof n, "%s.mlp.down_proj", p);
    kiln_status st = linear(b, n, m, q8 ? &ms : NULL, H, c->intermediate_size, 0, pending);
    b->x_amax = 0.0f;
    return st;
}

/* A native CPU engine keeps the token embedding as the checkpoint stores
 * it when that is a block format the host dequantizes: rows are gathered
 * and dequantized per token by kiln/QuantGather, and the file stays about
 * the checkpoint's size. With tied embeddings the output projection must
 * read the same constant, so its format must also be one QuantMatMul
 * reads (*lm_fmt: its index in quant_formats), in QuantMatMul's row
 * panels where the format has them (*panels; the gather reads rows back
 * out of them). x->id < 0 when the embedding is not kept quantized
 * (nothing added). */
static kiln_status quant_embedding(builder *b, kiln_tensor tokens, kiln_tensor *x, kiln_tensor *table, int *lm_fmt,
                                   int32_t *panels)
{
    const kiln_llm_config *c = &b->ck->config;
    const char *wname = "model.embed_tokens.weight";
    x->id = -1;
    *lm_fmt = -1;
    *panels = 0;
    uint32_t type;
    const void *data;
    size_t size;
    if (!b->opt->native || b->opt->backend != KILN_BACKEND_CPU || !b->ck->read_quantized ||
        b->ck->read_quantized(b->ck->weight_user, wname, &type, &data, &size) != KILN_OK)
        return KILN_OK;
    int64_t block = kiln_ggml_block_elements(type);
    const char *name = kiln_ggml_type_name(type);
    if (block <= 1 || !name || !kiln_ggml_can_dequantize(type) || c->hidden_size % block != 0)
        return KILN_OK;
    int f = quant_format(b, wname, &data, &size);
    if (c->tied_embeddings && f < 0)
        return KILN_OK;
    size_t row = (size_t)(c->hidden_size / block) * kiln_ggml_block_bytes(type);
    if (size != row * (size_t)c->vocab_size)
        return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\" (%s, %zu bytes) is not [%lld, %lld]", wname, name, size,
                         (long long)c->vocab_size, (long long)c->hidden_size);
    kiln_dims wd = dims2(c->vocab_size, (int64_t)row);
    const qmm_format *qf = kiln_qmm_format((int32_t)type);
    *panels = c->tied_embeddings && qf && kiln_qmm_panel_format(qf) && c->vocab_size % QMM_PANEL_ROWS == 0 &&
              row <= QMM_PANEL_ROW_BYTES;
    if (*panels) {
        unsigned char *packed = malloc(size);
        if (!packed)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for tensor \"%s\" (%zu bytes)", wname, size);
        kiln_qmm_panel_pack(qf, data, c->vocab_size, (int32_t)c->hidden_size, packed);
        kiln_status st = kiln_network_add_constant(b->net, wname, KILN_DTYPE_U8, &wd, packed, table);
        free(packed);
        KILN_TRY(st);
    } else {
        KILN_TRY(kiln_network_add_constant(b->net, wname, KILN_DTYPE_U8, &wd, data, table));
    }
    int32_t n = (int32_t)c->vocab_size, k = (int32_t)c->hidden_size;
    kiln_field fields[4] = {{sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, "format", KILN_FIELD_STRING, 1, name},
                            field_i32("n", &n),
                            field_i32("k", &k),
                            field_i32("panels", panels)};
    kiln_tensor in[2] = {*table, tokens};
    KILN_TRY(plugin(b, "embed", "QuantGather", fields, *panels ? 4 : 3, in, 2, x));
    if (b->stream != KILN_DTYPE_F32)
        KILN_TRY(kiln_network_add_cast(b->net, "embed_cast", *x, b->stream, x));
    list_add(b->ck->config.quantized, sizeof b->ck->config.quantized, name);
    *lm_fmt = c->tied_embeddings ? f : -1;
    b->done_weights++;
    progress(b, "converting weights");
    return KILN_OK;
}

/* Whether the output projection `lm_src` stays a constant in the engine
 * dtype: in a dtype build plain_weight's test; in a quantized one (int8,
 * int4, fp8) the head is kept unless --quantize-lm-head, or stored
 * quantized in the checkpoint. */
static int head_plain(builder *b, const char *lm_src)
{
    if (b->opt->weights == KILN_LLM_WEIGHTS_DTYPE)
        return plain_weight(b, lm_src);
    return !b->opt->weights_lm_head && !stored_quantized(b, lm_src);
}

static kiln_status build(builder *b, int32_t max_blocks)
{
    const kiln_llm_config *c = &b->ck->config;
    step_inputs in;
    KILN_TRY(add_inputs(b, max_blocks, &in));
    kiln_tensor emb, x, table;
    int lm_fmt = -1;       /* tied and kept quantized: the QuantMatMul format of table */
    int32_t lm_panels = 0; /* ... and table in its row panels */
    KILN_TRY(quant_embedding(b, in.tokens, &x, &table, &lm_fmt, &lm_panels));
    if (x.id < 0) {
        KILN_TRY(add_weight(b, "model.embed_tokens.weight", 2, c->vocab_size, c->hidden_size, &emb));
        KILN_TRY(kiln_network_add_gather(b->net, "embed", emb, in.tokens, 0, &x));
        /* the residual stream x is f32 in every engine: the sum of the
         * layers' outputs, rounded to 8 bits at every add in bf16, cost
         * 1.1 points of argmax agreement with the f32 engine (docs/llm.md) */
        if (b->stream != b->opt->dtype)
            KILN_TRY(kiln_network_add_cast(b->net, "embed_f32", x, b->stream, &x));
    }
    kiln_tensor pending;
    int has_pending = 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        KILN_TRY(add_layer(b, l, &in, &x, &pending, &has_pending));
    kiln_tensor h, lm, logits;
    int done = 0;
    const char *lm_src = c->tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    const int64_t vocab = c->vocab_size;
    if (b->fuse_head && lm_fmt < 0 && head_plain(b, lm_src)) {
        /* The final norm and the output projection as one FusedMatMul over
         * the last tokens' rows of the f32 stream, writing f32 logits: the
         * unfused head rounds them to the dtype first, which cost 0.5
         * points of argmax agreement with the f32 engine (docs/llm.md).
         * After unfused layers (FP8, int8, int4: their matmuls are not
         * FusedMatMul) the last MLP output is still to be added: only the
         * last tokens' rows of it, in f32 as AddRMSNorm adds them. */
        KILN_TRY(kiln_network_add_gather(b->net, "last_tokens", x, in.last_token, 0, &x));
        if (has_pending) {
            kiln_tensor m;
            KILN_TRY(kiln_network_add_gather(b->net, "last_tokens_mlp", pending, in.last_token, 0, &m));
            if (b->stream != b->opt->dtype)
                KILN_TRY(kiln_network_add_cast(b->net, "last_tokens_mlp_f32", m, b->stream, &m));
            KILN_TRY(kiln_network_add_binary(b->net, "last_tokens_residual_add", KILN_BINARY_ADD, x, m, &x));
        }
        if (c->tied_embeddings)
            lm = emb;
        else
            KILN_TRY(add_weight(b, "lm_head.weight", 2, c->vocab_size, c->hidden_size, &lm));
        KILN_TRY(
            fused_matmul(b, "lm_head", x, lm, NULL, vocab, c->hidden_size, "model.norm", "none", NULL, "f32", &logits));
        return kiln_network_mark_output(b->net, logits, "logits");
    }
    KILN_TRY(rmsnorm(b, "model.norm", &x, has_pending ? &pending : NULL, &h, NULL, 0.0f));
    KILN_TRY(kiln_network_add_gather(b->net, "last_tokens", h, in.last_token, 0, &h));
    /* Tied: the output projection reads the quantized embedding the gather
     * reads; or, when the gather reads f32 rows, a quantized copy of its
     * own where the checkpoint stores one. */
    if (lm_fmt >= 0) {
        KILN_TRY(quant_layer(b, kiln_ggml_type_name(quant_formats[lm_fmt].type), table, vocab, c->hidden_size, h,
                             lm_panels, "lm_head", &logits));
        b->done_weights++;
        done = 1;
    } else {
        KILN_TRY(quant_matmul(b, &lm_src, &vocab, 1, "lm_head.weight", "lm_head", h, c->hidden_size, &logits, &done));
        if (!done)
            KILN_TRY(woq_matmul(b, &lm_src, &vocab, 1, "lm_head.weight", "lm_head", h, c->hidden_size,
                                b->opt->weights_lm_head, &logits, &done));
    }
    if (!done) {
        if (c->tied_embeddings)
            lm = emb;
        else
            KILN_TRY(add_weight(b, "lm_head.weight", 2, c->vocab_size, c->hidden_size, &lm));
        KILN_TRY(kiln_network_add_matmul(b->net, "lm_head", h, 0, lm, 1, &logits));
    }
    if (b->opt->dtype != KILN_DTYPE_F32)
        KILN_TRY(kiln_network_add_cast(b->net, "logits_f32", logits, KILN_DTYPE_F32, &logits));
    return kiln_network_mark_output(b->net, logits, "logits");
}

/* What an engine must satisfy to run at all, refused here, at build, with
 * the limits named, instead of when the engine is first opened: a
 * sequence can hold a prompt token and generate one, a block fits in a
 * sequence, and the buffers the runtime sizes from these limits (block
 * table, logits, the KV cache's block count) can exist. */
static kiln_status check_limits(const kiln_llm_config *c, const kiln_llm_build_options *o)
{
    if (o->max_seq_len < 2)
        return kiln_fail(KILN_ERROR_LIMIT,
                         "LLM build: max_seq_len %d (the model's context: %lld) leaves no room to generate; "
                         "at least 2 tokens are needed",
                         o->max_seq_len, (long long)c->max_position_embeddings);
    if (o->block_size > o->max_seq_len)
        return kiln_fail(KILN_ERROR_LIMIT, "LLM build: block_size %d exceeds max_seq_len %d", o->block_size,
                         o->max_seq_len);
    int64_t blocks = (int64_t)o->max_batch * ((o->max_seq_len + o->block_size - 1) / o->block_size);
    if (blocks > KILN_LLM_MAX_KV_BLOCKS)
        return kiln_fail(KILN_ERROR_LIMIT,
                         "LLM build: max_batch %d sequences of max_seq_len %d in blocks of %d need %lld KV "
                         "blocks; a KV cache holds at most %d",
                         o->max_batch, o->max_seq_len, o->block_size, (long long)blocks, KILN_LLM_MAX_KV_BLOCKS);
    if ((int64_t)o->max_batch * c->vocab_size > KILN_LLM_MAX_LOGITS)
        return kiln_fail(KILN_ERROR_LIMIT, "LLM build: logits of max_batch %d x vocab_size %d exceed %lld values",
                         o->max_batch, c->vocab_size, (long long)KILN_LLM_MAX_LOGITS);
    return KILN_OK;
}

kiln_status kiln_llm_build_network(kiln_llm_checkpoint *ck, const kiln_llm_build_options *opt, kiln_registry *reg,
                                   kiln_network **out)
{
    kiln_llm_build_options o = *opt;
    o.native = o.native > 0;
    kiln_llm_config *c = &ck->config;
    KILN_TRY(kiln_llm_config_validate(c));
    if (o.dtype != KILN_DTYPE_F32 && o.dtype != KILN_DTYPE_F16 && o.dtype != KILN_DTYPE_BF16)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "LLM build: dtype must be f32, f16 or bf16");
    if (o.weights < KILN_LLM_WEIGHTS_DTYPE || o.weights > KILN_LLM_WEIGHTS_FP8)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "LLM build: weights %d is not dtype, int8, int4 or fp8",
                         o.weights);
    if (o.kv_cache < KILN_LLM_KV_AUTO || o.kv_cache > KILN_LLM_KV_FP8)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "LLM build: kv_cache %d is not auto, f32, f16, bf16 or fp8",
                         o.kv_cache);
    /* an FP8 cache is a u8 tensor of E4M3 codes (kiln/PagedAttention), as
     * Fp8MatMul's weights: the fp8 dtypes are reserved in the graph */
    static const kiln_dtype kv_types[] = {KILN_DTYPE_F32, KILN_DTYPE_F32, KILN_DTYPE_F16, KILN_DTYPE_BF16,
                                          KILN_DTYPE_U8};
    kiln_dtype kv_dtype = o.kv_cache != KILN_LLM_KV_AUTO ? kv_types[o.kv_cache]
                          : o.native && o.backend == KILN_BACKEND_CPU && o.dtype == KILN_DTYPE_F32 ? KILN_DTYPE_F16
                                                                                                   : o.dtype;
    if (o.backend == KILN_BACKEND_CUDA && kv_dtype != o.dtype && kv_dtype != KILN_DTYPE_U8)
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "LLM build: a %s KV cache with %s activations: the CUDA attention keeps the cache in the "
                         "activations' dtype or in fp8",
                         kiln_dtype_name(kv_dtype), kiln_dtype_name(o.dtype));
    if (o.weights_group < 0 || o.weights_group % 32 != 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "LLM build: weight group size %d is not a positive multiple of 32", o.weights_group);
    if (o.max_seq_len <= 0) {
        int64_t m = c->max_position_embeddings > 0 ? c->max_position_embeddings : 4096;
        o.max_seq_len = (int32_t)(m < 4096 ? m : 4096);
    }
    if (c->max_position_embeddings > 0 && o.max_seq_len > c->max_position_embeddings)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "LLM build: max_seq_len %d exceeds the model's context of %lld "
                         "tokens",
                         o.max_seq_len, (long long)c->max_position_embeddings);
    if (o.max_tokens <= 0)
        o.max_tokens = o.max_seq_len;
    if (o.max_batch <= 0 || o.block_size <= 0 || o.max_batch > (1 << 20) || o.block_size > (1 << 16) ||
        o.max_tokens > (1 << 24) || o.max_seq_len > (1 << 24))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "LLM build: max_batch %d, block_size %d, max_tokens %d or max_seq_len %d out of range",
                         o.max_batch, o.block_size, o.max_tokens, o.max_seq_len);
    KILN_TRY(check_limits(c, &o));
    if (c->rope.rotary_dim == 0)
        c->rope.rotary_dim = c->head_dim;
    c->dtype = o.dtype;
    c->max_seq_len = o.max_seq_len;
    c->max_batch = o.max_batch;
    c->max_tokens = o.max_tokens;
    c->block_size = o.block_size;
    c->quantized[0] = '\0';
    builder b = {.ck = ck, .opt = &o, .kv_dtype = kv_dtype};
    /* Decoder layers fuse on CUDA (their decode step is one GEMV per
     * matrix with the norms, residual adds and SwiGLU inside); on the CPU
     * they stay apart, where the matmuls run through OpenBLAS.
     * KILN_LLM_FUSE=0 or 1 overrides either (1 on the CPU runs the fused
     * layers' reference: tests). The first fused GEMVs measured slower
     * than the unfused layers on the H200 (1B decode 729 against 902
     * tok/s): their norm prologue cost about as much arithmetic as the
     * dot products at 2 weight rows a block. At 8 rows a block
     * (plugins/fusedmm/fusedmm_cuda.cu) it is a quarter of that, and the
     * H200's same-run A/B has the fused layers ahead (1B decode 927.5
     * against 877.0 tok/s, 8B 226.9 against 213.0; prefill about even:
     * bench/README.md). */
    const char *fuse_env = getenv("KILN_LLM_FUSE");
    b.fuse =
        fuse_env && (fuse_env[0] == '0' || fuse_env[0] == '1') ? fuse_env[0] == '1' : o.backend == KILN_BACKEND_CUDA;
    /* a calibration build reads the unfused layers' intermediate tensors */
    if (ck->probe)
        b.fuse = 0;
    /* The residual stream is f32 (docs/llm.md); KILN_LLM_RESIDUAL=dtype
     * keeps it in the engine dtype, as HF transformers' bf16 models do,
     * for A/B runs (speed, and the logits of HF's own bf16 forward). */
    const char *res_env = getenv("KILN_LLM_RESIDUAL");
    b.stream = res_env && strcmp(res_env, "dtype") == 0 ? o.dtype : KILN_DTYPE_F32;
    /* An FP8 layer's x is quantized by the norm or SwiGLU that writes it
     * (fp8_layer); KILN_LLM_FP8_INPUT=matmul leaves it to each Fp8MatMul,
     * as before, for A/B runs. */
    const char *fp8_env = getenv("KILN_LLM_FP8_INPUT");
    b.fp8_in = !(fp8_env && strcmp(fp8_env, "matmul") == 0);
    /* The head is fused where the layers are and their weights stay in
     * the dtype. In a quantized build (layers unfused) the fused head was
     * slower on the H200: 1B FP8 decode 1,281 against 1,304 tok/s with the
     * plain matmul and cast (bench/README.md, twenty-second session);
     * KILN_LLM_FUSE_HEAD=0 or 1 overrides either, for such A/B runs. */
    /* FP8 layers fused (fused_layer with E4M3 weights) with
     * KILN_LLM_FUSE_FP8=1: opt-in until measured on the GPU. */
    const char *fuse_fp8_env = getenv("KILN_LLM_FUSE_FP8");
    b.fuse_fp8 = fuse_fp8_env && strcmp(fuse_fp8_env, "1") == 0;
    const char *head_env = getenv("KILN_LLM_FUSE_HEAD");
    b.fuse_head = head_env && (head_env[0] == '0' || head_env[0] == '1')
                      ? head_env[0] == '1'
                      : b.fuse && o.weights == KILN_LLM_WEIGHTS_DTYPE;
    if (!c->tied_embeddings && !has_weight(&b, "lm_head.weight"))
        return kiln_fail(KILN_ERROR_NOT_FOUND,
                         "checkpoint has no tensor \"lm_head.weight\" and does not tie embeddings");
    /* embeddings, final norm, maybe lm_head; per layer 2 norms, 7 matrices, maybe 3 biases */
    b.n_weights = 2 + (!c->tied_embeddings || o.native) + (int64_t)c->n_layers * (9 + (c->qkv_bias ? 3 : 0));
    KILN_TRY(kiln_network_create(reg, &b.net));
    int32_t max_blocks = (o.max_seq_len + o.block_size - 1) / o.block_size;
    kiln_status st = build(&b, max_blocks);
    if (st != KILN_OK) {
        kiln_network_destroy(b.net);
        return st;
    }
    if (b.expanded[0])
        kiln_log(KILN_LOG_WARNING,
                 "LLM build: the %s weights are expanded to %s (QuantMatMul has no CUDA kernel for them)", b.expanded,
                 kiln_dtype_name(o.dtype));
    *out = b.net;
    return KILN_OK;
}

kiln_status kiln_llm_network_add_section(kiln_network *net, uint32_t id, const void *data, size_t size)
{
    kiln_graph *g = &net->graph;
    kiln_section_rec *s = realloc(g->sections, ((size_t)g->n_sections + 1) * sizeof *s);
    if (!s)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory adding an engine section");
    g->sections = s;
    void *copy = malloc(size ? size : 1);
    if (!copy)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory adding an engine section");
    if (size)
        memcpy(copy, data, size);
    s[g->n_sections++] = (kiln_section_rec){id, copy, size, 1};
    return KILN_OK;
}

static void forward_progress(void *user, double fraction, const char *what)
{
    const kiln_llm_build_options *o = user;
    o->progress(o->progress_user, 0.5 + 0.5 * fraction, what);
}

/* A template kiln cannot render fails the build, before any weight is read. */
static kiln_status check_chat_template(const kiln_llm_checkpoint *ck)
{
    kiln_jinja *t = NULL;
    kiln_status st = kiln_jinja_parse(ck->chat_template, strlen(ck->chat_template), &t);
    kiln_jinja_free(t);
    return st == KILN_OK ? st : kiln_fail_context(st, "the checkpoint's chat_template cannot be used");
}

/* The CHAT section (docs/llm.md): the template and the token texts it is
 * rendered with. */
static kiln_status add_chat_section(kiln_network *net, const kiln_llm_checkpoint *ck)
{
    json_t *o = json_pack("{s:s,s:s?,s:s?}", "template", ck->chat_template, "bos_token", ck->bos_token, "eos_token",
                          ck->eos_token);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        return kiln_fail(KILN_ERROR_FORMAT, "the checkpoint's chat_template or its special tokens are not valid UTF-8");
    kiln_status st = kiln_llm_network_add_section(net, KILN_LLM_SECTION_CHAT, text, strlen(text));
    free(text);
    return st;
}

/* The LLMC and TOKN sections are read back by the readers `kiln run`
 * uses, so that whatever they would refuse the build refuses first, with
 * their message. */
static kiln_status check_section_config(const char *json, size_t len)
{
    kiln_llm_config back;
    kiln_status st = kiln_llm_config_from_json(json, len, &back);
    return st == KILN_OK ? st : kiln_fail_context(st, "LLM build: section LLMC");
}

static kiln_status check_section_tokenizer(const void *data, size_t len)
{
    kiln_tokenizer *back = NULL;
    kiln_status st = kiln_tokenizer_deserialize(data, len, &back);
    kiln_tokenizer_free(back);
    return st == KILN_OK ? st : kiln_fail_context(st, "LLM build: section TOKN");
}

/* The engine into *engine, or streamed into the file `path` when given. */
static kiln_status build_engine(kiln_llm_checkpoint *ck, const kiln_llm_build_options *opt, kiln_registry *reg,
                                const kiln_build_config *bcfg, kiln_buffer *engine, const char *path)
{
    if (!ck->tokenizer)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "LLM build: the checkpoint has no tokenizer");
    if (ck->chat_template)
        KILN_TRY(check_chat_template(ck));
    kiln_network *net = NULL;
    KILN_TRY(kiln_llm_build_network(ck, opt, reg, &net));
    char *cfg_json = NULL;
    size_t cfg_len = 0;
    void *tok = NULL;
    size_t tok_len = 0;
    kiln_status st = kiln_llm_add_sampling(net, ck->config.max_batch, ck->config.vocab_size);
    if (st == KILN_OK)
        st = kiln_llm_config_to_json(&ck->config, &cfg_json, &cfg_len);
    if (st == KILN_OK)
        st = check_section_config(cfg_json, cfg_len);
    if (st == KILN_OK)
        st = kiln_llm_network_add_section(net, KILN_LLM_SECTION_CONFIG, cfg_json, cfg_len);
    if (st == KILN_OK)
        st = kiln_tokenizer_serialize(ck->tokenizer, &tok, &tok_len);
    if (st == KILN_OK)
        st = check_section_tokenizer(tok, tok_len);
    if (st == KILN_OK)
        st = kiln_llm_network_add_section(net, KILN_LLM_SECTION_TOKENIZER, tok, tok_len);
    if (st == KILN_OK && ck->chat_template)
        st = add_chat_section(net, ck);
    free(cfg_json);
    free(tok);
    if (st == KILN_OK) {
        kiln_build_config bc;
        if (bcfg)
            bc = *bcfg;
        else
            kiln_build_config_init(&bc);
        bc.backend = opt->backend;
        if (opt->progress) {
            bc.progress = forward_progress;
            bc.progress_user = (void *)opt;
        }
        st = path ? kiln_build_to_file(net, &bc, path) : kiln_build(net, &bc, engine);
    }
    kiln_network_destroy(net);
    return st;
}

kiln_status kiln_llm_build_engine(kiln_llm_checkpoint *ck, const kiln_llm_build_options *opt, kiln_registry *reg,
                                  const kiln_build_config *bcfg, kiln_buffer *engine)
{
    return build_engine(ck, opt, reg, bcfg, engine, NULL);
}

kiln_status kiln_llm_build_engine_file(kiln_llm_checkpoint *ck, const kiln_llm_build_options *opt, kiln_registry *reg,
                                       const kiln_build_config *bcfg, const char *path)
{
    return build_engine(ck, opt, reg, bcfg, NULL, path);
}
