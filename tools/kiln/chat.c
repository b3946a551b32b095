/* kiln chat ENGINE: an interactive chat. Reads one user message per line
 * from stdin (a terminal or a pipe), answers with the engine's chat
 * template, and keeps the conversation; /exit or end of input ends it. */
#include <stdint.h>
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
    "kept until /exit or the end of input. /reset starts over. When the\n"
    "conversation outgrows the engine's context the oldest turns are dropped\n"
    "(with a warning); a message that cannot be used (not UTF-8, longer than\n"
    "1 MiB, or alone too long for the context) is skipped with a warning.\n"
    "\n"
    "options:\n"
    "  --system TEXT            system message\n"
    "  -n, --max-tokens N       tokens per answer at most (default 512)\n" CLI_LLM_SAMPLING_HELP CLI_LLM_MEMORY_HELP
    "  --plugins LIB            load a plugin library first (repeatable)\n"
    "  -h, --help               show this help\n";

typedef struct conversation {
    kiln_llm_message **msgs;
    char **owned; /* the contents this side copied */
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

/* Removes messages [at, at + k). */
static void conv_remove(conversation *c, size_t at, size_t k)
{
    for (size_t i = at; i < at + k; i++) {
        free(c->owned[i]);
        free(c->msgs[i]);
    }
    memmove(c->msgs + at, c->msgs + at + k, sizeof *c->msgs * (c->n - at - k));
    memmove(c->owned + at, c->owned + at + k, sizeof *c->owned * (c->n - at - k));
    c->n -= k;
}

/* A message longer than this is skipped unread, so one huge line cannot
 * take the memory of the session. */
#define CHAT_MAX_LINE (1u << 20)

/* Reads one line without its end of line into *line (at most
 * CHAT_MAX_LINE bytes kept; *too_long set when more were discarded).
 * Returns 0 at the end of input. */
static int read_line(char **line, size_t *cap, size_t *len, int *too_long)
{
    int ch, any = 0;
    *len = 0;
    *too_long = 0;
    while ((ch = getchar()) != EOF) {
        any = 1;
        if (ch == '\n')
            break;
        if (*len == CHAT_MAX_LINE) {
            *too_long = 1;
            continue;
        }
        if (*len + 1 >= *cap) {
            size_t ncap = *cap ? *cap * 2 : 256;
            char *n = realloc(*line, ncap);
            if (!n)
                return -1;
            *line = n;
            *cap = ncap;
        }
        (*line)[(*len)++] = (char)ch;
    }
    if (!any)
        return 0;
    while (*len > 0 && (*line)[*len - 1] == '\r')
        (*len)--;
    if (*line)
        (*line)[*len] = '\0';
    return 1;
}

/* Offset of the first byte of s that is not well-formed UTF-8 (RFC 3629:
 * no overlong forms, surrogates or code points past U+10FFFF), or len. */
static size_t utf8_invalid_at(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (n == 0 || i + n > len)
            return i;
        uint32_t cp = n == 1 ? c : c & (0x7fu >> n);
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return i;
            cp = cp << 6 | (s[i + k] & 0x3fu);
        }
        static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < least[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += n;
    }
    return len;
}

/* A message that cannot be answered is reported in one line and the
 * session goes on. */
static void chat_skip(size_t line_no, const char *why)
{
    fprintf(stderr, "kiln: warning: line %zu skipped: %s\n", line_no, why);
}

/* Tokenizes the conversation, dropping the oldest turns (after the system
 * message, from `base`) until the prompt leaves room to answer: at least
 * `room` tokens or, with only the newest message left, at least one.
 * Returns CLI_OK with *ids set, CLI_USAGE when the newest message alone
 * does not fit (it is then removed), CLI_FAILURE on other errors (printed
 * as a warning and the message removed). */
static int fit_conversation(kiln_llm *llm, conversation *c, size_t base, size_t room, size_t line_no, int32_t **ids,
                            size_t *n_ids)
{
    size_t max = (size_t)kiln_llm_info_get(llm)->max_seq_len, dropped = 0;
    for (;;) {
        if (kiln_llm_chat_tokenize(llm, (const kiln_llm_message *const *)c->msgs, c->n, ids, n_ids) != KILN_OK) {
            chat_skip(line_no, kiln_last_error());
            conv_truncate(c, c->n - 1);
            return CLI_FAILURE;
        }
        int only_newest = c->n - base <= 1;
        if (*n_ids + (only_newest ? 1 : room) <= max)
            break;
        kiln_free(*ids);
        *ids = NULL;
        if (only_newest) {
            char why[160];
            snprintf(why, sizeof why, "the message takes %zu tokens; the engine's max sequence length is %zu", *n_ids,
                     max);
            chat_skip(line_no, why);
            conv_truncate(c, c->n - 1);
            return CLI_USAGE;
        }
        /* The oldest exchange: a user message and its answer. */
        conv_remove(c, base, c->n - base >= 3 ? 2 : 1);
        dropped++;
    }
    if (dropped == 1)
        fprintf(stderr, "kiln: warning: the conversation no longer fit in %zu tokens: dropped the oldest turn\n", max);
    else if (dropped)
        fprintf(stderr,
                "kiln: warning: the conversation no longer fit in %zu tokens: dropped the %zu oldest "
                "turns\n",
                max, dropped);
    return CLI_OK;
}

static int chat_loop(kiln_llm *llm, const char *system, long max_tokens, kiln_llm_sampling samp,
                     const char *const *stops, int n_stops)
{
    conversation c = {0};
    int st = system ? conv_add(&c, "system", system, strlen(system)) : CLI_OK;
    size_t base = c.n, line_no = 0, len;
    char *line = NULL;
    size_t line_cap = 0;
    int too_long, got;
    size_t max_seq = (size_t)kiln_llm_info_get(llm)->max_seq_len;
    /* Room kept for an answer when old turns must go: the answer's limit,
     * but never more than half the context. */
    size_t room = (size_t)max_tokens < max_seq / 2 ? (size_t)max_tokens : max_seq / 2;
    while (st == CLI_OK && (got = read_line(&line, &line_cap, &len, &too_long)) != 0) {
        if (got < 0) {
            st = cli_error("out of memory reading a message");
            break;
        }
        line_no++;
        if (too_long) {
            char why[96];
            snprintf(why, sizeof why, "longer than %u bytes", CHAT_MAX_LINE);
            chat_skip(line_no, why);
            continue;
        }
        if (len == 0)
            continue;
        size_t bad = utf8_invalid_at((const unsigned char *)line, len);
        if (bad < len) {
            char why[96];
            snprintf(why, sizeof why, "not valid UTF-8 at byte %zu", bad);
            chat_skip(line_no, why);
            continue;
        }
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit"))
            break;
        if (!strcmp(line, "/reset")) {
            conv_truncate(&c, base);
            continue;
        }
        if ((st = conv_add(&c, "user", line, len)) != CLI_OK)
            break;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (fit_conversation(llm, &c, base, room, line_no, &ids, &n_ids) != CLI_OK)
            continue;
        kiln_llm_request req;
        kiln_llm_request_init(&req);
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
    static const char *const valued[] = {
        "-n", "--max-tokens", "--system", "--plugins", "--stop", CLI_LLM_MEMORY_VALUED, CLI_LLM_SAMPLING_VALUED, NULL};
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
