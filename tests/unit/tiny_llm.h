/* A tiny LLM for the generation tests: a 2-layer Llama with deterministic
 * pseudo-random weights and a self-contained SentencePiece-style byte
 * tokenizer (ids 3 + byte), built with the LLM build (src/llm/model.c).
 * Shared by tests/unit/test_generate.c and tests/unit/test_scheduler.c. */
#ifndef KILN_TEST_TINY_LLM_H
#define KILN_TEST_TINY_LLM_H

#include <kiln/kiln.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "llm/model.h"
#include "llm/tokenizer.h"

/* ---- the tiny model ----------------------------------------------------------------- */

#define VOCAB (3 + 256)
#define HIDDEN 32
#define LAYERS 2
#define HEADS 4
#define KV_HEADS 2
#define HEAD_DIM 8
#define FFN 64

static inline kiln_status tiny_make_tokenizer(kiln_tokenizer **out)
{
    static char byte_names[256][8];
    const char *tokens[VOCAB];
    float scores[VOCAB];
    int32_t types[VOCAB];
    tokens[0] = "<unk>";
    tokens[1] = "<s>";
    tokens[2] = "</s>";
    types[0] = KILN_TOKEN_UNKNOWN;
    types[1] = types[2] = KILN_TOKEN_CONTROL;
    scores[0] = scores[1] = scores[2] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(byte_names[b], sizeof byte_names[b], "<0x%02X>", b);
        tokens[3 + b] = byte_names[b];
        types[3 + b] = KILN_TOKEN_BYTE;
        scores[3 + b] = 0;
    }
    kiln_tokenizer_vocab v = {
        .kind = KILN_TOKENIZER_SPM,
        .n_tokens = VOCAB,
        .tokens = tokens,
        .scores = scores,
        .types = types,
        .bos_id = 1,
        .eos_id = 2,
        .unk_id = 0,
        .add_bos = 1,
    };
    return kiln_tokenizer_create(&v, out);
}

/* Uniform in [-scale, scale) from a hash of the tensor name and index. */
static inline float weight_value(const char *name, int64_t i, float scale)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    uint64_t z = h + (uint64_t)i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return scale * (float)((double)(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static inline int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static inline kiln_status tiny_weight(void *user, const char *name, kiln_dims *dims, kiln_dtype type, void *dst,
                                      size_t size)
{
    (void)user;
    kiln_dims d = {.rank = 2};
    int norm = 0;
    if (!strcmp(name, "model.embed_tokens.weight")) {
        d.d[0] = VOCAB, d.d[1] = HIDDEN;
    } else if (ends_with(name, "layernorm.weight") || !strcmp(name, "model.norm.weight")) {
        d.rank = 1, d.d[0] = HIDDEN, norm = 1;
    } else if (ends_with(name, "q_proj.weight") || ends_with(name, "o_proj.weight")) {
        d.d[0] = HIDDEN, d.d[1] = HIDDEN;
    } else if (ends_with(name, "k_proj.weight") || ends_with(name, "v_proj.weight")) {
        d.d[0] = KV_HEADS * HEAD_DIM, d.d[1] = HIDDEN;
    } else if (ends_with(name, "gate_proj.weight") || ends_with(name, "up_proj.weight")) {
        d.d[0] = FFN, d.d[1] = HIDDEN;
    } else if (ends_with(name, "down_proj.weight")) {
        d.d[0] = HIDDEN, d.d[1] = FFN;
    } else {
        return kiln_fail(KILN_ERROR_NOT_FOUND, "tiny model has no tensor \"%s\"", name);
    }
    if (!dst) {
        *dims = d;
        return KILN_OK;
    }
    int64_t n = d.rank == 1 ? d.d[0] : d.d[0] * d.d[1];
    if (type != KILN_DTYPE_F32 || size != (size_t)n * 4)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "tiny model writes f32 only");
    float *f = dst;
    float scale = norm ? 0.0f : 1.0f / sqrtf((float)(d.rank == 2 ? d.d[1] : 1)) * 2.0f;
    for (int64_t i = 0; i < n; i++)
        f[i] = norm ? 1.0f : weight_value(name, i, scale);
    return KILN_OK;
}

/* The tiny model's checkpoint with the given tokenizer; free with
 * kiln_llm_checkpoint_free. */
static inline kiln_llm_checkpoint *tiny_checkpoint(void)
{
    kiln_llm_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck)
        return NULL;
    kiln_llm_config *c = &ck->config;
    kiln_llm_config_init(c);
    snprintf(c->architecture, sizeof c->architecture, "llama");
    c->vocab_size = VOCAB;
    c->hidden_size = HIDDEN;
    c->n_layers = LAYERS;
    c->n_heads = HEADS;
    c->n_kv_heads = KV_HEADS;
    c->head_dim = HEAD_DIM;
    c->intermediate_size = FFN;
    c->rms_norm_eps = 1e-5;
    c->rope.theta = 10000;
    c->rope.rotary_dim = HEAD_DIM;
    c->tied_embeddings = 1;
    c->max_position_embeddings = 256;
    c->bos_id = 1;
    c->n_eos = 1;
    c->eos_ids[0] = 2;
    c->add_bos = 1;
    c->chat_template = KILN_LLM_CHAT_LLAMA2;
    ck->read_weight = tiny_weight;
    if (tiny_make_tokenizer(&ck->tokenizer) != KILN_OK) {
        kiln_llm_checkpoint_free(ck);
        return NULL;
    }
    return ck;
}

/* Writes a buffer to a file; 1 on success. */
static inline int tiny_write_file(const char *path, const kiln_buffer *buf)
{
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(buf->data, 1, buf->size, f) == buf->size;
    if (f && fclose(f) != 0)
        ok = 0;
    return ok;
}

/* Builds the tiny model with these limits into an engine file. */
static inline kiln_status tiny_build(const char *path, int32_t max_batch, int32_t max_seq_len, int32_t max_tokens,
                                     int32_t block_size)
{
    kiln_llm_checkpoint *ck = tiny_checkpoint();
    if (!ck)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "tiny checkpoint");
    kiln_llm_build_options opt;
    kiln_llm_build_options_init(&opt);
    opt.max_batch = max_batch;
    opt.max_seq_len = max_seq_len;
    opt.max_tokens = max_tokens;
    opt.block_size = block_size;
    kiln_registry *reg = NULL;
    kiln_buffer buf = {0};
    kiln_status s = kiln_registry_create(&reg);
    if (s == KILN_OK)
        s = kiln_llm_build_engine(ck, &opt, reg, NULL, &buf);
    if (s == KILN_OK && !tiny_write_file(path, &buf))
        s = kiln_fail(KILN_ERROR_IO, "cannot write %s", path);
    kiln_buffer_free(&buf);
    kiln_llm_checkpoint_free(ck);
    kiln_registry_destroy(reg);
    return s;
}

#endif
