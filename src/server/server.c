/* kiln serve's HTTP server: routes, the life of a generation request, and
 * draining. See server.h for the threads; docs/serve.md for the API.
 *
 * A generation (gen) is shared by three owners, each holding a reference:
 * the connection that asked for it, the scheduler until on_finish, and for
 * a stream the libmicrohttpd response reading from it. Its lock orders
 * before libmicrohttpd's own (suspend and resume are called under it). */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <kiln/status.h>
#include <microhttpd.h>

#include "server/metrics.h"
#include "server/openai.h"
#include "server/server.h"

struct kiln_server {
    kiln_llm *llm;
    const kiln_llm_info *info;
    /* NULL once stopped; read under sched_lock by the threads that are not
     * the scheduler's */
    kiln_llm_scheduler *sched;
    pthread_rwlock_t sched_lock;
    struct MHD_Daemon *daemon;
    kiln_server_options o;
    char *model, *api_key;
    int port;
    long long started;
    atomic_int draining, listening;
    atomic_uint_fast64_t counter; /* request ids and default seeds */
    uint64_t salt;
    /* generations not finished, and those still tied to a connection */
    pthread_mutex_t lock;
    int n_unfinished, n_attached;
    /* the hang-up watcher: an epoll set of the sockets of requests in flight */
    int watch_fd, wake_fd;
    pthread_t watcher;
    int watcher_running;
    kiln_metrics metrics;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void sched_cancel(kiln_server *srv, uint64_t id)
{
    pthread_rwlock_rdlock(&srv->sched_lock);
    if (srv->sched)
        kiln_llm_request_cancel(srv->sched, id);
    pthread_rwlock_unlock(&srv->sched_lock);
}

/* 0 when the scheduler is stopped. */
static int sched_stats(kiln_server *srv, kiln_llm_scheduler_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    stats->struct_size = sizeof *stats;
    stats->abi_version = KILN_API_VERSION;
    pthread_rwlock_rdlock(&srv->sched_lock);
    int ok = srv->sched != NULL;
    if (ok)
        kiln_llm_scheduler_stats_get(srv->sched, stats);
    pthread_rwlock_unlock(&srv->sched_lock);
    return ok;
}

/* ---- a generation ------------------------------------------------------------------------------------------- */

typedef struct gen {
    kiln_server *srv;
    pthread_mutex_t lock;
    int refs;
    struct MHD_Connection *mc; /* NULL once the connection is done with it */
    int suspended, done, watched, fd;
    uint64_t id;
    kiln_openai_endpoint endpoint;
    int stream, include_usage;
    int32_t logprobs;
    char rid[48];
    long long created;
    /* bytes for the client: SSE events, or the whole answer */
    char *out;
    size_t out_len, out_pos, out_cap;
    int status; /* the answer's HTTP status when not streaming */
    int oom;
    /* logprobs gathered for an answer that does not stream */
    json_t *lp_tokens;
    size_t chars; /* characters of text so far, for completions' text_offset */
    double t_submit, t_last;
    size_t n_tokens;
    /* A streamed token's event around its text (see token_event), made at
     * the first token; NULL until then, or when the slow path is needed. */
    char *ev_head, *ev_tail;
    size_t ev_head_len, ev_tail_len;
} gen;

static void gen_unref(gen *g)
{
    pthread_mutex_lock(&g->lock);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->lock);
    if (!last)
        return;
    pthread_mutex_destroy(&g->lock);
    json_decref(g->lp_tokens);
    free(g->out);
    free(g->ev_head);
    free(g);
}

static void gen_append(gen *g, const char *s, size_t n)
{
    if (g->out_len + n > g->out_cap) {
        size_t cap = (g->out_cap ? g->out_cap * 2 : 1024) + n;
        char *p = realloc(g->out, cap);
        if (!p) {
            g->oom = 1;
            return;
        }
        g->out = p;
        g->out_cap = cap;
    }
    memcpy(g->out + g->out_len, s, n);
    g->out_len += n;
}

/* One server-sent event whose data is s. */
static void gen_sse(gen *g, const char *s)
{
    gen_append(g, "data: ", 6);
    gen_append(g, s, strlen(s));
    gen_append(g, "\n\n", 2);
}

/* One server-sent event holding `o` (stolen). */
static void gen_event(gen *g, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) {
        g->oom = 1;
        return;
    }
    gen_sse(g, s);
    free(s);
}

/* The event of one streamed token without logprobs: every running request
 * gets one a step, up to a thousand on a GPU, written by the step thread
 * while the GPU waits for the next step. The bytes are those of
 * kiln_openai_chunk_json through json_dumps by construction: that chunk is
 * dumped once with a marker for its text, the text around the marker kept,
 * and each token's text only is escaped by jansson. 0 when the token needs
 * the general path (a chat token with no text: an empty delta). */
static int token_event(gen *g, const char *text, size_t len)
{
    static const char marker[] = "\\u0001\\u0002\\u0003";
    if (g->endpoint == KILN_OPENAI_CHAT && len == 0)
        return 0;
    if (!g->ev_head) {
        json_t *o = kiln_openai_chunk_json(g->endpoint, g->rid, g->created, g->srv->model, NULL, "\x01\x02\x03", 3,
                                           NULL, NULL, g->include_usage);
        char *d = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        char *m = NULL;
        for (char *p = d; p && (p = strstr(p, marker)); p++)
            m = p; /* the last one: the text comes after the id and the model */
        if (!m || m == d || m[-1] != '"' || m[sizeof marker - 1] != '"') {
            free(d);
            return 0;
        }
        g->ev_head_len = (size_t)(m - 1 - d);
        g->ev_tail = m + sizeof marker; /* after the closing quote */
        g->ev_tail_len = strlen(g->ev_tail);
        g->ev_head = d;
    }
    json_t *t = kiln_openai_text(text, len);
    char *q = t ? json_dumps(t, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(t);
    if (!q) {
        g->oom = 1;
        return 1;
    }
    gen_append(g, "data: ", 6);
    gen_append(g, g->ev_head, g->ev_head_len);
    gen_append(g, q, strlen(q));
    gen_append(g, g->ev_tail, g->ev_tail_len);
    gen_append(g, "\n\n", 2);
    free(q);
    return 1;
}

/* Wakes the connection when it waits for what was just written. */
static void gen_wake(gen *g)
{
    if (g->suspended && g->mc) {
        g->suspended = 0;
        MHD_resume_connection(g->mc);
    }
}

/* The logprobs of one token, its alternatives' texts decoded here. */
static json_t *token_logprobs(gen *g, const kiln_llm_token *t)
{
    kiln_llm *llm = g->srv->llm;
    int32_t n_top = t->n_top > 0 && t->top_ids ? t->n_top : 0;
    char *text = NULL, *top_text[21] = {0};
    size_t len = 0, top_len[21] = {0};
    if (n_top > 20)
        n_top = 20;
    kiln_llm_detokenize(llm, &t->id, 1, &text, &len);
    for (int32_t j = 0; j < n_top; j++)
        kiln_llm_detokenize(llm, &t->top_ids[j], 1, &top_text[j], &top_len[j]);
    kiln_openai_token_logprobs lp = {text ? text : "", len, t->logprob, n_top, (const char *const *)top_text, top_len,
                                     t->top_logprobs};
    for (int32_t j = 0; j < n_top; j++)
        if (!top_text[j])
            top_text[j] = (char *)"";
    json_t *o = kiln_openai_logprobs_json(g->endpoint, &lp, 1, g->chars);
    g->chars += len; /* approximate for multibyte pieces; offsets stay monotonic */
    free(text);
    for (int32_t j = 0; j < n_top; j++)
        if (top_len[j] || top_text[j][0])
            free(top_text[j]);
    return o;
}

/* Appends the entries of a one-token logprobs object to the request's. */
static void lp_merge(gen *g, json_t *one)
{
    if (!one)
        return;
    if (!g->lp_tokens) {
        g->lp_tokens = one;
        return;
    }
    const char *keys[] = {"content", "tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        json_t *dst = json_object_get(g->lp_tokens, keys[k]), *src = json_object_get(one, keys[k]);
        if (dst && src)
            json_array_extend(dst, src);
    }
    json_decref(one);
}

static int on_token(void *user, const kiln_llm_token *t)
{
    gen *g = user;
    kiln_server *srv = g->srv;
    pthread_mutex_lock(&g->lock);
    if (t->id >= 0) {
        double now = now_s();
        kiln_metrics_observe(&srv->metrics, g->n_tokens ? KILN_HIST_ITL : KILN_HIST_TTFT,
                             now - (g->n_tokens ? g->t_last : g->t_submit));
        g->t_last = now;
        g->n_tokens++;
    }
    json_t *lp = g->logprobs >= 0 && t->id >= 0 ? token_logprobs(g, t) : NULL;
    if (g->stream) {
        if (!lp && t->len > 0 && token_event(g, t->text, t->len)) {
            gen_wake(g);
        } else if (t->len > 0 || lp) {
            const char *text = g->endpoint == KILN_OPENAI_CHAT && t->len == 0 ? NULL : t->text;
            gen_event(g, kiln_openai_chunk_json(g->endpoint, g->rid, g->created, srv->model, NULL, text ? text : "",
                                                t->len, NULL, lp, g->include_usage));
            gen_wake(g);
        }
    } else {
        lp_merge(g, lp);
    }
    int stop = g->mc == NULL; /* the client is gone */
    pthread_mutex_unlock(&g->lock);
    return stop;
}

static void gen_error_body(gen *g, int status, const char *fmt, const char *detail)
{
    kiln_openai_error e;
    kiln_openai_error_set(&e, status, NULL, fmt, detail);
    char *s = kiln_openai_error_json(&e);
    if (!s) {
        g->oom = 1;
        return;
    }
    if (g->stream) {
        gen_sse(g, s);
    } else {
        g->out_len = 0;
        gen_append(g, s, strlen(s));
        g->status = status;
    }
    free(s);
}

static void on_finish(void *user, kiln_llm_result *r)
{
    gen *g = user;
    kiln_server *srv = g->srv;
    pthread_mutex_lock(&g->lock);
    kiln_metrics_observe(&srv->metrics, KILN_HIST_E2E, now_s() - g->t_submit);
    const char *reason = r ? kiln_openai_finish_reason(r->finish) : NULL;
    /* a cancel is the client's hang-up unless the server is draining */
    if (r && r->finish == KILN_LLM_FINISH_CANCELLED && !atomic_load(&srv->draining))
        kiln_metrics_count_disconnect(&srv->metrics);
    if (!r) {
        gen_error_body(g, 500, "%s", "the server ran out of memory for the answer");
    } else if (!reason) {
        if (r->finish == KILN_LLM_FINISH_ERROR)
            gen_error_body(g, 500, "the engine failed: %s", r->error ? r->error : "unknown error");
        else
            gen_error_body(g, 503, "%s", "the request was cancelled: the server is shutting down");
    } else if (g->stream) {
        gen_event(g, kiln_openai_chunk_json(g->endpoint, g->rid, g->created, srv->model, NULL,
                                            g->endpoint == KILN_OPENAI_CHAT ? NULL : "", 0, reason, NULL,
                                            g->include_usage));
        if (g->include_usage)
            gen_event(g, kiln_openai_usage_chunk_json(g->endpoint, g->rid, g->created, srv->model, r->n_prompt_ids,
                                                      r->n_ids));
    } else {
        json_t *o = kiln_openai_response_json(g->endpoint, g->rid, g->created, srv->model, r->text, r->text_len, reason,
                                              g->lp_tokens, r->n_prompt_ids, r->n_ids);
        g->lp_tokens = NULL;
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (s) {
            gen_append(g, s, strlen(s));
            g->status = 200;
        } else {
            gen_error_body(g, 500, "%s", "out of memory for the answer");
        }
        free(s);
    }
    if (g->stream)
        gen_append(g, "data: [DONE]\n\n", 14);
    g->done = 1;
    gen_wake(g);
    pthread_mutex_unlock(&g->lock);
    kiln_llm_result_free(r);
    pthread_mutex_lock(&srv->lock);
    srv->n_unfinished--;
    pthread_mutex_unlock(&srv->lock);
    gen_unref(g);
}

/* A stream's content reader (libmicrohttpd's thread). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    gen *g = cls;
    pthread_mutex_lock(&g->lock);
    ssize_t n = 0;
    if (g->out_pos < g->out_len) {
        size_t k = g->out_len - g->out_pos < max ? g->out_len - g->out_pos : max;
        memcpy(buf, g->out + g->out_pos, k);
        g->out_pos += k;
        if (g->out_pos == g->out_len)
            g->out_pos = g->out_len = 0;
        n = (ssize_t)k;
    } else if (g->done || g->oom) {
        n = g->oom ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    } else if (g->mc) {
        g->suspended = 1;
        MHD_suspend_connection(g->mc);
    }
    pthread_mutex_unlock(&g->lock);
    return n;
}

static void stream_free(void *cls) { gen_unref(cls); }

/* ---- the hang-up watcher ------------------------------------------------------------------------------------ */

/* Cancels the request of a socket whose client hung up (EPOLLRDHUP: the
 * peer closed or shut down its side). The event carries the request id,
 * never a pointer, and cancelling an id that already ended is a no-op, so
 * nothing here can outlive what it names. */
static void *watch_main(void *arg)
{
    kiln_server *srv = arg;
    for (;;) {
        struct epoll_event ev[64];
        int n = epoll_wait(srv->watch_fd, ev, 64, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return NULL;
        for (int i = 0; i < n; i++) {
            if (ev[i].data.u64 == 0)
                return NULL;
            sched_cancel(srv, ev[i].data.u64);
        }
    }
}

static void watch_add(gen *g)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(g->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return;
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT, .data.u64 = g->id};
    g->fd = ci->connect_fd;
    if (epoll_ctl(g->srv->watch_fd, EPOLL_CTL_ADD, g->fd, &ev) == 0 ||
        (errno == EEXIST && epoll_ctl(g->srv->watch_fd, EPOLL_CTL_MOD, g->fd, &ev) == 0))
        g->watched = 1;
}

/* ---- responses ------------------------------------------------------------------------------------------------ */

static enum MHD_Result send_response(kiln_server *srv, struct MHD_Connection *mc, int status, struct MHD_Response *resp,
                                     const char *type)
{
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (atomic_load(&srv->draining))
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(mc, (unsigned)status, resp);
    MHD_destroy_response(resp);
    kiln_metrics_count_response(&srv->metrics, status);
    return ret;
}

static enum MHD_Result send_text(kiln_server *srv, struct MHD_Connection *mc, int status, const char *text,
                                 const char *type)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    return send_response(srv, mc, status, resp, type);
}

static enum MHD_Result send_json(kiln_server *srv, struct MHD_Connection *mc, int status, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!resp)
        free(s);
    return send_response(srv, mc, status, resp, "application/json");
}

static enum MHD_Result send_error(kiln_server *srv, struct MHD_Connection *mc, const kiln_openai_error *e)
{
    char *s = kiln_openai_error_json(e);
    if (!s)
        return MHD_NO;
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(s);
        return MHD_NO;
    }
    if (e->status == 429)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (e->status == 401)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (e->status == 413 || e->status == 503)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    return send_response(srv, mc, e->status, resp, "application/json");
}

static enum MHD_Result fail(kiln_server *srv, struct MHD_Connection *mc, int status, const char *param,
                            const char *code, const char *fmt, const char *detail)
{
    kiln_openai_error e;
    kiln_openai_error_set(&e, status, param, fmt, detail);
    e.code = code;
    return send_error(srv, mc, &e);
}

/* ---- generation requests --------------------------------------------------------------------------------------- */

typedef struct conn {
    char *body;
    size_t len, cap;
    int too_big;
    gen *g;
} conn;

/* Tokenizes the prompt or renders the conversation; checks the ids and
 * the engine's limits; fills max_tokens. Returns 0 or the error's status. */
static int prepare(kiln_server *srv, kiln_openai_request *r, int32_t **ids, size_t *n_ids, int32_t *max_tokens,
                   kiln_openai_error *e)
{
    const kiln_llm_info *info = srv->info;
    kiln_status st;
    const char *param = r->endpoint == KILN_OPENAI_CHAT ? "messages" : "prompt";
    if (r->endpoint == KILN_OPENAI_CHAT)
        st = kiln_llm_chat_tokenize(srv->llm, r->messages, r->n_messages, ids, n_ids);
    else if (r->prompt)
        st = kiln_llm_prompt_ids(srv->llm, r->prompt, r->prompt_len, ids, n_ids);
    else
        st = KILN_OK;
    if (st == KILN_ERROR_UNSUPPORTED && r->endpoint == KILN_OPENAI_CHAT)
        return kiln_openai_error_set(e, 400, param,
                                     "this engine has no chat template: send the prompt to /v1/completions");
    if (st != KILN_OK)
        return kiln_openai_error_set(e, st == KILN_ERROR_OUT_OF_MEMORY ? 500 : 400, param, "%s: %s", param,
                                     kiln_last_error());
    if (r->endpoint == KILN_OPENAI_COMPLETIONS && !r->prompt) {
        for (size_t i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] >= info->vocab_size)
                return kiln_openai_error_set(e, 400, param, "prompt token %zu is %d, outside the vocabulary (0..%d)", i,
                                             (int)r->prompt_ids[i], (int)info->vocab_size - 1);
        *ids = malloc(sizeof **ids * (r->n_prompt_ids ? r->n_prompt_ids : 1));
        if (!*ids)
            return kiln_openai_error_set(e, 500, param, "out of memory for the prompt");
        memcpy(*ids, r->prompt_ids, sizeof **ids * r->n_prompt_ids);
        *n_ids = r->n_prompt_ids;
    }
    size_t n = *n_ids;
    if (n == 0)
        return kiln_openai_error_set(e, 400, param, "the prompt is empty (0 tokens)");
    /* One sequence can hold at most this many tokens: the engine's max
     * sequence length, or the whole KV cache when that is smaller. */
    long long seq = info->max_seq_len, cache = info->cache_tokens;
    long long limit = seq < cache ? seq : cache;
    const char *what = seq <= cache ? "the engine's max sequence length" : "the whole KV cache";
    if ((long long)n >= limit)
        return kiln_openai_error_set(e, 400, param,
                                     "the prompt is %zu tokens; %s is %lld tokens (max sequence length %lld, KV cache "
                                     "%lld), which leaves no room to generate",
                                     n, what, limit, seq, cache);
    long long room = limit - (long long)n;
    if (r->max_tokens >= 0) {
        if (r->max_tokens > room)
            return kiln_openai_error_set(e, 400, "max_tokens",
                                         "the prompt (%zu tokens) plus max_tokens (%lld) is %lld tokens, past %s of "
                                         "%lld tokens (max sequence length %lld, KV cache %lld)",
                                         n, (long long)r->max_tokens, (long long)n + r->max_tokens, what, limit, seq,
                                         cache);
        *max_tokens = (int32_t)r->max_tokens;
    } else {
        /* OpenAI's completions default is 16 tokens; chat runs to the end
         * of the context */
        long long want = r->endpoint == KILN_OPENAI_COMPLETIONS ? 16 : room;
        *max_tokens = (int32_t)(want < room ? want : room);
    }
    return 0;
}

static enum MHD_Result start_generation(kiln_server *srv, struct MHD_Connection *mc, conn *c,
                                        kiln_openai_endpoint endpoint)
{
    kiln_openai_error e;
    if (atomic_load(&srv->draining))
        return fail(srv, mc, 503, NULL, NULL, "%s", "the server is shutting down");
    kiln_openai_request r;
    if (kiln_openai_parse(endpoint, c->body ? c->body : "", c->len, &srv->o.sampling, &r, &e))
        return send_error(srv, mc, &e);
    if (r.model && strcmp(r.model, srv->model) != 0) {
        kiln_openai_error_set(&e, 404, "model", "the model `%s` does not exist; this server serves `%s`", r.model,
                              srv->model);
        e.code = "model_not_found";
        kiln_openai_request_free(&r);
        return send_error(srv, mc, &e);
    }
    int32_t *ids = NULL, max_tokens = 0;
    size_t n_ids = 0;
    if (prepare(srv, &r, &ids, &n_ids, &max_tokens, &e)) {
        free(ids);
        kiln_openai_request_free(&r);
        return send_error(srv, mc, &e);
    }
    uint64_t serial = atomic_fetch_add(&srv->counter, 1) + 1;
    if (!r.has_seed)
        r.sampling.seed = splitmix64(srv->salt ^ serial);
    kiln_llm_request req;
    kiln_llm_request_init(&req);
    req.prompt_ids = ids;
    req.n_prompt_ids = n_ids;
    req.max_tokens = max_tokens;
    req.ignore_eos = r.ignore_eos;
    req.sampling = &r.sampling;
    req.stop = r.stop;
    req.n_stop = r.n_stop;
    req.logprobs = r.logprobs;

    gen *g = calloc(1, sizeof *g);
    if (!g) {
        free(ids);
        kiln_openai_request_free(&r);
        return fail(srv, mc, 500, NULL, NULL, "%s", "out of memory");
    }
    pthread_mutex_init(&g->lock, NULL);
    g->srv = srv;
    g->refs = 2; /* the connection and the scheduler */
    g->mc = mc;
    g->endpoint = endpoint;
    g->stream = r.stream;
    g->include_usage = r.include_usage;
    g->logprobs = r.logprobs;
    g->created = (long long)time(NULL);
    g->t_submit = now_s();
    snprintf(g->rid, sizeof g->rid, "%s-%016llx", endpoint == KILN_OPENAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)splitmix64(srv->salt + serial));
    if (g->stream && endpoint == KILN_OPENAI_CHAT)
        gen_event(g, kiln_openai_chunk_json(endpoint, g->rid, g->created, srv->model, "assistant", "", 0, NULL, NULL,
                                            g->include_usage));

    kiln_llm_callbacks cb;
    kiln_llm_callbacks_init(&cb);
    cb.on_token = on_token;
    cb.on_finish = on_finish;
    cb.user = g;
    pthread_mutex_lock(&srv->lock);
    srv->n_unfinished++;
    srv->n_attached++;
    pthread_mutex_unlock(&srv->lock);
    /* g's lock is held across submit so that no callback touches it
     * before the id is known and the connection is suspended or queued */
    pthread_mutex_lock(&g->lock);
    pthread_rwlock_rdlock(&srv->sched_lock);
    kiln_status st = srv->sched ? kiln_llm_submit(srv->sched, &req, &cb, &g->id) : KILN_ERROR_CANCELLED;
    pthread_rwlock_unlock(&srv->sched_lock);
    free(ids);
    kiln_openai_request_free(&r);
    if (st != KILN_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", st == KILN_ERROR_CANCELLED && !srv->sched ? "stopped" : kiln_last_error());
        /* a full queue (429) from the refusal itself: KILN_ERROR_LIMIT also
         * means a request that never fits (400), and the queue's length read
         * after the refusal may already have drained (a race seen in the
         * queue-full test under load). kiln_llm_submit names the queue in
         * exactly this refusal (llm.h; test_scheduler checks the words). */
        int full = st == KILN_ERROR_LIMIT && strstr(msg, "the queue holds") != NULL;
        g->mc = NULL;
        pthread_mutex_unlock(&g->lock);
        pthread_mutex_lock(&srv->lock);
        srv->n_unfinished--;
        srv->n_attached--;
        pthread_mutex_unlock(&srv->lock);
        gen_unref(g);
        gen_unref(g);
        if (full)
            return fail(srv, mc, 429, NULL, "rate_limit_exceeded",
                        "the server is busy: %s; retry after the Retry-After seconds", msg);
        if (st == KILN_ERROR_CANCELLED)
            return fail(srv, mc, 503, NULL, NULL, "the server is shutting down: %s", msg);
        if (st == KILN_ERROR_LIMIT || st == KILN_ERROR_INVALID_ARGUMENT || st == KILN_ERROR_UNSUPPORTED)
            return fail(srv, mc, 400, NULL, NULL, "%s", msg);
        return fail(srv, mc, 500, NULL, NULL, "%s", msg);
    }
    c->g = g;
    watch_add(g);
    enum MHD_Result ret = MHD_YES;
    if (g->stream) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, g, stream_free);
        if (resp) {
            g->refs++;
            MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
            ret = send_response(srv, mc, 200, resp, "text/event-stream");
        } else {
            ret = MHD_NO;
        }
    } else if (!g->done) {
        g->suspended = 1;
        MHD_suspend_connection(mc);
    }
    pthread_mutex_unlock(&g->lock);
    if (ret == MHD_NO)
        sched_cancel(srv, g->id);
    return ret;
}

/* The access handler's call after a suspended, non-streaming request was
 * resumed: the answer is complete. */
static enum MHD_Result finish_generation(kiln_server *srv, struct MHD_Connection *mc, gen *g)
{
    pthread_mutex_lock(&g->lock);
    if (!g->done) { /* resumed before the end: cannot happen, but never spin */
        g->suspended = 1;
        MHD_suspend_connection(mc);
        pthread_mutex_unlock(&g->lock);
        return MHD_YES;
    }
    if (g->oom) {
        pthread_mutex_unlock(&g->lock);
        return MHD_NO;
    }
    char *body = g->out;
    size_t len = g->out_len;
    int status = g->status;
    g->out = NULL;
    g->out_len = g->out_cap = 0;
    pthread_mutex_unlock(&g->lock);
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, body ? body : (void *)"",
                                                                body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp)
        free(body);
    return send_response(srv, mc, status, resp, "application/json");
}

/* ---- routes -------------------------------------------------------------------------------------------------------- */

static json_t *model_json(kiln_server *srv)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", srv->model, "object", "model", "created",
                     (json_int_t)srv->started, "owned_by", "kiln", "max_model_len", (int)srv->info->max_seq_len);
}

static int authorized(kiln_server *srv, struct MHD_Connection *mc)
{
    if (!srv->api_key)
        return 1;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    /* compared in constant time: the key's bytes must not leak through timing */
    size_t n = strlen(h), k = strlen(srv->api_key);
    unsigned diff = (unsigned)(n != k);
    for (size_t i = 0; i < k; i++)
        diff |= (unsigned)(unsigned char)srv->api_key[i] ^ (unsigned)(unsigned char)(i < n ? h[i] : 0);
    return diff == 0;
}

static enum MHD_Result route(kiln_server *srv, struct MHD_Connection *mc, const char *url, const char *method, conn *c)
{
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (!get)
            return fail(srv, mc, 405, NULL, NULL, "%s /health is not allowed; use GET", method);
        if (atomic_load(&srv->draining))
            return send_text(srv, mc, 503, "{\"status\":\"draining\"}", "application/json");
        return send_text(srv, mc, 200, "{\"status\":\"ok\"}", "application/json");
    }
    if (!strcmp(url, "/metrics")) {
        if (!get)
            return fail(srv, mc, 405, NULL, NULL, "%s /metrics is not allowed; use GET", method);
        kiln_llm_scheduler_stats stats;
        sched_stats(srv, &stats);
        char *page = kiln_metrics_render(&srv->metrics, &stats, srv->model);
        if (!page)
            return MHD_NO;
        struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(page), page, MHD_RESPMEM_MUST_FREE);
        if (!resp)
            free(page);
        return send_response(srv, mc, 200, resp, "text/plain; version=0.0.4");
    }
    int is_models = !strcmp(url, "/v1/models"), is_model = !strncmp(url, "/v1/models/", 11);
    int is_cmpl = !strcmp(url, "/v1/completions"), is_chat = !strcmp(url, "/v1/chat/completions");
    if (!is_models && !is_model && !is_cmpl && !is_chat)
        return fail(srv, mc, 404, NULL, NULL, "no route %s; see docs/serve.md", url);
    if (!authorized(srv, mc))
        return fail(srv, mc, 401, NULL, "invalid_api_key", "%s",
                    "a valid API key is required: send the header \"Authorization: Bearer KEY\"");
    if (is_models || is_model) {
        if (!get)
            return fail(srv, mc, 405, NULL, NULL, "%s is not allowed here; use GET", method);
        if (is_models)
            return send_json(srv, mc, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_json(srv)));
        if (strcmp(url + 11, srv->model) != 0)
            return fail(srv, mc, 404, "model", "model_not_found", "the model `%s` does not exist", url + 11);
        return send_json(srv, mc, 200, model_json(srv));
    }
    if (!post)
        return fail(srv, mc, 405, NULL, NULL, "%s is not allowed here; use POST", method);
    return start_generation(srv, mc, c, is_chat ? KILN_OPENAI_CHAT : KILN_OPENAI_COMPLETIONS);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    kiln_server *srv = cls;
    conn *c = *con_cls;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c)
            return MHD_NO;
        *con_cls = c;
        /* refuse a body announced too large before reading it */
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > srv->o.max_body) {
            char limit[32];
            snprintf(limit, sizeof limit, "%zu", srv->o.max_body);
            return fail(srv, mc, 413, NULL, NULL, "the request body is larger than this server's limit of %s bytes",
                        limit);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->too_big || c->len + n > srv->o.max_body) {
            c->too_big = 1;
            return MHD_YES;
        }
        if (c->len + n + 1 > c->cap) {
            size_t cap = (c->cap ? c->cap * 2 : 4096) + n + 1;
            if (cap > srv->o.max_body + 1)
                cap = srv->o.max_body + 1;
            char *p = realloc(c->body, cap);
            if (!p)
                return MHD_NO;
            c->body = p;
            c->cap = cap;
        }
        memcpy(c->body + c->len, upload, n);
        c->len += n;
        return MHD_YES;
    }
    if (c->g)
        return finish_generation(srv, mc, c->g);
    if (c->too_big) {
        char limit[32];
        snprintf(limit, sizeof limit, "%zu", srv->o.max_body);
        return fail(srv, mc, 413, NULL, NULL, "the request body is larger than this server's limit of %s bytes", limit);
    }
    return route(srv, mc, url, method, c);
}

/* The end of a request, however it ended (libmicrohttpd's thread). */
static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode why)
{
    (void)mc;
    (void)why;
    kiln_server *srv = cls;
    conn *c = *con_cls;
    if (!c)
        return;
    *con_cls = NULL;
    gen *g = c->g;
    if (g) {
        pthread_mutex_lock(&g->lock);
        /* before libmicrohttpd closes the socket, which may then be reused */
        if (g->watched)
            epoll_ctl(srv->watch_fd, EPOLL_CTL_DEL, g->fd, NULL);
        g->watched = 0;
        g->mc = NULL;
        int cancel = !g->done;
        uint64_t id = g->id;
        pthread_mutex_unlock(&g->lock);
        if (cancel)
            sched_cancel(srv, id);
        pthread_mutex_lock(&srv->lock);
        srv->n_attached--;
        pthread_mutex_unlock(&srv->lock);
        gen_unref(g);
    }
    free(c->body);
    free(c);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    kiln_server *srv = cls;
    /* before it listens, kiln_server_start's error says it in one line */
    if (!atomic_load(&srv->listening))
        return;
    fputs("kiln: serve: ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ---- start and stop ------------------------------------------------------------------------------------------------ */

void kiln_server_options_init(kiln_server_options *o)
{
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->max_queue = 1024;
    o->max_connections = 1024;
    o->timeout_s = 60;
    o->max_body = 16u << 20;
    o->max_header = 64u << 10;
    o->prefix_caching = 1;
    kiln_llm_sampling_init(&o->sampling);
}

static void server_free(kiln_server *s)
{
    if (s->watcher_running) {
        uint64_t one = 1;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
        epoll_ctl(s->watch_fd, EPOLL_CTL_ADD, s->wake_fd, &ev);
        if (write(s->wake_fd, &one, sizeof one) < 0)
            perror("kiln: serve: waking the watcher");
        pthread_join(s->watcher, NULL);
    }
    if (s->sched)
        kiln_llm_scheduler_stop(s->sched, 0);
    if (s->daemon)
        MHD_stop_daemon(s->daemon);
    if (s->watch_fd >= 0)
        close(s->watch_fd);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    kiln_metrics_destroy(&s->metrics);
    pthread_mutex_destroy(&s->lock);
    pthread_rwlock_destroy(&s->sched_lock);
    free(s->model);
    free(s->api_key);
    free(s);
}

int kiln_server_start(kiln_llm *llm, const kiln_server_options *o, kiln_server **out, char *err, size_t err_len)
{
    kiln_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    s->o = *o;
    s->llm = llm;
    s->info = kiln_llm_info_get(llm);
    s->watch_fd = s->wake_fd = -1;
    s->started = (long long)time(NULL);
    s->salt = splitmix64((uint64_t)now_s() * 1000003u ^ (uint64_t)getpid());
    pthread_mutex_init(&s->lock, NULL);
    pthread_rwlock_init(&s->sched_lock, NULL);
    kiln_metrics_init(&s->metrics);
    s->model = strdup(o->model_name ? o->model_name : "");
    s->api_key = o->api_key ? strdup(o->api_key) : NULL;
    if (!s->model || (o->api_key && !s->api_key)) {
        snprintf(err, err_len, "out of memory");
        server_free(s);
        return -1;
    }
    json_t *name = json_string(s->model); /* NULL unless UTF-8: every answer carries it */
    json_decref(name);
    if (!name || !s->model[0]) {
        snprintf(err, err_len, "the model name must be non-empty UTF-8");
        server_free(s);
        return -1;
    }

    kiln_llm_scheduler_options so;
    kiln_llm_scheduler_options_init(&so);
    so.max_queue = o->max_queue;
    so.prefix_caching = o->prefix_caching;
    if (kiln_llm_scheduler_start(llm, &so, &s->sched) != KILN_OK) {
        snprintf(err, err_len, "%s", kiln_last_error());
        server_free(s);
        return -1;
    }
    s->watch_fd = epoll_create1(EPOLL_CLOEXEC);
    s->wake_fd = eventfd(0, EFD_CLOEXEC);
    if (s->watch_fd < 0 || s->wake_fd < 0 || pthread_create(&s->watcher, NULL, watch_main, s) != 0) {
        snprintf(err, err_len, "cannot start the hang-up watcher: %s", strerror(errno));
        server_free(s);
        return -1;
    }
    s->watcher_running = 1;

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV},
                    *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai != 0) {
        snprintf(err, err_len, "cannot resolve --host %s: %s", o->host, gai_strerror(gai));
        server_free(s);
        return -1;
    }
    /* no more connections than open files allow, with room for the engine's */
    struct rlimit rl;
    unsigned limit = (unsigned)o->max_connections;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)limit + 64)
        limit = rl.rlim_cur > 128 ? (unsigned)(rl.rlim_cur - 64) : 64;
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                                 MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s,
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, o->max_header, MHD_OPTION_LISTEN_BACKLOG_SIZE,
                                 1024u, MHD_OPTION_END);
    int bind_errno = errno;
    freeaddrinfo(ai);
    if (!s->daemon) {
        snprintf(err, err_len, "cannot listen on %s:%d: %s", o->host, o->port,
                 bind_errno ? strerror(bind_errno) : "libmicrohttpd refused to start");
        server_free(s);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? (int)di->port : o->port;
    atomic_store(&s->listening, 1);
    *out = s;
    return 0;
}

int kiln_server_port(const kiln_server *s) { return s->port; }

static void wait_for(kiln_server *s, const int *counter, double seconds)
{
    double end = now_s() + seconds;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        int left = *counter;
        pthread_mutex_unlock(&s->lock);
        if (left <= 0 || now_s() >= end)
            return;
        struct timespec t = {0, 10 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
}

void kiln_server_stop(kiln_server *s, double drain_seconds)
{
    if (!s)
        return;
    atomic_store(&s->draining, 1);
    MHD_socket listen = MHD_quiesce_daemon(s->daemon);
    wait_for(s, &s->n_unfinished, drain_seconds);
    /* what is left is cancelled: every request gets its on_finish, which
     * resumes its connection with the 503 */
    uint64_t one = 1;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    epoll_ctl(s->watch_fd, EPOLL_CTL_ADD, s->wake_fd, &ev);
    if (write(s->wake_fd, &one, sizeof one) < 0)
        perror("kiln: serve: waking the watcher");
    pthread_join(s->watcher, NULL);
    s->watcher_running = 0;
    pthread_rwlock_wrlock(&s->sched_lock);
    kiln_llm_scheduler_stop(s->sched, 0);
    s->sched = NULL;
    pthread_rwlock_unlock(&s->sched_lock);
    /* a moment for clients to read the last bytes */
    wait_for(s, &s->n_attached, 2.0);
    MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    if (listen != MHD_INVALID_SOCKET)
        close(listen);
    server_free(s);
}
