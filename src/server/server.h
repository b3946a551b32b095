/* kiln serve's HTTP server (docs/serve.md): the OpenAI API over
 * libmicrohttpd on top of the request-level scheduler of include/kiln/llm.h.
 *
 * Not part of libkiln (which has no HTTP dependency): the module is the
 * kiln_server static library, built against the public headers only, that
 * the `kiln serve` command links. One libmicrohttpd thread polls every
 * connection (epoll); a connection waiting for tokens is suspended and
 * resumed by the scheduler's callbacks, so no thread is held per
 * connection. A second thread watches the sockets of requests in flight
 * and cancels a request whose client hung up, which libmicrohttpd cannot
 * see on a suspended connection. */
#ifndef KILN_SERVER_SERVER_H
#define KILN_SERVER_SERVER_H

#include <kiln/llm.h>
#include <stddef.h>

typedef struct kiln_server kiln_server;

typedef struct kiln_server_options {
    const char *host;       /* address to listen on (default "127.0.0.1") */
    int port;               /* 0: a free port (kiln_server_port says which) */
    const char *api_key;    /* non-NULL: /v1 routes need "Authorization: Bearer KEY" */
    const char *model_name; /* the model's id in the API (required) */
    int max_queue;          /* requests waiting for admission before 429 */
    int max_connections;    /* open connections at once */
    unsigned timeout_s;     /* a connection idle this long (not sending, not reading) is closed */
    size_t max_body;        /* request body bytes */
    size_t max_header;      /* bytes of the request line and headers */
    int prefix_caching;     /* share KV blocks of identical prompt prefixes */
    /* What a request's absent sampling fields mean (the seed is not used:
     * a request without one gets a fresh seed). Default: neutral
     * (kiln_llm_sampling_init). */
    kiln_llm_sampling sampling;
} kiln_server_options;

/* Defaults: 127.0.0.1:8000, no key, queue 1024, 1024 connections, 60 s,
 * 16 MiB bodies, 64 KiB headers, prefix caching on, neutral sampling. */
void kiln_server_options_init(kiln_server_options *o);

/* Starts the scheduler on `llm` (the server's until kiln_server_stop) and
 * listens. On failure returns nonzero with a one-line reason in err. */
int kiln_server_start(kiln_llm *llm, const kiln_server_options *o, kiln_server **out, char *err, size_t err_len);

/* The port listened on. */
int kiln_server_port(const kiln_server *s);

/* Drains and frees: stops accepting connections, answers new requests on
 * open ones with 503, lets requests in flight finish for up to
 * drain_seconds, cancels the rest (their clients get a 503 error, or an
 * error event on a stream), gives clients a moment to read what was
 * written, and closes everything. The llm is the caller's again. NULL is a
 * no-op. */
void kiln_server_stop(kiln_server *s, double drain_seconds);

#endif
