/* kiln: build, run, inspect engines and list plugins. Dispatches to one
 * file per subcommand. Exit status: 0 success, 1 failure, 2 usage. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char top_help[] = "usage: kiln <command> [options]\n"
                               "\n"
                               "commands:\n"
                               "  build     build a network JSON file into an engine\n"
                               "  exec      load an engine, run it, time it, optionally check it\n"
                               "  inspect   describe what an engine holds\n"
                               "  plugins   list registered plugin creators and their fields\n"
                               "  run       generate text with an LLM engine\n"
                               "  chat      chat with an LLM engine (reads messages from stdin)\n"
                               "  tokenize  print the token ids of a text (LLM engines)\n"
                               "  detokenize  print the text of token ids (LLM engines)\n"
                               "  bench     time prefill and decode of an LLM engine against its bandwidth floor\n"
                               "  perplexity  perplexity of an LLM engine on a text, or two engines compared\n"
#ifdef KILN_HAVE_SERVE
                               "  serve     serve an LLM engine over HTTP with the OpenAI API\n"
#endif
                               "\n"
                               "Run `kiln <command> --help` for a command's options. Errors are one line\n"
                               "starting `kiln: error:`; exit status 0 is success, 1 failure, 2 a usage error.\n";

/* ---- errors ---------------------------------------------------------------------- */

int cli_error(const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    fprintf(stderr, "kiln: error: %s\n", msg);
    return CLI_FAILURE;
}

int cli_usage(const char *cmd, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (cmd)
        cli_error("%s: %s (see `kiln %s --help`)", cmd, msg, cmd);
    else
        cli_error("%s (see `kiln --help`)", msg);
    return CLI_USAGE;
}

int cli_kiln_error(void)
{
    const char *msg = kiln_last_error();
    return cli_error("%s", msg[0] ? msg : "unknown failure");
}

/* ---- options ------------------------------------------------------------------------ */

void cli_args_init(cli_args *a, const char *cmd, int argc, char **argv)
{
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->argc = argc;
    a->argv = argv;
    a->i = 1;
    a->positional = calloc((size_t)(argc > 0 ? argc : 1), sizeof *a->positional);
}

void cli_args_free(cli_args *a) { free(a->positional); }

const char *cli_args_next(cli_args *a, const char *const *valued, const char **value)
{
    *value = NULL;
    while (a->i < a->argc) {
        char *arg = a->argv[a->i++];
        if (strcmp(arg, "--") == 0) {
            while (a->i < a->argc)
                a->positional[a->n_positional++] = a->argv[a->i++];
            return NULL;
        }
        if (arg[0] != '-' || arg[1] == '\0') {
            a->positional[a->n_positional++] = arg;
            continue;
        }
        char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        for (const char *const *v = valued; *v; v++) {
            if (strlen(*v) != len || strncmp(*v, arg, len) != 0)
                continue;
            if (eq) {
                *value = eq + 1;
            } else if (a->i < a->argc) {
                *value = a->argv[a->i++];
            } else {
                a->status = cli_usage(a->cmd, "option %s needs a value", *v);
                return NULL;
            }
            return *v;
        }
        if (eq) {
            a->status = cli_usage(a->cmd, "option %.*s takes no value", (int)len, arg);
            return NULL;
        }
        return arg;
    }
    return NULL;
}

int cli_parse_range(const char *cmd, const char *opt, const char *text, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end)
        return cli_usage(cmd, "%s expects an integer, got \"%s\"", opt, text);
    if (errno == ERANGE || v < lo || v > hi)
        return cli_usage(cmd, "%s %s is outside its limits %lld..%lld", opt, text, lo, hi);
    *out = v;
    return CLI_OK;
}

int cli_parse_count(const char *cmd, const char *opt, const char *text, long *out)
{
    long long v = 0; /* set when cli_parse_range succeeds (GCC -O3: maybe-uninitialized) */
    int st = cli_parse_range(cmd, opt, text, 0, CLI_COUNT_MAX, &v);
    if (st == CLI_OK)
        *out = (long)v;
    return st;
}

int cli_registry(const char *const *libs, int n_libs, kiln_registry **out)
{
    kiln_registry *reg = NULL;
    if (kiln_registry_create(&reg) != KILN_OK)
        return cli_kiln_error();
    for (int i = 0; i < n_libs; i++) {
        if (kiln_registry_load_library(reg, libs[i]) != KILN_OK) {
            cli_kiln_error();
            kiln_registry_destroy(reg);
            return CLI_FAILURE;
        }
    }
    *out = reg;
    return CLI_OK;
}

/* ---- dispatch ------------------------------------------------------------------------- */

static int dispatch(int argc, char **argv)
{
    if (argc < 2)
        return cli_usage(NULL, "missing command");
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(top_help, stdout);
        return CLI_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("kiln %s\n", kiln_version());
        return CLI_OK;
    }
    if (strcmp(cmd, "build") == 0)
        return cli_build(argc - 1, argv + 1);
    if (strcmp(cmd, "exec") == 0)
        return cli_exec(argc - 1, argv + 1);
    if (strcmp(cmd, "inspect") == 0)
        return cli_inspect(argc - 1, argv + 1);
    if (strcmp(cmd, "plugins") == 0)
        return cli_plugins(argc - 1, argv + 1);
    if (strcmp(cmd, "run") == 0)
        return cli_run(argc - 1, argv + 1);
    if (strcmp(cmd, "chat") == 0)
        return cli_chat(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0)
        return cli_tokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "detokenize") == 0)
        return cli_detokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return cli_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "perplexity") == 0)
        return cli_perplexity(argc - 1, argv + 1);
#ifdef KILN_HAVE_SERVE
    if (strcmp(cmd, "serve") == 0)
        return cli_serve(argc - 1, argv + 1);
#else
    if (strcmp(cmd, "serve") == 0)
        return cli_error("this kiln was built without libmicrohttpd: `kiln serve` is not available");
#endif
    return cli_usage(NULL, "unknown command \"%s\"", cmd);
}

int main(int argc, char **argv)
{
    cli_io_init();
    return cli_finish_stdout(dispatch(argc, argv));
}
