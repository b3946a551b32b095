/* kiln tokenize ENGINE TEXT and kiln detokenize ENGINE ID...: the engine's
 * own tokenizer, from the command line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_llm.h"

static const char tokenize_help[] = "usage: kiln tokenize ENGINE TEXT [--no-add-special] [--split-special]\n"
                                    "\n"
                                    "Prints the token ids of TEXT as a JSON array, as Hugging Face's\n"
                                    "tokenizer.encode(TEXT) gives them: added tokens such as BOS included and\n"
                                    "special tokens written in the text parsed.\n"
                                    "\n"
                                    "options:\n"
                                    "  --no-add-special  add no BOS/EOS (HF add_special_tokens=False); special\n"
                                    "                    tokens written in the text are still parsed\n"
                                    "  --split-special   special tokens written in the text are plain text\n"
                                    "                    (HF split_special_tokens=True)\n"
                                    "  --plugins LIB    load a plugin library first (repeatable)\n"
                                    "  -h, --help       show this help\n";

static const char detokenize_help[] = "usage: kiln detokenize ENGINE ID...\n"
                                      "\n"
                                      "Prints the text of the token ids (special tokens included).\n"
                                      "\n"
                                      "options:\n"
                                      "  --plugins LIB    load a plugin library first (repeatable)\n"
                                      "  -h, --help       show this help\n";

/* Tokenizing needs no cache and no decode graphs. */
static kiln_llm_options tokenize_only(void)
{
    kiln_llm_options o;
    kiln_llm_options_init(&o);
    o.kv_cache_blocks = 1;
    o.no_cuda_graphs = 1;
    return o;
}

/* Options both commands take; *flags (the tokenize flags, NULL for
 * detokenize) starts at the defaults and loses what the switches turn off. */
static int parse(const char *cmd, int argc, char **argv, cli_args *a, const char **libs, int *n_libs, uint32_t *flags,
                 int *help)
{
    static const char *const valued[] = {"--plugins", NULL};
    const char *opt, *val;
    cli_args_init(a, cmd, argc, argv);
    while ((opt = cli_args_next(a, valued, &val))) {
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help"))
            *help = 1;
        else if (!strcmp(opt, "--plugins"))
            libs[(*n_libs)++] = val;
        else if (flags && !strcmp(opt, "--no-add-special"))
            *flags &= ~(uint32_t)KILN_LLM_TOKENIZE_ADD_SPECIAL;
        else if (flags && !strcmp(opt, "--split-special"))
            *flags &= ~(uint32_t)KILN_LLM_TOKENIZE_PARSE_SPECIAL;
        else if (opt[1] >= '0' && opt[1] <= '9' && !flags)
            a->positional[a->n_positional++] = opt; /* a negative id: refused below */
        else
            return cli_usage(cmd, "unknown option %s", opt);
    }
    return a->status;
}

int cli_tokenize(int argc, char **argv)
{
    cli_args a;
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    int n_libs = 0, help = 0;
    uint32_t flags = KILN_LLM_TOKENIZE_ADD_SPECIAL | KILN_LLM_TOKENIZE_PARSE_SPECIAL;
    if (!libs)
        return cli_error("out of memory");
    int st = parse("tokenize", argc, argv, &a, libs, &n_libs, &flags, &help);
    if (st == CLI_OK && help)
        fputs(tokenize_help, stdout);
    else if (st == CLI_OK && a.n_positional != 2)
        st = cli_usage("tokenize", "expected ENGINE TEXT, got %d arguments", a.n_positional);
    kiln_registry *reg = NULL;
    kiln_llm *llm = NULL;
    kiln_llm_options lo = tokenize_only();
    if (st == CLI_OK && !help)
        st = cli_llm_open(a.positional[0], libs, n_libs, &lo, &reg, &llm);
    if (st == CLI_OK && !help) {
        int32_t *ids = NULL;
        size_t n = 0;
        const char *text = a.positional[1];
        if (kiln_llm_tokenize(llm, text, strlen(text), flags, &ids, &n) != KILN_OK) {
            st = cli_kiln_error();
        } else {
            putchar('[');
            for (size_t i = 0; i < n; i++)
                printf(i ? ", %d" : "%d", (int)ids[i]);
            puts("]");
        }
        kiln_free(ids);
    }
    kiln_llm_close(llm);
    kiln_registry_destroy(reg);
    free(libs);
    cli_args_free(&a);
    return st;
}

int cli_detokenize(int argc, char **argv)
{
    cli_args a;
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    int32_t *ids = calloc((size_t)argc + 1, sizeof *ids);
    int n_libs = 0, help = 0;
    if (!libs || !ids) {
        free(libs);
        free(ids);
        return cli_error("out of memory");
    }
    int st = parse("detokenize", argc, argv, &a, libs, &n_libs, NULL, &help);
    if (st == CLI_OK && help)
        fputs(detokenize_help, stdout);
    else if (st == CLI_OK && a.n_positional < 1)
        st = cli_usage("detokenize", "expected ENGINE ID...");
    for (int i = 1; st == CLI_OK && !help && i < a.n_positional; i++) {
        long long v = 0;
        st = cli_parse_range("detokenize", "token id", a.positional[i], 0, INT32_MAX, &v);
        ids[i - 1] = (int32_t)v;
    }
    kiln_registry *reg = NULL;
    kiln_llm *llm = NULL;
    kiln_llm_options lo = tokenize_only();
    if (st == CLI_OK && !help)
        st = cli_llm_open(a.positional[0], libs, n_libs, &lo, &reg, &llm);
    if (st == CLI_OK && !help) {
        char *text = NULL;
        size_t len = 0;
        if (kiln_llm_detokenize(llm, ids, (size_t)(a.n_positional - 1), &text, &len) != KILN_OK) {
            st = cli_kiln_error();
        } else {
            fwrite(text, 1, len, stdout);
            putchar('\n');
        }
        kiln_free(text);
    }
    kiln_llm_close(llm);
    kiln_registry_destroy(reg);
    free(libs);
    free(ids);
    cli_args_free(&a);
    return st;
}
