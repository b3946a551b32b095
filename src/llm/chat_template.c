/* Chat templates (chat_template.h). */
#include "llm/chat_template.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int failed;
} sbuf;

static void put(sbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* Jinja's str.strip()/trim: ASCII whitespace at both ends. */
static void put_trimmed(sbuf *b, const char *s)
{
    size_t n = strlen(s);
    while (n && strchr(" \t\n\r\f\v", s[n - 1]))
        n--;
    while (n && strchr(" \t\n\r\f\v", *s)) {
        s++;
        n--;
    }
    put(b, s, n);
}

static int known_role(const char *r)
{
    return r && (!strcmp(r, "system") || !strcmp(r, "user") || !strcmp(r, "assistant"));
}

/* SmolLM2-Instruct's template (ChatML):
 * <|im_start|>{role}\n{content}<|im_end|>\n per message, a default system
 * message first when the conversation has none, <|im_start|>assistant\n. */
static void render_chatml(sbuf *b, const kiln_chat_message *m, size_t n, int gen, const char *def_sys)
{
    if (def_sys && (n == 0 || strcmp(m[0].role, "system") != 0)) {
        puts_(b, "<|im_start|>system\n");
        puts_(b, def_sys);
        puts_(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        puts_(b, "<|im_start|>");
        puts_(b, m[i].role);
        puts_(b, "\n");
        puts_(b, m[i].content);
        puts_(b, "<|im_end|>\n");
    }
    if (gen)
        puts_(b, "<|im_start|>assistant\n");
}

/* Meta-Llama-3-Instruct's template: <|begin_of_text|>, then per message
 * <|start_header_id|>{role}<|end_header_id|>\n\n{content | trim}<|eot_id|>,
 * then the assistant header. */
static void render_llama3(sbuf *b, const kiln_chat_message *m, size_t n, int gen, const char *def_sys)
{
    puts_(b, "<|begin_of_text|>");
    if (def_sys && (n == 0 || strcmp(m[0].role, "system") != 0)) {
        puts_(b, "<|start_header_id|>system<|end_header_id|>\n\n");
        put_trimmed(b, def_sys);
        puts_(b, "<|eot_id|>");
    }
    for (size_t i = 0; i < n; i++) {
        puts_(b, "<|start_header_id|>");
        puts_(b, m[i].role);
        puts_(b, "<|end_header_id|>\n\n");
        put_trimmed(b, m[i].content);
        puts_(b, "<|eot_id|>");
    }
    if (gen)
        puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Llama-2-chat's template: an optional leading system message goes inside
 * the first user turn as <<SYS>>\n{system}\n<</SYS>>\n\n; user turns are
 * {bos}[INST] {content.strip()} [/INST], assistant turns
 * ' ' + {content.strip()} + ' ' + {eos}. */
static kiln_status render_llama2(sbuf *b, const kiln_chat_message *m, size_t n, const char *def_sys,
                                 const kiln_chat_tokens *tok)
{
    const char *sys = def_sys;
    size_t first = 0;
    if (n && !strcmp(m[0].role, "system")) {
        sys = m[0].content;
        first = 1;
    }
    for (size_t i = first; i < n; i++) {
        int user = !strcmp(m[i].role, "user");
        if (!user && strcmp(m[i].role, "assistant"))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "chat template llama2: message %zu is a system message; only the first may be", i);
        if (user != ((i - first) % 2 == 0))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                             "chat template llama2: message %zu: roles must alternate user/assistant/...", i);
        if (user) {
            puts_(b, tok && tok->bos ? tok->bos : "<s>");
            puts_(b, "[INST] ");
            sbuf content = {0};
            if (i == first && sys) {
                puts_(&content, "<<SYS>>\n");
                puts_(&content, sys);
                puts_(&content, "\n<</SYS>>\n\n");
            }
            puts_(&content, m[i].content);
            if (content.failed)
                b->failed = 1;
            else
                put_trimmed(b, content.p);
            free(content.p);
            puts_(b, " [/INST]");
        } else {
            puts_(b, " ");
            put_trimmed(b, m[i].content);
            puts_(b, " ");
            puts_(b, tok && tok->eos ? tok->eos : "</s>");
        }
    }
    return KILN_OK;
}

kiln_status kiln_chat_render(kiln_llm_chat_template tmpl, const kiln_chat_message *msgs, size_t n,
                             int add_generation_prompt, const char *default_system, const kiln_chat_tokens *tokens,
                             char **out, size_t *len)
{
    if (tmpl == KILN_LLM_CHAT_NONE)
        return kiln_fail(KILN_ERROR_UNSUPPORTED,
                         "the engine has no chat template (its config's chat_template is null)");
    for (size_t i = 0; i < n; i++) {
        if (!known_role(msgs[i].role))
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "chat message %zu: unknown role \"%s\"", i,
                             msgs[i].role ? msgs[i].role : "(null)");
        if (!msgs[i].content)
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "chat message %zu has no content", i);
    }
    sbuf b = {0};
    puts_(&b, "");
    switch (tmpl) {
    case KILN_LLM_CHAT_CHATML: render_chatml(&b, msgs, n, add_generation_prompt, default_system); break;
    case KILN_LLM_CHAT_LLAMA3: render_llama3(&b, msgs, n, add_generation_prompt, default_system); break;
    case KILN_LLM_CHAT_LLAMA2: {
        kiln_status s = render_llama2(&b, msgs, n, default_system, tokens);
        if (s != KILN_OK) {
            free(b.p);
            return s;
        }
        break;
    }
    default: free(b.p); return kiln_fail(KILN_ERROR_UNSUPPORTED, "chat template %d is not supported", (int)tmpl);
    }
    if (b.failed) {
        free(b.p);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory rendering a chat");
    }
    *out = b.p;
    *len = b.len;
    return KILN_OK;
}

kiln_status kiln_chat_render_jinja(const kiln_jinja *tmpl, const kiln_chat_message *msgs, size_t n,
                                   int add_generation_prompt, const kiln_chat_tokens *tokens, char **out, size_t *len)
{
    json_t *list = json_array();
    for (size_t i = 0; list && i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            json_decref(list);
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "chat message %zu has no %s", i,
                             msgs[i].role ? "content" : "role");
        }
        json_t *m = json_pack("{s:s,s:s}", "role", msgs[i].role, "content", msgs[i].content);
        if (!m || json_array_append_new(list, m) != 0) {
            json_decref(list);
            return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "chat message %zu is not valid UTF-8", i);
        }
    }
    json_t *vars = list ? json_pack("{s:o,s:b,s:s*,s:s*,s:n,s:n}", "messages", list, "add_generation_prompt",
                                    add_generation_prompt, "bos_token", tokens ? tokens->bos : NULL, "eos_token",
                                    tokens ? tokens->eos : NULL, "tools", "documents")
                        : NULL;
    if (!vars)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory rendering a chat");
    kiln_status s = kiln_jinja_render(tmpl, vars, out, len);
    json_decref(vars);
    return s;
}
