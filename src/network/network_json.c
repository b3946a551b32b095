/* The network JSON format (docs/network-format.md), built on the public
 * network API only: every layer goes through kiln_network_add_*, so a JSON
 * network gets exactly the checks a C-defined one gets.
 *
 * Strict by design: an unknown key anywhere is an error, so a misspelled
 * field never silently falls back to a default. Every error is one line:
 *   <file>: layer "fc" (index 3): field "transpose_b": expected a boolean
 */
#include <kiln/kiln.h>

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"
#include "core/npy.h"
#include "core/op_table.h"
#include "core/safetensors.h"

#define FORMAT_VERSION 1

/* Most outputs one plugin layer may have here; more is surely a mistake. */
#define MAX_PLUGIN_OUTPUTS 64

/* ---- context and errors ------------------------------------------------------------ */

typedef struct st_file {
    char *path;
    kiln_safetensors *st;
} st_file;

typedef struct jctx {
    kiln_network *net;
    const char *what;       /* source name for messages */
    const char *base_dir;   /* side files resolve here; NULL: none allowed */
    char where[320];        /* "layer \"fc\" (index 3)", "input 0", ... */
    const char *layer_name; /* the layer being read, when it has a name */
    const kiln_op_info *op; /* its op's row of the op table */
    st_file *files;         /* safetensors files opened so far, shared by layers */
    int32_t n_files;
} jctx;

static void set_where(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_where(jctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->where, sizeof c->where, fmt, ap);
    va_end(ap);
}

/* "<what>: <where>: field "<field>": <message>" (field may be NULL). */
static kiln_status jfail(jctx *c, kiln_status status, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static kiln_status jfail(jctx *c, kiln_status status, const char *field, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (field)
        return kiln_fail(status, "%s: %s: field \"%s\": %s", c->what, c->where, field, msg);
    return kiln_fail(status, "%s: %s: %s", c->what, c->where, msg);
}

/* An error from a call below (network API, npy, safetensors) gets the
 * source and place prefixed; its own message already names the details.
 * The network API starts its messages with `layer "<name>": `, which the
 * place already says for a named layer. */
static kiln_status jwrap(jctx *c, kiln_status status)
{
    if (c->layer_name) {
        char own[320];
        snprintf(own, sizeof own, "layer \"%s\": ", c->layer_name);
        const char *msg = kiln_last_error();
        if (strncmp(msg, own, strlen(own)) == 0) {
            char rest[1024];
            snprintf(rest, sizeof rest, "%s", msg + strlen(own));
            return kiln_fail(status, "%s: %s: %s", c->what, c->where, rest);
        }
    }
    return kiln_fail_context(status, "%s: %s", c->what, c->where);
}

/* ---- typed field access ------------------------------------------------------------- */

/* Fails on a key not in `allowed` (NULL-terminated). */
static kiln_status check_keys(jctx *c, json_t *obj, const char *const *allowed)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(*a, key) == 0;
        if (!ok)
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL, "unknown field \"%s\"", key);
    }
    return KILN_OK;
}

static json_t *need(jctx *c, json_t *obj, const char *key, kiln_status *st)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        *st = jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "missing");
    return v;
}

static kiln_status get_bool(jctx *c, json_t *obj, const char *key, int32_t def, int32_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = def;
        return KILN_OK;
    }
    if (!json_is_boolean(v))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "expected a boolean");
    *out = json_is_true(v);
    return KILN_OK;
}

/* "<prefix>5 is below 1" / "is above 7" / "is outside -8..7". */
static kiln_status range_fail(jctx *c, const char *key, const char *prefix, int64_t x, int64_t lo, int64_t hi)
{
    if (hi == INT64_MAX)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "%s%lld is below %lld", prefix, (long long)x, (long long)lo);
    return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "%s%lld is outside %lld..%lld", prefix, (long long)x,
                 (long long)lo, (long long)hi);
}

static kiln_status as_int(jctx *c, json_t *v, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    if (!json_is_integer(v))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "expected an integer");
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return range_fail(c, key, "", x, lo, hi);
    *out = x;
    return KILN_OK;
}

/* An optional int32 (def when absent). */
static kiln_status get_axis(jctx *c, json_t *obj, const char *key, int32_t def, int32_t *out)
{
    json_t *v = json_object_get(obj, key);
    int64_t x = def;
    if (v)
        KILN_TRY(as_int(c, v, key, -KILN_MAX_RANK, KILN_MAX_RANK - 1, &x));
    *out = (int32_t)x;
    return KILN_OK;
}

/* `label` names the field in messages ("plugin.name" for a nested key). */
static kiln_status get_string_as(jctx *c, json_t *obj, const char *key, const char *label, int required,
                                 const char **out)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, label, "missing");
        *out = NULL;
        return KILN_OK;
    }
    if (!json_is_string(v))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, label, "expected a string");
    *out = json_string_value(v);
    return KILN_OK;
}

static kiln_status get_string(jctx *c, json_t *obj, const char *key, int required, const char **out)
{
    return get_string_as(c, obj, key, key, required, out);
}

/* An array of at most KILN_MAX_RANK integers in lo..hi. */
static kiln_status as_int_list(jctx *c, json_t *v, const char *key, int64_t lo, int64_t hi, int64_t *out, int32_t *n)
{
    if (!json_is_array(v))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "expected an array of integers");
    if (json_array_size(v) > KILN_MAX_RANK)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "%zu entries exceed the maximum rank %d", json_array_size(v),
                     KILN_MAX_RANK);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e))
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "entry %zu: expected an integer", i);
        int64_t x = json_integer_value(e);
        if (x < lo || x > hi) {
            char entry[32];
            snprintf(entry, sizeof entry, "entry %zu: ", i);
            return range_fail(c, key, entry, x, lo, hi);
        }
        out[i] = x;
    }
    *n = (int32_t)json_array_size(v);
    return KILN_OK;
}

static kiln_status as_dims(jctx *c, json_t *v, const char *key, int64_t lo, kiln_dims *out)
{
    kiln_dims d = {0};
    KILN_TRY(as_int_list(c, v, key, lo, INT64_MAX, d.d, &d.rank));
    *out = d;
    return KILN_OK;
}

static kiln_status get_dtype(jctx *c, json_t *obj, const char *key, int required, int *given, kiln_dtype *out)
{
    const char *name = NULL;
    KILN_TRY(get_string(c, obj, key, required, &name));
    *given = name != NULL;
    if (!name)
        return KILN_OK;
    if (kiln_dtype_parse(name, out) != KILN_OK)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key,
                     "unknown dtype \"%s\" (expected f32, f16, bf16, i8, u8, i32, i64 or bool)", name);
    return KILN_OK;
}

/* A tensor reference: an input name or an earlier layer's output name. */
static kiln_status find_tensor(jctx *c, json_t *v, const char *key, size_t i, kiln_tensor *out)
{
    if (!json_is_string(v))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "entry %zu: expected a tensor name", i);
    const char *name = json_string_value(v);
    if (kiln_network_find_tensor(c->net, name, out) != KILN_OK)
        return jfail(c, KILN_ERROR_NOT_FOUND, key, "unknown tensor \"%s\" (inputs and earlier layers only)", name);
    return KILN_OK;
}

/* The layer's "inputs": between lo and hi names. *out is malloc'd. */
/* The layer's "inputs", as many as its op takes (core/op_table.h). */
static kiln_status get_inputs(jctx *c, json_t *obj, kiln_tensor **out, int32_t *n)
{
    size_t lo = (size_t)c->op->min_inputs;
    size_t hi = c->op->max_inputs < 0 ? SIZE_MAX : (size_t)c->op->max_inputs;
    json_t *v = json_object_get(obj, "inputs");
    if (!v)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "inputs", "missing");
    if (!json_is_array(v))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "inputs", "expected an array of tensor names");
    size_t k = json_array_size(v);
    if (k < lo || k > hi) {
        if (lo == hi)
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "inputs", "expected %zu tensor%s, got %zu", lo,
                         lo == 1 ? "" : "s", k);
        if (k > hi)
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "inputs", "expected at most %zu tensors, got %zu", hi, k);
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "inputs", "expected at least %zu tensor%s", lo,
                     lo == 1 ? "" : "s");
    }
    kiln_tensor *t = malloc((k ? k : 1) * sizeof *t);
    if (!t)
        return jfail(c, KILN_ERROR_OUT_OF_MEMORY, "inputs", "out of memory");
    for (size_t i = 0; i < k; i++) {
        kiln_status s = find_tensor(c, json_array_get(v, i), "inputs", i, &t[i]);
        if (s) {
            free(t);
            return s;
        }
    }
    *out = t;
    *n = (int32_t)k;
    return KILN_OK;
}

static int32_t rank_of(jctx *c, kiln_tensor t)
{
    kiln_dtype dt = KILN_DTYPE_F32;
    int32_t rank = 0;
    if (kiln_network_tensor_info(c->net, t, &dt, &rank) != KILN_OK)
        return -1;
    return rank;
}

/* ---- constant data ------------------------------------------------------------------ */

/* Element count of static dims, overflow-checked. */
static kiln_status count_of(jctx *c, const kiln_dims *d, size_t *out)
{
    size_t n = 1;
    for (int32_t i = 0; i < d->rank; i++)
        if (kiln_mul_overflow(n, (size_t)d->d[i], &n))
            return jfail(c, KILN_ERROR_SHAPE, "dims", "element count overflows");
    *out = n;
    return KILN_OK;
}

/* Stores JSON number `v` as element i of buf (dtype t), refusing values the
 * dtype cannot hold rather than wrapping or saturating them. */
static kiln_status store_element(jctx *c, const char *key, void *buf, kiln_dtype t, size_t i, json_t *v)
{
    if (kiln_dtype_is_float(t)) {
        if (!json_is_number(v))
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "entry %zu: expected a number", i);
        double x = json_number_value(v);
        if (fabs(x) > FLT_MAX)
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "entry %zu: %g overflows %s", i, x, kiln_dtype_name(t));
        kiln_store_f32(buf, t, (int64_t)i, (float)x);
        if (isinf(kiln_load_f32(buf, t, (int64_t)i)))
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "entry %zu: %g overflows %s", i, x, kiln_dtype_name(t));
        return KILN_OK;
    }
    int64_t x = 0;
    if (t == KILN_DTYPE_BOOL && json_is_boolean(v))
        x = json_is_true(v);
    else if (json_is_integer(v))
        x = json_integer_value(v);
    else
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "entry %zu: expected an integer%s", i,
                     t == KILN_DTYPE_BOOL ? " or a boolean" : "");
    int64_t lo = 0, hi = 0;
    switch (t) {
    case KILN_DTYPE_I8:
        lo = INT8_MIN;
        hi = INT8_MAX;
        break;
    case KILN_DTYPE_U8:
        lo = 0;
        hi = UINT8_MAX;
        break;
    case KILN_DTYPE_I32:
        lo = INT32_MIN;
        hi = INT32_MAX;
        break;
    case KILN_DTYPE_I64:
        lo = INT64_MIN;
        hi = INT64_MAX;
        break;
    case KILN_DTYPE_BOOL:
        lo = 0;
        hi = 1;
        break;
    default:
        return jfail(c, KILN_ERROR_UNSUPPORTED, "dtype", "%s constants cannot be written inline", kiln_dtype_name(t));
    }
    if (x < lo || x > hi)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "entry %zu: %lld does not fit %s", i, (long long)x,
                     kiln_dtype_name(t));
    switch (t) {
    case KILN_DTYPE_I8: ((int8_t *)buf)[i] = (int8_t)x; break;
    case KILN_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)x; break;
    case KILN_DTYPE_I64: ((int64_t *)buf)[i] = x; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)x; break; /* u8, bool */
    }
    return KILN_OK;
}

static kiln_status inline_data(jctx *c, json_t *data, kiln_dtype t, const kiln_dims *dims, void **out)
{
    size_t count = 0, bytes = 0;
    KILN_TRY(count_of(c, dims, &count));
    if (!json_is_array(data))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "data", "expected a flat array of numbers");
    if (json_array_size(data) != count)
        return jfail(c, KILN_ERROR_SHAPE, "data", "has %zu values, dims need %zu", json_array_size(data), count);
    if (kiln_mul_overflow(count, kiln_dtype_size(t), &bytes))
        return jfail(c, KILN_ERROR_SHAPE, "dims", "byte size overflows");
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf)
        return jfail(c, KILN_ERROR_OUT_OF_MEMORY, "data", "out of memory for %zu bytes", bytes);
    for (size_t i = 0; i < count; i++) {
        kiln_status s = store_element(c, "data", buf, t, i, json_array_get(data, i));
        if (s) {
            free(buf);
            return s;
        }
    }
    *out = buf;
    return KILN_OK;
}

/* base_dir + "/" + rel, where rel must stay inside base_dir: no absolute
 * path and no ".." component (a network file must not read arbitrary files
 * of whoever loads it). */
static kiln_status resolve_path(jctx *c, const char *rel, char **out)
{
    if (!c->base_dir)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "file", "side files are not allowed here (no base folder)");
    if (!rel[0] || rel[0] == '/')
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "file",
                     "\"%s\": expected a relative path inside the network's folder", rel);
    for (const char *p = rel; *p;) {
        size_t len = strcspn(p, "/");
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "file",
                         "\"%s\": \"..\" is not allowed (side files stay inside the network's "
                         "folder)",
                         rel);
        p += len;
        if (*p == '/')
            p++;
    }
    size_t n = strlen(c->base_dir) + strlen(rel) + 2;
    char *path = malloc(n);
    if (!path)
        return jfail(c, KILN_ERROR_OUT_OF_MEMORY, "file", "out of memory");
    snprintf(path, n, "%s/%s", c->base_dir, rel);
    *out = path;
    return KILN_OK;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Opens a safetensors file once per load; later layers reuse it. */
static kiln_status open_safetensors(jctx *c, const char *path, kiln_safetensors **out)
{
    for (int32_t i = 0; i < c->n_files; i++) {
        if (strcmp(c->files[i].path, path) == 0) {
            *out = c->files[i].st;
            return KILN_OK;
        }
    }
    st_file *grown = realloc(c->files, ((size_t)c->n_files + 1) * sizeof *grown);
    if (!grown)
        return jfail(c, KILN_ERROR_OUT_OF_MEMORY, "file", "out of memory");
    c->files = grown;
    kiln_safetensors *st;
    kiln_status s = kiln_safetensors_open(path, &st);
    if (s)
        return jwrap(c, s);
    char *copy = kiln_strdup(path);
    if (!copy) {
        kiln_safetensors_destroy(st);
        return jfail(c, KILN_ERROR_OUT_OF_MEMORY, "file", "out of memory");
    }
    c->files[c->n_files].path = copy;
    c->files[c->n_files].st = st;
    c->n_files++;
    *out = st;
    return KILN_OK;
}

/* Reads a side file into a malloc'd buffer; *dtype and *dims from the file. */
static kiln_status file_data(jctx *c, json_t *layer, const char *rel, kiln_dtype *dtype, kiln_dims *dims, void **out)
{
    const char *tensor = NULL;
    KILN_TRY(get_string(c, layer, "tensor", 0, &tensor));
    char *path = NULL;
    KILN_TRY(resolve_path(c, rel, &path));
    kiln_status s = KILN_OK;
    if (ends_with(rel, ".npy")) {
        size_t size = 0;
        if (tensor)
            s = jfail(c, KILN_ERROR_INVALID_ARGUMENT, "tensor", "only for .safetensors files");
        else if ((s = kiln_npy_read(path, dtype, dims, out, &size)) != KILN_OK)
            s = jwrap(c, s);
    } else if (ends_with(rel, ".safetensors")) {
        kiln_safetensors *st = NULL;
        const kiln_safetensors_tensor *t = NULL;
        if (!tensor)
            s = jfail(c, KILN_ERROR_INVALID_ARGUMENT, "tensor", "missing (the name inside \"%s\")", rel);
        if (!s)
            s = open_safetensors(c, path, &st);
        if (!s && (s = kiln_safetensors_find(st, tensor, &t)) != KILN_OK)
            s = jwrap(c, s);
        if (!s) {
            /* A copy: the mapping is unaligned and lives only for this load. */
            void *buf = malloc(t->size ? t->size : 1);
            if (!buf)
                s = jfail(c, KILN_ERROR_OUT_OF_MEMORY, "file", "out of memory for %zu bytes", t->size);
            else {
                memcpy(buf, t->data, t->size);
                *dtype = t->dtype;
                *dims = t->dims;
                *out = buf;
            }
        }
    } else {
        s = jfail(c, KILN_ERROR_INVALID_ARGUMENT, "file", "\"%s\": expected a .npy or .safetensors file", rel);
    }
    free(path);
    return s;
}

static int dims_equal(const kiln_dims *a, const kiln_dims *b)
{
    if (a->rank != b->rank)
        return 0;
    for (int32_t i = 0; i < a->rank; i++)
        if (a->d[i] != b->d[i])
            return 0;
    return 1;
}

/* "[4, 3]" into buf. */
static const char *fmt_dims(const kiln_dims *d, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int32_t i = 0; i < d->rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)d->d[i]);
    if (n < size)
        snprintf(buf + n, size - n, "]");
    return buf;
}

static int convertible(kiln_dtype t)
{
    return t < KILN_DTYPE_COUNT && t != KILN_DTYPE_FP8_E4M3 && t != KILN_DTYPE_FP8_E5M2;
}

/* ---- layers ---------------------------------------------------------------------- */

static kiln_status layer_constant(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "dtype", "dims", "data", "file", "tensor", NULL};
    KILN_TRY(check_keys(c, l, keys));
    json_t *data = json_object_get(l, "data");
    const char *file = NULL;
    KILN_TRY(get_string(c, l, "file", 0, &file));
    if (data && file)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL, "give either \"data\" or \"file\", not both");
    if (!data && !file)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL, "needs \"data\" or \"file\"");
    kiln_dtype dtype = KILN_DTYPE_F32;
    int has_dtype = 0;
    KILN_TRY(get_dtype(c, l, "dtype", data != NULL, &has_dtype, &dtype));
    kiln_dims dims = {0};
    json_t *jd = json_object_get(l, "dims");
    if (jd)
        KILN_TRY(as_dims(c, jd, "dims", 0, &dims));
    else if (data)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "dims", "missing");
    if (!file && json_object_get(l, "tensor"))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "tensor", "only with \"file\"");

    void *buf = NULL;
    if (data) {
        KILN_TRY(inline_data(c, data, dtype, &dims, &buf));
    } else {
        kiln_dtype fdtype = KILN_DTYPE_F32;
        kiln_dims fdims = {0};
        KILN_TRY(file_data(c, l, file, &fdtype, &fdims, &buf));
        kiln_status s = KILN_OK;
        if (jd && !dims_equal(&dims, &fdims)) {
            char want[200], got[200];
            s = jfail(c, KILN_ERROR_SHAPE, "dims", "%s does not match %s in \"%s\"", fmt_dims(&dims, want, sizeof want),
                      fmt_dims(&fdims, got, sizeof got), file);
        }
        dims = fdims;
        size_t count = 0, bytes = 0;
        if (!s && has_dtype && dtype != fdtype) {
            /* Weights are often stored wider than they are used (bf16 has
             * no .npy form, so it arrives as f32): convert. */
            void *conv = NULL;
            if (!convertible(fdtype) || !convertible(dtype))
                s = jfail(c, KILN_ERROR_UNSUPPORTED, "dtype", "cannot convert %s to %s", kiln_dtype_name(fdtype),
                          kiln_dtype_name(dtype));
            if (!s)
                s = count_of(c, &dims, &count);
            if (!s && kiln_mul_overflow(count, kiln_dtype_size(dtype), &bytes))
                s = jfail(c, KILN_ERROR_SHAPE, "dims", "byte size overflows");
            if (!s && !(conv = malloc(bytes ? bytes : 1)))
                s = jfail(c, KILN_ERROR_OUT_OF_MEMORY, "dtype", "out of memory");
            if (!s) {
                kiln_convert(conv, dtype, buf, fdtype, (int64_t)count);
                free(buf);
                buf = conv;
            }
        } else {
            dtype = fdtype;
        }
        if (s) {
            free(buf);
            return s;
        }
    }
    kiln_tensor out;
    kiln_status s = kiln_network_add_constant(c->net, name, dtype, &dims, buf, &out);
    free(buf);
    return s ? jwrap(c, s) : KILN_OK;
}

static kiln_status layer_matmul(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "transpose_a", "transpose_b", NULL};
    KILN_TRY(check_keys(c, l, keys));
    int32_t ta = 0, tb = 0, n = 0;
    KILN_TRY(get_bool(c, l, "transpose_a", 0, &ta));
    KILN_TRY(get_bool(c, l, "transpose_b", 0, &tb));
    kiln_tensor *in = NULL, out;
    KILN_TRY(get_inputs(c, l, &in, &n));
    kiln_status s = kiln_network_add_matmul(c->net, name, in[0], ta, in[1], tb, &out);
    free(in);
    return s ? jwrap(c, s) : KILN_OK;
}

static kiln_status layer_binary(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "kind", NULL};
    KILN_TRY(check_keys(c, l, keys));
    const char *kind = NULL;
    kiln_binary_op op;
    KILN_TRY(get_string(c, l, "kind", 1, &kind));
    if (kiln_binary_op_parse(kind, &op) != KILN_OK)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "kind", "%s", kiln_last_error());
    kiln_tensor *in = NULL, out;
    int32_t n = 0;
    KILN_TRY(get_inputs(c, l, &in, &n));
    kiln_status s = kiln_network_add_binary(c->net, name, op, in[0], in[1], &out);
    free(in);
    return s ? jwrap(c, s) : KILN_OK;
}

static kiln_status layer_unary(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "kind", NULL};
    KILN_TRY(check_keys(c, l, keys));
    const char *kind = NULL;
    kiln_unary_op op;
    KILN_TRY(get_string(c, l, "kind", 1, &kind));
    if (kiln_unary_op_parse(kind, &op) != KILN_OK)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "kind", "%s", kiln_last_error());
    kiln_tensor *in = NULL, out;
    int32_t n = 0;
    KILN_TRY(get_inputs(c, l, &in, &n));
    kiln_status s = kiln_network_add_unary(c->net, name, op, in[0], &out);
    free(in);
    return s ? jwrap(c, s) : KILN_OK;
}

static kiln_status layer_reduce(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "kind", "axes", "keep_dims", NULL};
    KILN_TRY(check_keys(c, l, keys));
    const char *kind = NULL;
    kiln_reduce_op op;
    KILN_TRY(get_string(c, l, "kind", 1, &kind));
    if (kiln_reduce_op_parse(kind, &op) != KILN_OK)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "kind", "%s", kiln_last_error());
    int32_t keep = 0, n = 0, n_axes = 0;
    KILN_TRY(get_bool(c, l, "keep_dims", 0, &keep));
    kiln_status s = KILN_OK;
    json_t *ja = need(c, l, "axes", &s);
    if (!ja)
        return s;
    int64_t axes[KILN_MAX_RANK];
    KILN_TRY(as_int_list(c, ja, "axes", -KILN_MAX_RANK, KILN_MAX_RANK - 1, axes, &n_axes));
    kiln_tensor *in = NULL, out;
    KILN_TRY(get_inputs(c, l, &in, &n));
    int32_t rank = rank_of(c, in[0]);
    uint32_t mask = 0;
    for (int32_t i = 0; i < n_axes && !s; i++) {
        int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
        if (a < 0 || a >= rank)
            s = jfail(c, KILN_ERROR_INVALID_ARGUMENT, "axes", "axis %lld is out of range for rank %d",
                      (long long)axes[i], rank);
        else if (mask & (1u << a))
            s = jfail(c, KILN_ERROR_INVALID_ARGUMENT, "axes", "axis %lld is listed twice", (long long)axes[i]);
        else
            mask |= 1u << a;
    }
    if (!s && (s = kiln_network_add_reduce(c->net, name, op, in[0], mask, keep, &out)) != KILN_OK)
        s = jwrap(c, s);
    free(in);
    return s;
}

static kiln_status layer_softmax(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "axis", NULL};
    KILN_TRY(check_keys(c, l, keys));
    int32_t axis = 0, n = 0;
    KILN_TRY(get_axis(c, l, "axis", -1, &axis));
    kiln_tensor *in = NULL, out;
    KILN_TRY(get_inputs(c, l, &in, &n));
    kiln_status s = kiln_network_add_softmax(c->net, name, in[0], axis, &out);
    free(in);
    return s ? jwrap(c, s) : KILN_OK;
}

static kiln_status layer_concat(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "axis", NULL};
    KILN_TRY(check_keys(c, l, keys));
    if (!json_object_get(l, "axis"))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "axis", "missing");
    int32_t axis = 0, n = 0;
    KILN_TRY(get_axis(c, l, "axis", 0, &axis));
    kiln_tensor *in = NULL, out;
    KILN_TRY(get_inputs(c, l, &in, &n));
    kiln_status s = kiln_network_add_concat(c->net, name, in, n, axis, &out);
    free(in);
    return s ? jwrap(c, s) : KILN_OK;
}

static kiln_status layer_slice(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "start", "size", "stride", NULL};
    KILN_TRY(check_keys(c, l, keys));
    int64_t start[KILN_MAX_RANK], size[KILN_MAX_RANK], stride[KILN_MAX_RANK];
    int32_t n_start, n_size, n_stride = -1, n;
    kiln_status s = KILN_OK;
    json_t *v;
    if (!(v = need(c, l, "start", &s)))
        return s;
    KILN_TRY(as_int_list(c, v, "start", 0, INT64_MAX, start, &n_start));
    if (!(v = need(c, l, "size", &s)))
        return s;
    KILN_TRY(as_int_list(c, v, "size", -1, INT64_MAX, size, &n_size));
    if ((v = json_object_get(l, "stride")))
        KILN_TRY(as_int_list(c, v, "stride", 1, INT64_MAX, stride, &n_stride));
    kiln_tensor *in = NULL, out;
    KILN_TRY(get_inputs(c, l, &in, &n));
    int32_t rank = rank_of(c, in[0]);
    if (n_stride < 0) {
        n_stride = rank;
        for (int32_t i = 0; i < rank; i++)
            stride[i] = 1;
    }
    const char *bad = n_start != rank ? "start" : n_size != rank ? "size" : n_stride != rank ? "stride" : NULL;
    if (bad)
        s = jfail(c, KILN_ERROR_INVALID_ARGUMENT, bad, "expected %d entries (the input's rank)", rank);
    if (!s && (s = kiln_network_add_slice(c->net, name, in[0], start, size, stride, &out)))
        s = jwrap(c, s);
    free(in);
    return s;
}

static kiln_status get_perm(jctx *c, json_t *l, const char *key, int32_t *has, int32_t *perm, int32_t want)
{
    json_t *v = json_object_get(l, key);
    *has = v != NULL;
    if (!v)
        return KILN_OK;
    int64_t p[KILN_MAX_RANK];
    int32_t n = 0;
    KILN_TRY(as_int_list(c, v, key, 0, KILN_MAX_RANK - 1, p, &n));
    if (n != want)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, key, "expected %d entries, got %d", want, n);
    for (int32_t i = 0; i < n; i++)
        perm[i] = (int32_t)p[i];
    return KILN_OK;
}

static kiln_status layer_shuffle(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "first_transpose", "reshape", "second_transpose", NULL};
    KILN_TRY(check_keys(c, l, keys));
    kiln_shuffle_desc d;
    kiln_shuffle_desc_init(&d);
    json_t *jr = json_object_get(l, "reshape");
    if (jr)
        KILN_TRY(as_dims(c, jr, "reshape", -1, &d.reshape));
    d.has_reshape = jr != NULL;
    kiln_tensor *in = NULL, out;
    int32_t n = 0;
    KILN_TRY(get_inputs(c, l, &in, &n));
    int32_t rank = rank_of(c, in[0]);
    kiln_status s = get_perm(c, l, "first_transpose", &d.has_first_transpose, d.first_transpose, rank);
    if (!s)
        s = get_perm(c, l, "second_transpose", &d.has_second_transpose, d.second_transpose,
                     d.has_reshape ? d.reshape.rank : rank);
    if (!s && (s = kiln_network_add_shuffle(c->net, name, in[0], &d, &out)))
        s = jwrap(c, s);
    free(in);
    return s;
}

static kiln_status layer_gather(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "axis", NULL};
    KILN_TRY(check_keys(c, l, keys));
    int32_t axis = 0, n = 0;
    KILN_TRY(get_axis(c, l, "axis", 0, &axis));
    kiln_tensor *in = NULL, out;
    KILN_TRY(get_inputs(c, l, &in, &n));
    kiln_status s = kiln_network_add_gather(c->net, name, in[0], in[1], axis, &out);
    free(in);
    return s ? jwrap(c, s) : KILN_OK;
}

static kiln_status layer_cast(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "dtype", NULL};
    KILN_TRY(check_keys(c, l, keys));
    kiln_dtype dtype = KILN_DTYPE_F32;
    int given = 0, n = 0;
    KILN_TRY(get_dtype(c, l, "dtype", 1, &given, &dtype));
    kiln_tensor *in = NULL, out;
    KILN_TRY(get_inputs(c, l, &in, &n));
    kiln_status s = kiln_network_add_cast(c->net, name, in[0], dtype, &out);
    free(in);
    return s ? jwrap(c, s) : KILN_OK;
}

/* ---- plugin layers ------------------------------------------------------------------ */

static const struct {
    const char *name;
    kiln_field_type type;
    size_t size;
} field_types[] = {
    {"f32", KILN_FIELD_F32, 4}, {"f64", KILN_FIELD_F64, 8},       {"i32", KILN_FIELD_I32, 4},
    {"i64", KILN_FIELD_I64, 8}, {"string", KILN_FIELD_STRING, 0},
};

/* Converts one "fields" entry; *storage receives the malloc'd values
 * (NULL for strings, which point into the JSON). */
static kiln_status plugin_field(jctx *c, const char *fname, json_t *jf, kiln_field *f, void **storage)
{
    static const char *const keys[] = {"type", "data", NULL};
    char label[160];
    snprintf(label, sizeof label, "fields.%s", fname);
    if (!json_is_object(jf))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, label, "expected {\"type\": ..., \"data\": ...}");
    const char *key;
    json_t *v;
    json_object_foreach(jf, key, v)
    {
        if (strcmp(key, keys[0]) && strcmp(key, keys[1]))
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, label, "unknown key \"%s\"", key);
    }
    json_t *jt = json_object_get(jf, "type"), *jd = json_object_get(jf, "data");
    if (!json_is_string(jt))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, label, "\"type\" must be one of f32, f64, i32, i64, string");
    size_t ti = 0;
    while (ti < sizeof field_types / sizeof field_types[0] && strcmp(field_types[ti].name, json_string_value(jt)) != 0)
        ti++;
    if (ti == sizeof field_types / sizeof field_types[0])
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, label,
                     "unknown type \"%s\" (expected f32, f64, i32, i64 or string)", json_string_value(jt));
    if (!jd)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, label, "\"data\" is missing");
    memset(f, 0, sizeof *f);
    f->struct_size = sizeof *f;
    f->abi_version = KILN_PLUGIN_ABI_VERSION;
    f->name = fname;
    f->type = field_types[ti].type;
    *storage = NULL;
    if (f->type == KILN_FIELD_STRING) {
        if (!json_is_string(jd))
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, label, "\"data\" must be a string");
        f->count = 1;
        f->data = json_string_value(jd);
        return KILN_OK;
    }
    /* A single number stands for a one-element array. */
    size_t count = json_is_array(jd) ? json_array_size(jd) : 1;
    void *buf = malloc(count ? count * field_types[ti].size : 1);
    if (!buf)
        return jfail(c, KILN_ERROR_OUT_OF_MEMORY, label, "out of memory");
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_is_array(jd) ? json_array_get(jd, i) : jd;
        int ok;
        if (f->type == KILN_FIELD_F32 || f->type == KILN_FIELD_F64) {
            double x = json_number_value(e);
            ok = json_is_number(e) && (f->type == KILN_FIELD_F64 || fabs(x) <= FLT_MAX);
            if (ok && f->type == KILN_FIELD_F32)
                ((float *)buf)[i] = (float)x;
            else if (ok)
                ((double *)buf)[i] = x;
        } else {
            int64_t x = json_integer_value(e);
            ok = json_is_integer(e) && (f->type == KILN_FIELD_I64 || (x >= INT32_MIN && x <= INT32_MAX));
            if (ok && f->type == KILN_FIELD_I32)
                ((int32_t *)buf)[i] = (int32_t)x;
            else if (ok)
                ((int64_t *)buf)[i] = x;
        }
        if (!ok) {
            free(buf);
            int is_float = f->type == KILN_FIELD_F32 || f->type == KILN_FIELD_F64;
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, label, "entry %zu: expected %s %s", i,
                         is_float ? "a number fitting" : "an integer fitting", field_types[ti].name);
        }
    }
    f->count = (int64_t)count;
    f->data = buf;
    *storage = buf;
    return KILN_OK;
}

static kiln_status layer_plugin(jctx *c, json_t *l, const char *name)
{
    static const char *const keys[] = {"name", "op", "inputs", "plugin", "fields", NULL};
    static const char *const pkeys[] = {"name", "version", "namespace", NULL};
    KILN_TRY(check_keys(c, l, keys));
    kiln_status s = KILN_OK;
    json_t *jp = need(c, l, "plugin", &s);
    if (!jp)
        return s;
    if (!json_is_object(jp))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "plugin", "expected {\"name\", \"version\", \"namespace\"}");
    const char *key;
    json_t *v;
    json_object_foreach(jp, key, v)
    {
        int ok = 0;
        for (const char *const *a = pkeys; *a && !ok; a++)
            ok = strcmp(*a, key) == 0;
        if (!ok)
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "plugin", "unknown key \"%s\"", key);
    }
    const char *pname = NULL, *pversion = NULL, *pnamespace = NULL;
    KILN_TRY(get_string_as(c, jp, "name", "plugin.name", 1, &pname));
    KILN_TRY(get_string_as(c, jp, "version", "plugin.version", 1, &pversion));
    KILN_TRY(get_string_as(c, jp, "namespace", "plugin.namespace", 0, &pnamespace));
    if (!pnamespace)
        pnamespace = "";

    json_t *jf = json_object_get(l, "fields");
    if (jf && !json_is_object(jf))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "fields", "expected an object of name: {\"type\", \"data\"}");
    size_t nf = jf ? json_object_size(jf) : 0;
    kiln_field *fields = calloc(nf ? nf : 1, sizeof *fields);
    void **storage = calloc(nf ? nf : 1, sizeof *storage);
    kiln_tensor *in = NULL;
    int32_t n_in = 0;
    if (!fields || !storage)
        s = jfail(c, KILN_ERROR_OUT_OF_MEMORY, "fields", "out of memory");
    size_t k = 0;
    if (!s && jf) {
        json_object_foreach(jf, key, v)
        {
            if ((s = plugin_field(c, key, v, &fields[k], &storage[k])) != KILN_OK)
                break;
            k++;
        }
    }
    if (!s)
        s = get_inputs(c, l, &in, &n_in);
    if (!s) {
        kiln_tensor outs[MAX_PLUGIN_OUTPUTS];
        int32_t n_out = 0;
        s = kiln_network_add_plugin(c->net, name, pname, pversion, pnamespace, fields, (int32_t)k, in, n_in, outs,
                                    MAX_PLUGIN_OUTPUTS, &n_out);
        if (s)
            s = jwrap(c, s);
    }
    for (size_t i = 0; i < k; i++)
        free(storage[i]);
    free(storage);
    free(fields);
    free(in);
    return s;
}

/* ---- sections -------------------------------------------------------------------- */

typedef kiln_status (*layer_fn)(jctx *c, json_t *l, const char *name);

/* The reader of each op a network file may declare (op table: declarable). */
static const layer_fn layer_ops[KILN_OP_COUNT] = {
    [KILN_OP_CONSTANT] = layer_constant, [KILN_OP_MATMUL] = layer_matmul, [KILN_OP_BINARY] = layer_binary,
    [KILN_OP_UNARY] = layer_unary,       [KILN_OP_REDUCE] = layer_reduce, [KILN_OP_SOFTMAX] = layer_softmax,
    [KILN_OP_CONCAT] = layer_concat,     [KILN_OP_SLICE] = layer_slice,   [KILN_OP_SHUFFLE] = layer_shuffle,
    [KILN_OP_GATHER] = layer_gather,     [KILN_OP_CAST] = layer_cast,     [KILN_OP_PLUGIN] = layer_plugin,
};

static kiln_status unknown_op(jctx *c, const char *op)
{
    char list[256];
    size_t n = 0;
    int32_t count = 0, k = 0;
    for (int32_t i = 0; i < KILN_OP_COUNT; i++)
        count += kiln_op_info_get((kiln_op)i)->declarable;
    for (int32_t i = 0; i < KILN_OP_COUNT && n < sizeof list; i++) {
        const kiln_op_info *info = kiln_op_info_get((kiln_op)i);
        if (!info->declarable)
            continue;
        k++;
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", k == 1 ? "" : k == count ? " or " : ", ", info->name);
    }
    return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "op", "unknown op \"%s\" (expected %s)", op, list);
}

static kiln_status parse_layer(jctx *c, json_t *l, size_t index)
{
    set_where(c, "layer %zu", index);
    c->layer_name = NULL;
    if (!json_is_object(l))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL, "expected an object");
    const char *name = NULL, *op = NULL;
    KILN_TRY(get_string(c, l, "name", 0, &name));
    if (name)
        set_where(c, "layer \"%s\" (index %zu)", name, index);
    c->layer_name = name;
    KILN_TRY(get_string(c, l, "op", 1, &op));
    int32_t k = kiln_op_find(op);
    c->op = k >= 0 ? kiln_op_info_get((kiln_op)k) : NULL;
    if (!c->op || !c->op->declarable || !layer_ops[k])
        return unknown_op(c, op);
    return layer_ops[k](c, l, name);
}

static kiln_status parse_inputs(jctx *c, json_t *inputs)
{
    static const char *const keys[] = {"name", "dtype", "dims", NULL};
    set_where(c, "inputs");
    if (!json_is_array(inputs))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL, "expected an array");
    for (size_t i = 0; i < json_array_size(inputs); i++) {
        json_t *in = json_array_get(inputs, i);
        set_where(c, "input %zu", i);
        if (!json_is_object(in))
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL, "expected an object");
        const char *name = NULL;
        KILN_TRY(get_string(c, in, "name", 1, &name));
        set_where(c, "input \"%s\" (index %zu)", name, i);
        KILN_TRY(check_keys(c, in, keys));
        kiln_dtype dtype = KILN_DTYPE_F32;
        int given = 0;
        KILN_TRY(get_dtype(c, in, "dtype", 1, &given, &dtype));
        kiln_status s = KILN_OK;
        json_t *jd = need(c, in, "dims", &s);
        if (!jd)
            return s;
        kiln_dims dims;
        KILN_TRY(as_dims(c, jd, "dims", -1, &dims));
        kiln_tensor t;
        if ((s = kiln_network_add_input(c->net, name, dtype, &dims, &t)) != KILN_OK)
            return jwrap(c, s);
    }
    return KILN_OK;
}

static kiln_status parse_profiles(jctx *c, json_t *profiles)
{
    static const char *const keys[] = {"min", "opt", "max", NULL};
    set_where(c, "profiles");
    if (!json_is_array(profiles))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL, "expected an array");
    for (size_t p = 0; p < json_array_size(profiles); p++) {
        json_t *jp = json_array_get(profiles, p);
        set_where(c, "profile %zu", p);
        if (!json_is_object(jp))
            return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL,
                         "expected an object of input name: {\"min\", \"opt\", \"max\"}");
        int32_t index = 0;
        kiln_status s = kiln_network_add_profile(c->net, &index);
        if (s)
            return jwrap(c, s);
        const char *input;
        json_t *v;
        json_object_foreach(jp, input, v)
        {
            set_where(c, "profile %zu, input \"%s\"", p, input);
            if (!json_is_object(v))
                return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL, "expected {\"min\", \"opt\", \"max\"}");
            KILN_TRY(check_keys(c, v, keys));
            kiln_dims d[3];
            for (int k = 0; k < 3; k++) {
                json_t *jd = need(c, v, keys[k], &s);
                if (!jd)
                    return s;
                KILN_TRY(as_dims(c, jd, keys[k], 0, &d[k]));
            }
            if ((s = kiln_network_set_profile_shape(c->net, index, input, &d[0], &d[1], &d[2])))
                return kiln_fail_context(s, "%s", c->what);
        }
    }
    return KILN_OK;
}

static kiln_status parse_outputs(jctx *c, json_t *outputs)
{
    static const char *const keys[] = {"tensor", "name", NULL};
    set_where(c, "outputs");
    if (!json_is_array(outputs))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL, "expected an array");
    for (size_t i = 0; i < json_array_size(outputs); i++) {
        json_t *o = json_array_get(outputs, i);
        set_where(c, "output %zu", i);
        const char *rename = NULL;
        json_t *ref = o;
        /* "fc" or {"tensor": "fc", "name": "logits"} to rename it. */
        if (json_is_object(o)) {
            KILN_TRY(check_keys(c, o, keys));
            KILN_TRY(get_string(c, o, "name", 0, &rename));
            kiln_status s = KILN_OK;
            if (!(ref = need(c, o, "tensor", &s)))
                return s;
        }
        kiln_tensor t;
        KILN_TRY(find_tensor(c, ref, json_is_object(o) ? "tensor" : "outputs", i, &t));
        kiln_status s = kiln_network_mark_output(c->net, t, rename);
        if (s)
            return jwrap(c, s);
    }
    return KILN_OK;
}

static kiln_status parse_root(jctx *c, json_t *root)
{
    static const char *const keys[] = {"kiln_network", "inputs", "profiles", "layers", "outputs", NULL};
    set_where(c, "top level");
    if (!json_is_object(root))
        return jfail(c, KILN_ERROR_FORMAT, NULL, "expected a JSON object");
    KILN_TRY(check_keys(c, root, keys));
    json_t *ver = json_object_get(root, "kiln_network");
    if (!ver)
        return jfail(c, KILN_ERROR_FORMAT, "kiln_network",
                     "missing (the format version, %d, marks a kiln network file)", FORMAT_VERSION);
    if (!json_is_integer(ver))
        return jfail(c, KILN_ERROR_FORMAT, "kiln_network", "expected the integer %d", FORMAT_VERSION);
    if (json_integer_value(ver) != FORMAT_VERSION)
        return jfail(c, KILN_ERROR_VERSION, "kiln_network", "format version %lld is not supported (this kiln reads %d)",
                     (long long)json_integer_value(ver), FORMAT_VERSION);
    json_t *layers = json_object_get(root, "layers");
    json_t *outputs = json_object_get(root, "outputs");
    if (!layers)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "layers", "missing");
    if (!outputs)
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, "outputs", "missing");
    json_t *v;
    if ((v = json_object_get(root, "inputs")))
        KILN_TRY(parse_inputs(c, v));
    if ((v = json_object_get(root, "profiles")))
        KILN_TRY(parse_profiles(c, v));
    set_where(c, "layers");
    if (!json_is_array(layers))
        return jfail(c, KILN_ERROR_INVALID_ARGUMENT, NULL, "expected an array");
    for (size_t i = 0; i < json_array_size(layers); i++)
        KILN_TRY(parse_layer(c, json_array_get(layers, i), i));
    c->layer_name = NULL;
    return parse_outputs(c, outputs);
}

static kiln_status parse_named(kiln_registry *reg, const char *text, size_t size, const char *base_dir,
                               const char *what, kiln_network **out)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, size, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: line %d, column %d: %s", what, jerr.line, jerr.column, jerr.text);
    kiln_network *net = NULL;
    kiln_status s = kiln_network_create(reg, &net);
    if (s) {
        json_decref(root);
        return s;
    }
    jctx c = {.net = net, .what = what, .base_dir = base_dir};
    s = parse_root(&c, root);
    for (int32_t i = 0; i < c.n_files; i++) {
        free(c.files[i].path);
        kiln_safetensors_destroy(c.files[i].st);
    }
    free(c.files);
    json_decref(root);
    if (s) {
        kiln_network_destroy(net);
        return s;
    }
    *out = net;
    return KILN_OK;
}

/* ---- entry points ---------------------------------------------------------------- */

kiln_status kiln_network_parse_json(kiln_registry *reg, const char *text, size_t size, const char *base_dir,
                                    kiln_network **out)
{
    if ((!text && size) || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_network_parse_json: NULL argument");
    return parse_named(reg, text ? text : "", size, base_dir, "network JSON", out);
}

kiln_status kiln_network_load_json(kiln_registry *reg, const char *path, kiln_network **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_network_load_json: NULL argument");
    FILE *f;
    char *text = NULL;
    size_t size = 0;
    if (kiln_file_fopen_read(path, &f, &size) != KILN_OK)
        return KILN_ERROR_IO;
    kiln_status s = KILN_OK;
    {
        text = malloc(size ? size : 1);
        if (!text)
            s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", path, size);
    }
    if (!s && size && fread(text, 1, size, f) != size)
        s = kiln_fail(KILN_ERROR_IO, "%s: read failed", path);
    fclose(f);
    /* Side files resolve against the JSON file's own folder. */
    char *base = NULL;
    if (!s) {
        const char *slash = strrchr(path, '/');
        base = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : kiln_strdup(".");
        if (!base)
            s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    if (!s)
        s = parse_named(reg, text, size, base, path, out);
    free(base);
    free(text);
    return s;
}
