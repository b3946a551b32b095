/* Hugging Face model directories: config.json, safetensors weights (one file
 * or shards listed by model.safetensors.index.json), tokenizer.json,
 * tokenizer_config.json, generation_config.json. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <strings.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/json_file.h"
#include "core/safetensors.h"
#include "llm/import_util.h"
#include "llm/model.h"

/* ---- config.json -------------------------------------------------------- */

typedef struct jfile {
    const char *what; /* file name for errors */
    json_t *root;
} jfile;

/* An integer key; absent → *present = 0 (when present is NULL the key is
 * required). */
static kiln_status j_int(const jfile *f, json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                         int *present)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (present) {
            *present = 0;
            return KILN_OK;
        }
        return kiln_fail(KILN_ERROR_FORMAT, "%s: missing key \"%s\"", f->what, key);
    }
    int64_t x;
    if (!kiln_json_int(v, &x))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s\": expected an integer", f->what, key);
    if (x < lo || x > hi)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s\" = %lld is outside [%lld, %lld]", f->what, key, (long long)x,
                         (long long)lo, (long long)hi);
    *out = x;
    if (present)
        *present = 1;
    return KILN_OK;
}

static kiln_status j_real(const jfile *f, json_t *obj, const char *key, double lo, double hi, double *out, int *present)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (present) {
            *present = 0;
            return KILN_OK;
        }
        return kiln_fail(KILN_ERROR_FORMAT, "%s: missing key \"%s\"", f->what, key);
    }
    if (!json_is_number(v))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s\": expected a number", f->what, key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s\" = %g is outside [%g, %g]", f->what, key, x, lo, hi);
    *out = x;
    if (present)
        *present = 1;
    return KILN_OK;
}

static kiln_status j_bool(const jfile *f, json_t *obj, const char *key, int *out, int *present)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *present = 0;
        return KILN_OK;
    }
    if (!json_is_boolean(v))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s\": expected true or false", f->what, key);
    *out = json_is_true(v);
    *present = 1;
    return KILN_OK;
}

/* rope_scaling (transformers 4) or rope_parameters (transformers 5). */
static kiln_status parse_rope(const jfile *f, json_t *rs, const char *key, kiln_llm_config *c)
{
    if (!json_is_object(rs))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s\": expected an object", f->what, key);
    int has;
    double theta = 0;
    KILN_TRY(j_real(f, rs, "rope_theta", 1e-9, 1e30, &theta, &has));
    if (has)
        c->rope.theta = theta;
    json_t *t = json_object_get(rs, "rope_type");
    if (!t)
        t = json_object_get(rs, "type");
    const char *type = json_is_string(t) ? json_string_value(t) : NULL;
    if (t && !type)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s.rope_type\": expected a string", f->what, key);
    if (!type || strcmp(type, "default") == 0) {
        c->rope.scaling = KILN_LLM_ROPE_NONE;
        return KILN_OK;
    }
    KILN_TRY(j_real(f, rs, "factor", 1e-6, 1e6, &c->rope.factor, NULL));
    if (strcmp(type, "linear") == 0) {
        c->rope.scaling = KILN_LLM_ROPE_LINEAR;
        return KILN_OK;
    }
    if (strcmp(type, "llama3") == 0) {
        c->rope.scaling = KILN_LLM_ROPE_LLAMA3;
        KILN_TRY(j_real(f, rs, "low_freq_factor", 1e-6, 1e6, &c->rope.low_freq_factor, NULL));
        KILN_TRY(j_real(f, rs, "high_freq_factor", 1e-6, 1e6, &c->rope.high_freq_factor, NULL));
        KILN_TRY(j_int(f, rs, "original_max_position_embeddings", 1, INT32_MAX, &c->rope.original_max_pos, NULL));
        if (!(c->rope.high_freq_factor > c->rope.low_freq_factor))
            return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s\": high_freq_factor must exceed low_freq_factor", f->what,
                             key);
        return KILN_OK;
    }
    return kiln_fail(KILN_ERROR_UNSUPPORTED,
                     "%s: key \"%s.rope_type\" = \"%s\" is not supported (default, linear, "
                     "llama3)",
                     f->what, key, type);
}

static kiln_status parse_config(const jfile *f, kiln_llm_config *c)
{
    json_t *o = f->root;
    if (!json_is_object(o))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: expected a JSON object", f->what);
    json_t *archs = json_object_get(o, "architectures");
    const char *arch = NULL;
    if (json_is_array(archs) && json_array_size(archs) > 0 && json_is_string(json_array_get(archs, 0)))
        arch = json_string_value(json_array_get(archs, 0));
    json_t *mt = json_object_get(o, "model_type");
    if (!arch && !json_is_string(mt))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: missing key \"architectures\" (or \"model_type\")", f->what);
    const char *family;
    if (arch ? strcmp(arch, "LlamaForCausalLM") == 0 : strcmp(json_string_value(mt), "llama") == 0)
        family = "llama";
    else if (arch ? strcmp(arch, "MistralForCausalLM") == 0 : strcmp(json_string_value(mt), "mistral") == 0)
        family = "mistral";
    else if (arch ? strcmp(arch, "Qwen2ForCausalLM") == 0 : strcmp(json_string_value(mt), "qwen2") == 0)
        family = "qwen2";
    else
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "%s: architecture \"%s\" is not supported (LlamaForCausalLM, "
                         "MistralForCausalLM, Qwen2ForCausalLM)",
                         f->what, arch ? arch : json_string_value(mt));
    snprintf(c->architecture, sizeof c->architecture, "%s", family);

    int64_t v = 0;
    int has = 0;
    const int64_t big = INT32_MAX;
    KILN_TRY(j_int(f, o, "vocab_size", 1, big, &v, NULL));
    c->vocab_size = (int32_t)v;
    KILN_TRY(j_int(f, o, "hidden_size", 1, big, &v, NULL));
    c->hidden_size = (int32_t)v;
    KILN_TRY(j_int(f, o, "intermediate_size", 1, big, &v, NULL));
    c->intermediate_size = (int32_t)v;
    KILN_TRY(j_int(f, o, "num_hidden_layers", 1, 65536, &v, NULL));
    c->n_layers = (int32_t)v;
    KILN_TRY(j_int(f, o, "num_attention_heads", 1, 65536, &v, NULL));
    c->n_heads = (int32_t)v;
    KILN_TRY(j_int(f, o, "num_key_value_heads", 1, 65536, &v, &has));
    c->n_kv_heads = has ? (int32_t)v : c->n_heads;
    if (c->n_heads % c->n_kv_heads != 0)
        return kiln_fail(KILN_ERROR_FORMAT,
                         "%s: key \"num_attention_heads\" = %d is not a multiple of "
                         "\"num_key_value_heads\" = %d",
                         f->what, c->n_heads, c->n_kv_heads);
    KILN_TRY(j_int(f, o, "head_dim", 2, 65536, &v, &has));
    if (has) {
        c->head_dim = (int32_t)v;
    } else {
        if (c->hidden_size % c->n_heads != 0)
            return kiln_fail(KILN_ERROR_FORMAT,
                             "%s: key \"hidden_size\" = %d is not a multiple of "
                             "\"num_attention_heads\" = %d (and no \"head_dim\")",
                             f->what, c->hidden_size, c->n_heads);
        c->head_dim = c->hidden_size / c->n_heads;
    }
    KILN_TRY(j_real(f, o, "rms_norm_eps", 0.0, 0.5, &c->rms_norm_eps, &has));
    if (!has)
        c->rms_norm_eps = 1e-6;
    KILN_TRY(j_int(f, o, "max_position_embeddings", 1, INT64_MAX, &c->max_position_embeddings, &has));
    double theta = 0;
    KILN_TRY(j_real(f, o, "rope_theta", 1e-9, 1e30, &theta, &has));
    if (has)
        c->rope.theta = theta;
    json_t *rs = json_object_get(o, "rope_parameters");
    const char *rkey = "rope_parameters";
    if (!rs || json_is_null(rs)) {
        rs = json_object_get(o, "rope_scaling");
        rkey = "rope_scaling";
    }
    if (rs && !json_is_null(rs))
        KILN_TRY(parse_rope(f, rs, rkey, c));
    double partial = 0;
    KILN_TRY(j_real(f, o, "partial_rotary_factor", 1e-6, 1.0, &partial, &has));
    c->rope.rotary_dim = has ? 2 * (int32_t)(c->head_dim * partial / 2) : c->head_dim;
    int tied = 0;
    KILN_TRY(j_bool(f, o, "tie_word_embeddings", &tied, &has));
    /* transformers' default for Llama, Mistral and Qwen2 configs is untied */
    c->tied_embeddings = has ? tied : 0;
    int bias = 0;
    KILN_TRY(j_bool(f, o, "attention_bias", &bias, &has));
    c->qkv_bias = strcmp(family, "qwen2") == 0 ? 1 : bias;
    int mlp_bias = 0;
    KILN_TRY(j_bool(f, o, "mlp_bias", &mlp_bias, &has));
    if (mlp_bias)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: key \"mlp_bias\" = true is not supported", f->what);
    if (bias && strcmp(family, "qwen2") != 0)
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "%s: key \"attention_bias\" = true is not supported (it also "
                         "biases o_proj)",
                         f->what);
    json_t *act = json_object_get(o, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: key \"hidden_act\": only \"silu\" is supported", f->what);
    int sliding = 0;
    KILN_TRY(j_bool(f, o, "use_sliding_window", &sliding, &has));
    if (sliding)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: key \"use_sliding_window\" = true is not supported", f->what);
    if (strcmp(family, "mistral") == 0) {
        /* Mistral attends within a sliding window; kiln's attention has none,
         * so the context is limited to the window, where both agree. */
        int64_t win = 0;
        KILN_TRY(j_int(f, o, "sliding_window", 1, INT64_MAX, &win, &has));
        if (has && (c->max_position_embeddings == 0 || win < c->max_position_embeddings))
            c->max_position_embeddings = win;
    }
    return KILN_OK;
}

static kiln_status load_json(const char *text, size_t len, const char *what, jfile *f)
{
    json_error_t err;
    f->what = what;
    f->root = kiln_json_load_file_text(text, len, 0, &err);
    if (!f->root)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: invalid JSON at line %d column %d: %s", what, err.line, err.column,
                         err.text);
    return KILN_OK;
}

kiln_status kiln_llm_hf_parse_config(const char *text, size_t len, const char *what, kiln_llm_config *cfg)
{
    jfile f;
    KILN_TRY(load_json(text, len, what, &f));
    kiln_llm_config c;
    kiln_llm_config_init(&c);
    kiln_status st = parse_config(&f, &c);
    if (st == KILN_OK && json_is_object(f.root)) {
        /* special tokens from config.json: the fallback when
         * generation_config.json is absent */
        json_t *e = json_object_get(f.root, "eos_token_id");
        int64_t id;
        if (kiln_json_int(e, &id)) {
            if (id >= 0 && id < c.vocab_size) {
                c.eos_ids[0] = (int32_t)id;
                c.n_eos = 1;
            }
        } else if (json_is_array(e)) {
            for (size_t i = 0; i < json_array_size(e) && c.n_eos < KILN_LLM_MAX_EOS; i++)
                if (kiln_json_int(json_array_get(e, i), &id) && id >= 0 && id < c.vocab_size)
                    c.eos_ids[c.n_eos++] = (int32_t)id;
        }
        if (kiln_json_int(json_object_get(f.root, "bos_token_id"), &id) && id >= 0 && id < c.vocab_size)
            c.bos_id = (int32_t)id;
    }
    if (st == KILN_OK)
        st = kiln_llm_config_validate(&c);
    if (st != KILN_OK)
        kiln_fail_context(st, "%s", what);
    json_decref(f.root);
    if (st == KILN_OK)
        *cfg = c;
    return st;
}

/* ---- weights ------------------------------------------------------------ */

typedef struct hf_weights {
    kiln_safetensors **shards;
    char **shard_paths;
    int32_t n_shards;
    kiln_llm_quant_config quant; /* how the linear layers are stored */
} hf_weights;

static void hf_weights_free(void *user)
{
    hf_weights *w = user;
    if (!w)
        return;
    for (int32_t i = 0; i < w->n_shards; i++) {
        kiln_safetensors_destroy(w->shards[i]);
        free(w->shard_paths[i]);
    }
    free(w->shards);
    free(w->shard_paths);
    free(w);
}

/* The mapped checkpoint pages of a tensor just converted leave the
 * process (they stay in the page cache: a second read, as of tied
 * embeddings, faults them back in), so a build holds the checkpoint's
 * weights once, in the network, not also as mapped file pages. Shards
 * are read-only file mappings (kiln_safetensors_open), so dropping a page
 * never loses a byte. */
static void drop_pages(const void *p, size_t n)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(page - 1);
    if (n > 0)
        (void)madvise((void *)a, (uintptr_t)p + n - a, MADV_DONTNEED);
}

static kiln_status hf_read_weight(void *user, const char *name, kiln_dims *dims, kiln_dtype dst_type, void *dst,
                                  size_t dst_size)
{
    hf_weights *w = user;
    for (int32_t i = 0; i < w->n_shards; i++) {
        const kiln_safetensors_tensor *t;
        if (kiln_safetensors_find(w->shards[i], name, &t) != KILN_OK)
            continue;
        if (t->dtype != KILN_DTYPE_F32 && t->dtype != KILN_DTYPE_F16 && t->dtype != KILN_DTYPE_BF16)
            return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: tensor \"%s\" has dtype %s (F32, F16 or BF16 expected)",
                             w->shard_paths[i], name, t->dtype_name);
        *dims = t->dims;
        if (!dst)
            return KILN_OK;
        size_t n = 1;
        for (int32_t d = 0; d < t->dims.rank; d++)
            if (kiln_mul_overflow(n, (size_t)t->dims.d[d], &n))
                return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\" is too large", w->shard_paths[i], name);
        size_t src_es = t->dtype == KILN_DTYPE_F32 ? 4 : 2, dst_es = dst_type == KILN_DTYPE_F32 ? 4 : 2, need;
        if (kiln_mul_overflow(n, src_es, &need) || need != t->size)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\" holds %zu bytes, its shape needs more or less",
                             w->shard_paths[i], name, t->size);
        if (kiln_mul_overflow(n, dst_es, &need) || need != dst_size)
            return kiln_fail(KILN_ERROR_INTERNAL, "tensor \"%s\": destination of %zu bytes, %zu needed", name, dst_size,
                             need);
        kiln_convert(dst, dst_type, t->data, t->dtype, (int64_t)n);
        drop_pages(t->data, t->size);
        return KILN_OK;
    }
    return KILN_ERROR_NOT_FOUND;
}

/* Tensor `name` of dtype t, any shape, found in some shard: *dims and a
 * borrowed pointer to its bytes (checked against the shape). */
static kiln_status hf_find_raw(hf_weights *w, const char *name, kiln_dtype t, kiln_dims *dims, const void **data)
{
    for (int32_t i = 0; i < w->n_shards; i++) {
        const kiln_safetensors_tensor *st;
        if (kiln_safetensors_find(w->shards[i], name, &st) != KILN_OK)
            continue;
        if (st->dtype != t)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\" has dtype %s (%s expected)", w->shard_paths[i], name,
                             st->dtype_name, kiln_dtype_name(t));
        size_t n = kiln_dtype_size(t);
        for (int32_t d = 0; d < st->dims.rank; d++)
            if (kiln_mul_overflow(n, (size_t)st->dims.d[d], &n))
                return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\" is too large", w->shard_paths[i], name);
        if (n != st->size)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\" holds %zu bytes, its shape needs %zu",
                             w->shard_paths[i], name, st->size, n);
        *dims = st->dims;
        *data = st->data;
        return KILN_OK;
    }
    return KILN_ERROR_NOT_FOUND;
}

/* A tensor [d0, d1] of name `base`.`suffix` in dtype t, or an error naming it. */
static kiln_status hf_quant_part(hf_weights *w, const char *base, const char *suffix, kiln_dtype t, int64_t d0,
                                 int64_t d1, const void **data)
{
    char name[200];
    kiln_dims dims;
    snprintf(name, sizeof name, "%s.%s", base, suffix);
    kiln_status st = hf_find_raw(w, name, t, &dims, data);
    if (st == KILN_ERROR_NOT_FOUND)
        return kiln_fail(KILN_ERROR_FORMAT, "checkpoint has %s.qweight but no tensor \"%s\"", base, name);
    KILN_TRY(st);
    if (dims.rank != (d1 ? 2 : 1) || dims.d[0] != d0 || (d1 && dims.d[1] != d1))
        return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\" is not [%lld%s%lld] as its qweight implies", name,
                         (long long)d0, d1 ? ", " : "", (long long)(d1 ? d1 : 0));
    return KILN_OK;
}

/* AWQ and GPTQ linears: `name` is "….weight"; the layer's qweight,
 * qzeros, scales (and GPTQ's g_idx) are read as the formats lay them out
 * (llm/woq.h) into kiln's int4 layout. */
static kiln_status hf_read_woq(void *user, const char *name, kiln_woq_weight *out)
{
    hf_weights *w = user;
    size_t len = strlen(name);
    char base[192], qname[200];
    if (w->quant.method == KILN_LLM_QUANT_NONE || len < 8 || len - 7 >= sizeof base ||
        strcmp(name + len - 7, ".weight") != 0)
        return KILN_ERROR_NOT_FOUND;
    memcpy(base, name, len - 7);
    base[len - 7] = '\0';
    snprintf(qname, sizeof qname, "%s.qweight", base);
    kiln_dims qd;
    const void *qweight, *qzeros, *scales16, *g_idx = NULL;
    kiln_status st = hf_find_raw(w, qname, KILN_DTYPE_I32, &qd, &qweight);
    if (st != KILN_OK)
        return st;
    if (qd.rank != 2)
        return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\" has rank %d, expected 2", qname, qd.rank);
    /* AWQ: [k, n / 8]; GPTQ: [k / 8, n] */
    const int awq = w->quant.method == KILN_LLM_QUANT_AWQ;
    int64_t k = awq ? qd.d[0] : qd.d[0] * 8, n = awq ? qd.d[1] * 8 : qd.d[1];
    int32_t group = w->quant.group < 0 ? (int32_t)k : w->quant.group;
    if (k <= 0 || n <= 0 || k % group != 0 || k > (1 << 30) || n > (1 << 30))
        return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\": %lld inputs are not a multiple of group_size %d", qname,
                         (long long)k, group);
    int64_t ng = k / group;
    KILN_TRY(hf_quant_part(w, base, "qzeros", KILN_DTYPE_I32, ng, n / 8, &qzeros));
    KILN_TRY(hf_quant_part(w, base, "scales", KILN_DTYPE_F16, ng, n, &scales16));
    if (!awq) {
        kiln_dims gd;
        snprintf(qname, sizeof qname, "%s.g_idx", base);
        st = hf_find_raw(w, qname, KILN_DTYPE_I32, &gd, &g_idx);
        if (st == KILN_OK && (gd.rank != 1 || gd.d[0] != k))
            return kiln_fail(KILN_ERROR_SHAPE, "tensor \"%s\" is not [%lld]", qname, (long long)k);
        if (st != KILN_OK && st != KILN_ERROR_NOT_FOUND)
            return st;
    }
    float *scales = malloc((size_t)(ng * n) * sizeof(float));
    if (!scales)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory reading \"%s.scales\"", base);
    kiln_convert(scales, KILN_DTYPE_F32, scales16, KILN_DTYPE_F16, ng * n);
    /* the files are little-endian int32, as this machine (kiln's engines
     * assume it too) */
    if (awq)
        st = kiln_woq_from_awq(qweight, qzeros, scales, n, k, group, base, out);
    else
        st = kiln_woq_from_gptq(qweight, qzeros, scales, g_idx, n, k, group, (int32_t)ng, w->quant.zero_offset, base,
                                out);
    free(scales);
    return st;
}

kiln_status kiln_llm_hf_parse_quant_config(const char *text, size_t len, const char *what, kiln_llm_quant_config *out)
{
    jfile f;
    kiln_llm_quant_config qc = {KILN_LLM_QUANT_NONE, 0, 0}, *w = &qc;
    KILN_TRY(load_json(text, len, what, &f));
    json_t *q = json_object_get(f.root, "quantization_config");
    kiln_status st = KILN_OK;
    if (!q || json_is_null(q))
        goto done;
    const char *method = json_string_value(json_object_get(q, "quant_method"));
    int64_t bits = 0, group = 0;
    if (!method) {
        st = kiln_fail(KILN_ERROR_FORMAT, "%s: quantization_config has no quant_method", what);
        goto done;
    }
    if (strcmp(method, "awq") != 0 && strcmp(method, "gptq") != 0) {
        st = kiln_fail(KILN_ERROR_UNSUPPORTED,
                       "%s: quantization_config.quant_method \"%s\" is not supported (awq, gptq)", what, method);
        goto done;
    }
    int awq = strcmp(method, "awq") == 0;
    st = j_int(&f, q, awq && json_object_get(q, "w_bit") ? "w_bit" : "bits", 1, 32, &bits, NULL);
    if (st == KILN_OK)
        st = j_int(&f, q, awq && json_object_get(q, "q_group_size") ? "q_group_size" : "group_size", -1, 1 << 30,
                   &group, NULL);
    if (st != KILN_OK)
        goto done;
    if (bits != 4 || group == 0 || (group > 0 && group % 32 != 0)) {
        st = kiln_fail(KILN_ERROR_UNSUPPORTED,
                       "%s: %s with %lld bits in groups of %lld is not supported (4 bits, groups of a multiple of 32 "
                       "or -1)",
                       what, method, (long long)bits, (long long)group);
        goto done;
    }
    if (awq) {
        const char *version = json_string_value(json_object_get(q, "version"));
        json_t *zp = json_object_get(q, "zero_point");
        if ((version && strcasecmp(version, "gemm") != 0) || (zp && !json_is_true(zp))) {
            st = kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: AWQ version \"%s\"%s is not supported (GEMM with zero points)",
                           what, version ? version : "gemm", zp && !json_is_true(zp) ? " without zero points" : "");
            goto done;
        }
    } else {
        const char *fmt = json_string_value(json_object_get(q, "checkpoint_format"));
        if (fmt && strcmp(fmt, "gptq") != 0 && strcmp(fmt, "gptq_v2") != 0) {
            st = kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: GPTQ checkpoint_format \"%s\" is not supported (gptq, gptq_v2)",
                           what, fmt);
            goto done;
        }
        w->zero_offset = fmt && strcmp(fmt, "gptq_v2") == 0 ? 0 : 1;
    }
    w->method = awq ? KILN_LLM_QUANT_AWQ : KILN_LLM_QUANT_GPTQ;
    w->group = (int32_t)group;
done:
    json_decref(f.root);
    if (st == KILN_OK)
        *out = qc;
    return st;
}

static kiln_status add_shard(hf_weights *w, const char *path)
{
    for (int32_t i = 0; i < w->n_shards; i++)
        if (strcmp(w->shard_paths[i], path) == 0)
            return KILN_OK;
    kiln_safetensors **s = realloc(w->shards, ((size_t)w->n_shards + 1) * sizeof *s);
    if (s)
        w->shards = s;
    char **p = realloc(w->shard_paths, ((size_t)w->n_shards + 1) * sizeof *p);
    if (p)
        w->shard_paths = p;
    char *copy = kiln_strdup(path);
    if (!s || !p || !copy) {
        free(copy);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory opening %s", path);
    }
    kiln_safetensors *st = NULL;
    kiln_status rc = kiln_safetensors_open(path, &st);
    if (rc != KILN_OK) {
        free(copy);
        return rc;
    }
    w->shards[w->n_shards] = st;
    w->shard_paths[w->n_shards++] = copy;
    return KILN_OK;
}

static kiln_status open_weights(const char *dir, hf_weights *w)
{
    char *single = kiln_llm_path_join(dir, "model.safetensors");
    char *index = kiln_llm_path_join(dir, "model.safetensors.index.json");
    kiln_status st = KILN_OK;
    char *text = NULL;
    size_t len = 0;
    if (!single || !index) {
        st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    st = kiln_llm_read_file(index, &text, &len);
    if (st == KILN_ERROR_NOT_FOUND) {
        st = add_shard(w, single);
        if (st == KILN_ERROR_IO)
            kiln_fail_context(st, "%s has neither model.safetensors nor model.safetensors.index.json", dir);
        goto done;
    }
    if (st != KILN_OK)
        goto done;
    jfile f;
    st = load_json(text, len, index, &f);
    if (st != KILN_OK)
        goto done;
    json_t *wm = json_object_get(f.root, "weight_map");
    if (!json_is_object(wm)) {
        st = kiln_fail(KILN_ERROR_FORMAT, "%s: missing key \"weight_map\"", index);
    } else {
        const char *k;
        json_t *v;
        json_object_foreach(wm, k, v)
        {
            const char *file = json_string_value(v);
            if (!file || strchr(file, '/') || strcmp(file, "..") == 0) {
                st = kiln_fail(KILN_ERROR_FORMAT, "%s: key \"weight_map.%s\": expected a file name in the folder",
                               index, k);
                break;
            }
            char *p = kiln_llm_path_join(dir, file);
            st = p ? add_shard(w, p) : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory");
            free(p);
            if (st != KILN_OK)
                break;
        }
    }
    json_decref(f.root);
done:
    free(text);
    free(single);
    free(index);
    return st;
}

/* ---- tokenizer_config.json and generation_config.json ------------------- */

/* A token named in tokenizer_config.json: a string or {"content": ...}. */
static const char *token_name(json_t *v)
{
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* An optional JSON file of the checkpoint, DIR/NAME, that must hold an
 * object: *path (the caller frees it) and f->root (the caller decrefs it;
 * NULL when the file is absent, which is not an error). */
static kiln_status load_optional_object(const char *dir, const char *name, char **path, jfile *f)
{
    f->root = NULL;
    if (!(*path = kiln_llm_path_join(dir, name)))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    char *text = NULL;
    size_t len;
    kiln_status st = kiln_llm_read_file(*path, &text, &len);
    if (st == KILN_ERROR_NOT_FOUND)
        return KILN_OK;
    if (st == KILN_OK)
        st = load_json(text, len, *path, f);
    free(text);
    if (st == KILN_OK && !json_is_object(f->root))
        st = kiln_fail(KILN_ERROR_FORMAT, "%s: expected a JSON object", *path);
    if (st != KILN_OK) {
        json_decref(f->root);
        f->root = NULL;
    }
    return st;
}

static kiln_status read_tokenizer_config(const char *dir, kiln_llm_checkpoint *ck, kiln_tokenizer *tok, int *bos,
                                         int *eos)
{
    kiln_llm_config *c = &ck->config;
    char *path = NULL;
    jfile f = {0};
    kiln_status st = load_optional_object(dir, "tokenizer_config.json", &path, &f);
    if (st == KILN_OK && f.root) {
        json_t *ct = json_object_get(f.root, "chat_template");
        const char *tmpl = json_string_value(ct);
        if (json_is_array(ct)) /* [{"name": "default", "template": ...}, ...] */
            for (size_t i = 0; i < json_array_size(ct); i++) {
                json_t *e = json_array_get(ct, i);
                const char *n = json_string_value(json_object_get(e, "name"));
                if (n && strcmp(n, "default") == 0)
                    tmpl = json_string_value(json_object_get(e, "template"));
            }
        c->chat_template = kiln_llm_chat_template_detect(tmpl);
        const char *b = token_name(json_object_get(f.root, "bos_token"));
        const char *e = token_name(json_object_get(f.root, "eos_token"));
        st = kiln_llm_checkpoint_set_chat(ck, tmpl, tmpl ? strlen(tmpl) : 0, b, e);
        int32_t id;
        if (b && (id = kiln_tokenizer_token_id(tok, b, strlen(b))) >= 0)
            *bos = id;
        if (e && (id = kiln_tokenizer_token_id(tok, e, strlen(e))) >= 0)
            *eos = id;
    }
    json_decref(f.root);
    free(path);
    return st;
}

/* Newer checkpoints keep the template in its own file, chat_template.jinja. */
static kiln_status read_chat_template_file(const char *dir, kiln_llm_checkpoint *ck)
{
    char *path = kiln_llm_path_join(dir, "chat_template.jinja"), *text = NULL;
    size_t len;
    if (!path)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    kiln_status st = kiln_llm_read_file(path, &text, &len);
    if (st == KILN_OK) {
        ck->config.chat_template = kiln_llm_chat_template_detect(text);
        ck->chat_template = text; /* NUL-terminated by kiln_llm_read_file */
        text = NULL;
    } else if (st == KILN_ERROR_NOT_FOUND) {
        st = KILN_OK;
    }
    free(text);
    free(path);
    return st;
}

static kiln_status read_generation_config(const char *dir, kiln_llm_config *c)
{
    char *path = NULL;
    jfile f = {0};
    kiln_status st = load_optional_object(dir, "generation_config.json", &path, &f);
    if (st == KILN_OK && f.root) {
        json_t *e = json_object_get(f.root, "eos_token_id");
        if (json_is_number(e) || json_is_array(e)) {
            int32_t n = 0;
            size_t count = json_is_array(e) ? json_array_size(e) : 1;
            for (size_t i = 0; i < count && st == KILN_OK; i++) {
                json_t *x = json_is_array(e) ? json_array_get(e, i) : e;
                int64_t id;
                if (!kiln_json_int(x, &id) || id < 0 || id >= c->vocab_size)
                    st = kiln_fail(KILN_ERROR_FORMAT, "%s: key \"eos_token_id\": not a token id below vocab_size %d",
                                   path, c->vocab_size);
                else if (n < KILN_LLM_MAX_EOS)
                    c->eos_ids[n++] = (int32_t)id;
            }
            if (st == KILN_OK && n > 0)
                c->n_eos = n;
        } else if (e && !json_is_null(e)) {
            st = kiln_fail(KILN_ERROR_FORMAT, "%s: key \"eos_token_id\": expected an integer or a list", path);
        }
        int64_t b = 0;
        int has;
        if (st == KILN_OK)
            st = j_int(&f, f.root, "bos_token_id", 0, c->vocab_size - 1, &b, &has);
        if (st == KILN_OK && has)
            c->bos_id = (int32_t)b;
        kiln_llm_generation *g = &c->generation;
        int64_t k = 0;
        if (st == KILN_OK)
            st = j_real(&f, f.root, "temperature", 0.0, 1e6, &g->temperature, &g->has_temperature);
        if (st == KILN_OK)
            st = j_real(&f, f.root, "top_p", 0.0, 1.0, &g->top_p, &g->has_top_p);
        if (st == KILN_OK)
            st = j_real(&f, f.root, "repetition_penalty", 0.0, 1e6, &g->repetition_penalty, &g->has_repetition_penalty);
        if (st == KILN_OK)
            st = j_int(&f, f.root, "top_k", 0, INT32_MAX, &k, &g->has_top_k);
        if (st == KILN_OK && g->has_top_k)
            g->top_k = (int32_t)k;
        if (st == KILN_OK)
            st = j_bool(&f, f.root, "do_sample", &g->do_sample, &g->has_do_sample);
    }
    json_decref(f.root);
    free(path);
    return st;
}

/* ---- the importer ------------------------------------------------------- */

kiln_status kiln_llm_import_hf(const char *dir, kiln_llm_checkpoint **out)
{
    kiln_llm_checkpoint *ck = calloc(1, sizeof *ck);
    hf_weights *w = calloc(1, sizeof *w);
    char *path = kiln_llm_path_join(dir, "config.json"), *text = NULL;
    kiln_status st = KILN_OK;
    size_t len;
    if (!ck || !w || !path) {
        st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    ck->read_weight = hf_read_weight;
    ck->read_woq = hf_read_woq;
    ck->weight_user = w;
    ck->free_user = hf_weights_free;
    w = NULL;
    st = kiln_llm_read_file(path, &text, &len);
    if (st == KILN_OK)
        st = kiln_llm_hf_parse_config(text, len, path, &ck->config);
    if (st == KILN_OK)
        st = kiln_llm_hf_parse_quant_config(text, len, path, &((hf_weights *)ck->weight_user)->quant);
    free(text);
    free(path);
    path = NULL;
    if (st != KILN_OK)
        goto fail;
    snprintf(ck->config.source, sizeof ck->config.source, "hf:%s", dir);
    st = open_weights(dir, ck->weight_user);
    if (st != KILN_OK)
        goto fail;
    path = kiln_llm_path_join(dir, "tokenizer.json");
    st = path ? kiln_tokenizer_load_json(path, &ck->tokenizer) : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    if (st != KILN_OK)
        goto fail;
    if (kiln_tokenizer_vocab_size(ck->tokenizer) > ck->config.vocab_size) {
        st = kiln_fail(KILN_ERROR_FORMAT, "%s: the vocabulary has %d tokens, config.json's vocab_size is %d", path,
                       kiln_tokenizer_vocab_size(ck->tokenizer), ck->config.vocab_size);
        goto fail;
    }
    /* Special tokens: generation_config.json over config.json over
     * tokenizer_config.json's names over what tokenizer.json implies. */
    int bos = kiln_tokenizer_bos_id(ck->tokenizer), eos = kiln_tokenizer_eos_id(ck->tokenizer);
    st = read_tokenizer_config(dir, ck, ck->tokenizer, &bos, &eos);
    if (st == KILN_OK && !ck->chat_template)
        st = read_chat_template_file(dir, ck);
    if (st == KILN_OK)
        st = read_generation_config(dir, &ck->config);
    if (st != KILN_OK)
        goto fail;
    kiln_llm_config *c = &ck->config;
    if (c->bos_id < 0)
        c->bos_id = bos;
    if (c->n_eos == 0 && eos >= 0)
        c->eos_ids[c->n_eos++] = eos;
    st = kiln_tokenizer_set_bos_eos(ck->tokenizer, c->bos_id, c->n_eos > 0 ? c->eos_ids[0] : -1);
    if (st != KILN_OK)
        goto fail;
    /* Whether encode adds BOS is the tokenizer's post-processor's call (as
     * in transformers); record what it does. */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    st = kiln_tokenizer_encode(ck->tokenizer, "a", 1, KILN_TOKENIZE_DEFAULT, &ids, &n_ids);
    if (st != KILN_OK)
        goto fail;
    c->add_bos = c->bos_id >= 0 && n_ids > 0 && ids[0] == c->bos_id;
    free(ids);
    free(path);
    *out = ck;
    return KILN_OK;
fail:
    free(path);
    hf_weights_free(w);
    kiln_llm_checkpoint_free(ck);
    return st;
}
