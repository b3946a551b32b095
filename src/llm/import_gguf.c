/* GGUF checkpoints (architectures "llama" and "qwen2"): the model shape
 * from "<arch>.*" keys, tensors dequantized to the engine dtype when read,
 * the vocabulary from "tokenizer.ggml.*". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "llm/gguf.h"
#include "llm/model.h"

typedef struct gguf_src {
    kiln_gguf *g;
    char path[256];
} gguf_src;

static void gguf_src_free(void *user)
{
    gguf_src *s = user;
    if (!s)
        return;
    kiln_gguf_close(s->g);
    free(s);
}

/* HF name → GGUF name; 0 when the name has no GGUF counterpart. */
static int gguf_name(const char *hf, char *out, size_t cap)
{
    static const struct {
        const char *hf, *gg;
    } top[] = {{"model.embed_tokens.weight", "token_embd.weight"},
               {"model.norm.weight", "output_norm.weight"},
               {"lm_head.weight", "output.weight"}},
      layer[] = {{"input_layernorm.weight", "attn_norm.weight"},
                 {"self_attn.q_proj.weight", "attn_q.weight"},
                 {"self_attn.k_proj.weight", "attn_k.weight"},
                 {"self_attn.v_proj.weight", "attn_v.weight"},
                 {"self_attn.q_proj.bias", "attn_q.bias"},
                 {"self_attn.k_proj.bias", "attn_k.bias"},
                 {"self_attn.v_proj.bias", "attn_v.bias"},
                 {"self_attn.o_proj.weight", "attn_output.weight"},
                 {"post_attention_layernorm.weight", "ffn_norm.weight"},
                 {"mlp.gate_proj.weight", "ffn_gate.weight"},
                 {"mlp.up_proj.weight", "ffn_up.weight"},
                 {"mlp.down_proj.weight", "ffn_down.weight"}};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (strcmp(hf, top[i].hf) == 0)
            return snprintf(out, cap, "%s", top[i].gg) < (int)cap;
    int l, used = 0;
    char rest[96];
    if (sscanf(hf, "model.layers.%d.%95s%n", &l, rest, &used) != 2 || l < 0 || hf[used] != '\0')
        return 0;
    for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++)
        if (strcmp(rest, layer[i].hf) == 0)
            return snprintf(out, cap, "blk.%d.%s", l, layer[i].gg) < (int)cap;
    return 0;
}

static kiln_status gguf_read(void *user, const char *name, kiln_dims *dims, kiln_dtype dst_type, void *dst,
                             size_t dst_size)
{
    gguf_src *s = user;
    char gname[128];
    const kiln_gguf_tensor *t;
    if (!gguf_name(name, gname, sizeof gname) || !(t = kiln_gguf_find_tensor(s->g, gname)))
        return KILN_ERROR_NOT_FOUND;
    /* GGUF lists ne[0] (innermost) first: HF's [out, in] is ne = {in, out} */
    memset(dims, 0, sizeof *dims);
    dims->rank = t->n_dims;
    for (int32_t i = 0; i < t->n_dims; i++)
        dims->d[i] = t->ne[t->n_dims - 1 - i];
    if (!dst)
        return KILN_OK;
    size_t es = dst_type == KILN_DTYPE_F32 ? 4 : 2, need;
    if (kiln_mul_overflow((size_t)t->n_elements, es, &need) || need != dst_size)
        return kiln_fail(KILN_ERROR_INTERNAL, "%s: tensor \"%s\": destination of %zu bytes", s->path, gname, dst_size);
    if (!kiln_ggml_can_dequantize(t->type)) {
        const char *tn = kiln_ggml_type_name(t->type);
        if (tn)
            return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: tensor \"%s\" has type %s, which kiln cannot read", s->path,
                             gname, tn);
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: tensor \"%s\" has ggml type %u, which kiln cannot read", s->path,
                         gname, t->type);
    }
    float *f = dst_type == KILN_DTYPE_F32 ? dst : malloc((size_t)t->n_elements * sizeof(float));
    if (!f)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory for tensor \"%s\"", s->path, gname);
    kiln_status st = kiln_ggml_dequantize(t->type, t->data, t->n_elements, f);
    if (st == KILN_OK && dst_type != KILN_DTYPE_F32)
        kiln_convert(dst, dst_type, f, KILN_DTYPE_F32, t->n_elements);
    if (f != dst)
        free(f);
    if (st != KILN_OK)
        kiln_fail_context(st, "%s: tensor \"%s\"", s->path, gname);
    return st;
}

static kiln_status gguf_read_quantized(void *user, const char *name, uint32_t *ggml_type, const void **data,
                                       size_t *size)
{
    gguf_src *s = user;
    char gname[128];
    const kiln_gguf_tensor *t;
    if (!gguf_name(name, gname, sizeof gname) || !(t = kiln_gguf_find_tensor(s->g, gname)))
        return KILN_ERROR_NOT_FOUND;
    *ggml_type = t->type;
    *data = t->data;
    *size = t->size;
    return KILN_OK;
}

/* ---- metadata ----------------------------------------------------------- */

static kiln_status get_int(const kiln_gguf *g, const char *path, const char *arch, const char *key, int64_t lo,
                           int64_t hi, int required, int64_t *out)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int64_t v = 0;
    kiln_status st = kiln_gguf_get_i64(g, k, &v);
    if (st == KILN_ERROR_NOT_FOUND && !required)
        return KILN_ERROR_NOT_FOUND;
    if (st == KILN_ERROR_NOT_FOUND)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: missing key \"%s\"", path, k);
    if (st != KILN_OK)
        return kiln_fail_context(st, "%s", path);
    if (v < lo || v > hi)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s\" = %lld is outside [%lld, %lld]", path, k, (long long)v,
                         (long long)lo, (long long)hi);
    *out = v;
    return KILN_OK;
}

static kiln_status get_real(const kiln_gguf *g, const char *path, const char *arch, const char *key, double *out)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    float v;
    kiln_status st = kiln_gguf_get_f32(g, k, &v);
    if (st == KILN_ERROR_NOT_FOUND)
        return st;
    if (st != KILN_OK)
        return kiln_fail_context(st, "%s", path);
    *out = v;
    return KILN_OK;
}

static int get_bool(const kiln_gguf *g, const char *key, int dflt)
{
    const kiln_gguf_kv *kv = kiln_gguf_find_kv(g, key);
    if (!kv || kv->type != KILN_GGUF_BOOL)
        return dflt;
    return kv->value[0] != 0;
}

/* llama.cpp's converter stores Llama 3.1 style RoPE scaling as one factor
 * per frequency (rope_freqs.weight) instead of its parameters. Llama 3.x
 * uses low_freq_factor 1, high_freq_factor 4 and an original context of
 * 8192 (or <arch>.rope.scaling.original_context_length); factor is the
 * largest entry. The parameters are accepted only if they reproduce every
 * stored factor, as the converter computes them. */
static kiln_status read_rope_freqs(const kiln_gguf *g, const char *path, const char *arch, const kiln_gguf_tensor *rf,
                                   kiln_llm_config *c)
{
    int32_t half = c->rope.rotary_dim / 2;
    if (rf->type != KILN_GGML_F32 || rf->n_dims != 1 || rf->ne[0] != half)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"rope_freqs.weight\" is not %d F32 values", path, half);
    const float *f = rf->data;
    double factor = 1.0, lo = 1.0, hi = 4.0, orig = 8192.0;
    int64_t v = 0;
    if (get_int(g, path, arch, "rope.scaling.original_context_length", 1, INT32_MAX, 0, &v) == KILN_OK)
        orig = (double)v;
    for (int32_t i = 0; i < half; i++) {
        float x;
        memcpy(&x, f + i, sizeof x);
        if (!(x >= 1.0f && x < 1e6f))
            return kiln_fail(KILN_ERROR_UNSUPPORTED,
                             "%s: rope_freqs.weight[%d] = %g is not a Llama 3 scaling "
                             "factor",
                             path, i, (double)x);
        if (x > factor)
            factor = x;
    }
    for (int32_t i = 0; i < half; i++) {
        double freq = 1.0 / pow(c->rope.theta, 2.0 * i / c->rope.rotary_dim), wavelen = 2 * M_PI / freq, want;
        if (wavelen < orig / hi)
            want = 1.0;
        else if (wavelen > orig / lo)
            want = factor;
        else {
            double smooth = (orig / wavelen - lo) / (hi - lo);
            want = 1.0 / ((1 - smooth) / factor + smooth);
        }
        float x;
        memcpy(&x, f + i, sizeof x);
        if (fabs(x - want) > 1e-3 * want)
            return kiln_fail(KILN_ERROR_UNSUPPORTED,
                             "%s: rope_freqs.weight does not follow Llama 3 scaling "
                             "(entry %d is %g, expected %g for factor %g, low 1, high 4, original context %g)",
                             path, i, (double)x, want, factor, orig);
    }
    if (factor > 1.0) {
        c->rope.scaling = KILN_LLM_ROPE_LLAMA3;
        c->rope.factor = factor;
        c->rope.low_freq_factor = lo;
        c->rope.high_freq_factor = hi;
        c->rope.original_max_pos = (int64_t)orig;
    }
    return KILN_OK;
}

static kiln_status read_shape(const kiln_gguf *g, const char *path, kiln_llm_config *c)
{
    const char *a;
    size_t alen;
    if (kiln_gguf_get_string(g, "general.architecture", &a, &alen) != KILN_OK)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: missing key \"general.architecture\"", path);
    char arch[32];
    if (!(alen == 5 && memcmp(a, "llama", 5) == 0) && !(alen == 5 && memcmp(a, "qwen2", 5) == 0))
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: general.architecture \"%.*s\" is not supported (llama, qwen2)",
                         path, (int)(alen > 40 ? 40 : alen), a);
    snprintf(arch, sizeof arch, "%.*s", (int)alen, a);
    snprintf(c->architecture, sizeof c->architecture, "%s", arch);
    int64_t v = 0;
    const int64_t big = INT32_MAX;
    KILN_TRY(get_int(g, path, arch, "block_count", 1, 65536, 1, &v));
    c->n_layers = (int32_t)v;
    KILN_TRY(get_int(g, path, arch, "embedding_length", 1, big, 1, &v));
    c->hidden_size = (int32_t)v;
    KILN_TRY(get_int(g, path, arch, "feed_forward_length", 1, big, 1, &v));
    c->intermediate_size = (int32_t)v;
    KILN_TRY(get_int(g, path, arch, "attention.head_count", 1, 65536, 1, &v));
    c->n_heads = (int32_t)v;
    kiln_status st = get_int(g, path, arch, "attention.head_count_kv", 1, 65536, 0, &v);
    if (st != KILN_OK && st != KILN_ERROR_NOT_FOUND)
        return st;
    c->n_kv_heads = st == KILN_OK ? (int32_t)v : c->n_heads;
    st = get_int(g, path, arch, "attention.key_length", 2, 65536, 0, &v);
    if (st != KILN_OK && st != KILN_ERROR_NOT_FOUND)
        return st;
    if (st == KILN_OK) {
        c->head_dim = (int32_t)v;
    } else {
        if (c->hidden_size % c->n_heads != 0)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: %s.embedding_length %d is not a multiple of the head count %d",
                             path, arch, c->hidden_size, c->n_heads);
        c->head_dim = c->hidden_size / c->n_heads;
    }
    st = get_int(g, path, arch, "rope.dimension_count", 2, c->head_dim, 0, &v);
    if (st != KILN_OK && st != KILN_ERROR_NOT_FOUND)
        return st;
    c->rope.rotary_dim = st == KILN_OK ? (int32_t)v : c->head_dim;
    st = get_int(g, path, arch, "context_length", 1, INT64_MAX, 0, &c->max_position_embeddings);
    if (st != KILN_OK && st != KILN_ERROR_NOT_FOUND)
        return st;
    st = get_real(g, path, arch, "attention.layer_norm_rms_epsilon", &c->rms_norm_eps);
    if (st == KILN_ERROR_NOT_FOUND)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: missing key \"%s.attention.layer_norm_rms_epsilon\"", path, arch);
    KILN_TRY(st);
    st = get_real(g, path, arch, "rope.freq_base", &c->rope.theta);
    if (st != KILN_OK && st != KILN_ERROR_NOT_FOUND)
        return st;
    char k[128];
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    const char *stype;
    size_t slen;
    if (kiln_gguf_get_string(g, k, &stype, &slen) == KILN_OK && !(slen == 4 && memcmp(stype, "none", 4) == 0)) {
        if (!(slen == 6 && memcmp(stype, "linear", 6) == 0))
            return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: key \"%s\" = \"%.*s\" is not supported (none, linear)", path,
                             k, (int)(slen > 40 ? 40 : slen), stype);
        c->rope.scaling = KILN_LLM_ROPE_LINEAR;
        if (get_real(g, path, arch, "rope.scaling.factor", &c->rope.factor) != KILN_OK || !(c->rope.factor > 0))
            return kiln_fail(KILN_ERROR_FORMAT, "%s: linear rope scaling without a positive %s.rope.scaling.factor",
                             path, arch);
    }
    const kiln_gguf_tensor *rf = kiln_gguf_find_tensor(g, "rope_freqs.weight");
    if (rf)
        KILN_TRY(read_rope_freqs(g, path, arch, rf, c));
    /* llama.cpp's converter permutes Q/K rows of llama models for its
     * adjacent-pair rotation; qwen2 keeps HF's halves (docs/llm.md) */
    c->rope.interleaved = strcmp(arch, "llama") == 0;
    c->qkv_bias = kiln_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    const kiln_gguf_tensor *emb = kiln_gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: missing 2-D tensor \"token_embd.weight\"", path);
    if (emb->ne[1] < 1 || emb->ne[1] > big)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"token_embd.weight\" has %lld rows", path,
                         (long long)emb->ne[1]);
    c->vocab_size = (int32_t)emb->ne[1];
    c->tied_embeddings = kiln_gguf_find_tensor(g, "output.weight") == NULL;
    st = kiln_llm_config_validate(c);
    return st == KILN_OK ? st : kiln_fail_context(st, "%s", path);
}

/* ---- vocabulary --------------------------------------------------------- */

/* llama.cpp's pre-tokenizer regexes (src/llama-vocab.cpp) per
 * tokenizer.ggml.pre; each splits the pieces of the previous one. */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char LLAMA3_RE[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_RE[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const PRE_GPT2[] = {GPT2_RE};
static const char *const PRE_LLAMA3[] = {LLAMA3_RE};
static const char *const PRE_QWEN2[] = {QWEN2_RE};
static const char *const PRE_SMOLLM[] = {"\\p{N}", GPT2_RE};
static const char *const PRE_DEFAULT[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_RE, "\\p{N}+", "[0-9][0-9][0-9]"};

static void pick_pre(const char *pre, size_t len, kiln_tokenizer_vocab *v)
{
#define PRE_IS(s) (len == sizeof(s) - 1 && memcmp(pre, s, len) == 0)
    if (pre && (PRE_IS("llama-bpe") || PRE_IS("llama3") || PRE_IS("llama-v3"))) {
        v->pre_regexes = PRE_LLAMA3, v->n_pre_regexes = 1;
        v->ignore_merges = 1;
    } else if (pre && (PRE_IS("qwen2") || PRE_IS("stablelm2"))) {
        v->pre_regexes = PRE_QWEN2, v->n_pre_regexes = 1;
    } else if (pre && (PRE_IS("smollm") || PRE_IS("starcoder") || PRE_IS("refact") || PRE_IS("command-r"))) {
        v->pre_regexes = PRE_SMOLLM, v->n_pre_regexes = 2;
    } else if (pre && (PRE_IS("gpt-2") || PRE_IS("gpt2") || PRE_IS("mpt") || PRE_IS("olmo"))) {
        v->pre_regexes = PRE_GPT2, v->n_pre_regexes = 1;
    } else {
        v->pre_regexes = PRE_DEFAULT, v->n_pre_regexes = 4;
    }
#undef PRE_IS
}

static const kiln_gguf_kv *array_kv(const kiln_gguf *g, const char *key, kiln_gguf_value_type elem)
{
    const kiln_gguf_kv *kv = kiln_gguf_find_kv(g, key);
    if (!kv || kv->type != KILN_GGUF_ARRAY)
        return NULL;
    if (elem == KILN_GGUF_STRING ? kv->array_type != KILN_GGUF_STRING
                                 : (kv->array_type == KILN_GGUF_STRING || kv->array_type == KILN_GGUF_ARRAY))
        return NULL;
    return kv;
}

static int32_t token_id_key(const kiln_gguf *g, const char *key, int32_t n_tokens)
{
    int64_t v = 0;
    if (kiln_gguf_get_i64(g, key, &v) != KILN_OK || v < 0 || v >= n_tokens)
        return -1;
    return (int32_t)v;
}

static kiln_status read_vocab(const kiln_gguf *g, const char *path, kiln_llm_config *c, kiln_tokenizer **out)
{
    const char *model;
    size_t mlen;
    if (kiln_gguf_get_string(g, "tokenizer.ggml.model", &model, &mlen) != KILN_OK)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: missing key \"tokenizer.ggml.model\" (no vocabulary)", path);
    kiln_tokenizer_vocab v;
    memset(&v, 0, sizeof v);
    if (mlen == 5 && memcmp(model, "llama", 5) == 0)
        v.kind = KILN_TOKENIZER_SPM;
    else if (mlen == 4 && memcmp(model, "gpt2", 4) == 0)
        v.kind = KILN_TOKENIZER_BYTE_BPE;
    else
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: tokenizer.ggml.model \"%.*s\" is not supported (llama, gpt2)",
                         path, (int)(mlen > 40 ? 40 : mlen), model);
    const kiln_gguf_kv *toks = array_kv(g, "tokenizer.ggml.tokens", KILN_GGUF_STRING);
    if (!toks || toks->count < 1 || toks->count > (uint64_t)c->vocab_size)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"tokenizer.ggml.tokens\" is missing or not 1..%d strings", path,
                         c->vocab_size);
    v.n_tokens = (int32_t)toks->count;
    const kiln_gguf_kv *scores = array_kv(g, "tokenizer.ggml.scores", KILN_GGUF_F32);
    const kiln_gguf_kv *types = array_kv(g, "tokenizer.ggml.token_type", KILN_GGUF_I32);
    const kiln_gguf_kv *merges = array_kv(g, "tokenizer.ggml.merges", KILN_GGUF_STRING);
    if ((scores && scores->count != toks->count) || (types && types->count != toks->count))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: tokenizer.ggml.scores/token_type do not have one entry per token",
                         path);
    if (v.kind == KILN_TOKENIZER_BYTE_BPE && !merges)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: a gpt2 vocabulary without \"tokenizer.ggml.merges\"", path);
    if (merges && merges->count > INT32_MAX)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: too many merges", path);
    size_t n = (size_t)v.n_tokens, nm = merges ? (size_t)merges->count : 0;
    const char **tok_ptrs = calloc(n, sizeof *tok_ptrs);
    uint32_t *tok_lens = calloc(n, sizeof *tok_lens);
    float *sc = scores ? calloc(n, sizeof *sc) : NULL;
    int32_t *ty = types ? calloc(n, sizeof *ty) : NULL;
    char **mg = calloc(nm ? nm : 1, sizeof *mg);
    char *tmpl_copy = NULL;
    kiln_status st = KILN_OK;
    if (!tok_ptrs || !tok_lens || (scores && !sc) || (types && !ty) || !mg) {
        st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory reading the vocabulary", path);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        size_t len;
        kiln_gguf_array_string(toks, i, &tok_ptrs[i], &len);
        if (len > UINT32_MAX) {
            st = kiln_fail(KILN_ERROR_FORMAT, "%s: token %zu is too long", path, i);
            goto done;
        }
        tok_lens[i] = (uint32_t)len;
        int64_t type = 0;
        if (sc)
            st = kiln_gguf_array_f32(scores, i, &sc[i]);
        if (st == KILN_OK && ty && (st = kiln_gguf_array_int(types, i, 0, KILN_TOKEN_BYTE, &type)) == KILN_OK)
            ty[i] = (int32_t)type;
        if (st != KILN_OK) {
            st = kiln_fail_context(st, "%s", path);
            goto done;
        }
    }
    for (size_t i = 0; i < nm; i++) {
        const char *s;
        size_t len;
        kiln_gguf_array_string(merges, i, &s, &len);
        mg[i] = malloc(len + 1);
        if (!mg[i]) {
            st = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory reading the merges", path);
            goto done;
        }
        memcpy(mg[i], s, len);
        mg[i][len] = '\0';
    }
    v.tokens = tok_ptrs;
    v.token_lens = tok_lens;
    v.scores = v.kind == KILN_TOKENIZER_SPM ? sc : NULL;
    v.types = ty;
    v.n_merges = (int32_t)nm;
    v.merges = (const char *const *)mg;
    if (v.kind == KILN_TOKENIZER_BYTE_BPE) {
        const char *pre = NULL;
        size_t plen = 0;
        if (kiln_gguf_get_string(g, "tokenizer.ggml.pre", &pre, &plen) != KILN_OK)
            pre = NULL;
        pick_pre(pre, plen, &v);
    }
    v.bos_id = token_id_key(g, "tokenizer.ggml.bos_token_id", v.n_tokens);
    v.eos_id = token_id_key(g, "tokenizer.ggml.eos_token_id", v.n_tokens);
    v.unk_id = token_id_key(g, "tokenizer.ggml.unknown_token_id", v.n_tokens);
    /* llama.cpp's defaults when the keys are absent: SPM adds BOS, BPE not */
    v.add_bos = get_bool(g, "tokenizer.ggml.add_bos_token", v.kind == KILN_TOKENIZER_SPM) && v.bos_id >= 0;
    v.add_eos = get_bool(g, "tokenizer.ggml.add_eos_token", 0) && v.eos_id >= 0;
    st = kiln_tokenizer_create(&v, out);
    if (st != KILN_OK) {
        kiln_fail_context(st, "%s", path);
        goto done;
    }
    c->bos_id = v.bos_id;
    c->add_bos = v.add_bos;
    if (v.eos_id >= 0)
        c->eos_ids[c->n_eos++] = v.eos_id;
    int32_t eot = token_id_key(g, "tokenizer.ggml.eot_token_id", v.n_tokens);
    if (eot >= 0 && eot != v.eos_id)
        c->eos_ids[c->n_eos++] = eot;
    const char *tmpl;
    size_t tlen;
    if (kiln_gguf_get_string(g, "tokenizer.chat_template", &tmpl, &tlen) == KILN_OK &&
        (tmpl_copy = malloc(tlen + 1)) != NULL) {
        memcpy(tmpl_copy, tmpl, tlen);
        tmpl_copy[tlen] = '\0';
        c->chat_template = kiln_llm_chat_template_detect(tmpl_copy);
    }
done:
    for (size_t i = 0; mg && i < nm; i++)
        free(mg[i]);
    free(mg);
    free(tok_ptrs);
    free(tok_lens);
    free(sc);
    free(ty);
    free(tmpl_copy);
    return st;
}

/* A special token's text, NUL-terminated in buf; NULL when id is -1 or the text does not fit. */
static const char *piece(const kiln_tokenizer *tok, int32_t id, char *buf, size_t cap)
{
    size_t len = 0;
    const char *p = id >= 0 ? kiln_tokenizer_token_to_piece(tok, id, &len) : NULL;
    if (!p || len >= cap)
        return NULL;
    memcpy(buf, p, len);
    buf[len] = '\0';
    return buf;
}

/* tokenizer.chat_template, rendered with the vocabulary's BOS and EOS texts. */
static kiln_status read_chat(const kiln_gguf *g, kiln_llm_checkpoint *ck)
{
    const char *tmpl;
    size_t tlen;
    char bos[256], eos[256];
    if (kiln_gguf_get_string(g, "tokenizer.chat_template", &tmpl, &tlen) != KILN_OK)
        return KILN_OK;
    const kiln_llm_config *c = &ck->config;
    return kiln_llm_checkpoint_set_chat(ck, tmpl, tlen, piece(ck->tokenizer, c->bos_id, bos, sizeof bos),
                                        piece(ck->tokenizer, c->n_eos > 0 ? c->eos_ids[0] : -1, eos, sizeof eos));
}

kiln_status kiln_llm_import_gguf(const char *path, kiln_llm_checkpoint **out)
{
    kiln_llm_checkpoint *ck = calloc(1, sizeof *ck);
    gguf_src *s = calloc(1, sizeof *s);
    if (!ck || !s) {
        free(ck);
        free(s);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    }
    ck->read_weight = gguf_read;
    ck->read_quantized = gguf_read_quantized;
    ck->weight_user = s;
    ck->free_user = gguf_src_free;
    snprintf(s->path, sizeof s->path, "%s", path);
    kiln_llm_config_init(&ck->config);
    kiln_status st = kiln_gguf_open(path, &s->g);
    if (st == KILN_OK)
        st = read_shape(s->g, path, &ck->config);
    if (st == KILN_OK)
        st = read_vocab(s->g, path, &ck->config, &ck->tokenizer);
    if (st == KILN_OK)
        st = read_chat(s->g, ck);
    if (st != KILN_OK) {
        kiln_llm_checkpoint_free(ck);
        return st;
    }
    snprintf(ck->config.source, sizeof ck->config.source, "gguf:%s", path);
    *out = ck;
    return KILN_OK;
}
