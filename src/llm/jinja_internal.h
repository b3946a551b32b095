/* Inside the Jinja interpreter (jinja.h): the arena, the syntax tree the
 * parser (jinja_parse.c) builds and the evaluator (jinja_eval.c) walks,
 * and the values (jinja_value.c). */
#ifndef KILN_LLM_JINJA_INTERNAL_H
#define KILN_LLM_JINJA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "llm/jinja.h"

/* ---- arena: everything of one parse or one render, freed at once ------ */

typedef struct jarena {
    struct jchunk *head;
    size_t used, limit; /* bytes handed out; 0 limit = none */
} jarena;

/* NULL when out of memory or past the limit. Zeroed. */
void *jarena_alloc(jarena *a, size_t n);
void jarena_free(jarena *a);

/* ---- values ------------------------------------------------------------ */

typedef enum {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_NS,   /* namespace(): a dict that `set ns.x = ...` writes */
    JV_LOOP, /* the `loop` of a for */
    JV_FUNC, /* a global function or a bound method, called by name */
} jtype;

typedef struct jv {
    jtype t;
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s; /* JV_STR, JV_FUNC (name) */
        struct jlist *l;
        struct jdict *d; /* JV_DICT, JV_NS */
        struct jloop *loop;
    } u;
    const struct jv *self; /* JV_FUNC: the bound object of a method, or NULL */
} jv;

typedef struct jlist {
    size_t n;
    jv *v;
    int tuple;
} jlist; /* tuple: prints as (a, b) */
typedef struct jdict {
    size_t n, cap;
    jv *k;
    jv *v;
} jdict; /* keys are strings; insertion order */
typedef struct jloop {
    int64_t index0, length;
    jv prev, next;
} jloop;

jv jv_str(const char *p, size_t n);
jv jv_int(int64_t i);
jv jv_bool(int b);
int jv_truthy(jv v);
/* Bytes of strings and values a render may scan (comparing, searching,
 * measuring): a few seconds of work at most, so a template that loops over
 * a large value fails with an error instead of running for hours. */
#define J_MAX_WORK ((uint64_t)128 << 20)
/* What visiting one element of a list or key of a dict counts as, in bytes. */
#define J_WORK_PER_ITEM 64
/* Python's ==. Adds the bytes it compares (J_WORK_PER_ITEM per element or key) to *work
 * and gives up (answering unequal) once *work passes J_MAX_WORK; the caller
 * turns that into an error. */
int jv_equal(jv a, jv b, uint64_t *work);
/* The dict value for a string key, or NULL. */
jv *jdict_get(const jdict *d, const char *k, size_t n);
/* Sets (or adds) a key; 0 on out of memory. */
int jdict_set(jarena *a, jdict *d, jv k, jv v);

/* Builds a value from JSON (strings copied into the arena). 0 on out of memory. */
int jv_from_json(jarena *a, const json_t *j, jv *out);

/* A growing string in the arena, with a byte cap; failed once it overflows. */
typedef struct jbuf {
    jarena *a;
    char *p;
    size_t n, cap, max;
    int failed; /* 1: out of memory, 2: past max */
} jbuf;
void jbuf_put(jbuf *b, const char *s, size_t n);
/* Inline so that the length of a literal folds: values are written in
 * many small pieces. */
static inline void jbuf_puts(jbuf *b, const char *s) { jbuf_put(b, s, __builtin_strlen(s)); }

/* str(v) as Python prints it (None, True, 1.5, ['a'], {'k': 1}). */
void jv_write_str(jbuf *b, jv v);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: none), sort_keys). 0 if v is not JSON-able. */
int jv_write_json(jbuf *b, jv v, int indent, int sort_keys, int depth);

/* ---- syntax tree ------------------------------------------------------- */

typedef enum {
    /* statements */
    N_BODY,   /* kids: statements */
    N_TEXT,   /* s */
    N_OUTPUT, /* kids[0]: expression */
    N_IF,     /* kids: cond, body, cond, body, ..., [NULL, else body] */
    N_FOR,    /* names: targets; kids: iter, body, filter-or-NULL, else-or-NULL */
    N_SET,    /* names: targets (or [ns, attr] with op 1); kids[0]: value or a body (op 2) */
    N_BREAK,
    N_CONTINUE,
    /* expressions */
    E_LIT,    /* lit */
    E_NAME,   /* s */
    E_LIST,   /* kids; op 1: a tuple */
    E_DICT,   /* kids: key, value, key, value, ... */
    E_ATTR,   /* kids[0] . s */
    E_ITEM,   /* kids[0] [ kids[1] ] */
    E_SLICE,  /* kids[0] [ kids[1] : kids[2] : kids[3] ], absent parts NULL */
    E_CALL,   /* kids[0](kids[1..]), names: keyword of each argument or NULL */
    E_FILTER, /* s: filter; kids[0] | s(kids[1..]) with names as E_CALL */
    E_TEST,   /* s: test; op: negated; kids[0] is s(kids[1..]) */
    E_NOT,
    E_NEG,
    E_POS,
    E_BIN, /* op: one of the J_OP_* below; kids[0], kids[1] */
    E_AND,
    E_OR,
    E_COND, /* kids[1] if kids[0] else kids[2] (kids[2] may be NULL) */
} jnode_kind;

enum {
    J_OP_ADD = 1,
    J_OP_SUB,
    J_OP_MUL,
    J_OP_DIV,
    J_OP_FLOORDIV,
    J_OP_MOD,
    J_OP_POW,
    J_OP_CONCAT,
    J_OP_EQ,
    J_OP_NE,
    J_OP_LT,
    J_OP_LE,
    J_OP_GT,
    J_OP_GE,
    J_OP_IN,
    J_OP_NOTIN
};

typedef struct jnode {
    jnode_kind kind;
    int line;
    int op;
    const char *s;
    size_t n;
    jv lit;
    struct jnode **kids;
    size_t n_kids;
    const char **names; /* N_FOR / N_SET targets; E_CALL / E_FILTER keywords */
    size_t n_names;
} jnode;

struct kiln_jinja {
    jarena arena;
    jnode *root;
};

/* Whether a filter / test / global function of that name exists (checked
 * at parse time so an unsupported one fails the build). */
int kiln_jinja_has_filter(const char *name, size_t n);
int kiln_jinja_has_test(const char *name, size_t n);

#endif
