/* The engine file reader: header, section table, checksums, then the
 * plan. docs/engine-format.md is the spec (section 5 lists the checks in
 * the order made here). */
#include "engine/engine_format.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* The state struct on the stack: no allocation that could fail. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <kiln/kiln.h>

#include "core/error.h"
#include "core/op_table.h"

/* The header checksum covers the header with its checksum field read as
 * zero, then the section table. */
uint64_t kiln_engine_header_checksum(const uint8_t *image, size_t table_bytes)
{
    static const uint8_t zero[8] = {0};
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    XXH64_update(&st, image, OFF_HEADER_CHECKSUM);
    XXH64_update(&st, zero, sizeof zero);
    XXH64_update(&st, image + OFF_HEADER_CHECKSUM + 8, HEADER_SIZE - OFF_HEADER_CHECKSUM - 8);
    XXH64_update(&st, image + HEADER_SIZE, table_bytes);
    return XXH64_digest(&st);
}

void kiln_engine_fourcc_str(uint32_t id, char out[5])
{
    for (int i = 0; i < 4; i++) {
        char c = (char)(id >> (8 * i));
        out[i] = (c >= 0x20 && c < 0x7f) ? c : '?';
    }
    out[4] = '\0';
}


/* ---- reading: the fixed header ----------------------------------------------- */

typedef struct header_view {
    kiln_engine_header_info info;
    uint32_t n_sections;
    uint64_t table_end;
} header_view;

static kiln_status parse_header(const uint8_t *d, size_t size, header_view *hv)
{
    if (!d && size)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "engine data is NULL");
    if (size >= 8 && memcmp(d, KILN_ENGINE_MAGIC, 8) != 0)
        return kiln_fail(KILN_ERROR_FORMAT, "not a kiln engine (bad magic)");
    if (size < HEADER_SIZE)
        return kiln_fail(KILN_ERROR_FORMAT, "engine truncated: %zu bytes is less than the %u-byte header", size,
                         HEADER_SIZE);
    uint32_t version = kiln_get_u32(d + OFF_FORMAT_VERSION);
    if (version > KILN_ENGINE_FORMAT_VERSION)
        return kiln_fail(KILN_ERROR_VERSION, "engine format version %u is newer than this kiln reads (%u)", version,
                         KILN_ENGINE_FORMAT_VERSION);
    if (version == 0)
        return kiln_fail(KILN_ERROR_FORMAT, "engine format version 0 is invalid");
    uint32_t header_size = kiln_get_u32(d + OFF_HEADER_SIZE);
    if (header_size != HEADER_SIZE)
        return kiln_fail(KILN_ERROR_FORMAT, "engine header size %u, expected %u", header_size, HEADER_SIZE);
    uint64_t file_size = kiln_get_u64(d + OFF_FILE_SIZE);
    uint32_t n_sections = kiln_get_u32(d + OFF_N_SECTIONS);
    /* n_sections < 2^32, so this cannot overflow 64 bits. */
    uint64_t table_end = HEADER_SIZE + (uint64_t)ENTRY_SIZE * n_sections;
    if (table_end > size) {
        if (file_size > size)
            return kiln_fail(KILN_ERROR_FORMAT, "engine truncated: header says %" PRIu64 " bytes, file has %zu",
                             file_size, size);
        return kiln_fail(KILN_ERROR_FORMAT,
                         "engine section table (%u entries) runs past the end of the data (%zu bytes)", n_sections,
                         size);
    }
    if (kiln_engine_header_checksum(d, (size_t)(table_end - HEADER_SIZE)) != kiln_get_u64(d + OFF_HEADER_CHECKSUM))
        return kiln_fail(KILN_ERROR_CHECKSUM, "engine header checksum mismatch: the file is corrupted");

    kiln_engine_header_info info;
    memset(&info, 0, sizeof info);
    info.format_version = version;
    memcpy(info.kiln_version, d + OFF_KILN_VERSION, sizeof info.kiln_version);
    if (!memchr(info.kiln_version, 0, sizeof info.kiln_version))
        return kiln_fail(KILN_ERROR_FORMAT, "engine kiln version string is not NUL-terminated");
    uint32_t backend = kiln_get_u32(d + OFF_BACKEND);
    if (backend >= KILN_BACKEND_COUNT)
        return kiln_fail(KILN_ERROR_FORMAT, "engine backend %u is unknown", backend);
    info.backend = (kiln_backend)backend;
    uint32_t n_archs = kiln_get_u32(d + OFF_N_GPU_ARCHS);
    if (n_archs > 8)
        return kiln_fail(KILN_ERROR_FORMAT, "engine lists %u GPU architectures (at most 8)", n_archs);
    info.n_gpu_archs = (int32_t)n_archs;
    for (uint32_t i = 0; i < n_archs; i++)
        info.gpu_archs[i] = (int32_t)kiln_get_u32(d + OFF_GPU_ARCHS + 4 * (size_t)i);
    info.file_size = file_size;
    if (n_sections > INT32_MAX)
        return kiln_fail(KILN_ERROR_FORMAT, "engine has %u sections", n_sections);
    info.n_sections = (int32_t)n_sections;
    hv->info = info;
    hv->n_sections = n_sections;
    hv->table_end = table_end;
    return KILN_OK;
}

kiln_status kiln_engine_read_header(const void *data, size_t size, kiln_engine_header_info *info)
{
    if (!info)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_read_header: info is required");
    header_view hv;
    KILN_TRY(parse_header(data, size, &hv));
    *info = hv.info;
    return KILN_OK;
}

/* ---- reading: the section table ------------------------------------------------ */

typedef struct section_view {
    uint32_t id;
    uint64_t offset, size, checksum;
} section_view;

static int cmp_section_offset(const void *x, const void *y)
{
    const section_view *a = *(const section_view *const *)x, *b = *(const section_view *const *)y;
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return a->size < b->size ? -1 : a->size > b->size;
}

/* Checks every entry's bounds, that sections do not overlap, that every
 * byte outside them is zero (so no bit of the file escapes a check) and
 * every checksum. */
static kiln_status check_sections(const uint8_t *d, size_t size, const header_view *hv, section_view *secs)
{
    char cc[5];
    uint32_t n = hv->n_sections;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = d + HEADER_SIZE + (size_t)ENTRY_SIZE * i;
        section_view *s = &secs[i];
        s->id = kiln_get_u32(e);
        s->offset = kiln_get_u64(e + 8);
        s->size = kiln_get_u64(e + 16);
        s->checksum = kiln_get_u64(e + 24);
        kiln_engine_fourcc_str(s->id, cc);
        uint64_t end;
        if (s->offset < hv->table_end || __builtin_add_overflow(s->offset, s->size, &end) || end > size)
            return kiln_fail(KILN_ERROR_FORMAT,
                             "engine section %s (entry %u) at offset %" PRIu64 ", %" PRIu64
                             " bytes, lies outside the file's %zu data bytes",
                             cc, i, s->offset, s->size, size);
    }
    const section_view **order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "checking %u engine sections", n);
    for (uint32_t i = 0; i < n; i++)
        order[i] = &secs[i];
    qsort(order, n, sizeof *order, cmp_section_offset);
    uint64_t pos = hv->table_end;
    kiln_status st = KILN_OK;
    for (uint32_t i = 0; i <= n && st == KILN_OK; i++) {
        uint64_t next = i < n ? order[i]->offset : size;
        if (next < pos) {
            kiln_engine_fourcc_str(order[i]->id, cc);
            st = kiln_fail(KILN_ERROR_FORMAT, "engine section %s at offset %" PRIu64 " overlaps another section", cc,
                           next);
            break;
        }
        for (uint64_t p = pos; p < next; p++)
            if (d[p] != 0) {
                st = kiln_fail(KILN_ERROR_CHECKSUM,
                               "engine padding byte at offset %" PRIu64 " is not zero: the file is corrupted", p);
                break;
            }
        if (i < n)
            pos = order[i]->offset + order[i]->size;
    }
    free(order);
    KILN_TRY(st);
    for (uint32_t i = 0; i < n; i++) {
        const section_view *s = &secs[i];
        if (XXH64(d + s->offset, (size_t)s->size, 0) != s->checksum) {
            kiln_engine_fourcc_str(s->id, cc);
            return kiln_fail(KILN_ERROR_CHECKSUM, "engine section %s checksum mismatch: the file is corrupted", cc);
        }
    }
    return KILN_OK;
}

/* ---- reading: the plan --------------------------------------------------------- */

typedef struct plan_reader {
    kiln_graph *g;
    const uint8_t *weights;
    uint64_t weights_size;
    const uint8_t *blobs;
    uint64_t blobs_size;
    int borrow;
    char ctx[96]; /* "tensor 3", "layer 7" ... for messages */
} plan_reader;

static kiln_status rd_fail(plan_reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static kiln_status rd_fail(plan_reader *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_fail(KILN_ERROR_FORMAT, "engine plan: %s%s%s", r->ctx, r->ctx[0] ? ": " : "", msg);
}

static kiln_status rd_oom(void) { return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "reading the engine plan"); }

static kiln_status rd_field(plan_reader *r, json_t *obj, const char *key, json_t **out)
{
    json_t *v = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    if (!v)
        return rd_fail(r, "missing field \"%s\"", key);
    *out = v;
    return KILN_OK;
}

static kiln_status rd_int_value(plan_reader *r, json_t *v, const char *what, int64_t lo, int64_t hi, int64_t *out)
{
    if (!json_is_integer(v))
        return rd_fail(r, "%s is not an integer", what);
    int64_t x = (int64_t)json_integer_value(v);
    if (x < lo || x > hi)
        return rd_fail(r, "%s = %" PRId64 " is outside %" PRId64 "..%" PRId64, what, x, lo, hi);
    *out = x;
    return KILN_OK;
}

static kiln_status rd_int(plan_reader *r, json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = NULL;
    KILN_TRY(rd_field(r, obj, key, &v));
    return rd_int_value(r, v, key, lo, hi, out);
}

static kiln_status rd_i32(plan_reader *r, json_t *obj, const char *key, int64_t lo, int64_t hi, int32_t *out)
{
    int64_t v = 0;
    KILN_TRY(rd_int(r, obj, key, lo, hi, &v));
    *out = (int32_t)v;
    return KILN_OK;
}

static kiln_status rd_array(plan_reader *r, json_t *obj, const char *key, size_t max, json_t **out)
{
    json_t *v = NULL;
    KILN_TRY(rd_field(r, obj, key, &v));
    if (!json_is_array(v))
        return rd_fail(r, "field \"%s\" is not an array", key);
    if (json_array_size(v) > max)
        return rd_fail(r, "field \"%s\" has %zu entries (at most %zu)", key, json_array_size(v), max);
    *out = v;
    return KILN_OK;
}

static kiln_status rd_str(plan_reader *r, json_t *obj, const char *key, char **out)
{
    json_t *v = NULL;
    KILN_TRY(rd_field(r, obj, key, &v));
    if (!json_is_string(v))
        return rd_fail(r, "field \"%s\" is not a string", key);
    char *s = kiln_strdup(json_string_value(v));
    if (!s)
        return rd_oom();
    *out = s;
    return KILN_OK;
}

/* A fixed-size array of int32 values in [lo, hi], at most max entries. */
static kiln_status rd_i32s(plan_reader *r, json_t *obj, const char *key, size_t max, int64_t lo, int64_t hi,
                           int32_t *dst, int32_t *n)
{
    json_t *a = NULL;
    KILN_TRY(rd_array(r, obj, key, max, &a));
    char what[64];
    for (size_t i = 0; i < json_array_size(a); i++) {
        int64_t v = 0;
        snprintf(what, sizeof what, "%s[%zu]", key, i);
        KILN_TRY(rd_int_value(r, json_array_get(a, i), what, lo, hi, &v));
        dst[i] = (int32_t)v;
    }
    *n = (int32_t)json_array_size(a);
    return KILN_OK;
}

/* Like rd_i32s into a new malloc'd array (NULL when empty). */
static kiln_status rd_i32s_alloc(plan_reader *r, json_t *obj, const char *key, int64_t lo, int64_t hi, int32_t **dst,
                                 int32_t *n)
{
    json_t *a = NULL;
    KILN_TRY(rd_array(r, obj, key, INT32_MAX, &a));
    size_t count = json_array_size(a);
    int32_t *v = NULL;
    if (count && !(v = calloc(count, sizeof *v)))
        return rd_oom();
    int32_t got = 0;
    kiln_status s = rd_i32s(r, obj, key, count, lo, hi, v, &got);
    if (s != KILN_OK) {
        free(v);
        return s;
    }
    *dst = v;
    *n = got;
    return KILN_OK;
}

/* [offset, size] inside a section of `limit` bytes. */
static kiln_status rd_range(plan_reader *r, json_t *obj, const char *key, uint64_t limit, uint64_t *off, uint64_t *size)
{
    json_t *a = NULL;
    KILN_TRY(rd_array(r, obj, key, 2, &a));
    if (json_array_size(a) != 2)
        return rd_fail(r, "field \"%s\" is not an [offset, size] pair", key);
    int64_t o = 0, n = 0;
    KILN_TRY(rd_int_value(r, json_array_get(a, 0), "offset", 0, INT64_MAX, &o));
    KILN_TRY(rd_int_value(r, json_array_get(a, 1), "size", 0, INT64_MAX, &n));
    uint64_t end;
    if (__builtin_add_overflow((uint64_t)o, (uint64_t)n, &end) || end > limit || (uint64_t)n > SIZE_MAX)
        return rd_fail(r, "%s [%" PRId64 ", +%" PRId64 ") lies outside its %" PRIu64 "-byte section", key, o, n, limit);
    *off = (uint64_t)o;
    *size = (uint64_t)n;
    return KILN_OK;
}

/* Copies or borrows bytes of a section. Empty ranges give NULL. */
static kiln_status take_bytes(plan_reader *r, const uint8_t *base, uint64_t off, uint64_t size, int borrow, void **data,
                              int32_t *owned)
{
    *data = NULL;
    *owned = 0;
    if (size == 0)
        return KILN_OK;
    if (borrow) {
        /* no base: the writer's check of its own plan, which reads no bytes */
        *data = base ? (void *)(uintptr_t)(base + off) : NULL;
        return KILN_OK;
    }
    void *p = malloc((size_t)size);
    if (!p)
        return rd_oom();
    memcpy(p, base + off, (size_t)size);
    *data = p;
    *owned = 1;
    return KILN_OK;
}

static kiln_status rd_exprs(plan_reader *r, json_t *arr, int32_t n_symbols)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    kiln_expr_node *nodes = calloc(n, sizeof *nodes);
    if (!nodes)
        return rd_oom();
    /* The pool owns the nodes from here; its hash table is rebuilt on the
     * first insertion (expr.c), so none is stored. */
    g->exprs.nodes = nodes;
    g->exprs.n = g->exprs.cap = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        snprintf(r->ctx, sizeof r->ctx, "expression %zu", i);
        json_t *e = json_array_get(arr, i);
        if (!json_is_array(e) || json_array_size(e) != 4)
            return rd_fail(r, "not a [kind, a, b, value] array");
        int64_t kind = 0, a = 0, b = 0, value = 0;
        KILN_TRY(rd_int_value(r, json_array_get(e, 0), "kind", 0, KILN_EXPR_NODE_SYMBOL, &kind));
        KILN_TRY(rd_int_value(r, json_array_get(e, 1), "a", -1, (int64_t)i - 1, &a));
        KILN_TRY(rd_int_value(r, json_array_get(e, 2), "b", -1, (int64_t)i - 1, &b));
        KILN_TRY(rd_int_value(r, json_array_get(e, 3), "value", INT64_MIN, INT64_MAX, &value));
        if (kind == KILN_EXPR_NODE_CONST || kind == KILN_EXPR_NODE_SYMBOL) {
            if (a != -1 || b != -1)
                return rd_fail(r, "a leaf has operands %" PRId64 ", %" PRId64, a, b);
            if (kind == KILN_EXPR_NODE_SYMBOL && (value < 0 || value >= n_symbols))
                return rd_fail(r, "symbol %" PRId64 " does not exist (%d symbols)", value, n_symbols);
        } else {
            if (a < 0 || b < 0)
                return rd_fail(r, "operation has operands %" PRId64 ", %" PRId64, a, b);
            if (value != 0)
                return rd_fail(r, "operation has value %" PRId64, value);
        }
        nodes[i] = (kiln_expr_node){(int32_t)kind, (kiln_expr)a, (kiln_expr)b, value};
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status rd_plugins(plan_reader *r, json_t *arr)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    if (!(g->plugins = calloc(n, sizeof *g->plugins)))
        return rd_oom();
    g->n_plugins = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        kiln_plugin_rec *p = &g->plugins[i];
        json_t *o = json_array_get(arr, i);
        snprintf(r->ctx, sizeof r->ctx, "plugin %zu", i);
        if (!json_is_object(o))
            return rd_fail(r, "not an object");
        KILN_TRY(rd_str(r, o, "name", &p->name));
        KILN_TRY(rd_str(r, o, "version", &p->version));
        KILN_TRY(rd_str(r, o, "namespace", &p->plugin_namespace));
        KILN_TRY(rd_str(r, o, "library", &p->library));
        int64_t bv = 0;
        KILN_TRY(rd_int(r, o, "blob_version", 0, UINT32_MAX, &bv));
        p->blob_version = (uint32_t)bv;
        uint64_t off, size;
        KILN_TRY(rd_range(r, o, "blob", r->blobs_size, &off, &size));
        /* Blobs are always copied: the record owns its blob. */
        int32_t owned;
        KILN_TRY(take_bytes(r, r->blobs, off, size, 0, &p->blob, &owned));
        p->blob_size = (size_t)size;
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status rd_tensors(plan_reader *r, json_t *arr, int32_t n_layers)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    if (!(g->tensors = calloc(n, sizeof *g->tensors)))
        return rd_oom();
    g->n_tensors = g->cap_tensors = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        kiln_tensor_rec *t = &g->tensors[i];
        json_t *o = json_array_get(arr, i);
        snprintf(r->ctx, sizeof r->ctx, "tensor %zu", i);
        if (!json_is_object(o))
            return rd_fail(r, "not an object");
        KILN_TRY(rd_str(r, o, "name", &t->name));
        snprintf(r->ctx, sizeof r->ctx, "tensor %zu \"%.48s\"", i, t->name);
        int32_t dtype = 0, rank = 0;
        int64_t flags = 0, arena_offset = 0, max_bytes = 0;
        /* Unused dims read as -1, as kiln_graph_add_tensor leaves them. */
        for (int32_t k = 0; k < KILN_MAX_RANK; k++)
            t->dims[k] = -1;
        KILN_TRY(rd_i32(r, o, "dtype", 0, KILN_DTYPE_COUNT - 1, &dtype));
        t->dtype = (kiln_dtype)dtype;
        KILN_TRY(rd_int(r, o, "flags", 0, KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT | KILN_TENSOR_CONSTANT, &flags));
        t->flags = (uint32_t)flags;
        KILN_TRY(rd_i32s(r, o, "dims", KILN_MAX_RANK, 0, (int64_t)g->exprs.n - 1, t->dims, &rank));
        t->rank = rank;
        KILN_TRY(rd_i32(r, o, "producer", -1, (int64_t)n_layers - 1, &t->producer));
        KILN_TRY(rd_int(r, o, "arena_offset", -1, INT64_MAX, &arena_offset));
        KILN_TRY(rd_int(r, o, "max_bytes", 0, INT64_MAX, &max_bytes));
        t->arena_offset = arena_offset;
        t->max_bytes = (size_t)max_bytes;
        uint64_t end;
        if (arena_offset >= 0 &&
            (__builtin_add_overflow((uint64_t)arena_offset, (uint64_t)max_bytes, &end) || end > g->arena_size))
            return rd_fail(r, "arena range [%" PRId64 ", +%" PRId64 ") exceeds the %zu-byte arena", arena_offset,
                           max_bytes, g->arena_size);
        json_t *data = json_object_get(o, "data");
        if (!(t->flags & KILN_TENSOR_CONSTANT)) {
            if (data)
                return rd_fail(r, "has data but is not a constant");
            continue;
        }
        uint64_t off, size;
        KILN_TRY(rd_range(r, o, "data", r->weights_size, &off, &size));
        if (off % KILN_ENGINE_WEIGHT_ALIGN)
            return rd_fail(r, "data offset %" PRIu64 " is not a multiple of %u", off, KILN_ENGINE_WEIGHT_ALIGN);
        /* The bytes must match the static shape so kernels never read past
         * them. */
        uint64_t bytes = kiln_dtype_size(t->dtype);
        for (int32_t k = 0; k < t->rank; k++) {
            const kiln_expr_node *e = &g->exprs.nodes[t->dims[k]];
            if (e->kind != KILN_EXPR_NODE_CONST || e->value < 0)
                return rd_fail(r, "constant dim %d is not a non-negative constant", k);
            if (__builtin_mul_overflow(bytes, (uint64_t)e->value, &bytes))
                return rd_fail(r, "constant size overflows");
        }
        if (bytes != size)
            return rd_fail(r, "constant has %" PRIu64 " bytes, its shape needs %" PRIu64, size, bytes);
        KILN_TRY(take_bytes(r, r->weights, off, size, r->borrow, &t->data, &t->data_owned));
        t->data_size = (size_t)size;
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status rd_perm(plan_reader *r, json_t *o, const char *key, int32_t rank, int32_t *perm)
{
    int32_t n = 0;
    KILN_TRY(rd_i32s(r, o, key, KILN_MAX_RANK, 0, KILN_MAX_RANK - 1, perm, &n));
    if (n != rank)
        return rd_fail(r, "%s has %d entries for rank %d", key, n, rank);
    uint32_t seen = 0;
    for (int32_t i = 0; i < n; i++) {
        if (perm[i] >= rank || (seen & (1u << perm[i])))
            return rd_fail(r, "%s is not a permutation of 0..%d", key, rank - 1);
        seen |= 1u << perm[i];
    }
    return KILN_OK;
}

static kiln_status rd_steps(plan_reader *r, json_t *o, const char *key, const kiln_layer *l, kiln_layer_params *p)
{
    json_t *steps = NULL;
    KILN_TRY(rd_array(r, o, key, KILN_FUSED_MAX_STEPS, &steps));
    int32_t n = (int32_t)json_array_size(steps);
    if (n < 1)
        return rd_fail(r, "a fused layer has no steps");
    p->fused.n_steps = n;
    for (int32_t i = 0; i < n; i++) {
        json_t *e = json_array_get(steps, (size_t)i);
        if (!json_is_array(e) || json_array_size(e) != 5)
            return rd_fail(r, "fused step %d is not [is_binary, op, a, b, src_layer]", i);
        int64_t f[5] = {0};
        /* Operands name layer inputs or earlier steps only. */
        int64_t last = (int64_t)l->n_inputs + i - 1;
        KILN_TRY(rd_int_value(r, json_array_get(e, 0), "fused is_binary", 0, 1, &f[0]));
        KILN_TRY(rd_int_value(r, json_array_get(e, 1), "fused op", 0,
                              f[0] ? KILN_BINARY_OP_COUNT - 1 : KILN_UNARY_OP_COUNT - 1, &f[1]));
        KILN_TRY(rd_int_value(r, json_array_get(e, 2), "fused operand a", 0, last, &f[2]));
        KILN_TRY(rd_int_value(r, json_array_get(e, 3), "fused operand b", f[0] ? 0 : INT32_MIN, f[0] ? last : INT32_MAX,
                              &f[3]));
        KILN_TRY(rd_int_value(r, json_array_get(e, 4), "fused src_layer", -1, INT32_MAX, &f[4]));
        p->fused.steps[i] =
            (kiln_fused_step){(int32_t)f[0], (int32_t)f[1], (int32_t)f[2], (int32_t)f[3], (int32_t)f[4]};
    }
    return KILN_OK;
}

/* One attribute of the op table (core/op_table.h) from "params". */
static kiln_status rd_attr(plan_reader *r, json_t *o, const kiln_op_attr *a, kiln_layer *l)
{
    kiln_graph *g = r->g;
    kiln_layer_params *p = &l->p;
    uint8_t *field = (uint8_t *)p + a->offset;
    int32_t rank = l->n_inputs > 0 ? g->tensors[l->inputs[0]].rank : 0;
    int64_t hi = kiln_op_attr_hi(a, rank, p->shuffle.mid_rank, g->n_plugins);
    int64_t v = 0;
    switch (a->type) {
    case KILN_ATTR_I32: {
        int32_t x = 0;
        KILN_TRY(rd_i32(r, o, a->key, a->lo, hi, &x));
        memcpy(field, &x, sizeof x);
        return KILN_OK;
    }
    case KILN_ATTR_AXES: {
        KILN_TRY(rd_int(r, o, a->key, 0, (int64_t)(1u << rank) - 1, &v));
        uint32_t x = (uint32_t)v;
        memcpy(field, &x, sizeof x);
        return KILN_OK;
    }
    case KILN_ATTR_I64_RANK: {
        json_t *arr = NULL;
        KILN_TRY(rd_array(r, o, a->key, KILN_MAX_RANK, &arr));
        if ((int32_t)json_array_size(arr) != rank)
            return rd_fail(r, "%s has %zu entries for rank %d", a->key, json_array_size(arr), rank);
        for (int32_t i = 0; i < rank; i++) {
            KILN_TRY(rd_int_value(r, json_array_get(arr, (size_t)i), a->key, a->lo, INT64_MAX, &v));
            memcpy(field + sizeof(int64_t) * (size_t)i, &v, sizeof v);
        }
        return KILN_OK;
    }
    case KILN_ATTR_PERM: {
        int32_t has = json_object_get(o, a->key) != NULL;
        memcpy((uint8_t *)p + a->aux, &has, sizeof has);
        return has ? rd_perm(r, o, a->key, (int32_t)(hi + 1), (int32_t *)(void *)field) : KILN_OK;
    }
    case KILN_ATTR_EXPRS: {
        int32_t n = 0;
        KILN_TRY(rd_i32s(r, o, a->key, KILN_MAX_RANK, 0, (int64_t)g->exprs.n - 1, (int32_t *)(void *)field, &n));
        memcpy((uint8_t *)p + a->aux, &n, sizeof n);
        return KILN_OK;
    }
    case KILN_ATTR_STEPS: return rd_steps(r, o, a->key, l, p);
    case KILN_ATTR_TYPE_COUNT: break;
    }
    return rd_fail(r, "attribute \"%s\" has no reader", a->key);
}

static kiln_status rd_params(plan_reader *r, json_t *o, kiln_layer *l, const kiln_op_info *op)
{
    kiln_graph *g = r->g;
    /* Concat reads every input along the first input's rank. */
    if (l->op == KILN_OP_CONCAT) {
        int32_t rank = g->tensors[l->inputs[0]].rank;
        for (int32_t i = 1; i < l->n_inputs; i++)
            if (g->tensors[l->inputs[i]].rank != rank)
                return rd_fail(r, "concat inputs have ranks %d and %d", rank, g->tensors[l->inputs[i]].rank);
    }
    for (int32_t i = 0; i < op->n_attrs; i++)
        KILN_TRY(rd_attr(r, o, &op->attrs[i], l));
    return KILN_OK;
}

static kiln_status rd_layers(plan_reader *r, json_t *arr)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    if (!(g->layers = calloc(n, sizeof *g->layers)))
        return rd_oom();
    g->n_layers = g->cap_layers = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        kiln_layer *l = &g->layers[i];
        json_t *o = json_array_get(arr, i);
        snprintf(r->ctx, sizeof r->ctx, "layer %zu", i);
        if (!json_is_object(o))
            return rd_fail(r, "not an object");
        KILN_TRY(rd_str(r, o, "name", &l->name));
        snprintf(r->ctx, sizeof r->ctx, "layer %zu \"%.48s\"", i, l->name);
        int32_t op = 0;
        KILN_TRY(rd_i32(r, o, "op", 0, KILN_OP_COUNT - 1, &op));
        l->op = (kiln_op)op;
        KILN_TRY(rd_i32s_alloc(r, o, "inputs", 0, (int64_t)g->n_tensors - 1, &l->inputs, &l->n_inputs));
        KILN_TRY(rd_i32s_alloc(r, o, "outputs", 0, (int64_t)g->n_tensors - 1, &l->outputs, &l->n_outputs));
        const kiln_op_info *info = kiln_op_info_get(l->op);
        if (l->n_inputs < info->min_inputs || (info->max_inputs >= 0 && l->n_inputs > info->max_inputs) ||
            l->n_outputs < info->min_outputs || l->n_outputs > info->max_outputs)
            return rd_fail(r, "%s with %d inputs and %d outputs", info->name, l->n_inputs, l->n_outputs);
        json_t *params = NULL;
        KILN_TRY(rd_field(r, o, "params", &params));
        if (!json_is_object(params))
            return rd_fail(r, "field \"params\" is not an object");
        KILN_TRY(rd_params(r, params, l, info));
        int64_t ws = 0;
        KILN_TRY(rd_int(r, o, "workspace", 0, INT64_MAX, &ws));
        l->workspace = (size_t)ws;
        KILN_TRY(rd_int(r, o, "tactic", INT64_MIN, INT64_MAX, &l->tactic));
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status rd_symbol(plan_reader *r, json_t *e, size_t i, const uint8_t *is_input)
{
    kiln_graph *g = r->g;
    snprintf(r->ctx, sizeof r->ctx, "symbol %zu", i);
    if (!json_is_array(e) || json_array_size(e) != 2)
        return rd_fail(r, "not a [tensor, axis] pair");
    int64_t t = 0, axis = 0;
    KILN_TRY(rd_int_value(r, json_array_get(e, 0), "tensor", 0, (int64_t)g->n_tensors - 1, &t));
    if (!is_input[t])
        return rd_fail(r, "tensor %" PRId64 " is not a network input", t);
    KILN_TRY(rd_int_value(r, json_array_get(e, 1), "axis", 0, (int64_t)g->tensors[t].rank - 1, &axis));
    g->symbols[i] = (kiln_symbol){(int32_t)t, (int32_t)axis};
    return KILN_OK;
}

static kiln_status rd_symbols(plan_reader *r, json_t *arr)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    if (!(g->symbols = calloc(n, sizeof *g->symbols)))
        return rd_oom();
    g->n_symbols = (int32_t)n;
    /* A table, not a search per symbol: the counts come from the file, and
     * symbols × inputs could be made large enough to hang. */
    uint8_t *is_input = calloc((size_t)g->n_tensors + 1, 1);
    if (!is_input)
        return rd_oom();
    for (int32_t k = 0; k < g->n_inputs; k++)
        is_input[g->inputs[k]] = 1;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n && st == KILN_OK; i++)
        st = rd_symbol(r, json_array_get(arr, i), i, is_input);
    free(is_input);
    r->ctx[0] = '\0';
    return st;
}

static kiln_status rd_dims(plan_reader *r, json_t *o, const char *key, int32_t rank, kiln_dims *d)
{
    json_t *a = NULL;
    KILN_TRY(rd_array(r, o, key, KILN_MAX_RANK, &a));
    if ((int32_t)json_array_size(a) != rank)
        return rd_fail(r, "%s has %zu dims for rank %d", key, json_array_size(a), rank);
    d->rank = rank;
    for (int32_t i = 0; i < rank; i++)
        KILN_TRY(rd_int_value(r, json_array_get(a, (size_t)i), key, 0, INT64_MAX, &d->d[i]));
    return KILN_OK;
}

static kiln_status rd_profiles(plan_reader *r, json_t *arr)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr), total;
    if (n == 0 || g->n_inputs == 0) {
        g->n_profiles = (int32_t)n;
        for (size_t p = 0; p < n; p++) {
            json_t *row = json_array_get(arr, p);
            if (!json_is_array(row) || json_array_size(row) != 0) {
                snprintf(r->ctx, sizeof r->ctx, "profile %zu", p);
                return rd_fail(r, "not an array of %d inputs", g->n_inputs);
            }
        }
        return KILN_OK;
    }
    if (kiln_mul_overflow(n, (size_t)g->n_inputs, &total) || total > INT32_MAX)
        return rd_fail(r, "%zu profiles of %d inputs is too many", n, g->n_inputs);
    if (!(g->profiles = calloc(total, sizeof *g->profiles)))
        return rd_oom();
    g->n_profiles = (int32_t)n;
    for (size_t p = 0; p < n; p++) {
        json_t *row = json_array_get(arr, p);
        snprintf(r->ctx, sizeof r->ctx, "profile %zu", p);
        if (!json_is_array(row) || json_array_size(row) != (size_t)g->n_inputs)
            return rd_fail(r, "not an array of %d inputs", g->n_inputs);
        for (int32_t i = 0; i < g->n_inputs; i++) {
            kiln_profile_dims *pd = &g->profiles[p * (size_t)g->n_inputs + (size_t)i];
            json_t *o = json_array_get(row, (size_t)i);
            int32_t rank = g->tensors[g->inputs[i]].rank;
            snprintf(r->ctx, sizeof r->ctx, "profile %zu input %d", p, i);
            if (!json_is_object(o))
                return rd_fail(r, "not an object");
            KILN_TRY(rd_dims(r, o, "min", rank, &pd->min));
            KILN_TRY(rd_dims(r, o, "opt", rank, &pd->opt));
            KILN_TRY(rd_dims(r, o, "max", rank, &pd->max));
            for (int32_t k = 0; k < rank; k++)
                if (pd->min.d[k] > pd->opt.d[k] || pd->opt.d[k] > pd->max.d[k])
                    return rd_fail(r, "dim %d has min %" PRId64 ", opt %" PRId64 ", max %" PRId64 " out of order", k,
                                   pd->min.d[k], pd->opt.d[k], pd->max.d[k]);
        }
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status rd_constraints(plan_reader *r, json_t *arr)
{
    kiln_graph *g = r->g;
    size_t n = json_array_size(arr);
    if (n == 0)
        return KILN_OK;
    if (!(g->constraints = calloc(n, sizeof *g->constraints)))
        return rd_oom();
    g->n_constraints = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        kiln_constraint *c = &g->constraints[i];
        json_t *o = json_array_get(arr, i);
        snprintf(r->ctx, sizeof r->ctx, "constraint %zu", i);
        if (!json_is_object(o))
            return rd_fail(r, "not an object");
        int32_t kind = 0;
        KILN_TRY(rd_i32(r, o, "kind", 0, KILN_CONSTRAINT_KIND_COUNT - 1, &kind));
        c->kind = (kiln_constraint_kind)kind;
        int unary = c->kind == KILN_CONSTRAINT_POSITIVE || c->kind == KILN_CONSTRAINT_NONNEGATIVE;
        KILN_TRY(rd_i32(r, o, "a", 0, (int64_t)g->exprs.n - 1, &c->a));
        KILN_TRY(rd_i32(r, o, "b", unary ? -1 : 0, (int64_t)g->exprs.n - 1, &c->b));
        KILN_TRY(rd_i32(r, o, "layer", -1, (int64_t)g->n_layers - 1, &c->layer));
        KILN_TRY(rd_str(r, o, "what", &c->what));
    }
    r->ctx[0] = '\0';
    return KILN_OK;
}

static kiln_status parse_plan(plan_reader *r, const uint8_t *text, size_t size)
{
    kiln_graph *g = r->g;
    json_error_t err;
    json_t *root = json_loadb((const char *)text, size, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return kiln_fail(KILN_ERROR_FORMAT, "engine plan: JSON error at byte %d: %s", err.position, err.text);
    kiln_status s = KILN_OK;
    json_t *a_sym = NULL, *a_exprs = NULL, *a_plugins = NULL, *a_tensors = NULL, *a_layers = NULL;
    json_t *a_constraints = NULL, *a_profiles = NULL;
    int64_t arena = 0, ws = 0;
    r->ctx[0] = '\0';
    if (!json_is_object(root))
        s = rd_fail(r, "not a JSON object");
    if (s == KILN_OK)
        s = rd_int(r, root, "arena_size", 0, INT64_MAX, &arena);
    if (s == KILN_OK && (s = rd_int(r, root, "workspace_size", 0, INT64_MAX, &ws)) == KILN_OK) {
        g->arena_size = (size_t)arena;
        g->workspace_size = (size_t)ws;
    }
    if (s == KILN_OK)
        s = rd_array(r, root, "symbols", INT32_MAX, &a_sym);
    if (s == KILN_OK)
        s = rd_array(r, root, "exprs", INT32_MAX, &a_exprs);
    if (s == KILN_OK)
        s = rd_array(r, root, "plugins", INT32_MAX, &a_plugins);
    if (s == KILN_OK)
        s = rd_array(r, root, "tensors", INT32_MAX, &a_tensors);
    if (s == KILN_OK)
        s = rd_array(r, root, "layers", INT32_MAX, &a_layers);
    if (s == KILN_OK)
        s = rd_array(r, root, "profiles", INT32_MAX, &a_profiles);
    if (s == KILN_OK)
        s = rd_array(r, root, "constraints", INT32_MAX, &a_constraints);
    /* Each part is checked against the parts before it, so the order
     * matters: symbols' count, expressions, plugins, tensors, layers. */
    if (s == KILN_OK)
        s = rd_exprs(r, a_exprs, (int32_t)json_array_size(a_sym));
    if (s == KILN_OK)
        s = rd_plugins(r, a_plugins);
    if (s == KILN_OK)
        s = rd_tensors(r, a_tensors, (int32_t)json_array_size(a_layers));
    if (s == KILN_OK)
        s = rd_layers(r, a_layers);
    if (s == KILN_OK)
        s = rd_i32s_alloc(r, root, "inputs", 0, (int64_t)g->n_tensors - 1, &g->inputs, &g->n_inputs);
    if (s == KILN_OK)
        s = rd_i32s_alloc(r, root, "outputs", 0, (int64_t)g->n_tensors - 1, &g->outputs, &g->n_outputs);
    if (s == KILN_OK)
        s = rd_symbols(r, a_sym);
    if (s == KILN_OK)
        s = rd_profiles(r, a_profiles);
    if (s == KILN_OK)
        s = rd_constraints(r, a_constraints);
    json_decref(root);
    if (s == KILN_OK)
        s = kiln_engine_check_plan(g);
    return s;
}

kiln_status kiln_engine_parse_plan(const uint8_t *text, size_t size, const kiln_engine_sections *secs, int borrow,
                                   kiln_graph *g)
{
    plan_reader r;
    memset(&r, 0, sizeof r);
    r.g = g;
    r.blobs = secs->blobs;
    r.blobs_size = secs->blobs_size;
    r.weights = secs->weights;
    r.weights_size = secs->weights_size;
    r.borrow = borrow;
    return parse_plan(&r, text, size);
}

/* ---- reading: the whole engine -------------------------------------------------- */

static kiln_status rd_extra_sections(kiln_graph *g, const uint8_t *d, const section_view *secs, uint32_t n, int borrow)
{
    uint32_t count = 0;
    for (uint32_t i = 0; i < n; i++)
        count += secs[i].id != SECTION_PLAN && secs[i].id != SECTION_WEIGHTS && secs[i].id != SECTION_BLOBS;
    if (count == 0)
        return KILN_OK;
    if (!(g->sections = calloc(count, sizeof *g->sections)))
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "reading %u engine sections", count);
    for (uint32_t i = 0; i < n; i++) {
        const section_view *s = &secs[i];
        if (s->id == SECTION_PLAN || s->id == SECTION_WEIGHTS || s->id == SECTION_BLOBS)
            continue;
        kiln_section_rec *rec = &g->sections[g->n_sections++];
        rec->id = s->id;
        rec->size = (size_t)s->size;
        if (s->size == 0)
            continue;
        if (borrow) {
            rec->data = (void *)(uintptr_t)(d + s->offset);
        } else {
            if (!(rec->data = malloc((size_t)s->size)))
                return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "copying a %" PRIu64 "-byte engine section", s->size);
            memcpy(rec->data, d + s->offset, (size_t)s->size);
            rec->data_owned = 1;
        }
    }
    return KILN_OK;
}

kiln_status kiln_engine_read(const void *data, size_t size, int borrow, kiln_graph *out, kiln_engine_header_info *info)
{
    if (!out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_engine_read: out is required");
    const uint8_t *d = data;
    header_view hv;
    KILN_TRY(parse_header(d, size, &hv));
    if (hv.info.file_size != size)
        return kiln_fail(KILN_ERROR_FORMAT, "engine %s: header says %" PRIu64 " bytes, file has %zu",
                         hv.info.file_size > size ? "truncated" : "size mismatch", hv.info.file_size, size);
    section_view *secs = malloc((hv.n_sections ? hv.n_sections : 1) * sizeof *secs);
    if (!secs)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "reading %u engine sections", hv.n_sections);
    kiln_status s = check_sections(d, size, &hv, secs);
    const section_view *plan = NULL, *weights = NULL, *blobs = NULL;
    for (uint32_t i = 0; i < hv.n_sections && s == KILN_OK; i++) {
        const section_view **slot = secs[i].id == SECTION_PLAN      ? &plan
                                    : secs[i].id == SECTION_WEIGHTS ? &weights
                                    : secs[i].id == SECTION_BLOBS   ? &blobs
                                                                    : NULL;
        if (!slot)
            continue;
        if (*slot) {
            char cc[5];
            kiln_engine_fourcc_str(secs[i].id, cc);
            s = kiln_fail(KILN_ERROR_FORMAT, "engine has two %s sections", cc);
        }
        *slot = &secs[i];
    }
    if (s == KILN_OK && (!plan || !weights || !blobs))
        s = kiln_fail(KILN_ERROR_FORMAT, "engine lacks its %s section", !plan ? "PLAN" : !weights ? "WGHT" : "BLOB");
    if (s == KILN_OK && weights->offset % WEIGHTS_PAGE)
        s = kiln_fail(KILN_ERROR_FORMAT, "engine weights section at offset %" PRIu64 " is not %u-aligned",
                      weights->offset, WEIGHTS_PAGE);
    kiln_graph g;
    kiln_graph_init(&g);
    if (s == KILN_OK) {
        g.backend = hv.info.backend;
        g.n_gpu_archs = hv.info.n_gpu_archs;
        memcpy(g.gpu_archs, hv.info.gpu_archs, sizeof g.gpu_archs);
        kiln_engine_sections es = {d + blobs->offset, blobs->size, d + weights->offset, weights->size};
        s = kiln_engine_parse_plan(d + plan->offset, (size_t)plan->size, &es, borrow, &g);
    }
    if (s == KILN_OK)
        s = rd_extra_sections(&g, d, secs, hv.n_sections, borrow);
    free(secs);
    if (s != KILN_OK) {
        kiln_graph_free(&g);
        return s;
    }
    *out = g;
    if (info)
        *info = hv.info;
    return KILN_OK;
}
