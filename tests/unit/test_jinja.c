/* The Jinja interpreter's refusals and bounds: a template it cannot parse
 * fails naming the construct and the line; a hostile template stops at a
 * limit (steps, bytes scanned, output, memory, nesting, range) with a
 * message instead of hanging or exhausting memory; runtime errors name their line. (What it
 * renders is checked against transformers in test_jinja_reference.c.) */
#include "test.h"

#include "llm/jinja.h"

static kiln_status parse(const char *src)
{
    kiln_jinja *t = NULL;
    kiln_status s = kiln_jinja_parse(src, strlen(src), &t);
    kiln_jinja_free(t);
    return s;
}

/* Renders src with messages = [{"role": "user", "content": "hi"}]; *out
 * (may be NULL) gets the text. */
static kiln_status render(const char *src, char **out)
{
    kiln_jinja *t = NULL;
    kiln_status s = kiln_jinja_parse(src, strlen(src), &t);
    if (s != KILN_OK)
        return s;
    json_t *vars =
        json_pack("{s:[{s:s,s:s}],s:b}", "messages", "role", "user", "content", "hi", "add_generation_prompt", 1);
    char *text = NULL;
    size_t len = 0;
    s = kiln_jinja_render(t, vars, &text, &len);
    json_decref(vars);
    kiln_jinja_free(t);
    if (out)
        *out = text;
    else
        free(text);
    return s;
}

static void test_parse_errors(void)
{
    CHECK_FAILS(parse("ok\n{% macro m() %}x{% endmacro %}"), KILN_ERROR_FORMAT, "line 2: unsupported tag 'macro'");
    CHECK_FAILS(parse("{% include 'x' %}"), KILN_ERROR_FORMAT, "unsupported tag 'include'");
    CHECK_FAILS(parse("{{ x | frobnicate }}"), KILN_ERROR_FORMAT, "unsupported filter 'frobnicate'");
    CHECK_FAILS(parse("{% if x is frob %}{% endif %}"), KILN_ERROR_FORMAT, "unsupported test 'frob'");
    CHECK_FAILS(parse("a\nb\n{% for m in messages %}\n{{ m }}"), KILN_ERROR_FORMAT,
                "line 4: 'for' opened at line 3 is never closed (expected '{% endfor %}')");
    CHECK_FAILS(parse("{% if x %}{% endfor %}"), KILN_ERROR_FORMAT, "unexpected 'endfor' inside 'if'");
    CHECK_FAILS(parse("{% endif %}"), KILN_ERROR_FORMAT, "unexpected 'endif' with no open block");
    CHECK_FAILS(parse("{{ 'abc }}"), KILN_ERROR_FORMAT, "unterminated string literal");
    CHECK_FAILS(parse("{{ x"), KILN_ERROR_FORMAT, "unclosed '{{' expression");
    CHECK_FAILS(parse("{# never closed"), KILN_ERROR_FORMAT, "unclosed comment");
    CHECK_FAILS(parse("{{ (1 + }}"), KILN_ERROR_FORMAT, "expected an expression, found '}}'");
    CHECK_FAILS(parse("{{ a $ b }}"), KILN_ERROR_FORMAT, "unexpected character '$'");
    CHECK_FAILS(parse("{{ 99999999999999999999 }}"), KILN_ERROR_FORMAT, "too large");
    CHECK_FAILS(parse("{% for m in messages recursive %}{% endfor %}"), KILN_ERROR_FORMAT, "recursive");
    kiln_jinja *t = NULL;
    CHECK_FAILS(kiln_jinja_parse("x\n\0y", 4, &t), KILN_ERROR_FORMAT, "line 2: NUL byte");
    CHECK(t == NULL);
    /* nesting deeper than the parser allows */
    char deep[4096];
    size_t n = (size_t)snprintf(deep, sizeof deep, "{{ ");
    for (int i = 0; i < 1000; i++)
        deep[n++] = '(';
    snprintf(deep + n, sizeof deep - n, " }}");
    CHECK_FAILS(parse(deep), KILN_ERROR_FORMAT, "nested more than");
    n = 0;
    for (int i = 0; i < 300; i++)
        n += (size_t)snprintf(deep + n, sizeof deep - n, "{%% if x %%}");
    CHECK_FAILS(parse(deep), KILN_ERROR_FORMAT, "nested more than");
    CHECK_OK(parse("{% generation %}{{ x }}{% endgeneration %}{% set a, b = 1, 2 %}{{ a ~ b }}"));
}

static void test_runtime_errors(void)
{
    char *out = NULL;
    CHECK_FAILS(render("line1\n{{ raise_exception('Only user and assistant roles are supported!') }}", &out),
                KILN_ERROR_INVALID_ARGUMENT, "line 2: raise_exception: Only user and assistant roles are supported!");
    CHECK(out == NULL);
    CHECK_FAILS(render("{{ nothing.attr }}", NULL), KILN_ERROR_INVALID_ARGUMENT, "of an undefined value");
    CHECK_FAILS(render("{{ 1 / 0 }}", NULL), KILN_ERROR_INVALID_ARGUMENT, "division by zero");
    CHECK_FAILS(render("{{ messages + 1 }}", NULL), KILN_ERROR_INVALID_ARGUMENT, "unsupported operand types for +");
    CHECK_FAILS(render("{% set x = 1 %}{% set x.y = 2 %}", NULL), KILN_ERROR_INVALID_ARGUMENT, "is not a namespace()");
    CHECK_FAILS(render("{{ 'a' < 1 }}", NULL), KILN_ERROR_INVALID_ARGUMENT, "cannot compare string with int");
    CHECK_FAILS(render("{{ 5() }}", NULL), KILN_ERROR_INVALID_ARGUMENT, "not callable");
    CHECK_FAILS(render("{{ 'x'.nomethod() }}", NULL), KILN_ERROR_INVALID_ARGUMENT, "has no method 'nomethod'");
    CHECK_FAILS(render("{% for a, b in [1] %}{% endfor %}", NULL), KILN_ERROR_INVALID_ARGUMENT, "cannot unpack");
    /* undefined names are empty and false, as in Jinja's default Undefined */
    CHECK_OK(render("[{{ nothing }}]{% if nothing %}x{% endif %}{% for x in nothing %}y{% endfor %}", &out));
    CHECK(out && !strcmp(out, "[]"));
    free(out);
}

static void test_limits(void)
{
    /* 100000^2 iterations: stops at the step limit */
    CHECK_FAILS(render("{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", NULL),
                KILN_ERROR_INVALID_ARGUMENT, "steps");
    CHECK_FAILS(render("{{ range(100001) | length }}", NULL), KILN_ERROR_INVALID_ARGUMENT, "range() of more than");
    /* output doubling: past the output or memory cap */
    CHECK_FAILS(render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}"
                       "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
                       NULL),
                KILN_ERROR_INVALID_ARGUMENT, "out of memory");
    CHECK_FAILS(render("{{ 'x' * 100000000000 }}", NULL), KILN_ERROR_INVALID_ARGUMENT, "out of memory");
    CHECK_FAILS(
        render("{% for i in range(100000) %}{{ 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy'"
               " * 4 }}{% endfor %}",
               NULL),
        KILN_ERROR_INVALID_ARGUMENT, "output longer than");
    /* a list nested 100000 deep, then compared and printed: bounded, no stack overflow */
    char *out = NULL;
    kiln_status s = render("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
                           "{% endfor %}{{ (ns.l == ns.l) ~ (ns.l | string | length > 0) }}",
                           &out);
    CHECK(s == KILN_OK || s == KILN_ERROR_INVALID_ARGUMENT);
    free(out);
    /* few steps, each scanning a large value: stopped by the bytes scanned, in
     * well under a second, instead of running for minutes */
    static const char *const scans[] = {
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s | length }}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% if 'xy' in s %}{% endif %}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s.count('x') }}{% endfor %}",
        "{% set l = ['x' * 1000000] * 1000 %}{% for i in range(100000) %}{{ l == l }}{% endfor %}",
        "{% set l = ['x' * 1000000] * 1000 %}{{ l | unique | list | length }}",
        /* a needle that nearly matches at every byte: the search itself is bounded */
        "{{ ('a' * 30000000).count('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab') }}",
    };
    for (size_t i = 0; i < sizeof scans / sizeof *scans; i++)
        CHECK_FAILS(render(scans[i], NULL), KILN_ERROR_INVALID_ARGUMENT, "scanned");
    /* (one making a new value each time runs out of memory first) */
    CHECK_FAILS(
        render("{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{% set t = s | upper %}{% endfor %}", NULL),
        KILN_ERROR_INVALID_ARGUMENT, "out of memory");
    /* ...while a long conversation (4 MB of text) renders through a template
     * that measures and searches every message */
    {
        json_t *msgs = json_array();
        char *text = malloc(1 << 20);
        memset(text, 'w', (1 << 20) - 1);
        text[(1 << 20) - 1] = '\0';
        for (int m = 0; m < 4; m++)
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", m % 2 ? "assistant" : "user", "content", text));
        json_t *vars = json_pack("{s:o}", "messages", msgs);
        kiln_jinja *t = NULL;
        const char *src = "{% for m in messages %}{% if '<tool_call>' not in m.content and m.content | length > 0 %}"
                          "<{{ m.role }}>{{ m.content | trim }}{% endif %}{% endfor %}";
        CHECK_OK(kiln_jinja_parse(src, strlen(src), &t));
        char *o = NULL;
        size_t len = 0;
        CHECK_OK(kiln_jinja_render(t, vars, &o, &len));
        CHECK(len == 4 * ((1u << 20) - 1) + 2 * strlen("<user>") + 2 * strlen("<assistant>"));
        free(o);
        kiln_jinja_free(t);
        json_decref(vars);
        free(text);
    }
    /* ...and so does a conversation of 5000 short messages through a template
     * that asks for the list's length and each content's type in its loop
     * (a glance, not a scan: counting the list each time would pass the budget) */
    {
        json_t *msgs = json_array();
        for (int m = 0; m < 5000; m++)
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", m % 2 ? "assistant" : "user", "content", "ok"));
        json_t *vars = json_pack("{s:o}", "messages", msgs);
        kiln_jinja *t = NULL;
        const char *src = "{% for m in messages %}{% if m.content is string and messages | length > 0 and "
                          "(messages | first) is defined %}{{ m.content }}{% endif %}"
                          "{% if loop.index0 == messages | length - 1 %}.{% endif %}{% endfor %}";
        CHECK_OK(kiln_jinja_parse(src, strlen(src), &t));
        char *o = NULL;
        size_t len = 0;
        CHECK_OK(kiln_jinja_render(t, vars, &o, &len));
        CHECK(len == 5000 * 2 + 1);
        free(o);
        kiln_jinja_free(t);
        json_decref(vars);
    }
    /* a left-nested chain of 3000 additions: past the evaluation depth, refused */
    static char chain[16384];
    size_t n = (size_t)snprintf(chain, sizeof chain, "{{ 1");
    for (int i = 0; i < 3000; i++)
        n += (size_t)snprintf(chain + n, sizeof chain - n, "+1");
    snprintf(chain + n, sizeof chain - n, " }}");
    CHECK_FAILS(render(chain, NULL), KILN_ERROR_INVALID_ARGUMENT, "nested more than");
}

static void test_render_basics(void)
{
    /* whitespace control as transformers configures Jinja: trim_blocks, lstrip_blocks */
    char *out = NULL;
    CHECK_OK(render("  {% if true %}\n  a\n  {% endif %}\nb {{- ' c' }}\n{{ messages[0].content -}}  \n!", &out));
    CHECK(out && !strcmp(out, "  a\nb c\nhi!"));
    free(out);
    CHECK_OK(render("{{ messages | tojson }}|{{ add_generation_prompt }}|{{ tools is defined }}", &out));
    CHECK(out && !strcmp(out, "[{\"role\": \"user\", \"content\": \"hi\"}]|True|False"));
    free(out);
}

static const test_case_ tests[] = {TEST(test_parse_errors), TEST(test_runtime_errors), TEST(test_limits),
                                   TEST(test_render_basics)};

TEST_MAIN(tests)
