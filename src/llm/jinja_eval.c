/* Rendering a parsed Jinja template (jinja.h): scopes, statements,
 * expressions with Python's semantics, and the global functions, methods,
 * filters and tests chat templates call. Every render is bounded. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "llm/jinja_internal.h"

#define J_MAX_OUTPUT ((size_t)16 << 20) /* rendered text */
#define J_MAX_MEMORY ((size_t)64 << 20) /* values made while rendering (the conversation included) */
#define J_MAX_STEPS 1000000u            /* nodes evaluated and loop iterations */
#define J_MAX_DEPTH 1000                /* expression nesting while evaluating */
#define J_MAX_RANGE 100000              /* range()'s length, as Jinja's sandbox */

typedef struct frame {
    jdict vars;
    struct frame *up;
} frame;

typedef struct R {
    jarena *a;
    jbuf *out;
    frame *top;
    uint64_t steps;
    uint64_t work; /* bytes scanned, J_MAX_WORK at most */
    int depth;
    int line;
    char err[384];
} R;

enum { OK = 1, ERR = 0, BRK = 2, CONT = 3 };

static int rfail(R *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rfail(R *r, const char *fmt, ...)
{
    if (r->err[0])
        return ERR;
    int k = snprintf(r->err, sizeof r->err, "chat template line %d: ", r->line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + k, sizeof r->err - (size_t)k, fmt, ap);
    va_end(ap);
    return ERR;
}

static int oom(R *r) { return rfail(r, "out of memory (more than %zu MiB of values)", J_MAX_MEMORY >> 20); }

/* Counts `steps` more steps and checks both budgets: steps bound the nodes
 * evaluated, work the bytes scanned inside them. */
static int tick(R *r, uint64_t steps)
{
    if ((r->steps += steps) > J_MAX_STEPS)
        return rfail(r, "more than %u steps", J_MAX_STEPS);
    if (r->work > J_MAX_WORK)
        return rfail(r, "more than %llu MiB of strings and values scanned", (unsigned long long)(J_MAX_WORK >> 20));
    return OK;
}

/* The bytes an operation may scan in an operand: a string's length,
 * J_WORK_PER_ITEM per element of a list or key of a dict. Deeper work (comparing nested values)
 * is counted where it happens (jv_equal, order). */
static uint64_t shallow(jv v)
{
    switch (v.t) {
    case JV_STR: return v.u.s.n;
    case JV_LIST: return J_WORK_PER_ITEM * (uint64_t)v.u.l->n;
    case JV_DICT:
    case JV_NS: return J_WORK_PER_ITEM * (uint64_t)v.u.d->n;
    default: return 0;
    }
}

/* Counts two operands as scanned by the operation about to run on them. */
static int scan(R *r, jv a, jv b)
{
    r->work += shallow(a) + shallow(b);
    return tick(r, 0);
}

static const char *type_name(jv v)
{
    static const char *const n[] = {"undefined", "none", "bool",      "int",  "float",   "string",
                                    "list",      "dict", "namespace", "loop", "function"};
    return n[v.t];
}

static jv undef(void) { return (jv){.t = JV_UNDEF}; }

static jlist *new_list(R *r, size_t n)
{
    jlist *l = jarena_alloc(r->a, sizeof *l);
    if (l && n && !(l->v = jarena_alloc(r->a, n * sizeof *l->v)))
        return NULL;
    if (l)
        l->n = n;
    return l;
}

static jv list_val(jlist *l) { return (jv){.t = JV_LIST, .u.l = l}; }

static char *sdup(R *r, const char *s, size_t n)
{
    char *p = jarena_alloc(r->a, n + 1);
    if (p && n)
        memcpy(p, s, n);
    return p;
}

/* ---- UTF-8 and whitespace ---------------------------------------------------- */

static size_t u8_len(const char *s, size_t n)
{
    /* Code points are the bytes that are not continuations (10xxxxxx),
     * counted eight at a time: long messages are measured often. */
    size_t c = n, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, s + i, 8);
        c -= (size_t)__builtin_popcountll(x & ~(x << 1) & 0x8080808080808080ull);
    }
    for (; i < n; i++)
        c -= ((unsigned char)s[i] & 0xC0) == 0x80;
    return c;
}

/* Byte offset of code point `cp` (clamped to n). */
static size_t u8_off(const char *s, size_t n, size_t cp)
{
    size_t i = 0;
    while (i < n && cp) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
        cp--;
    }
    return i;
}

/* Length of the Unicode whitespace character at s (what Python's str.strip()
 * removes), or 0. */
static size_t ws_at(const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F))
        return 1;
    if (n >= 2 && c == 0xC2 && ((unsigned char)s[1] == 0x85 || (unsigned char)s[1] == 0xA0))
        return 2;
    if (n >= 3 && c == 0xE1 && (unsigned char)s[1] == 0x9A && (unsigned char)s[2] == 0x80)
        return 3;
    if (n >= 3 && c == 0xE2 && (unsigned char)s[1] == 0x80 &&
        ((unsigned char)s[2] <= 0x8A || (unsigned char)s[2] == 0xA8 || (unsigned char)s[2] == 0xA9 ||
         (unsigned char)s[2] == 0xAF))
        return 3;
    if (n >= 3 && c == 0xE2 && (unsigned char)s[1] == 0x81 && (unsigned char)s[2] == 0x9F)
        return 3;
    if (n >= 3 && c == 0xE3 && (unsigned char)s[1] == 0x80 && (unsigned char)s[2] == 0x80)
        return 3;
    return 0;
}

static size_t ws_before(const char *s, size_t n)
{
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (ws_at(s + n - k, k) == k)
            return k;
    return 0;
}

/* str.strip/lstrip/rstrip: whitespace, or any byte of `chars` (ASCII
 * sets), looked up in a table: a search of `chars` per byte made a long
 * set over a long string cost their product (a fuzzer's template took
 * seconds within the work budget, which counts the string once). */
static jv strip(jv s, int left, int right, const jv *chars)
{
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, k;
    if (chars && chars->t == JV_STR) {
        unsigned char in[256] = {0};
        for (size_t i = 0; i < chars->u.s.n; i++)
            in[(unsigned char)chars->u.s.p[i]] = 1;
        while (left && n && in[(unsigned char)*p])
            p++, n--;
        while (right && n && in[(unsigned char)p[n - 1]])
            n--;
    } else {
        while (left && n && (k = ws_at(p, n)))
            p += k, n -= k;
        while (right && n && (k = ws_before(p, n)))
            n -= k;
    }
    return jv_str(p, n);
}

/* Simple case mappings of ASCII, Latin-1, Latin Extended-A, Greek and
 * Cyrillic (what Python's str.lower/upper do there); other code points are
 * kept. Each maps within its own UTF-8 length. */
static uint32_t to_lower(uint32_t c)
{
    if ((c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3AB && c != 0x3A2) ||
        (c >= 0x410 && c <= 0x42F))
        return c + 0x20;
    if (c >= 0x400 && c <= 0x40F)
        return c + 0x50;
    if (((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) && !(c & 1))
        return c + 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) && (c & 1))
        return c + 1;
    return c;
}

static uint32_t to_upper(uint32_t c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3CB && c != 0x3C2) ||
        (c >= 0x430 && c <= 0x44F))
        return c - 0x20;
    if (c >= 0x450 && c <= 0x45F)
        return c - 0x50;
    if (((c >= 0x101 && c <= 0x12F) || (c >= 0x133 && c <= 0x137) || (c >= 0x14B && c <= 0x177)) && (c & 1))
        return c - 1;
    if (((c >= 0x13A && c <= 0x148) || (c >= 0x17A && c <= 0x17E)) && !(c & 1))
        return c - 1;
    return c;
}

/* The code point at s (n bytes left) and its length; a stray byte is itself. */
static uint32_t u8_get(const unsigned char *s, size_t n, size_t *len)
{
    if (s[0] >= 0xC2 && s[0] < 0xE0 && n >= 2 && (s[1] & 0xC0) == 0x80) {
        *len = 2;
        return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    }
    *len = 1;
    while (s[0] >= 0xE0 && *len < n && *len < 4 && (s[*len] & 0xC0) == 0x80)
        (*len)++;
    return s[0] < 0x80 ? s[0] : 0xFFFFFFFFu; /* 3- and 4-byte code points are kept as they are */
}

/* mode: 0 lower, 1 upper, 2 capitalize, 3 str.title(), 4 the title filter
 * (words start after whitespace, '-', '(', '{', '[' or '<'). */
static int case_map(R *r, jv s, int mode, jv *out)
{
    char *o = sdup(r, s.u.s.p, s.u.s.n);
    if (!o)
        return oom(r);
    int start = 1;
    for (size_t i = 0, len; i < s.u.s.n; i += len) {
        if ((mode == 0 || mode == 1) && (unsigned char)o[i] < 0x80) { /* the common case, kept cheap */
            char c = o[i];
            o[i] = mode ? (c >= 'a' && c <= 'z' ? (char)(c - 0x20) : c) : (c >= 'A' && c <= 'Z' ? (char)(c + 0x20) : c);
            len = 1;
            continue;
        }
        uint32_t c = u8_get((const unsigned char *)o + i, s.u.s.n - i, &len);
        if (c == 0xFFFFFFFFu) {
            if (mode == 3)
                start = 1;
            else if (mode == 2 || mode == 4)
                start = 0;
            continue;
        }
        int cased = to_lower(c) != c || to_upper(c) != c;
        int up = mode == 1 || (mode >= 2 && start);
        uint32_t m = up ? to_upper(c) : to_lower(c);
        if (len == 1)
            o[i] = (char)m;
        else {
            o[i] = (char)(0xC0 | (m >> 6));
            o[i + 1] = (char)(0x80 | (m & 0x3F));
        }
        if (mode == 2)
            start = 0;
        else if (mode == 3)
            start = !cased;
        else if (mode == 4)
            start = c == ' ' || (c >= 0x09 && c <= 0x0D) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    }
    *out = jv_str(o, s.u.s.n);
    return OK;
}

/* ---- scopes ------------------------------------------------------------- */

static const char *const globals[] = {"raise_exception", "namespace", "range", "strftime_now", "dict", NULL};

static jv lookup(R *r, const char *s, size_t n)
{
    for (frame *f = r->top; f; f = f->up) {
        jv *v = jdict_get(&f->vars, s, n);
        if (v)
            return *v;
    }
    for (size_t i = 0; globals[i]; i++)
        if (strlen(globals[i]) == n && !memcmp(globals[i], s, n))
            return (jv){.t = JV_FUNC, .u.s = {globals[i], n}};
    return undef();
}

static int assign(R *r, const char *name, jv v)
{
    return jdict_set(r->a, &r->top->vars, jv_str(name, strlen(name)), v) ? OK : oom(r);
}

/* ---- iteration ------------------------------------------------------------ */

/* The items a for loop or filter walks: a list's items, a dict's keys, a
 * string's characters. */
static int iterate(R *r, jv v, jlist **out)
{
    if (v.t == JV_LIST) {
        *out = v.u.l;
        return OK;
    }
    if (v.t == JV_UNDEF) {
        *out = new_list(r, 0);
        return *out ? OK : oom(r);
    }
    if (v.t == JV_DICT) {
        jlist *l = new_list(r, v.u.d->n);
        if (!l)
            return oom(r);
        memcpy(l->v, v.u.d->k, v.u.d->n * sizeof *l->v);
        *out = l;
        return OK;
    }
    if (v.t == JV_STR) {
        jlist *l = new_list(r, u8_len(v.u.s.p, v.u.s.n));
        if (!l)
            return oom(r);
        for (size_t i = 0, k = 0; i < l->n; i++) {
            size_t e = k + u8_off(v.u.s.p + k, v.u.s.n - k, 1);
            l->v[i] = jv_str(v.u.s.p + k, e - k);
            k = e;
        }
        *out = l;
        return OK;
    }
    return rfail(r, "'%s' value is not iterable", type_name(v));
}

static int items_of(R *r, jv d, jv *out)
{
    if (d.t != JV_DICT && d.t != JV_NS)
        return rfail(r, "items() of a %s value", type_name(d));
    jlist *l = new_list(r, d.u.d->n);
    if (!l)
        return oom(r);
    for (size_t i = 0; i < d.u.d->n; i++) {
        jlist *pair = new_list(r, 2);
        if (!pair)
            return oom(r);
        pair->tuple = 1;
        pair->v[0] = d.u.d->k[i];
        pair->v[1] = d.u.d->v[i];
        l->v[i] = list_val(pair);
    }
    *out = list_val(l);
    return OK;
}

/* ---- operators -------------------------------------------------------------- */

static int numeric(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double dbl(jv v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b; }
static int64_t i64(jv v) { return v.t == JV_INT ? v.u.i : v.u.b; }

static int concat_str(R *r, jv a, jv b, jv *out)
{
    jbuf s = {.a = r->a, .max = J_MAX_MEMORY};
    jv_write_str(&s, a);
    jv_write_str(&s, b);
    if (s.failed)
        return oom(r);
    *out = jv_str(s.p ? s.p : "", s.n);
    return OK;
}

/* Python's <, as ordering for numbers, strings and lists; -2 when the types do not order. */
static int order(jv a, jv b, int depth, uint64_t *work)
{
    if (numeric(a) && numeric(b)) {
        double x = dbl(a), y = dbl(b);
        if (a.t != JV_FLOAT && b.t != JV_FLOAT)
            return i64(a) < i64(b) ? -1 : i64(a) > i64(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        *work += n;
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        return c ? (c < 0 ? -1 : 1) : a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && depth < 64) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            *work += J_WORK_PER_ITEM;
            if (jv_equal(a.u.l->v[i], b.u.l->v[i], work))
                continue;
            return order(a.u.l->v[i], b.u.l->v[i], depth + 1, work);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    return -2;
}

/* memmem that counts its work in r->work: memchr for the needle's first
 * byte, then a compare per candidate. A needle that nearly matches
 * everywhere is stopped by the budget (answering "not found"; the caller's
 * next tick() turns that into the error). Sanitizer builds also stay
 * linear: their memmem checks the whole haystack on every call. */
static const char *find(R *r, const char *h, size_t hn, const char *nd, size_t nn)
{
    if (!nn)
        return h;
    const char *p = h, *end = h + hn;
    while ((size_t)(end - p) >= nn && r->work <= J_MAX_WORK) {
        const char *c = memchr(p, (unsigned char)nd[0], (size_t)(end - p) - nn + 1);
        if (!c) {
            r->work += (uint64_t)(end - p);
            return NULL;
        }
        r->work += (uint64_t)(c - p) + nn + 16; /* 16: a candidate's own cost */
        if (!memcmp(c, nd, nn))
            return c;
        p = c + 1;
    }
    return NULL;
}

static int contains(R *r, jv hay, jv needle, int *out)
{
    if (hay.t == JV_STR) {
        if (needle.t != JV_STR)
            return rfail(r, "'in <string>' requires a string, not %s", type_name(needle));
        *out = needle.u.s.n == 0 || find(r, hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
        return OK;
    }
    if (hay.t == JV_LIST) {
        *out = 0;
        for (size_t i = 0; i < hay.u.l->n && !*out; i++)
            *out = jv_equal(hay.u.l->v[i], needle, &r->work);
        return OK;
    }
    if (hay.t == JV_DICT || hay.t == JV_NS) {
        *out = needle.t == JV_STR && jdict_get(hay.u.d, needle.u.s.p, needle.u.s.n) != NULL;
        return OK;
    }
    return rfail(r, "'in' needs a string, list or dict on its right, not %s", type_name(hay));
}

static int repeat(R *r, jv s, int64_t k, jv *out)
{
    size_t items = s.t == JV_STR ? s.u.s.n : s.u.l->n;
    if (k <= 0 || items == 0) { /* also '' * 10**18: no loop over k */
        *out = s.t == JV_STR ? jv_str("", 0) : list_val(new_list(r, 0));
        return out->t == JV_STR || out->u.l ? OK : oom(r);
    }
    size_t unit = s.t == JV_STR ? items : items * sizeof(jv);
    if ((uint64_t)k > J_MAX_MEMORY / unit)
        return oom(r);
    if (s.t == JV_STR) {
        char *p = jarena_alloc(r->a, s.u.s.n * (size_t)k + 1);
        if (!p)
            return oom(r);
        for (int64_t i = 0; i < k; i++)
            memcpy(p + (size_t)i * s.u.s.n, s.u.s.p, s.u.s.n);
        *out = jv_str(p, s.u.s.n * (size_t)k);
        return OK;
    }
    jlist *l = new_list(r, s.u.l->n * (size_t)k);
    if (!l)
        return oom(r);
    for (int64_t i = 0; i < k; i++)
        memcpy(l->v + (size_t)i * s.u.l->n, s.u.l->v, s.u.l->n * sizeof(jv));
    *out = list_val(l);
    return OK;
}

static int binop(R *r, int op, jv a, jv b, jv *out)
{
    if (scan(r, a, b) != OK)
        return ERR;
    if (op == J_OP_CONCAT)
        return concat_str(r, a, b, out);
    if (op == J_OP_EQ || op == J_OP_NE) {
        *out = jv_bool(jv_equal(a, b, &r->work) == (op == J_OP_EQ));
        return OK;
    }
    if (op == J_OP_IN || op == J_OP_NOTIN) {
        int c = 0;
        if (contains(r, b, a, &c) != OK)
            return ERR;
        *out = jv_bool(c == (op == J_OP_IN));
        return OK;
    }
    if (op >= J_OP_LT && op <= J_OP_GE) {
        int c = order(a, b, 0, &r->work);
        if (c == -2)
            return rfail(r, "cannot compare %s with %s", type_name(a), type_name(b));
        *out = jv_bool(op == J_OP_LT ? c < 0 : op == J_OP_LE ? c <= 0 : op == J_OP_GT ? c > 0 : c >= 0);
        return OK;
    }
    if (op == J_OP_ADD && a.t == JV_STR && b.t == JV_STR)
        return concat_str(r, a, b, out);
    if (op == J_OP_ADD && a.t == JV_LIST && b.t == JV_LIST) {
        jlist *l = new_list(r, a.u.l->n + b.u.l->n);
        if (!l)
            return oom(r);
        if (a.u.l->n)
            memcpy(l->v, a.u.l->v, a.u.l->n * sizeof(jv));
        if (b.u.l->n)
            memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(jv));
        *out = list_val(l);
        return OK;
    }
    if (op == J_OP_MUL && (a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL))
        return repeat(r, a, i64(b), out);
    if (op == J_OP_MUL && (b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL))
        return repeat(r, b, i64(a), out);
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (!numeric(a) || !numeric(b))
        return rfail(r, "unsupported operand types for %s: %s and %s", names[op], type_name(a), type_name(b));
    int ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
    int64_t x = i64(a), y = i64(b), z;
    double f = dbl(a), g = dbl(b);
    if ((op == J_OP_DIV || op == J_OP_FLOORDIV || op == J_OP_MOD) && g == 0.0)
        return rfail(r, "division by zero");
    switch (op) {
    case J_OP_ADD:
        if (ints && !__builtin_add_overflow(x, y, &z))
            return *out = jv_int(z), OK;
        return *out = (jv){.t = JV_FLOAT, .u.f = f + g}, OK;
    case J_OP_SUB:
        if (ints && !__builtin_sub_overflow(x, y, &z))
            return *out = jv_int(z), OK;
        return *out = (jv){.t = JV_FLOAT, .u.f = f - g}, OK;
    case J_OP_MUL:
        if (ints && !__builtin_mul_overflow(x, y, &z))
            return *out = jv_int(z), OK;
        return *out = (jv){.t = JV_FLOAT, .u.f = f * g}, OK;
    case J_OP_DIV: return *out = (jv){.t = JV_FLOAT, .u.f = f / g}, OK;
    case J_OP_FLOORDIV:
        if (ints && !(x == INT64_MIN && y == -1)) {
            z = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0)))
                z--;
            return *out = jv_int(z), OK;
        }
        return *out = (jv){.t = JV_FLOAT, .u.f = floor(f / g)}, OK;
    case J_OP_MOD:
        if (ints) {
            z = y == -1 ? 0 : x % y;
            if (z != 0 && ((z < 0) != (y < 0)))
                z += y;
            return *out = jv_int(z), OK;
        }
        f = fmod(f, g);
        if (f != 0 && ((f < 0) != (g < 0)))
            f += g;
        return *out = (jv){.t = JV_FLOAT, .u.f = f}, OK;
    default: /* J_OP_POW */
        if (ints && y >= 0) {
            int64_t acc = 1;
            int over = 0;
            for (int64_t i = 0; i < y && !over && acc != 0 && !(acc == 1 && (x == 1)); i++)
                over = __builtin_mul_overflow(acc, x, &acc);
            if (x == 1 || (x == -1))
                acc = x == 1 || y % 2 == 0 ? 1 : -1;
            if (!over)
                return *out = jv_int(acc), OK;
        }
        return *out = (jv){.t = JV_FLOAT, .u.f = pow(f, g)}, OK;
    }
}

/* ---- attribute and item access ------------------------------------------------ */

static jv get_attr(jv obj, const char *s, size_t n)
{
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        jv *v = jdict_get(obj.u.d, s, n);
        return v ? *v : undef();
    }
    if (obj.t == JV_LOOP) {
        const jloop *l = obj.u.loop;
#define IS(x) (n == sizeof x - 1 && !memcmp(s, x, n))
        if (IS("index"))
            return jv_int(l->index0 + 1);
        if (IS("index0"))
            return jv_int(l->index0);
        if (IS("revindex"))
            return jv_int(l->length - l->index0);
        if (IS("revindex0"))
            return jv_int(l->length - l->index0 - 1);
        if (IS("first"))
            return jv_bool(l->index0 == 0);
        if (IS("last"))
            return jv_bool(l->index0 == l->length - 1);
        if (IS("length"))
            return jv_int(l->length);
        if (IS("previtem"))
            return l->prev;
        if (IS("nextitem"))
            return l->next;
#undef IS
    }
    return undef();
}

static int get_item(R *r, jv obj, jv key, jv *out)
{
    if (scan(r, obj.t == JV_LIST ? undef() : obj, key) != OK) /* a list is indexed, not scanned */
        return ERR;
    if (obj.t == JV_UNDEF)
        return rfail(r, "subscript of an undefined value");
    if ((obj.t == JV_DICT || obj.t == JV_NS) && key.t == JV_STR) {
        *out = get_attr(obj, key.u.s.p, key.u.s.n);
        return OK;
    }
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t n = obj.t == JV_LIST ? (int64_t)obj.u.l->n : (int64_t)u8_len(obj.u.s.p, obj.u.s.n);
        int64_t i = i64(key);
        if (i < 0)
            i += n;
        if (i < 0 || i >= n) {
            *out = undef();
            return OK;
        }
        if (obj.t == JV_LIST) {
            *out = obj.u.l->v[i];
        } else {
            size_t a = u8_off(obj.u.s.p, obj.u.s.n, (size_t)i);
            *out = jv_str(obj.u.s.p + a, u8_off(obj.u.s.p + a, obj.u.s.n - a, 1));
        }
        return OK;
    }
    if (key.t == JV_STR) {
        *out = get_attr(obj, key.u.s.p, key.u.s.n);
        return OK;
    }
    *out = undef();
    return OK;
}

static int slice(R *r, jv obj, const jv *part, jv *out)
{
    if (scan(r, obj, undef()) != OK)
        return ERR;
    if (obj.t != JV_LIST && obj.t != JV_STR)
        return rfail(r, "cannot slice a %s value", type_name(obj));
    int64_t v[3];
    int has[3];
    for (int i = 0; i < 3; i++) {
        has[i] = part[i].t != JV_UNDEF && part[i].t != JV_NONE;
        if (has[i] && part[i].t != JV_INT && part[i].t != JV_BOOL)
            return rfail(r, "slice indices must be integers");
        v[i] = has[i] ? i64(part[i]) : 0;
    }
    int64_t step = has[2] ? v[2] : 1;
    if (step == 0)
        return rfail(r, "slice step cannot be zero");
    int64_t n = obj.t == JV_LIST ? (int64_t)obj.u.l->n : (int64_t)u8_len(obj.u.s.p, obj.u.s.n);
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
    int64_t start = has[0] ? v[0] : (step < 0 ? hi : lo), stop = has[1] ? v[1] : (step < 0 ? lo : hi);
    if (has[0]) {
        if (start < 0)
            start = start + n < lo ? lo : start + n;
        else if (start > hi)
            start = hi;
    }
    if (has[1]) {
        if (stop < 0)
            stop = stop + n < lo ? lo : stop + n;
        else if (stop > hi)
            stop = hi;
    }
    int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                             : (start > stop ? (start - stop - step - 1) / -step : 0);
    if (obj.t == JV_LIST) {
        jlist *l = new_list(r, (size_t)count);
        if (!l)
            return oom(r);
        for (int64_t i = 0; i < count; i++)
            l->v[i] = obj.u.l->v[start + i * step];
        *out = list_val(l);
        return OK;
    }
    if (step == 1) {
        size_t a = u8_off(obj.u.s.p, obj.u.s.n, (size_t)start);
        size_t b = count ? u8_off(obj.u.s.p, obj.u.s.n, (size_t)(start + count)) : a;
        *out = jv_str(obj.u.s.p + a, b - a);
        return OK;
    }
    jlist *chars;
    if (iterate(r, obj, &chars) != OK)
        return ERR;
    jbuf s = {.a = r->a, .max = J_MAX_MEMORY};
    for (int64_t i = 0; i < count; i++)
        jbuf_put(&s, chars->v[start + i * step].u.s.p, chars->v[start + i * step].u.s.n);
    if (s.failed)
        return oom(r);
    *out = jv_str(s.p ? s.p : "", s.n);
    return OK;
}

/* ---- calls -------------------------------------------------------------------- */

typedef struct args {
    jv pos[8];
    const char *kw[8]; /* keyword of pos[i] or NULL */
    size_t n;
} args;

/* Counts a call's receiver and arguments as scanned. */
static int scan_args(R *r, jv v, const args *a)
{
    for (size_t i = 0; i < a->n; i++)
        r->work += shallow(a->pos[i]);
    return scan(r, v, undef());
}

static int ev(R *r, const jnode *n, jv *out);

static int eval_args(R *r, const jnode *n, size_t first, args *a)
{
    a->n = 0;
    for (size_t i = first; i < n->n_kids; i++) {
        if (a->n == 8)
            return rfail(r, "more than 8 arguments");
        if (ev(r, n->kids[i], &a->pos[a->n]) != OK)
            return ERR;
        a->kw[a->n++] = n->names ? n->names[i] : NULL;
    }
    return OK;
}

/* Positional argument i, or the keyword `name`; NULL when absent. */
static const jv *arg(const args *a, size_t i, const char *name)
{
    size_t p = 0;
    for (size_t k = 0; k < a->n; k++) {
        if (a->kw[k] ? (name && !strcmp(a->kw[k], name)) : p++ == i)
            return &a->pos[k];
    }
    return NULL;
}

static int want_str(R *r, const jv *v, const char *what)
{
    if (!v || v->t != JV_STR)
        return rfail(r, "%s expects a string argument", what);
    return OK;
}

static int str_replace(R *r, jv s, jv from, jv to, int64_t count, jv *out)
{
    jbuf b = {.a = r->a, .max = J_MAX_MEMORY};
    size_t i = 0;
    if (!from.u.s.n) { /* Python inserts `to` between every character */
        jlist *chars;
        if (iterate(r, s, &chars) != OK)
            return ERR;
        for (size_t k = 0; k <= chars->n; k++) {
            if (count < 0 || (int64_t)k < count)
                jbuf_put(&b, to.u.s.p, to.u.s.n);
            if (k < chars->n)
                jbuf_put(&b, chars->v[k].u.s.p, chars->v[k].u.s.n);
        }
    } else {
        while (i < s.u.s.n && count != 0) {
            const char *hit = find(r, s.u.s.p + i, s.u.s.n - i, from.u.s.p, from.u.s.n);
            if (!hit)
                break;
            jbuf_put(&b, s.u.s.p + i, (size_t)(hit - (s.u.s.p + i)));
            jbuf_put(&b, to.u.s.p, to.u.s.n);
            i = (size_t)(hit - s.u.s.p) + from.u.s.n;
            if (count > 0)
                count--;
        }
        jbuf_put(&b, s.u.s.p + i, s.u.s.n - i);
    }
    if (b.failed)
        return oom(r);
    *out = jv_str(b.p ? b.p : "", b.n);
    return OK;
}

static int str_split(R *r, jv s, const jv *sep, int64_t maxsplit, jv *out)
{
    jlist *l = new_list(r, 0);
    size_t cap = 0;
    if (!l)
        return oom(r);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    for (;;) {
        size_t a, b, next;
        if (sep && sep->t == JV_STR) {
            if (!sep->u.s.n)
                return rfail(r, "split(): empty separator");
            const char *hit = maxsplit != 0 ? find(r, p + i, n - i, sep->u.s.p, sep->u.s.n) : NULL;
            a = i;
            b = hit ? (size_t)(hit - p) : n;
            next = hit ? b + sep->u.s.n : n + 1;
        } else {
            size_t k;
            while (i < n && (k = ws_at(p + i, n - i)))
                i += k;
            if (i >= n)
                break;
            a = i;
            if (maxsplit == 0) {
                b = n;
                while (b > a && (k = ws_before(p + a, b - a)))
                    b -= k;
            } else {
                b = a;
                while (b < n && !ws_at(p + b, n - b))
                    b++;
            }
            next = b;
        }
        if (l->n == cap) {
            cap = cap ? cap * 2 : 8;
            jv *v = jarena_alloc(r->a, cap * sizeof *v);
            if (!v)
                return oom(r);
            if (l->n)
                memcpy(v, l->v, l->n * sizeof *v);
            l->v = v;
        }
        l->v[l->n++] = jv_str(p + a, b - a);
        if (maxsplit > 0)
            maxsplit--;
        if (next > n)
            break;
        i = next;
    }
    *out = list_val(l);
    return OK;
}

static int affix(R *r, jv s, const jv *x, int end, const char *what, jv *out)
{
    if (x && x->t == JV_LIST) {
        for (size_t i = 0; i < x->u.l->n; i++) {
            if (affix(r, s, &x->u.l->v[i], end, what, out) != OK)
                return ERR;
            if (out->u.b)
                return OK;
        }
        *out = jv_bool(0);
        return OK;
    }
    if (want_str(r, x, what) != OK)
        return ERR;
    size_t k = x->u.s.n;
    *out = jv_bool(k <= s.u.s.n && !memcmp(s.u.s.p + (end ? s.u.s.n - k : 0), x->u.s.p, k));
    return OK;
}

static int join(R *r, jv seq, jv sep, const jv *attr, jv *out)
{
    jlist *l;
    if (iterate(r, seq, &l) != OK)
        return ERR;
    jbuf b = {.a = r->a, .max = J_MAX_MEMORY};
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            jv_write_str(&b, sep);
        jv x = l->v[i];
        if (attr && attr->t == JV_STR)
            x = get_attr(x, attr->u.s.p, attr->u.s.n);
        jv_write_str(&b, x);
    }
    if (b.failed)
        return oom(r);
    *out = jv_str(b.p ? b.p : "", b.n);
    return OK;
}

#define NAME_IS(s, n, lit) ((n) == sizeof lit - 1 && !memcmp((s), lit, n))

static int call_method(R *r, jv obj, const char *m, size_t mn, const args *a, jv *out, int *found)
{
    if (scan_args(r, obj, a) != OK)
        return ERR;
    const jv *a0 = arg(a, 0, NULL), *a1 = arg(a, 1, NULL);
    *found = 1;
    if (obj.t == JV_STR) {
        if (NAME_IS(m, mn, "strip") || NAME_IS(m, mn, "lstrip") || NAME_IS(m, mn, "rstrip")) {
            *out = strip(obj, m[0] != 'r', m[0] != 'l', a0);
            return OK;
        }
        if (NAME_IS(m, mn, "upper"))
            return case_map(r, obj, 1, out);
        if (NAME_IS(m, mn, "lower"))
            return case_map(r, obj, 0, out);
        if (NAME_IS(m, mn, "capitalize"))
            return case_map(r, obj, 2, out);
        if (NAME_IS(m, mn, "title"))
            return case_map(r, obj, 3, out);
        if (NAME_IS(m, mn, "startswith") || NAME_IS(m, mn, "endswith"))
            return affix(r, obj, a0, m[0] == 'e', m[0] == 'e' ? "endswith()" : "startswith()", out);
        if (NAME_IS(m, mn, "replace")) {
            if (want_str(r, a0, "replace()") != OK || want_str(r, a1, "replace()") != OK)
                return ERR;
            const jv *c = arg(a, 2, "count");
            return str_replace(r, obj, *a0, *a1, c && c->t == JV_INT ? c->u.i : -1, out);
        }
        if (NAME_IS(m, mn, "split")) {
            const jv *sep = arg(a, 0, "sep"), *mx = arg(a, 1, "maxsplit");
            return str_split(r, obj, sep && sep->t == JV_STR ? sep : NULL, mx && mx->t == JV_INT ? mx->u.i : -1, out);
        }
        if (NAME_IS(m, mn, "join"))
            return a0 ? join(r, *a0, obj, NULL, out) : rfail(r, "join() expects an argument");
        if (NAME_IS(m, mn, "find") || NAME_IS(m, mn, "count")) {
            if (want_str(r, a0, "find()/count()") != OK)
                return ERR;
            int64_t c = 0, at = -1;
            for (size_t i = 0; i + a0->u.s.n <= obj.u.s.n;) {
                const char *hit = find(r, obj.u.s.p + i, obj.u.s.n - i, a0->u.s.p, a0->u.s.n);
                if (!hit)
                    break;
                if (at < 0)
                    at = (int64_t)u8_len(obj.u.s.p, (size_t)(hit - obj.u.s.p));
                c++;
                i = (size_t)(hit - obj.u.s.p) + (a0->u.s.n ? a0->u.s.n : 1);
            }
            *out = jv_int(m[0] == 'f' ? at : c);
            return OK;
        }
    }
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        if (NAME_IS(m, mn, "items"))
            return items_of(r, obj, out);
        if (NAME_IS(m, mn, "keys") || NAME_IS(m, mn, "values")) {
            jlist *l = new_list(r, obj.u.d->n);
            if (!l)
                return oom(r);
            if (obj.u.d->n)
                memcpy(l->v, m[0] == 'k' ? obj.u.d->k : obj.u.d->v, obj.u.d->n * sizeof(jv));
            *out = list_val(l);
            return OK;
        }
        if (NAME_IS(m, mn, "get")) {
            if (want_str(r, a0, "get()") != OK)
                return ERR;
            jv *v = jdict_get(obj.u.d, a0->u.s.p, a0->u.s.n);
            *out = v ? *v : a1 ? *a1 : (jv){.t = JV_NONE};
            return OK;
        }
    }
    *found = 0;
    return OK;
}

static int namespace_of(R *r, const args *a, jv *out, int ns)
{
    jdict *d = jarena_alloc(r->a, sizeof *d);
    if (!d)
        return oom(r);
    for (size_t i = 0; i < a->n; i++) {
        if (!a->kw[i]) {
            if (a->pos[i].t != JV_DICT && a->pos[i].t != JV_NS)
                return rfail(r, "%s() takes keyword arguments or a dict", ns ? "namespace" : "dict");
            for (size_t k = 0; k < a->pos[i].u.d->n; k++) {
                if (tick(r, d->n) != OK)
                    return ERR;
                if (!jdict_set(r->a, d, a->pos[i].u.d->k[k], a->pos[i].u.d->v[k]))
                    return oom(r);
            }
        } else if (!jdict_set(r->a, d, jv_str(a->kw[i], strlen(a->kw[i])), a->pos[i])) {
            return oom(r);
        }
    }
    *out = (jv){.t = ns ? JV_NS : JV_DICT, .u.d = d};
    return OK;
}

static int call_global(R *r, const char *fn, const args *a, jv *out)
{
    if (scan_args(r, undef(), a) != OK)
        return ERR;
    const jv *a0 = arg(a, 0, NULL);
    if (!strcmp(fn, "raise_exception")) {
        if (a0 && a0->t == JV_STR)
            return rfail(r, "raise_exception: %.*s", (int)(a0->u.s.n > 300 ? 300 : a0->u.s.n), a0->u.s.p);
        return rfail(r, "raise_exception");
    }
    if (!strcmp(fn, "namespace") || !strcmp(fn, "dict"))
        return namespace_of(r, a, out, fn[0] == 'n');
    if (!strcmp(fn, "strftime_now")) {
        if (want_str(r, a0, "strftime_now()") != OK)
            return ERR;
        char fmt[128], s[256];
        if (a0->u.s.n >= sizeof fmt)
            return rfail(r, "strftime_now(): format too long");
        memcpy(fmt, a0->u.s.p, a0->u.s.n);
        fmt[a0->u.s.n] = '\0';
        time_t now = time(NULL);
        struct tm tm;
        size_t n = localtime_r(&now, &tm) ? strftime(s, sizeof s, fmt, &tm) : 0;
        char *p = sdup(r, s, n);
        if (!p)
            return oom(r);
        *out = jv_str(p, n);
        return OK;
    }
    /* range */
    int64_t v[3] = {0, 0, 1};
    if (a->n < 1 || a->n > 3)
        return rfail(r, "range() takes 1 to 3 arguments");
    for (size_t i = 0; i < a->n; i++)
        if (a->pos[i].t != JV_INT && a->pos[i].t != JV_BOOL)
            return rfail(r, "range() arguments must be integers");
    if (a->n == 1)
        v[1] = i64(a->pos[0]);
    for (size_t i = 0; a->n > 1 && i < a->n; i++)
        v[i] = i64(a->pos[i]);
    if (v[2] == 0)
        return rfail(r, "range() step must not be zero");
    double cnt = v[2] > 0 ? ceil(((double)v[1] - (double)v[0]) / (double)v[2])
                          : ceil(((double)v[0] - (double)v[1]) / (double)-v[2]);
    if (cnt < 0)
        cnt = 0;
    if (cnt > J_MAX_RANGE)
        return rfail(r, "range() of more than %d items", J_MAX_RANGE);
    jlist *l = new_list(r, (size_t)cnt);
    if (!l)
        return oom(r);
    for (size_t i = 0; i < l->n; i++)
        l->v[i] = jv_int(v[0] + (int64_t)i * v[2]);
    *out = list_val(l);
    return OK;
}

static int ev_call(R *r, const jnode *n, jv *out)
{
    const jnode *callee = n->kids[0];
    args a;
    if (callee->kind == E_ATTR) {
        jv obj;
        if (ev(r, callee->kids[0], &obj) != OK)
            return ERR;
        if (obj.t == JV_UNDEF)
            return rfail(r, "'%.*s' called on an undefined value", (int)callee->n, callee->s);
        int found;
        if (eval_args(r, n, 1, &a) != OK || call_method(r, obj, callee->s, callee->n, &a, out, &found) != OK)
            return ERR;
        if (found)
            return OK;
        jv f = get_attr(obj, callee->s, callee->n);
        if (f.t != JV_FUNC)
            return rfail(r, "%s value has no method '%.*s'", type_name(obj), (int)callee->n, callee->s);
        return call_global(r, f.u.s.p, &a, out);
    }
    jv f;
    if (ev(r, callee, &f) != OK)
        return ERR;
    if (f.t != JV_FUNC) {
        if (callee->kind == E_NAME)
            return rfail(r, "'%.*s' is not a function (%s)", (int)callee->n, callee->s, type_name(f));
        return rfail(r, "a %s value is not callable", type_name(f));
    }
    if (eval_args(r, n, 1, &a) != OK)
        return ERR;
    return call_global(r, f.u.s.p, &a, out);
}

/* ---- tests ---------------------------------------------------------------------- */

static const char *const test_names[] = {
    "defined",     "undefined", "none",  "string",  "number",   "integer", "float", "mapping", "iterable", "sequence",
    "boolean",     "true",      "false", "equalto", "eq",       "==",      "ne",    "!=",      "odd",      "even",
    "divisibleby", "in",        "lower", "upper",   "callable", "gt",      "ge",    "lt",      "le",       NULL};

int kiln_jinja_has_test(const char *name, size_t n)
{
    for (size_t i = 0; test_names[i]; i++)
        if (strlen(test_names[i]) == n && !memcmp(test_names[i], name, n))
            return 1;
    return 0;
}

/* Tests charge nothing themselves: the type tests look at a tag, and the
 * rest go through binop, case_map's memory and jv_equal, which count. */
static int run_test(R *r, const char *t, size_t tn, jv v, const args *a, int *res)
{
    const jv *a0 = arg(a, 0, NULL);
    if (NAME_IS(t, tn, "defined") || NAME_IS(t, tn, "undefined"))
        *res = (v.t != JV_UNDEF) == (t[0] == 'd');
    else if (NAME_IS(t, tn, "none"))
        *res = v.t == JV_NONE;
    else if (NAME_IS(t, tn, "string"))
        *res = v.t == JV_STR;
    else if (NAME_IS(t, tn, "number"))
        *res = v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    else if (NAME_IS(t, tn, "integer"))
        *res = v.t == JV_INT;
    else if (NAME_IS(t, tn, "float"))
        *res = v.t == JV_FLOAT;
    else if (NAME_IS(t, tn, "mapping"))
        *res = v.t == JV_DICT;
    else if (NAME_IS(t, tn, "iterable"))
        *res = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF;
    else if (NAME_IS(t, tn, "sequence"))
        *res = v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT;
    else if (NAME_IS(t, tn, "boolean"))
        *res = v.t == JV_BOOL;
    else if (NAME_IS(t, tn, "true") || NAME_IS(t, tn, "false"))
        *res = v.t == JV_BOOL && v.u.b == (t[0] == 't');
    else if (NAME_IS(t, tn, "callable"))
        *res = v.t == JV_FUNC;
    else if (NAME_IS(t, tn, "lower") || NAME_IS(t, tn, "upper")) {
        jv m;
        if (v.t != JV_STR)
            return rfail(r, "test '%.*s' needs a string", (int)tn, t);
        if (case_map(r, v, t[0] == 'u', &m) != OK)
            return ERR;
        *res = jv_equal(m, v, &r->work);
    } else if (NAME_IS(t, tn, "odd") || NAME_IS(t, tn, "even") || NAME_IS(t, tn, "divisibleby")) {
        int64_t d = t[0] == 'd' ? (a0 && (a0->t == JV_INT || a0->t == JV_BOOL) ? i64(*a0) : 0) : 2;
        if (v.t != JV_INT && v.t != JV_BOOL)
            return rfail(r, "test '%.*s' needs an integer", (int)tn, t);
        if (d == 0)
            return rfail(r, "divisibleby needs a non-zero integer");
        int64_t m = d == -1 ? 0 : i64(v) % d;
        *res = t[0] == 'o' ? m != 0 : m == 0;
    } else {
        if (!a0)
            return rfail(r, "test '%.*s' needs an argument", (int)tn, t);
        int op = NAME_IS(t, tn, "in")                           ? J_OP_IN
                 : NAME_IS(t, tn, "ne") || NAME_IS(t, tn, "!=") ? J_OP_NE
                 : NAME_IS(t, tn, "gt")                         ? J_OP_GT
                 : NAME_IS(t, tn, "ge")                         ? J_OP_GE
                 : NAME_IS(t, tn, "lt")                         ? J_OP_LT
                 : NAME_IS(t, tn, "le")                         ? J_OP_LE
                                                                : J_OP_EQ;
        jv b;
        if (binop(r, op, v, *a0, &b) != OK)
            return ERR;
        *res = b.u.b;
    }
    return OK;
}

/* ---- filters -------------------------------------------------------------------- */

static const char *const filter_names[] = {
    "abs",    "capitalize", "count",   "d",       "default", "dictsort",  "first",      "float",  "int",
    "items",  "join",       "last",    "length",  "list",    "lower",     "map",        "max",    "min",
    "reject", "rejectattr", "replace", "reverse", "safe",    "select",    "selectattr", "string", "sum",
    "title",  "tojson",     "trim",    "unique",  "upper",   "wordcount", NULL};

int kiln_jinja_has_filter(const char *name, size_t n)
{
    for (size_t i = 0; filter_names[i]; i++)
        if (strlen(filter_names[i]) == n && !memcmp(filter_names[i], name, n))
            return 1;
    return 0;
}

static int apply_filter(R *r, const char *f, size_t fn, jv v, const args *a, jv *out);

/* select / reject / selectattr / rejectattr / map over a sequence. */
static int select_map(R *r, const char *f, size_t fn, jv v, const args *a, jv *out)
{
    jlist *in;
    if (iterate(r, v, &in) != OK)
        return ERR;
    jlist *l = new_list(r, in->n);
    if (!l)
        return oom(r);
    l->n = 0;
    int is_map = f[0] == 'm', attr = NAME_IS(f, fn, "selectattr") || NAME_IS(f, fn, "rejectattr");
    int keep_when = f[0] == 's';
    const jv *attr_kw = arg(a, 99, "attribute");
    for (size_t i = 0; i < in->n; i++) {
        if (tick(r, 1) != OK)
            return ERR;
        jv x = in->v[i];
        if (is_map) {
            if (attr_kw) {
                if (attr_kw->t != JV_STR)
                    return rfail(r, "map(attribute=) needs a string");
                jv y = get_attr(x, attr_kw->u.s.p, attr_kw->u.s.n);
                const jv *dflt = arg(a, 99, "default");
                l->v[l->n++] = y.t == JV_UNDEF && dflt ? *dflt : y;
                continue;
            }
            const jv *name = arg(a, 0, NULL);
            if (!name || name->t != JV_STR || !kiln_jinja_has_filter(name->u.s.p, name->u.s.n))
                return rfail(r, "map() needs a filter name or attribute=");
            args rest = *a;
            rest.n = 0;
            for (size_t k = 1; k < a->n; k++) {
                rest.pos[rest.n] = a->pos[k];
                rest.kw[rest.n++] = a->kw[k];
            }
            if (apply_filter(r, name->u.s.p, name->u.s.n, x, &rest, &l->v[l->n]) != OK)
                return ERR;
            l->n++;
            continue;
        }
        size_t first = 0;
        jv subject = x;
        if (attr) {
            const jv *an = arg(a, 0, NULL);
            if (!an || an->t != JV_STR)
                return rfail(r, "%.*s() needs an attribute name", (int)fn, f);
            subject = get_attr(x, an->u.s.p, an->u.s.n);
            first = 1;
        }
        int keep;
        const jv *tname = first < a->n ? &a->pos[first] : NULL;
        if (!tname) {
            keep = jv_truthy(subject);
        } else {
            if (tname->t != JV_STR || !kiln_jinja_has_test(tname->u.s.p, tname->u.s.n))
                return rfail(r, "%.*s(): unsupported test", (int)fn, f);
            args targs = {.n = 0};
            for (size_t k = first + 1; k < a->n; k++) {
                targs.pos[targs.n] = a->pos[k];
                targs.kw[targs.n++] = a->kw[k];
            }
            if (run_test(r, tname->u.s.p, tname->u.s.n, subject, &targs, &keep) != OK)
                return ERR;
        }
        if (keep == keep_when)
            l->v[l->n++] = x;
    }
    *out = list_val(l);
    return OK;
}

static int to_int(R *r, jv v, const jv *dflt, jv *out)
{
    if (v.t == JV_INT || v.t == JV_BOOL) {
        *out = jv_int(i64(v));
        return OK;
    }
    if (v.t == JV_FLOAT && v.u.f > -9.2e18 && v.u.f < 9.2e18) {
        *out = jv_int((int64_t)v.u.f);
        return OK;
    }
    if (v.t == JV_STR && v.u.s.n < 64) {
        char s[64], *e;
        memcpy(s, v.u.s.p, v.u.s.n);
        s[v.u.s.n] = '\0';
        long long x = strtoll(s, &e, 10);
        if (e != s && !*e) {
            *out = jv_int(x);
            return OK;
        }
        double f = strtod(s, &e);
        if (e != s && !*e && f > -9.2e18 && f < 9.2e18) {
            *out = jv_int((int64_t)f);
            return OK;
        }
    }
    *out = dflt ? *dflt : jv_int(0);
    (void)r;
    return OK;
}

static int apply_filter(R *r, const char *f, size_t fn, jv v, const args *a, jv *out)
{
    /* The operand counts as scanned but where the filter only looks at a
     * list's size or ends, or passes it through: templates ask for
     * `messages | length` inside their loop over a long conversation. */
    int glance =
        NAME_IS(f, fn, "default") || NAME_IS(f, fn, "d") ||
        ((v.t == JV_LIST || v.t == JV_DICT || v.t == JV_NS) &&
         (NAME_IS(f, fn, "length") || NAME_IS(f, fn, "count") || NAME_IS(f, fn, "first") || NAME_IS(f, fn, "last")));
    if (scan_args(r, glance ? undef() : v, a) != OK)
        return ERR;
    const jv *a0 = arg(a, 0, NULL);
    if (NAME_IS(f, fn, "default") || NAME_IS(f, fn, "d")) {
        const jv *bo = arg(a, 1, "boolean");
        int use = v.t == JV_UNDEF || (bo && jv_truthy(*bo) && !jv_truthy(v));
        *out = use ? (a0 ? *a0 : jv_str("", 0)) : v;
        return OK;
    }
    if (NAME_IS(f, fn, "safe")) {
        *out = v;
        return OK;
    }
    if (v.t == JV_UNDEF && !NAME_IS(f, fn, "length") && !NAME_IS(f, fn, "count") && !NAME_IS(f, fn, "string") &&
        !NAME_IS(f, fn, "list") && !NAME_IS(f, fn, "join") && !NAME_IS(f, fn, "trim"))
        return rfail(r, "filter '%.*s' applied to an undefined value", (int)fn, f);
    if (NAME_IS(f, fn, "trim")) {
        jv s = v;
        if (s.t != JV_STR && concat_str(r, v, jv_str("", 0), &s) != OK)
            return ERR;
        *out = strip(s, 1, 1, a0);
        return OK;
    }
    if (NAME_IS(f, fn, "upper") || NAME_IS(f, fn, "lower") || NAME_IS(f, fn, "capitalize") || NAME_IS(f, fn, "title")) {
        jv s = v;
        if (s.t != JV_STR && concat_str(r, v, jv_str("", 0), &s) != OK)
            return ERR;
        return case_map(r, s, f[0] == 'u' ? 1 : f[0] == 'l' ? 0 : f[0] == 'c' ? 2 : 4, out);
    }
    if (NAME_IS(f, fn, "string"))
        return concat_str(r, v, jv_str("", 0), out);
    if (NAME_IS(f, fn, "length") || NAME_IS(f, fn, "count")) {
        *out = jv_int(v.t == JV_STR                    ? (int64_t)u8_len(v.u.s.p, v.u.s.n)
                      : v.t == JV_LIST                 ? (int64_t)v.u.l->n
                      : v.t == JV_DICT || v.t == JV_NS ? (int64_t)v.u.d->n
                                                       : 0);
        if (v.t != JV_STR && v.t != JV_LIST && v.t != JV_DICT && v.t != JV_NS && v.t != JV_UNDEF)
            return rfail(r, "a %s value has no length", type_name(v));
        return OK;
    }
    if (NAME_IS(f, fn, "replace")) {
        jv s = v;
        if (s.t != JV_STR && concat_str(r, v, jv_str("", 0), &s) != OK)
            return ERR;
        const jv *a1 = arg(a, 1, NULL), *c = arg(a, 2, "count");
        if (want_str(r, a0, "replace") != OK || want_str(r, a1, "replace") != OK)
            return ERR;
        return str_replace(r, s, *a0, *a1, c && c->t == JV_INT ? c->u.i : -1, out);
    }
    if (NAME_IS(f, fn, "join"))
        return join(r, v, a0 ? *a0 : jv_str("", 0), arg(a, 1, "attribute"), out);
    if (NAME_IS(f, fn, "tojson")) {
        const jv *ind = arg(a, 0, "indent"), *sk = arg(a, 99, "sort_keys");
        jbuf b = {.a = r->a, .max = J_MAX_MEMORY};
        int indent = ind && ind->t == JV_INT ? (int)(ind->u.i < 0 ? 0 : ind->u.i > 64 ? 64 : ind->u.i) : -1;
        if (!jv_write_json(&b, v, indent, sk && jv_truthy(*sk), 0))
            return rfail(r, "tojson: a %s value is not JSON", type_name(v));
        if (b.failed)
            return oom(r);
        *out = jv_str(b.p ? b.p : "", b.n);
        return OK;
    }
    if (NAME_IS(f, fn, "items") || NAME_IS(f, fn, "dictsort")) {
        if (items_of(r, v, out) != OK)
            return ERR;
        if (f[0] == 'd') { /* by key, case-insensitively as Jinja does for strings */
            jlist *l = out->u.l;
            for (size_t i = 1; i < l->n; i++)
                for (size_t j = i; j > 0; j--) {
                    if (tick(r, 1) != OK)
                        return ERR;
                    jv ka, kb;
                    if (case_map(r, l->v[j - 1].u.l->v[0], 0, &ka) != OK ||
                        case_map(r, l->v[j].u.l->v[0], 0, &kb) != OK)
                        return ERR;
                    if (order(ka, kb, 0, &r->work) <= 0)
                        break;
                    jv t = l->v[j];
                    l->v[j] = l->v[j - 1];
                    l->v[j - 1] = t;
                }
        }
        return OK;
    }
    if (NAME_IS(f, fn, "list")) {
        jlist *l;
        if (iterate(r, v, &l) != OK)
            return ERR;
        *out = list_val(l);
        return OK;
    }
    if (NAME_IS(f, fn, "first") || NAME_IS(f, fn, "last")) {
        jlist *l;
        if (iterate(r, v, &l) != OK)
            return ERR;
        *out = l->n ? l->v[f[0] == 'f' ? 0 : l->n - 1] : undef();
        return OK;
    }
    if (NAME_IS(f, fn, "reverse")) {
        jlist *l, *o;
        if (iterate(r, v, &l) != OK || !(o = new_list(r, l->n)))
            return r->err[0] ? ERR : oom(r);
        for (size_t i = 0; i < l->n; i++)
            o->v[i] = l->v[l->n - 1 - i];
        if (v.t == JV_STR)
            return join(r, list_val(o), jv_str("", 0), NULL, out);
        *out = list_val(o);
        return OK;
    }
    if (NAME_IS(f, fn, "unique")) {
        jlist *l, *o;
        if (iterate(r, v, &l) != OK || !(o = new_list(r, l->n)))
            return r->err[0] ? ERR : oom(r);
        o->n = 0;
        for (size_t i = 0; i < l->n; i++) {
            int seen = 0;
            for (size_t k = 0; k < o->n && !seen; k++)
                seen = jv_equal(o->v[k], l->v[i], &r->work);
            if (!seen)
                o->v[o->n++] = l->v[i];
            if (tick(r, o->n) != OK)
                return ERR;
        }
        *out = list_val(o);
        return OK;
    }
    if (NAME_IS(f, fn, "max") || NAME_IS(f, fn, "min") || NAME_IS(f, fn, "sum")) {
        jlist *l;
        if (iterate(r, v, &l) != OK)
            return ERR;
        if (f[1] == 'u') {
            jv acc = jv_int(0);
            for (size_t i = 0; i < l->n; i++)
                if (binop(r, J_OP_ADD, acc, l->v[i], &acc) != OK)
                    return ERR;
            *out = acc;
            return OK;
        }
        *out = undef();
        for (size_t i = 0; i < l->n; i++) {
            int c = out->t == JV_UNDEF ? 0 : order(l->v[i], *out, 0, &r->work);
            if (c == -2)
                return rfail(r, "%.*s: values do not compare", (int)fn, f);
            if (out->t == JV_UNDEF || (f[1] == 'a' ? c > 0 : c < 0))
                *out = l->v[i];
        }
        return OK;
    }
    if (NAME_IS(f, fn, "abs")) {
        if (v.t == JV_FLOAT)
            *out = (jv){.t = JV_FLOAT, .u.f = fabs(v.u.f)};
        else if ((v.t == JV_INT || v.t == JV_BOOL) && i64(v) != INT64_MIN)
            *out = jv_int(i64(v) < 0 ? -i64(v) : i64(v));
        else
            return rfail(r, "abs of a %s value", type_name(v));
        return OK;
    }
    if (NAME_IS(f, fn, "int"))
        return to_int(r, v, a0, out);
    if (NAME_IS(f, fn, "float")) {
        jv i;
        if (v.t == JV_FLOAT) {
            *out = v;
        } else if (v.t == JV_STR && v.u.s.n < 64) {
            char s[64], *e;
            memcpy(s, v.u.s.p, v.u.s.n);
            s[v.u.s.n] = '\0';
            double d = strtod(s, &e);
            *out = e != s && !*e ? (jv){.t = JV_FLOAT, .u.f = d} : a0 ? *a0 : (jv){.t = JV_FLOAT};
        } else if (to_int(r, v, NULL, &i) == OK && (v.t == JV_INT || v.t == JV_BOOL)) {
            *out = (jv){.t = JV_FLOAT, .u.f = (double)i.u.i};
        } else {
            *out = a0 ? *a0 : (jv){.t = JV_FLOAT};
        }
        return OK;
    }
    if (NAME_IS(f, fn, "wordcount")) {
        jv words;
        if (v.t != JV_STR || str_split(r, v, NULL, -1, &words) != OK)
            return r->err[0] ? ERR : rfail(r, "wordcount needs a string");
        *out = jv_int((int64_t)words.u.l->n);
        return OK;
    }
    return select_map(r, f, fn, v, a, out);
}

/* ---- expressions ---------------------------------------------------------------- */

static int ev(R *r, const jnode *n, jv *out)
{
    if (tick(r, 1) != OK)
        return ERR;
    if (r->depth >= J_MAX_DEPTH)
        return rfail(r, "expression nested more than %d deep", J_MAX_DEPTH);
    r->depth++;
    int saved = r->line;
    r->line = n->line;
    int st = OK;
    jv a, b;
    switch (n->kind) {
    case E_LIT: *out = n->lit; break;
    case E_NAME: *out = lookup(r, n->s, n->n); break;
    case E_LIST: {
        jlist *l = new_list(r, n->n_kids);
        if (!l) {
            st = oom(r);
            break;
        }
        for (size_t i = 0; i < n->n_kids && st == OK; i++)
            st = ev(r, n->kids[i], &l->v[i]);
        l->tuple = n->op;
        *out = list_val(l);
        break;
    }
    case E_DICT: {
        jdict *d = jarena_alloc(r->a, sizeof *d);
        if (!d) {
            st = oom(r);
            break;
        }
        for (size_t i = 0; i + 1 < n->n_kids && st == OK; i += 2) {
            if ((st = ev(r, n->kids[i], &a)) != OK || (st = ev(r, n->kids[i + 1], &b)) != OK)
                break;
            if (a.t != JV_STR)
                st = rfail(r, "dict keys must be strings here, not %s", type_name(a));
            else if ((st = tick(r, d->n)) == OK && !jdict_set(r->a, d, a, b)) /* jdict_set scans the keys */
                st = oom(r);
        }
        *out = (jv){.t = JV_DICT, .u.d = d};
        break;
    }
    case E_ATTR:
        if ((st = ev(r, n->kids[0], &a)) != OK)
            break;
        if (a.t == JV_UNDEF)
            st = rfail(r, "'.%.*s' of an undefined value", (int)n->n, n->s);
        else if ((st = scan(r, a.t == JV_DICT || a.t == JV_NS ? a : undef(), undef())) == OK) /* the keys */
            *out = get_attr(a, n->s, n->n);
        break;
    case E_ITEM:
        if ((st = ev(r, n->kids[0], &a)) == OK && (st = ev(r, n->kids[1], &b)) == OK)
            st = get_item(r, a, b, out);
        break;
    case E_SLICE: {
        jv part[3] = {undef(), undef(), undef()};
        if ((st = ev(r, n->kids[0], &a)) != OK)
            break;
        for (int i = 0; i < 3 && st == OK; i++)
            if (n->kids[1 + i])
                st = ev(r, n->kids[1 + i], &part[i]);
        if (st == OK)
            st = slice(r, a, part, out);
        break;
    }
    case E_CALL: st = ev_call(r, n, out); break;
    case E_FILTER: {
        args ar;
        if ((st = ev(r, n->kids[0], &a)) == OK && (st = eval_args(r, n, 1, &ar)) == OK)
            st = apply_filter(r, n->s, n->n, a, &ar, out);
        break;
    }
    case E_TEST: {
        args ar;
        int res = 0;
        if ((st = ev(r, n->kids[0], &a)) == OK && (st = eval_args(r, n, 1, &ar)) == OK &&
            (st = run_test(r, n->s, n->n, a, &ar, &res)) == OK)
            *out = jv_bool(res != n->op);
        break;
    }
    case E_NOT:
        if ((st = ev(r, n->kids[0], &a)) == OK)
            *out = jv_bool(!jv_truthy(a));
        break;
    case E_NEG:
    case E_POS:
        if ((st = ev(r, n->kids[0], &a)) != OK)
            break;
        if (!numeric(a))
            st = rfail(r, "unary %c of a %s value", n->kind == E_NEG ? '-' : '+', type_name(a));
        else if (n->kind == E_POS)
            *out = a.t == JV_BOOL ? jv_int(a.u.b) : a;
        else if (a.t == JV_FLOAT)
            *out = (jv){.t = JV_FLOAT, .u.f = -a.u.f};
        else if (i64(a) == INT64_MIN)
            *out = (jv){.t = JV_FLOAT, .u.f = -(double)INT64_MIN};
        else
            *out = jv_int(-i64(a));
        break;
    case E_BIN:
        if ((st = ev(r, n->kids[0], &a)) == OK && (st = ev(r, n->kids[1], &b)) == OK) {
            if ((a.t == JV_UNDEF || b.t == JV_UNDEF) && n->op != J_OP_CONCAT && n->op != J_OP_EQ && n->op != J_OP_NE &&
                n->op != J_OP_IN && n->op != J_OP_NOTIN)
                st = rfail(r, "an undefined value in an arithmetic or comparison");
            else
                st = binop(r, n->op, a, b, out);
        }
        break;
    case E_AND:
    case E_OR:
        if ((st = ev(r, n->kids[0], &a)) != OK)
            break;
        if (jv_truthy(a) == (n->kind == E_OR))
            *out = a;
        else
            st = ev(r, n->kids[1], out);
        break;
    case E_COND:
        if ((st = ev(r, n->kids[0], &a)) != OK)
            break;
        if (jv_truthy(a))
            st = ev(r, n->kids[1], out);
        else if (n->kids[2])
            st = ev(r, n->kids[2], out);
        else
            *out = undef();
        break;
    default: st = rfail(r, "internal: not an expression"); break;
    }
    r->depth--;
    if (st == OK)
        r->line = saved;
    return st;
}

/* ---- statements ------------------------------------------------------------------- */

static int exec(R *r, const jnode *n);

static int exec_body(R *r, const jnode *b)
{
    for (size_t i = 0; i < b->n_kids; i++) {
        int st = exec(r, b->kids[i]);
        if (st != OK)
            return st;
    }
    return OK;
}

static int bind_targets(R *r, const jnode *n, jv item)
{
    if (n->n_names == 1)
        return assign(r, n->names[0], item);
    jlist *l;
    if (item.t != JV_LIST && item.t != JV_STR)
        return rfail(r, "cannot unpack a %s value into %zu names", type_name(item), n->n_names);
    if (iterate(r, item, &l) != OK)
        return ERR;
    if (l->n != n->n_names)
        return rfail(r, "cannot unpack %zu values into %zu names", l->n, n->n_names);
    for (size_t i = 0; i < n->n_names; i++)
        if (assign(r, n->names[i], l->v[i]) != OK)
            return ERR;
    return OK;
}

static int exec_for(R *r, const jnode *n)
{
    jv seq;
    jlist *items;
    if (ev(r, n->kids[0], &seq) != OK || iterate(r, seq, &items) != OK)
        return ERR;
    frame f = {.up = r->top};
    r->top = &f;
    int st = OK;
    if (n->kids[2]) { /* for x in xs if cond: filtered before loop.* counts */
        jlist *kept = new_list(r, items->n);
        if (!kept) {
            r->top = f.up;
            return oom(r);
        }
        kept->n = 0;
        for (size_t i = 0; i < items->n && st == OK; i++) {
            jv c;
            if ((st = tick(r, 1)) == OK && (st = bind_targets(r, n, items->v[i])) == OK &&
                (st = ev(r, n->kids[2], &c)) == OK && jv_truthy(c))
                kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    jloop *lp = jarena_alloc(r->a, sizeof *lp);
    if (!lp && st == OK)
        st = oom(r);
    for (size_t i = 0; i < items->n && st == OK; i++) {
        if ((st = tick(r, 1)) != OK)
            break;
        *lp = (jloop){(int64_t)i, (int64_t)items->n, i ? items->v[i - 1] : undef(),
                      i + 1 < items->n ? items->v[i + 1] : undef()};
        if ((st = bind_targets(r, n, items->v[i])) != OK ||
            (st = assign(r, "loop", (jv){.t = JV_LOOP, .u.loop = lp})) != OK)
            break;
        st = exec_body(r, n->kids[1]);
        if (st == CONT)
            st = OK;
    }
    if (st == BRK)
        st = OK;
    r->top = f.up;
    if (st == OK && items->n == 0 && n->kids[3])
        st = exec_body(r, n->kids[3]);
    return st;
}

static int exec(R *r, const jnode *n)
{
    if (tick(r, 1) != OK)
        return ERR;
    r->line = n->line;
    jv v;
    switch (n->kind) {
    case N_BODY: return exec_body(r, n);
    case N_TEXT: jbuf_put(r->out, n->s, n->n); break;
    case N_OUTPUT:
        if (ev(r, n->kids[0], &v) != OK)
            return ERR;
        jv_write_str(r->out, v);
        break;
    case N_IF:
        for (size_t i = 0; i + 1 < n->n_kids; i += 2) {
            if (n->kids[i]) {
                if (ev(r, n->kids[i], &v) != OK)
                    return ERR;
                if (!jv_truthy(v))
                    continue;
            }
            return exec_body(r, n->kids[i + 1]);
        }
        break;
    case N_FOR: return exec_for(r, n);
    case N_BREAK: return BRK;
    case N_CONTINUE: return CONT;
    case N_SET:
        if (n->op == 2) { /* {% set x %}...{% endset %} */
            jbuf b = {.a = r->a, .max = J_MAX_OUTPUT}, *saved = r->out;
            r->out = &b;
            int st = exec_body(r, n->kids[0]);
            r->out = saved;
            if (st != OK)
                return st == ERR ? ERR : rfail(r, "break/continue outside a loop body");
            if (b.failed)
                return b.failed == 2 ? rfail(r, "set block longer than %zu MiB", J_MAX_OUTPUT >> 20) : oom(r);
            return assign(r, n->names[0], jv_str(b.p ? b.p : "", b.n));
        }
        if (ev(r, n->kids[0], &v) != OK)
            return ERR;
        if (n->op == 1) {
            jv ns = lookup(r, n->names[0], strlen(n->names[0]));
            if (ns.t != JV_NS)
                return rfail(r, "'set %s.%s': %s is not a namespace()", n->names[0], n->names[1], n->names[0]);
            return jdict_set(r->a, ns.u.d, jv_str(n->names[1], strlen(n->names[1])), v) ? OK : oom(r);
        }
        return bind_targets(r, n, v);
    default: return rfail(r, "internal: not a statement");
    }
    if (r->out->failed)
        return r->out->failed == 2 ? rfail(r, "output longer than %zu MiB", J_MAX_OUTPUT >> 20) : oom(r);
    return OK;
}

kiln_status kiln_jinja_render(const kiln_jinja *t, const json_t *vars, char **out, size_t *len)
{
    if (!t || !out || !len || (vars && !json_is_object(vars)))
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_jinja_render: a template, an object of variables and out");
    jarena a = {.limit = J_MAX_MEMORY};
    jbuf o = {.a = &a, .max = J_MAX_OUTPUT};
    frame g = {0};
    R r = {.a = &a, .out = &o, .top = &g, .line = 1};
    int st = OK;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vars, key, val)
    {
        jv v;
        size_t kn = strlen(key);
        char *k = sdup(&r, key, kn);
        if (!k || !jv_from_json(&a, val, &v) || !jdict_set(&a, &g.vars, jv_str(k, kn), v)) {
            st = oom(&r);
            break;
        }
    }
    if (st == OK)
        st = exec(&r, t->root);
    if (st == BRK || st == CONT)
        st = rfail(&r, "break/continue outside a loop");
    if (st == OK) /* a search cut short by the budget answers "not found": never let that through */
        st = tick(&r, 0);
    kiln_status s = KILN_OK;
    if (st != OK) {
        s = kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "%s", r.err);
    } else if (!(*out = malloc(o.n + 1))) {
        s = kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory rendering a chat template");
    } else {
        if (o.n)
            memcpy(*out, o.p, o.n);
        (*out)[o.n] = '\0';
        *len = o.n;
    }
    jarena_free(&a);
    return s;
}
