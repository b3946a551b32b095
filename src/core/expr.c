/* Hash-consed shape expressions. */
#include "core/expr.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void kiln_expr_pool_init(kiln_expr_pool *p) { memset(p, 0, sizeof *p); }

void kiln_expr_pool_free(kiln_expr_pool *p)
{
    free(p->nodes);
    free(p->hash);
    memset(p, 0, sizeof *p);
}

kiln_status kiln_expr_pool_copy(kiln_expr_pool *dst, const kiln_expr_pool *src)
{
    kiln_expr_pool t;
    kiln_expr_pool_init(&t);
    if (src->n > 0) {
        t.nodes = malloc((size_t)src->n * sizeof *t.nodes);
        if (!t.nodes)
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "copying %d shape expressions", src->n);
        memcpy(t.nodes, src->nodes, (size_t)src->n * sizeof *t.nodes);
        t.n = t.cap = src->n;
    }
    if (src->hash_cap > 0) {
        t.hash = malloc((size_t)src->hash_cap * sizeof *t.hash);
        if (!t.hash) {
            free(t.nodes);
            return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "copying the shape expression table");
        }
        memcpy(t.hash, src->hash, (size_t)src->hash_cap * sizeof *t.hash);
        t.hash_cap = src->hash_cap;
    }
    t.failed = src->failed;
    *dst = t;
    return KILN_OK;
}

/* ---- hash-consing ------------------------------------------------------------- */

static uint64_t node_hash(const kiln_expr_node *n)
{
    uint64_t h = 1469598103934665603ull;
    uint64_t parts[4] = {(uint64_t)(uint32_t)n->kind, (uint64_t)(uint32_t)n->a, (uint64_t)(uint32_t)n->b,
                         (uint64_t)n->value};
    for (int i = 0; i < 4; i++) {
        h ^= parts[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h;
}

static int node_equal(const kiln_expr_node *x, const kiln_expr_node *y)
{
    return x->kind == y->kind && x->a == y->a && x->b == y->b && x->value == y->value;
}

static int rehash(kiln_expr_pool *p, int32_t cap)
{
    int32_t *h = malloc((size_t)cap * sizeof *h);
    if (!h)
        return -1;
    for (int32_t i = 0; i < cap; i++)
        h[i] = -1;
    for (int32_t i = 0; i < p->n; i++) {
        uint32_t slot = (uint32_t)node_hash(&p->nodes[i]) & (uint32_t)(cap - 1);
        while (h[slot] >= 0)
            slot = (slot + 1) & (uint32_t)(cap - 1);
        h[slot] = i;
    }
    free(p->hash);
    p->hash = h;
    p->hash_cap = cap;
    return 0;
}

/* Returns the existing identical node or appends it. */
static kiln_expr intern(kiln_expr_pool *p, kiln_expr_node node)
{
    if (p->failed)
        return -1;
    /* A pool copied from an engine may arrive without its table. */
    if (p->hash_cap == 0 || (int64_t)(p->n + 1) * 2 > p->hash_cap) {
        int32_t cap = p->hash_cap ? p->hash_cap : 64;
        while ((int64_t)(p->n + 1) * 2 > cap) {
            if (cap > INT32_MAX / 2) {
                p->failed = 1;
                return -1;
            }
            cap *= 2;
        }
        if (rehash(p, cap) != 0) {
            p->failed = 1;
            return -1;
        }
    }
    uint32_t mask = (uint32_t)(p->hash_cap - 1);
    uint32_t slot = (uint32_t)node_hash(&node) & mask;
    while (p->hash[slot] >= 0) {
        if (node_equal(&p->nodes[p->hash[slot]], &node))
            return p->hash[slot];
        slot = (slot + 1) & mask;
    }
    if (p->n == p->cap) {
        int32_t cap = p->cap ? p->cap * 2 : 64;
        kiln_expr_node *nodes = p->cap > INT32_MAX / 2 ? NULL : realloc(p->nodes, (size_t)cap * sizeof *nodes);
        if (!nodes) {
            p->failed = 1;
            return -1;
        }
        p->nodes = nodes;
        p->cap = cap;
    }
    p->nodes[p->n] = node;
    p->hash[slot] = p->n;
    return p->n++;
}

kiln_expr kiln_expr_const(kiln_expr_pool *p, int64_t value)
{
    kiln_expr_node n = {KILN_EXPR_NODE_CONST, -1, -1, value};
    return intern(p, n);
}

kiln_expr kiln_expr_symbol(kiln_expr_pool *p, int32_t symbol)
{
    if (symbol < 0)
        return -1;
    kiln_expr_node n = {KILN_EXPR_NODE_SYMBOL, -1, -1, symbol};
    return intern(p, n);
}

int kiln_expr_is_const(const kiln_expr_pool *p, kiln_expr e, int64_t *value)
{
    if (e < 0 || e >= p->n || p->nodes[e].kind != KILN_EXPR_NODE_CONST)
        return 0;
    if (value)
        *value = p->nodes[e].value;
    return 1;
}

/* ---- arithmetic ---------------------------------------------------------------- */

/* One binary op on values; nonzero on division by zero or int64 overflow. */
static int apply(int32_t op, int64_t a, int64_t b, int64_t *out)
{
    switch (op) {
    case KILN_EXPR_ADD: return __builtin_add_overflow(a, b, out);
    case KILN_EXPR_SUB: return __builtin_sub_overflow(a, b, out);
    case KILN_EXPR_MUL: return __builtin_mul_overflow(a, b, out);
    case KILN_EXPR_FLOOR_DIV:
    case KILN_EXPR_CEIL_DIV: {
        if (b == 0 || (a == INT64_MIN && b == -1))
            return 1;
        int64_t q = a / b, r = a % b;
        /* C truncates toward zero; adjust when the exact quotient is not an
         * integer and lies on the other side. */
        if (r != 0 && op == KILN_EXPR_FLOOR_DIV && ((r < 0) != (b < 0)))
            q--;
        if (r != 0 && op == KILN_EXPR_CEIL_DIV && ((r < 0) == (b < 0)))
            q++;
        *out = q;
        return 0;
    }
    case KILN_EXPR_MAX: *out = a > b ? a : b; return 0;
    case KILN_EXPR_MIN: *out = a < b ? a : b; return 0;
    default: return 1;
    }
}

kiln_expr kiln_expr_operation(kiln_expr_pool *p, kiln_expr_op op, kiln_expr a, kiln_expr b)
{
    if (p->failed || (unsigned)op >= KILN_EXPR_OP_COUNT || a < 0 || b < 0 || a >= p->n || b >= p->n)
        return -1;
    int64_t va = 0, vb = 0;
    int ca = kiln_expr_is_const(p, a, &va), cb = kiln_expr_is_const(p, b, &vb);
    if (ca && cb) {
        int64_t v;
        /* Invalid constant arithmetic stays a node so evaluation reports it. */
        if (apply(op, va, vb, &v) == 0)
            return kiln_expr_const(p, v);
    }
    switch (op) {
    case KILN_EXPR_ADD:
        if (ca && va == 0)
            return b;
        if (cb && vb == 0)
            return a;
        break;
    case KILN_EXPR_SUB:
        if (cb && vb == 0)
            return a;
        if (a == b)
            return kiln_expr_const(p, 0);
        break;
    case KILN_EXPR_MUL:
        if ((ca && va == 0) || (cb && vb == 0))
            return kiln_expr_const(p, 0);
        if (ca && va == 1)
            return b;
        if (cb && vb == 1)
            return a;
        break;
    case KILN_EXPR_FLOOR_DIV:
    case KILN_EXPR_CEIL_DIV:
        if (cb && vb == 1)
            return a;
        break;
    case KILN_EXPR_MAX:
    case KILN_EXPR_MIN:
        if (a == b)
            return a;
        break;
    default: break;
    }
    /* Commutative ops in a canonical operand order, so a+b and b+a share a
     * node. Operands still precede the node either way. */
    if ((op == KILN_EXPR_ADD || op == KILN_EXPR_MUL || op == KILN_EXPR_MAX || op == KILN_EXPR_MIN) && a > b) {
        kiln_expr t = a;
        a = b;
        b = t;
    }
    kiln_expr_node n = {(int32_t)op, a, b, 0};
    return intern(p, n);
}

kiln_status kiln_expr_pool_eval(const kiln_expr_pool *p, const int64_t *symbols, int32_t n_symbols, int64_t *values)
{
    char buf[160];
    for (int32_t i = 0; i < p->n; i++) {
        const kiln_expr_node *n = &p->nodes[i];
        if (n->kind == KILN_EXPR_NODE_CONST) {
            values[i] = n->value;
        } else if (n->kind == KILN_EXPR_NODE_SYMBOL) {
            if (n->value < 0 || n->value >= n_symbols)
                return kiln_fail(KILN_ERROR_SHAPE,
                                 "shape expression %d names symbol s%" PRId64 " but only %d symbols exist", i, n->value,
                                 n_symbols);
            values[i] = symbols[n->value];
        } else if (n->kind >= 0 && n->kind < KILN_EXPR_OP_COUNT && n->a >= 0 && n->a < i && n->b >= 0 && n->b < i) {
            if (apply(n->kind, values[n->a], values[n->b], &values[i]) != 0) {
                int div = n->kind == KILN_EXPR_FLOOR_DIV || n->kind == KILN_EXPR_CEIL_DIV;
                return kiln_fail(KILN_ERROR_SHAPE, "shape expression %s: %s (%" PRId64 " and %" PRId64 ")",
                                 kiln_expr_format(p, i, buf, sizeof buf),
                                 div && values[n->b] == 0 ? "division by zero" : "int64 overflow", values[n->a],
                                 values[n->b]);
            }
        } else {
            return kiln_fail(KILN_ERROR_SHAPE, "shape expression %d is malformed", i);
        }
    }
    return KILN_OK;
}

/* ---- formatting ---------------------------------------------------------------- */

typedef struct fmt_out {
    char *buf;
    size_t size, pos;
} fmt_out;

/* Returns nonzero once the buffer is full, which also stops the walk: a DAG
 * with shared operands would otherwise expand exponentially. */
static int put(fmt_out *o, const char *s)
{
    while (*s && o->pos + 1 < o->size)
        o->buf[o->pos++] = *s++;
    o->buf[o->pos] = '\0';
    return *s != '\0';
}

static int format_node(const kiln_expr_pool *p, kiln_expr e, fmt_out *o, int depth)
{
    char tmp[32];
    if (e < 0 || e >= p->n)
        return put(o, "?");
    const kiln_expr_node *n = &p->nodes[e];
    if (n->kind == KILN_EXPR_NODE_CONST) {
        snprintf(tmp, sizeof tmp, "%" PRId64, n->value);
        return put(o, tmp);
    }
    if (n->kind == KILN_EXPR_NODE_SYMBOL) {
        snprintf(tmp, sizeof tmp, "s%" PRId64, n->value);
        return put(o, tmp);
    }
    if (depth > 64 || n->kind < 0 || n->kind >= KILN_EXPR_OP_COUNT)
        return put(o, "...");
    static const char *const pre[KILN_EXPR_OP_COUNT] = {"(", "(", "(", "floor(", "ceil(", "max(", "min("};
    static const char *const mid[KILN_EXPR_OP_COUNT] = {"+", "-", "*", "/", "/", ", ", ", "};
    return put(o, pre[n->kind]) || format_node(p, n->a, o, depth + 1) || put(o, mid[n->kind]) ||
           format_node(p, n->b, o, depth + 1) || put(o, ")");
}

char *kiln_expr_format(const kiln_expr_pool *p, kiln_expr e, char *buf, size_t size)
{
    if (!buf || size == 0)
        return buf;
    /* Written from the start of buf: callers pass fresh stack buffers. */
    fmt_out o = {buf, size, 0};
    buf[0] = '\0';
    format_node(p, e, &o, 0);
    return buf;
}
