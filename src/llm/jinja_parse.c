/* Jinja source -> syntax tree (jinja.h): a lexer that applies Hugging
 * Face's whitespace rules (trim_blocks, lstrip_blocks, `-` markers), then a
 * recursive-descent parser with Jinja's operator precedence. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "llm/jinja_internal.h"

#define J_MAX_TOKENS (1u << 20)
#define J_MAX_NEST 128 /* blocks and parentheses deep */

typedef enum {
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STR,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF
} ttype;

typedef struct tok {
    ttype t;
    int line;
    const char *s; /* T_TEXT, T_NAME, T_STR (decoded, in the arena), T_OP */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    jarena *a;
    tok *t;
    size_t n, cap, pos;
    int depth;
    char err[256];
} parser;

static int fail(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(parser *p, int line, const char *fmt, ...)
{
    if (p->err[0])
        return 0;
    int k = snprintf(p->err, sizeof p->err, "chat template line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + k, sizeof p->err - (size_t)k, fmt, ap);
    va_end(ap);
    return 0;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* ---- lexer ---------------------------------------------------------------- */

static tok *push(parser *p, ttype t, int line)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        if (cap > J_MAX_TOKENS) {
            fail(p, line, "too many tokens (at most %u)", J_MAX_TOKENS);
            return NULL;
        }
        tok *nt = realloc(p->t, cap * sizeof *nt);
        if (!nt) {
            fail(p, line, "out of memory");
            return NULL;
        }
        p->t = nt;
        p->cap = cap;
    }
    tok *k = &p->t[p->n++];
    memset(k, 0, sizeof *k);
    k->t = t;
    k->line = line;
    return k;
}

static void put_utf8(char *o, size_t *n, uint32_t c)
{
    if (c < 0x80) {
        o[(*n)++] = (char)c;
    } else if (c < 0x800) {
        o[(*n)++] = (char)(0xC0 | (c >> 6));
        o[(*n)++] = (char)(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        o[(*n)++] = (char)(0xE0 | (c >> 12));
        o[(*n)++] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[(*n)++] = (char)(0x80 | (c & 0x3F));
    } else {
        o[(*n)++] = (char)(0xF0 | (c >> 18));
        o[(*n)++] = (char)(0x80 | ((c >> 12) & 0x3F));
        o[(*n)++] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[(*n)++] = (char)(0x80 | (c & 0x3F));
    }
}

static int hexval(char c)
{
    if (is_digit(c))
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A quoted literal from src[*i] (the quote); Python's escapes. */
static int lex_string(parser *p, const char *src, size_t len, size_t *i, int line)
{
    char q = src[*i];
    size_t j = *i + 1;
    while (j < len && src[j] != q) {
        if (src[j] == '\\' && j + 1 < len)
            j++;
        j++;
    }
    if (j >= len)
        return fail(p, line, "unterminated string literal");
    char *o = jarena_alloc(p->a, j - *i + 1);
    if (!o)
        return fail(p, line, "out of memory");
    size_t n = 0;
    for (size_t k = *i + 1; k < j; k++) {
        char c = src[k];
        if (c != '\\') {
            o[n++] = c;
            continue;
        }
        char e = src[++k];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t cp = 0;
            int ok = k + (size_t)digits < j;
            for (int d = 1; ok && d <= digits; d++) {
                int h = hexval(src[k + (size_t)d]);
                ok = h >= 0;
                cp = cp * 16 + (uint32_t)(h < 0 ? 0 : h);
            }
            if (!ok || cp > 0x10FFFF)
                return fail(p, line, "bad \\%c escape in a string literal", e);
            k += (size_t)digits;
            /* \xhh and \u never take more bytes than their own text */
            put_utf8(o, &n, cp);
            continue;
        }
        if (e >= '0' && e <= '7') {
            uint32_t cp = 0;
            int d = 0;
            while (d < 3 && k < j && src[k] >= '0' && src[k] <= '7')
                cp = cp * 8 + (uint32_t)(src[k++] - '0'), d++;
            k--;
            put_utf8(o, &n, cp);
            continue;
        }
        switch (e) {
        case 'n': o[n++] = '\n'; break;
        case 't': o[n++] = '\t'; break;
        case 'r': o[n++] = '\r'; break;
        case 'a': o[n++] = '\a'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'v': o[n++] = '\v'; break;
        case '\\':
        case '\'':
        case '"': o[n++] = e; break;
        case '\n': break;
        default:
            o[n++] = '\\';
            o[n++] = e;
            break;
        }
    }
    tok *t = push(p, T_STR, line);
    if (!t)
        return 0;
    t->s = o;
    t->n = n;
    *i = j + 1;
    return 1;
}

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">="};
static const char ops1[] = "+-/*%~<>=()[]{},.:|";

/* Tokens of one {{ }} or {% %} from src[*i] up to its end marker. */
static int lex_tag(parser *p, const char *src, size_t len, size_t *i, int *line, int block)
{
    const char *end = block ? "%}" : "}}";
    size_t k = *i;
    for (;;) {
        while (k < len && is_ws(src[k])) {
            if (src[k] == '\n')
                (*line)++;
            k++;
        }
        if (k >= len)
            return fail(p, *line, "unclosed %s", block ? "'{%' tag" : "'{{' expression");
        int sign = src[k] == '-' || (block && src[k] == '+');
        if (!strncmp(src + k + (size_t)sign, end, 2)) {
            if (!push(p, block ? T_BLOCK_END : T_VAR_END, *line))
                return 0;
            char sc = sign ? src[k] : 0;
            k += (size_t)sign + 2;
            int ate_nl = 0;
            if (sc == '-') {
                while (k < len && is_ws(src[k])) {
                    ate_nl = src[k] == '\n';
                    *line += ate_nl;
                    k++;
                }
            } else if (block && !sc && k < len && src[k] == '\n') { /* trim_blocks */
                (*line)++;
                k++;
                ate_nl = 1;
            }
            *i = k;
            return ate_nl ? 2 : 1;
        }
        char c = src[k];
        if (c == '\'' || c == '"') {
            if (!lex_string(p, src, len, &k, *line))
                return 0;
        } else if (is_alpha(c)) {
            size_t j = k;
            while (j < len && (is_alpha(src[j]) || is_digit(src[j])))
                j++;
            tok *t = push(p, T_NAME, *line);
            if (!t)
                return 0;
            t->s = src + k;
            t->n = j - k;
            k = j;
        } else if (is_digit(c)) {
            size_t j = k;
            while (j < len && is_digit(src[j]))
                j++;
            int flt = 0;
            if (j + 1 < len && src[j] == '.' && is_digit(src[j + 1])) {
                flt = 1;
                for (j++; j < len && is_digit(src[j]);)
                    j++;
            }
            if (j < len && (src[j] == 'e' || src[j] == 'E')) {
                size_t e = j + 1;
                if (e < len && (src[e] == '+' || src[e] == '-'))
                    e++;
                if (e < len && is_digit(src[e])) {
                    flt = 1;
                    for (j = e; j < len && is_digit(src[j]);)
                        j++;
                }
            }
            char num[64];
            if (j - k >= sizeof num)
                return fail(p, *line, "number literal too long");
            memcpy(num, src + k, j - k);
            num[j - k] = '\0';
            tok *t = push(p, flt ? T_FLOAT : T_INT, *line);
            if (!t)
                return 0;
            if (flt) {
                t->f = strtod(num, NULL);
            } else {
                char *e;
                unsigned long long v = strtoull(num, &e, 10);
                if (v > INT64_MAX || j - k > 19)
                    return fail(p, *line, "integer literal %s is too large", num);
                t->i = (int64_t)v;
            }
            k = j;
        } else {
            size_t n = 0;
            for (size_t o = 0; o < sizeof ops2 / sizeof *ops2; o++)
                if (k + 1 < len && !strncmp(src + k, ops2[o], 2))
                    n = 2;
            if (!n && strchr(ops1, c) && c)
                n = 1;
            if (!n)
                return fail(p, *line, "unexpected character '%c' (0x%02x) in a tag", c >= 32 && c < 127 ? c : '?',
                            (unsigned char)c);
            tok *t = push(p, T_OP, *line);
            if (!t)
                return 0;
            t->s = src + k;
            t->n = n;
            k += n;
        }
    }
}

static int emit_text(parser *p, const char *s, size_t n, int line)
{
    if (!n)
        return 1;
    tok *t = push(p, T_TEXT, line);
    if (!t)
        return 0;
    t->s = s;
    t->n = n;
    return 1;
}

static int count_nl(const char *s, size_t n)
{
    int c = 0;
    for (size_t i = 0; i < n; i++)
        c += s[i] == '\n';
    return c;
}

static int lex(parser *p, const char *src, size_t len)
{
    size_t pos = 0;
    int line = 1, line_starting = 1;
    while (pos <= len) {
        size_t i = pos;
        while (i + 1 < len && !(src[i] == '{' && (src[i + 1] == '{' || src[i + 1] == '%' || src[i + 1] == '#')))
            i++;
        if (i + 1 >= len) {
            if (!emit_text(p, src + pos, len - pos, line))
                return 0;
            break;
        }
        size_t tn = i - pos;
        char kind = src[i + 1], sign = i + 2 < len ? src[i + 2] : 0;
        if (sign == '-') {
            while (tn && is_ws(src[pos + tn - 1]))
                tn--;
        } else if (sign != '+' && kind != '{') { /* lstrip_blocks */
            size_t l = tn;
            while (l && src[pos + l - 1] != '\n')
                l--;
            if (l > 0 || line_starting) {
                size_t k = l;
                while (k < tn && is_ws(src[pos + k]))
                    k++;
                if (k == tn)
                    tn = l;
            }
        }
        if (!emit_text(p, src + pos, tn, line))
            return 0;
        line += count_nl(src + pos, i - pos);
        size_t k = i + 2 + (sign == '-' || sign == '+');
        if (kind == '#') {
            size_t e = k;
            while (e + 1 < len && !(src[e] == '#' && src[e + 1] == '}'))
                e++;
            if (e + 1 >= len)
                return fail(p, line, "unclosed comment '{#'");
            line += count_nl(src + k, e - k);
            int strip = e > k && src[e - 1] == '-';
            k = e + 2;
            line_starting = 0;
            if (strip) {
                while (k < len && is_ws(src[k])) {
                    line_starting = src[k] == '\n';
                    line += line_starting;
                    k++;
                }
            } else if (k < len && src[k] == '\n') {
                line++;
                k++;
                line_starting = 1;
            }
            pos = k;
            continue;
        }
        if (!push(p, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, line))
            return 0;
        int r = lex_tag(p, src, len, &k, &line, kind == '%');
        if (!r)
            return 0;
        line_starting = r == 2;
        pos = k;
        if (pos == len)
            break;
    }
    return push(p, T_EOF, line) != NULL;
}

/* ---- parser ------------------------------------------------------------- */

static tok *peek(parser *p) { return &p->t[p->pos]; }
static tok *peek2(parser *p) { return &p->t[p->pos + 1 < p->n ? p->pos + 1 : p->pos]; }
static tok *next(parser *p) { return &p->t[p->pos < p->n - 1 ? p->pos++ : p->pos]; }

static int is_op(const tok *t, const char *op) { return t->t == T_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n); }
static int is_name(const tok *t, const char *nm)
{
    return t->t == T_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n);
}

static const char *describe(const tok *t, char *buf, size_t cap)
{
    switch (t->t) {
    case T_TEXT: return "template text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_STR: return "a string";
    case T_INT:
    case T_FLOAT: return "a number";
    case T_EOF: return "the end of the template";
    default: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    }
}

static int expect_op(parser *p, const char *op)
{
    tok *t = next(p);
    if (is_op(t, op))
        return 1;
    char b[64];
    return fail(p, t->line, "expected '%s', found %s", op, describe(t, b, sizeof b));
}

static jnode *mk(parser *p, jnode_kind k, int line, size_t n_kids)
{
    jnode *nd = jarena_alloc(p->a, sizeof *nd);
    if (nd && n_kids)
        nd->kids = jarena_alloc(p->a, n_kids * sizeof *nd->kids);
    if (!nd || (n_kids && !nd->kids)) {
        fail(p, line, "out of memory");
        return NULL;
    }
    nd->kind = k;
    nd->line = line;
    nd->n_kids = n_kids;
    return nd;
}

/* A growable list of child nodes (and keyword names) during parsing. */
typedef struct kids {
    jnode **v;
    const char **names;
    size_t n, cap;
} kids;

static int kids_add(parser *p, kids *k, jnode *nd, const char *name, int line)
{
    if (k->n == k->cap) {
        size_t cap = k->cap ? k->cap * 2 : 8;
        jnode **v = jarena_alloc(p->a, cap * sizeof *v);
        const char **nm = jarena_alloc(p->a, cap * sizeof *nm);
        if (!v || !nm)
            return fail(p, line, "out of memory");
        if (k->n) {
            memcpy(v, k->v, k->n * sizeof *v);
            memcpy(nm, k->names, k->n * sizeof *nm);
        }
        k->v = v;
        k->names = nm;
        k->cap = cap;
    }
    k->v[k->n] = nd;
    k->names[k->n++] = name;
    return 1;
}

static jnode *mk_from(parser *p, jnode_kind kind, int line, kids *k, int keep_names)
{
    jnode *nd = mk(p, kind, line, 0);
    if (!nd)
        return NULL;
    nd->kids = k->v;
    nd->n_kids = k->n;
    if (keep_names) {
        nd->names = k->names;
        nd->n_names = k->n;
    }
    return nd;
}

static const char *name_dup(parser *p, const tok *t)
{
    char *s = jarena_alloc(p->a, t->n + 1);
    if (!s) {
        fail(p, t->line, "out of memory");
        return NULL;
    }
    memcpy(s, t->s, t->n);
    return s;
}

static jnode *expr(parser *p);
static jnode *unary(parser *p, int with_filter);

static int enter(parser *p, int line)
{
    if (++p->depth > J_MAX_NEST)
        return fail(p, line, "nested more than %d deep", J_MAX_NEST);
    return 1;
}

/* Arguments of a call, filter or test after its '(' up to ')'. */
static int call_args(parser *p, kids *k)
{
    while (!is_op(peek(p), ")")) {
        const char *kw = NULL;
        if (peek(p)->t == T_NAME && is_op(peek2(p), "=")) {
            if (!(kw = name_dup(p, next(p))))
                return 0;
            next(p);
        }
        jnode *a = expr(p);
        if (!a || !kids_add(p, k, a, kw, a->line))
            return 0;
        if (!is_op(peek(p), ")") && !expect_op(p, ","))
            return 0;
    }
    next(p);
    return 1;
}

static jnode *primary(parser *p)
{
    tok *t = next(p);
    char b[64];
    if (!enter(p, t->line))
        return NULL;
    jnode *nd = NULL;
    if (t->t == T_STR || t->t == T_INT || t->t == T_FLOAT) {
        if (!(nd = mk(p, E_LIT, t->line, 0)))
            return NULL;
        nd->lit = t->t == T_STR ? jv_str(t->s, t->n) : t->t == T_INT ? jv_int(t->i) : (jv){.t = JV_FLOAT, .u.f = t->f};
        /* adjacent string literals concatenate, as in Python */
        while (nd->lit.t == JV_STR && peek(p)->t == T_STR) {
            tok *u = next(p);
            char *s = jarena_alloc(p->a, nd->lit.u.s.n + u->n + 1);
            if (!s) {
                fail(p, u->line, "out of memory");
                return NULL;
            }
            memcpy(s, nd->lit.u.s.p, nd->lit.u.s.n);
            memcpy(s + nd->lit.u.s.n, u->s, u->n);
            nd->lit = jv_str(s, nd->lit.u.s.n + u->n);
        }
    } else if (t->t == T_NAME) {
        if (!(nd = mk(p, E_LIT, t->line, 0)))
            return NULL;
        if (is_name(t, "true") || is_name(t, "True"))
            nd->lit = jv_bool(1);
        else if (is_name(t, "false") || is_name(t, "False"))
            nd->lit = jv_bool(0);
        else if (is_name(t, "none") || is_name(t, "None"))
            nd->lit.t = JV_NONE;
        else {
            nd->kind = E_NAME;
            nd->s = t->s;
            nd->n = t->n;
        }
    } else if (is_op(t, "(")) {
        jnode *e = expr(p);
        if (!e)
            return NULL;
        if (is_op(peek(p), ",")) { /* a tuple: a list here */
            kids k = {0};
            if (!kids_add(p, &k, e, NULL, t->line))
                return NULL;
            while (is_op(peek(p), ",")) {
                next(p);
                if (is_op(peek(p), ")"))
                    break;
                jnode *x = expr(p);
                if (!x || !kids_add(p, &k, x, NULL, x->line))
                    return NULL;
            }
            if ((e = mk_from(p, E_LIST, t->line, &k, 0)))
                e->op = 1;
        }
        if (!e || !expect_op(p, ")"))
            return NULL;
        nd = e;
    } else if (is_op(t, "[")) {
        kids k = {0};
        while (!is_op(peek(p), "]")) {
            jnode *x = expr(p);
            if (!x || !kids_add(p, &k, x, NULL, x->line))
                return NULL;
            if (!is_op(peek(p), "]") && !expect_op(p, ","))
                return NULL;
        }
        next(p);
        nd = mk_from(p, E_LIST, t->line, &k, 0);
    } else if (is_op(t, "{")) {
        kids k = {0};
        while (!is_op(peek(p), "}")) {
            jnode *key = expr(p);
            if (!key || !expect_op(p, ":"))
                return NULL;
            jnode *v = expr(p);
            if (!v || !kids_add(p, &k, key, NULL, key->line) || !kids_add(p, &k, v, NULL, v->line))
                return NULL;
            if (!is_op(peek(p), "}") && !expect_op(p, ","))
                return NULL;
        }
        next(p);
        nd = mk_from(p, E_DICT, t->line, &k, 0);
    } else {
        fail(p, t->line, "expected an expression, found %s", describe(t, b, sizeof b));
    }
    p->depth--;
    return nd;
}

/* Subscript after '[': an index or a slice a:b:c. */
static jnode *subscript(parser *p, jnode *obj, int line)
{
    jnode *part[3] = {NULL, NULL, NULL};
    int slice = 0;
    for (int i = 0; i < 3; i++) {
        if (!is_op(peek(p), ":") && !is_op(peek(p), "]"))
            if (!(part[i] = expr(p)))
                return NULL;
        if (i < 2 && is_op(peek(p), ":")) {
            next(p);
            slice = 1;
            continue;
        }
        break;
    }
    if (!expect_op(p, "]"))
        return NULL;
    if (!slice && !part[0]) {
        fail(p, line, "empty subscript '[]'");
        return NULL;
    }
    jnode *nd = mk(p, slice ? E_SLICE : E_ITEM, line, slice ? 4 : 2);
    if (!nd)
        return NULL;
    nd->kids[0] = obj;
    for (int i = 0; i < (slice ? 3 : 1); i++)
        nd->kids[1 + i] = part[i];
    return nd;
}

static jnode *postfix(parser *p, jnode *nd)
{
    while (nd) {
        tok *t = peek(p);
        if (is_op(t, ".")) {
            next(p);
            tok *nm = next(p);
            if (nm->t != T_NAME && nm->t != T_INT) {
                char b[64];
                fail(p, nm->line, "expected an attribute name after '.', found %s", describe(nm, b, sizeof b));
                return NULL;
            }
            jnode *a = mk(p, nm->t == T_INT ? E_ITEM : E_ATTR, t->line, nm->t == T_INT ? 2 : 1);
            if (!a)
                return NULL;
            a->kids[0] = nd;
            if (nm->t == T_INT) {
                if (!(a->kids[1] = mk(p, E_LIT, t->line, 0)))
                    return NULL;
                a->kids[1]->lit = jv_int(nm->i);
            } else {
                a->s = nm->s;
                a->n = nm->n;
            }
            nd = a;
        } else if (is_op(t, "[")) {
            next(p);
            nd = subscript(p, nd, t->line);
        } else if (is_op(t, "(")) {
            next(p);
            kids k = {0};
            if (!kids_add(p, &k, nd, NULL, t->line) || !call_args(p, &k))
                return NULL;
            nd = mk_from(p, E_CALL, t->line, &k, 1);
        } else {
            break;
        }
    }
    return nd;
}

/* `| name(args)` filters and `is [not] name args` tests, left to right. */
static jnode *filters(parser *p, jnode *nd)
{
    while (nd) {
        tok *t = peek(p);
        if (is_op(t, "|")) {
            next(p);
            tok *nm = next(p);
            if (nm->t != T_NAME) {
                fail(p, nm->line, "expected a filter name after '|'");
                return NULL;
            }
            if (!kiln_jinja_has_filter(nm->s, nm->n)) {
                fail(p, nm->line, "unsupported filter '%.*s'", (int)nm->n, nm->s);
                return NULL;
            }
            kids k = {0};
            if (!kids_add(p, &k, nd, NULL, t->line))
                return NULL;
            if (is_op(peek(p), "(")) {
                next(p);
                if (!call_args(p, &k))
                    return NULL;
            }
            if (!(nd = mk_from(p, E_FILTER, nm->line, &k, 1)))
                return NULL;
            nd->s = nm->s;
            nd->n = nm->n;
        } else if (is_name(t, "is")) {
            next(p);
            int neg = 0;
            if (is_name(peek(p), "not")) {
                next(p);
                neg = 1;
            }
            tok *nm = next(p);
            if (nm->t != T_NAME && !(nm->t == T_NAME)) {
                fail(p, nm->line, "expected a test name after 'is'");
                return NULL;
            }
            if (!kiln_jinja_has_test(nm->s, nm->n)) {
                fail(p, nm->line, "unsupported test '%.*s'", (int)nm->n, nm->s);
                return NULL;
            }
            kids k = {0};
            if (!kids_add(p, &k, nd, NULL, t->line))
                return NULL;
            tok *a = peek(p);
            if (is_op(a, "(")) {
                next(p);
                if (!call_args(p, &k))
                    return NULL;
            } else if (a->t == T_STR || a->t == T_INT || a->t == T_FLOAT || is_op(a, "[") || is_op(a, "{") ||
                       (a->t == T_NAME && !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and") &&
                        !is_name(a, "if") && !is_name(a, "is") && !is_name(a, "in") && !is_name(a, "not"))) {
                jnode *arg = postfix(p, primary(p));
                if (!arg || !kids_add(p, &k, arg, NULL, arg->line))
                    return NULL;
            }
            if (!(nd = mk_from(p, E_TEST, nm->line, &k, 0)))
                return NULL;
            nd->s = nm->s;
            nd->n = nm->n;
            nd->op = neg;
        } else {
            break;
        }
    }
    return nd;
}

static jnode *unary(parser *p, int with_filter)
{
    tok *t = peek(p);
    jnode *nd;
    if (is_op(t, "-") || is_op(t, "+")) {
        next(p);
        if (!enter(p, t->line))
            return NULL;
        jnode *x = unary(p, 0);
        p->depth--;
        if (!x || !(nd = mk(p, is_op(t, "-") ? E_NEG : E_POS, t->line, 1)))
            return NULL;
        nd->kids[0] = x;
    } else {
        nd = postfix(p, primary(p));
    }
    return with_filter ? filters(p, nd) : nd;
}

static jnode *bin(parser *p, int op, int line, jnode *l, jnode *r)
{
    if (!l || !r)
        return NULL;
    jnode *nd = mk(p, E_BIN, line, 2);
    if (!nd)
        return NULL;
    nd->op = op;
    nd->kids[0] = l;
    nd->kids[1] = r;
    return nd;
}

static jnode *power(parser *p)
{
    jnode *l = unary(p, 1);
    while (l && is_op(peek(p), "**")) {
        int line = next(p)->line;
        l = bin(p, J_OP_POW, line, l, unary(p, 1));
    }
    return l;
}

static jnode *math2(parser *p)
{
    jnode *l = power(p);
    for (;;) {
        tok *t = peek(p);
        int op = is_op(t, "*")    ? J_OP_MUL
                 : is_op(t, "/")  ? J_OP_DIV
                 : is_op(t, "//") ? J_OP_FLOORDIV
                 : is_op(t, "%")  ? J_OP_MOD
                                  : 0;
        if (!l || !op)
            return l;
        next(p);
        l = bin(p, op, t->line, l, power(p));
    }
}

static jnode *concat(parser *p)
{
    jnode *l = math2(p);
    while (l && is_op(peek(p), "~")) {
        int line = next(p)->line;
        l = bin(p, J_OP_CONCAT, line, l, math2(p));
    }
    return l;
}

static jnode *math1(parser *p)
{
    jnode *l = concat(p);
    for (;;) {
        tok *t = peek(p);
        int op = is_op(t, "+") ? J_OP_ADD : is_op(t, "-") ? J_OP_SUB : 0;
        if (!l || !op)
            return l;
        next(p);
        l = bin(p, op, t->line, l, concat(p));
    }
}

static int cmp_op(parser *p)
{
    tok *t = peek(p);
    return is_op(t, "==")                                   ? J_OP_EQ
           : is_op(t, "!=")                                 ? J_OP_NE
           : is_op(t, "<")                                  ? J_OP_LT
           : is_op(t, "<=")                                 ? J_OP_LE
           : is_op(t, ">")                                  ? J_OP_GT
           : is_op(t, ">=")                                 ? J_OP_GE
           : is_name(t, "in")                               ? J_OP_IN
           : (is_name(t, "not") && is_name(peek2(p), "in")) ? J_OP_NOTIN
                                                            : 0;
}

/* Comparisons; a chain a < b < c is (a < b) and (b < c), as in Python
 * (b evaluated twice, which is harmless: expressions have no effects). */
static jnode *compare(parser *p)
{
    jnode *l = math1(p), *chain = NULL;
    int op;
    while (l && (op = cmp_op(p))) {
        int line = next(p)->line;
        if (op == J_OP_NOTIN)
            next(p);
        jnode *r = math1(p), *c = bin(p, op, line, l, r);
        if (!c)
            return NULL;
        if (chain) {
            jnode *a = mk(p, E_AND, line, 2);
            if (!a)
                return NULL;
            a->kids[0] = chain;
            a->kids[1] = c;
            c = a;
        }
        chain = c;
        l = r;
    }
    return chain ? chain : l;
}

static jnode *not_(parser *p)
{
    tok *t = peek(p);
    if (!is_name(t, "not"))
        return compare(p);
    next(p);
    if (!enter(p, t->line))
        return NULL;
    jnode *x = not_(p), *nd = NULL;
    p->depth--;
    if (x && (nd = mk(p, E_NOT, t->line, 1)))
        nd->kids[0] = x;
    return nd;
}

static jnode *logic(parser *p, int is_or)
{
    jnode *l = is_or ? logic(p, 0) : not_(p);
    while (l && is_name(peek(p), is_or ? "or" : "and")) {
        int line = next(p)->line;
        jnode *r = is_or ? logic(p, 0) : not_(p), *nd;
        if (!r || !(nd = mk(p, is_or ? E_OR : E_AND, line, 2)))
            return NULL;
        nd->kids[0] = l;
        nd->kids[1] = r;
        l = nd;
    }
    return l;
}

/* Full expression: `a if cond else b` over or/and/not/compare/... */
static jnode *expr_cond(parser *p, int with_cond)
{
    tok *t = peek(p);
    if (!enter(p, t->line))
        return NULL;
    jnode *nd = logic(p, 1);
    while (with_cond && nd && is_name(peek(p), "if")) {
        int line = next(p)->line;
        jnode *c = logic(p, 1), *e = NULL;
        if (!c)
            return NULL;
        if (is_name(peek(p), "else")) {
            next(p);
            if (!(e = logic(p, 1)))
                return NULL;
        }
        jnode *x = mk(p, E_COND, line, 3);
        if (!x)
            return NULL;
        x->kids[0] = c;
        x->kids[1] = nd;
        x->kids[2] = e;
        nd = x;
    }
    p->depth--;
    return nd;
}

static jnode *expr(parser *p) { return expr_cond(p, 1); }

/* ---- statements --------------------------------------------------------- */

static int expect_block_end(parser *p, const char *what)
{
    tok *t = next(p);
    if (t->t == T_BLOCK_END)
        return 1;
    char b[64];
    return fail(p, t->line, "expected '%%}' to end '%s', found %s", what, describe(t, b, sizeof b));
}

/* Statements up to a {% tag %} whose name is one of `ends` (NULL-terminated;
 * none: to the end of the template); *end gets that tag's token. */
static jnode *body(parser *p, const char *const *ends, const char *opener, int open_line, tok **end);

static int target_names(parser *p, kids *k, const char *what)
{
    do {
        tok *nm = next(p);
        if (nm->t != T_NAME)
            return fail(p, nm->line, "expected a variable name in '%s'", what);
        const char *s = name_dup(p, nm);
        if (!s || !kids_add(p, k, NULL, s, nm->line))
            return 0;
    } while (is_op(peek(p), ",") && next(p));
    return 1;
}

static jnode *stmt_if(parser *p, int line)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    kids k = {0};
    jnode *c = expr(p);
    if (!c || !expect_block_end(p, "if"))
        return NULL;
    for (;;) {
        tok *end;
        jnode *b = body(p, ends, "if", line, &end);
        if (!b || !kids_add(p, &k, c, NULL, line) || !kids_add(p, &k, b, NULL, line))
            return NULL;
        if (is_name(end, "endif"))
            break;
        if (is_name(end, "else")) {
            static const char *const endif[] = {"endif", NULL};
            if (!expect_block_end(p, "else"))
                return NULL;
            if (!(b = body(p, endif, "if", line, &end)) || !kids_add(p, &k, NULL, NULL, line) ||
                !kids_add(p, &k, b, NULL, line))
                return NULL;
            break;
        }
        if (!(c = expr(p)) || !expect_block_end(p, "elif"))
            return NULL;
    }
    return expect_block_end(p, "endif") ? mk_from(p, N_IF, line, &k, 0) : NULL;
}

static jnode *stmt_for(parser *p, int line)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    kids names = {0};
    if (!target_names(p, &names, "for"))
        return NULL;
    tok *in = next(p);
    if (!is_name(in, "in")) {
        fail(p, in->line, "expected 'in' in 'for'");
        return NULL;
    }
    jnode *nd = mk(p, N_FOR, line, 4);
    if (!nd || !(nd->kids[0] = expr_cond(p, 0)))
        return NULL;
    if (is_name(peek(p), "if")) {
        next(p);
        if (!(nd->kids[2] = expr_cond(p, 0)))
            return NULL;
    }
    if (is_name(peek(p), "recursive")) {
        fail(p, peek(p)->line, "unsupported: recursive for loops");
        return NULL;
    }
    tok *end;
    if (!expect_block_end(p, "for") || !(nd->kids[1] = body(p, ends, "for", line, &end)))
        return NULL;
    if (is_name(end, "else") && (!expect_block_end(p, "else") || !(nd->kids[3] = body(p, endfor, "for", line, &end))))
        return NULL;
    if (!expect_block_end(p, "endfor"))
        return NULL;
    nd->names = names.names;
    nd->n_names = names.n;
    return nd;
}

static jnode *stmt_set(parser *p, int line)
{
    kids names = {0};
    jnode *nd = mk(p, N_SET, line, 1);
    if (!nd)
        return NULL;
    if (peek(p)->t == T_NAME && is_op(peek2(p), ".")) {
        const char *ns = name_dup(p, next(p));
        next(p);
        tok *attr = next(p);
        if (!ns || attr->t != T_NAME) {
            fail(p, attr->line, "expected an attribute name in 'set %s.'", ns ? ns : "");
            return NULL;
        }
        const char *a = name_dup(p, attr);
        if (!a || !kids_add(p, &names, NULL, ns, line) || !kids_add(p, &names, NULL, a, line))
            return NULL;
        nd->op = 1;
    } else if (!target_names(p, &names, "set")) {
        return NULL;
    }
    nd->names = names.names;
    nd->n_names = names.n;
    if (peek(p)->t == T_BLOCK_END && names.n == 1) {
        static const char *const endset[] = {"endset", NULL};
        tok *end;
        next(p);
        nd->op = 2;
        if (!(nd->kids[0] = body(p, endset, "set", line, &end)) || !expect_block_end(p, "endset"))
            return NULL;
        return nd;
    }
    if (!expect_op(p, "=") || !(nd->kids[0] = expr(p)))
        return NULL;
    if (is_op(peek(p), ",")) { /* set a = x, y: a tuple */
        kids k = {0};
        if (!kids_add(p, &k, nd->kids[0], NULL, line))
            return NULL;
        while (is_op(peek(p), ",")) {
            next(p);
            jnode *x = expr(p);
            if (!x || !kids_add(p, &k, x, NULL, line))
                return NULL;
        }
        if (!(nd->kids[0] = mk_from(p, E_LIST, line, &k, 0)))
            return NULL;
    }
    return expect_block_end(p, "set") ? nd : NULL;
}

static jnode *statement(parser *p, tok *name)
{
    int line = name->line;
    if (is_name(name, "if"))
        return stmt_if(p, line);
    if (is_name(name, "for"))
        return stmt_for(p, line);
    if (is_name(name, "set"))
        return stmt_set(p, line);
    if (is_name(name, "break") || is_name(name, "continue")) {
        jnode *nd = mk(p, is_name(name, "break") ? N_BREAK : N_CONTINUE, line, 0);
        return nd && expect_block_end(p, is_name(name, "break") ? "break" : "continue") ? nd : NULL;
    }
    if (is_name(name, "generation")) { /* transformers' assistant-mask marker: renders its body */
        static const char *const end[] = {"endgeneration", NULL};
        tok *e;
        jnode *b;
        if (!expect_block_end(p, "generation") || !(b = body(p, end, "generation", line, &e)) ||
            !expect_block_end(p, "endgeneration"))
            return NULL;
        return b;
    }
    fail(p, line, "unsupported tag '%.*s'", (int)name->n, name->s);
    return NULL;
}

static jnode *body(parser *p, const char *const *ends, const char *opener, int open_line, tok **end)
{
    kids k = {0};
    int line = peek(p)->line;
    if (!enter(p, line))
        return NULL;
    for (;;) {
        tok *t = next(p);
        jnode *nd = NULL;
        if (t->t == T_EOF) {
            if (ends) {
                const char *closer = ends[0];
                for (size_t i = 0; ends[i]; i++)
                    if (!strncmp(ends[i], "end", 3))
                        closer = ends[i];
                fail(p, t->line, "'%s' opened at line %d is never closed (expected '{%% %s %%}')", opener, open_line,
                     closer);
                return NULL;
            }
            break;
        }
        if (t->t == T_TEXT) {
            if (!(nd = mk(p, N_TEXT, t->line, 0)))
                return NULL;
            nd->s = t->s;
            nd->n = t->n;
        } else if (t->t == T_VAR_BEGIN) {
            if (!(nd = mk(p, N_OUTPUT, t->line, 1)) || !(nd->kids[0] = expr(p)))
                return NULL;
            tok *e = next(p);
            if (e->t != T_VAR_END) {
                char b[64];
                fail(p, e->line, "expected '}}', found %s", describe(e, b, sizeof b));
                return NULL;
            }
        } else if (t->t == T_BLOCK_BEGIN) {
            tok *name = next(p);
            if (name->t != T_NAME) {
                fail(p, name->line, "expected a tag name after '{%%'");
                return NULL;
            }
            for (size_t i = 0; ends && ends[i]; i++)
                if (is_name(name, ends[i])) {
                    *end = name;
                    p->depth--;
                    return mk_from(p, N_BODY, line, &k, 0);
                }
            static const char *const closers[] = {"endif", "endfor", "elif", "else", "endset", "endgeneration", NULL};
            for (size_t i = 0; closers[i]; i++)
                if (is_name(name, closers[i])) {
                    if (ends)
                        fail(p, name->line, "unexpected '%s' inside '%s' opened at line %d", closers[i], opener,
                             open_line);
                    else
                        fail(p, name->line, "unexpected '%s' with no open block", closers[i]);
                    return NULL;
                }
            if (!(nd = statement(p, name)))
                return NULL;
        } else {
            char b[64];
            fail(p, t->line, "unexpected %s", describe(t, b, sizeof b));
            return NULL;
        }
        if (!kids_add(p, &k, nd, NULL, nd->line))
            return NULL;
    }
    p->depth--;
    return mk_from(p, N_BODY, line, &k, 0);
}

kiln_status kiln_jinja_parse(const char *src, size_t len, kiln_jinja **out)
{
    if (!src || !out)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_jinja_parse: src and out are required");
    kiln_jinja *t = calloc(1, sizeof *t);
    if (!t)
        return kiln_fail(KILN_ERROR_OUT_OF_MEMORY, "out of memory parsing a chat template");
    /* Jinja's newline handling: \r\n and \r become \n, and one trailing
     * newline is dropped (keep_trailing_newline is off). */
    char *s = jarena_alloc(&t->arena, len + 1);
    size_t n = 0;
    for (size_t i = 0; s && i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    parser p = {.a = &t->arena};
    if (!s)
        fail(&p, 1, "out of memory");
    else if (memchr(s, '\0', n))
        fail(&p, 1 + count_nl(s, (size_t)((const char *)memchr(s, '\0', n) - s)), "NUL byte in the template");
    else if (lex(&p, s, n))
        t->root = body(&p, NULL, NULL, 0, NULL);
    free(p.t);
    if (!t->root) {
        kiln_jinja_free(t);
        return kiln_fail(KILN_ERROR_FORMAT, "%s", p.err[0] ? p.err : "chat template: parse failed");
    }
    *out = t;
    return KILN_OK;
}

void kiln_jinja_free(kiln_jinja *t)
{
    if (!t)
        return;
    jarena_free(&t->arena);
    free(t);
}
