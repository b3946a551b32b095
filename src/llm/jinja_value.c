/* Values of the Jinja interpreter (jinja_internal.h): the arena they live
 * in, JSON in, and Python's str() and json.dumps() out. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/jinja_internal.h"

/* ---- arena --------------------------------------------------------------- */

typedef struct jchunk {
    struct jchunk *next;
    size_t size, used;
    max_align_t data[];
} jchunk;

void *jarena_alloc(jarena *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    if (n == 0)
        n = sizeof(max_align_t);
    if (a->limit && (n > a->limit || a->used > a->limit - n))
        return NULL;
    jchunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > 65536 ? n : 65536;
        c = malloc(sizeof *c + size);
        if (!c)
            return NULL;
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void jarena_free(jarena *a)
{
    for (jchunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- values ---------------------------------------------------------------- */

jv jv_str(const char *p, size_t n) { return (jv){.t = JV_STR, .u.s = {p, n}}; }
jv jv_int(int64_t i) { return (jv){.t = JV_INT, .u.i = i}; }
jv jv_bool(int b) { return (jv){.t = JV_BOOL, .u.b = b != 0}; }

int jv_truthy(jv v)
{
    switch (v.t) {
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    case JV_NS:
    case JV_LOOP:
    case JV_FUNC: return 1;
    default: return 0;
    }
}

static int numeric(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double as_double(jv v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b; }

/* Values nested deeper than this (a template can build any depth) compare
 * unequal rather than recurse without bound. */
#define J_MAX_COMPARE_DEPTH 256

static int equal(jv a, jv b, int depth, uint64_t *work)
{
    if (depth > J_MAX_COMPARE_DEPTH || *work > J_MAX_WORK)
        return 0;
    if (numeric(a) && numeric(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT)
            return (a.t == JV_INT ? a.u.i : a.u.b) == (b.t == JV_INT ? b.u.i : b.u.b);
        return as_double(a) == as_double(b);
    }
    if (a.t != b.t)
        return 0;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR:
        if (a.u.s.n != b.u.s.n)
            return 0;
        *work += a.u.s.n;
        return !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n)
            return 0;
        for (size_t i = 0; i < a.u.l->n; i++) {
            *work += J_WORK_PER_ITEM;
            if (!equal(a.u.l->v[i], b.u.l->v[i], depth + 1, work))
                return 0;
        }
        return 1;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n)
            return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            *work += J_WORK_PER_ITEM * b.u.d->n; /* jdict_get scans the keys */
            jv *o = jdict_get(b.u.d, a.u.d->k[i].u.s.p, a.u.d->k[i].u.s.n);
            if (!o || !equal(a.u.d->v[i], *o, depth + 1, work))
                return 0;
        }
        return 1;
    default: return a.u.d == b.u.d;
    }
}

int jv_equal(jv a, jv b, uint64_t *work) { return equal(a, b, 0, work); }

jv *jdict_get(const jdict *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, k, n))
            return &d->v[i];
    return NULL;
}

int jdict_set(jarena *a, jdict *d, jv k, jv v)
{
    jv *o = jdict_get(d, k.u.s.p, k.u.s.n);
    if (o) {
        *o = v;
        return 1;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *nk = jarena_alloc(a, cap * sizeof *nk), *nv = jarena_alloc(a, cap * sizeof *nv);
        if (!nk || !nv)
            return 0;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return 1;
}

int jv_from_json(jarena *a, const json_t *j, jv *out)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jdict *d = jarena_alloc(a, sizeof *d);
        if (!d)
            return 0;
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)j, key, v)
        {
            size_t kn = strlen(key);
            char *k = jarena_alloc(a, kn + 1);
            jv x;
            if (!k || !jv_from_json(a, v, &x))
                return 0;
            memcpy(k, key, kn);
            if (!jdict_set(a, d, jv_str(k, kn), x))
                return 0;
        }
        *out = (jv){.t = JV_DICT, .u.d = d};
        return 1;
    }
    case JSON_ARRAY: {
        jlist *l = jarena_alloc(a, sizeof *l);
        size_t n = json_array_size(j);
        if (!l || (n && !(l->v = jarena_alloc(a, n * sizeof *l->v))))
            return 0;
        for (size_t i = 0; i < n; i++)
            if (!jv_from_json(a, json_array_get(j, i), &l->v[i]))
                return 0;
        l->n = n;
        *out = (jv){.t = JV_LIST, .u.l = l};
        return 1;
    }
    case JSON_STRING: {
        size_t n = json_string_length(j);
        char *s = jarena_alloc(a, n + 1);
        if (!s)
            return 0;
        memcpy(s, json_string_value(j), n);
        *out = jv_str(s, n);
        return 1;
    }
    case JSON_INTEGER: *out = jv_int(json_integer_value(j)); return 1;
    case JSON_REAL: *out = (jv){.t = JV_FLOAT, .u.f = json_real_value(j)}; return 1;
    case JSON_TRUE: *out = jv_bool(1); return 1;
    case JSON_FALSE: *out = jv_bool(0); return 1;
    default: *out = (jv){.t = JV_NONE}; return 1;
    }
}

/* ---- output -------------------------------------------------------------- */

void jbuf_put(jbuf *b, const char *s, size_t n)
{
    if (b->failed || !n)
        return;
    if (n > b->max || b->n > b->max - n) {
        b->failed = 2;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = jarena_alloc(b->a, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        if (b->n)
            memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    if (n <= 8) /* the common small piece, without a call */
        for (size_t i = 0; i < n; i++)
            b->p[b->n + i] = s[i];
    else
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* Python's repr(float): the shortest digits that read back exactly,
 * positional from 1e-4 up to 1e16, otherwise an exponent. */
static void put_float(jbuf *b, double f, int json)
{
    char s[64];
    if (isnan(f)) {
        jbuf_puts(b, json ? "NaN" : "nan");
        return;
    }
    if (isinf(f)) {
        jbuf_puts(b, f < 0 ? "-" : "");
        jbuf_puts(b, json ? "Infinity" : "inf");
        return;
    }
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(s, sizeof s, "%.*e", prec - 1, f);
        if (strtod(s, NULL) == f)
            break;
    }
    snprintf(s, sizeof s, "%.*e", prec - 1, f);
    int exp = atoi(strchr(s, 'e') + 1);
    if (exp >= -4 && exp < 16) {
        int dec = prec - 1 - exp;
        snprintf(s, sizeof s, "%.*f", dec > 0 ? dec : 0, f);
        if (!strchr(s, '.'))
            strcat(s, ".0");
    } else {
        char m[40];
        snprintf(m, sizeof m, "%.*e", prec - 1, f);
        char *e = strchr(m, 'e');
        *e = '\0';
        snprintf(s, sizeof s, "%se%c%02d", m, exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    jbuf_puts(b, s);
}

static void put_int(jbuf *b, int64_t i)
{
    char s[32];
    snprintf(s, sizeof s, "%lld", (long long)i);
    jbuf_puts(b, s);
}

/* repr(str): single quotes unless the text has ' and no ". */
static void put_repr(jbuf *b, const char *s, size_t n)
{
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    jbuf_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '\\' || c == (unsigned char)q) {
            e[0] = '\\';
            e[1] = (char)c;
            jbuf_put(b, e, 2);
        } else if (c == '\n') {
            jbuf_puts(b, "\\n");
        } else if (c == '\r') {
            jbuf_puts(b, "\\r");
        } else if (c == '\t') {
            jbuf_puts(b, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", c);
            jbuf_puts(b, e);
        } else {
            jbuf_put(b, (const char *)&c, 1);
        }
    }
    jbuf_put(b, &q, 1);
}

static void write_repr(jbuf *b, jv v, int depth)
{
    if (b->failed) /* a list holding itself twice, 64 deep, has 2^64 leaves: stop at the cap */
        return;
    if (depth > 64) {
        jbuf_puts(b, "...");
        return;
    }
    if (v.t == JV_STR) {
        put_repr(b, v.u.s.p, v.u.s.n);
    } else if (v.t == JV_LIST) {
        jbuf_puts(b, v.u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                jbuf_puts(b, ", ");
            write_repr(b, v.u.l->v[i], depth + 1);
        }
        jbuf_puts(b, v.u.l->tuple ? (v.u.l->n == 1 ? ",)" : ")") : "]");
    } else if (v.t == JV_DICT) {
        jbuf_puts(b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                jbuf_puts(b, ", ");
            write_repr(b, v.u.d->k[i], depth + 1);
            jbuf_puts(b, ": ");
            write_repr(b, v.u.d->v[i], depth + 1);
        }
        jbuf_puts(b, "}");
    } else {
        jv_write_str(b, v);
    }
}

void jv_write_str(jbuf *b, jv v)
{
    switch (v.t) {
    case JV_UNDEF: break;
    case JV_NONE: jbuf_puts(b, "None"); break;
    case JV_BOOL: jbuf_puts(b, v.u.b ? "True" : "False"); break;
    case JV_INT: put_int(b, v.u.i); break;
    case JV_FLOAT: put_float(b, v.u.f, 0); break;
    case JV_STR: jbuf_put(b, v.u.s.p, v.u.s.n); break;
    case JV_LIST:
    case JV_DICT: write_repr(b, v, 0); break;
    case JV_NS: jbuf_puts(b, "<Namespace>"); break;
    case JV_LOOP: jbuf_puts(b, "<LoopContext>"); break;
    case JV_FUNC: jbuf_puts(b, "<function>"); break;
    }
}

/* json.dumps of a string. Written through a small buffer: escapes are many
 * and short, and a jbuf_put for each would be slow on long text. */
static void put_json_string(jbuf *b, const char *s, size_t n)
{
    /* per byte: 0 as it is, 'u' as \u00XX, else the letter after a backslash */
    static const char esc[256] = {
        ['\b'] = 'b', ['\t'] = 't', ['\n'] = 'n', ['\f'] = 'f', ['\r'] = 'r', ['"'] = '"', ['\\'] = '\\',
        [0] = 'u',    [1] = 'u',    [2] = 'u',    [3] = 'u',    [4] = 'u',    [5] = 'u',   [6] = 'u',
        [7] = 'u',    [11] = 'u',   [14] = 'u',   [15] = 'u',   [16] = 'u',   [17] = 'u',  [18] = 'u',
        [19] = 'u',   [20] = 'u',   [21] = 'u',   [22] = 'u',   [23] = 'u',   [24] = 'u',  [25] = 'u',
        [26] = 'u',   [27] = 'u',   [28] = 'u',   [29] = 'u',   [30] = 'u',   [31] = 'u'};
    static const char hex[] = "0123456789abcdef";
    char t[512];
    size_t k = 0;
    t[k++] = '"';
    for (size_t i = 0; i < n && !b->failed; i++) {
        if (k > sizeof t - 8) {
            jbuf_put(b, t, k);
            k = 0;
        }
        unsigned char c = (unsigned char)s[i];
        char e = esc[c];
        if (!e) {
            t[k++] = (char)c;
        } else if (e != 'u') {
            t[k++] = '\\';
            t[k++] = e;
        } else {
            memcpy(t + k, "\\u00", 4);
            t[k + 4] = hex[c >> 4];
            t[k + 5] = hex[c & 15];
            k += 6;
        }
    }
    t[k++] = '"';
    jbuf_put(b, t, k);
}

static void newline_indent(jbuf *b, int indent, int level)
{
    jbuf_puts(b, "\n");
    for (int i = 0; i < indent * level && !b->failed; i++)
        jbuf_puts(b, " ");
}

/* qsort order of two `const jv *` keys: by code point (UTF-8 byte order). */
static int key_cmp(const void *pa, const void *pb)
{
    const jv *a = *(const jv *const *)pa, *b = *(const jv *const *)pb;
    size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
    int c = memcmp(a->u.s.p, b->u.s.p, n);
    return c ? c : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
}

int jv_write_json(jbuf *b, jv v, int indent, int sort_keys, int depth)
{
    if (depth > 64)
        return 0;
    if (b->failed) /* past the cap (the caller reports it): shared lists can have 2^64 leaves */
        return 1;
    switch (v.t) {
    case JV_NONE: jbuf_puts(b, "null"); return 1;
    case JV_BOOL: jbuf_puts(b, v.u.b ? "true" : "false"); return 1;
    case JV_INT: put_int(b, v.u.i); return 1;
    case JV_FLOAT: put_float(b, v.u.f, 1); return 1;
    case JV_STR: put_json_string(b, v.u.s.p, v.u.s.n); return 1;
    case JV_LIST:
        if (!v.u.l->n) {
            jbuf_puts(b, "[]");
            return 1;
        }
        jbuf_puts(b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                jbuf_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                newline_indent(b, indent, depth + 1);
            if (!jv_write_json(b, v.u.l->v[i], indent, sort_keys, depth + 1))
                return 0;
        }
        if (indent >= 0)
            newline_indent(b, indent, depth);
        jbuf_puts(b, "]");
        return 1;
    case JV_DICT:
    case JV_NS: {
        const jdict *d = v.u.d;
        if (!d->n) {
            jbuf_puts(b, "{}");
            return 1;
        }
        /* the order to write keys in: insertion, or sorted by code point (UTF-8 byte order) */
        const jv **ord = jarena_alloc(b->a, d->n * sizeof *ord);
        if (!ord) {
            b->failed = 1;
            return 1;
        }
        for (size_t i = 0; i < d->n; i++)
            ord[i] = &d->k[i];
        if (sort_keys) /* keys are unique, so an unstable sort is exact */
            qsort(ord, d->n, sizeof *ord, key_cmp);
        jbuf_puts(b, "{");
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                jbuf_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                newline_indent(b, indent, depth + 1);
            put_json_string(b, ord[i]->u.s.p, ord[i]->u.s.n);
            jbuf_puts(b, ": ");
            if (!jv_write_json(b, d->v[ord[i] - d->k], indent, sort_keys, depth + 1))
                return 0;
        }
        if (indent >= 0)
            newline_indent(b, indent, depth);
        jbuf_puts(b, "}");
        return 1;
    }
    default: return 0;
    }
}
