/* Structure-aware fuzzing of engines: a custom mutator that takes a valid
 * engine apart, changes its plan JSON (a number, or an array element or
 * member removed, repeated or swapped) or the bytes of another section, and
 * lays it out again with every checksum recomputed, so that what the
 * fuzzer exercises are the reader's plan checks, not its checksums. An
 * engine the reader accepts is then loaded with kiln's built-in plugins,
 * described, and run once on the CPU at its first profile's smallest
 * shapes with zeroed inputs: anything accepted must run or fail cleanly,
 * never crash. Seeds: tests/fuzz/corpus/fuzz_engine_plan/ (valid engines;
 * crashes found become files there). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include <kiln/kiln.h>

#include "engine/engine_format.h"
#include "runtime/runtime_internal.h"

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* Inputs and buffers beyond this are not run: the fuzzer looks for
 * crashes, and a plan asking for gigabytes would only hit its memory
 * limit. */
#define RUN_LIMIT ((size_t)256 << 20)

/* ---- the engine as sections ------------------------------------------------------------- */

typedef struct section {
    uint32_t id;
    uint8_t *data;
    size_t size;
} section;

typedef struct engine_parts {
    uint8_t header[HEADER_SIZE];
    section *secs;
    uint32_t n;
} engine_parts;

static void parts_free(engine_parts *p)
{
    for (uint32_t i = 0; i < p->n; i++)
        free(p->secs[i].data);
    free(p->secs);
    memset(p, 0, sizeof *p);
}

/* Splits an engine whose header and table are sound; 0 otherwise. */
static int parts_read(const uint8_t *d, size_t size, engine_parts *p)
{
    memset(p, 0, sizeof *p);
    if (size < HEADER_SIZE || memcmp(d, KILN_ENGINE_MAGIC, 8) != 0)
        return 0;
    uint32_t n = kiln_get_u32(d + OFF_N_SECTIONS);
    if (n == 0 || n > 64 || HEADER_SIZE + (size_t)ENTRY_SIZE * n > size)
        return 0;
    memcpy(p->header, d, HEADER_SIZE);
    p->secs = calloc(n, sizeof *p->secs);
    if (!p->secs)
        return 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = d + HEADER_SIZE + (size_t)ENTRY_SIZE * i;
        uint64_t off = kiln_get_u64(e + 8), sz = kiln_get_u64(e + 16);
        if (off > size || sz > size - off) {
            parts_free(p);
            return 0;
        }
        section *s = &p->secs[p->n++];
        s->id = kiln_get_u32(e);
        s->size = (size_t)sz;
        s->data = malloc(sz ? sz : 1);
        if (!s->data) {
            parts_free(p);
            return 0;
        }
        memcpy(s->data, d + off, sz);
    }
    return 1;
}

/* Lays the sections out as the writer does and seals every checksum.
 * Returns the size, or 0 when it does not fit max_size. */
static size_t parts_write(const engine_parts *p, uint8_t *out, size_t max_size)
{
    size_t pos = HEADER_SIZE + (size_t)ENTRY_SIZE * p->n;
    size_t *offs = calloc(p->n, sizeof *offs);
    if (!offs)
        return 0;
    for (uint32_t i = 0; i < p->n; i++) {
        size_t a = p->secs[i].id == SECTION_WEIGHTS ? WEIGHTS_PAGE : SECTION_ALIGN;
        pos = (pos + a - 1) / a * a;
        offs[i] = pos;
        pos += p->secs[i].size;
    }
    if (pos > max_size) {
        free(offs);
        return 0;
    }
    memset(out, 0, pos);
    memcpy(out, p->header, HEADER_SIZE);
    kiln_put_u64(out + OFF_FILE_SIZE, pos);
    kiln_put_u32(out + OFF_N_SECTIONS, p->n);
    for (uint32_t i = 0; i < p->n; i++) {
        const section *s = &p->secs[i];
        memcpy(out + offs[i], s->data, s->size);
        uint8_t *e = out + HEADER_SIZE + (size_t)ENTRY_SIZE * i;
        kiln_put_u32(e, s->id);
        kiln_put_u32(e + 4, 0);
        kiln_put_u64(e + 8, offs[i]);
        kiln_put_u64(e + 16, s->size);
        kiln_put_u64(e + 24, XXH64(s->data, s->size, 0));
    }
    kiln_put_u64(out + OFF_HEADER_CHECKSUM, 0);
    kiln_put_u64(out + OFF_HEADER_CHECKSUM, kiln_engine_header_checksum(out, (size_t)ENTRY_SIZE * p->n));
    free(offs);
    return pos;
}

/* ---- mutating JSON ------------------------------------------------------------------------ */

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next(rng *r)
{
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return r->s >> 17;
}

/* Every integer, array and object of a document, with where it sits. */
typedef struct node {
    json_t *v, *parent;
    size_t index;    /* in an array parent */
    const char *key; /* in an object parent */
} node;

typedef struct nodes {
    node *v;
    size_t n, cap;
} nodes;

static void collect(json_t *v, json_t *parent, size_t index, const char *key, nodes *out, int depth)
{
    if (depth > 32)
        return;
    if (out->n == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 256;
        node *m = realloc(out->v, cap * sizeof *m);
        if (!m)
            return;
        out->v = m;
        out->cap = cap;
    }
    out->v[out->n++] = (node){v, parent, index, key};
    size_t i;
    const char *k;
    json_t *c;
    if (json_is_array(v))
        json_array_foreach(v, i, c) collect(c, v, i, NULL, out, depth + 1);
    else if (json_is_object(v))
        json_object_foreach(v, k, c) collect(c, v, 0, k, out, depth + 1);
}

static void replace(const node *n, json_t *with)
{
    if (json_is_array(n->parent))
        json_array_set_new(n->parent, n->index, with);
    else
        json_object_set_new(n->parent, n->key, with);
}

/* old + d with two's-complement wrap-around: a number near the limits
 * stays a number near the limits, and the mutator itself never overflows
 * (UBSan stops the run at a signed overflow, wherever it happens). */
static json_int_t wrap_add(json_int_t old, unsigned long long d) { return (json_int_t)((unsigned long long)old + d); }

static json_int_t new_integer(rng *r, json_int_t old, const nodes *all)
{
    switch (next(r) % 12) {
    case 0: return 0;
    case 1: return -1;
    case 2: return 1;
    case 3: return wrap_add(old, 1);
    case 4: return wrap_add(old, ~0ull);                   /* old - 1 */
    case 5: return wrap_add(old, (unsigned long long)old); /* old * 2 */
    case 6: return old / 2;
    case 7: return wrap_add(old, 256);
    case 8: return wrap_add(old, 2);
    case 9: return (json_int_t)1 << (next(r) % 63);
    case 10: return INT32_MAX;
    default: {
        /* Another number of the same plan: a valid index, often of the
         * wrong thing. */
        const node *o = &all->v[next(r) % all->n];
        return json_is_integer(o->v) ? json_integer_value(o->v) : old;
    }
    }
}

/* One change to a JSON document; 0 when it has nothing to change. */
static int mutate_json(json_t *root, rng *r)
{
    nodes all = {0};
    collect(root, NULL, 0, NULL, &all, 0);
    int done = 0;
    for (int tries = 0; tries < 8 && !done && all.n > 1; tries++) {
        const node *n = &all.v[1 + next(r) % (all.n - 1)];
        uint64_t what = next(r) % 10;
        if (json_is_integer(n->v) && what < 7) {
            replace(n, json_integer(new_integer(r, json_integer_value(n->v), &all)));
            done = 1;
        } else if (json_is_array(n->v) && json_array_size(n->v) > 0) {
            size_t len = json_array_size(n->v), i = next(r) % len, j = next(r) % len;
            if (what % 3 == 0)
                json_array_remove(n->v, i);
            else if (what % 3 == 1)
                json_array_append(n->v, json_array_get(n->v, i));
            else {
                json_t *a = json_incref(json_array_get(n->v, i)), *b = json_incref(json_array_get(n->v, j));
                json_array_set_new(n->v, i, b);
                json_array_set_new(n->v, j, a);
            }
            done = 1;
        } else if (json_is_object(n->v) && json_object_size(n->v) > 0 && what == 9) {
            size_t k = next(r) % json_object_size(n->v), i = 0;
            const char *key;
            json_t *c;
            json_object_foreach(n->v, key, c)
            {
                if (i++ == k) {
                    json_object_del(n->v, key);
                    break;
                }
            }
            done = 1;
        }
    }
    free(all.v);
    return done;
}

/* Mutates section s as JSON when it parses as JSON; 0 otherwise. */
static int mutate_json_section(section *s, rng *r)
{
    json_t *root = json_loadb((const char *)s->data, s->size, 0, NULL);
    if (!root)
        return 0;
    int ok = mutate_json(root, r);
    char *text = ok ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return 0;
    free(s->data);
    s->data = (uint8_t *)text;
    s->size = strlen(text);
    return 1;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    engine_parts p;
    rng r = {seed * 2654435761u + 1};
    if (!parts_read(data, size, &p))
        return LLVMFuzzerMutate(data, size, max_size);
    uint32_t plan = 0;
    for (uint32_t i = 0; i < p.n; i++)
        if (p.secs[i].id == SECTION_PLAN)
            plan = i;
    uint32_t pick = next(&r) % 10 < 8 ? plan : (uint32_t)(next(&r) % p.n);
    section *s = &p.secs[pick];
    int changed = mutate_json_section(s, &r);
    if (!changed && s->size > 0 && s->size < (1u << 20)) {
        /* Bytes of a section that is not JSON (blobs, weights, TOKN). */
        uint8_t *b = realloc(s->data, s->size + 64);
        if (b) {
            s->data = b;
            s->size = LLVMFuzzerMutate(b, s->size, s->size + 64);
            changed = 1;
        }
    }
    size_t n = changed ? parts_write(&p, data, max_size) : 0;
    parts_free(&p);
    return n ? n : LLVMFuzzerMutate(data, size, max_size);
}

/* ---- what an accepted engine must survive ---------------------------------------------------- */

static kiln_registry *registry(void)
{
    static kiln_registry *reg;
    if (!reg && kiln_registry_create(&reg) != KILN_OK)
        __builtin_trap();
    return reg;
}

/* Bytes of every tensor at profile 0's min shapes, so that the run is
 * skipped when it would only exhaust memory. */
static int small_enough(const kiln_engine *e)
{
    const kiln_graph *g = &e->graph;
    size_t total = g->arena_size, bytes;
    if (g->workspace_size > RUN_LIMIT || total > RUN_LIMIT)
        return 0;
    int64_t *sym = calloc((size_t)g->n_symbols + 1, sizeof *sym);
    int64_t *values = calloc((size_t)g->exprs.n + 1, sizeof *values);
    kiln_dims *dims = calloc((size_t)g->n_tensors + 1, sizeof *dims);
    int ok = sym && values && dims;
    if (ok) {
        kiln_graph_profile_symbols(g, g->n_profiles > 0 ? 0 : -1, 0, sym);
        ok = kiln_graph_eval_shapes(g, sym, values, dims) == KILN_OK;
    }
    for (int32_t t = 0; ok && t < g->n_tensors; t++) {
        if (!(g->tensors[t].flags & (KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT)))
            continue;
        ok = kiln_dims_bytes(&dims[t], g->tensors[t].dtype, &bytes) == KILN_OK && bytes <= RUN_LIMIT &&
             (total += bytes) <= RUN_LIMIT;
    }
    free(sym);
    free(values);
    free(dims);
    return ok;
}

static void run_once(kiln_engine *e)
{
    kiln_context *ctx = NULL;
    if (!small_enough(e) || kiln_context_create(e, &ctx) != KILN_OK)
        return;
    int ok = 1;
    int32_t n = kiln_engine_num_io_tensors(e);
    for (int32_t i = 0; i < n && ok; i++) {
        const char *name = kiln_engine_io_tensor_name(e, i);
        kiln_dtype dt;
        int32_t is_input;
        kiln_dims dims, mn, opt, mx;
        ok = kiln_engine_io_tensor_info(e, name, &dt, &is_input, &dims) == KILN_OK;
        if (ok && is_input && kiln_engine_num_profiles(e) > 0 &&
            kiln_engine_profile_shape(e, 0, name, &mn, &opt, &mx) == KILN_OK)
            ok = kiln_context_set_input_shape(ctx, name, &mn) == KILN_OK;
    }
    for (int32_t i = 0; i < n && ok; i++) {
        const char *name = kiln_engine_io_tensor_name(e, i);
        kiln_dtype dt;
        int32_t is_input;
        kiln_dims dims;
        void *ptr = NULL;
        size_t bytes;
        ok = kiln_engine_io_tensor_info(e, name, &dt, &is_input, &dims) == KILN_OK &&
             kiln_context_tensor_shape(ctx, name, &dims) == KILN_OK && kiln_dims_bytes(&dims, dt, &bytes) == KILN_OK &&
             kiln_context_tensor_address(ctx, name, &ptr) == KILN_OK;
        if (ok && is_input && ptr && bytes)
            memset(ptr, 0, bytes);
    }
    if (ok)
        (void)kiln_context_enqueue(ctx, NULL);
    kiln_context_destroy(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_engine *e = NULL;
    if (kiln_engine_load_memory(registry(), data, size, &e) != KILN_OK)
        return 0;
    char *text = NULL;
    if (kiln_engine_describe_json(e, &text) == KILN_OK)
        free(text);
    run_once(e);
    kiln_engine_destroy(e);
    return 0;
}
