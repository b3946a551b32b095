/* The OpenAI API's request bodies and response objects (docs/serve.md):
 * parsing and validation of POST /v1/completions and /v1/chat/completions
 * bodies into kiln requests, and the JSON the server answers with. No
 * HTTP and no engine here, so the parser can be fuzzed on its own
 * (tests/fuzz/fuzz_openai.c); limits that need the engine (prompt length
 * against the context) are the server's. */
#ifndef KILN_SERVER_OPENAI_H
#define KILN_SERVER_OPENAI_H

#include <jansson.h>
#include <kiln/llm.h>

typedef enum kiln_openai_endpoint {
    KILN_OPENAI_COMPLETIONS = 0, /* POST /v1/completions */
    KILN_OPENAI_CHAT,            /* POST /v1/chat/completions */
} kiln_openai_endpoint;

/* A refused request: the HTTP status, OpenAI's error type and code, the
 * parameter at fault ("" when none) and a one-line message naming it. */
typedef struct kiln_openai_error {
    int status;
    const char *type; /* "invalid_request_error", "authentication_error", ... */
    const char *code; /* NULL or "model_not_found", "rate_limit_exceeded", ... */
    char param[96];
    char message[512];
} kiln_openai_error;

/* Fills e; returns e->status. */
int kiln_openai_error_set(kiln_openai_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A parsed request. Every string points into `root` (the parsed body),
 * which the request owns. */
typedef struct kiln_openai_request {
    kiln_openai_endpoint endpoint;
    json_t *root;
    const char *model; /* NULL when absent */
    /* completions: the prompt as text (prompt != NULL) or as ids */
    const char *prompt;
    size_t prompt_len;
    int32_t *prompt_ids;
    size_t n_prompt_ids;
    /* chat: the conversation (messages[i] points at turns[i]) */
    kiln_llm_message *turns;
    const kiln_llm_message **messages;
    size_t n_messages;
    /* -1 when absent (the server picks the default) */
    int64_t max_tokens;
    kiln_llm_sampling sampling;
    int has_seed;
    const char **stop;
    int32_t n_stop;
    int stream;
    int include_usage; /* stream_options.include_usage */
    /* -1: none; else the number of alternatives per token (0..20) */
    int32_t logprobs;
    int ignore_eos;
} kiln_openai_request;

/* Most stop strings a request may give, and longest one. */
#define KILN_OPENAI_MAX_STOP 16
#define KILN_OPENAI_MAX_STOP_LEN 1024

/* Parses and validates a body. Sampling fields the body leaves out take
 * their value from `defaults` (its seed is not used), or, when it is NULL,
 * kiln_llm_sampling_init's neutral ones (OpenAI's: temperature 1, top_p
 * 1). On failure fills *err (status 400 and the field at fault, e.g.
 * "temperature must be a number in [0, 2], got a string") and leaves *out
 * zeroed; on success the caller frees *out with kiln_openai_request_free. */
int kiln_openai_parse(kiln_openai_endpoint endpoint, const char *body, size_t len, const kiln_llm_sampling *defaults,
                      kiln_openai_request *out, kiln_openai_error *err);

/* NULL or zeroed is a no-op. */
void kiln_openai_request_free(kiln_openai_request *r);

/* ---- responses ---------------------------------------------------------------------------------------------- */

/* {"error": {"message", "type", "param", "code"}}, serialized; malloc'd. */
char *kiln_openai_error_json(const kiln_openai_error *e);

/* "stop" (EOS and stop strings) or "length"; NULL for CANCELLED and
 * ERROR, which are not answers. */
const char *kiln_openai_finish_reason(kiln_llm_finish finish);

/* A JSON string of text that need not be valid UTF-8 (one token's piece):
 * invalid bytes become U+FFFD. */
json_t *kiln_openai_text(const char *text, size_t len);

/* One generated token's logprobs, its text already decoded by the caller. */
typedef struct kiln_openai_token_logprobs {
    const char *text; /* the token's own text (may be a partial character) */
    size_t len;
    float logprob;
    int32_t n_top;
    const char *const *top_text; /* n_top texts and lengths, most likely first */
    const size_t *top_len;
    const float *top_logprob;
} kiln_openai_token_logprobs;

/* The "logprobs" member of one choice for tokens[0..n): the completions
 * shape ({tokens, token_logprobs, top_logprobs, text_offset}; offsets in
 * characters from `offset`) or the chat shape ({content: [{token, logprob,
 * bytes, top_logprobs}]}). */
json_t *kiln_openai_logprobs_json(kiln_openai_endpoint endpoint, const kiln_openai_token_logprobs *tokens, size_t n,
                                  size_t offset);

/* {"prompt_tokens", "completion_tokens", "total_tokens"}. */
json_t *kiln_openai_usage_json(size_t prompt_tokens, size_t completion_tokens);

/* The whole answer of a request that did not stream: a text_completion or
 * a chat.completion with one choice. `logprobs` (stolen) may be NULL. */
json_t *kiln_openai_response_json(kiln_openai_endpoint endpoint, const char *id, long long created, const char *model,
                                  const char *text, size_t len, const char *finish_reason, json_t *logprobs,
                                  size_t prompt_tokens, size_t completion_tokens);

/* One streamed chunk with one choice: `text` (may be NULL: no content),
 * `role` (chat's first chunk: "assistant"; else NULL), finish_reason (NULL
 * while it goes on), logprobs (stolen, may be NULL); "usage": null when
 * the request asked for usage. */
json_t *kiln_openai_chunk_json(kiln_openai_endpoint endpoint, const char *id, long long created, const char *model,
                               const char *role, const char *text, size_t len, const char *finish_reason,
                               json_t *logprobs, int include_usage);

/* The last chunk when stream_options.include_usage: no choices, usage. */
json_t *kiln_openai_usage_chunk_json(kiln_openai_endpoint endpoint, const char *id, long long created,
                                     const char *model, size_t prompt_tokens, size_t completion_tokens);

#endif
