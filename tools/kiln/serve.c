/* kiln serve ENGINE: the OpenAI API over HTTP (src/server, docs/serve.md)
 * until SIGTERM or SIGINT, which drain it. */
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_llm.h"
#include "server/server.h"

static const char serve_help[] =
    "usage: kiln serve ENGINE [options]\n"
    "\n"
    "Serves an LLM engine through the OpenAI API: GET /v1/models, POST\n"
    "/v1/completions and /v1/chat/completions (streaming or not), GET /health\n"
    "and GET /metrics (Prometheus). Requests are batched as they come (in-flight\n"
    "batching). SIGTERM or SIGINT stops accepting, lets requests in flight\n"
    "finish for --drain seconds, cancels the rest and exits 0.\n"
    "\n"
    "options:\n"
    "  --host ADDR              address to listen on (default 127.0.0.1: this machine only)\n"
    "  --port N                 port (default 8000; 0 picks a free one)\n"
    "  --api-key KEY            require \"Authorization: Bearer KEY\" on /v1 (default: the\n"
    "                           KILN_API_KEY environment variable, else none)\n"
    "  --model-name NAME        the model's id in the API (default: the engine's file\n"
    "                           name without its extension)\n"
    "  --max-queue N            requests waiting for a batch slot before 429 (default 1024)\n"
    "  --max-connections N      open connections at once (default 1024)\n"
    "  --timeout S              close a connection idle for S seconds (default 60)\n"
    "  --max-body-mb N          largest request body (default 16)\n"
    "  --drain S                seconds requests may finish after SIGTERM (default 30)\n"
    "  --no-prefix-cache        do not share KV blocks of identical prompt prefixes\n"
    "  --kv-cache-blocks N      exactly N KV-cache blocks (overrides --kv-cache-mb)\n" CLI_LLM_MEMORY_HELP
    "  --plugins LIB            load a plugin library first (repeatable)\n"
    "  -h, --help               show this help\n"
    "\n"
    "sampling of requests that leave a field out (as `kiln run`: llama.cpp's defaults):\n"
    "  --temperature T          0 is greedy (default 0.8)\n"
    "  --top-k K                keep the K most likely tokens, 0 = off (default 40)\n"
    "  --top-p P                keep the smallest set with probability >= P (default 0.95)\n"
    "  --min-p P                keep tokens with p >= P * max p (default 0.05)\n"
    "  --repeat-penalty R       HF repetition penalty (default 1 = off)\n"
    "  --presence-penalty X     OpenAI presence penalty (default 0)\n"
    "  --frequency-penalty X    OpenAI frequency penalty (default 0)\n";

/* The engine's file name without folders and extension. */
static char *default_model_name(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    char *name = strdup(base);
    char *dot = name ? strrchr(name, '.') : NULL;
    if (dot && dot != name)
        *dot = '\0';
    return name;
}

int cli_serve(int argc, char **argv)
{
    static const char *const valued[] = {"--host",
                                         "--port",
                                         "--api-key",
                                         "--model-name",
                                         "--max-queue",
                                         "--max-connections",
                                         "--timeout",
                                         "--max-body-mb",
                                         "--drain",
                                         "--kv-cache-blocks",
                                         "--plugins",
                                         CLI_LLM_MEMORY_VALUED,
                                         CLI_LLM_SAMPLING_VALUED,
                                         NULL};
    cli_args a;
    cli_args_init(&a, "serve", argc, argv);
    const char *opt, *val;
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    int n_libs = 0, help = 0;
    long long drain = 30, n;
    kiln_server_options so;
    kiln_server_options_init(&so);
    so.api_key = getenv("KILN_API_KEY");
    if (so.api_key && !so.api_key[0])
        so.api_key = NULL;
    kiln_llm_options lo;
    kiln_llm_options_init(&lo);
    cli_llm_sampling_default(&so.sampling);
    int st = libs ? CLI_OK : cli_error("out of memory");
    while (st == CLI_OK && (opt = cli_args_next(&a, valued, &val))) {
        int handled = 0;
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help"))
            help = 1;
        else if (!strcmp(opt, "--host"))
            so.host = val;
        else if (!strcmp(opt, "--port") && (st = cli_parse_range("serve", opt, val, 0, 65535, &n)) == CLI_OK)
            so.port = (int)n;
        else if (!strcmp(opt, "--api-key")) {
            so.api_key = val;
            if (!val[0])
                st = cli_usage("serve", "--api-key is empty");
        } else if (!strcmp(opt, "--model-name")) {
            so.model_name = val;
            if (!val[0] || strlen(val) > 200)
                st = cli_usage("serve", "--model-name must be 1 to 200 bytes");
        } else if (!strcmp(opt, "--max-queue") && (st = cli_parse_range("serve", opt, val, 1, 1000000, &n)) == CLI_OK)
            so.max_queue = (int)n;
        else if (!strcmp(opt, "--max-connections") &&
                 (st = cli_parse_range("serve", opt, val, 1, 1000000, &n)) == CLI_OK)
            so.max_connections = (int)n;
        else if (!strcmp(opt, "--timeout") && (st = cli_parse_range("serve", opt, val, 1, 86400, &n)) == CLI_OK)
            so.timeout_s = (unsigned)n;
        else if (!strcmp(opt, "--max-body-mb") && (st = cli_parse_range("serve", opt, val, 1, 1024, &n)) == CLI_OK)
            so.max_body = (size_t)n << 20;
        else if (!strcmp(opt, "--drain"))
            st = cli_parse_range("serve", opt, val, 0, 86400, &drain);
        else if (!strcmp(opt, "--no-prefix-cache"))
            so.prefix_caching = 0;
        else if (!strcmp(opt, "--kv-cache-blocks") &&
                 (st = cli_parse_range("serve", opt, val, 1, 1 << 24, &n)) == CLI_OK)
            lo.kv_cache_blocks = (int32_t)n;
        else if (!strcmp(opt, "--plugins"))
            libs[n_libs++] = val;
        else if (!strcmp(opt, "--seed"))
            st = cli_usage("serve", "--seed: each request gives its own seed, or gets a fresh one");
        else if (st == CLI_OK && (st = cli_llm_memory_option("serve", opt, val, &lo, &handled)) == CLI_OK && !handled &&
                 (st = cli_llm_sampling_option("serve", opt, val, &so.sampling, &handled)) == CLI_OK && !handled)
            st = cli_usage("serve", "unknown option %s", opt);
    }
    if (st == CLI_OK && help)
        fputs(serve_help, stdout);
    else if (st == CLI_OK && a.n_positional != 1)
        st = cli_usage("serve", "expected one ENGINE, got %d arguments", a.n_positional);
    if (st != CLI_OK || help) {
        free(libs);
        cli_args_free(&a);
        return st;
    }

    char *name = so.model_name ? NULL : default_model_name(a.positional[0]);
    if (!so.model_name)
        so.model_name = name;
    /* Signals go to sigwait below: blocked before any thread starts, so
     * every thread inherits the mask. A client gone mid-write must not
     * kill the process. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    kiln_registry *reg = NULL;
    kiln_llm *llm = NULL;
    kiln_server *srv = NULL;
    st = so.model_name ? cli_llm_open(a.positional[0], libs, n_libs, &lo, &reg, &llm) : cli_error("out of memory");
    char err[512];
    if (st == CLI_OK && kiln_server_start(llm, &so, &srv, err, sizeof err) != 0)
        st = cli_error("%s", err);
    if (st == CLI_OK) {
        cli_llm_print_cache(llm);
        fprintf(stderr, "kiln: serving %s on http://%s%s%s:%d/v1 (max queue %d%s); SIGTERM drains\n", so.model_name,
                strchr(so.host, ':') ? "[" : "", so.host, strchr(so.host, ':') ? "]" : "", kiln_server_port(srv),
                so.max_queue, so.api_key ? ", API key required" : "");
        fflush(stderr);
        int sig = 0;
        sigwait(&stop_signals, &sig);
        fprintf(stderr, "kiln: %s: draining (up to %lld s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", drain);
        kiln_server_stop(srv, (double)drain);
        fprintf(stderr, "kiln: stopped\n");
    }
    kiln_llm_close(llm);
    kiln_registry_destroy(reg);
    free(name);
    free(libs);
    cli_args_free(&a);
    return st;
}
