/* Chat templates: the exact text each family's Jinja template (Hugging Face
 * tokenizer_config.json chat_template) renders for the same conversations. */
#include "test.h"

#include "llm/chat_template.h"

static int renders(kiln_llm_chat_template t, const kiln_chat_message *m, size_t n, int gen, const char *sys,
                   const char *want)
{
    char *out = NULL;
    size_t len = 0;
    kiln_chat_tokens tok = {"<s>", "</s>"};
    kiln_status s = kiln_chat_render(t, m, n, gen, sys, &tok, &out, &len);
    int ok = s == KILN_OK && out && len == strlen(want) && !strcmp(out, want);
    if (!ok)
        fprintf(stderr, "rendered: %s\nexpected: %s\n", out ? out : kiln_last_error(), want);
    free(out);
    return ok;
}

static const kiln_chat_message convo[3] = {
    {"user", "Hi there"},
    {"assistant", "Hello! How can I help?"},
    {"user", "What is 2+2?"},
};

static void test_chatml(void)
{
    /* SmolLM2-Instruct: the default system message when none is given. */
    CHECK(renders(KILN_LLM_CHAT_CHATML, convo, 1, 1,
                  "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                  "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                  "<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"));
    /* Without a default: none inserted. */
    CHECK(renders(KILN_LLM_CHAT_CHATML, convo, 3, 1, NULL,
                  "<|im_start|>user\nHi there<|im_end|>\n"
                  "<|im_start|>assistant\nHello! How can I help?<|im_end|>\n"
                  "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"));
    /* A given system message replaces the default. */
    kiln_chat_message m[2] = {{"system", "Be terse."}, {"user", "Hi"}};
    CHECK(renders(KILN_LLM_CHAT_CHATML, m, 2, 0, "default",
                  "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"));
}

static void test_llama3(void)
{
    kiln_chat_message m[2] = {{"system", "Be terse. "}, {"user", "  Hi\n"}};
    /* Contents are trimmed ({{ message['content'] | trim }}). */
    CHECK(renders(KILN_LLM_CHAT_LLAMA3, m, 2, 1, NULL,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe terse.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    CHECK(renders(KILN_LLM_CHAT_LLAMA3, convo, 3, 1, NULL,
                  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello! How can I help?<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n"));
}

static void test_llama2(void)
{
    CHECK(renders(KILN_LLM_CHAT_LLAMA2, convo, 3, 1, NULL,
                  "<s>[INST] Hi there [/INST] Hello! How can I help? </s><s>[INST] What is 2+2? [/INST]"));
    kiln_chat_message m[2] = {{"system", "Be terse."}, {"user", "Hi"}};
    CHECK(renders(KILN_LLM_CHAT_LLAMA2, m, 2, 1, NULL, "<s>[INST] <<SYS>>\nBe terse.\n<</SYS>>\n\nHi [/INST]"));
    /* Turns must alternate; a late system message is refused. */
    kiln_chat_message bad[2] = {{"user", "a"}, {"user", "b"}};
    char *out = NULL;
    size_t len = 0;
    CHECK_FAILS(kiln_chat_render(KILN_LLM_CHAT_LLAMA2, bad, 2, 1, NULL, NULL, &out, &len), KILN_ERROR_INVALID_ARGUMENT,
                "alternate");
    kiln_chat_message late[2] = {{"user", "a"}, {"system", "b"}};
    CHECK_FAILS(kiln_chat_render(KILN_LLM_CHAT_LLAMA2, late, 2, 1, NULL, NULL, &out, &len), KILN_ERROR_INVALID_ARGUMENT,
                "only the first");
}

static void test_errors(void)
{
    char *out = NULL;
    size_t len = 0;
    CHECK_FAILS(kiln_chat_render(KILN_LLM_CHAT_NONE, convo, 1, 1, NULL, NULL, &out, &len), KILN_ERROR_UNSUPPORTED,
                "no chat template");
    kiln_chat_message m[1] = {{"tool", "x"}};
    CHECK_FAILS(kiln_chat_render(KILN_LLM_CHAT_CHATML, m, 1, 1, NULL, NULL, &out, &len), KILN_ERROR_INVALID_ARGUMENT,
                "unknown role \"tool\"");
    CHECK(out == NULL);
}

static const test_case_ tests[] = {TEST(test_chatml), TEST(test_llama3), TEST(test_llama2), TEST(test_errors)};

TEST_MAIN(tests)
