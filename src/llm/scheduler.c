/* In-flight batching (include/kiln/llm.h "requests that come and go",
 * docs/scheduling.md): requests submitted from any thread join and leave
 * the running batch between steps. Each step packs decode tokens first,
 * then prefill chunks, under the engine's token budget (max_tokens) and
 * batch (max_batch); KV blocks are taken as sequences grow; when the cache
 * runs dry the newest running request is preempted (its blocks released,
 * its tokens recomputed when it is admitted again); waiting requests are
 * admitted first come, first served; full blocks are shared between
 * sequences with the same prefix (kv_cache.h).
 *
 * A preempted request resumes with exactly the output it would have
 * produced: its PRNG state lives in the request and is drawn from only
 * when a row samples, and recomputing from position 0 rebuilds the
 * sampling layer's penalty history (sample.c) token by token.
 *
 * Threads: the submitting side (kiln_llm_submit, _request_cancel,
 * _stats_get) touches only the incoming list, the cancel ids and the
 * stats snapshot, under `mu`; everything else belongs to the stepping
 * thread. A step allocates nothing (results are built when a request
 * ends). */
#include <kiln/kiln.h>
#include <kiln/llm.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/api_struct.h"
#include "core/error.h"
#include "sample/sample.h"
#include "llm/kv_cache.h"
#include "llm/llm_internal.h"
#include "llm/sampler.h"
#include "llm/tokenizer.h"

/* ---- per-request state -------------------------------------------------------------------- */

enum { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE };

typedef struct sched_seq {
    struct sched_seq *prev, *next; /* in the incoming or the waiting list */
    uint64_t id;
    kiln_llm_request req;       /* the caller's, read as far as its struct_size reaches */
    kiln_llm_sampling sampling; /* req.sampling points here */
    char **stop;                /* req.stop points here: copies */
    kiln_llm_callbacks cb;
    int32_t *ids; /* prompt then generated, cap n_prompt + max_tokens */
    size_t n_prompt, n_ids;
    size_t n_cached;  /* ids whose keys and values are in the cache */
    int32_t *blocks;  /* [max_blocks] */
    uint64_t *hashes; /* [max_blocks] chain hashes of the full blocks (prefix caching) */
    int32_t n_hashed; /* blocks hashed and offered to the prefix cache */
    kiln_kv_seq kv;
    uint8_t *seen;  /* [vocab] engines without the sampling layer, with penalties */
    int32_t *count; /* [vocab] */
    kiln_rng rng;
    kiln_tokenizer_stream *stream;
    char *text;
    size_t text_len, text_cap, emitted;
    size_t max_stop; /* longest stop string */
    float *logprobs; /* [max_tokens] when the request asks for logprobs */
    int state;
    int admitted;  /* ever admitted (counts its prompt once) */
    int cancel;    /* a cancel for it arrived */
    int in_step;   /* has a row in the step being packed */
    int penalized; /* uses a penalty: holds a state slot, never takes cached blocks */
    int32_t slot;  /* row of sample_state, -1: none */
    double t_submit, t_first, t_last;
} sched_seq;

struct kiln_llm_scheduler {
    kiln_llm *llm;
    kiln_llm_scheduler_options opt;
    pthread_mutex_t mu;
    pthread_cond_t work; /* to the stepping thread: something to do */
    pthread_cond_t idle; /* from it: a step ended */
    /* Under mu. */
    sched_seq *in_head, *in_tail; /* submitted, not yet seen by a step */
    int32_t n_in;
    uint64_t *cancel_ids;
    size_t n_cancel, cap_cancel;
    uint64_t last_id;
    int stopping, quit;
    kiln_llm_scheduler_stats shown; /* the last snapshot */
    /* The stepping thread's. */
    sched_seq *wait_head, *wait_tail; /* FCFS; preempted ones go first */
    int32_t n_waiting;
    sched_seq **running; /* [max_batch] in admission order: the last is the newest */
    int32_t n_running;
    sched_seq **rows; /* [max_batch] the sequence of each row of the step */
    int32_t *lens;    /* [max_batch] seq_lens of the step's rows */
    /* Running ahead (run_ahead): a decode step enqueued while the one
     * before it still runs, fed its tokens on the device. Its rows (NULL:
     * that request ended meanwhile), their seq_lens, its rows and bucket. */
    int ahead, run_ahead;
    sched_seq **ahead_rows;
    int32_t *ahead_lens;
    int32_t ahead_S, ahead_B;
    /* kiln_llm_now_ms of the last step's end and of the enqueue of the
     * step run next (a step run ahead: of its own), for the stats' step
     * times */
    double last_end_ms, enqueue_ms, ahead_enqueue_ms;
    int one_token_rows; /* the step run next has one token a row */
    kiln_llm_scheduler_stats stats;
    pthread_t thread;
    int has_thread;
};

static int has_penalty(const kiln_llm_sampling *p)
{
    return (p->repetition_penalty > 0.0f && p->repetition_penalty != 1.0f) || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

static void seq_free(sched_seq *q)
{
    if (!q)
        return;
    for (int32_t k = 0; q->stop && k < q->req.n_stop; k++)
        free(q->stop[k]);
    free(q->stop);
    free(q->ids);
    free(q->blocks);
    free(q->hashes);
    free(q->seen);
    free(q->count);
    free(q->text);
    free(q->logprobs);
    kiln_tokenizer_stream_free(q->stream);
    free(q);
}

/* Sampling values the engine could not honour. */
static kiln_status check_sampling(const kiln_llm_sampling *p)
{
    const float v[6] = {p->temperature,      p->top_p, p->min_p, p->repetition_penalty, p->presence_penalty,
                        p->frequency_penalty};
    static const char *const names[6] = {"temperature",      "top_p", "min_p", "repetition_penalty", "presence_penalty",
                                         "frequency_penalty"};
    for (int i = 0; i < 6; i++)
        if (!isfinite(v[i]))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "sampling %s %g is not a finite number", names[i],
                             (double)v[i]);
    if (p->top_k < 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "sampling top_k %d must be >= 0", (int)p->top_k);
    if (p->min_p < 0.0f || p->min_p > 1.0f)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "sampling min_p %g is not in [0, 1]", (double)p->min_p);
    if (p->repetition_penalty < 0.0f)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "sampling repetition_penalty %g must be >= 0",
                         (double)p->repetition_penalty);
    return KILN_OK;
}

/* Copies, checks and tokenizes one request and takes all the memory it
 * will use. */
static kiln_status seq_create(kiln_llm_scheduler *sc, const kiln_llm_request *user_req, const kiln_llm_callbacks *cb,
                              sched_seq **out)
{
    kiln_llm *llm = sc->llm;
    const kiln_llm_config *c = &llm->cfg;
    sched_seq *q = calloc(1, sizeof *q);
    if (!q)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a request");
    q->slot = -1;
    *out = q;
    kiln_llm_request_init(&q->req);
    KILN_TRY(kiln_api_struct_read(&q->req, sizeof q->req, user_req, "request"));
    kiln_llm_sampling_init(&q->sampling);
    if (q->req.sampling)
        KILN_TRY(kiln_api_struct_read(&q->sampling, sizeof q->sampling, q->req.sampling, "request sampling"));
    q->req.sampling = &q->sampling;
    kiln_llm_callbacks_init(&q->cb);
    if (cb)
        KILN_TRY(kiln_api_struct_read(&q->cb, sizeof q->cb, cb, "callbacks"));
    const kiln_llm_request *r = &q->req;
    KILN_TRY(check_sampling(&q->sampling));
    if (r->max_tokens < 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "max_tokens %d must be >= 1", (int)r->max_tokens);
    if (r->logprobs < -1 || r->logprobs > SAMPLE_MAX_TOP)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "logprobs %d is not in [-1, %d]", (int)r->logprobs,
                         SAMPLE_MAX_TOP);
    if (r->logprobs >= 0 && llm->logprob_top == 0)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "logprobs: the engine's sampling layer has no logprob outputs "
                                                 "(an engine built before them: rebuild it)");
    if (r->logprobs > llm->logprob_top)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "logprobs %d: the engine's sampling layer returns at most %d",
                         (int)r->logprobs, (int)llm->logprob_top);
    if (r->n_stop < 0 || (r->n_stop > 0 && !r->stop))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%d stop strings at %p", (int)r->n_stop, (const void *)r->stop);
    KILN_TRY(kiln_llm_request_prompt(llm, r, &q->ids, &q->n_prompt));
    size_t n = q->n_ids = q->n_prompt;
    if (n == 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "the prompt is empty");
    if (n >= (size_t)c->max_seq_len)
        return kiln_fail(KILN_ERROR_LIMIT, "prompt of %zu tokens exceeds the engine's max sequence length %d", n,
                         (int)c->max_seq_len);
    size_t total = n + (size_t)r->max_tokens;
    if (total > (size_t)c->max_seq_len)
        return kiln_fail(KILN_ERROR_LIMIT,
                         "prompt of %zu tokens plus max_tokens %d exceeds the engine's max sequence length %d", n,
                         (int)r->max_tokens, (int)c->max_seq_len);
    int32_t need = kiln_kv_blocks_for(&llm->pool, (int64_t)total);
    if (need > llm->pool.n_blocks)
        return kiln_fail(KILN_ERROR_LIMIT,
                         "prompt of %zu tokens plus max_tokens %d needs %d KV blocks, the cache holds %d (%lld tokens)",
                         n, (int)r->max_tokens, (int)need, (int)llm->pool.n_blocks,
                         (long long)llm->pool.n_blocks * c->block_size);
    if (r->n_stop > 0 && !(q->stop = calloc((size_t)r->n_stop, sizeof *q->stop)))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for stop strings");
    for (int32_t k = 0; k < r->n_stop; k++) {
        size_t len = r->stop[k] ? strlen(r->stop[k]) : 0;
        if (len == 0) {
            q->req.n_stop = k;
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "stop string %d is empty", (int)k);
        }
        if (!(q->stop[k] = malloc(len + 1))) {
            q->req.n_stop = k;
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for stop strings");
        }
        memcpy(q->stop[k], r->stop[k], len + 1);
        if (len > q->max_stop)
            q->max_stop = len;
    }
    q->req.stop = (const char *const *)q->stop;
    q->req.prompt = NULL;
    q->req.prompt_ids = NULL;
    int32_t *grown = realloc(q->ids, sizeof *q->ids * total);
    if (!grown)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a request");
    q->ids = grown;
    q->penalized = has_penalty(&q->sampling);
    /* A decoded token is at most its vocabulary string, tripled when each
     * byte of it is invalid UTF-8 and becomes U+FFFD; text averages far
     * less, and a thousand requests of a thousand tokens must not take
     * gigabytes: room for 16 bytes a token, grown (a rare allocation in a
     * step) past that. */
    size_t worst = 3 * (llm->max_piece + 4) * (size_t)r->max_tokens + 1;
    size_t typical = 16 * (size_t)r->max_tokens + 3 * llm->max_piece + 64;
    q->text_cap = typical < worst ? typical : worst;
    q->text = malloc(q->text_cap);
    q->blocks = malloc(sizeof *q->blocks * (size_t)llm->max_blocks);
    q->hashes = malloc(sizeof *q->hashes * (size_t)llm->max_blocks);
    if (!llm->has_sampler && q->penalized) {
        q->seen = calloc((size_t)c->vocab_size, 1);
        q->count = calloc((size_t)c->vocab_size, sizeof *q->count);
    }
    if (r->logprobs >= 0)
        q->logprobs = malloc(sizeof *q->logprobs * (size_t)r->max_tokens);
    if (!q->text || !q->blocks || !q->hashes || (!llm->has_sampler && q->penalized && (!q->seen || !q->count)) ||
        (r->logprobs >= 0 && !q->logprobs))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a request");
    KILN_TRY(kiln_tokenizer_stream_create(llm->tok, 0, &q->stream));
    kiln_kv_seq_init(&q->kv, q->blocks, llm->max_blocks);
    for (size_t k = 0; q->seen && k < n; k++)
        q->seen[q->ids[k]] = 1;
    kiln_rng_seed(&q->rng, q->sampling.seed);
    q->text[0] = '\0';
    return KILN_OK;
}

/* ---- text, stop strings and streaming ------------------------------------------------------ */

static void text_append(sched_seq *q, const char *s, size_t n)
{
    if (q->text_len + n + 1 > q->text_cap) {
        /* Beyond the bound computed at the start; only a tokenizer that
         * expands more than that gets here. */
        size_t cap = (q->text_len + n + 1) * 2;
        char *t = realloc(q->text, cap);
        if (!t)
            return;
        q->text = t;
        q->text_cap = cap;
    }
    memcpy(q->text + q->text_len, s, n);
    q->text_len += n;
    q->text[q->text_len] = '\0';
}

/* Looks for a stop string in the text not yet emitted (and the bytes before
 * it a stop string could start in); truncates there. Returns 1 on a match. */
static int stop_match(sched_seq *q)
{
    const kiln_llm_request *r = &q->req;
    if (!r->n_stop)
        return 0;
    size_t from = q->emitted > q->max_stop ? q->emitted - q->max_stop : 0;
    size_t best = SIZE_MAX;
    for (int32_t k = 0; k < r->n_stop; k++) {
        size_t len = strlen(r->stop[k]);
        for (size_t at = from; at + len <= q->text_len; at++)
            if (memcmp(q->text + at, r->stop[k], len) == 0) {
                if (at < best)
                    best = at;
                break;
            }
    }
    if (best == SIZE_MAX)
        return 0;
    q->text_len = best;
    q->text[best] = '\0';
    return 1;
}

/* Bytes at the end of the text that could begin a stop string: held back
 * until the next token decides. A stop string's prefix starts on a UTF-8
 * character boundary, so what is emitted is always whole characters. */
static size_t stop_holdback(const sched_seq *q)
{
    const kiln_llm_request *r = &q->req;
    size_t hold = 0;
    for (int32_t k = 0; k < r->n_stop; k++) {
        size_t len = strlen(r->stop[k]);
        for (size_t h = len - 1; h > hold; h--)
            if (h <= q->text_len - q->emitted && memcmp(q->text + q->text_len - h, r->stop[k], h) == 0) {
                hold = h;
                break;
            }
    }
    return hold;
}

/* Hands the text that became final to on_token with `tok` (id, logprobs);
 * returns nonzero when the callback asks to end the request. */
static int emit(sched_seq *q, kiln_llm_token *tok, int final)
{
    size_t hold = final ? 0 : stop_holdback(q);
    size_t end = q->text_len - hold;
    size_t from = q->emitted;
    if (end < from)
        end = from;
    q->emitted = end;
    if (!q->cb.on_token || (tok->id < 0 && end == from))
        return 0;
    tok->text = q->text + from;
    tok->len = end - from;
    return q->cb.on_token(q->cb.user, tok);
}

static void token_init(kiln_llm_token *tok, int32_t id)
{
    memset(tok, 0, sizeof *tok);
    tok->struct_size = (uint32_t)sizeof *tok;
    tok->abi_version = KILN_API_VERSION;
    tok->id = id;
    tok->logprob = NAN;
}

/* ---- a request's end ----------------------------------------------------------------------- */

static kiln_llm_result *make_result(const sched_seq *q, kiln_llm_finish why, const char *error)
{
    kiln_llm_result *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->struct_size = (uint32_t)sizeof *r;
    r->abi_version = KILN_API_VERSION;
    size_t n_gen = q->n_ids - q->n_prompt;
    r->prompt_ids = malloc(sizeof *r->prompt_ids * (q->n_prompt ? q->n_prompt : 1));
    r->ids = malloc(sizeof *r->ids * (n_gen ? n_gen : 1));
    r->text = malloc(q->text_len + 1);
    if (q->logprobs)
        r->logprobs = malloc(sizeof *r->logprobs * (n_gen ? n_gen : 1));
    if (error)
        r->error = kiln_strdup(error);
    r->finish = why;
    if (!r->prompt_ids || !r->ids || !r->text || (q->logprobs && !r->logprobs) || (error && !r->error)) {
        /* What is left says what happened, without the tokens. */
        free(r->prompt_ids);
        free(r->ids);
        free(r->text);
        free(r->logprobs);
        r->prompt_ids = r->ids = NULL;
        r->text = NULL;
        r->logprobs = NULL;
        r->finish = KILN_LLM_FINISH_ERROR;
        return r;
    }
    memcpy(r->prompt_ids, q->ids, sizeof *r->ids * q->n_prompt);
    r->n_prompt_ids = q->n_prompt;
    memcpy(r->ids, q->ids + q->n_prompt, sizeof *r->ids * n_gen);
    r->n_ids = n_gen;
    memcpy(r->text, q->text, q->text_len + 1);
    r->text_len = q->text_len;
    if (q->logprobs)
        memcpy(r->logprobs, q->logprobs, sizeof *r->logprobs * n_gen);
    if (n_gen) {
        r->prompt_ms = q->t_first - q->t_submit;
        r->generate_ms = q->t_last - q->t_first;
        r->prompt_tok_s = r->prompt_ms > 0 ? (double)q->n_prompt / (r->prompt_ms / 1e3) : 0;
        r->generate_tok_s = n_gen > 1 && r->generate_ms > 0 ? (double)(n_gen - 1) / (r->generate_ms / 1e3) : 0;
    }
    return r;
}

static void slot_release(kiln_llm *llm, sched_seq *q)
{
    if (q->slot >= 0)
        llm->free_slots[llm->n_free_slots++] = q->slot;
    q->slot = -1;
}

/* Ends a request: flushes held-back text, lets go of its blocks and slot,
 * and hands its result to on_finish. The caller takes it out of its list
 * and frees it. */
static void seq_end(kiln_llm_scheduler *sc, sched_seq *q, kiln_llm_finish why, const char *error)
{
    if (why != KILN_LLM_FINISH_STOP && why != KILN_LLM_FINISH_ERROR) {
        const char *t;
        size_t n;
        if (kiln_tokenizer_stream_finish(q->stream, &t, &n) == KILN_OK && n) {
            text_append(q, t, n);
            if (stop_match(q))
                why = KILN_LLM_FINISH_STOP;
        }
    }
    kiln_llm_token tok;
    token_init(&tok, -1);
    if (why != KILN_LLM_FINISH_ERROR)
        emit(q, &tok, 1);
    q->state = SEQ_DONE;
    /* A step run ahead may hold a row of it: that row's token is dropped.
     * Its blocks are reused only by steps enqueued after that one. */
    for (int32_t s = 0; sc->ahead && s < sc->ahead_S; s++)
        if (sc->ahead_rows[s] == q) {
            sc->ahead_rows[s] = NULL;
            sc->stats.dropped_rows++;
        }
    kiln_kv_seq_release(&sc->llm->pool, &q->kv);
    slot_release(sc->llm, q);
    if (why == KILN_LLM_FINISH_CANCELLED)
        sc->stats.cancelled++;
    else if (why == KILN_LLM_FINISH_ERROR)
        sc->stats.failed++;
    else
        sc->stats.finished++;
    kiln_llm_result *res = make_result(q, why, error);
    /* Whoever waits for on_finish sees the request counted. */
    pthread_mutex_lock(&sc->mu);
    sc->shown.steps = sc->stats.steps;
    sc->shown.generated_tokens = sc->stats.generated_tokens;
    sc->shown.finished = sc->stats.finished;
    sc->shown.cancelled = sc->stats.cancelled;
    sc->shown.failed = sc->stats.failed;
    pthread_mutex_unlock(&sc->mu);
    if (q->cb.on_finish)
        q->cb.on_finish(q->cb.user, res);
    else
        kiln_llm_result_free(res);
}

/* Handles a sampled token (row s of the step, which ended at time t). */
static void seq_accept(kiln_llm_scheduler *sc, sched_seq *q, int32_t s, int32_t id, double t)
{
    kiln_llm *llm = sc->llm;
    const kiln_llm_config *c = &llm->cfg;
    if (q->n_ids == q->n_prompt)
        q->t_first = t;
    q->t_last = t;
    kiln_llm_token tok;
    token_init(&tok, id);
    if (q->logprobs) {
        const size_t k = (size_t)llm->logprob_top;
        tok.logprob = llm->h.logprob[s];
        tok.n_top = q->req.logprobs;
        tok.top_ids = llm->h.top_ids + (size_t)s * k;
        tok.top_logprobs = llm->h.top_logprobs + (size_t)s * k;
        q->logprobs[q->n_ids - q->n_prompt] = tok.logprob;
    }
    q->ids[q->n_ids++] = id;
    sc->stats.generated_tokens++;
    if (q->seen) {
        q->seen[id] = 1;
        q->count[id]++;
    }
    if (!q->req.ignore_eos)
        for (int32_t k = 0; k < c->n_eos; k++)
            if (c->eos_ids[k] == id) {
                seq_end(sc, q, KILN_LLM_FINISH_EOS, NULL);
                return;
            }
    const char *piece = NULL;
    size_t n = 0;
    if (kiln_tokenizer_stream_push(q->stream, id, &piece, &n) == KILN_OK && n)
        text_append(q, piece, n);
    if (stop_match(q)) {
        emit(q, &tok, 1);
        seq_end(sc, q, KILN_LLM_FINISH_STOP, NULL);
        return;
    }
    if (emit(q, &tok, 0)) {
        seq_end(sc, q, KILN_LLM_FINISH_CANCELLED, NULL);
        return;
    }
    if (q->n_ids - q->n_prompt >= (size_t)q->req.max_tokens || q->n_ids >= (size_t)c->max_seq_len)
        seq_end(sc, q, KILN_LLM_FINISH_LENGTH, NULL);
}

/* ---- lists ---------------------------------------------------------------------------------- */

static void list_push_back(sched_seq **head, sched_seq **tail, sched_seq *q)
{
    q->next = NULL;
    q->prev = *tail;
    if (*tail)
        (*tail)->next = q;
    else
        *head = q;
    *tail = q;
}

static void list_push_front(sched_seq **head, sched_seq **tail, sched_seq *q)
{
    q->prev = NULL;
    q->next = *head;
    if (*head)
        (*head)->prev = q;
    else
        *tail = q;
    *head = q;
}

static void list_unlink(sched_seq **head, sched_seq **tail, sched_seq *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        *head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        *tail = q->prev;
    q->prev = q->next = NULL;
}

/* Drops the running requests that ended, keeping the order. */
static void compact_running(kiln_llm_scheduler *sc)
{
    int32_t k = 0;
    for (int32_t i = 0; i < sc->n_running; i++) {
        if (sc->running[i]->state == SEQ_DONE)
            seq_free(sc->running[i]);
        else
            sc->running[k++] = sc->running[i];
    }
    sc->n_running = k;
}

/* Ends every request of the waiting list with `why`. */
static void end_waiting(kiln_llm_scheduler *sc, kiln_llm_finish why, int only_cancelled)
{
    for (sched_seq *q = sc->wait_head, *next; q; q = next) {
        next = q->next;
        if (only_cancelled && !q->cancel)
            continue;
        list_unlink(&sc->wait_head, &sc->wait_tail, q);
        sc->n_waiting--;
        seq_end(sc, q, why, NULL);
        seq_free(q);
    }
}

/* ---- scheduling ---------------------------------------------------------------------------- */

/* Frees a running request's blocks and sends it back to the front of the
 * waiting list; it recomputes its tokens when admitted again. */
static void preempt(kiln_llm_scheduler *sc)
{
    sched_seq *q = sc->running[--sc->n_running];
    kiln_kv_seq_release(&sc->llm->pool, &q->kv);
    slot_release(sc->llm, q);
    q->n_cached = 0;
    q->n_hashed = 0;
    q->state = SEQ_WAITING;
    list_push_front(&sc->wait_head, &sc->wait_tail, q);
    sc->n_waiting++;
    sc->stats.preemptions++;
}

/* Fills row s's sampling inputs: the request's parameters when the row
 * samples, its state slot (the layer tracks the tokens every row of the
 * sequence feeds), and a uniform drawn from its PRNG exactly when
 * sampler.c would draw one. */
static void set_sampling_row(kiln_llm *llm, int32_t s, sched_seq *q, int sample)
{
    float *p = llm->h.params + (size_t)llm->n_params * (size_t)s;
    int32_t *sq = llm->h.seq + SAMPLE_SEQ * s;
    const kiln_llm_sampling *sp = &q->sampling;
    memset(p, 0, sizeof *p * (size_t)llm->n_params);
    if (llm->n_params > SAMPLE_PARAMS)
        p[SAMPLE_PARAMS] = sample && q->logprobs ? (float)q->req.logprobs : -1.0f;
    sq[2] = q->slot;
    sq[3] = (int32_t)q->n_prompt;
    if (!sample || !llm->has_sampler)
        return;
    p[0] = sp->temperature;
    p[1] = (float)(sp->top_k < llm->cfg.vocab_size ? sp->top_k : llm->cfg.vocab_size);
    p[2] = sp->top_p;
    p[3] = sp->min_p;
    p[4] = sp->repetition_penalty;
    p[5] = sp->presence_penalty;
    p[6] = sp->frequency_penalty;
    if (sp->temperature > 0.0f)
        kiln_sampler_uniform_bits(&q->rng, sq);
}

/* Adds q's next `chunk` tokens as row S of the step. */
static void add_row(kiln_llm_scheduler *sc, sched_seq *q, size_t chunk, int32_t *S, int32_t *T)
{
    kiln_llm *llm = sc->llm;
    step_host *h = &llm->h;
    for (size_t j = 0; j < chunk; j++) {
        h->tokens[*T + (int32_t)j] = q->ids[q->n_cached + j];
        h->positions[*T + (int32_t)j] = (int32_t)(q->n_cached + j);
    }
    *T += (int32_t)chunk;
    int32_t s = *S;
    memcpy(h->block_table + (size_t)s * (size_t)llm->max_blocks, q->kv.blocks,
           sizeof(int32_t) * (size_t)q->kv.n_blocks);
    h->seq_lens[s] = (int32_t)(q->n_cached + chunk);
    h->query_start[s + 1] = *T;
    h->last_token[s] = *T - 1;
    set_sampling_row(llm, s, q, q->n_cached + chunk >= q->n_ids);
    sc->rows[s] = q;
    q->in_step = 1;
    (*S)++;
}

/* Tokens q may add now: up to `want`, as far as its blocks and the pool's
 * available ones reach. */
static size_t fits(const kiln_llm_scheduler *sc, const sched_seq *q, size_t want)
{
    const kiln_kv_pool *pool = &sc->llm->pool;
    size_t room = ((size_t)q->kv.n_blocks + (size_t)kiln_kv_pool_available(pool)) * (size_t)pool->block_size;
    room = room > q->n_cached ? room - q->n_cached : 0;
    return want < room ? want : room;
}

/* Packs one step: the running decodes (one token each, preempting the
 * newest running requests while the cache lacks a block), then running
 * prefills (chunks in the remaining budget), then waiting requests, first
 * come first served, while no preemption happened in this step. */
static int32_t pack(kiln_llm_scheduler *sc, int32_t *T_out)
{
    kiln_llm *llm = sc->llm;
    kiln_kv_pool *pool = &llm->pool;
    int32_t S = 0, T = 0;
    int preempted = 0;
    llm->h.query_start[0] = 0;
    for (int32_t i = 0; i < sc->n_running; i++)
        sc->running[i]->in_step = 0;
    /* Decodes. */
    for (int32_t i = 0; i < sc->n_running && S < llm->max_batch && T < llm->max_tokens; i++) {
        sched_seq *q = sc->running[i];
        if (q->n_ids - q->n_cached != 1)
            continue;
        while (kiln_kv_seq_grow(pool, &q->kv, (int64_t)q->n_cached + 1) != KILN_OK) {
            preempted = 1;
            preempt(sc);
            if (sc->n_running == i)
                break; /* q itself was the newest */
        }
        if (i < sc->n_running)
            add_row(sc, q, 1, &S, &T);
    }
    /* Running prefills; the newest running request, when it has no row
     * yet, makes room for an older one that gets no block at all. */
    for (int32_t i = 0; i < sc->n_running && S < llm->max_batch && T < llm->max_tokens; i++) {
        sched_seq *q = sc->running[i];
        if (q->in_step)
            continue;
        size_t want = q->n_ids - q->n_cached, budget = (size_t)(llm->max_tokens - T);
        if (want > budget)
            want = budget;
        size_t chunk = fits(sc, q, want);
        while (chunk == 0 && sc->n_running - 1 > i && !sc->running[sc->n_running - 1]->in_step) {
            preempted = 1;
            preempt(sc);
            chunk = fits(sc, q, want);
        }
        if (chunk == 0 || kiln_kv_seq_grow(pool, &q->kv, (int64_t)(q->n_cached + chunk)) != KILN_OK)
            continue;
        add_row(sc, q, chunk, &S, &T);
    }
    /* Admissions: blocks for the whole remaining prompt must be available
     * now, beyond a reserve (1% of the cache) for the running decodes;
     * with NO_EVICT, beyond every running request's remaining growth too,
     * and for the request's own max_tokens. */
    int32_t reserve = sc->n_running > 0 ? pool->n_blocks / 100 : 0;
    const int no_evict = sc->opt.admission == KILN_LLM_ADMIT_NO_EVICT;
    for (int32_t i = 0; no_evict && i < sc->n_running; i++) {
        const sched_seq *q = sc->running[i];
        reserve += kiln_kv_blocks_for(pool, (int64_t)(q->n_prompt + (size_t)q->req.max_tokens)) - q->kv.n_blocks;
    }
    while (!preempted && sc->wait_head && sc->n_running < llm->max_batch && S < llm->max_batch && T < llm->max_tokens) {
        sched_seq *q = sc->wait_head;
        int32_t hit = 0;
        if (!q->penalized)
            hit = kiln_kv_seq_match(pool, &q->kv, q->ids, (int32_t)((q->n_ids - 1) / (size_t)pool->block_size),
                                    q->hashes);
        q->n_cached = (size_t)hit * (size_t)pool->block_size;
        q->n_hashed = hit;
        size_t whole = no_evict ? q->n_prompt + (size_t)q->req.max_tokens : q->n_ids;
        int32_t need = kiln_kv_blocks_for(pool, (int64_t)whole) - hit;
        size_t chunk = q->n_ids - q->n_cached;
        if (chunk > (size_t)(llm->max_tokens - T))
            chunk = (size_t)(llm->max_tokens - T);
        if (kiln_kv_pool_available(pool) - reserve < need ||
            kiln_kv_seq_grow(pool, &q->kv, (int64_t)(q->n_cached + chunk)) != KILN_OK) {
            kiln_kv_seq_release(pool, &q->kv);
            q->n_cached = 0;
            q->n_hashed = 0;
            break;
        }
        list_unlink(&sc->wait_head, &sc->wait_tail, q);
        sc->n_waiting--;
        q->state = SEQ_RUNNING;
        if (q->penalized && llm->has_sampler && llm->n_free_slots > 0)
            q->slot = llm->free_slots[--llm->n_free_slots];
        if (!q->admitted)
            sc->stats.prompt_tokens += q->n_prompt;
        q->admitted = 1;
        sc->stats.prefix_hit_tokens += q->n_cached;
        sc->running[sc->n_running++] = q;
        add_row(sc, q, chunk, &S, &T);
        if (no_evict)
            reserve += kiln_kv_blocks_for(pool, (int64_t)whole) - q->kv.n_blocks;
    }
    *T_out = T;
    return S;
}

/* Offers q's blocks that became full to the prefix cache. */
static void register_blocks(kiln_llm_scheduler *sc, sched_seq *q)
{
    kiln_kv_pool *pool = &sc->llm->pool;
    if (!pool->caching)
        return;
    int32_t full = (int32_t)(q->n_cached / (size_t)pool->block_size);
    for (int32_t j = q->n_hashed; j < full; j++) {
        const int32_t *blk = q->ids + (size_t)j * (size_t)pool->block_size;
        q->hashes[j] = kiln_kv_block_hash(j > 0 ? q->hashes[j - 1] : 0, blk, pool->block_size);
        kiln_kv_seq_register(pool, &q->kv, j, q->hashes[j], blk);
    }
    if (full > q->n_hashed)
        q->n_hashed = full;
}

/* Hands out the tokens of a step that ended: rows[s] (NULL: none) with
 * seq_lens lens[s] took ids next[s] (or sample from the logits of an
 * engine without the sampling layer). */
static void take_tokens(kiln_llm_scheduler *sc, sched_seq **rows, int32_t S, const int32_t *lens, const int32_t *next)
{
    kiln_llm *llm = sc->llm;
    const int32_t V = llm->cfg.vocab_size;
    sc->stats.steps++;
    /* The step's tokens all exist from its end on: one clock read a step, not
     * one a token. */
    const double t = kiln_llm_now_ms();
    const double from = sc->enqueue_ms > sc->last_end_ms ? sc->enqueue_ms : sc->last_end_ms;
    const uint64_t us = t > from ? (uint64_t)((t - from) * 1e3 + 0.5) : 0;
    sc->last_end_ms = t;
    if (sc->one_token_rows) {
        sc->stats.decode_steps++;
        sc->stats.decode_us += us;
    } else {
        sc->stats.prompt_step_us += us;
    }
    for (int32_t s = 0; s < S; s++) {
        sched_seq *q = rows[s];
        if (!q)
            continue;
        q->n_cached = (size_t)lens[s];
        register_blocks(sc, q);
        if (q->n_cached < q->n_ids)
            continue; /* a prefill chunk short of the prompt's end */
        int32_t id;
        if (llm->has_sampler) {
            id = next[s];
        } else {
            /* An engine built without the sampling layer. */
            float *row = llm->h.logits + (size_t)s * (size_t)V;
            if (q->seen)
                kiln_sampler_penalize(row, V, &q->sampling, q->seen, q->count);
            id = kiln_sampler_sample(row, V, &q->sampling, &q->rng, llm->cand);
        }
        if (id < 0 || id >= V) {
            char why[128];
            snprintf(why, sizeof why, "the engine sampled id %d outside the vocabulary [0, %d)", (int)id, (int)V);
            seq_end(sc, q, KILN_LLM_FINISH_ERROR, why);
            continue;
        }
        seq_accept(sc, q, s, id, t);
    }
    compact_running(sc);
}

/* Whether the decode step of rows[0..S) (seq_lens lens), just enqueued,
 * may be followed by the next one before its ids reach the host: every
 * row samples in it and goes on after it unless its token ends it (EOS, a
 * stop string: the next step's row is then dropped), and the host has
 * nothing to add to the next step (no request waiting). Rows with a
 * penalty (state kept on the engine's side per slot), logprobs or an
 * engine without the sampling layer always wait for the host. */
static int may_run_ahead(const kiln_llm_scheduler *sc, sched_seq *const *rows, int32_t S, const int32_t *lens)
{
    const kiln_llm *llm = sc->llm;
    if (!sc->run_ahead || !llm->has_sampler || sc->n_waiting > 0 || atomic_load(&llm->cancel))
        return 0;
    for (int32_t s = 0; s < S; s++) {
        const sched_seq *q = rows[s];
        if (!q || q->state != SEQ_RUNNING || q->cancel || q->slot >= 0 || q->logprobs || (size_t)lens[s] != q->n_ids ||
            q->n_ids + 1 - q->n_prompt >= (size_t)q->req.max_tokens || q->n_ids + 1 >= (size_t)llm->cfg.max_seq_len)
            return 0;
    }
    return 1;
}

/* Enqueues the decode step after the one of rows[0..S) (lens, bucket B),
 * which is still running: each row one position on, its token the running
 * step's next_token on the device. Leaves *ran 0 without enqueuing
 * anything when a row's next token finds no block (the next step packed
 * as usual preempts). On success this step's ids are in llm->h.next: the
 * ahead step's copy of next_token completes the previous one first
 * (include/kiln/runtime.h). */
static kiln_status run_ahead(kiln_llm_scheduler *sc, int32_t S, int32_t B, int *ran)
{
    kiln_llm *llm = sc->llm;
    step_host *h = &llm->h;
    *ran = 0;
    for (int32_t s = 0; s < S; s++)
        if (kiln_kv_seq_grow(&llm->pool, &sc->rows[s]->kv, (int64_t)sc->lens[s] + 1) != KILN_OK)
            return KILN_OK;
    for (int32_t s = 0; s < S; s++) {
        sched_seq *q = sc->rows[s];
        h->positions[s] = sc->lens[s];
        h->seq_lens[s] = sc->lens[s] + 1;
        memcpy(h->block_table + (size_t)s * (size_t)llm->max_blocks, q->kv.blocks,
               sizeof(int32_t) * (size_t)q->kv.n_blocks);
        set_sampling_row(llm, s, q, 1);
        sc->ahead_rows[s] = q;
        sc->ahead_lens[s] = sc->lens[s] + 1;
    }
    sc->ahead = 1;
    sc->ahead_enqueue_ms = kiln_llm_now_ms();
    sc->stats.steps_ahead++;
    sc->ahead_S = S;
    sc->ahead_B = B;
    *ran = 1;
    return kiln_llm_step_enqueue(llm, B ? B : S, B ? B : S, B != 0, 0, 0, 1, h->next_ahead);
}

/* Runs the step of sc->rows[0..S) (lens sc->lens) that was just enqueued
 * (B: its graph bucket, decode: every row one token, nothing but ids to
 * copy out) to its end, running the next one ahead where it may, and hands
 * out its tokens. On failure every request of the step (and of a step
 * run ahead) ends with the error. */
static kiln_status finish_step(kiln_llm_scheduler *sc, int32_t S, int32_t B, int decode, kiln_status st)
{
    kiln_llm *llm = sc->llm;
    int ran = 0;
    if (st == KILN_OK && decode && may_run_ahead(sc, sc->rows, S, sc->lens))
        st = run_ahead(sc, S, B, &ran);
    if (st == KILN_OK && !ran)
        st = kiln_context_synchronize(llm->ctx);
    if (st != KILN_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", kiln_last_error());
        (void)kiln_context_synchronize(llm->ctx);
        for (int32_t s = 0; s < S; s++)
            if (sc->rows[s] && sc->rows[s]->state != SEQ_DONE)
                seq_end(sc, sc->rows[s], KILN_LLM_FINISH_ERROR, why);
        for (int32_t s = 0; sc->ahead && s < sc->ahead_S; s++)
            if (sc->ahead_rows[s])
                seq_end(sc, sc->ahead_rows[s], KILN_LLM_FINISH_ERROR, why);
        sc->ahead = 0;
        compact_running(sc);
        return kiln_fail(st, "%s", why);
    }
    take_tokens(sc, sc->rows, S, sc->lens, llm->h.next);
    return KILN_OK;
}

/* Runs a packed step and hands out its tokens. */
static kiln_status run_packed(kiln_llm_scheduler *sc, int32_t S, int32_t T)
{
    kiln_llm *llm = sc->llm;
    step_host *h = &llm->h;
    int need_logits = 0, need_logprobs = 0;
    for (int32_t s = 0; s < S; s++) {
        sched_seq *q = sc->rows[s];
        int sample = (size_t)h->seq_lens[s] >= q->n_ids;
        need_logits |= sample && !llm->has_sampler;
        need_logprobs |= sample && q->logprobs != NULL;
    }
    int32_t B = T == S ? kiln_llm_step_bucket(llm, S) : 0;
    if (B)
        kiln_llm_step_pad(llm, S, B);
    memcpy(sc->lens, h->seq_lens, sizeof *sc->lens * (size_t)S);
    sc->enqueue_ms = kiln_llm_now_ms();
    sc->one_token_rows = T == S;
    kiln_status st = kiln_llm_step_enqueue(llm, B ? B : T, B ? B : S, B != 0, need_logits, need_logprobs, 0, h->next);
    return finish_step(sc, S, B, T == S && !need_logits && !need_logprobs, st);
}

/* The step run ahead becomes the current one: runs it to its end (with
 * the next one ahead where it may) and hands out its tokens. */
static kiln_status finish_ahead(kiln_llm_scheduler *sc)
{
    step_host *h = &sc->llm->h;
    sched_seq **rows = sc->rows;
    int32_t *lens = sc->lens, *next = h->next;
    sc->rows = sc->ahead_rows;
    sc->lens = sc->ahead_lens;
    h->next = h->next_ahead;
    sc->ahead_rows = rows;
    sc->ahead_lens = lens;
    h->next_ahead = next;
    sc->ahead = 0;
    sc->enqueue_ms = sc->ahead_enqueue_ms;
    sc->one_token_rows = 1;
    return finish_step(sc, sc->ahead_S, sc->ahead_B, 1, KILN_OK);
}

/* Publishes the stats snapshot; under mu. */
static void publish(kiln_llm_scheduler *sc)
{
    const kiln_kv_pool *pool = &sc->llm->pool;
    kiln_llm_scheduler_stats *st = &sc->stats;
    st->running = sc->n_running;
    st->waiting = sc->n_waiting + sc->n_in;
    st->blocks_total = pool->n_blocks;
    st->blocks_used = pool->n_blocks - kiln_kv_pool_available(pool);
    if (st->blocks_used > st->blocks_peak)
        st->blocks_peak = st->blocks_used;
    sc->shown = *st;
}

/* Takes what the submitting side left: new requests join the waiting list
 * in arrival order, cancelled ones are marked. Returns nonzero when the
 * scheduler is told to quit. */
static int take_incoming(kiln_llm_scheduler *sc)
{
    pthread_mutex_lock(&sc->mu);
    while (sc->in_head) {
        sched_seq *q = sc->in_head;
        list_unlink(&sc->in_head, &sc->in_tail, q);
        list_push_back(&sc->wait_head, &sc->wait_tail, q);
        sc->n_waiting++;
    }
    sc->n_in = 0;
    for (size_t k = 0; k < sc->n_cancel; k++) {
        for (sched_seq *q = sc->wait_head; q; q = q->next)
            if (q->id == sc->cancel_ids[k])
                q->cancel = 1;
        for (int32_t i = 0; i < sc->n_running; i++)
            if (sc->running[i]->id == sc->cancel_ids[k])
                sc->running[i]->cancel = 1;
    }
    sc->n_cancel = 0;
    int quit = sc->quit;
    pthread_mutex_unlock(&sc->mu);
    return quit;
}

/* Ends the cancelled requests (all of them with `all`). */
static void end_cancelled(kiln_llm_scheduler *sc, int all)
{
    for (int32_t i = 0; i < sc->n_running; i++)
        if (all || sc->running[i]->cancel)
            seq_end(sc, sc->running[i], KILN_LLM_FINISH_CANCELLED, NULL);
    compact_running(sc);
    end_waiting(sc, KILN_LLM_FINISH_CANCELLED, !all);
}

static kiln_status sched_step(kiln_llm_scheduler *sc, int *busy)
{
    int quit = take_incoming(sc);
    int all = quit || atomic_exchange(&sc->llm->cancel, 0);
    end_cancelled(sc, all);
    kiln_status st = KILN_OK;
    if (sc->ahead) {
        st = finish_ahead(sc);
    } else if (sc->n_running + sc->n_waiting > 0) {
        int32_t T = 0, S = pack(sc, &T);
        pthread_mutex_lock(&sc->mu);
        publish(sc);
        pthread_mutex_unlock(&sc->mu);
        if (S > 0)
            st = run_packed(sc, S, T);
        else
            st = kiln_fail(KILN_ERROR_INTERNAL, "the scheduler packed an empty step with %d running and %d waiting",
                           (int)sc->n_running, (int)sc->n_waiting);
    }
    pthread_mutex_lock(&sc->mu);
    publish(sc);
    if (busy)
        *busy = sc->n_running + sc->n_waiting + sc->n_in > 0 || sc->ahead;
    pthread_cond_broadcast(&sc->idle);
    pthread_mutex_unlock(&sc->mu);
    return st;
}

/* ---- the stepping thread ---------------------------------------------------------------------- */

static void *sched_thread(void *arg)
{
    kiln_llm_scheduler *sc = arg;
    for (;;) {
        pthread_mutex_lock(&sc->mu);
        while (!sc->quit && !sc->in_head && !sc->n_cancel && sc->n_running + sc->n_waiting == 0 && !sc->ahead) {
            /* kiln_llm_cancel signals nothing: look at it now and then. */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 100 * 1000 * 1000;
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            if (pthread_cond_timedwait(&sc->work, &sc->mu, &until) == ETIMEDOUT)
                atomic_store(&sc->llm->cancel, 0);
        }
        int quit = sc->quit;
        pthread_mutex_unlock(&sc->mu);
        if (sched_step(sc, NULL) != KILN_OK)
            kiln_log(KILN_LOG_ERROR, "llm scheduler: %s", kiln_last_error());
        if (quit)
            return NULL;
    }
}

/* ---- the API ------------------------------------------------------------------------------------ */

void kiln_llm_scheduler_options_init(kiln_llm_scheduler_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->struct_size = (uint32_t)sizeof *o;
    o->abi_version = KILN_API_VERSION;
    o->max_queue = 4096;
    o->thread = 1;
    o->prefix_caching = 1;
    o->run_ahead = -1;
}

void kiln_llm_callbacks_init(kiln_llm_callbacks *cb)
{
    if (!cb)
        return;
    memset(cb, 0, sizeof *cb);
    cb->struct_size = (uint32_t)sizeof *cb;
    cb->abi_version = KILN_API_VERSION;
}

static void sched_free(kiln_llm_scheduler *sc)
{
    free(sc->running);
    free(sc->rows);
    free(sc->lens);
    free(sc->ahead_rows);
    free(sc->ahead_lens);
    free(sc->cancel_ids);
    pthread_mutex_destroy(&sc->mu);
    pthread_cond_destroy(&sc->work);
    pthread_cond_destroy(&sc->idle);
    free(sc);
}

kiln_status kiln_llm_scheduler_start(kiln_llm *llm, const kiln_llm_scheduler_options *options, kiln_llm_scheduler **out)
{
    if (!llm || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_llm_scheduler_start: llm and out are required");
    if (llm->scheduled)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_llm_scheduler_start: the llm has a scheduler already");
    kiln_llm_scheduler_options o;
    kiln_llm_scheduler_options_init(&o);
    if (options)
        KILN_TRY(kiln_api_struct_read(&o, sizeof o, options, "scheduler options"));
    if (o.max_queue <= 0)
        o.max_queue = 4096;
    if (o.admission != KILN_LLM_ADMIT_MAX_UTILIZATION && o.admission != KILN_LLM_ADMIT_NO_EVICT)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "scheduler admission %d is not MAX_UTILIZATION (0) or NO_EVICT (1)", (int)o.admission);
    if (o.run_ahead < -1 || o.run_ahead > 1)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "scheduler run_ahead %d is not -1 (auto), 0 or 1",
                         (int)o.run_ahead);
    kiln_llm_scheduler *sc = calloc(1, sizeof *sc);
    if (!sc)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a scheduler");
    pthread_mutex_init(&sc->mu, NULL);
    pthread_cond_init(&sc->work, NULL);
    pthread_cond_init(&sc->idle, NULL);
    sc->llm = llm;
    sc->opt = o;
    sc->running = calloc((size_t)llm->max_batch, sizeof *sc->running);
    sc->rows = calloc((size_t)llm->max_batch, sizeof *sc->rows);
    sc->lens = calloc((size_t)llm->max_batch, sizeof *sc->lens);
    sc->ahead_rows = calloc((size_t)llm->max_batch, sizeof *sc->ahead_rows);
    sc->ahead_lens = calloc((size_t)llm->max_batch, sizeof *sc->ahead_lens);
    /* KILN_LLM_RUN_AHEAD=0 or 1 stands for the default (-1), to time both
     * through callers that take the default (kiln bench, the server) */
    const char *env = getenv("KILN_LLM_RUN_AHEAD");
    if (o.run_ahead < 0 && env && (!strcmp(env, "0") || !strcmp(env, "1")))
        o.run_ahead = env[0] - '0';
    sc->run_ahead = o.run_ahead < 0 ? kiln_engine_backend(llm->engine) != KILN_BACKEND_CPU : o.run_ahead != 0;
    kiln_status s = sc->running && sc->rows && sc->lens && sc->ahead_rows && sc->ahead_lens
                        ? KILN_OK
                        : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory for a scheduler");
    if (s == KILN_OK)
        s = kiln_kv_pool_set_caching(&llm->pool, o.prefix_caching != 0);
    if (s == KILN_OK)
        publish(sc);
    if (s == KILN_OK && o.thread) {
        int e = pthread_create(&sc->thread, NULL, sched_thread, sc);
        if (e)
            s = kiln_fail(KILN_ERROR_BACKEND, "kiln_llm_scheduler_start: pthread_create: %s", strerror(e));
        sc->has_thread = e == 0;
    }
    if (s != KILN_OK) {
        sched_free(sc);
        return s;
    }
    llm->scheduled = 1;
    *out = sc;
    return KILN_OK;
}

kiln_status kiln_llm_submit(kiln_llm_scheduler *sc, const kiln_llm_request *req, const kiln_llm_callbacks *callbacks,
                            uint64_t *id)
{
    if (!sc || !req)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_llm_submit: scheduler and request are required");
    sched_seq *q = NULL;
    kiln_status s = seq_create(sc, req, callbacks, &q);
    if (s != KILN_OK) {
        seq_free(q);
        return s;
    }
    q->t_submit = kiln_llm_now_ms();
    pthread_mutex_lock(&sc->mu);
    int32_t queued = sc->shown.waiting;
    if (sc->stopping)
        s = kiln_fail(KILN_ERROR_CANCELLED, "kiln_llm_submit: the scheduler is stopping");
    else if (queued >= sc->opt.max_queue)
        s = kiln_fail(KILN_ERROR_LIMIT, "kiln_llm_submit: %d requests are waiting, the queue holds %d", (int)queued,
                      (int)sc->opt.max_queue);
    if (s == KILN_OK) {
        q->id = ++sc->last_id;
        list_push_back(&sc->in_head, &sc->in_tail, q);
        sc->n_in++;
        sc->shown.waiting++;
        if (id)
            *id = q->id;
        pthread_cond_signal(&sc->work);
    }
    pthread_mutex_unlock(&sc->mu);
    if (s != KILN_OK)
        seq_free(q);
    return s;
}

void kiln_llm_request_cancel(kiln_llm_scheduler *sc, uint64_t id)
{
    if (!sc || id == 0)
        return;
    pthread_mutex_lock(&sc->mu);
    /* A request not yet seen by a step ends there too: the step marks it
     * once it joins the waiting list. */
    if (sc->n_cancel == sc->cap_cancel) {
        size_t cap = sc->cap_cancel ? sc->cap_cancel * 2 : 16;
        uint64_t *grown = realloc(sc->cancel_ids, cap * sizeof *grown);
        if (grown) {
            sc->cancel_ids = grown;
            sc->cap_cancel = cap;
        }
    }
    if (sc->n_cancel < sc->cap_cancel) {
        sc->cancel_ids[sc->n_cancel++] = id;
        pthread_cond_signal(&sc->work);
    } else {
        kiln_log(KILN_LOG_ERROR, "kiln_llm_request_cancel: out of memory; request %llu runs on",
                 (unsigned long long)id);
    }
    pthread_mutex_unlock(&sc->mu);
}

kiln_status kiln_llm_scheduler_step(kiln_llm_scheduler *sc, int *busy)
{
    if (!sc)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_llm_scheduler_step: scheduler is NULL");
    if (sc->has_thread)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "kiln_llm_scheduler_step: this scheduler steps on its own thread (options.thread = 1)");
    return sched_step(sc, busy);
}

void kiln_llm_scheduler_stats_get(kiln_llm_scheduler *sc, kiln_llm_scheduler_stats *out)
{
    if (!sc || !out)
        return;
    pthread_mutex_lock(&sc->mu);
    kiln_llm_scheduler_stats st = sc->shown;
    pthread_mutex_unlock(&sc->mu);
    st.struct_size = (uint32_t)sizeof st;
    st.abi_version = KILN_API_VERSION;
    /* A caller compiled against a shorter struct gets what it knows of. */
    size_t n = out->struct_size >= 8 && out->struct_size < sizeof st ? out->struct_size : sizeof st;
    memcpy(out, &st, n);
    out->struct_size = (uint32_t)n;
}

void kiln_llm_scheduler_stop(kiln_llm_scheduler *sc, double drain_seconds)
{
    if (!sc)
        return;
    double deadline = kiln_llm_now_ms() + (drain_seconds > 0 ? drain_seconds * 1e3 : 0);
    pthread_mutex_lock(&sc->mu);
    sc->stopping = 1;
    if (sc->has_thread) {
        while (drain_seconds > 0 && sc->n_in + sc->shown.running + sc->shown.waiting > 0 &&
               kiln_llm_now_ms() < deadline) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 10 * 1000 * 1000;
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&sc->idle, &sc->mu, &until);
        }
        sc->quit = 1;
        pthread_cond_signal(&sc->work);
        pthread_mutex_unlock(&sc->mu);
        pthread_join(sc->thread, NULL);
    } else {
        pthread_mutex_unlock(&sc->mu);
        int busy = 1;
        while (drain_seconds > 0 && busy && kiln_llm_now_ms() < deadline)
            if (sched_step(sc, &busy) != KILN_OK)
                kiln_log(KILN_LOG_ERROR, "llm scheduler: %s", kiln_last_error());
        pthread_mutex_lock(&sc->mu);
        sc->quit = 1;
        pthread_mutex_unlock(&sc->mu);
        sched_step(sc, NULL);
    }
    sc->llm->scheduled = 0;
    sched_free(sc);
}
