/* kiln build NET.json -o OUT.engine: network JSON to engine file. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char build_help[] = "usage: kiln build NET.json -o OUT.engine [options]\n"
                                 "\n"
                                 "Builds a network (docs/network-format.md) into an engine file.\n"
                                 "A checkpoint in NET.json's place (a Hugging Face model directory, a\n"
                                 ".gguf or a llama2.c .bin) builds an LLM engine instead, with options of\n"
                                 "its own (--dtype, --calibrate, --weights, --kv-dtype, --max-batch, ...):\n"
                                 "`kiln build CHECKPOINT --help` lists them.\n"
                                 "\n"
                                 "options:\n"
                                 "  -o, --output FILE   engine file to write (required)\n"
                                 "  --plugins LIB       load a plugin library first (repeatable)\n"
                                 "  --backend NAME      cpu (default) or cuda\n"
                                 "  --gpu-arch LIST     cuda: the GPU architectures the engine is for, e.g. 90 or\n"
                                 "                      sm_80,sm_90 (default: this machine's GPU, else the ones\n"
                                 "                      kiln's CUDA kernels were built for)\n"
                                 "  --no-fusion         skip elementwise fusion\n"
                                 "  --verbose           log what each build pass did\n"
                                 "  -h, --help          show this help\n";

static void log_to_stderr(void *user, kiln_log_level level, const char *message)
{
    static const char *const names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "kiln: %s: %s\n", (unsigned)level < 4 ? names[level] : "log", message);
}

/* Redraws one line on the terminal; the caller ends it with a newline. */
static void progress_bar(void *user, double fraction, const char *what)
{
    int *drawn = user;
    if (fraction < 0)
        fraction = 0;
    if (fraction > 1)
        fraction = 1;
    int filled = (int)(fraction * 30 + 0.5);
    fprintf(stderr, "\r[%.*s%*s] %3d%% %-24.24s", filled, "##############################", 30 - filled, "",
            (int)(fraction * 100 + 0.5), what ? what : "");
    fflush(stderr);
    *drawn = 1;
}

/* "90", "sm_90" or a comma-separated list of them into config->gpu_archs. */
static int parse_gpu_archs(const char *list, kiln_build_config *config)
{
    int32_t n = 0;
    const char *p = list;
    for (;;) {
        if (!strncmp(p, "sm_", 3))
            p += 3;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v <= 0 || v > 1000 || (*end && *end != ',') || n == 8)
            return cli_usage("build",
                             "--gpu-arch \"%s\": expected up to 8 architectures like 90 or sm_90, "
                             "comma-separated",
                             list);
        config->gpu_archs[n++] = (int32_t)v;
        if (!*end)
            break;
        p = end + 1;
    }
    config->n_gpu_archs = n;
    return CLI_OK;
}

/* A checkpoint (HF directory, .gguf, llama2.c .bin) builds an LLM engine:
 * tools/kiln/build_llm.c. */
int cli_build_is_checkpoint(int argc, char **argv);
int cli_build_llm(int argc, char **argv);

int cli_build(int argc, char **argv)
{
    if (cli_build_is_checkpoint(argc, argv))
        return cli_build_llm(argc, argv);
    static const char *const valued[] = {"-o", "--output", "--plugins", "--backend", "--gpu-arch", NULL};
    cli_args a;
    cli_args_init(&a, "build", argc, argv);
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    int n_libs = 0, verbose = 0, status = CLI_OK;
    const char *out = NULL, *opt, *val;
    kiln_build_config config;
    kiln_build_config_init(&config);
    while ((opt = cli_args_next(&a, valued, &val))) {
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
            fputs(build_help, stdout);
            goto done;
        } else if (!strcmp(opt, "-o") || !strcmp(opt, "--output")) {
            out = val;
        } else if (!strcmp(opt, "--plugins")) {
            libs[n_libs++] = val;
        } else if (!strcmp(opt, "--backend")) {
            if (!strcmp(val, "cpu"))
                config.backend = KILN_BACKEND_CPU;
            else if (!strcmp(val, "cuda"))
                config.backend = KILN_BACKEND_CUDA;
            else {
                status = cli_usage("build", "unknown backend \"%s\" (cpu or cuda)", val);
                goto done;
            }
        } else if (!strcmp(opt, "--gpu-arch")) {
            if ((status = parse_gpu_archs(val, &config)) != CLI_OK)
                goto done;
        } else if (!strcmp(opt, "--no-fusion")) {
            config.flags |= KILN_BUILD_NO_FUSION;
        } else if (!strcmp(opt, "--verbose")) {
            verbose = 1;
        } else {
            status = cli_usage("build", "unknown option %s", opt);
            goto done;
        }
    }
    if (a.status) {
        status = a.status;
        goto done;
    }
    if (a.n_positional != 1) {
        status = cli_usage("build", a.n_positional ? "expected one network file" : "missing the network file");
        goto done;
    }
    if (!out) {
        status = cli_usage("build", "missing -o OUT.engine");
        goto done;
    }
    if ((status = cli_check_output("build", out)) != CLI_OK)
        goto done;
    if (verbose)
        kiln_set_log(log_to_stderr, NULL, KILN_LOG_INFO);
    int drawn = 0;
    if (isatty(STDERR_FILENO) && !verbose) {
        config.progress = progress_bar;
        config.progress_user = &drawn;
    }

    kiln_registry *reg = NULL;
    kiln_network *net = NULL;
    if ((status = cli_registry(libs, n_libs, &reg)) != CLI_OK)
        goto done;
    if (kiln_network_load_json(reg, a.positional[0], &net) != KILN_OK) {
        status = cli_kiln_error();
        kiln_registry_destroy(reg);
        goto done;
    }
    kiln_status s = kiln_build_to_file(net, &config, out);
    if (drawn)
        fputc('\n', stderr);
    if (s != KILN_OK) {
        status = cli_kiln_error();
    } else {
        /* Reading back what was written gives the planned figures. */
        char *text = NULL;
        json_t *d = NULL;
        if (kiln_engine_describe_file_json(reg, out, &text) != KILN_OK) {
            status = cli_kiln_error();
        } else if (!(d = json_loads(text, 0, NULL))) {
            status = cli_error("cannot parse the engine description");
        } else {
            json_t *mem = json_object_get(d, "memory");
            printf("built %s: %zu layers (%d in the network), arena %lld bytes, workspace %lld bytes, "
                   "engine %lld bytes, target %s\n",
                   out, json_array_size(json_object_get(d, "layers")), (int)kiln_network_num_layers(net),
                   cli_json_int(mem, "arena_bytes"), cli_json_int(mem, "workspace_bytes"),
                   cli_json_int(json_object_get(d, "header"), "file_size"),
                   cli_json_str(json_object_get(d, "target"), "backend"));
        }
        json_decref(d);
        kiln_free(text);
    }
    kiln_network_destroy(net);
    kiln_registry_destroy(reg);
done:
    free(libs);
    cli_args_free(&a);
    return status;
}
