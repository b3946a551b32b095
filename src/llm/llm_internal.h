/* struct kiln_llm, shared by the files that implement include/kiln/llm.h
 * (generate.c opens and generates, score.c scores). */
#ifndef KILN_LLM_INTERNAL_H
#define KILN_LLM_INTERNAL_H

#include <kiln/llm.h>
#include <kiln/runtime.h>
#include <stdatomic.h>

#include "llm/jinja.h"
#include "llm/kv_cache.h"
#include "llm/llm_config.h"
#include "llm/sampler.h"
#include "llm/tokenizer.h"

/* Host copies of the step's inputs, at their max sizes. */
typedef struct step_host {
    int32_t *tokens, *positions;    /* [max_tokens] */
    int32_t *block_table;           /* [max_batch, max_blocks] */
    int32_t *seq_lens, *last_token; /* [max_batch] */
    int32_t *query_start;           /* [max_batch + 1] */
    float *params;                  /* [max_batch, SAMPLE_PARAMS] sample_params */
    int32_t *seq;                   /* [max_batch, SAMPLE_SEQ] sample_seq */
    int32_t *next;                  /* [max_batch] next_token */
    float *logits;                  /* [max_batch, vocab]: engines without the sampling layer */
} step_host;

/* The step's inputs, in the order run_step copies them (names in
 * generate.c). */
enum {
    IN_TOKENS,
    IN_POSITIONS,
    IN_BLOCK_TABLE,
    IN_SEQ_LENS,
    IN_QUERY_START,
    IN_LAST_TOKEN,
    IN_PARAMS,
    IN_SEQ,
    N_STEP_INPUTS
};

struct kiln_llm {
    kiln_engine *engine;
    kiln_context *ctx;
    kiln_llm_config cfg;
    kiln_llm_info info; /* what kiln_llm_info_get hands out, filled at open */
    kiln_tokenizer *tok;
    char *default_system;      /* LLMC "default_system", NULL when absent */
    kiln_jinja *chat;          /* the CHAT section's template, NULL when absent */
    char *chat_bos, *chat_eos; /* its bos_token / eos_token, NULL when the tokenizer has none */
    kiln_dtype kv_dtype;
    size_t block_bytes; /* one KV block of every layer */
    int32_t max_batch, max_tokens, max_blocks;
    kiln_kv_pool pool;
    /* The KV tensors' extra block that the padding rows of a graph-replayed
     * decode step write; -1 without graphs. */
    int32_t scratch_block;
    int has_sampler; /* the engine ends with kiln/Sample (next_token) */
    step_host h;
    /* What each step input's buffer (the context's own, which never moves)
     * holds: a decode step copies only the inputs that changed (tokens,
     * positions, seq_lens, sample_seq; block_table when a sequence enters a
     * new block). */
    void *shadow[N_STEP_INPUTS];
    size_t shadow_bytes[N_STEP_INPUTS];
    int32_t cur_T, cur_S; /* shapes set on the context, 0: none */
    /* Free rows of sample_state, the penalties' history on the engine's
     * side: a running sequence with a penalty holds one. */
    int32_t *free_slots; /* [max_batch] */
    int32_t n_free_slots;
    /* Decode batch sizes with a captured graph, ascending; 0 buckets when
     * graphs are off. */
    int32_t buckets[32];
    int32_t n_buckets;
    double capture_ms;
    size_t graph_nodes;
    /* CPU: threads of a step; own_threads: those asked for in the options
     * (a context pool of that size, given to the scoring context too), 0:
     * the process-wide pool. */
    int32_t n_threads, own_threads;
    kiln_candidate *cand; /* [vocab] host sampling scratch */
    size_t max_piece;     /* longest vocabulary string, bytes */
    atomic_int cancel;
};


#endif
