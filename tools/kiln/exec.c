/* kiln exec ENGINE: load, set shapes, fill inputs, time, optionally check
 * against the reference path — like trtexec. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"

static const char exec_help[] =
    "usage: kiln exec ENGINE [options]\n"
    "\n"
    "Loads an engine, sets input shapes, fills the inputs, runs it and reports\n"
    "latency (min, median, p99, mean in ms). On a cuda engine inputs are copied in\n"
    "through pinned staging once, and GPU time from CUDA events is reported beside\n"
    "the host wall time of each enqueue + synchronize.\n"
    "\n"
    "options:\n"
    "  --plugins LIB          load a plugin library first (repeatable)\n"
    "  --shapes NAME:DIMS     shape of a dynamic input, e.g. input:4x1024 (repeatable);\n"
    "                         unset dynamic inputs use the profile's opt shape\n"
    "  --input NAME=FILE.npy  read an input from a .npy file (repeatable); others get\n"
    "                         deterministic pseudo-random values (floats in [-1, 1),\n"
    "                         integers in [0, 4))\n"
    "  --profile-index N      optimization profile to use (default 0)\n"
    "  --warmup N             untimed runs first (default 2)\n"
    "  --iterations N         timed runs (default 10)\n"
    "  --check                rerun on the reference path and compare every output:\n"
    "                         pass when |a-b| <= atol + rtol*|b| everywhere\n"
    "  --atol X, --rtol X     tolerances for --check (default per dtype: f32 1e-5/1e-4,\n"
    "                         f16 1e-2/1e-2, bf16 2e-2/2e-2, integers exact)\n"
    "  --save-outputs DIR     write each output as DIR/NAME.npy\n"
    "  --cuda-graph           (cuda) capture the engine in a CUDA graph once and replay it\n"
    "  --profile              per-layer times of one extra run, slowest first (cuda: GPU\n"
    "                         time from events between layers, without a graph; cpu: host)\n"
    "  --json                 print one JSON object instead of text\n"
    "  -h, --help             show this help\n";

typedef struct io_tensor {
    const char *name;
    int32_t is_input;
    kiln_dtype dtype;
    kiln_dims dims;
    size_t bytes;
    void *data; /* bound buffer: inputs, and outputs of the timed runs */
    void *ref;  /* outputs of the reference run (--check) */
    const char *shape_arg, *file_arg;
    void *npy; /* the --input file's data, read once */
    kiln_dtype npy_dtype;
    kiln_dims npy_dims;
    /* --check results */
    double max_abs, max_rel, atol, rtol;
    int pass;
} io_tensor;

typedef struct exec_opts {
    const char *engine, *save_dir;
    const char **libs, **shapes, **inputs;
    int n_libs, n_shapes, n_inputs;
    long iterations, warmup, profile_index;
    int check, json, cuda_graph, profile;
    double atol, rtol; /* < 0: per dtype */
} exec_opts;

/* Timing and profile results of one exec. */
typedef struct exec_result {
    double lat[4]; /* host wall ms: min, median, p99, mean */
    double gpu[4]; /* GPU ms from CUDA events (cuda engines) */
    int has_gpu;
    int n_layers;
    int *order; /* layer indices, slowest first */
    const char **layer_name, **layer_op;
    double *layer_ms, layer_total;
} exec_result;

/* ---- parsing -------------------------------------------------------------------------- */

static int parse_dims(const char *text, kiln_dims *out)
{
    kiln_dims d;
    memset(&d, 0, sizeof d);
    const char *p = text;
    if (!*p)
        return -1;
    while (*p) {
        char *end;
        if (d.rank == KILN_MAX_RANK || *p < '0' || *p > '9')
            return -1;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p)
            return -1;
        d.d[d.rank++] = v;
        p = end;
        if (*p == 'x') {
            p++;
            if (!*p)
                return -1;
        } else if (*p) {
            return -1;
        }
    }
    *out = d;
    return 0;
}

static int parse_real(const char *opt, const char *text, double *out)
{
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !(v >= 0))
        return cli_usage("exec", "%s expects a non-negative number, got \"%s\"", opt, text);
    *out = v;
    return CLI_OK;
}

static int parse_opts(int argc, char **argv, exec_opts *o, int *help)
{
    static const char *const valued[] = {"--plugins",      "--shapes",        "--input", "--iterations", "--warmup",
                                         "--save-outputs", "--profile-index", "--atol",  "--rtol",       NULL};
    cli_args a;
    cli_args_init(&a, "exec", argc, argv);
    const char *opt, *val;
    int st = CLI_OK;
    while (st == CLI_OK && (opt = cli_args_next(&a, valued, &val))) {
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
            *help = 1;
            break;
        } else if (!strcmp(opt, "--plugins")) {
            o->libs[o->n_libs++] = val;
        } else if (!strcmp(opt, "--shapes")) {
            const char *colon = strrchr(val, ':');
            kiln_dims d;
            if (!colon || colon == val || parse_dims(colon + 1, &d))
                st = cli_usage("exec", "--shapes expects NAME:DIMS like input:4x1024, got \"%s\"", val);
            o->shapes[o->n_shapes++] = val;
        } else if (!strcmp(opt, "--input")) {
            const char *eq = strchr(val, '=');
            if (!eq || eq == val || !eq[1])
                st = cli_usage("exec", "--input expects NAME=FILE.npy, got \"%s\"", val);
            o->inputs[o->n_inputs++] = val;
        } else if (!strcmp(opt, "--iterations")) {
            st = cli_parse_count("exec", opt, val, &o->iterations);
            if (st == CLI_OK && o->iterations < 1)
                st = cli_usage("exec", "--iterations must be at least 1");
        } else if (!strcmp(opt, "--warmup")) {
            st = cli_parse_count("exec", opt, val, &o->warmup);
        } else if (!strcmp(opt, "--profile-index")) {
            st = cli_parse_count("exec", opt, val, &o->profile_index);
        } else if (!strcmp(opt, "--atol")) {
            st = parse_real(opt, val, &o->atol);
        } else if (!strcmp(opt, "--rtol")) {
            st = parse_real(opt, val, &o->rtol);
        } else if (!strcmp(opt, "--save-outputs")) {
            o->save_dir = val;
        } else if (!strcmp(opt, "--check")) {
            o->check = 1;
        } else if (!strcmp(opt, "--json")) {
            o->json = 1;
        } else if (!strcmp(opt, "--cuda-graph")) {
            o->cuda_graph = 1;
        } else if (!strcmp(opt, "--profile")) {
            o->profile = 1;
        } else {
            st = cli_usage("exec", "unknown option %s", opt);
        }
    }
    if (st == CLI_OK && a.status)
        st = a.status;
    if (st == CLI_OK && !*help && a.n_positional != 1)
        st = cli_usage("exec", a.n_positional ? "expected one engine file" : "missing the engine file");
    if (st == CLI_OK && !*help)
        o->engine = a.positional[0];
    cli_args_free(&a);
    return st;
}

/* ---- inputs --------------------------------------------------------------------------- */

/* Finds NAME in "NAME<sep>VALUE" arguments (the last one wins). */
static const char *find_arg(const char **args, int n, const char *name, char sep)
{
    const char *found = NULL;
    size_t len = strlen(name);
    for (int i = 0; i < n; i++) {
        const char *s = sep == ':' ? strrchr(args[i], ':') : strchr(args[i], '=');
        if (s && (size_t)(s - args[i]) == len && !strncmp(args[i], name, len))
            found = s + 1;
    }
    return found;
}

/* Every --shapes / --input must name an input: a typo silently falling
 * back to random data would make a check meaningless. */
static int check_arg_names(kiln_engine *e, const char **args, int n, char sep, const char *opt)
{
    for (int i = 0; i < n; i++) {
        const char *s = sep == ':' ? strrchr(args[i], ':') : strchr(args[i], '=');
        int len = (int)(s - args[i]);
        int found = 0;
        for (int32_t k = 0; k < kiln_engine_num_io_tensors(e); k++) {
            const char *name = kiln_engine_io_tensor_name(e, k);
            int32_t is_input = 0;
            kiln_engine_io_tensor_info(e, name, NULL, &is_input, NULL);
            if (is_input && (int)strlen(name) == len && !strncmp(name, args[i], (size_t)len))
                found = 1;
        }
        if (!found)
            return cli_error("%s %s: the engine has no input named \"%.*s\"", opt, args[i], len, args[i]);
    }
    return CLI_OK;
}

/* xorshift64*: fixed seed, so every run of exec sees the same inputs. */
static uint64_t next_random(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static void fill_random(io_tensor *t, uint64_t seed)
{
    int64_t n = 0;
    kiln_dims_count(&t->dims, &n);
    uint64_t s = seed;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = next_random(&s);
        float v;
        if (t->dtype == KILN_DTYPE_BOOL)
            v = (float)(r & 1);
        else if (kiln_dtype_is_integer(t->dtype))
            v = (float)(r % 4);
        else
            v = (float)((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        kiln_store_f32(t->data, t->dtype, i, v);
    }
}

/* Copies the --input file's values into the input buffer. */
static int load_npy(io_tensor *t)
{
    kiln_dtype dtype = t->npy_dtype;
    kiln_dims dims = t->npy_dims;
    const void *data = t->npy;
    int64_t n = 0;
    kiln_dims_count(&t->dims, &n);
    int64_t m = -1;
    kiln_dims_count(&dims, &m);
    char want[160], got[160];
    int st = CLI_OK;
    if (m != n || dims.rank != t->dims.rank) {
        st = cli_error("input \"%s\": %s holds shape %s, the input is %s", t->name, t->file_arg,
                       kiln_dims_format(&dims, got, sizeof got), kiln_dims_format(&t->dims, want, sizeof want));
    } else if (dtype == t->dtype) {
        memcpy(t->data, data, t->bytes);
    } else if (kiln_dtype_is_float(dtype) && kiln_dtype_is_float(t->dtype)) {
        kiln_convert(t->data, t->dtype, data, dtype, n);
    } else {
        st = cli_error("input \"%s\": %s holds %s, the input is %s", t->name, t->file_arg, kiln_dtype_name(dtype),
                       kiln_dtype_name(t->dtype));
    }
    return st;
}

/* Shape of an input: --shapes, else the .npy file's, else the declared one
 * when static, else the profile's opt. */
static int input_shape(kiln_engine *e, const exec_opts *o, io_tensor *t)
{
    kiln_dims declared, opt;
    kiln_engine_io_tensor_info(e, t->name, NULL, NULL, &declared);
    if (t->shape_arg) {
        parse_dims(t->shape_arg, &t->dims);
        return CLI_OK;
    }
    if (t->file_arg) {
        t->dims = t->npy_dims;
        return CLI_OK;
    }
    int dynamic = 0;
    for (int32_t k = 0; k < declared.rank; k++)
        dynamic |= declared.d[k] < 0;
    if (!dynamic) {
        t->dims = declared;
        return CLI_OK;
    }
    if (kiln_engine_profile_shape(e, (int32_t)o->profile_index, t->name, NULL, &opt, NULL) != KILN_OK)
        return cli_kiln_error();
    t->dims = opt;
    return CLI_OK;
}

/* ---- timing and checking --------------------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* min, median, p99, mean of n samples (sorted in place). */
static void summarize(double *v, long n, double out[4])
{
    double sum = 0;
    for (long i = 0; i < n; i++)
        sum += v[i];
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    long p99 = (long)ceil(0.99 * (double)n) - 1;
    out[0] = v[0];
    out[1] = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    out[2] = v[p99 < 0 ? 0 : p99];
    out[3] = sum / (double)n;
}

static void default_tolerance(kiln_dtype t, double *atol, double *rtol)
{
    switch (t) {
    case KILN_DTYPE_F32:
        *atol = 1e-5;
        *rtol = 1e-4;
        break;
    case KILN_DTYPE_F16:
        *atol = 1e-2;
        *rtol = 1e-2;
        break;
    case KILN_DTYPE_BF16:
        *atol = 2e-2;
        *rtol = 2e-2;
        break;
    default:
        *atol = 0;
        *rtol = 0;
        break;
    }
}

/* a: the timed run, b: the reference. */
static void compare(io_tensor *t, const exec_opts *o)
{
    default_tolerance(t->dtype, &t->atol, &t->rtol);
    if (o->atol >= 0)
        t->atol = o->atol;
    if (o->rtol >= 0)
        t->rtol = o->rtol;
    int64_t n = 0;
    kiln_dims_count(&t->dims, &n);
    t->max_abs = t->max_rel = 0;
    t->pass = 1;
    for (int64_t i = 0; i < n; i++) {
        double a = kiln_load_f32(t->data, t->dtype, i), b = kiln_load_f32(t->ref, t->dtype, i);
        if (isnan(a) || isnan(b)) {
            if (!(isnan(a) && isnan(b))) {
                t->pass = 0;
                t->max_abs = t->max_rel = INFINITY;
            }
            continue;
        }
        if (a == b)
            continue;
        double d = fabs(a - b);
        double rel = d / fmax(fabs(b), 1e-6);
        if (!(d <= t->max_abs))
            t->max_abs = d;
        if (!(rel <= t->max_rel))
            t->max_rel = rel;
        if (!(d <= t->atol + t->rtol * fabs(b)))
            t->pass = 0;
    }
}

static int save_output(const io_tensor *t, const char *dir)
{
    char path[4096], name[512];
    snprintf(name, sizeof name, "%s", t->name);
    for (char *p = name; *p; p++)
        if (*p == '/')
            *p = '_';
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    if (kiln_npy_write(path, t->dtype, &t->dims, t->data) != KILN_OK)
        return cli_kiln_error();
    return CLI_OK;
}

/* ---- reporting ------------------------------------------------------------------------- */

static json_t *dims_json(const kiln_dims *d)
{
    json_t *a = json_array();
    for (int32_t i = 0; i < d->rank; i++)
        json_array_append_new(a, json_integer(d->d[i]));
    return a;
}

static json_t *stats_json(const double *v)
{
    return json_pack("{s:f, s:f, s:f, s:f}", "min", v[0], "median", v[1], "p99", v[2], "mean", v[3]);
}

static json_t *report_json(const exec_opts *o, kiln_engine *e, io_tensor *io, int n_io, const exec_result *r)
{
    json_t *inputs = json_array(), *outputs = json_array();
    for (int i = 0; i < n_io; i++) {
        json_t *t = json_pack("{s:s, s:s, s:o}", "name", io[i].name, "dtype", kiln_dtype_name(io[i].dtype), "shape",
                              dims_json(&io[i].dims));
        if (io[i].is_input) {
            json_object_set_new(t, "source", json_string(io[i].file_arg ? io[i].file_arg : "random"));
            json_array_append_new(inputs, t);
        } else {
            json_array_append_new(outputs, t);
        }
    }
    json_t *root = json_pack("{s:s, s:s, s:i, s:o, s:o, s:i, s:i}", "engine", o->engine, "backend",
                             kiln_backend_name(kiln_engine_backend(e)), "profile", (int)o->profile_index, "inputs",
                             inputs, "outputs", outputs, "warmup", (int)o->warmup, "iterations", (int)o->iterations);
    json_object_set_new(root, "latency_ms", stats_json(r->lat));
    if (r->has_gpu) {
        json_object_set_new(root, "gpu_ms", stats_json(r->gpu));
        json_object_set_new(root, "cuda_graph", json_boolean(o->cuda_graph));
    }
    if (r->n_layers) {
        json_t *list = json_array();
        for (int k = 0; k < r->n_layers; k++) {
            int l = r->order[k];
            json_array_append_new(list, json_pack("{s:s, s:s, s:f, s:f}", "name", r->layer_name[l], "op",
                                                  r->layer_op[l], "ms", r->layer_ms[l], "percent",
                                                  r->layer_total > 0 ? 100.0 * r->layer_ms[l] / r->layer_total : 0.0));
        }
        json_object_set_new(root, "layer_profile",
                            json_pack("{s:s, s:f, s:o}", "clock", r->has_gpu ? "gpu" : "host", "total_ms",
                                      r->layer_total, "layers", list));
    }
    if (o->check) {
        json_t *list = json_array();
        int all = 1;
        for (int i = 0; i < n_io; i++) {
            if (io[i].is_input)
                continue;
            all &= io[i].pass;
            json_array_append_new(list, json_pack("{s:s, s:f, s:f, s:f, s:f, s:b}", "name", io[i].name, "max_abs_error",
                                                  isinf(io[i].max_abs) ? 1e308 : io[i].max_abs, "max_rel_error",
                                                  isinf(io[i].max_rel) ? 1e308 : io[i].max_rel, "atol", io[i].atol,
                                                  "rtol", io[i].rtol, "pass", io[i].pass));
        }
        json_object_set_new(root, "check",
                            json_pack("{s:b, s:s, s:o}", "pass", all, "reference", "cpu", "outputs", list));
    }
    if (o->save_dir)
        json_object_set_new(root, "saved_outputs", json_string(o->save_dir));
    return root;
}

static void report_text(const exec_opts *o, kiln_engine *e, io_tensor *io, int n_io, const exec_result *r)
{
    char buf[160];
    printf("engine %s: %s, profile %ld%s\n", o->engine, kiln_backend_name(kiln_engine_backend(e)), o->profile_index,
           o->cuda_graph ? ", CUDA graph" : "");
    for (int i = 0; i < n_io; i++)
        printf("%-6s %-16s %-5s %s%s%s\n", io[i].is_input ? "input" : "output", io[i].name,
               kiln_dtype_name(io[i].dtype), kiln_dims_format(&io[i].dims, buf, sizeof buf),
               io[i].is_input ? (io[i].file_arg ? "  from " : "  random") : "",
               io[i].is_input && io[i].file_arg ? io[i].file_arg : "");
    printf("latency over %ld iterations (%ld warm-up): min %.4f ms, median %.4f ms, p99 %.4f ms, mean %.4f ms\n",
           o->iterations, o->warmup, r->lat[0], r->lat[1], r->lat[2], r->lat[3]);
    if (r->has_gpu)
        printf("GPU time (CUDA events):        min %.4f ms, median %.4f ms, p99 %.4f ms, mean %.4f ms\n", r->gpu[0],
               r->gpu[1], r->gpu[2], r->gpu[3]);
    if (r->n_layers) {
        printf("per-layer %s time of one run (%.4f ms in layers):\n", r->has_gpu ? "GPU" : "host", r->layer_total);
        printf("  %-32s %-18s %10s %7s\n", "layer", "op", "ms", "%");
        for (int k = 0; k < r->n_layers; k++) {
            int l = r->order[k];
            printf("  %-32s %-18s %10.4f %6.1f%%\n", r->layer_name[l], r->layer_op[l], r->layer_ms[l],
                   r->layer_total > 0 ? 100.0 * r->layer_ms[l] / r->layer_total : 0.0);
        }
    }
    if (o->check)
        for (int i = 0; i < n_io; i++)
            if (!io[i].is_input)
                printf("check %s: max abs error %.3g, max rel error %.3g (atol %g, rtol %g): %s\n", io[i].name,
                       io[i].max_abs, io[i].max_rel, io[i].atol, io[i].rtol, io[i].pass ? "PASS" : "FAIL");
    if (o->save_dir)
        printf("outputs saved to %s\n", o->save_dir);
}

/* ---- the command ------------------------------------------------------------------------- */

/* On cuda, device outputs to the host buffers (`ref`: the reference's). */
static int fetch_outputs(kiln_context *ctx, io_tensor *io, int n_io, int ref)
{
    for (int i = 0; i < n_io; i++)
        if (!io[i].is_input &&
            kiln_context_copy_output(ctx, io[i].name, ref ? io[i].ref : io[i].data, io[i].bytes) != KILN_OK)
            return cli_kiln_error();
    if (kiln_context_synchronize(ctx) != KILN_OK)
        return cli_kiln_error();
    return CLI_OK;
}

static const exec_result *sort_layers_by;

static int cmp_layer(const void *a, const void *b)
{
    double x = sort_layers_by->layer_ms[*(const int *)a], y = sort_layers_by->layer_ms[*(const int *)b];
    return (x < y) - (x > y);
}

/* One extra run with per-layer timing (never in a graph: events between
 * layers need the plain launches). */
static int profile_layers(const exec_opts *o, kiln_context *ctx, exec_result *r)
{
    int n = kiln_context_num_layers(ctx);
    if ((o->cuda_graph && kiln_context_set_cuda_graph(ctx, 0) != KILN_OK) ||
        kiln_context_set_profiling(ctx, 1) != KILN_OK || kiln_context_enqueue(ctx, NULL) != KILN_OK ||
        kiln_context_synchronize(ctx) != KILN_OK)
        return cli_kiln_error();
    r->order = calloc((size_t)(n ? n : 1), sizeof *r->order);
    r->layer_name = calloc((size_t)(n ? n : 1), sizeof *r->layer_name);
    r->layer_op = calloc((size_t)(n ? n : 1), sizeof *r->layer_op);
    r->layer_ms = calloc((size_t)(n ? n : 1), sizeof *r->layer_ms);
    if (!r->order || !r->layer_name || !r->layer_op || !r->layer_ms)
        return cli_error("out of memory");
    r->layer_total = 0;
    for (int l = 0; l < n; l++) {
        if (kiln_context_layer_time(ctx, l, &r->layer_name[l], &r->layer_op[l], &r->layer_ms[l]) != KILN_OK)
            return cli_kiln_error();
        r->order[l] = l;
        r->layer_total += r->layer_ms[l];
    }
    sort_layers_by = r;
    qsort(r->order, (size_t)n, sizeof *r->order, cmp_layer);
    r->n_layers = n;
    if (kiln_context_set_profiling(ctx, 0) != KILN_OK ||
        (o->cuda_graph && kiln_context_set_cuda_graph(ctx, 1) != KILN_OK))
        return cli_kiln_error();
    return CLI_OK;
}

static int timed_runs(const exec_opts *o, kiln_context *ctx, int cuda, exec_result *r)
{
    for (long i = 0; i < o->warmup; i++)
        if (kiln_context_enqueue(ctx, NULL) != KILN_OK || kiln_context_synchronize(ctx) != KILN_OK)
            return cli_kiln_error();
    double *times = calloc((size_t)o->iterations, sizeof *times);
    double *gpu = calloc((size_t)o->iterations, sizeof *gpu);
    if (!times || !gpu) {
        free(times);
        free(gpu);
        return cli_error("out of memory");
    }
    int st = CLI_OK;
    for (long i = 0; i < o->iterations && st == CLI_OK; i++) {
        double t0 = now_ms();
        float ms = 0;
        if (kiln_context_enqueue(ctx, NULL) != KILN_OK || kiln_context_synchronize(ctx) != KILN_OK)
            st = cli_kiln_error();
        times[i] = now_ms() - t0;
        if (st == CLI_OK && cuda && kiln_context_gpu_time(ctx, &ms) != KILN_OK)
            st = cli_kiln_error();
        gpu[i] = ms;
    }
    if (st == CLI_OK) {
        summarize(times, o->iterations, r->lat);
        summarize(gpu, o->iterations, r->gpu);
        r->has_gpu = cuda;
    }
    free(times);
    free(gpu);
    return st;
}

static int run(const exec_opts *o, kiln_engine *e, kiln_context *ctx, io_tensor *io, int n_io, exec_result *r)
{
    int cuda = kiln_engine_backend(e) == KILN_BACKEND_CUDA;
    if (o->cuda_graph && !cuda)
        return cli_error("--cuda-graph needs an engine built for cuda; %s is built for %s", o->engine,
                         kiln_backend_name(kiln_engine_backend(e)));
    if (kiln_context_set_profile(ctx, (int32_t)o->profile_index) != KILN_OK)
        return cli_kiln_error();
    if (check_arg_names(e, o->shapes, o->n_shapes, ':', "--shapes") ||
        check_arg_names(e, o->inputs, o->n_inputs, '=', "--input"))
        return CLI_FAILURE;
    for (int i = 0; i < n_io; i++) {
        io_tensor *t = &io[i];
        t->name = kiln_engine_io_tensor_name(e, i);
        if (kiln_engine_io_tensor_info(e, t->name, &t->dtype, &t->is_input, NULL) != KILN_OK)
            return cli_kiln_error();
        if (!t->is_input)
            continue;
        t->shape_arg = find_arg(o->shapes, o->n_shapes, t->name, ':');
        t->file_arg = find_arg(o->inputs, o->n_inputs, t->name, '=');
        size_t npy_bytes;
        if (t->file_arg && kiln_npy_read(t->file_arg, &t->npy_dtype, &t->npy_dims, &t->npy, &npy_bytes) != KILN_OK)
            return cli_kiln_error();
        int st = input_shape(e, o, t);
        if (st)
            return st;
        if (kiln_context_set_input_shape(ctx, t->name, &t->dims) != KILN_OK)
            return cli_kiln_error();
    }
    for (int i = 0; i < n_io; i++) {
        io_tensor *t = &io[i];
        if (kiln_context_tensor_shape(ctx, t->name, &t->dims) != KILN_OK ||
            kiln_dims_bytes(&t->dims, t->dtype, &t->bytes) != KILN_OK)
            return cli_kiln_error();
        t->data = calloc(1, t->bytes ? t->bytes : 1);
        if (!t->is_input && o->check)
            t->ref = calloc(1, t->bytes ? t->bytes : 1);
        if (!t->data || (!t->is_input && o->check && !t->ref))
            return cli_error("out of memory for %zu bytes of tensor \"%s\"", t->bytes, t->name);
        if (t->is_input) {
            if (t->file_arg) {
                int st = load_npy(t);
                if (st)
                    return st;
            } else {
                fill_random(t, 0x9E3779B97F4A7C15ULL + (uint64_t)i);
            }
        }
        /* On cuda the tensors stay in the context's device memory: inputs
         * are copied in once, outputs fetched after the runs. */
        if (cuda ? t->is_input && kiln_context_copy_input(ctx, t->name, t->data, t->bytes) != KILN_OK
                 : kiln_context_set_tensor_address(ctx, t->name, t->data) != KILN_OK)
            return cli_kiln_error();
    }
    if (o->cuda_graph && kiln_context_set_cuda_graph(ctx, 1) != KILN_OK)
        return cli_kiln_error();

    int st = timed_runs(o, ctx, cuda, r);
    if (st == CLI_OK && cuda)
        st = fetch_outputs(ctx, io, n_io, 0);
    if (st == CLI_OK && o->profile)
        st = profile_layers(o, ctx, r);
    if (st)
        return st;

    int all_pass = 1;
    if (o->check) {
        /* The reference writes where the outputs are: on cuda the device
         * tensors (the timed results are on the host already), on the CPU
         * the reference buffers bound in their place. */
        for (int i = 0; !cuda && i < n_io; i++)
            if (!io[i].is_input && kiln_context_set_tensor_address(ctx, io[i].name, io[i].ref) != KILN_OK)
                return cli_kiln_error();
        if (kiln_context_run_reference(ctx) != KILN_OK)
            return cli_kiln_error();
        if (cuda && (st = fetch_outputs(ctx, io, n_io, 1)) != CLI_OK)
            return st;
        for (int i = 0; i < n_io; i++)
            if (!io[i].is_input) {
                compare(&io[i], o);
                all_pass &= io[i].pass;
            }
    }
    if (o->save_dir) {
        if (mkdir(o->save_dir, 0777) != 0 && errno != EEXIST)
            return cli_error("cannot create %s: %s", o->save_dir, strerror(errno));
        for (int i = 0; i < n_io; i++)
            if (!io[i].is_input && save_output(&io[i], o->save_dir))
                return CLI_FAILURE;
    }
    if (o->json) {
        json_t *root = report_json(o, e, io, n_io, r);
        char *text = json_dumps(root, JSON_INDENT(2));
        printf("%s\n", text ? text : "{}");
        free(text);
        json_decref(root);
    } else {
        report_text(o, e, io, n_io, r);
    }
    fflush(stdout);
    if (!all_pass) {
        for (int i = 0; i < n_io; i++)
            if (!io[i].is_input && !io[i].pass)
                return cli_error("check failed: output \"%s\" differs from the reference by up to %.3g "
                                 "(abs), %.3g (rel), beyond atol %g + rtol %g",
                                 io[i].name, io[i].max_abs, io[i].max_rel, io[i].atol, io[i].rtol);
    }
    return CLI_OK;
}

int cli_exec(int argc, char **argv)
{
    exec_opts o;
    memset(&o, 0, sizeof o);
    o.iterations = 10;
    o.warmup = 2;
    o.atol = o.rtol = -1;
    o.libs = calloc((size_t)argc + 1, sizeof *o.libs);
    o.shapes = calloc((size_t)argc + 1, sizeof *o.shapes);
    o.inputs = calloc((size_t)argc + 1, sizeof *o.inputs);
    int help = 0;
    int st = parse_opts(argc, argv, &o, &help);
    if (st == CLI_OK && help)
        fputs(exec_help, stdout);
    if (st != CLI_OK || help)
        goto done;

    kiln_registry *reg = NULL;
    kiln_engine *engine = NULL;
    kiln_context *ctx = NULL;
    io_tensor *io = NULL;
    int n_io = 0;
    exec_result result;
    memset(&result, 0, sizeof result);
    if ((st = cli_registry(o.libs, o.n_libs, &reg)) != CLI_OK)
        goto done;
    if (kiln_engine_load(reg, o.engine, &engine) != KILN_OK || kiln_context_create(engine, &ctx) != KILN_OK) {
        st = cli_kiln_error();
    } else {
        n_io = kiln_engine_num_io_tensors(engine);
        io = calloc((size_t)(n_io ? n_io : 1), sizeof *io);
        st = io ? run(&o, engine, ctx, io, n_io, &result) : cli_error("out of memory");
    }
    kiln_context_destroy(ctx);
    for (int i = 0; io && i < n_io; i++) {
        free(io[i].data);
        free(io[i].ref);
        kiln_free(io[i].npy);
    }
    free(io);
    free(result.order);
    free(result.layer_name);
    free(result.layer_op);
    free(result.layer_ms);
    kiln_engine_destroy(engine);
    kiln_registry_destroy(reg);
done:
    free(o.libs);
    free(o.shapes);
    free(o.inputs);
    return st;
}
