/* Shape expressions: a hash-consed DAG of integer expressions over symbols.
 *
 * A symbol is one dynamic dim of one network input. Nodes are only appended
 * and every node's operands come before it, so evaluating all nodes in
 * index order is a valid schedule (kiln_expr_pool_eval).
 */
#ifndef KILN_CORE_EXPR_H
#define KILN_CORE_EXPR_H

#include <kiln/plugin.h>

/* Node kinds: the binary kiln_expr_op values, then these. */
#define KILN_EXPR_NODE_CONST ((int32_t)KILN_EXPR_OP_COUNT)
#define KILN_EXPR_NODE_SYMBOL ((int32_t)KILN_EXPR_OP_COUNT + 1)

typedef struct kiln_expr_node {
    int32_t kind;   /* kiln_expr_op, KILN_EXPR_NODE_CONST or _SYMBOL */
    kiln_expr a, b; /* operands of binary ops, else -1 */
    int64_t value;  /* constant value, or symbol index */
} kiln_expr_node;

/* The plugin ABI's kiln_expr_builder is this pool. */
struct kiln_expr_builder {
    kiln_expr_node *nodes;
    int32_t n, cap;
    int32_t *hash; /* open addressing table of node indices, -1 empty */
    int32_t hash_cap;
    int32_t failed; /* set when an allocation failed; every later call returns -1 */
};
typedef struct kiln_expr_builder kiln_expr_pool;

void kiln_expr_pool_init(kiln_expr_pool *p);
void kiln_expr_pool_free(kiln_expr_pool *p);
kiln_status kiln_expr_pool_copy(kiln_expr_pool *dst, const kiln_expr_pool *src);

/* Constructors return -1 on allocation failure or invalid operands.
 * kiln_expr_op folds constants and simplifies x+0, x*1, x*0 (to 0), x-0,
 * x/1, max/min of equal operands. The function is kiln_expr_operation
 * because plugin.h's enum typedef owns the identifier kiln_expr_op; the
 * function-like macro below keeps kiln_expr_op(p, op, a, b) working (a
 * macro only expands before '(', so the type name is untouched). */
kiln_expr kiln_expr_const(kiln_expr_pool *p, int64_t value);
kiln_expr kiln_expr_symbol(kiln_expr_pool *p, int32_t symbol);
kiln_expr kiln_expr_operation(kiln_expr_pool *p, kiln_expr_op op, kiln_expr a, kiln_expr b);
#define kiln_expr_op(p, op, a, b) kiln_expr_operation((p), (op), (a), (b))

/* Nonzero with *value when e is constant. */
int kiln_expr_is_const(const kiln_expr_pool *p, kiln_expr e, int64_t *value);

/* Evaluates every node into values[0..n) given symbol values. Returns
 * KILN_ERROR_SHAPE (with message) on division by zero or overflow. */
kiln_status kiln_expr_pool_eval(const kiln_expr_pool *p, const int64_t *symbols, int32_t n_symbols, int64_t *values);

/* Appends a readable form ("(s0*4096)") into buf; returns buf. */
char *kiln_expr_format(const kiln_expr_pool *p, kiln_expr e, char *buf, size_t size);

#endif
