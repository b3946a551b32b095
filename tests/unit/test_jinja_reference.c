/* kiln's Jinja interpreter against transformers: every case of
 * tests/data/chat/reference.json (the published chat templates of Llama 2,
 * Llama 3.1/3.2, Mistral Instruct v0.1-v0.3, Qwen2.5, SmolLM2, TinyLlama and
 * Zephyr, plus two feature templates, for conversations with and without a
 * system turn, single and multi-turn, add_generation_prompt on and off),
 * rendered by transformers' render_jinja_template in
 * tests/data/chat/make_reference.py, must render byte for byte the same
 * here, and a case transformers raised on must fail here too. */
#include "test.h"

#include <jansson.h>

#include "llm/jinja.h"

static json_t *load(const char *name)
{
    const char *src = getenv("KILN_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/chat/%s", src ? src : ".", name);
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j)
        fprintf(stderr, "%s: %s\n", path, e.text);
    return j;
}

static json_t *find_template(json_t *templates, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(templates, "templates"), i,
                       t) if (!strcmp(json_string_value(json_object_get(t, "name")), name)) return t;
    return NULL;
}

static void test_reference(void)
{
    json_t *templates = load("templates.json"), *ref = load("reference.json");
    CHECK(templates && ref);
    if (!templates || !ref) {
        json_decref(templates);
        json_decref(ref);
        return;
    }
    size_t i, matched = 0, errors_matched = 0, n = 0;
    json_t *c;
    json_array_foreach(json_object_get(ref, "cases"), i, c)
    {
        const char *tname = json_string_value(json_object_get(c, "template"));
        const char *conv = json_string_value(json_object_get(c, "conversation"));
        json_t *t = find_template(templates, tname);
        CHECK(t != NULL);
        if (!t)
            continue;
        n++;
        const char *src = json_string_value(json_object_get(t, "template"));
        kiln_jinja *tmpl = NULL;
        kiln_status s = kiln_jinja_parse(src, strlen(src), &tmpl);
        if (s != KILN_OK) {
            fprintf(stderr, "%s: parse failed: %s\n", tname, kiln_last_error());
            CHECK(0);
            continue;
        }
        json_t *vars = json_pack(
            "{s:O,s:O,s:O,s:O,s:n,s:n}", "messages", json_object_get(json_object_get(ref, "conversations"), conv),
            "add_generation_prompt", json_object_get(c, "add_generation_prompt"), "bos_token",
            json_object_get(t, "bos_token"), "eos_token", json_object_get(t, "eos_token"), "tools", "documents");
        json_object_update(vars, json_object_get(t, "extra"));
        char *out = NULL;
        size_t len = 0;
        s = kiln_jinja_render(tmpl, vars, &out, &len);
        json_t *want = json_object_get(c, "output");
        if (want) {
            int ok = s == KILN_OK && len == json_string_length(want) && !memcmp(out, json_string_value(want), len);
            if (!ok)
                fprintf(stderr, "%s / %s / gen=%d differs:\n--- kiln\n%s\n--- transformers\n%s\n---\n", tname, conv,
                        json_is_true(json_object_get(c, "add_generation_prompt")),
                        s == KILN_OK ? out : kiln_last_error(), json_string_value(want));
            matched += ok;
            CHECK(ok);
        } else {
            /* transformers raised (raise_exception): kiln must refuse too, with the template's message */
            const char *msg = json_string_value(json_object_get(c, "error"));
            int ok = s == KILN_ERROR_INVALID_ARGUMENT && strstr(kiln_last_error(), msg);
            if (!ok)
                fprintf(stderr, "%s / %s: expected the error \"%s\", got %s\n", tname, conv, msg,
                        s == KILN_OK ? "a rendering" : kiln_last_error());
            errors_matched += ok;
            matched += ok;
            CHECK(ok);
        }
        free(out);
        json_decref(vars);
        kiln_jinja_free(tmpl);
    }
    printf("%zu of %zu reference cases identical (%zu of them raising in both)\n", matched, n, errors_matched);
    CHECK(n >= 100);
    json_decref(templates);
    json_decref(ref);
}

static const test_case_ tests[] = {TEST(test_reference)};

TEST_MAIN(tests)
