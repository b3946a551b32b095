/* The LLMC engine section: what an LLM engine is (model shape, limits,
 * special tokens, chat template, generation defaults), as a JSON object
 * (docs/llm.md "Engine sections"). Written by the LLM build (src/llm/model.c)
 * and read by the generation runtime when it opens an engine. */
#ifndef KILN_LLM_LLM_CONFIG_H
#define KILN_LLM_LLM_CONFIG_H

#include <kiln/status.h>
#include <kiln/types.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_LLM_MAX_EOS 8
/* Build limits (model.c): the KV cache's block count (its profile max),
 * and the values of the logits buffer (max_batch x vocab_size). */
#define KILN_LLM_MAX_KV_BLOCKS (1 << 24)
#define KILN_LLM_MAX_LOGITS (1LL << 31)

typedef enum kiln_llm_chat_template {
    KILN_LLM_CHAT_NONE = 0, /* JSON null */
    KILN_LLM_CHAT_CHATML,   /* "chatml": <|im_start|>role\n...<|im_end|> */
    KILN_LLM_CHAT_LLAMA3,   /* "llama3": <|start_header_id|>role<|end_header_id|> */
    KILN_LLM_CHAT_LLAMA2,   /* "llama2": [INST] ... [/INST] (also Mistral) */
} kiln_llm_chat_template;

typedef enum kiln_llm_rope_scaling {
    KILN_LLM_ROPE_NONE = 0, /* "none" */
    KILN_LLM_ROPE_LINEAR,   /* "linear": positions divided by factor */
    KILN_LLM_ROPE_LLAMA3,   /* "llama3": frequency-band scaling */
} kiln_llm_rope_scaling;

typedef struct kiln_llm_rope {
    double theta;
    kiln_llm_rope_scaling scaling;
    double factor;            /* linear, llama3 */
    double low_freq_factor;   /* llama3 */
    double high_freq_factor;  /* llama3 */
    int64_t original_max_pos; /* llama3: original_max_position_embeddings */
    int32_t rotary_dim;       /* dims rotated per head (== head_dim unless partial) */
    int32_t interleaved;      /* 1: adjacent pairs (GGUF llama, llama2.c); 0: halves (HF) */
} kiln_llm_rope;

/* Defaults from generation_config.json; has_* says whether the file gave it. */
typedef struct kiln_llm_generation {
    int has_temperature, has_top_k, has_top_p, has_repetition_penalty, has_do_sample;
    double temperature;
    int32_t top_k;
    double top_p;
    double repetition_penalty;
    int do_sample;
} kiln_llm_generation;

typedef struct kiln_llm_config {
    char architecture[32]; /* "llama", "mistral", "qwen2" */
    int32_t vocab_size;    /* rows of the embedding / logits width */
    int32_t hidden_size;
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t intermediate_size;
    double rms_norm_eps;
    kiln_llm_rope rope;
    int qkv_bias;
    int tied_embeddings;
    kiln_dtype dtype;                /* engine compute / KV-cache dtype: F32, F16, BF16 */
    int64_t max_position_embeddings; /* from the checkpoint, 0 when unknown */
    /* Build limits (docs/llm.md profiles). */
    int32_t max_seq_len;
    int32_t max_batch;
    int32_t max_tokens;
    int32_t block_size;
    /* Special tokens: -1 when absent. */
    int32_t bos_id;
    int32_t n_eos;
    int32_t eos_ids[KILN_LLM_MAX_EOS];
    int add_bos; /* prompts start with BOS */
    kiln_llm_chat_template chat_template;
    char source[256]; /* what it was built from (path / format) */
    kiln_llm_generation generation;
    /* ggml formats the matmul weights were kept in ("Q4_K,Q6_K", read by
     * kiln/QuantMatMul); empty when every weight is in dtype. */
    char quantized[64];
    /* FP8 builds: tokens of the calibration text behind the activations'
     * static scales (kiln_llm_build_options.calibrate); 0: per-token. */
    int32_t calibration_tokens;
} kiln_llm_config;

/* Zeroes *cfg and sets the neutral defaults (bos -1, no eos, no template,
 * rope theta 10000 non-interleaved, dtype F32). */
void kiln_llm_config_init(kiln_llm_config *cfg);

/* *json malloc'd (NUL-terminated, *len without the NUL); caller frees. */
kiln_status kiln_llm_config_to_json(const kiln_llm_config *cfg, char **json, size_t *len);

/* Parses the LLMC section; every required field is checked (type, range,
 * consistency: n_heads % n_kv_heads == 0, ...) and a failure names it. */
kiln_status kiln_llm_config_from_json(const void *json, size_t len, kiln_llm_config *cfg);

/* "chatml"/"llama3"/"llama2" or NULL for NONE. */
const char *kiln_llm_chat_template_name(kiln_llm_chat_template t);

/* The template a Jinja chat_template string is written for, by its markers
 * (<|im_start|> → chatml, <|start_header_id|> → llama3, [INST] → llama2);
 * NONE when none is found or tmpl is NULL. */
kiln_llm_chat_template kiln_llm_chat_template_detect(const char *tmpl);

#endif
