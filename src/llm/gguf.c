/* GGUF reader and ggml block dequantization. */
#include "llm/gguf.h"

#include <float.h>
#include <math.h>

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"
#include "core/ggml_block.h"

/* ---- a bounds-checked cursor over the file ------------------------------------ */

typedef struct cursor {
    const uint8_t *base;
    size_t size, pos;
    const char *what;
} cursor;

static int cur_need(const cursor *c, size_t n) { return n <= c->size - c->pos; }

static kiln_status cur_read(cursor *c, void *out, size_t n, const char *field)
{
    if (!cur_need(c, n))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: truncated while reading %s at byte %zu", c->what, field, c->pos);
    memcpy(out, c->base + c->pos, n);
    c->pos += n;
    return KILN_OK;
}

/* GGUF is little-endian; kiln only runs on little-endian hosts. */
static kiln_status cur_u32(cursor *c, uint32_t *v, const char *field) { return cur_read(c, v, 4, field); }
static kiln_status cur_u64(cursor *c, uint64_t *v, const char *field) { return cur_read(c, v, 8, field); }

/* A string is a u64 length then bytes. Returns a pointer to its bytes. */
static kiln_status cur_string(cursor *c, const uint8_t **s, uint64_t *len, const char *field)
{
    KILN_TRY(cur_u64(c, len, field));
    if (!cur_need(c, *len))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: %s of %llu bytes runs past the end of the file", c->what, field,
                         (unsigned long long)*len);
    *s = c->base + c->pos;
    c->pos += (size_t)*len;
    return KILN_OK;
}

static size_t value_size(kiln_gguf_value_type t)
{
    switch (t) {
    case KILN_GGUF_U8:
    case KILN_GGUF_I8:
    case KILN_GGUF_BOOL: return 1;
    case KILN_GGUF_U16:
    case KILN_GGUF_I16: return 2;
    case KILN_GGUF_U32:
    case KILN_GGUF_I32:
    case KILN_GGUF_F32: return 4;
    case KILN_GGUF_U64:
    case KILN_GGUF_I64:
    case KILN_GGUF_F64: return 8;
    default: return 0;
    }
}

/* ---- ggml types --------------------------------------------------------------- */

static const struct {
    uint32_t type;
    const char *name;
    int64_t block;
    size_t bytes;
} ggml_types[] = {
    {KILN_GGML_F32, "F32", 1, 4},       {KILN_GGML_F16, "F16", 1, 2},       {KILN_GGML_Q4_0, "Q4_0", 32, 18},
    {KILN_GGML_Q4_1, "Q4_1", 32, 20},   {KILN_GGML_Q5_0, "Q5_0", 32, 22},   {KILN_GGML_Q5_1, "Q5_1", 32, 24},
    {KILN_GGML_Q8_0, "Q8_0", 32, 34},   {KILN_GGML_Q8_1, "Q8_1", 32, 36},   {KILN_GGML_Q2_K, "Q2_K", 256, 84},
    {KILN_GGML_Q3_K, "Q3_K", 256, 110}, {KILN_GGML_Q4_K, "Q4_K", 256, 144}, {KILN_GGML_Q5_K, "Q5_K", 256, 176},
    {KILN_GGML_Q6_K, "Q6_K", 256, 210}, {KILN_GGML_Q8_K, "Q8_K", 256, 292}, {KILN_GGML_BF16, "BF16", 1, 2},
};

static int ggml_index(uint32_t type)
{
    for (size_t i = 0; i < sizeof ggml_types / sizeof ggml_types[0]; i++)
        if (ggml_types[i].type == type)
            return (int)i;
    return -1;
}

const char *kiln_ggml_type_name(uint32_t type)
{
    int i = ggml_index(type);
    return i < 0 ? NULL : ggml_types[i].name;
}

int64_t kiln_ggml_block_elements(uint32_t type)
{
    int i = ggml_index(type);
    return i < 0 ? 0 : ggml_types[i].block;
}

size_t kiln_ggml_block_bytes(uint32_t type)
{
    int i = ggml_index(type);
    return i < 0 ? 0 : ggml_types[i].bytes;
}

/* ---- parsing ------------------------------------------------------------------ */

void kiln_gguf_close(kiln_gguf *g)
{
    if (!g)
        return;
    for (int64_t i = 0; i < g->n_kvs; i++)
        free(g->kvs[i].strings);
    free(g->kvs);
    free(g->tensors);
    free(g->strings);
    if (g->map) {
        if (g->mapped)
            munmap(g->map, g->map_size);
        else
            free(g->map);
    }
    free(g);
}

/* Copies a length-delimited name into the arena at *used. */
static const char *arena_copy(kiln_gguf *g, size_t *used, const uint8_t *s, uint64_t len)
{
    char *dst = g->strings + *used;
    memcpy(dst, s, (size_t)len);
    dst[len] = '\0';
    *used += (size_t)len + 1;
    return dst;
}

static kiln_status parse_value(cursor *c, kiln_gguf_kv *kv, const char *key)
{
    uint32_t t = 0;
    KILN_TRY(cur_u32(c, &t, "a value type"));
    if (t >= KILN_GGUF_VALUE_TYPE_COUNT)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s\" has unknown value type %u", c->what, key, t);
    kv->type = (kiln_gguf_value_type)t;
    kv->count = 1;
    kv->value = c->base + c->pos;
    if (t == KILN_GGUF_STRING) {
        const uint8_t *s;
        uint64_t len;
        return cur_string(c, &s, &len, "a string value");
    }
    if (t != KILN_GGUF_ARRAY) {
        if (!cur_need(c, value_size(kv->type)))
            return kiln_fail(KILN_ERROR_FORMAT, "%s: truncated in the value of \"%s\"", c->what, key);
        c->pos += value_size(kv->type);
        return KILN_OK;
    }
    uint32_t at = 0;
    uint64_t n = 0;
    KILN_TRY(cur_u32(c, &at, "an array type"));
    KILN_TRY(cur_u64(c, &n, "an array length"));
    if (at >= KILN_GGUF_VALUE_TYPE_COUNT || at == KILN_GGUF_ARRAY)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: key \"%s\" is an array of unsupported type %u", c->what, key, at);
    kv->array_type = (kiln_gguf_value_type)at;
    kv->count = n;
    kv->value = c->base + c->pos;
    if (at != KILN_GGUF_STRING) {
        size_t bytes;
        if (kiln_mul_overflow((size_t)n, value_size(kv->array_type), &bytes) || n > SIZE_MAX || !cur_need(c, bytes))
            return kiln_fail(KILN_ERROR_FORMAT, "%s: array \"%s\" of %llu elements runs past the end of the file",
                             c->what, key, (unsigned long long)n);
        c->pos += bytes;
        return KILN_OK;
    }
    /* Each string takes at least its 8-byte length: bounds the count. */
    if (n > (c->size - c->pos) / 8)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: array \"%s\" of %llu strings runs past the end of the file", c->what,
                         key, (unsigned long long)n);
    kv->strings = malloc((size_t)(n ? n : 1) * sizeof *kv->strings);
    if (!kv->strings)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory for array \"%s\"", c->what, key);
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *s;
        uint64_t len;
        kv->strings[i] = c->base + c->pos;
        KILN_TRY(cur_string(c, &s, &len, "an array string"));
    }
    return KILN_OK;
}

static kiln_status parse(kiln_gguf *g, const char *what)
{
    cursor c = {g->map, g->map_size, 0, what};
    char magic[4] = {0};
    if (cur_read(&c, magic, 4, "the magic") != KILN_OK || memcmp(magic, "GGUF", 4) != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "%s: not a GGUF file (bad magic)", what);
    KILN_TRY(cur_u32(&c, &g->version, "the version"));
    if (g->version != 2 && g->version != 3)
        return kiln_fail(KILN_ERROR_VERSION, "%s: GGUF version %u is not supported (kiln reads 2 and 3)", what,
                         g->version);
    uint64_t n_tensors = 0, n_kvs = 0;
    KILN_TRY(cur_u64(&c, &n_tensors, "the tensor count"));
    KILN_TRY(cur_u64(&c, &n_kvs, "the metadata count"));
    /* A key-value pair takes at least 12 bytes and a tensor info 24: this
     * bounds both counts by the file size before anything is allocated. */
    if (n_kvs > g->map_size / 12 || n_tensors > g->map_size / 24)
        return kiln_fail(KILN_ERROR_FORMAT,
                         "%s: header claims %llu tensors and %llu metadata keys, more than the file can hold", what,
                         (unsigned long long)n_tensors, (unsigned long long)n_kvs);
    /* Keys and names are copied into one arena; their total is bounded by the file size. */
    g->strings = malloc(g->map_size + 1);
    g->kvs = calloc((size_t)(n_kvs ? n_kvs : 1), sizeof *g->kvs);
    g->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->tensors);
    if (!g->strings || !g->kvs || !g->tensors)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory", what);
    size_t used = 0;
    g->alignment = 32;
    for (uint64_t i = 0; i < n_kvs; i++) {
        const uint8_t *s;
        uint64_t len;
        KILN_TRY(cur_string(&c, &s, &len, "a metadata key"));
        kiln_gguf_kv *kv = &g->kvs[i];
        kv->key = arena_copy(g, &used, s, len);
        g->n_kvs = (int64_t)i + 1;
        KILN_TRY(parse_value(&c, kv, kv->key));
        if (strcmp(kv->key, "general.alignment") == 0) {
            uint32_t a;
            if (kv->type != KILN_GGUF_U32)
                return kiln_fail(KILN_ERROR_FORMAT, "%s: general.alignment must be a u32", what);
            memcpy(&a, kv->value, 4);
            if (a == 0 || (a & (a - 1)) != 0 || a > 65536)
                return kiln_fail(KILN_ERROR_FORMAT, "%s: general.alignment %u is not a power of two up to 65536", what,
                                 a);
            g->alignment = a;
        }
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        kiln_gguf_tensor *t = &g->tensors[i];
        const uint8_t *s;
        uint64_t len;
        KILN_TRY(cur_string(&c, &s, &len, "a tensor name"));
        t->name = arena_copy(g, &used, s, len);
        g->n_tensors = (int64_t)i + 1;
        uint32_t nd = 0;
        KILN_TRY(cur_u32(&c, &nd, "a tensor rank"));
        if (nd < 1 || nd > 4)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\" has %u dims (1 to 4 allowed)", what, t->name, nd);
        t->n_dims = (int32_t)nd;
        uint64_t count = 1;
        for (uint32_t d = 0; d < 4; d++) {
            uint64_t ne = 1;
            if (d < nd)
                KILN_TRY(cur_u64(&c, &ne, "a tensor dim"));
            if (ne > (uint64_t)INT64_MAX || __builtin_mul_overflow(count, ne, &count) || count > (uint64_t)INT64_MAX)
                return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\" has an impossible shape", what, t->name);
            t->ne[d] = (int64_t)ne;
        }
        t->n_elements = (int64_t)count;
        KILN_TRY(cur_u32(&c, &t->type, "a tensor type"));
        uint64_t offset = 0;
        KILN_TRY(cur_u64(&c, &offset, "a tensor offset"));
        int64_t block = kiln_ggml_block_elements(t->type);
        if (block == 0)
            return kiln_fail(KILN_ERROR_UNSUPPORTED, "%s: tensor \"%s\" has ggml type %u, which kiln does not know",
                             what, t->name, t->type);
        if (t->ne[0] % block != 0)
            return kiln_fail(KILN_ERROR_FORMAT,
                             "%s: tensor \"%s\": row of %lld elements is not a multiple of the %s block (%lld)", what,
                             t->name, (long long)t->ne[0], kiln_ggml_type_name(t->type), (long long)block);
        t->size = (size_t)(count / (uint64_t)block) * kiln_ggml_block_bytes(t->type);
        t->data = (const void *)(uintptr_t)offset; /* relative for now */
    }
    /* Tensor data starts at the next multiple of the alignment. */
    size_t data_start = c.pos;
    size_t rem = data_start % g->alignment;
    if (rem && kiln_add_overflow(data_start, g->alignment - rem, &data_start))
        return kiln_fail(KILN_ERROR_FORMAT, "%s: bad data offset", what);
    for (int64_t i = 0; i < g->n_tensors; i++) {
        kiln_gguf_tensor *t = &g->tensors[i];
        uint64_t offset = (uint64_t)(uintptr_t)t->data;
        size_t begin, end;
        if (offset % g->alignment != 0)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\" offset %llu is not aligned to %llu", what, t->name,
                             (unsigned long long)offset, (unsigned long long)g->alignment);
        if (offset > SIZE_MAX || kiln_add_overflow(data_start, (size_t)offset, &begin) ||
            kiln_add_overflow(begin, t->size, &end) || end > g->map_size)
            return kiln_fail(KILN_ERROR_FORMAT, "%s: tensor \"%s\" data ends past the end of the file", what, t->name);
        t->data = (const uint8_t *)g->map + begin;
    }
    return KILN_OK;
}

kiln_status kiln_gguf_parse(const void *data, size_t size, const char *what, kiln_gguf **out)
{
    kiln_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->map = malloc(size ? size : 1))) {
        free(g);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory", what);
    }
    memcpy(g->map, data, size);
    g->map_size = size;
    kiln_status s = parse(g, what);
    if (s != KILN_OK) {
        kiln_gguf_close(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}

kiln_status kiln_gguf_open(const char *path, kiln_gguf **out)
{
    int fd;
    size_t file_size;
    kiln_status fs = kiln_file_open_read(path, &fd, &file_size);
    if (fs != KILN_OK)
        return fs == KILN_ERROR_NOT_FOUND ? KILN_ERROR_IO : fs;
    kiln_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        close(fd);
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    g->map_size = file_size;
    if (g->map_size > 0) {
        void *m = mmap(NULL, g->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            close(fd);
            free(g);
            return kiln_fail(KILN_ERROR_IO, "%s: cannot map: %m", path);
        }
        g->map = m;
        g->mapped = 1;
    }
    close(fd);
    kiln_status s = parse(g, path);
    if (s != KILN_OK) {
        kiln_gguf_close(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}

/* ---- metadata access ------------------------------------------------------------ */

const kiln_gguf_kv *kiln_gguf_find_kv(const kiln_gguf *g, const char *key)
{
    for (int64_t i = 0; i < g->n_kvs; i++)
        if (strcmp(g->kvs[i].key, key) == 0)
            return &g->kvs[i];
    return NULL;
}

const kiln_gguf_tensor *kiln_gguf_find_tensor(const kiln_gguf *g, const char *name)
{
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0)
            return &g->tensors[i];
    return NULL;
}

/* Reads one numeric element of type t at p as double, and whether it is an integer. */
static double read_number(kiln_gguf_value_type t, const uint8_t *p, int *is_int)
{
    *is_int = 1;
    switch (t) {
    case KILN_GGUF_U8:
    case KILN_GGUF_BOOL: return p[0];
    case KILN_GGUF_I8: return (int8_t)p[0];
    case KILN_GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case KILN_GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case KILN_GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case KILN_GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case KILN_GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    case KILN_GGUF_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    case KILN_GGUF_F32: {
        float v;
        memcpy(&v, p, 4);
        *is_int = 0;
        return v;
    }
    case KILN_GGUF_F64: {
        double v;
        memcpy(&v, p, 8);
        *is_int = 0;
        return v;
    }
    default: *is_int = 0; return 0.0;
    }
}

static kiln_status find_scalar(const kiln_gguf *g, const char *key, const kiln_gguf_kv **kv)
{
    *kv = kiln_gguf_find_kv(g, key);
    if (!*kv)
        return kiln_fail(KILN_ERROR_NOT_FOUND, "GGUF key \"%s\" is missing", key);
    if ((*kv)->type == KILN_GGUF_ARRAY || (*kv)->type == KILN_GGUF_STRING)
        return kiln_fail(KILN_ERROR_FORMAT, "GGUF key \"%s\" is not a number", key);
    return KILN_OK;
}

kiln_status kiln_gguf_get_i64(const kiln_gguf *g, const char *key, int64_t *out)
{
    const kiln_gguf_kv *kv;
    KILN_TRY(find_scalar(g, key, &kv));
    if (kv->type == KILN_GGUF_I64) {
        memcpy(out, kv->value, 8);
        return KILN_OK;
    }
    if (kv->type == KILN_GGUF_U64) {
        uint64_t v;
        memcpy(&v, kv->value, 8);
        if (v > (uint64_t)INT64_MAX)
            return kiln_fail(KILN_ERROR_FORMAT, "GGUF key \"%s\" is too large", key);
        *out = (int64_t)v;
        return KILN_OK;
    }
    int is_int;
    double v = read_number(kv->type, kv->value, &is_int);
    if (!is_int)
        return kiln_fail(KILN_ERROR_FORMAT, "GGUF key \"%s\" is a float, expected an integer", key);
    *out = (int64_t)v;
    return KILN_OK;
}

/* A number from the file as f32: converting a double outside float's
 * range is undefined behaviour, so it is refused instead. NaN and
 * infinities pass through for the caller's range checks. */
static kiln_status to_f32(double v, const char *key, uint64_t index, int is_array, float *out)
{
    if (isfinite(v) && fabs(v) > FLT_MAX) {
        if (is_array)
            return kiln_fail(KILN_ERROR_FORMAT, "GGUF key \"%s\"[%llu] = %g is outside the f32 range", key,
                             (unsigned long long)index, v);
        return kiln_fail(KILN_ERROR_FORMAT, "GGUF key \"%s\" = %g is outside the f32 range", key, v);
    }
    *out = (float)v;
    return KILN_OK;
}

kiln_status kiln_gguf_get_f32(const kiln_gguf *g, const char *key, float *out)
{
    const kiln_gguf_kv *kv;
    KILN_TRY(find_scalar(g, key, &kv));
    int is_int;
    return to_f32(read_number(kv->type, kv->value, &is_int), key, 0, 0, out);
}

kiln_status kiln_gguf_get_string(const kiln_gguf *g, const char *key, const char **s, size_t *len)
{
    const kiln_gguf_kv *kv = kiln_gguf_find_kv(g, key);
    if (!kv)
        return kiln_fail(KILN_ERROR_NOT_FOUND, "GGUF key \"%s\" is missing", key);
    if (kv->type != KILN_GGUF_STRING)
        return kiln_fail(KILN_ERROR_FORMAT, "GGUF key \"%s\" is not a string", key);
    uint64_t n = 0;
    memcpy(&n, kv->value, 8);
    *s = (const char *)kv->value + 8;
    *len = (size_t)n;
    return KILN_OK;
}

void kiln_gguf_array_string(const kiln_gguf_kv *kv, uint64_t i, const char **s, size_t *len)
{
    uint64_t n = 0;
    memcpy(&n, kv->strings[i], 8);
    *s = (const char *)kv->strings[i] + 8;
    *len = (size_t)n;
}

kiln_status kiln_gguf_array_int(const kiln_gguf_kv *kv, uint64_t i, int64_t lo, int64_t hi, int64_t *out)
{
    const uint8_t *p = kv->value + i * value_size(kv->array_type);
    int64_t v;
    int ok = 1;
    if (kv->array_type == KILN_GGUF_I64) {
        memcpy(&v, p, 8);
    } else if (kv->array_type == KILN_GGUF_U64) {
        uint64_t u;
        memcpy(&u, p, 8);
        ok = u <= (uint64_t)INT64_MAX;
        v = ok ? (int64_t)u : 0;
    } else {
        /* Every other integer type is exact in a double. */
        int is_int;
        double d = read_number(kv->array_type, p, &is_int);
        if (!is_int)
            return kiln_fail(KILN_ERROR_FORMAT, "GGUF key \"%s\" holds floats, expected integers", kv->key);
        v = (int64_t)d;
    }
    if (!ok || v < lo || v > hi)
        return kiln_fail(KILN_ERROR_FORMAT, "GGUF key \"%s\"[%llu] is outside %lld..%lld", kv->key,
                         (unsigned long long)i, (long long)lo, (long long)hi);
    *out = v;
    return KILN_OK;
}

kiln_status kiln_gguf_array_f32(const kiln_gguf_kv *kv, uint64_t i, float *out)
{
    int is_int;
    return to_f32(read_number(kv->array_type, kv->value + i * value_size(kv->array_type), &is_int), kv->key, i, 1, out);
}

/* ---- dequantization ------------------------------------------------------------
 * One block at a time through core/ggml_block.h (the layouts are described
 * there). */

int kiln_ggml_can_dequantize(uint32_t type)
{
    switch (type) {
    case KILN_GGML_F32:
    case KILN_GGML_F16:
    case KILN_GGML_BF16:
    case KILN_GGML_Q8_0:
    case KILN_GGML_Q4_0:
    case KILN_GGML_Q4_1:
    case KILN_GGML_Q5_0:
    case KILN_GGML_Q5_1:
    case KILN_GGML_Q4_K:
    case KILN_GGML_Q5_K:
    case KILN_GGML_Q6_K: return 1;
    default: return 0;
    }
}

kiln_status kiln_ggml_dequantize(uint32_t type, const void *src, int64_t n, float *dst)
{
    if (!kiln_ggml_can_dequantize(type)) {
        const char *name = kiln_ggml_type_name(type);
        return name ? kiln_fail(KILN_ERROR_UNSUPPORTED,
                                "ggml type %s cannot be dequantized by kiln (supported: F32, F16, BF16, Q8_0, Q4_0, "
                                "Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)",
                                name)
                    : kiln_fail(KILN_ERROR_UNSUPPORTED, "unknown ggml type %u", type);
    }
    int64_t block = kiln_ggml_block_elements(type);
    if (n < 0 || n % block != 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%lld elements is not a multiple of the %s block (%lld)",
                         (long long)n, kiln_ggml_type_name(type), (long long)block);
    const uint8_t *b = src;
    size_t bytes = kiln_ggml_block_bytes(type);
    switch (type) {
    case KILN_GGML_F32: memcpy(dst, src, (size_t)n * 4); return KILN_OK;
    case KILN_GGML_F16: kiln_convert(dst, KILN_DTYPE_F32, src, KILN_DTYPE_F16, n); return KILN_OK;
    case KILN_GGML_BF16: kiln_convert(dst, KILN_DTYPE_F32, src, KILN_DTYPE_BF16, n); return KILN_OK;
    default: break;
    }
    for (int64_t i = 0; i < n / block; i++, b += bytes, dst += block) {
        switch (type) {
        case KILN_GGML_Q8_0: kiln_ggml_block_q8_0(b, dst); break;
        case KILN_GGML_Q4_0: kiln_ggml_block_q4_0(b, dst); break;
        case KILN_GGML_Q4_1: kiln_ggml_block_q4_1(b, dst); break;
        case KILN_GGML_Q5_0: kiln_ggml_block_q5_0(b, dst); break;
        case KILN_GGML_Q5_1: kiln_ggml_block_q5_1(b, dst); break;
        case KILN_GGML_Q4_K: kiln_ggml_block_q4_k(b, dst); break;
        case KILN_GGML_Q5_K: kiln_ggml_block_q5_k(b, dst); break;
        default: kiln_ggml_block_q6_k(b, dst); break;
        }
    }
    return KILN_OK;
}
