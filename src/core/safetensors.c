/* safetensors parser. The checks follow the reference implementation
 * (safetensors/src/tensor.rs: Metadata::validate) so a file it accepts is
 * accepted here and a file it refuses is refused, with a message naming the
 * tensor and the field. */
#include "core/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"
#include "core/json_file.h"

/* The reference implementation's limit; it keeps a hostile length field
 * from making us parse gigabytes of JSON. */
#define ST_MAX_HEADER 100000000u

struct kiln_safetensors {
    json_t *root; /* owns every name and string the tensors point at */
    char *source; /* file name or `what`, for messages */
    void *map;    /* non-NULL when kiln_safetensors_open mapped the file */
    size_t map_size;
    kiln_safetensors_tensor *tensors; /* by data offset */
    const kiln_safetensors_tensor **by_name;
    int32_t n_tensors;
    const char **meta_keys;
    const char **meta_values;
    int32_t n_meta;
};

/* ---- dtypes ----------------------------------------------------------------------- */

static const struct {
    const char *name;
    uint32_t bits;
    kiln_dtype dtype; /* KILN_DTYPE_COUNT: none in kiln */
} st_types[] = {
    {"F32", 32, KILN_DTYPE_F32},
    {"F16", 16, KILN_DTYPE_F16},
    {"BF16", 16, KILN_DTYPE_BF16},
    {"I8", 8, KILN_DTYPE_I8},
    {"U8", 8, KILN_DTYPE_U8},
    {"I32", 32, KILN_DTYPE_I32},
    {"I64", 64, KILN_DTYPE_I64},
    {"BOOL", 8, KILN_DTYPE_BOOL},
    {"F8_E4M3", 8, KILN_DTYPE_FP8_E4M3},
    {"F8_E5M2", 8, KILN_DTYPE_FP8_E5M2},
    {"F64", 64, KILN_DTYPE_COUNT},
    {"I16", 16, KILN_DTYPE_COUNT},
    {"U16", 16, KILN_DTYPE_COUNT},
    {"U32", 32, KILN_DTYPE_COUNT},
    {"U64", 64, KILN_DTYPE_COUNT},
    {"F8_E8M0", 8, KILN_DTYPE_COUNT},
    {"F6_E2M3", 6, KILN_DTYPE_COUNT},
    {"F6_E3M2", 6, KILN_DTYPE_COUNT},
    {"F4", 4, KILN_DTYPE_COUNT},
};

/* ---- parsing ---------------------------------------------------------------------- */

/* Reads a non-negative JSON integer. */
static int get_size(const json_t *v, size_t *out)
{
    int64_t x;
    if (!kiln_json_int(v, &x) || x < 0)
        return -1;
    *out = (size_t)x;
    return 0;
}

/* Fills t from one header entry; data pointers are set later. */
static kiln_status parse_entry(const char *what, const char *name, json_t *entry, kiln_safetensors_tensor *t,
                               size_t *begin, size_t *end, size_t data_len)
{
    if (!json_is_object(entry))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\": expected an object", what, name);
    /* Other keys in an entry are ignored, as the reference reader does:
     * they are the writer's business, not a misspelling of ours. */
    json_t *jt = json_object_get(entry, "dtype");
    if (!json_is_string(jt))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\": field \"dtype\": expected a string", what, name);
    const char *dname = json_string_value(jt);
    uint32_t bits = 0;
    for (size_t i = 0; i < sizeof st_types / sizeof st_types[0]; i++) {
        if (strcmp(dname, st_types[i].name) == 0) {
            bits = st_types[i].bits;
            t->dtype = st_types[i].dtype;
        }
    }
    if (!bits)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"", what, name, dname);
    t->dtype_name = dname;

    json_t *js = json_object_get(entry, "shape");
    if (!json_is_array(js))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\": field \"shape\": expected an array", what, name);
    if (json_array_size(js) > KILN_MAX_RANK)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: tensor \"%s\": rank %zu exceeds %d", what, name,
                         json_array_size(js), KILN_MAX_RANK);
    t->dims.rank = (int32_t)json_array_size(js);
    size_t count = 1;
    for (int32_t i = 0; i < t->dims.rank; i++) {
        size_t d;
        if (get_size(json_array_get(js, (size_t)i), &d) != 0)
            return kiln_fail(KILN_ERROR_FORMAT,
                             "%s: tensor \"%s\": field \"shape\": dim %d is not a non-negative "
                             "integer",
                             what, name, i);
        if (kiln_mul_overflow(count, d, &count))
            return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\": element count overflows", what, name);
        t->dims.d[i] = (int64_t)d;
    }
    size_t nbits;
    if (kiln_mul_overflow(count, bits, &nbits))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\": byte size overflows", what, name);
    if (nbits % 8)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\": %zu elements of %s do not fill whole bytes", what, name,
                         count, dname);

    json_t *jo = json_object_get(entry, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2 || get_size(json_array_get(jo, 0), begin) != 0 ||
        get_size(json_array_get(jo, 1), end) != 0)
        return kiln_fail(KILN_ERROR_FORMAT,
                         "%s: tensor \"%s\": field \"data_offsets\": expected [begin, end] of "
                         "non-negative integers",
                         what, name);
    if (*begin > *end || *end > data_len)
        return kiln_fail(KILN_ERROR_FORMAT,
                         "%s: tensor \"%s\": data_offsets [%zu, %zu] outside the data region "
                         "of %zu bytes",
                         what, name, *begin, *end, data_len);
    if (*end - *begin != nbits / 8)
        return kiln_fail(KILN_ERROR_FORMAT,
                         "%s: tensor \"%s\": data_offsets span %zu bytes but shape and dtype %s "
                         "need %zu",
                         what, name, *end - *begin, dname, nbits / 8);
    t->name = name;
    t->size = nbits / 8;
    return KILN_OK;
}

static kiln_status parse_metadata(kiln_safetensors *st, const char *what, json_t *meta)
{
    if (!json_is_object(meta))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: \"__metadata__\": expected an object", what);
    size_t n = json_object_size(meta);
    st->meta_keys = calloc(n ? n : 1, sizeof *st->meta_keys);
    st->meta_values = calloc(n ? n : 1, sizeof *st->meta_values);
    if (!st->meta_keys || !st->meta_values)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory", what);
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v)
    {
        if (!json_is_string(v))
            return kiln_fail(KILN_ERROR_FORMAT, "%s: \"__metadata__\": value of \"%s\" is not a string", what, key);
        st->meta_keys[st->n_meta] = key;
        st->meta_values[st->n_meta] = json_string_value(v);
        st->n_meta++;
    }
    return KILN_OK;
}

/* Sorting helpers. Offsets are kept beside the tensors while sorting. */
typedef struct st_span {
    size_t begin, end;
    kiln_safetensors_tensor t;
} st_span;

static int span_cmp(const void *a, const void *b)
{
    const st_span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

static int name_cmp(const void *a, const void *b)
{
    const kiln_safetensors_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static kiln_status parse_header(kiln_safetensors *st, const uint8_t *p, size_t len, const char *what)
{
    if (len < 8)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: %zu bytes is too short for a safetensors file", what, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | p[i];
    if (n > ST_MAX_HEADER)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: header length %llu exceeds the %u byte limit", what,
                         (unsigned long long)n, ST_MAX_HEADER);
    if (n > len - 8)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", what,
                         (unsigned long long)n, len);
    const uint8_t *data = p + 8 + n;
    size_t data_len = len - 8 - (size_t)n;
    if (n == 0 || p[8] != '{')
        return kiln_fail(KILN_ERROR_FORMAT, "%s: header does not start with '{'", what);

    json_error_t jerr;
    st->root = kiln_json_load_file_text((const char *)p + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!st->root)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: header JSON: %s (line %d, column %d)", what, jerr.text, jerr.line,
                         jerr.column);
    if (!json_is_object(st->root))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: header is not a JSON object", what);

    size_t count = json_object_size(st->root);
    st_span *spans = calloc(count ? count : 1, sizeof *spans);
    if (!spans)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory", what);
    size_t n_spans = 0;
    kiln_status s = KILN_OK;
    const char *key;
    json_t *v;
    json_object_foreach(st->root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0)
            s = parse_metadata(st, what, v);
        else {
            st_span *sp = &spans[n_spans++];
            s = parse_entry(what, key, v, &sp->t, &sp->begin, &sp->end, data_len);
        }
        if (s)
            break;
    }
    /* The tensors must tile the data region: no hole can hide other data
     * (a polyglot file) and no two tensors may share bytes. */
    if (!s) {
        qsort(spans, n_spans, sizeof *spans, span_cmp);
        size_t at = 0;
        for (size_t i = 0; i < n_spans && !s; i++) {
            if (spans[i].begin != at)
                s = kiln_fail(KILN_ERROR_FORMAT,
                              "%s: tensor \"%s\": data starts at %zu, expected %zu (tensors must "
                              "cover the data region without holes or overlap)",
                              what, spans[i].t.name, spans[i].begin, at);
            at = spans[i].end;
        }
        if (!s && at != data_len)
            s = kiln_fail(KILN_ERROR_FORMAT, "%s: tensors cover %zu bytes of a %zu byte data region", what, at,
                          data_len);
    }
    if (!s) {
        st->tensors = calloc(n_spans ? n_spans : 1, sizeof *st->tensors);
        st->by_name = calloc(n_spans ? n_spans : 1, sizeof *st->by_name);
        if (!st->tensors || !st->by_name)
            s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory", what);
    }
    if (!s) {
        for (size_t i = 0; i < n_spans; i++) {
            st->tensors[i] = spans[i].t;
            st->tensors[i].data = data + spans[i].begin;
            st->by_name[i] = &st->tensors[i];
        }
        st->n_tensors = (int32_t)n_spans;
        qsort(st->by_name, n_spans, sizeof *st->by_name, name_cmp);
    }
    free(spans);
    return s;
}

kiln_status kiln_safetensors_parse(const void *buf, size_t size, const char *what, kiln_safetensors **out)
{
    if ((!buf && size) || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_safetensors_parse: NULL argument");
    if (!what)
        what = "safetensors";
    kiln_safetensors *st = calloc(1, sizeof *st);
    if (!st)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory", what);
    st->source = kiln_strdup(what);
    kiln_status s =
        st->source ? parse_header(st, buf, size, what) : kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory", what);
    if (s) {
        kiln_safetensors_destroy(st);
        return s;
    }
    *out = st;
    return KILN_OK;
}

kiln_status kiln_safetensors_open(const char *path, kiln_safetensors **out)
{
    if (!path || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_safetensors_open: NULL argument");
    int fd;
    size_t size;
    if (kiln_file_open_read(path, &fd, &size) != KILN_OK)
        return KILN_ERROR_IO;
    if (size < 8) {
        close(fd);
        return kiln_fail(KILN_ERROR_FORMAT, "%s: %zu bytes is too short for a safetensors file", path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return kiln_fail(KILN_ERROR_IO, "%s: mmap failed: %s", path, strerror(errno));
    kiln_safetensors *st = NULL;
    kiln_status s = kiln_safetensors_parse(map, size, path, &st);
    if (s) {
        munmap(map, size);
        return s;
    }
    st->map = map;
    st->map_size = size;
    *out = st;
    return KILN_OK;
}

void kiln_safetensors_destroy(kiln_safetensors *st)
{
    if (!st)
        return;
    if (st->map)
        munmap(st->map, st->map_size);
    json_decref(st->root);
    free(st->tensors);
    free(st->by_name);
    free(st->meta_keys);
    free(st->meta_values);
    free(st->source);
    free(st);
}

/* ---- queries ---------------------------------------------------------------------- */

int32_t kiln_safetensors_count(const kiln_safetensors *st) { return st ? st->n_tensors : 0; }

const kiln_safetensors_tensor *kiln_safetensors_tensor_at(const kiln_safetensors *st, int32_t i)
{
    if (!st || i < 0 || i >= st->n_tensors)
        return NULL;
    return &st->tensors[i];
}

kiln_status kiln_safetensors_find(const kiln_safetensors *st, const char *name, const kiln_safetensors_tensor **out)
{
    if (!st || !name || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_safetensors_find: NULL argument");
    kiln_safetensors_tensor key = {.name = name};
    const kiln_safetensors_tensor *pkey = &key;
    const kiln_safetensors_tensor **hit =
        bsearch(&pkey, st->by_name, (size_t)st->n_tensors, sizeof *st->by_name, name_cmp);
    if (!hit)
        return kiln_fail(KILN_ERROR_NOT_FOUND, "%s: no tensor \"%s\"", st->source, name);
    if ((*hit)->dtype == KILN_DTYPE_COUNT)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: tensor \"%s\" has dtype %s, which kiln does not support",
                         st->source, name, (*hit)->dtype_name);
    *out = *hit;
    return KILN_OK;
}

int32_t kiln_safetensors_metadata_count(const kiln_safetensors *st) { return st ? st->n_meta : 0; }

void kiln_safetensors_metadata_at(const kiln_safetensors *st, int32_t i, const char **key, const char **value)
{
    int ok = st && i >= 0 && i < st->n_meta;
    if (key)
        *key = ok ? st->meta_keys[i] : NULL;
    if (value)
        *value = ok ? st->meta_values[i] : NULL;
}

const char *kiln_safetensors_metadata(const kiln_safetensors *st, const char *key)
{
    for (int32_t i = 0; st && key && i < st->n_meta; i++)
        if (strcmp(st->meta_keys[i], key) == 0)
            return st->meta_values[i];
    return NULL;
}
