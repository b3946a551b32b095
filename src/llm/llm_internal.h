/* struct kiln_llm, shared by the files that implement include/kiln/llm.h
 * (generate.c opens the engine, step.c runs one step of it, scheduler.c
 * schedules requests over steps, score.c scores). */
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

/* Host copies of the step's inputs, at their max sizes (in kiln_llm's
 * `packed`), and of what comes out of a step. */
typedef struct step_host {
    int32_t *tokens, *positions;    /* [max_tokens] */
    int32_t *block_table;           /* [max_batch, max_blocks] */
    int32_t *seq_lens, *last_token; /* [max_batch] */
    int32_t *query_start;           /* [max_batch + 1] */
    float *params;                  /* [max_batch, n_params] sample_params */
    int32_t *seq;                   /* [max_batch, SAMPLE_SEQ] sample_seq */
    int32_t *next;                  /* [max_batch] next_token */
    int32_t *next_ahead;            /* [max_batch] next_token of a step run ahead (scheduler.c) */
    float *logits;                  /* [max_batch, vocab]: engines without the sampling layer */
    /* Engines whose sampling layer has the logprob outputs: */
    float *logprob;      /* [max_batch] of the sampled id */
    int32_t *top_ids;    /* [max_batch, logprob_top] */
    float *top_logprobs; /* [max_batch, logprob_top] */
} step_host;

/* The step's inputs, in the order kiln_llm_step_run copies them (names in
 * step.c). */
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
    /* Columns of sample_params: SAMPLE_PARAMS, or one more (the row's
     * logprobs, -1: none) when the layer has the logprob outputs, which
     * hold logprob_top alternatives (0: the engine has none). */
    int32_t n_params, logprob_top;
    step_host h;
    /* The step's inputs live in one block of host memory (h's pointers
     * point into it) laid out as the block of device memory the inputs are
     * bound to (kiln_context_io_span): one copy carries them all, tokens
     * first and block_table last, so a step copies up to the end of its
     * block_table rows. */
    void *packed;
    size_t offset[N_STEP_INPUTS];
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
    int32_t no_prefix_caching; /* kiln_llm_options' */
    kiln_candidate *cand;      /* [vocab] host sampling scratch */
    size_t max_piece;          /* longest vocabulary string, bytes */
    atomic_int cancel;
    /* A scheduler holds the llm (kiln_llm_scheduler_start until _stop). */
    int scheduled;
};

/* ---- one step of the engine (step.c) -------------------------------------------------- */

double kiln_llm_now_ms(void);

/* Sets the step inputs' shapes for T tokens of S sequences (skipped when
 * they are those of the last step). */
kiln_status kiln_llm_step_shapes(kiln_llm *llm, int32_t T, int32_t S);

/* Rows [S, B) of a decode step padded up to a graph's batch size B: each a
 * one-token sequence at position 0 of the scratch block, sampled greedily
 * and ignored. */
void kiln_llm_step_pad(kiln_llm *llm, int32_t S, int32_t B);

/* The smallest captured batch size that holds a decode step of S
 * sequences, 0 when none does (or graphs are off). */
int32_t kiln_llm_step_bucket(const kiln_llm *llm, int32_t S);

/* Copies the step's inputs (llm->h, T tokens of S rows) in, runs it, and
 * copies out what the host needs: next_token, the logprob outputs when
 * need_logprobs, the logits for an engine without the sampling layer
 * (need_logits). One synchronization. With `graph` the step is a decode
 * step padded to a captured batch size and replays its graph. */
kiln_status kiln_llm_step_run(kiln_llm *llm, int32_t T, int32_t S, int graph, int need_logits, int need_logprobs);

/* kiln_llm_step_run without the synchronization: next_token's copy goes
 * to `next` (filled at the next synchronize, or when the following step
 * copies next_token out: include/kiln/runtime.h). With `feed` the step's
 * T == S tokens are the previous step's next_token, copied on the device
 * (h->tokens is not read): a decode step enqueued before the host has
 * seen the tokens it continues (scheduler.c, "running ahead"). */
kiln_status kiln_llm_step_enqueue(kiln_llm *llm, int32_t T, int32_t S, int graph, int need_logits, int need_logprobs,
                                  int feed, int32_t *next);

/* Captures one CUDA graph per decode batch size bucket (1, 2, 4, ...,
 * max_batch) by running a step of padding rows at each, so that decode
 * steps only replay. Nothing else is captured: prefill steps vary in T and
 * launch directly (PAUSED). */
kiln_status kiln_llm_capture_graphs(kiln_llm *llm);

/* A request's prompt ids: its text tokenized as kiln_llm_prompt_ids does,
 * or its ids checked against the vocabulary. *ids malloc'd. */
kiln_status kiln_llm_request_prompt(const kiln_llm *llm, const kiln_llm_request *req, int32_t **ids, size_t *n);

/* ---- scoring (score.c) ------------------------------------------------------------------ */

/* kiln_llm_score over a calibration engine (model.h, kiln_checkpoint.probe):
 * amax[i] receives the largest value of its output "calib.<i>", i <
 * n_probes, over the n tokens; the logits are not read. */
kiln_status kiln_llm_score_probe(kiln_llm *llm, const int32_t *ids, size_t n, int32_t n_probes, float *amax);

#endif
