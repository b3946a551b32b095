/* kiln inspect ENGINE: what an engine holds, from kiln_engine_describe_json. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char inspect_help[] = "usage: kiln inspect ENGINE [options]\n"
                                   "\n"
                                   "Describes an engine: target, inputs and profiles, tensors, layers (with\n"
                                   "fused steps), memory plan, plugin records and extra sections. Works without\n"
                                   "the plugin libraries: their records are then shown as not registered.\n"
                                   "\n"
                                   "options:\n"
                                   "  --plugins LIB   load a plugin library first (repeatable)\n"
                                   "  --json          print the engine description as JSON\n"
                                   "  -h, --help      show this help\n";

/* ---- text rendering ------------------------------------------------------------------ */

const char *cli_json_str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

long long cli_json_int(json_t *o, const char *key) { return (long long)json_integer_value(json_object_get(o, key)); }

/* "[s0, 1024]" from an array of strings or integers. */
static void print_list(json_t *a)
{
    size_t i;
    json_t *v;
    putchar('[');
    json_array_foreach(a, i, v)
    {
        if (i)
            fputs(", ", stdout);
        if (json_is_string(v))
            fputs(json_string_value(v), stdout);
        else if (json_is_integer(v))
            printf("%lld", (long long)json_integer_value(v));
        else {
            char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
            fputs(t ? t : "?", stdout);
            free(t);
        }
    }
    putchar(']');
}

static void print_dims(json_t *a)
{
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) printf("%s%lld", i ? "x" : "", (long long)json_integer_value(v));
    if (json_array_size(a) == 0)
        fputs("scalar", stdout);
}

static json_t *find_tensor(json_t *root, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(root, "tensors"), i, t) if (!strcmp(cli_json_str(t, "name"), name)) return t;
    return NULL;
}

static void print_io(json_t *root, const char *which)
{
    size_t i;
    json_t *name;
    json_t *names = json_object_get(root, which);
    printf("%s (%zu):\n", which, json_array_size(names));
    json_array_foreach(names, i, name)
    {
        json_t *t = find_tensor(root, json_string_value(name));
        printf("  %-16s %-5s ", json_string_value(name), t ? cli_json_str(t, "dtype") : "?");
        print_list(t ? json_object_get(t, "dims") : NULL);
        putchar('\n');
        if (strcmp(which, "inputs"))
            continue;
        size_t p;
        json_t *prof;
        json_array_foreach(json_object_get(root, "profiles"), p, prof)
        {
            json_t *d = json_object_get(prof, json_string_value(name));
            if (!d)
                continue;
            printf("    profile %zu: min ", p);
            print_dims(json_object_get(d, "min"));
            fputs("  opt ", stdout);
            print_dims(json_object_get(d, "opt"));
            fputs("  max ", stdout);
            print_dims(json_object_get(d, "max"));
            putchar('\n');
        }
    }
}

static void print_text(const char *path, json_t *root, kiln_registry *reg, const char *load_error)
{
    json_t *h = json_object_get(root, "header"), *tg = json_object_get(root, "target");
    printf("engine %s\n", path);
    printf("  format version %lld, built by kiln %s, %lld bytes, target %s", cli_json_int(h, "format_version"),
           cli_json_str(h, "kiln_version"), cli_json_int(h, "file_size"), cli_json_str(tg, "backend"));
    json_t *archs = json_object_get(tg, "gpu_archs");
    for (size_t k = 0; k < json_array_size(archs); k++)
        printf("%ssm_%lld", k ? ", " : " (", (long long)json_integer_value(json_array_get(archs, k)));
    if (json_array_size(archs))
        putchar(')');
    putchar('\n');
    if (load_error)
        printf("  cannot run here: %s\n", load_error);
    size_t i;
    json_t *v;
    json_t *syms = json_object_get(root, "symbols");
    if (json_array_size(syms)) {
        fputs("symbols:", stdout);
        json_array_foreach(syms, i, v)
            printf(" s%zu = %s dim %lld", i, cli_json_str(v, "tensor"), cli_json_int(v, "axis"));
        putchar('\n');
    }
    print_io(root, "inputs");
    print_io(root, "outputs");

    json_t *layers = json_object_get(root, "layers");
    printf("layers (%zu):\n", json_array_size(layers));
    json_array_foreach(layers, i, v)
    {
        printf("  %3zu %-18s %-20s ", i, cli_json_str(v, "op"), cli_json_str(v, "name"));
        print_list(json_object_get(v, "inputs"));
        fputs(" -> ", stdout);
        print_list(json_object_get(v, "outputs"));
        json_t *params = json_object_get(v, "params");
        json_t *steps = json_object_get(params, "steps");
        if (steps) {
            putchar('\n');
            size_t k;
            json_t *st;
            /* Operands below the input count are the layer's inputs, the
             * rest earlier steps' results. */
            json_t *ins = json_object_get(v, "inputs");
            long long n_in = (long long)json_array_size(ins);
            json_array_foreach(steps, k, st)
            {
                printf("        step %zu = %s(", k, cli_json_str(st, "op"));
                size_t q;
                json_t *operand;
                json_array_foreach(json_object_get(st, "operands"), q, operand)
                {
                    long long o = (long long)json_integer_value(operand);
                    if (o < n_in)
                        printf("%s%s", q ? ", " : "", json_string_value(json_array_get(ins, (size_t)o)));
                    else
                        printf("%sstep %lld", q ? ", " : "", o - n_in);
                }
                puts(")");
            }
            continue;
        }
        if (json_object_size(params)) {
            char *t = json_dumps(params, JSON_COMPACT);
            printf("  %s", t ? t : "");
            free(t);
        }
        if (json_object_get(v, "workspace"))
            printf("  workspace %lld bytes", cli_json_int(v, "workspace"));
        /* A matmul of a cuda engine built where no GPU was has no tactic:
         * the cuBLASLt heuristic's first choice runs. */
        if (json_object_get(v, "tactic"))
            printf("  tactic %lld", cli_json_int(v, "tactic"));
        else if (!strcmp(cli_json_str(tg, "backend"), "cuda") && !strcmp(cli_json_str(v, "op"), "matmul"))
            fputs("  tactic heuristic", stdout);
        putchar('\n');
    }

    long long n_const = 0, const_bytes = 0;
    json_array_foreach(json_object_get(root, "tensors"), i, v)
    {
        if (json_object_get(v, "data_bytes")) {
            n_const++;
            const_bytes += cli_json_int(v, "data_bytes");
        }
    }
    printf("constants: %lld tensors, %lld bytes\n", n_const, const_bytes);
    json_t *mem = json_object_get(root, "memory");
    if (json_object_get(mem, "context_bytes")) /* a loaded engine's */
        printf("memory: a context takes %lld bytes (its tensors and a %lld-byte workspace; the I/O tensors are the "
               "caller's, sized when bound: with them at their max shapes the plan's arena is %lld bytes)\n",
               cli_json_int(mem, "context_bytes"), cli_json_int(mem, "workspace_bytes"),
               cli_json_int(mem, "arena_bytes"));
    else
        printf("memory: arena %lld bytes with the I/O tensors at their max shapes (a context leaves them out), "
               "workspace %lld bytes\n",
               cli_json_int(mem, "arena_bytes"), cli_json_int(mem, "workspace_bytes"));

    json_t *plugins = json_object_get(root, "plugins");
    printf("plugins (%zu):\n", json_array_size(plugins));
    json_array_foreach(plugins, i, v)
    {
        const char *lib = NULL;
        int found = reg && kiln_registry_find(reg, cli_json_str(v, "name"), cli_json_str(v, "version"),
                                              cli_json_str(v, "namespace"), &lib);
        printf("  \"%s\" version \"%s\" namespace \"%s\" from %s, blob version %lld (%lld bytes): %s\n",
               cli_json_str(v, "name"), cli_json_str(v, "version"), cli_json_str(v, "namespace"),
               cli_json_str(v, "library"), cli_json_int(v, "blob_version"), cli_json_int(v, "blob_bytes"),
               found ? "registered" : "NOT REGISTERED");
    }
    json_t *sections = json_object_get(root, "sections");
    if (json_array_size(sections)) {
        printf("sections (%zu):\n", json_array_size(sections));
        json_array_foreach(sections, i, v) printf("  %s %lld bytes\n", cli_json_str(v, "id"), cli_json_int(v, "bytes"));
    }
}

/* The LLMC/TOKN sections of an LLM engine: tools/kiln/build_llm.c. */
void cli_inspect_llm(const char *path, json_t *root, int as_json);

/* ---- the command ----------------------------------------------------------------------- */

int cli_inspect(int argc, char **argv)
{
    static const char *const valued[] = {"--plugins", NULL};
    cli_args a;
    cli_args_init(&a, "inspect", argc, argv);
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    int n_libs = 0, as_json = 0, status = CLI_OK;
    const char *opt, *val;
    while ((opt = cli_args_next(&a, valued, &val))) {
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
            fputs(inspect_help, stdout);
            goto done;
        } else if (!strcmp(opt, "--plugins")) {
            libs[n_libs++] = val;
        } else if (!strcmp(opt, "--json")) {
            as_json = 1;
        } else {
            status = cli_usage("inspect", "unknown option %s", opt);
            goto done;
        }
    }
    if (a.status) {
        status = a.status;
        goto done;
    }
    if (a.n_positional != 1) {
        status = cli_usage("inspect", a.n_positional ? "expected one engine file" : "missing the engine file");
        goto done;
    }
    const char *path = a.positional[0];
    kiln_registry *reg = NULL;
    if ((status = cli_registry(libs, n_libs, &reg)) != CLI_OK)
        goto done;

    /* A full load checks everything; when it fails for a reason other than
     * a damaged file (a missing plugin, another target), the file itself
     * is still worth showing, missing plugins included. */
    kiln_engine *engine = NULL;
    char *text = NULL, load_error[1024] = "";
    if (kiln_engine_load(reg, path, &engine) == KILN_OK) {
        if (kiln_engine_describe_json(engine, &text) != KILN_OK)
            status = cli_kiln_error();
    } else {
        snprintf(load_error, sizeof load_error, "%s", kiln_last_error());
        if (kiln_engine_describe_file_json(reg, path, &text) != KILN_OK)
            status = cli_kiln_error();
    }
    if (status == CLI_OK) {
        json_t *root = json_loads(text, 0, NULL);
        if (root)
            cli_inspect_llm(path, root, as_json);
        if (!root) {
            status = cli_error("cannot parse the engine description");
        } else if (as_json) {
            if (load_error[0])
                json_object_set_new(root, "load_error", json_string(load_error));
            char *out = json_dumps(root, JSON_INDENT(2));
            printf("%s\n", out ? out : "{}");
            free(out);
        } else {
            print_text(path, root, reg, load_error[0] ? load_error : NULL);
        }
        json_decref(root);
    }
    kiln_free(text);
    kiln_engine_destroy(engine);
    kiln_registry_destroy(reg);
done:
    free(libs);
    cli_args_free(&a);
    return status;
}
