/* struct kiln_llm, shared by the files that implement include/kiln/llm.h
 * (generate.c opens and generates, score.c scores). */
#ifndef KILN_LLM_INTERNAL_H
#define KILN_LLM_INTERNAL_H

#include <kiln/llm.h>
#include <kiln/runtime.h>
#include <stdatomic.h>

#include "kv_cache.h"
#include "llm_config.h"
#include "sampler.h"
#include "tokenizer.h"

struct kiln_llm {
    kiln_engine *engine;
    kiln_context *ctx;
    kiln_llm_config cfg;
    kiln_llm_info info;           /* what kiln_llm_info_get hands out, filled at open */
    kiln_tokenizer *tok;
    char *default_system;        /* LLMC "default_system", NULL when absent */
    kiln_dtype kv_dtype;
    void **kv;                   /* n_layers caches, [n_blocks, 2, n_kv_heads, block_size, head_dim] */
    size_t kv_layer_bytes;
    int32_t max_batch, max_tokens, max_blocks;
    kiln_kv_pool pool;
    /* Step buffers at their max sizes, bound once at open. */
    int32_t *tokens, *positions;  /* [max_tokens] */
    int32_t *block_table;         /* [max_batch, max_blocks] */
    int32_t *seq_lens, *last_token; /* [max_batch] */
    int32_t *query_start;         /* [max_batch + 1] */
    float *logits;                /* [max_batch, vocab] */
    kiln_candidate *cand;         /* [vocab] sampling scratch */
    size_t max_piece;             /* longest vocabulary string, bytes */
    atomic_int cancel;
};

#endif
