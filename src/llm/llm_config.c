/* The LLMC section (docs/llm.md): kiln_llm_config <-> JSON. */
#include "llm/llm_config.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void kiln_llm_config_init(kiln_llm_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->rope.theta = 10000.0;
    cfg->rope.factor = 1.0;
    cfg->rope.low_freq_factor = 1.0;
    cfg->rope.high_freq_factor = 4.0;
    cfg->rope.original_max_pos = 8192;
    cfg->dtype = KILN_DTYPE_F32;
    cfg->bos_id = -1;
    cfg->rms_norm_eps = 1e-6;
}

const char *kiln_llm_chat_template_name(kiln_llm_chat_template t)
{
    switch (t) {
    case KILN_LLM_CHAT_CHATML: return "chatml";
    case KILN_LLM_CHAT_LLAMA3: return "llama3";
    case KILN_LLM_CHAT_LLAMA2: return "llama2";
    default: return NULL;
    }
}

kiln_llm_chat_template kiln_llm_chat_template_detect(const char *tmpl)
{
    if (!tmpl)
        return KILN_LLM_CHAT_NONE;
    if (strstr(tmpl, "<|im_start|>"))
        return KILN_LLM_CHAT_CHATML;
    if (strstr(tmpl, "<|start_header_id|>"))
        return KILN_LLM_CHAT_LLAMA3;
    if (strstr(tmpl, "[INST]"))
        return KILN_LLM_CHAT_LLAMA2;
    return KILN_LLM_CHAT_NONE;
}

static const char *scaling_name(kiln_llm_rope_scaling s)
{
    switch (s) {
    case KILN_LLM_ROPE_LINEAR: return "linear";
    case KILN_LLM_ROPE_LLAMA3: return "llama3";
    default: return "none";
    }
}

static const char *dtype_name(kiln_dtype t)
{
    switch (t) {
    case KILN_DTYPE_F16: return "f16";
    case KILN_DTYPE_BF16: return "bf16";
    default: return "f32";
    }
}

/* jansson's setters fail only on allocation; one flag collects them. */
static void set(json_t *o, const char *k, json_t *v, int *ok)
{
    if (!v || json_object_set_new(o, k, v) != 0)
        *ok = 0;
}

kiln_status kiln_llm_config_to_json(const kiln_llm_config *cfg, char **json, size_t *len)
{
    int ok = 1;
    json_t *o = json_object();
    json_t *rope = json_object();
    json_t *eos = json_array();
    json_t *gen = json_object();
    if (!o || !rope || !eos || !gen) {
        json_decref(o), json_decref(rope), json_decref(eos), json_decref(gen);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "LLMC: out of memory");
    }
    set(o, "architecture", json_string(cfg->architecture), &ok);
    set(o, "vocab_size", json_integer(cfg->vocab_size), &ok);
    set(o, "hidden_size", json_integer(cfg->hidden_size), &ok);
    set(o, "n_layers", json_integer(cfg->n_layers), &ok);
    set(o, "n_heads", json_integer(cfg->n_heads), &ok);
    set(o, "n_kv_heads", json_integer(cfg->n_kv_heads), &ok);
    set(o, "head_dim", json_integer(cfg->head_dim), &ok);
    set(o, "intermediate_size", json_integer(cfg->intermediate_size), &ok);
    set(o, "rms_norm_eps", json_real(cfg->rms_norm_eps), &ok);
    set(rope, "theta", json_real(cfg->rope.theta), &ok);
    set(rope, "scaling", json_string(scaling_name(cfg->rope.scaling)), &ok);
    set(rope, "factor", json_real(cfg->rope.factor), &ok);
    set(rope, "low_freq_factor", json_real(cfg->rope.low_freq_factor), &ok);
    set(rope, "high_freq_factor", json_real(cfg->rope.high_freq_factor), &ok);
    set(rope, "original_max_position", json_integer(cfg->rope.original_max_pos), &ok);
    set(rope, "rotary_dim", json_integer(cfg->rope.rotary_dim), &ok);
    set(rope, "interleaved", json_boolean(cfg->rope.interleaved), &ok);
    set(o, "rope", rope, &ok);
    set(o, "qkv_bias", json_boolean(cfg->qkv_bias), &ok);
    set(o, "tied_embeddings", json_boolean(cfg->tied_embeddings), &ok);
    set(o, "dtype", json_string(dtype_name(cfg->dtype)), &ok);
    if (cfg->quantized[0])
        set(o, "quantized_weights", json_string(cfg->quantized), &ok);
    if (cfg->calibration_tokens > 0)
        set(o, "calibration_tokens", json_integer(cfg->calibration_tokens), &ok);
    set(o, "max_position_embeddings", json_integer(cfg->max_position_embeddings), &ok);
    set(o, "max_seq_len", json_integer(cfg->max_seq_len), &ok);
    set(o, "max_batch", json_integer(cfg->max_batch), &ok);
    set(o, "max_tokens", json_integer(cfg->max_tokens), &ok);
    set(o, "block_size", json_integer(cfg->block_size), &ok);
    set(o, "bos_id", cfg->bos_id >= 0 ? json_integer(cfg->bos_id) : json_null(), &ok);
    for (int32_t i = 0; i < cfg->n_eos && i < KILN_LLM_MAX_EOS; i++)
        if (json_array_append_new(eos, json_integer(cfg->eos_ids[i])) != 0)
            ok = 0;
    set(o, "eos_ids", eos, &ok);
    set(o, "add_bos", json_boolean(cfg->add_bos), &ok);
    const char *ct = kiln_llm_chat_template_name(cfg->chat_template);
    set(o, "chat_template", ct ? json_string(ct) : json_null(), &ok);
    set(o, "source", json_string(cfg->source), &ok);
    const kiln_llm_generation *g = &cfg->generation;
    if (g->has_temperature)
        set(gen, "temperature", json_real(g->temperature), &ok);
    if (g->has_top_k)
        set(gen, "top_k", json_integer(g->top_k), &ok);
    if (g->has_top_p)
        set(gen, "top_p", json_real(g->top_p), &ok);
    if (g->has_repetition_penalty)
        set(gen, "repetition_penalty", json_real(g->repetition_penalty), &ok);
    if (g->has_do_sample)
        set(gen, "do_sample", json_boolean(g->do_sample), &ok);
    set(o, "generation", gen, &ok);
    char *text = ok ? json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "LLMC: out of memory (or a non-UTF-8 string in the config)");
    *json = text;
    *len = strlen(text);
    return KILN_OK;
}

/* ---- reading ------------------------------------------------------------ */

static kiln_status get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: missing field \"%s\"", key);
    if (!json_is_integer(v))
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: field \"%s\": expected an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: field \"%s\" = %lld is outside [%lld, %lld]", key, (long long)x,
                         (long long)lo, (long long)hi);
    *out = x;
    return KILN_OK;
}

static kiln_status get_i32(json_t *o, const char *key, int64_t lo, int64_t hi, int32_t *out)
{
    int64_t x = 0;
    KILN_TRY(get_int(o, key, lo, hi, &x));
    *out = (int32_t)x;
    return KILN_OK;
}

static kiln_status get_real(json_t *o, const char *key, double lo, double hi, double *out)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: missing field \"%s\"", key);
    if (!json_is_number(v))
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: field \"%s\": expected a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: field \"%s\" = %g is outside [%g, %g]", key, x, lo, hi);
    *out = x;
    return KILN_OK;
}

static kiln_status get_bool(json_t *o, const char *key, int *out)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: missing field \"%s\"", key);
    if (!json_is_boolean(v))
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: field \"%s\": expected true or false", key);
    *out = json_is_true(v);
    return KILN_OK;
}

static kiln_status get_str(json_t *o, const char *key, int nullable, const char **out)
{
    json_t *v = json_object_get(o, key);
    if (!v)
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: missing field \"%s\"", key);
    if (nullable && json_is_null(v)) {
        *out = NULL;
        return KILN_OK;
    }
    if (!json_is_string(v))
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: field \"%s\": expected a string", key);
    *out = json_string_value(v);
    return KILN_OK;
}

static kiln_status parse(json_t *o, kiln_llm_config *c)
{
    const int64_t big = INT32_MAX;
    const char *s = NULL;
    if (!json_is_object(o))
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: expected a JSON object");
    KILN_TRY(get_str(o, "architecture", 0, &s));
    if (strlen(s) >= sizeof c->architecture)
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: field \"architecture\" is too long");
    strcpy(c->architecture, s);
    KILN_TRY(get_i32(o, "vocab_size", 1, big, &c->vocab_size));
    KILN_TRY(get_i32(o, "hidden_size", 1, big, &c->hidden_size));
    KILN_TRY(get_i32(o, "n_layers", 1, 65536, &c->n_layers));
    KILN_TRY(get_i32(o, "n_heads", 1, 65536, &c->n_heads));
    KILN_TRY(get_i32(o, "n_kv_heads", 1, 65536, &c->n_kv_heads));
    KILN_TRY(get_i32(o, "head_dim", 2, 65536, &c->head_dim));
    KILN_TRY(get_i32(o, "intermediate_size", 1, big, &c->intermediate_size));
    KILN_TRY(get_real(o, "rms_norm_eps", 0.0, 1.0, &c->rms_norm_eps));
    if (c->n_heads % c->n_kv_heads != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: n_heads %d is not a multiple of n_kv_heads %d", c->n_heads,
                         c->n_kv_heads);
    json_t *rope = json_object_get(o, "rope");
    if (!json_is_object(rope))
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: field \"rope\": expected an object");
    KILN_TRY(get_real(rope, "theta", 1e-9, 1e30, &c->rope.theta));
    KILN_TRY(get_str(rope, "scaling", 0, &s));
    if (strcmp(s, "none") == 0)
        c->rope.scaling = KILN_LLM_ROPE_NONE;
    else if (strcmp(s, "linear") == 0)
        c->rope.scaling = KILN_LLM_ROPE_LINEAR;
    else if (strcmp(s, "llama3") == 0)
        c->rope.scaling = KILN_LLM_ROPE_LLAMA3;
    else
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: rope.scaling \"%s\" is not none, linear or llama3", s);
    KILN_TRY(get_real(rope, "factor", 1e-9, 1e9, &c->rope.factor));
    KILN_TRY(get_real(rope, "low_freq_factor", 1e-9, 1e9, &c->rope.low_freq_factor));
    KILN_TRY(get_real(rope, "high_freq_factor", 1e-9, 1e9, &c->rope.high_freq_factor));
    KILN_TRY(get_int(rope, "original_max_position", 1, INT64_MAX, &c->rope.original_max_pos));
    KILN_TRY(get_i32(rope, "rotary_dim", 0, c->head_dim, &c->rope.rotary_dim));
    KILN_TRY(get_bool(rope, "interleaved", &c->rope.interleaved));
    if (c->rope.rotary_dim % 2 != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: rope.rotary_dim %d is odd", c->rope.rotary_dim);
    KILN_TRY(get_bool(o, "qkv_bias", &c->qkv_bias));
    KILN_TRY(get_bool(o, "tied_embeddings", &c->tied_embeddings));
    KILN_TRY(get_str(o, "dtype", 0, &s));
    if (strcmp(s, "f32") == 0)
        c->dtype = KILN_DTYPE_F32;
    else if (strcmp(s, "f16") == 0)
        c->dtype = KILN_DTYPE_F16;
    else if (strcmp(s, "bf16") == 0)
        c->dtype = KILN_DTYPE_BF16;
    else
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: dtype \"%s\" is not f32, f16 or bf16", s);
    /* absent in engines whose weights are all in dtype */
    if (json_object_get(o, "quantized_weights")) {
        KILN_TRY(get_str(o, "quantized_weights", 0, &s));
        if (strlen(s) >= sizeof c->quantized)
            return kiln_fail(KILN_ERROR_FORMAT, "LLMC: quantized_weights \"%.40s\" is too long", s);
        strcpy(c->quantized, s);
    }
    /* absent in engines without static activation scales */
    if (json_object_get(o, "calibration_tokens"))
        KILN_TRY(get_i32(o, "calibration_tokens", 1, INT32_MAX, &c->calibration_tokens));
    KILN_TRY(get_int(o, "max_position_embeddings", 0, INT64_MAX, &c->max_position_embeddings));
    KILN_TRY(get_i32(o, "max_seq_len", 1, big, &c->max_seq_len));
    KILN_TRY(get_i32(o, "max_batch", 1, big, &c->max_batch));
    KILN_TRY(get_i32(o, "max_tokens", 1, big, &c->max_tokens));
    KILN_TRY(get_i32(o, "block_size", 1, big, &c->block_size));
    json_t *bos = json_object_get(o, "bos_id");
    if (json_is_null(bos))
        c->bos_id = -1;
    else
        KILN_TRY(get_i32(o, "bos_id", 0, c->vocab_size - 1, &c->bos_id));
    json_t *eos = json_object_get(o, "eos_ids");
    if (!json_is_array(eos))
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: field \"eos_ids\": expected an array");
    if (json_array_size(eos) > KILN_LLM_MAX_EOS)
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: %zu eos_ids, at most %d", json_array_size(eos), KILN_LLM_MAX_EOS);
    c->n_eos = (int32_t)json_array_size(eos);
    for (int32_t i = 0; i < c->n_eos; i++) {
        json_t *e = json_array_get(eos, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= c->vocab_size)
            return kiln_fail(KILN_ERROR_FORMAT, "LLMC: eos_ids[%d] is not a token id below vocab_size %d", i,
                             c->vocab_size);
        c->eos_ids[i] = (int32_t)json_integer_value(e);
    }
    KILN_TRY(get_bool(o, "add_bos", &c->add_bos));
    KILN_TRY(get_str(o, "chat_template", 1, &s));
    if (!s)
        c->chat_template = KILN_LLM_CHAT_NONE;
    else if (strcmp(s, "chatml") == 0)
        c->chat_template = KILN_LLM_CHAT_CHATML;
    else if (strcmp(s, "llama3") == 0)
        c->chat_template = KILN_LLM_CHAT_LLAMA3;
    else if (strcmp(s, "llama2") == 0)
        c->chat_template = KILN_LLM_CHAT_LLAMA2;
    else
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: chat_template \"%s\" is not chatml, llama3, llama2 or null", s);
    KILN_TRY(get_str(o, "source", 0, &s));
    snprintf(c->source, sizeof c->source, "%s", s);
    json_t *gen = json_object_get(o, "generation");
    if (!json_is_object(gen))
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: field \"generation\": expected an object");
    kiln_llm_generation *g = &c->generation;
    if ((g->has_temperature = json_object_get(gen, "temperature") != NULL))
        KILN_TRY(get_real(gen, "temperature", 0.0, 1e6, &g->temperature));
    if ((g->has_top_p = json_object_get(gen, "top_p") != NULL))
        KILN_TRY(get_real(gen, "top_p", 0.0, 1.0, &g->top_p));
    if ((g->has_repetition_penalty = json_object_get(gen, "repetition_penalty") != NULL))
        KILN_TRY(get_real(gen, "repetition_penalty", 0.0, 1e6, &g->repetition_penalty));
    if ((g->has_top_k = json_object_get(gen, "top_k") != NULL))
        KILN_TRY(get_i32(gen, "top_k", 0, big, &g->top_k));
    if ((g->has_do_sample = json_object_get(gen, "do_sample") != NULL))
        KILN_TRY(get_bool(gen, "do_sample", &g->do_sample));
    return KILN_OK;
}

kiln_status kiln_llm_config_from_json(const void *json, size_t len, kiln_llm_config *cfg)
{
    json_error_t err;
    json_t *o = json_loadb(json, len, 0, &err);
    if (!o)
        return kiln_fail(KILN_ERROR_FORMAT, "LLMC: invalid JSON at line %d: %s", err.line, err.text);
    kiln_llm_config c;
    kiln_llm_config_init(&c);
    kiln_status st = parse(o, &c);
    json_decref(o);
    if (st == KILN_OK)
        *cfg = c;
    return st;
}
