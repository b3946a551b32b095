/* llama2.c checkpoints (the "legacy" format run.c reads): a Config header
 * of 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
 * seq_len; a negative vocab_size means the classifier is not shared with
 * the embedding), then f32 weights in this order: token_embedding,
 * rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis_real,
 * freq_cis_imag, [wcls]. Matrices are PyTorch's [out, in]; w1 is the gate,
 * w3 the up and w2 the down projection. llama2.c rotates adjacent pairs, so
 * the engine uses RoPE with interleaved = 1. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"
#include "llm/model.h"

enum { W_EMB, W_RMS_ATT, W_Q, W_K, W_V, W_O, W_RMS_FFN, W_1, W_2, W_3, W_RMS_FINAL, W_FREQ_RE, W_FREQ_IM, W_CLS, W_N };

/* Element counts of each weight block (all layers together), overflow-checked. */
static int block_sizes(const kiln_llm_config *c, int32_t seq_len, int shared, size_t n[W_N])
{
    size_t dim = (size_t)c->hidden_size, hid = (size_t)c->intermediate_size, L = (size_t)c->n_layers;
    size_t kv = (size_t)c->n_kv_heads * (size_t)c->head_dim, V = (size_t)c->vocab_size;
    size_t half = (size_t)c->head_dim / 2, t = 0;
    int o = 0;
    memset(n, 0, sizeof(size_t) * W_N);
    o |= kiln_mul_overflow(V, dim, &n[W_EMB]);
    o |= kiln_mul_overflow(L, dim, &n[W_RMS_ATT]);
    o |= kiln_mul_overflow(L, dim, &t) || kiln_mul_overflow(t, dim, &n[W_Q]);
    o |= kiln_mul_overflow(L, dim, &t) || kiln_mul_overflow(t, kv, &n[W_K]);
    n[W_V] = n[W_K];
    n[W_O] = n[W_Q];
    n[W_RMS_FFN] = n[W_RMS_ATT];
    o |= kiln_mul_overflow(L, dim, &t) || kiln_mul_overflow(t, hid, &n[W_1]);
    n[W_2] = n[W_3] = n[W_1];
    n[W_RMS_FINAL] = dim;
    o |= kiln_mul_overflow((size_t)seq_len, half, &n[W_FREQ_RE]);
    n[W_FREQ_IM] = n[W_FREQ_RE];
    n[W_CLS] = shared ? 0 : n[W_EMB];
    return o;
}

kiln_status kiln_llm_llama2c_parse_header(const void *data, size_t file_size, const char *what, kiln_llm_config *cfg,
                                          int *shared, size_t *weights_bytes)
{
    if (file_size < 28)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: %zu bytes, too short for the llama2.c header (28)", what, file_size);
    int32_t h[7];
    memcpy(h, data, sizeof h);
    if (memcmp(data, "24ka", 4) == 0)
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "%s: a llama2.c version 1/2 export (magic \"ak42\"); only the "
                         "legacy format (export.py --version 0) is read",
                         what);
    static const char *names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++)
        if (h[i] == 0 || (i != 5 && h[i] < 0) || h[i] == INT32_MIN)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: header field %s = %d is invalid", what, names[i], h[i]);
    if (h[3] > h[0] || h[0] % h[3] != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: header dim %d is not a multiple of n_heads %d", what, h[0], h[3]);
    if (h[4] > h[3] || h[3] % h[4] != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: header n_heads %d is not a multiple of n_kv_heads %d", what, h[3],
                         h[4]);
    kiln_llm_config c;
    kiln_llm_config_init(&c);
    snprintf(c.architecture, sizeof c.architecture, "llama");
    c.hidden_size = h[0];
    c.intermediate_size = h[1];
    c.n_layers = h[2];
    c.n_heads = h[3];
    c.n_kv_heads = h[4];
    c.vocab_size = h[5] < 0 ? -h[5] : h[5];
    c.head_dim = h[0] / h[3];
    c.max_position_embeddings = h[6];
    c.rms_norm_eps = 1e-5;
    c.rope.theta = 10000.0;
    c.rope.interleaved = 1;
    c.rope.rotary_dim = c.head_dim;
    c.tied_embeddings = h[5] > 0;
    kiln_status st = kiln_llm_config_validate(&c);
    if (st != KILN_OK)
        return kiln_fail_context(st, "%s", what);
    size_t n[W_N], total = 0;
    int o = block_sizes(&c, h[6], c.tied_embeddings, n);
    for (int i = 0; i < W_N && !o; i++)
        o |= kiln_add_overflow(total, n[i], &total);
    if (o || kiln_mul_overflow(total, 4, &total))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: the header's sizes overflow", what);
    if (file_size - 28 != total)
        return kiln_fail(KILN_ERROR_FORMAT,
                         "%s: %zu bytes of weights, the header (dim %d, hidden %d, %d layers, "
                         "vocab %d, seq_len %d) needs %zu: truncated or not a llama2.c checkpoint",
                         what, file_size - 28, h[0], h[1], h[2], h[5], h[6], total);
    *cfg = c;
    *shared = c.tied_embeddings;
    *weights_bytes = total;
    return KILN_OK;
}

typedef struct l2c {
    void *map;
    size_t size;
    const float *block[W_N];
    kiln_llm_config cfg;
    char path[256];
} l2c;

static void l2c_free(void *user)
{
    l2c *m = user;
    if (!m)
        return;
    if (m->map)
        munmap(m->map, m->size);
    free(m);
}

/* Weight `name` as (block, layer stride, rows, cols); 0 when unknown. */
static int l2c_locate(const l2c *m, const char *name, const float **p, int64_t *rows, int64_t *cols)
{
    const kiln_llm_config *c = &m->cfg;
    int64_t dim = c->hidden_size, hid = c->intermediate_size, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int32_t l;
    int used = 0;
    char rest[96];
    if (strcmp(name, "model.embed_tokens.weight") == 0) {
        *p = m->block[W_EMB], *rows = c->vocab_size, *cols = dim;
        return 1;
    }
    if (strcmp(name, "model.norm.weight") == 0) {
        *p = m->block[W_RMS_FINAL], *rows = dim, *cols = 0;
        return 1;
    }
    if (strcmp(name, "lm_head.weight") == 0) {
        if (c->tied_embeddings)
            return 0;
        *p = m->block[W_CLS], *rows = c->vocab_size, *cols = dim;
        return 1;
    }
    if (sscanf(name, "model.layers.%d.%95s%n", &l, rest, &used) != 2 || l < 0 || l >= c->n_layers || name[used] != '\0')
        return 0;
    static const struct {
        const char *name;
        int block, rows, cols; /* 0 dim, 1 hidden, 2 kv, -1 none */
    } map[] = {{"input_layernorm.weight", W_RMS_ATT, 0, -1},
               {"post_attention_layernorm.weight", W_RMS_FFN, 0, -1},
               {"self_attn.q_proj.weight", W_Q, 0, 0},
               {"self_attn.k_proj.weight", W_K, 2, 0},
               {"self_attn.v_proj.weight", W_V, 2, 0},
               {"self_attn.o_proj.weight", W_O, 0, 0},
               {"mlp.gate_proj.weight", W_1, 1, 0},
               {"mlp.down_proj.weight", W_2, 0, 1},
               {"mlp.up_proj.weight", W_3, 1, 0}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        if (strcmp(rest, map[i].name) != 0)
            continue;
        int64_t sz[3] = {dim, hid, kv};
        int64_t r = sz[map[i].rows], k = map[i].cols < 0 ? 1 : sz[map[i].cols];
        *p = m->block[map[i].block] + (size_t)l * (size_t)r * (size_t)k;
        *rows = r;
        *cols = map[i].cols < 0 ? 0 : k;
        return 1;
    }
    return 0;
}

static kiln_status l2c_read(void *user, const char *name, kiln_dims *dims, kiln_dtype dst_type, void *dst,
                            size_t dst_size)
{
    const l2c *m = user;
    const float *p;
    int64_t rows, cols;
    if (!l2c_locate(m, name, &p, &rows, &cols))
        return KILN_ERROR_NOT_FOUND;
    memset(dims, 0, sizeof *dims);
    dims->rank = cols ? 2 : 1;
    dims->d[0] = rows;
    dims->d[1] = cols;
    if (!dst)
        return KILN_OK;
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1); /* bounded by the header check */
    if (n * (dst_type == KILN_DTYPE_F32 ? 4 : 2) != dst_size)
        return kiln_fail(KILN_ERROR_INTERNAL, "%s: tensor \"%s\": wrong destination size", m->path, name);
    kiln_convert(dst, dst_type, p, KILN_DTYPE_F32, (int64_t)n);
    return KILN_OK;
}

kiln_status kiln_llm_import_llama2c(const char *path, const char *tokenizer_path, kiln_llm_checkpoint **out)
{
    if (!tokenizer_path)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "%s: a llama2.c checkpoint needs its tokenizer.bin "
                         "(--tokenizer)",
                         path);
    int fd;
    size_t file_size;
    KILN_TRY(kiln_file_open_read(path, &fd, &file_size));
    if (file_size < 28) {
        close(fd);
        return kiln_fail(KILN_ERROR_FORMAT, "%s: too short for the llama2.c header (28 bytes)", path);
    }
    l2c *m = calloc(1, sizeof *m);
    kiln_llm_checkpoint *ck = calloc(1, sizeof *ck);
    if (!m || !ck) {
        close(fd);
        free(m);
        free(ck);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory");
    }
    m->size = file_size;
    m->map = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    ck->read_weight = l2c_read;
    ck->weight_user = m;
    ck->free_user = l2c_free;
    kiln_status st;
    if (m->map == MAP_FAILED) {
        m->map = NULL;
        st = kiln_fail(KILN_ERROR_IO, "%s: cannot map: %s", path, strerror(errno));
        goto fail;
    }
    snprintf(m->path, sizeof m->path, "%s", path);
    int shared;
    size_t wbytes;
    st = kiln_llm_llama2c_parse_header(m->map, m->size, path, &m->cfg, &shared, &wbytes);
    if (st != KILN_OK)
        goto fail;
    size_t n[W_N];
    block_sizes(&m->cfg, (int32_t)m->cfg.max_position_embeddings, shared, n);
    const float *p = (const float *)((const uint8_t *)m->map + 28);
    for (int i = 0; i < W_N; i++) {
        m->block[i] = p;
        p += n[i];
    }
    ck->config = m->cfg;
    snprintf(ck->config.source, sizeof ck->config.source, "llama2.c:%s", path);
    /* read to the end: a tokenizer.bin may hold fewer tokens than the
     * embedding has rows, never more */
    st = kiln_tokenizer_load_llama2c(tokenizer_path, 0, &ck->tokenizer);
    if (st != KILN_OK)
        goto fail;
    if (kiln_tokenizer_vocab_size(ck->tokenizer) > m->cfg.vocab_size) {
        st = kiln_fail(KILN_ERROR_FORMAT, "%s: %d tokens, but the checkpoint %s has a vocabulary of %d", tokenizer_path,
                       kiln_tokenizer_vocab_size(ck->tokenizer), path, m->cfg.vocab_size);
        goto fail;
    }
    ck->config.bos_id = kiln_tokenizer_bos_id(ck->tokenizer);
    int32_t eos = kiln_tokenizer_eos_id(ck->tokenizer);
    if (eos >= 0)
        ck->config.eos_ids[ck->config.n_eos++] = eos;
    ck->config.add_bos = ck->config.bos_id >= 0;
    *out = ck;
    return KILN_OK;
fail:
    kiln_llm_checkpoint_free(ck);
    return st;
}
