/* Shape expressions: hash-consing, folding, simplification, evaluation. */
#include "test.h"

#include "core/error.h"
#include "core/expr.h"

static void test_hash_consing(void)
{
    kiln_expr_pool p;
    kiln_expr_pool_init(&p);
    kiln_expr s0 = kiln_expr_symbol(&p, 0), s1 = kiln_expr_symbol(&p, 1);
    CHECK(s0 >= 0 && s1 >= 0 && s0 != s1);
    CHECK(kiln_expr_symbol(&p, 0) == s0);
    kiln_expr c5 = kiln_expr_const(&p, 5);
    CHECK(kiln_expr_const(&p, 5) == c5);
    CHECK(kiln_expr_const(&p, 6) != c5);
    kiln_expr a = kiln_expr_op(&p, KILN_EXPR_ADD, s0, s1);
    CHECK(kiln_expr_op(&p, KILN_EXPR_ADD, s1, s0) == a); /* commutative */
    CHECK(kiln_expr_op(&p, KILN_EXPR_MUL, s1, s0) == kiln_expr_op(&p, KILN_EXPR_MUL, s0, s1));
    CHECK(kiln_expr_op(&p, KILN_EXPR_SUB, s0, s1) != kiln_expr_op(&p, KILN_EXPR_SUB, s1, s0));
    /* many distinct nodes survive table growth and stay unique */
    kiln_expr first = -1;
    for (int i = 0; i < 1000; i++) {
        kiln_expr e = kiln_expr_op(&p, KILN_EXPR_MUL, s0, kiln_expr_const(&p, 1000 + i));
        if (i == 0)
            first = e;
    }
    int32_t n = p.n;
    CHECK(kiln_expr_op(&p, KILN_EXPR_MUL, kiln_expr_const(&p, 1000), s0) == first);
    CHECK(p.n == n);
    /* every operand precedes its node */
    int order_ok = 1;
    for (int32_t i = 0; i < p.n; i++)
        if (p.nodes[i].kind < KILN_EXPR_OP_COUNT && (p.nodes[i].a >= i || p.nodes[i].b >= i))
            order_ok = 0;
    CHECK(order_ok);
    kiln_expr_pool_free(&p);
}

static int64_t folded(kiln_expr_pool *p, kiln_expr_op op, int64_t a, int64_t b)
{
    int64_t v = -12345;
    kiln_expr e = kiln_expr_op(p, op, kiln_expr_const(p, a), kiln_expr_const(p, b));
    CHECK(kiln_expr_is_const(p, e, &v));
    return v;
}

static void test_folding(void)
{
    kiln_expr_pool p;
    kiln_expr_pool_init(&p);
    CHECK(folded(&p, KILN_EXPR_ADD, 2, 3) == 5);
    CHECK(folded(&p, KILN_EXPR_SUB, 2, 3) == -1);
    CHECK(folded(&p, KILN_EXPR_MUL, -4, 3) == -12);
    /* floor and ceil, including negative operands */
    CHECK(folded(&p, KILN_EXPR_FLOOR_DIV, 7, 2) == 3);
    CHECK(folded(&p, KILN_EXPR_FLOOR_DIV, -7, 2) == -4);
    CHECK(folded(&p, KILN_EXPR_FLOOR_DIV, 7, -2) == -4);
    CHECK(folded(&p, KILN_EXPR_FLOOR_DIV, -7, -2) == 3);
    CHECK(folded(&p, KILN_EXPR_FLOOR_DIV, -8, 2) == -4);
    CHECK(folded(&p, KILN_EXPR_CEIL_DIV, 7, 2) == 4);
    CHECK(folded(&p, KILN_EXPR_CEIL_DIV, -7, 2) == -3);
    CHECK(folded(&p, KILN_EXPR_CEIL_DIV, 7, -2) == -3);
    CHECK(folded(&p, KILN_EXPR_CEIL_DIV, -7, -2) == 4);
    CHECK(folded(&p, KILN_EXPR_CEIL_DIV, 8, 2) == 4);
    CHECK(folded(&p, KILN_EXPR_MAX, -1, 4) == 4);
    CHECK(folded(&p, KILN_EXPR_MIN, -1, 4) == -1);
    /* invalid arithmetic is not folded: it stays a node and eval reports it */
    kiln_expr z = kiln_expr_op(&p, KILN_EXPR_FLOOR_DIV, kiln_expr_const(&p, 5), kiln_expr_const(&p, 0));
    CHECK(z >= 0 && !kiln_expr_is_const(&p, z, NULL));
    kiln_expr o = kiln_expr_op(&p, KILN_EXPR_ADD, kiln_expr_const(&p, INT64_MAX), kiln_expr_const(&p, 1));
    CHECK(o >= 0 && !kiln_expr_is_const(&p, o, NULL));
    kiln_expr_pool_free(&p);
}

static void test_simplification(void)
{
    kiln_expr_pool p;
    kiln_expr_pool_init(&p);
    kiln_expr s = kiln_expr_symbol(&p, 0);
    kiln_expr zero = kiln_expr_const(&p, 0), one = kiln_expr_const(&p, 1);
    int64_t v = -1;
    CHECK(kiln_expr_op(&p, KILN_EXPR_ADD, s, zero) == s);
    CHECK(kiln_expr_op(&p, KILN_EXPR_ADD, zero, s) == s);
    CHECK(kiln_expr_op(&p, KILN_EXPR_SUB, s, zero) == s);
    CHECK(kiln_expr_op(&p, KILN_EXPR_MUL, s, one) == s);
    CHECK(kiln_expr_op(&p, KILN_EXPR_MUL, one, s) == s);
    CHECK(kiln_expr_is_const(&p, kiln_expr_op(&p, KILN_EXPR_MUL, s, zero), &v) && v == 0);
    CHECK(kiln_expr_op(&p, KILN_EXPR_FLOOR_DIV, s, one) == s);
    CHECK(kiln_expr_op(&p, KILN_EXPR_CEIL_DIV, s, one) == s);
    CHECK(kiln_expr_op(&p, KILN_EXPR_MAX, s, s) == s);
    CHECK(kiln_expr_op(&p, KILN_EXPR_MIN, s, s) == s);
    v = -1;
    CHECK(kiln_expr_is_const(&p, kiln_expr_op(&p, KILN_EXPR_SUB, s, s), &v) && v == 0);
    /* nothing else is simplified away */
    CHECK(!kiln_expr_is_const(&p, kiln_expr_op(&p, KILN_EXPR_SUB, zero, s), NULL));
    CHECK(kiln_expr_op(&p, KILN_EXPR_FLOOR_DIV, s, s) != one);
    kiln_expr_pool_free(&p);
}

static void test_invalid_operands(void)
{
    kiln_expr_pool p;
    kiln_expr_pool_init(&p);
    kiln_expr s = kiln_expr_symbol(&p, 0);
    CHECK(kiln_expr_symbol(&p, -1) == -1);
    CHECK(kiln_expr_op(&p, KILN_EXPR_ADD, s, -1) == -1);
    CHECK(kiln_expr_op(&p, KILN_EXPR_ADD, -1, s) == -1);
    CHECK(kiln_expr_op(&p, KILN_EXPR_ADD, s, 99) == -1);
    CHECK(kiln_expr_op(&p, KILN_EXPR_OP_COUNT, s, s) == -1);
    CHECK(kiln_expr_op(&p, (kiln_expr_op)-1, s, s) == -1);
    CHECK(!kiln_expr_is_const(&p, -1, NULL) && !kiln_expr_is_const(&p, 99, NULL));
    kiln_expr_pool_free(&p);
}

static void test_eval(void)
{
    kiln_expr_pool p;
    kiln_expr_pool_init(&p);
    kiln_expr s0 = kiln_expr_symbol(&p, 0), s1 = kiln_expr_symbol(&p, 1);
    /* s0*4096 + ceil(s1/3) - floor(s1/-2) */
    kiln_expr e = kiln_expr_op(&p, KILN_EXPR_ADD, kiln_expr_op(&p, KILN_EXPR_MUL, s0, kiln_expr_const(&p, 4096)),
                               kiln_expr_op(&p, KILN_EXPR_CEIL_DIV, s1, kiln_expr_const(&p, 3)));
    e = kiln_expr_op(&p, KILN_EXPR_SUB, e, kiln_expr_op(&p, KILN_EXPR_FLOOR_DIV, s1, kiln_expr_const(&p, -2)));
    kiln_expr mx = kiln_expr_op(&p, KILN_EXPR_MAX, s0, s1);
    kiln_expr q = kiln_expr_op(&p, KILN_EXPR_FLOOR_DIV, s0, s1);
    int64_t *values = calloc((size_t)p.n, sizeof *values);
    int64_t sym[2] = {2, 7};
    CHECK_OK(kiln_expr_pool_eval(&p, sym, 2, values));
    /* 8192 + ceil(7/3)=3 - floor(-3.5)=-4 -> 8199 */
    CHECK(values[e] == 8199);
    CHECK(values[mx] == 7);
    CHECK(values[q] == 0);
    sym[0] = -7;
    sym[1] = 2;
    CHECK_OK(kiln_expr_pool_eval(&p, sym, 2, values));
    CHECK(values[q] == -4);
    /* division by zero */
    sym[1] = 0;
    CHECK_FAILS(kiln_expr_pool_eval(&p, sym, 2, values), KILN_ERROR_SHAPE, "division by zero");
    /* int64 overflow in s0*4096 */
    sym[0] = INT64_MAX / 1000;
    sym[1] = 1;
    CHECK_FAILS(kiln_expr_pool_eval(&p, sym, 2, values), KILN_ERROR_SHAPE, "overflow");
    /* too few symbol values */
    CHECK_FAILS(kiln_expr_pool_eval(&p, sym, 1, values), KILN_ERROR_SHAPE, "s1");
    free(values);

    /* INT64_MIN / -1 overflows */
    kiln_expr_pool_free(&p);
    kiln_expr_pool_init(&p);
    kiln_expr m = kiln_expr_op(&p, KILN_EXPR_FLOOR_DIV, kiln_expr_symbol(&p, 0), kiln_expr_const(&p, -1));
    int64_t vals[8];
    int64_t s = INT64_MIN;
    CHECK(m >= 0 && p.n <= 8);
    CHECK_FAILS(kiln_expr_pool_eval(&p, &s, 1, vals), KILN_ERROR_SHAPE, "overflow");
    s = -9;
    CHECK_OK(kiln_expr_pool_eval(&p, &s, 1, vals));
    CHECK(vals[m] == 9);
    kiln_expr_pool_free(&p);
}

static void test_format(void)
{
    kiln_expr_pool p;
    kiln_expr_pool_init(&p);
    kiln_expr s0 = kiln_expr_symbol(&p, 0);
    kiln_expr e = kiln_expr_op(&p, KILN_EXPR_MUL, s0, kiln_expr_const(&p, 4096));
    char buf[128];
    CHECK(strcmp(kiln_expr_format(&p, e, buf, sizeof buf), "(s0*4096)") == 0);
    kiln_expr c = kiln_expr_op(&p, KILN_EXPR_CEIL_DIV, kiln_expr_op(&p, KILN_EXPR_SUB, s0, kiln_expr_const(&p, 2)),
                               kiln_expr_const(&p, 3));
    CHECK(strcmp(kiln_expr_format(&p, c, buf, sizeof buf), "ceil((s0-2)/3)") == 0);
    kiln_expr mx = kiln_expr_op(&p, KILN_EXPR_MAX, s0, kiln_expr_symbol(&p, 1));
    CHECK(strcmp(kiln_expr_format(&p, mx, buf, sizeof buf), "max(s0, s1)") == 0);
    CHECK(strcmp(kiln_expr_format(&p, kiln_expr_const(&p, -3), buf, sizeof buf), "-3") == 0);
    char small[5];
    CHECK(strcmp(kiln_expr_format(&p, e, small, sizeof small), "(s0*") == 0);
    /* a DAG that doubles at every level formats in bounded time */
    kiln_expr d = s0;
    for (int i = 0; i < 200; i++)
        d = kiln_expr_op(&p, KILN_EXPR_SUB, d, kiln_expr_op(&p, KILN_EXPR_ADD, d, s0));
    kiln_expr_format(&p, d, buf, sizeof buf);
    CHECK(strlen(buf) == sizeof buf - 1);
    kiln_expr_pool_free(&p);
}

static void test_copy(void)
{
    kiln_expr_pool p, q;
    kiln_expr_pool_init(&p);
    kiln_expr s0 = kiln_expr_symbol(&p, 0);
    kiln_expr e = kiln_expr_op(&p, KILN_EXPR_ADD, s0, kiln_expr_const(&p, 7));
    CHECK_OK(kiln_expr_pool_copy(&q, &p));
    kiln_expr_pool_free(&p);
    CHECK(q.n == 3);
    CHECK(kiln_expr_op(&q, KILN_EXPR_ADD, kiln_expr_const(&q, 7), kiln_expr_symbol(&q, 0)) == e);
    CHECK(q.n == 3);
    CHECK(kiln_expr_symbol(&q, 1) == 3);
    kiln_expr_pool_free(&q);
    /* a pool rebuilt node by node without its table (as a reader might)
     * still hash-conses after the first insertion */
    kiln_expr_pool r;
    kiln_expr_pool_init(&r);
    r.nodes = malloc(2 * sizeof *r.nodes);
    r.nodes[0] = (kiln_expr_node){KILN_EXPR_NODE_SYMBOL, -1, -1, 0};
    r.nodes[1] = (kiln_expr_node){KILN_EXPR_NODE_CONST, -1, -1, 9};
    r.n = r.cap = 2;
    CHECK(kiln_expr_const(&r, 9) == 1);
    CHECK(kiln_expr_symbol(&r, 0) == 0);
    kiln_expr_pool_free(&r);
}

static const test_case_ tests[] = {
    TEST(test_hash_consing), TEST(test_folding), TEST(test_simplification), TEST(test_invalid_operands),
    TEST(test_eval),         TEST(test_format),  TEST(test_copy),
};
TEST_MAIN(tests)
