/* kiln build NET.json -o OUT.engine: network JSON to engine file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char build_help[] =
    "usage: kiln build NET.json -o OUT.engine [options]\n"
    "\n"
    "Builds a network (docs/network-format.md) into an engine file.\n"
    "\n"
    "options:\n"
    "  -o, --output FILE   engine file to write (required)\n"
    "  --plugins LIB       load a plugin library first (repeatable)\n"
    "  --backend NAME      cpu (default) or cuda\n"
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
    fprintf(stderr, "\r[%.*s%*s] %3d%% %-24.24s", filled, "##############################",
            30 - filled, "", (int)(fraction * 100 + 0.5), what ? what : "");
    fflush(stderr);
    *drawn = 1;
}

/* A checkpoint (HF directory, .gguf, llama2.c .bin) builds an LLM engine:
 * tools/kiln/build_llm.c. */
int cli_build_is_checkpoint(int argc, char **argv);
int cli_build_llm(int argc, char **argv);

int cli_build(int argc, char **argv)
{
    if (cli_build_is_checkpoint(argc, argv))
        return cli_build_llm(argc, argv);
    static const char *const valued[] = {"-o", "--output", "--plugins", "--backend", NULL};
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
        cli_engine_image img;
        if (cli_engine_map(out, &img) != KILN_OK) {
            status = cli_kiln_error();
        } else {
            printf("built %s: %d layers (%d in the network), arena %zu bytes, workspace %zu bytes, "
                   "engine %zu bytes, target %s\n",
                   out, (int)img.graph.n_layers, (int)kiln_network_num_layers(net),
                   img.graph.arena_size, img.graph.workspace_size, img.size,
                   kiln_backend_name(img.info.backend));
            cli_engine_unmap(&img);
        }
    }
    kiln_network_destroy(net);
    kiln_registry_destroy(reg);
done:
    free(libs);
    cli_args_free(&a);
    return status;
}
