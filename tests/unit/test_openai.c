/* The OpenAI request parser (src/server/openai.c): what OpenAI's API
 * reference accepts is accepted with its meaning, and every bad field is a
 * 400 naming that field; response objects carry the members the reference
 * lists. (The official Python client reads them in tests/e2e/serve_openai.sh.) */
#include "test.h"

#include "server/openai.h"

static int parse(kiln_openai_endpoint ep, const char *body, kiln_openai_request *r, kiln_openai_error *e)
{
    return kiln_openai_parse(ep, body, strlen(body), NULL, r, e);
}

/* The body fails with 400, param `param`, and a message containing needle. */
static void check_bad(kiln_openai_endpoint ep, const char *body, const char *param, const char *needle)
{
    kiln_openai_request r;
    kiln_openai_error e;
    int st = parse(ep, body, &r, &e);
    CHECK(st == 400);
    CHECK(r.root == NULL);
    if (st == 400 && (strcmp(e.param, param) != 0 || !strstr(e.message, needle))) {
        test_failures_++;
        fprintf(stderr, "body %s: param \"%s\" message \"%s\"; expected \"%s\" / \"%s\"\n", body, e.param, e.message,
                param, needle);
    }
    kiln_openai_request_free(&r);
}

static void test_chat_fields(void)
{
    kiln_openai_request r;
    kiln_openai_error e;
    const char *body = "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
                       "\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null},{\"role\":\"user\","
                       "\"content\":\"hi\"}],\"max_completion_tokens\":7,\"max_tokens\":99,\"temperature\":0.5,"
                       "\"top_p\":0.9,\"seed\":-3,\"stop\":[\"x\",\"yz\"],\"stream\":true,\"stream_options\":"
                       "{\"include_usage\":true},\"logprobs\":true,\"top_logprobs\":3,\"presence_penalty\":0.5,"
                       "\"frequency_penalty\":-0.5,\"top_k\":-1,\"min_p\":0.1,\"repetition_penalty\":1.1,"
                       "\"ignore_eos\":true,\"user\":\"u\",\"n\":1,\"tools\":[],\"response_format\":{\"type\":"
                       "\"text\"}}";
    CHECK(parse(KILN_OPENAI_CHAT, body, &r, &e) == 0);
    CHECK(r.model && !strcmp(r.model, "m"));
    CHECK(r.n_messages == 4);
    if (r.n_messages == 4) {
        CHECK(!strcmp(r.messages[0]->role, "system"));
        CHECK(!strcmp(r.messages[1]->content, "a\nb"));
        CHECK(!strcmp(r.messages[2]->content, ""));
        CHECK(!strcmp(r.messages[3]->content, "hi"));
    }
    CHECK(r.max_tokens == 7); /* max_completion_tokens wins */
    CHECK_NEAR(r.sampling.temperature, 0.5, 1e-7);
    CHECK_NEAR(r.sampling.top_p, 0.9, 1e-7);
    CHECK(r.has_seed && r.sampling.seed == (uint64_t)-3);
    CHECK(r.n_stop == 2 && !strcmp(r.stop[1], "yz"));
    CHECK(r.stream && r.include_usage);
    CHECK(r.logprobs == 3);
    CHECK_NEAR(r.sampling.presence_penalty, 0.5, 1e-7);
    CHECK_NEAR(r.sampling.frequency_penalty, -0.5, 1e-7);
    CHECK(r.sampling.top_k == 0);
    CHECK_NEAR(r.sampling.min_p, 0.1, 1e-7);
    CHECK_NEAR(r.sampling.repetition_penalty, 1.1, 1e-6);
    CHECK(r.ignore_eos);
    kiln_openai_request_free(&r);

    /* defaults: OpenAI's temperature 1 and top_p 1, nothing else */
    CHECK(parse(KILN_OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":null}", &r, &e) == 0);
    CHECK(r.model == NULL && r.max_tokens == -1 && r.logprobs == -1 && !r.stream && r.n_stop == 0 && !r.has_seed);
    CHECK(r.sampling.temperature == 1.0f && r.sampling.top_p == 1.0f && r.sampling.top_k == 0);
    kiln_openai_request_free(&r);
}

/* Sampling fields a request leaves out take the server's defaults; those
 * it gives win. */
static void test_defaults(void)
{
    kiln_llm_sampling d;
    kiln_llm_sampling_init(&d);
    d.temperature = 0.8f;
    d.top_k = 40;
    d.top_p = 0.95f;
    d.min_p = 0.05f;
    kiln_openai_request r;
    kiln_openai_error e;
    const char *body = "{\"prompt\":\"a\",\"temperature\":0,\"top_k\":-1}";
    CHECK(kiln_openai_parse(KILN_OPENAI_COMPLETIONS, body, strlen(body), &d, &r, &e) == 0);
    CHECK(r.sampling.temperature == 0.0f && r.sampling.top_k == 0);
    CHECK(r.sampling.top_p == 0.95f && r.sampling.min_p == 0.05f && r.sampling.repetition_penalty == 1.0f);
    kiln_openai_request_free(&r);
}

static void test_completion_prompts(void)
{
    kiln_openai_request r;
    kiln_openai_error e;
    CHECK(parse(KILN_OPENAI_COMPLETIONS, "{\"prompt\":\"Once\",\"logprobs\":2,\"max_tokens\":3.0}", &r, &e) == 0);
    CHECK(r.prompt && r.prompt_len == 4 && r.logprobs == 2 && r.max_tokens == 3);
    kiln_openai_request_free(&r);
    CHECK(parse(KILN_OPENAI_COMPLETIONS, "{\"prompt\":[\"Once\"]}", &r, &e) == 0);
    CHECK(r.prompt && !strcmp(r.prompt, "Once"));
    kiln_openai_request_free(&r);
    CHECK(parse(KILN_OPENAI_COMPLETIONS, "{\"prompt\":[5,6,7]}", &r, &e) == 0);
    CHECK(!r.prompt && r.n_prompt_ids == 3 && r.prompt_ids[2] == 7);
    kiln_openai_request_free(&r);
    CHECK(parse(KILN_OPENAI_COMPLETIONS, "{\"prompt\":[[1,2]]}", &r, &e) == 0);
    CHECK(!r.prompt && r.n_prompt_ids == 2 && r.prompt_ids[0] == 1);
    kiln_openai_request_free(&r);
    /* the empty string is a prompt (BOS alone, where the engine adds one) */
    CHECK(parse(KILN_OPENAI_COMPLETIONS, "{\"prompt\":\"\"}", &r, &e) == 0);
    CHECK(r.prompt && r.prompt_len == 0);
    kiln_openai_request_free(&r);
}

static void test_bad_requests(void)
{
    const kiln_openai_endpoint C = KILN_OPENAI_COMPLETIONS, H = KILN_OPENAI_CHAT;
    check_bad(C, "", "", "not valid JSON");
    check_bad(C, "{\"prompt\":\"a\"", "", "not valid JSON");
    check_bad(C, "[1]", "", "must be a JSON object");
    check_bad(C, "{}", "prompt", "prompt is required");
    check_bad(C, "{\"prompt\":3}", "prompt", "got a number");
    check_bad(C, "{\"prompt\":[]}", "prompt", "empty list");
    check_bad(C, "{\"prompt\":[\"a\",\"b\"]}", "prompt", "one prompt per request");
    check_bad(C, "{\"prompt\":[1,-2]}", "prompt", "prompt[1] must be a token id");
    check_bad(C, "{\"prompt\":[1,\"x\"]}", "prompt", "prompt[1] must be a token id");
    check_bad(C, "{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens", "[1, 2147483647]");
    check_bad(C, "{\"prompt\":\"a\",\"max_tokens\":\"5\"}", "max_tokens", "got a string");
    check_bad(C, "{\"prompt\":\"a\",\"max_tokens\":2.5}", "max_tokens", "got 2.5");
    check_bad(C, "{\"prompt\":\"a\",\"temperature\":3}", "temperature", "[0, 2]");
    check_bad(C, "{\"prompt\":\"a\",\"temperature\":true}", "temperature", "got a boolean");
    check_bad(C, "{\"prompt\":\"a\",\"top_p\":0}", "top_p", "(0, 1]");
    check_bad(C, "{\"prompt\":\"a\",\"presence_penalty\":2.5}", "presence_penalty", "[-2, 2]");
    check_bad(C, "{\"prompt\":\"a\",\"frequency_penalty\":{}}", "frequency_penalty", "got an object");
    check_bad(C, "{\"prompt\":\"a\",\"repetition_penalty\":0}", "repetition_penalty", "(0, 100]");
    check_bad(C, "{\"prompt\":\"a\",\"top_k\":-2}", "top_k", "[-1, 2147483647]");
    check_bad(C, "{\"prompt\":\"a\",\"min_p\":1.5}", "min_p", "[0, 1]");
    check_bad(C, "{\"prompt\":\"a\",\"seed\":1.5}", "seed", "must be an integer");
    check_bad(C, "{\"prompt\":\"a\",\"stop\":5}", "stop", "a string or a list of strings");
    check_bad(C, "{\"prompt\":\"a\",\"stop\":[\"a\",7]}", "stop[1]", "must be a string");
    check_bad(C, "{\"prompt\":\"a\",\"stop\":[\"\"]}", "stop", "stop[0] must be 1 to 1024 bytes");
    check_bad(C,
              "{\"prompt\":\"a\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\","
              "\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}",
              "stop", "at most 16");
    check_bad(C, "{\"prompt\":\"a\",\"n\":2}", "n", "n must be 1");
    check_bad(C, "{\"prompt\":\"a\",\"best_of\":3}", "best_of", "best_of must be 1");
    check_bad(C, "{\"prompt\":\"a\",\"echo\":true}", "echo", "not supported");
    check_bad(C, "{\"prompt\":\"a\",\"suffix\":\"b\"}", "suffix", "not supported");
    check_bad(C, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":1}}", "logit_bias", "not supported");
    check_bad(C, "{\"prompt\":\"a\",\"logprobs\":21}", "logprobs", "[0, 20]");
    check_bad(C, "{\"prompt\":\"a\",\"stream\":\"yes\"}", "stream", "must be a boolean");
    check_bad(C, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", "stream_options",
              "only allowed when stream is true");
    check_bad(C, "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
              "stream_options.include_usage", "must be a boolean");
    check_bad(C, "{\"prompt\":\"a\",\"model\":5}", "model", "must be a string");
    check_bad(C, "{\"prompt\":\"a\",\"user\":[]}", "user", "must be a string");
    check_bad(C, "{\"prompt\":\"a\",\"ignore_eos\":\"no\"}", "ignore_eos", "must be a boolean");
    check_bad(H, "{}", "messages", "messages is required");
    check_bad(H, "{\"messages\":{}}", "messages", "a list of messages");
    check_bad(H, "{\"messages\":[]}", "messages", "empty list");
    check_bad(H, "{\"messages\":[\"hi\"]}", "messages[0]", "got a string");
    check_bad(H, "{\"messages\":[{\"content\":\"hi\"}]}", "messages[0].role", "is required");
    check_bad(H, "{\"messages\":[{\"role\":1,\"content\":\"hi\"}]}", "messages[0].role", "must be a string");
    check_bad(H, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content", "is required");
    check_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content", "got a number");
    check_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages[0].content",
              "image_url");
    check_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":3}", "logprobs",
              "must be a boolean");
    check_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", "top_logprobs",
              "needs logprobs");
    check_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}", "tools",
              "not supported");
    check_bad(H,
              "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_object\"}}",
              "response_format", "only");
    /* a NUL in a string: jansson refuses it, so no C string is cut short */
    check_bad(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", "", "not valid JSON");
}

static void test_responses(void)
{
    kiln_openai_error e;
    kiln_openai_error_set(&e, 400, "temperature", "temperature must be %s", "a number");
    char *s = kiln_openai_error_json(&e);
    json_t *o = s ? json_loads(s, 0, NULL) : NULL;
    json_t *err = json_object_get(o, "error");
    CHECK(err && !strcmp(json_string_value(json_object_get(err, "message")), "temperature must be a number"));
    CHECK(!strcmp(json_string_value(json_object_get(err, "type")), "invalid_request_error"));
    CHECK(!strcmp(json_string_value(json_object_get(err, "param")), "temperature"));
    CHECK(json_is_null(json_object_get(err, "code")));
    json_decref(o);
    free(s);

    /* a body's bad bytes quoted in the message (jansson's error text does)
     * still give an error object */
    kiln_openai_request r;
    const char bad_body[] = "{\"prompt\":\"a\",\"ob\\\xc5\x97\xdd\xdd\"}";
    CHECK(kiln_openai_parse(KILN_OPENAI_COMPLETIONS, bad_body, sizeof bad_body - 1, NULL, &r, &e) == 400);
    s = kiln_openai_error_json(&e);
    CHECK(s && strstr(s, "not valid JSON"));
    free(s);

    CHECK(!strcmp(kiln_openai_finish_reason(KILN_LLM_FINISH_EOS), "stop"));
    CHECK(!strcmp(kiln_openai_finish_reason(KILN_LLM_FINISH_STOP), "stop"));
    CHECK(!strcmp(kiln_openai_finish_reason(KILN_LLM_FINISH_LENGTH), "length"));
    CHECK(kiln_openai_finish_reason(KILN_LLM_FINISH_CANCELLED) == NULL);

    /* invalid UTF-8 (a token that is half a character) becomes U+FFFD */
    json_t *t = kiln_openai_text("a\xe2\x82", 3);
    CHECK(t && !strcmp(json_string_value(t), "a\xef\xbf\xbd\xef\xbf\xbd"));
    json_decref(t);

    o = kiln_openai_response_json(KILN_OPENAI_CHAT, "chatcmpl-1", 5, "m", "Paris", 5, "stop", NULL, 10, 3);
    json_t *choice = json_array_get(json_object_get(o, "choices"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(o, "object")), "chat.completion"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(choice, "message"), "content")), "Paris"));
    CHECK(!strcmp(json_string_value(json_object_get(choice, "finish_reason")), "stop"));
    CHECK(json_integer_value(json_object_get(json_object_get(o, "usage"), "total_tokens")) == 13);
    json_decref(o);

    const char *tops[2] = {"x", "\xe2"};
    size_t top_len[2] = {1, 1};
    float top_lp[2] = {-0.1f, -INFINITY};
    kiln_openai_token_logprobs lp = {"x", 1, -0.1f, 2, tops, top_len, top_lp};
    o = kiln_openai_logprobs_json(KILN_OPENAI_CHAT, &lp, 1, 0);
    json_t *c0 = json_array_get(json_object_get(o, "content"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(c0, "token")), "x"));
    CHECK(json_integer_value(json_array_get(json_object_get(c0, "bytes"), 0)) == 'x');
    json_t *alt = json_array_get(json_object_get(c0, "top_logprobs"), 1);
    CHECK(json_real_value(json_object_get(alt, "logprob")) == -9999.0);
    CHECK(json_integer_value(json_array_get(json_object_get(alt, "bytes"), 0)) == 0xe2);
    json_decref(o);
    o = kiln_openai_logprobs_json(KILN_OPENAI_COMPLETIONS, &lp, 1, 7);
    CHECK(json_integer_value(json_array_get(json_object_get(o, "text_offset"), 0)) == 7);
    CHECK(json_object_size(json_array_get(json_object_get(o, "top_logprobs"), 0)) == 2);
    json_decref(o);

    o = kiln_openai_chunk_json(KILN_OPENAI_CHAT, "c", 1, "m", "assistant", "", 0, NULL, NULL, 1);
    choice = json_array_get(json_object_get(o, "choices"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(o, "object")), "chat.completion.chunk"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(choice, "delta"), "role")), "assistant"));
    CHECK(json_is_null(json_object_get(choice, "finish_reason")));
    CHECK(json_is_null(json_object_get(o, "usage")));
    json_decref(o);
    o = kiln_openai_usage_chunk_json(KILN_OPENAI_COMPLETIONS, "c", 1, "m", 4, 2);
    CHECK(json_array_size(json_object_get(o, "choices")) == 0);
    CHECK(json_integer_value(json_object_get(json_object_get(o, "usage"), "completion_tokens")) == 2);
    json_decref(o);
}

static const test_case_ tests[] = {TEST(test_chat_fields), TEST(test_defaults), TEST(test_completion_prompts),
                                   TEST(test_bad_requests), TEST(test_responses)};
TEST_MAIN(tests)
