/* kiln plugins: every registered creator with its field schema. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char plugins_help[] = "usage: kiln plugins [options]\n"
                                   "\n"
                                   "Lists every registered plugin creator (kiln's built-ins and those of the\n"
                                   "libraries given): its (name, version, namespace) triple, library, blob\n"
                                   "schema version, description and fields.\n"
                                   "\n"
                                   "options:\n"
                                   "  --plugins LIB   load a plugin library first (repeatable)\n"
                                   "  --json          print the list as JSON\n"
                                   "  -h, --help      show this help\n";

static const char *field_type_name(kiln_field_type t)
{
    static const char *const names[] = {"f32", "f64", "i32", "i64", "string"};
    return (unsigned)t < KILN_FIELD_TYPE_COUNT ? names[t] : "?";
}

/* The default value as JSON: a string, or an array of numbers. */
static json_t *default_json(const kiln_field_spec *f)
{
    if (!f->default_data)
        return json_null();
    if (f->type == KILN_FIELD_STRING)
        return json_string((const char *)f->default_data);
    json_t *a = json_array();
    for (int64_t i = 0; i < f->default_count && i < 64; i++) {
        switch (f->type) {
        case KILN_FIELD_F32: json_array_append_new(a, json_real(((const float *)f->default_data)[i])); break;
        case KILN_FIELD_F64: json_array_append_new(a, json_real(((const double *)f->default_data)[i])); break;
        case KILN_FIELD_I32: json_array_append_new(a, json_integer(((const int32_t *)f->default_data)[i])); break;
        case KILN_FIELD_I64: json_array_append_new(a, json_integer(((const int64_t *)f->default_data)[i])); break;
        default: break;
        }
    }
    return a;
}

static json_t *creator_json(const kiln_plugin_creator *c, const char *lib)
{
    json_t *fields = json_array();
    for (int32_t i = 0; i < c->n_fields; i++) {
        const kiln_field_spec *f = &c->fields[i];
        json_array_append_new(fields,
                              json_pack("{s:s, s:s, s:I, s:b, s:o, s:s}", "name", f->name ? f->name : "", "type",
                                        field_type_name(f->type), "count", (json_int_t)f->count, "required",
                                        f->required, "default", default_json(f), "doc", f->doc ? f->doc : ""));
    }
    return json_pack("{s:s, s:s, s:s, s:s, s:I, s:s, s:o}", "name", c->name, "version", c->version, "namespace",
                     c->plugin_namespace ? c->plugin_namespace : "", "library", lib ? lib : "", "blob_version",
                     (json_int_t)c->blob_version, "description", c->description ? c->description : "", "fields",
                     fields);
}

static void print_creator(json_t *c)
{
    printf("\"%s\" version \"%s\" namespace \"%s\"\n", json_string_value(json_object_get(c, "name")),
           json_string_value(json_object_get(c, "version")), json_string_value(json_object_get(c, "namespace")));
    printf("  library: %s\n", json_string_value(json_object_get(c, "library")));
    printf("  blob version: %lld\n", (long long)json_integer_value(json_object_get(c, "blob_version")));
    const char *desc = json_string_value(json_object_get(c, "description"));
    if (desc && desc[0])
        printf("  %s\n", desc);
    json_t *fields = json_object_get(c, "fields");
    if (!json_array_size(fields)) {
        printf("  fields: none\n");
        return;
    }
    printf("  fields:\n");
    size_t i;
    json_t *f;
    json_array_foreach(fields, i, f)
    {
        long long count = (long long)json_integer_value(json_object_get(f, "count"));
        char cnt[32];
        if (count == KILN_FIELD_ANY_COUNT)
            snprintf(cnt, sizeof cnt, "[n]");
        else if (count == 1)
            cnt[0] = '\0';
        else
            snprintf(cnt, sizeof cnt, "[%lld]", count);
        printf("    %-16s %s%s", json_string_value(json_object_get(f, "name")),
               json_string_value(json_object_get(f, "type")), cnt);
        if (json_is_true(json_object_get(f, "required"))) {
            fputs("  required", stdout);
        } else {
            json_t *d = json_object_get(f, "default");
            char *t = json_is_null(d) ? NULL : json_dumps(d, JSON_COMPACT | JSON_ENCODE_ANY);
            printf("  default %s", t ? t : "none");
            free(t);
        }
        const char *doc = json_string_value(json_object_get(f, "doc"));
        if (doc && doc[0])
            printf("  — %s", doc);
        putchar('\n');
    }
}

int cli_plugins(int argc, char **argv)
{
    static const char *const valued[] = {"--plugins", NULL};
    cli_args a;
    cli_args_init(&a, "plugins", argc, argv);
    const char **libs = calloc((size_t)argc + 1, sizeof *libs);
    int n_libs = 0, as_json = 0, status = CLI_OK;
    const char *opt, *val;
    while ((opt = cli_args_next(&a, valued, &val))) {
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
            fputs(plugins_help, stdout);
            goto done;
        } else if (!strcmp(opt, "--plugins")) {
            libs[n_libs++] = val;
        } else if (!strcmp(opt, "--json")) {
            as_json = 1;
        } else {
            status = cli_usage("plugins", "unknown option %s", opt);
            goto done;
        }
    }
    if (a.status) {
        status = a.status;
        goto done;
    }
    if (a.n_positional) {
        status = cli_usage("plugins", "unexpected argument \"%s\"", a.positional[0]);
        goto done;
    }
    kiln_registry *reg = NULL;
    if ((status = cli_registry(libs, n_libs, &reg)) != CLI_OK)
        goto done;
    json_t *list = json_array();
    for (int32_t i = 0; i < kiln_registry_count(reg); i++) {
        const char *lib = NULL;
        const kiln_plugin_creator *c = kiln_registry_get(reg, i, &lib);
        if (c)
            json_array_append_new(list, creator_json(c, lib));
    }
    if (as_json) {
        char *t = json_dumps(list, JSON_INDENT(2));
        printf("%s\n", t ? t : "[]");
        free(t);
    } else if (!json_array_size(list)) {
        printf("no plugins registered (load libraries with --plugins)\n");
    } else {
        size_t i;
        json_t *c;
        json_array_foreach(list, i, c)
        {
            if (i)
                putchar('\n');
            print_creator(c);
        }
    }
    json_decref(list);
    kiln_registry_destroy(reg);
done:
    free(libs);
    cli_args_free(&a);
    return status;
}
