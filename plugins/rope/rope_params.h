/* kiln/RoPE's parameters, shared with FusedMatMul's rope epilogue (which
 * rotates the packed qkv row exactly as RoPE does): the struct (RoPE's
 * blob layout), its checks, its reading from fields and the frequencies. */
#ifndef KILN_PLUGINS_ROPE_PARAMS_H
#define KILN_PLUGINS_ROPE_PARAMS_H

#include <math.h>

#include "plugin_cuda.h"
#include "plugin_util.h"

enum { ROPE_SCALING_NONE = 0, ROPE_SCALING_LINEAR, ROPE_SCALING_LLAMA3 };

typedef struct rope_params {
    int32_t n_heads, head_dim, rotary_dim, interleaved, scaling;
    float theta, factor, low_freq_factor, high_freq_factor;
    int32_t original_max_position;
    int32_t n_kv_heads;
} rope_params;

/* KILN_OK, or the failure naming `plugin` and the first bad field. */
static inline kiln_status rope_params_check(const kiln_host_api *host, const char *plugin, const rope_params *p)
{
    if (p->n_heads < 1 || p->head_dim < 2 || p->head_dim % 2)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: n_heads must be >= 1 and head_dim even, got %d and %d",
                          plugin, p->n_heads, p->head_dim);
    if (p->n_kv_heads < 0 || p->n_kv_heads > (1 << 20) || p->n_heads > (1 << 20) || p->head_dim > (1 << 16))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: n_heads %d, n_kv_heads %d or head_dim %d out of range",
                          plugin, p->n_heads, p->n_kv_heads, p->head_dim);
    if (p->rotary_dim < 2 || p->rotary_dim > p->head_dim || p->rotary_dim % 2 || p->rotary_dim / 2 > ROPE_MAX_PAIRS)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          "%s: field \"rotary_dim\" %d must be even and in [2, head_dim %d] (at most %d)", plugin,
                          p->rotary_dim, p->head_dim, 2 * ROPE_MAX_PAIRS);
    if (!(p->theta > 1.0f) || !isfinite(p->theta))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: field \"theta\" must be > 1, got %g", plugin,
                          (double)p->theta);
    if (p->scaling < ROPE_SCALING_NONE || p->scaling > ROPE_SCALING_LLAMA3 ||
        (p->interleaved != 0 && p->interleaved != 1))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: bad scaling or interleaved value", plugin);
    if (p->scaling != ROPE_SCALING_NONE && !(p->factor > 0.0f))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "%s: field \"factor\" must be > 0", plugin);
    if (p->scaling == ROPE_SCALING_LLAMA3 &&
        (!(p->high_freq_factor > p->low_freq_factor) || !(p->low_freq_factor > 0.0f) || p->original_max_position < 1))
        return host->fail(
            KILN_ERROR_INVALID_ARGUMENT,
            "%s: llama3 scaling needs high_freq_factor > low_freq_factor > 0 and original_max_position >= 1", plugin);
    return KILN_OK;
}

/* RoPE's fields (schema-checked) into *p. */
static inline kiln_status rope_params_read(const kiln_host_api *host, const char *plugin, const kiln_field *f,
                                           int32_t n, rope_params *p)
{
    memset(p, 0, sizeof *p);
    p->n_heads = plugin_field_i32(f, n, "n_heads", 0);
    p->head_dim = plugin_field_i32(f, n, "head_dim", 0);
    p->rotary_dim = plugin_field_i32(f, n, "rotary_dim", 0);
    if (p->rotary_dim == 0)
        p->rotary_dim = p->head_dim;
    p->interleaved = plugin_field_i32(f, n, "interleaved", 0);
    p->theta = plugin_field_f32(f, n, "theta", 0.0f);
    p->factor = plugin_field_f32(f, n, "factor", 1.0f);
    p->low_freq_factor = plugin_field_f32(f, n, "low_freq_factor", 1.0f);
    p->high_freq_factor = plugin_field_f32(f, n, "high_freq_factor", 4.0f);
    p->original_max_position = plugin_field_i32(f, n, "original_max_position", 8192);
    p->n_kv_heads = plugin_field_i32(f, n, "n_kv_heads", 0);
    const kiln_field *scaling = plugin_field(f, n, "scaling");
    const char *kind = scaling ? scaling->data : "none";
    if (strcmp(kind, "none") == 0)
        p->scaling = ROPE_SCALING_NONE;
    else if (strcmp(kind, "linear") == 0)
        p->scaling = ROPE_SCALING_LINEAR;
    else if (strcmp(kind, "llama3") == 0)
        p->scaling = ROPE_SCALING_LLAMA3;
    else
        return host->fail(KILN_ERROR_INVALID_ARGUMENT,
                          "%s: field \"scaling\" is \"%s\"; expected none, linear or llama3", plugin, kind);
    return KILN_OK;
}

/* inv_freq[0 .. rotary_dim / 2) as HF computes it in f32, then the Llama 3
 * or linear scaling. */
static inline void rope_params_frequencies(const rope_params *p, float *inv_freq)
{
    int32_t dim = p->rotary_dim;
    for (int32_t i = 0; i < dim / 2; i++) {
        float inv = 1.0f / powf(p->theta, (float)(2 * i) / (float)dim);
        if (p->scaling == ROPE_SCALING_LINEAR) {
            inv /= p->factor;
        } else if (p->scaling == ROPE_SCALING_LLAMA3) {
            float old = (float)p->original_max_position;
            float low_wavelen = old / p->low_freq_factor, high_wavelen = old / p->high_freq_factor;
            float wavelen = 2.0f * (float)M_PI / inv;
            if (wavelen > low_wavelen) {
                inv /= p->factor;
            } else if (!(wavelen < high_wavelen)) {
                float smooth = (old / wavelen - p->low_freq_factor) / (p->high_freq_factor - p->low_freq_factor);
                inv = (1.0f - smooth) * inv / p->factor + smooth * inv;
            }
        }
        inv_freq[i] = inv;
    }
}

#endif
