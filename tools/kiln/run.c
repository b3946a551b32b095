/* kiln run ENGINE -p PROMPT: generate text with an LLM engine, streaming it
 * to stdout (or one JSON object with --json). Also the pieces `chat` and
 * `tokenize` share: opening an LLM engine and the sampling options. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_llm.h"

static const char run_help[] =
    "usage: kiln run ENGINE -p PROMPT [options]\n"
    "\n"
    "Generates text with an LLM engine and streams it to stdout; prompt and\n"
    "generation speed (tok/s) go to stderr.\n"
    "\n"
    "options:\n"
    "  -p, --prompt TEXT        the prompt (special tokens such as <|im_start|> are parsed)\n"
    "  -n, --max-tokens N       tokens to generate at most (default 128; fewer when the\n"
    "                           engine's max sequence length leaves less room)\n"
    "  --chat                   wrap the prompt in the engine's chat template as a user turn\n"
    "  --system TEXT            system message for --chat\n" CLI_LLM_SAMPLING_HELP CLI_LLM_MEMORY_HELP
    "  --plugins LIB            load a plugin library first (repeatable)\n"
    "  --json                   print one JSON object (prompt_ids, generated_ids, text,\n"
    "                           finish_reason, timings, kv_cache, backend, cuda_graphs)\n"
    "                           instead of streaming\n"
    "  -h, --help               show this help\n";

/* ---- shared with chat and tokenize ------------------------------------------------------ */

int cli_llm_memory_option(const char *cmd, const char *opt, const char *value, kiln_llm_options *o, int *handled)
{
    *handled = 1;
    if (!strcmp(opt, "--kv-cache-mb")) {
        long mb;
        int st = cli_parse_count(cmd, opt, value, &mb);
        o->kv_cache_mb = (size_t)mb;
        return st;
    }
    if (!strcmp(opt, "--kv-cache-fraction")) {
        char *end;
        double f = strtod(value, &end);
        if (end == value || *end || !(f > 0 && f <= 1))
            return cli_usage(cmd, "--kv-cache-fraction expects a number in (0, 1], got \"%s\"", value);
        o->kv_cache_fraction = (float)f;
        return CLI_OK;
    }
    if (!strcmp(opt, "--no-cuda-graphs")) {
        o->no_cuda_graphs = 1;
        return CLI_OK;
    }
    if (!strcmp(opt, "--threads")) {
        long long n;
        int st = cli_parse_range(cmd, opt, value, 1, 1024, &n);
        if (st == CLI_OK)
            o->n_threads = (int32_t)n;
        return st;
    }
    *handled = 0;
    return CLI_OK;
}

int cli_llm_open(const char *path, const char *const *libs, int n_libs, const kiln_llm_options *opt,
                 kiln_registry **reg, kiln_llm **llm)
{
    int st = cli_registry(libs, n_libs, reg);
    if (st != CLI_OK)
        return st;
    if (kiln_llm_open(*reg, path, opt, llm) != KILN_OK) {
        cli_kiln_error();
        kiln_registry_destroy(*reg);
        *reg = NULL;
        return CLI_FAILURE;
    }
    return CLI_OK;
}

void cli_llm_sampling_default(kiln_llm_sampling *s)
{
    /* llama.cpp's defaults. */
    kiln_llm_sampling_init(s);
    s->temperature = 0.8f;
    s->top_k = 40;
    s->top_p = 0.95f;
    s->min_p = 0.05f;
    s->repetition_penalty = 1.0f;
    s->seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
}

static int parse_float(const char *cmd, const char *opt, const char *text, double lo, double hi, float *out)
{
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !(v >= lo && v <= hi))
        return cli_usage(cmd, "%s expects a number in [%g, %g], got \"%s\"", opt, lo, hi, text);
    *out = (float)v;
    return CLI_OK;
}

int cli_llm_sampling_option(const char *cmd, const char *opt, const char *value, kiln_llm_sampling *s, int *handled)
{
    *handled = 1;
    if (!strcmp(opt, "--temperature"))
        return parse_float(cmd, opt, value, 0, 100, &s->temperature);
    if (!strcmp(opt, "--top-p"))
        return parse_float(cmd, opt, value, 0, 1, &s->top_p);
    if (!strcmp(opt, "--min-p"))
        return parse_float(cmd, opt, value, 0, 1, &s->min_p);
    if (!strcmp(opt, "--repeat-penalty"))
        return parse_float(cmd, opt, value, 0.01, 100, &s->repetition_penalty);
    if (!strcmp(opt, "--presence-penalty"))
        return parse_float(cmd, opt, value, -100, 100, &s->presence_penalty);
    if (!strcmp(opt, "--frequency-penalty"))
        return parse_float(cmd, opt, value, -100, 100, &s->frequency_penalty);
    if (!strcmp(opt, "--top-k")) {
        long long k;
        int st = cli_parse_range(cmd, opt, value, 0, INT32_MAX, &k);
        if (st == CLI_OK)
            s->top_k = (int32_t)k;
        return st;
    }
    if (!strcmp(opt, "--seed")) {
        /* Every 64-bit seed, none clamped: strtoull saturates silently. */
        char *end;
        errno = 0;
        unsigned long long u = strtoull(value, &end, 10);
        if (end == value || *end || value[0] == '-' || value[0] == '+')
            return cli_usage(cmd, "--seed expects an integer, got \"%s\"", value);
        if (errno == ERANGE)
            return cli_usage(cmd, "--seed %s is outside its limits 0..%llu", value, (unsigned long long)UINT64_MAX);
        s->seed = (uint64_t)u;
        return CLI_OK;
    }
    *handled = 0;
    return CLI_OK;
}

int cli_llm_print_token(void *user, int32_t request, int32_t token, const char *text, size_t len)
{
    (void)user;
    (void)request;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

void cli_llm_print_speed(const kiln_llm_result *r)
{
    fprintf(stderr, "prompt: %zu tokens, %.1f tok/s; generation: %zu tokens, %.1f tok/s (%s)\n", r->n_prompt_ids,
            r->prompt_tok_s, r->n_ids, r->generate_tok_s, kiln_llm_finish_name(r->finish));
}

void cli_llm_print_cache(const kiln_llm *llm)
{
    const kiln_llm_info *info = kiln_llm_info_get(llm);
    fprintf(stderr, "kv cache: %.1f MB, %d blocks of %d tokens = %lld tokens (max %d sequences of %d)",
            (double)info->cache_bytes / (1024.0 * 1024.0), (int)info->n_blocks, (int)info->block_size,
            (long long)info->cache_tokens, (int)info->max_batch, (int)info->max_seq_len);
    if (info->n_threads)
        fprintf(stderr, "; %d threads", (int)info->n_threads);
    if (info->n_graphs)
        fprintf(stderr, "; cuda graphs: %d batch sizes captured in %.1f ms, %zu launches per decode step",
                (int)info->n_graphs, info->graph_capture_ms, info->graph_nodes);
    fputc('\n', stderr);
}

int cli_llm_fit_max_tokens(const kiln_llm *llm, size_t n_prompt, long want, int32_t *out)
{
    const kiln_llm_info *info = kiln_llm_info_get(llm);
    if (n_prompt >= (size_t)info->max_seq_len)
        return cli_error("prompt of %zu tokens exceeds the engine's max sequence length %d", n_prompt,
                         (int)info->max_seq_len);
    long room = (long)info->max_seq_len - (long)n_prompt;
    *out = (int32_t)(want < room ? want : room);
    return CLI_OK;
}

/* ---- run --------------------------------------------------------------------------------- */

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static int print_json(const kiln_llm *llm, const kiln_llm_result *r, uint64_t seed)
{
    const kiln_llm_info *info = kiln_llm_info_get(llm);
    json_t *o = json_object();
    json_object_set_new(o, "prompt_ids", ids_json(r->prompt_ids, r->n_prompt_ids));
    json_object_set_new(o, "generated_ids", ids_json(r->ids, r->n_ids));
    json_object_set_new(o, "text", json_stringn(r->text, r->text_len));
    json_object_set_new(o, "finish_reason", json_string(kiln_llm_finish_name(r->finish)));
    json_object_set_new(o, "seed", json_integer((json_int_t)(seed & 0x7fffffffffffffffull)));
    json_t *t = json_object();
    json_object_set_new(t, "prompt_tokens", json_integer((json_int_t)r->n_prompt_ids));
    json_object_set_new(t, "generated_tokens", json_integer((json_int_t)r->n_ids));
    json_object_set_new(t, "prompt_ms", json_real(r->prompt_ms));
    json_object_set_new(t, "generate_ms", json_real(r->generate_ms));
    json_object_set_new(t, "prompt_tok_s", json_real(r->prompt_tok_s));
    json_object_set_new(t, "generate_tok_s", json_real(r->generate_tok_s));
    json_object_set_new(o, "timings", t);
    json_t *kv = json_object();
    json_object_set_new(kv, "bytes", json_integer((json_int_t)info->cache_bytes));
    json_object_set_new(kv, "blocks", json_integer(info->n_blocks));
    json_object_set_new(kv, "block_size", json_integer(info->block_size));
    json_object_set_new(kv, "tokens", json_integer((json_int_t)info->cache_tokens));
    json_object_set_new(o, "kv_cache", kv);
    json_object_set_new(o, "backend", json_string(kiln_backend_name(info->backend)));
    if (info->n_threads)
        json_object_set_new(o, "threads", json_integer(info->n_threads));
    if (info->n_graphs) {
        json_t *g = json_object();
        json_object_set_new(g, "batch_sizes", json_integer(info->n_graphs));
        json_object_set_new(g, "capture_ms", json_real(info->graph_capture_ms));
        json_object_set_new(g, "launches_per_step", json_integer((json_int_t)info->graph_nodes));
        json_object_set_new(o, "cuda_graphs", g);
    }
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    if (!s)
        return cli_error("out of memory writing JSON");
    puts(s);
    free(s);
    return CLI_OK;
}

int cli_run(int argc, char **argv)
{
    static const char *const valued[] = {"-p",
                                         "--prompt",
                                         "-n",
                                         "--max-tokens",
                                         "--system",
                                         "--plugins",
                                         "--stop",
                                         CLI_LLM_MEMORY_VALUED,
                                         CLI_LLM_SAMPLING_VALUED,
                                         NULL};
    cli_args a;
    cli_args_init(&a, "run", argc, argv);
    const char *opt, *val, *prompt = NULL, *system = NULL;
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    const char **stops = calloc((size_t)argc + 1, sizeof *stops);
    int n_libs = 0, n_stops = 0, chat = 0, json = 0, help = 0, ignore_eos = 0;
    long max_tokens = 128;
    kiln_llm_options lo;
    kiln_llm_options_init(&lo);
    kiln_llm_sampling samp;
    cli_llm_sampling_default(&samp);
    int st = libs && stops ? CLI_OK : cli_error("out of memory");
    while (st == CLI_OK && (opt = cli_args_next(&a, valued, &val))) {
        int handled = 0;
        if (!strcmp(opt, "-h") || !strcmp(opt, "--help"))
            help = 1;
        else if (!strcmp(opt, "-p") || !strcmp(opt, "--prompt"))
            prompt = val;
        else if (!strcmp(opt, "-n") || !strcmp(opt, "--max-tokens"))
            st = cli_parse_count("run", opt, val, &max_tokens);
        else if (!strcmp(opt, "--system"))
            system = val;
        else if (!strcmp(opt, "--plugins"))
            libs[n_libs++] = val;
        else if (!strcmp(opt, "--stop"))
            stops[n_stops++] = val;
        else if (!strcmp(opt, "--chat"))
            chat = 1;
        else if (!strcmp(opt, "--json"))
            json = 1;
        else if (!strcmp(opt, "--ignore-eos"))
            ignore_eos = 1;
        else if ((st = cli_llm_memory_option("run", opt, val, &lo, &handled)) == CLI_OK && !handled &&
                 (st = cli_llm_sampling_option("run", opt, val, &samp, &handled)) == CLI_OK && !handled)
            st = cli_usage("run", "unknown option %s", opt);
    }
    if (st == CLI_OK && a.status)
        st = a.status;
    if (st == CLI_OK && help)
        fputs(run_help, stdout);
    else if (st == CLI_OK && a.n_positional != 1)
        st = cli_usage("run", "expected one ENGINE, got %d arguments", a.n_positional);
    else if (st == CLI_OK && !prompt)
        st = cli_usage("run", "missing -p PROMPT");
    else if (st == CLI_OK && max_tokens < 1)
        st = cli_usage("run", "-n must be >= 1");
    else if (st == CLI_OK && system && !chat)
        st = cli_usage("run", "--system needs --chat");
    kiln_registry *reg = NULL;
    kiln_llm *llm = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (st == CLI_OK && !help)
        st = cli_llm_open(a.positional[0], libs, n_libs, &lo, &reg, &llm);
    if (st == CLI_OK && !help) {
        kiln_llm_message sys_msg, user_msg;
        kiln_llm_message_init(&sys_msg);
        kiln_llm_message_init(&user_msg);
        sys_msg.role = "system";
        sys_msg.content = system;
        user_msg.role = "user";
        user_msg.content = prompt;
        const kiln_llm_message *msgs[2] = {&sys_msg, &user_msg};
        kiln_status s = chat ? kiln_llm_chat_tokenize(llm, system ? msgs : msgs + 1, system ? 2 : 1, &ids, &n_ids)
                             : kiln_llm_prompt_ids(llm, prompt, strlen(prompt), &ids, &n_ids);
        if (s != KILN_OK)
            st = cli_kiln_error();
    }
    kiln_llm_request req;
    kiln_llm_request_init(&req);
    if (st == CLI_OK && !help)
        st = cli_llm_fit_max_tokens(llm, n_ids, max_tokens, &req.max_tokens);
    if (st == CLI_OK && !help) {
        req.prompt_ids = ids;
        req.n_prompt_ids = n_ids;
        req.sampling = &samp;
        req.stop = stops;
        req.n_stop = n_stops;
        req.ignore_eos = ignore_eos;
        const kiln_llm_request *reqs[1] = {&req};
        kiln_llm_result *res = NULL;
        if (kiln_llm_generate(llm, reqs, 1, json ? NULL : cli_llm_print_token, NULL, &res) != KILN_OK) {
            st = cli_kiln_error();
        } else {
            if (json) {
                st = print_json(llm, res, samp.seed);
            } else {
                putchar('\n');
                fflush(stdout);
                cli_llm_print_speed(res);
                cli_llm_print_cache(llm);
            }
            kiln_llm_result_free(res);
        }
    }
    kiln_free(ids);
    kiln_llm_close(llm);
    kiln_registry_destroy(reg);
    free(libs);
    free(stops);
    cli_args_free(&a);
    return st;
}
