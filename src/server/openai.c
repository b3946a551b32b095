/* OpenAI request bodies into kiln requests, and the response objects. The
 * accepted fields and their ranges are those of OpenAI's API reference;
 * fields kiln cannot honour (n > 1, tools, logit_bias, echo, ...) are
 * refused by name rather than ignored. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai.h"

int kiln_openai_error_set(kiln_openai_error *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->code = NULL;
    switch (status) {
    case 401: e->type = "authentication_error"; break;
    case 429: e->type = "rate_limit_error"; break;
    case 500:
    case 503: e->type = "server_error"; break;
    default: e->type = "invalid_request_error"; break;
    }
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

/* ---- field readers ---------------------------------------------------------------------------------------------- */

static const char *kind_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* A member, with JSON null read as absent (clients send null for "unset"). */
static json_t *member(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int bad(kiln_openai_error *e, const char *param, const char *want, const json_t *got)
{
    return kiln_openai_error_set(e, 400, param, "%s must be %s, got %s", param, want, kind_name(got));
}

/* An integer, also written as a real without a fraction (2.0), as the
 * Python servers clients are tested against accept. */
static int get_int(json_t *o, const char *key, long long lo, long long hi, long long *out, kiln_openai_error *e)
{
    json_t *v = member(o, key);
    if (!v)
        return 0;
    char want[96];
    snprintf(want, sizeof want, "an integer in [%lld, %lld]", lo, hi);
    long long x;
    if (json_is_integer(v)) {
        x = (long long)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (!(d == floor(d) && d >= (double)lo && d <= (double)hi))
            return kiln_openai_error_set(e, 400, key, "%s must be %s, got %g", key, want, d);
        x = (long long)d;
    } else {
        return bad(e, key, want, v);
    }
    if (x < lo || x > hi)
        return kiln_openai_error_set(e, 400, key, "%s must be %s, got %lld", key, want, x);
    *out = x;
    return 0;
}

/* A number in [lo, hi] (or (lo, hi] when open_lo). */
static int get_float(json_t *o, const char *key, double lo, double hi, int open_lo, float *out, kiln_openai_error *e)
{
    json_t *v = member(o, key);
    if (!v)
        return 0;
    char want[96];
    snprintf(want, sizeof want, "a number in %c%g, %g]", open_lo ? '(' : '[', lo, hi);
    if (!json_is_number(v))
        return bad(e, key, want, v);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi) || (open_lo && d == lo))
        return kiln_openai_error_set(e, 400, key, "%s must be %s, got %g", key, want, d);
    *out = (float)d;
    return 0;
}

static int get_bool(json_t *o, const char *key, int *out, kiln_openai_error *e)
{
    json_t *v = member(o, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return bad(e, key, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

static int get_string(json_t *o, const char *key, const char **out, kiln_openai_error *e)
{
    json_t *v = member(o, key);
    if (!v)
        return 0;
    if (!json_is_string(v))
        return bad(e, key, "a string", v);
    *out = json_string_value(v);
    return 0;
}

/* ---- the prompt and the conversation ---------------------------------------------------------------------------- */

static int parse_ids(json_t *a, const char *param, kiln_openai_request *r, kiln_openai_error *e)
{
    size_t n = json_array_size(a);
    r->prompt_ids = malloc(sizeof *r->prompt_ids * (n ? n : 1));
    if (!r->prompt_ids)
        return kiln_openai_error_set(e, 500, param, "out of memory for %zu prompt ids", n);
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return kiln_openai_error_set(e, 400, param, "%s[%zu] must be a token id (an integer >= 0), got %s", param,
                                         i, json_is_integer(v) ? "a negative or huge number" : kind_name(v));
        r->prompt_ids[i] = (int32_t)json_integer_value(v);
    }
    r->n_prompt_ids = n;
    return 0;
}

/* prompt: a string, a list of one string, a list of token ids, or a list
 * of one list of ids. */
static int parse_prompt(json_t *root, kiln_openai_request *r, kiln_openai_error *e)
{
    json_t *p = member(root, "prompt");
    if (!p)
        return kiln_openai_error_set(e, 400, "prompt", "prompt is required");
    if (json_is_string(p)) {
        r->prompt = json_string_value(p);
        r->prompt_len = json_string_length(p);
        return 0;
    }
    if (!json_is_array(p))
        return bad(e, "prompt", "a string, a list of token ids or a list of one of these", p);
    size_t n = json_array_size(p);
    if (n == 0)
        return kiln_openai_error_set(e, 400, "prompt", "prompt is an empty list");
    json_t *first = json_array_get(p, 0);
    if (json_is_string(first) || json_is_array(first)) {
        if (n > 1)
            return kiln_openai_error_set(
                e, 400, "prompt", "prompt is a list of %zu prompts; this server takes one prompt per request", n);
        if (json_is_string(first)) {
            r->prompt = json_string_value(first);
            r->prompt_len = json_string_length(first);
            return 0;
        }
        if (json_array_size(first) == 0)
            return kiln_openai_error_set(e, 400, "prompt", "prompt[0] is an empty list of token ids");
        return parse_ids(first, "prompt[0]", r, e);
    }
    return parse_ids(p, "prompt", r, e);
}

/* content: a string, or a list of {"type": "text", "text"} parts (joined
 * with newlines, as vLLM does); null only for an assistant turn. */
static int parse_content(json_t *msg, size_t i, int assistant, kiln_openai_error *e)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    json_t *c = member(msg, "content");
    if (!c) {
        if (!assistant)
            return kiln_openai_error_set(e, 400, param, "%s is required", param);
        return json_object_set_new(msg, "content", json_string(""))
                   ? kiln_openai_error_set(e, 500, param, "out of memory")
                   : 0;
    }
    if (json_is_string(c))
        return 0;
    if (!json_is_array(c))
        return bad(e, param, "a string or a list of text parts", c);
    size_t total = 0, n = json_array_size(c);
    for (size_t j = 0; j < n; j++) {
        json_t *part = json_array_get(c, j);
        const char *type = json_is_object(part) ? json_string_value(json_object_get(part, "type")) : NULL;
        json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
        if (!type || strcmp(type, "text") != 0)
            return kiln_openai_error_set(e, 400, param, "%s[%zu] must be a part of type \"text\"%s%s%s", param, j,
                                         type ? " (got \"" : "", type ? type : "", type ? "\": not supported)" : "");
        if (!json_is_string(text))
            return kiln_openai_error_set(e, 400, param, "%s[%zu].text must be a string", param, j);
        total += json_string_length(text) + 1;
    }
    char *joined = malloc(total + 1), *w = joined;
    if (!joined)
        return kiln_openai_error_set(e, 500, param, "out of memory for %s", param);
    for (size_t j = 0; j < n; j++) {
        json_t *text = json_object_get(json_array_get(c, j), "text");
        if (j)
            *w++ = '\n';
        memcpy(w, json_string_value(text), json_string_length(text));
        w += json_string_length(text);
    }
    json_t *s = json_stringn_nocheck(joined, (size_t)(w - joined));
    free(joined);
    /* the tree owns the joined text, as it owns every other string */
    if (!s || json_object_set_new(msg, "content", s))
        return kiln_openai_error_set(e, 500, param, "out of memory for %s", param);
    return 0;
}

static int parse_messages(json_t *root, kiln_openai_request *r, kiln_openai_error *e)
{
    json_t *m = member(root, "messages");
    if (!m)
        return kiln_openai_error_set(e, 400, "messages", "messages is required");
    if (!json_is_array(m))
        return bad(e, "messages", "a list of messages", m);
    size_t n = json_array_size(m);
    if (n == 0)
        return kiln_openai_error_set(e, 400, "messages", "messages is an empty list");
    r->turns = calloc(n, sizeof *r->turns);
    r->messages = calloc(n, sizeof *r->messages);
    if (!r->turns || !r->messages)
        return kiln_openai_error_set(e, 500, "messages", "out of memory for %zu messages", n);
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(m, i);
        char param[64];
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(msg))
            return bad(e, param, "an object with role and content", msg);
        json_t *role = json_object_get(msg, "role");
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!role)
            return kiln_openai_error_set(e, 400, param, "%s is required", param);
        if (!json_is_string(role))
            return bad(e, param, "a string", role);
        const char *rs = json_string_value(role);
        if (rs[0] == '\0')
            return kiln_openai_error_set(e, 400, param, "%s is empty", param);
        json_t *tc = member(msg, "tool_calls");
        if (tc && (!json_is_array(tc) || json_array_size(tc) > 0))
            return kiln_openai_error_set(e, 400, "tool_calls", "messages[%zu].tool_calls: tool calls are not supported",
                                         i);
        int assistant = !strcmp(rs, "assistant");
        /* OpenAI's newer name for the system turn; templates know "system" */
        if (!strcmp(rs, "developer") && json_object_set_new(msg, "role", json_string("system")))
            return kiln_openai_error_set(e, 500, param, "out of memory");
        if (parse_content(msg, i, assistant, e))
            return e->status;
        kiln_llm_message_init(&r->turns[i]);
        r->turns[i].role = json_string_value(json_object_get(msg, "role"));
        r->turns[i].content = json_string_value(json_object_get(msg, "content"));
        r->messages[i] = &r->turns[i];
    }
    r->n_messages = n;
    return 0;
}

/* ---- the whole request ------------------------------------------------------------------------------------------ */

static int parse_stop(json_t *root, kiln_openai_request *r, kiln_openai_error *e)
{
    json_t *s = member(root, "stop");
    if (!s)
        return 0;
    size_t n = json_is_array(s) ? json_array_size(s) : 1;
    if (!json_is_string(s) && !json_is_array(s))
        return bad(e, "stop", "a string or a list of strings", s);
    if (n > KILN_OPENAI_MAX_STOP)
        return kiln_openai_error_set(e, 400, "stop", "stop has %zu strings, at most %d are allowed", n,
                                     KILN_OPENAI_MAX_STOP);
    r->stop = calloc(n ? n : 1, sizeof *r->stop);
    if (!r->stop)
        return kiln_openai_error_set(e, 500, "stop", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_array(s) ? json_array_get(s, i) : s;
        char param[32];
        snprintf(param, sizeof param, json_is_array(s) ? "stop[%zu]" : "stop", i);
        if (!json_is_string(v))
            return bad(e, param, "a string", v);
        size_t len = json_string_length(v);
        if (len == 0 || len > KILN_OPENAI_MAX_STOP_LEN || strlen(json_string_value(v)) != len)
            return kiln_openai_error_set(e, 400, "stop", "%s must be 1 to %d bytes without NUL, got %zu bytes", param,
                                         KILN_OPENAI_MAX_STOP_LEN, len);
        r->stop[i] = json_string_value(v);
    }
    r->n_stop = (int32_t)n;
    return 0;
}

/* Fields kiln refuses rather than silently ignore: each is accepted only
 * at the value that asks for nothing. */
static int parse_unsupported(json_t *root, kiln_openai_request *r, kiln_openai_error *e)
{
    long long one = 1;
    if (get_int(root, "n", 1, 1000000, &one, e))
        return e->status;
    if (one != 1)
        return kiln_openai_error_set(e, 400, "n", "n must be 1: this server generates one choice per request, got %lld",
                                     one);
    one = 1;
    if (get_int(root, "best_of", 1, 1000000, &one, e))
        return e->status;
    if (one != 1)
        return kiln_openai_error_set(e, 400, "best_of", "best_of must be 1, got %lld", one);
    int echo = 0;
    if (get_bool(root, "echo", &echo, e))
        return e->status;
    if (echo)
        return kiln_openai_error_set(e, 400, "echo", "echo is not supported");
    json_t *v = member(root, "suffix");
    if (v && !(json_is_string(v) && json_string_length(v) == 0))
        return kiln_openai_error_set(e, 400, "suffix", "suffix is not supported");
    v = member(root, "logit_bias");
    if (v && !(json_is_object(v) && json_object_size(v) == 0))
        return kiln_openai_error_set(e, 400, "logit_bias", "logit_bias is not supported");
    static const char *const lists[] = {"tools", "functions"};
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) {
        v = member(root, lists[i]);
        if (v && !(json_is_array(v) && json_array_size(v) == 0))
            return kiln_openai_error_set(e, 400, lists[i], "%s: tool calling is not supported", lists[i]);
    }
    v = member(root, "tool_choice");
    if (v && !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
        return kiln_openai_error_set(e, 400, "tool_choice", "tool_choice: tool calling is not supported");
    v = member(root, "response_format");
    if (v) {
        const char *type = json_is_object(v) ? json_string_value(json_object_get(v, "type")) : NULL;
        if (!type || strcmp(type, "text") != 0)
            return kiln_openai_error_set(e, 400, "response_format",
                                         "response_format: only {\"type\": \"text\"} is supported");
    }
    (void)r;
    return 0;
}

static int parse_logprobs(json_t *root, kiln_openai_request *r, kiln_openai_error *e)
{
    r->logprobs = -1;
    if (r->endpoint == KILN_OPENAI_COMPLETIONS) {
        long long n = -1;
        if (get_int(root, "logprobs", 0, 20, &n, e))
            return e->status;
        r->logprobs = (int32_t)n;
        return 0;
    }
    int on = 0;
    long long top = -1;
    if (get_bool(root, "logprobs", &on, e) || get_int(root, "top_logprobs", 0, 20, &top, e))
        return e->status;
    if (top >= 0 && !on)
        return kiln_openai_error_set(e, 400, "top_logprobs", "top_logprobs needs logprobs set to true");
    if (on)
        r->logprobs = top >= 0 ? (int32_t)top : 0;
    return 0;
}

static int parse_sampling(json_t *root, const kiln_llm_sampling *defaults, kiln_openai_request *r, kiln_openai_error *e)
{
    kiln_llm_sampling *s = &r->sampling;
    kiln_llm_sampling_init(s);
    if (defaults) {
        s->temperature = defaults->temperature;
        s->top_k = defaults->top_k;
        s->top_p = defaults->top_p;
        s->min_p = defaults->min_p;
        s->repetition_penalty = defaults->repetition_penalty;
        s->presence_penalty = defaults->presence_penalty;
        s->frequency_penalty = defaults->frequency_penalty;
    }
    if (get_float(root, "temperature", 0, 2, 0, &s->temperature, e) ||
        get_float(root, "top_p", 0, 1, 1, &s->top_p, e) || get_float(root, "min_p", 0, 1, 0, &s->min_p, e) ||
        get_float(root, "presence_penalty", -2, 2, 0, &s->presence_penalty, e) ||
        get_float(root, "frequency_penalty", -2, 2, 0, &s->frequency_penalty, e) ||
        get_float(root, "repetition_penalty", 0, 100, 1, &s->repetition_penalty, e))
        return e->status;
    long long k = s->top_k;
    if (get_int(root, "top_k", -1, INT32_MAX, &k, e))
        return e->status;
    s->top_k = k > 0 ? (int32_t)k : 0; /* -1 and 0 both mean off, as in vLLM */
    json_t *seed = member(root, "seed");
    if (seed) {
        if (!json_is_integer(seed))
            return bad(e, "seed", "an integer", seed);
        s->seed = (uint64_t)json_integer_value(seed);
        r->has_seed = 1;
    }
    return 0;
}

int kiln_openai_parse(kiln_openai_endpoint endpoint, const char *body, size_t len, const kiln_llm_sampling *defaults,
                      kiln_openai_request *out, kiln_openai_error *err)
{
    kiln_openai_request r;
    memset(&r, 0, sizeof r);
    memset(out, 0, sizeof *out);
    r.endpoint = endpoint;
    json_error_t je;
    r.root = json_loadb(body, len, 0, &je);
    if (!r.root)
        return kiln_openai_error_set(err, 400, "", "request body is not valid JSON: %s (line %d, column %d)", je.text,
                                     je.line, je.column);
    json_t *root = r.root;
    long long max_tokens = -1, max_completion = -1;
    int st = 0;
    if (!json_is_object(root))
        st = kiln_openai_error_set(err, 400, "", "request body must be a JSON object, got %s", kind_name(root));
    else if (get_string(root, "model", &r.model, err) ||
             (endpoint == KILN_OPENAI_COMPLETIONS ? parse_prompt(root, &r, err) : parse_messages(root, &r, err)) ||
             get_int(root, "max_tokens", 1, INT32_MAX, &max_tokens, err) ||
             get_int(root, "max_completion_tokens", 1, INT32_MAX, &max_completion, err) ||
             parse_sampling(root, defaults, &r, err) || parse_stop(root, &r, err) ||
             get_bool(root, "stream", &r.stream, err) || parse_logprobs(root, &r, err) ||
             get_bool(root, "ignore_eos", &r.ignore_eos, err) || parse_unsupported(root, &r, err))
        st = err->status;
    const char *user = NULL;
    if (!st && get_string(root, "user", &user, err))
        st = err->status;
    json_t *so = st ? NULL : member(root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            st = bad(err, "stream_options", "an object", so);
        else if (!r.stream)
            st =
                kiln_openai_error_set(err, 400, "stream_options", "stream_options is only allowed when stream is true");
        else if (!json_is_boolean(json_object_get(so, "include_usage")) && member(so, "include_usage"))
            st = bad(err, "stream_options.include_usage", "a boolean", json_object_get(so, "include_usage"));
        else
            r.include_usage = json_is_true(json_object_get(so, "include_usage"));
    }
    if (st) {
        kiln_openai_request_free(&r);
        return st;
    }
    r.max_tokens = max_completion >= 0 ? max_completion : max_tokens;
    *out = r;
    return 0;
}

void kiln_openai_request_free(kiln_openai_request *r)
{
    if (!r)
        return;
    json_decref(r->root);
    free(r->prompt_ids);
    free(r->turns);
    free(r->messages);
    free(r->stop);
    memset(r, 0, sizeof *r);
}

/* ---- responses ---------------------------------------------------------------------------------------------- */

char *kiln_openai_error_json(const kiln_openai_error *e)
{
    /* the message may quote the bad bytes of a body (jansson's errors do) */
    json_t *o =
        json_pack("{s:{s:o, s:s, s:o, s:o}}", "error", "message", kiln_openai_text(e->message, strlen(e->message)),
                  "type", e->type, "param", e->param[0] ? kiln_openai_text(e->param, strlen(e->param)) : json_null(),
                  "code", e->code ? json_string(e->code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

const char *kiln_openai_finish_reason(kiln_llm_finish finish)
{
    switch (finish) {
    case KILN_LLM_FINISH_LENGTH: return "length";
    case KILN_LLM_FINISH_EOS:
    case KILN_LLM_FINISH_STOP: return "stop";
    default: return NULL;
    }
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (n < len)
        return 0;
    unsigned cp = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

json_t *kiln_openai_text(const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    char *fixed = malloc(len * 3 + 1), *w = fixed;
    if (!fixed)
        return NULL;
    for (size_t i = 0; i < len;) {
        size_t k = s[i] ? utf8_seq(s + i, len - i) : 0;
        if (k) {
            memcpy(w, s + i, k);
            w += k, i += k;
        } else {
            memcpy(w, "\xef\xbf\xbd", 3); /* U+FFFD; NUL too, which a C string cannot carry */
            w += 3, i++;
        }
    }
    json_t *v = json_stringn_nocheck(fixed, (size_t)(w - fixed));
    free(fixed);
    return v;
}

static size_t utf8_chars(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xc0) != 0x80;
    return n;
}

static json_t *bytes_json(const char *s, size_t len)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < len; i++)
        json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* OpenAI gives -9999.0 for a logprob that is minus infinity; JSON has no
 * infinities. */
static json_t *logprob_json(float lp) { return json_real(isfinite(lp) ? lp : -9999.0); }

json_t *kiln_openai_logprobs_json(kiln_openai_endpoint endpoint, const kiln_openai_token_logprobs *t, size_t n,
                                  size_t offset)
{
    if (endpoint == KILN_OPENAI_CHAT) {
        json_t *content = json_array();
        for (size_t i = 0; i < n; i++) {
            json_t *top = json_array();
            for (int32_t j = 0; j < t[i].n_top; j++)
                json_array_append_new(top, json_pack("{s:o, s:o, s:o}", "token",
                                                     kiln_openai_text(t[i].top_text[j], t[i].top_len[j]), "logprob",
                                                     logprob_json(t[i].top_logprob[j]), "bytes",
                                                     bytes_json(t[i].top_text[j], t[i].top_len[j])));
            json_array_append_new(content,
                                  json_pack("{s:o, s:o, s:o, s:o}", "token", kiln_openai_text(t[i].text, t[i].len),
                                            "logprob", logprob_json(t[i].logprob), "bytes",
                                            bytes_json(t[i].text, t[i].len), "top_logprobs", top));
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offsets = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(tokens, kiln_openai_text(t[i].text, t[i].len));
        json_array_append_new(lps, logprob_json(t[i].logprob));
        json_t *top = json_object();
        for (int32_t j = 0; j < t[i].n_top; j++) {
            json_t *key = kiln_openai_text(t[i].top_text[j], t[i].top_len[j]);
            if (key)
                json_object_set_new(top, json_string_value(key), logprob_json(t[i].top_logprob[j]));
            json_decref(key);
        }
        json_array_append_new(tops, top);
        json_array_append_new(offsets, json_integer((json_int_t)offset));
        offset += utf8_chars(t[i].text, t[i].len);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops,
                     "text_offset", offsets);
}

json_t *kiln_openai_usage_json(size_t prompt_tokens, size_t completion_tokens)
{
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)prompt_tokens, "completion_tokens",
                     (json_int_t)completion_tokens, "total_tokens", (json_int_t)(prompt_tokens + completion_tokens));
}

static const char *object_name(kiln_openai_endpoint endpoint, int chunk)
{
    if (endpoint == KILN_OPENAI_COMPLETIONS)
        return "text_completion";
    return chunk ? "chat.completion.chunk" : "chat.completion";
}

json_t *kiln_openai_response_json(kiln_openai_endpoint endpoint, const char *id, long long created, const char *model,
                                  const char *text, size_t len, const char *finish_reason, json_t *logprobs,
                                  size_t prompt_tokens, size_t completion_tokens)
{
    json_t *choice = json_pack("{s:i, s:o, s:s}", "index", 0, "logprobs", logprobs ? logprobs : json_null(),
                               "finish_reason", finish_reason);
    if (endpoint == KILN_OPENAI_CHAT)
        json_object_set_new(choice, "message",
                            json_pack("{s:s, s:o}", "role", "assistant", "content", kiln_openai_text(text, len)));
    else
        json_object_set_new(choice, "text", kiln_openai_text(text, len));
    return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", id, "object", object_name(endpoint, 0), "created",
                     (json_int_t)created, "model", model, "choices", choice, "usage",
                     kiln_openai_usage_json(prompt_tokens, completion_tokens));
}

json_t *kiln_openai_chunk_json(kiln_openai_endpoint endpoint, const char *id, long long created, const char *model,
                               const char *role, const char *text, size_t len, const char *finish_reason,
                               json_t *logprobs, int include_usage)
{
    json_t *choice = json_pack("{s:i, s:o, s:o}", "index", 0, "logprobs", logprobs ? logprobs : json_null(),
                               "finish_reason", finish_reason ? json_string(finish_reason) : json_null());
    if (endpoint == KILN_OPENAI_CHAT) {
        json_t *delta = json_object();
        if (role)
            json_object_set_new(delta, "role", json_string(role));
        if (text)
            json_object_set_new(delta, "content", kiln_openai_text(text, len));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", kiln_openai_text(text ? text : "", text ? len : 0));
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object", object_name(endpoint, 1), "created",
                          (json_int_t)created, "model", model, "choices", choice);
    if (o && include_usage)
        json_object_set_new(o, "usage", json_null());
    return o;
}

json_t *kiln_openai_usage_chunk_json(kiln_openai_endpoint endpoint, const char *id, long long created,
                                     const char *model, size_t prompt_tokens, size_t completion_tokens)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object", object_name(endpoint, 1), "created",
                     (json_int_t)created, "model", model, "choices", "usage",
                     kiln_openai_usage_json(prompt_tokens, completion_tokens));
}
