/* kiln chat ENGINE: an interactive chat. Reads one user message per line
 * from stdin (a terminal or a pipe), answers with the engine's chat
 * template, and keeps the conversation; /exit or end of input ends it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_llm.h"

static const char chat_help[] =
    "usage: kiln chat ENGINE [options]\n"
    "\n"
    "Chats with an LLM engine through its chat template: each line read from\n"
    "stdin is a user message, the answer streams to stdout; the conversation is\n"
    "kept until /exit or the end of input. /reset starts over.\n"
    "\n"
    "options:\n"
    "  --system TEXT            system message\n"
    "  -n, --max-tokens N       tokens per answer at most (default 512)\n"
    CLI_LLM_SAMPLING_HELP
    CLI_LLM_MEMORY_HELP
    "  --plugins LIB            load a plugin library first (repeatable)\n"
    "  -h, --help               show this help\n";

typedef struct conversation {
    kiln_llm_message **msgs;
    char **owned;          /* the contents this side copied */
    size_t n, cap;
} conversation;

static int conv_add(conversation *c, const char *role, const char *content, size_t len)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        kiln_llm_message **m = realloc(c->msgs, sizeof *m * cap);
        if (m)
            c->msgs = m;
        char **o = realloc(c->owned, sizeof *o * cap);
        if (o)
            c->owned = o;
        if (!m || !o)
            return cli_error("out of memory");
        c->cap = cap;
    }
    char *copy = malloc(len + 1);
    kiln_llm_message *m = malloc(sizeof *m);
    if (!copy || !m) {
        free(copy);
        free(m);
        return cli_error("out of memory");
    }
    memcpy(copy, content, len);
    copy[len] = '\0';
    kiln_llm_message_init(m);
    m->role = role;
    m->content = copy;
    c->owned[c->n] = copy;
    c->msgs[c->n++] = m;
    return CLI_OK;
}

static void conv_truncate(conversation *c, size_t n)
{
    while (c->n > n) {
        c->n--;
        free(c->owned[c->n]);
        free(c->msgs[c->n]);
    }
}

static int chat_loop(kiln_llm *llm, const char *system, long max_tokens, kiln_llm_sampling samp,
                     const char *const *stops, int n_stops)
{
    conversation c = {0};
    int st = system ? conv_add(&c, "system", system, strlen(system)) : CLI_OK;
    size_t base = c.n;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    while (st == CLI_OK && (len = getline(&line, &line_cap, stdin)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit"))
            break;
        if (!strcmp(line, "/reset")) {
            conv_truncate(&c, base);
            continue;
        }
        if (len == 0)
            continue;
        if ((st = conv_add(&c, "user", line, (size_t)len)) != CLI_OK)
            break;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        kiln_llm_request req;
        kiln_llm_request_init(&req);
        if (kiln_llm_chat_tokenize(llm, (const kiln_llm_message *const *)c.msgs, c.n, &ids, &n_ids) != KILN_OK) {
            st = cli_kiln_error();
            break;
        }
        if ((st = cli_llm_fit_max_tokens(llm, n_ids, max_tokens, &req.max_tokens)) != CLI_OK) {
            kiln_free(ids);
            break;
        }
        req.prompt_ids = ids;
        req.n_prompt_ids = n_ids;
        req.sampling = &samp;
        req.stop = stops;
        req.n_stop = n_stops;
        const kiln_llm_request *reqs[1] = {&req};
        kiln_llm_result *res = NULL;
        kiln_status s = kiln_llm_generate(llm, reqs, 1, cli_llm_print_token, NULL, &res);
        samp.seed++; /* a fresh draw each turn, reproducible from --seed */
        kiln_free(ids);
        if (s != KILN_OK) {
            st = cli_kiln_error();
            break;
        }
        putchar('\n');
        fflush(stdout);
        cli_llm_print_speed(res);
        st = conv_add(&c, "assistant", res->text, res->text_len);
        kiln_llm_result_free(res);
    }
    free(line);
    conv_truncate(&c, 0);
    free(c.msgs);
    free(c.owned);
    return st;
}

int cli_chat(int argc, char **argv)
{
    static const char *const valued[] = {"-n", "--max-tokens", "--system", "--plugins", "--stop",
                                         CLI_LLM_MEMORY_VALUED, CLI_LLM_SAMPLING_VALUED, NULL};
    cli_args a;
    cli_args_init(&a, "chat", argc, argv);
    const char *opt, *val, *system = NULL;
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    const char **stops = calloc((size_t)argc + 1, sizeof *stops);
    int n_libs = 0, n_stops = 0, help = 0;
    long max_tokens = 512;
    kiln_llm_options lo;
    kiln_llm_options_init(&lo);
    kiln_llm_sampling samp;
    cli_llm_sampling_default(&samp);
    int st = libs && stops ? CLI_OK : cli_error("out of memory");
    while (st == CLI_OK && (opt = cli_args_next(&a, valued, &val))) {
        int handled = 0;
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help"))
            help = 1;
        else if (!strcmp(opt, "-n") || !strcmp(opt, "--max-tokens"))
            st = cli_parse_count("chat", opt, val, &max_tokens);
        else if (!strcmp(opt, "--system"))
            system = val;
        else if (!strcmp(opt, "--plugins"))
            libs[n_libs++] = val;
        else if (!strcmp(opt, "--stop"))
            stops[n_stops++] = val;
        else if ((st = cli_llm_memory_option("chat", opt, val, &lo, &handled)) == CLI_OK && !handled &&
                 (st = cli_llm_sampling_option("chat", opt, val, &samp, &handled)) == CLI_OK && !handled)
            st = cli_usage("chat", "unknown option %s", opt);
    }
    if (st == CLI_OK && a.status)
        st = a.status;
    if (st == CLI_OK && help)
        fputs(chat_help, stdout);
    else if (st == CLI_OK && a.n_positional != 1)
        st = cli_usage("chat", "expected one ENGINE, got %d arguments", a.n_positional);
    else if (st == CLI_OK && max_tokens < 1)
        st = cli_usage("chat", "-n must be >= 1");
    kiln_registry *reg = NULL;
    kiln_llm *llm = NULL;
    if (st == CLI_OK && !help)
        st = cli_llm_open(a.positional[0], libs, n_libs, &lo, &reg, &llm);
    if (st == CLI_OK && !help) {
        if (!kiln_llm_info_get(llm)->chat_template)
            st = cli_error("%s has no chat template (its config's chat_template is null); use `kiln run`",
                           a.positional[0]);
        else {
            cli_llm_print_cache(llm);
            st = chat_loop(llm, system, max_tokens, samp, stops, n_stops);
        }
    }
    kiln_llm_close(llm);
    kiln_registry_destroy(reg);
    free(libs);
    free(stops);
    cli_args_free(&a);
    return st;
}
