/* The graph: appending, lookup, deep copy, shape evaluation, constraints. */
#include "test.h"

#include "core/error.h"
#include "core/graph.h"

/* ---- a fake plugin that counts clones and destroys ---- */

static int live_instances;
static int fail_clone;

typedef struct fake_plugin {
    kiln_plugin base;
    int *state;
} fake_plugin;

static kiln_status fake_clone(const kiln_plugin *self, kiln_plugin **out);
static void fake_destroy(kiln_plugin *self)
{
    fake_plugin *f = (fake_plugin *)self;
    free(f->state);
    free(f);
    live_instances--;
}

static const kiln_plugin_ops fake_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .clone = fake_clone,
    .destroy = fake_destroy,
};

static kiln_plugin *fake_new(int value)
{
    fake_plugin *f = calloc(1, sizeof *f);
    f->base.struct_size = sizeof f->base;
    f->base.ops = &fake_ops;
    f->state = malloc(sizeof *f->state);
    *f->state = value;
    live_instances++;
    return &f->base;
}

static kiln_status fake_clone(const kiln_plugin *self, kiln_plugin **out)
{
    if (fail_clone)
        return kiln_fail(KILN_ERROR_PLUGIN, "fake clone refused");
    *out = fake_new(*((const fake_plugin *)self)->state);
    return KILN_OK;
}

/* ---- tests ---- */

static void test_add_and_find(void)
{
    kiln_graph g;
    kiln_graph_init(&g);
    kiln_expr d[2] = {kiln_expr_const(&g.exprs, 4), kiln_expr_const(&g.exprs, 1024)};
    int32_t a = kiln_graph_add_tensor(&g, "a", KILN_DTYPE_F32, 2, d);
    int32_t b = kiln_graph_add_tensor(&g, "b", KILN_DTYPE_F16, 1, d);
    CHECK(a == 0 && b == 1 && g.n_tensors == 2);
    CHECK(g.tensors[a].producer == -1 && g.tensors[a].arena_offset == -1 && g.tensors[a].flags == 0);
    CHECK(g.tensors[b].dims[0] == d[0] && g.tensors[b].dims[1] == -1);
    CHECK(kiln_graph_add_tensor(&g, "bad", KILN_DTYPE_F32, KILN_MAX_RANK + 1, d) == -1);
    CHECK(strstr(kiln_last_error(), "rank 9") != NULL);
    int32_t ins[2] = {a, b};
    int32_t l = kiln_graph_add_layer(&g, "mm", KILN_OP_MATMUL, ins, 2, 1);
    CHECK(l == 0 && g.n_layers == 1);
    CHECK(g.layers[l].tactic == -1 && g.layers[l].workspace == 0 && g.layers[l].outputs[0] == -1);
    CHECK(g.layers[l].inputs[1] == b && g.layers[l].n_inputs == 2 && g.layers[l].op == KILN_OP_MATMUL);
    /* many appends (growth) keep earlier data */
    for (int i = 0; i < 100; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        CHECK(kiln_graph_add_tensor(&g, name, KILN_DTYPE_I32, 0, NULL) == 2 + i);
        CHECK(kiln_graph_add_layer(&g, name, KILN_OP_UNARY, &a, 1, 1) == 1 + i);
    }
    CHECK(kiln_graph_find_tensor(&g, "b") == 1);
    CHECK(kiln_graph_find_tensor(&g, "t99") == 101);
    CHECK(kiln_graph_find_tensor(&g, "zz") == -1);
    CHECK(kiln_graph_find_tensor(&g, NULL) == -1);
    CHECK(kiln_graph_find_layer(&g, "mm") == 0);
    CHECK(kiln_graph_find_layer(&g, "t5") == 6);
    CHECK(strcmp(g.tensors[0].name, "a") == 0);
    kiln_graph_free(&g);
    CHECK(g.n_tensors == 0 && g.tensors == NULL);
    kiln_graph_free(&g); /* freeing twice after init is safe */
}

static void test_op_names(void)
{
    CHECK(strcmp(kiln_op_name(KILN_OP_MATMUL), "matmul") == 0);
    CHECK(strcmp(kiln_op_name(KILN_OP_FUSED), "fused_elementwise") == 0);
    CHECK(strcmp(kiln_op_name(KILN_OP_CONSTANT), "constant") == 0);
    CHECK(strcmp(kiln_op_name(KILN_OP_COUNT), "?") == 0);
    for (int i = 0; i < KILN_OP_COUNT; i++)
        CHECK(strcmp(kiln_op_name((kiln_op)i), "?") != 0);
}

static void test_dims(void)
{
    kiln_dims d = {.rank = 2, .d = {4, 1024}};
    int64_t n = 0;
    size_t bytes = 0;
    char buf[64];
    CHECK_OK(kiln_dims_count(&d, &n));
    CHECK(n == 4096);
    CHECK_OK(kiln_dims_bytes(&d, KILN_DTYPE_F16, &bytes));
    CHECK(bytes == 8192);
    CHECK(strcmp(kiln_dims_format(&d, buf, sizeof buf), "4x1024") == 0);
    kiln_dims s = {.rank = 0};
    CHECK_OK(kiln_dims_count(&s, &n));
    CHECK(n == 1);
    CHECK(strcmp(kiln_dims_format(&s, buf, sizeof buf), "scalar") == 0);
    kiln_dims z = {.rank = 3, .d = {5, 0, 7}};
    CHECK_OK(kiln_dims_count(&z, &n));
    CHECK(n == 0);
    /* 2^32 * 2^32 = 2^64 does not fit */
    kiln_dims big = {.rank = 2, .d = {(int64_t)1 << 32, (int64_t)1 << 32}};
    n = 7;
    CHECK_FAILS(kiln_dims_count(&big, &n), KILN_ERROR_SHAPE, "overflow");
    CHECK(n == 7);
    /* 2^62 elements fit in int64 but 2^62 * 4 bytes does not fit in size_t */
    kiln_dims huge = {.rank = 2, .d = {(int64_t)1 << 31, (int64_t)1 << 31}};
    CHECK_FAILS(kiln_dims_bytes(&huge, KILN_DTYPE_F32, &bytes), KILN_ERROR_SHAPE, "overflow");
    CHECK(bytes == 8192);
    kiln_dims neg = {.rank = 1, .d = {-1}};
    CHECK_FAILS(kiln_dims_count(&neg, &n), KILN_ERROR_SHAPE, "negative");
    CHECK_FAILS(kiln_dims_bytes(&d, KILN_DTYPE_COUNT, &bytes), KILN_ERROR_INVALID_ARGUMENT, "dtype");
    char tiny[4];
    CHECK(strcmp(kiln_dims_format(&d, tiny, sizeof tiny), "4x1") == 0);
}

/* Builds: input x [s0, 8] (symbol 0), input y [s1] (symbol 1), tensor
 * z [ceil(s0/2), s1*3], one layer "add_3". */
static void build_small(kiln_graph *g)
{
    kiln_graph_init(g);
    kiln_expr_pool *p = &g->exprs;
    kiln_expr s0 = kiln_expr_symbol(p, 0), s1 = kiln_expr_symbol(p, 1);
    kiln_expr xd[2] = {s0, kiln_expr_const(p, 8)};
    kiln_expr yd[1] = {s1};
    kiln_expr zd[2] = {kiln_expr_op(p, KILN_EXPR_CEIL_DIV, s0, kiln_expr_const(p, 2)),
                       kiln_expr_op(p, KILN_EXPR_MUL, s1, kiln_expr_const(p, 3))};
    int32_t x = kiln_graph_add_tensor(g, "x", KILN_DTYPE_F32, 2, xd);
    int32_t y = kiln_graph_add_tensor(g, "y", KILN_DTYPE_F32, 1, yd);
    kiln_graph_add_tensor(g, "z", KILN_DTYPE_F32, 2, zd);
    g->inputs = malloc(2 * sizeof *g->inputs);
    g->inputs[0] = x;
    g->inputs[1] = y;
    g->n_inputs = 2;
    g->symbols = malloc(2 * sizeof *g->symbols);
    g->symbols[0] = (kiln_symbol){x, 0};
    g->symbols[1] = (kiln_symbol){y, 0};
    g->n_symbols = 2;
    int32_t ins[2] = {x, y};
    kiln_graph_add_layer(g, "add_3", KILN_OP_BINARY, ins, 2, 1);
}

static void add_constraint(kiln_graph *g, kiln_constraint_kind kind, kiln_expr a, kiln_expr b, const char *what)
{
    g->constraints = realloc(g->constraints, (size_t)(g->n_constraints + 1) * sizeof *g->constraints);
    g->constraints[g->n_constraints++] = (kiln_constraint){kind, a, b, 0, kiln_strdup(what)};
}

static void test_eval_shapes(void)
{
    kiln_graph g;
    build_small(&g);
    int64_t *values = calloc((size_t)g.exprs.n, sizeof *values);
    kiln_dims dims[3];
    int64_t sym[2] = {7, 5};
    CHECK_OK(kiln_graph_eval_shapes(&g, sym, values, dims));
    CHECK(dims[0].rank == 2 && dims[0].d[0] == 7 && dims[0].d[1] == 8);
    CHECK(dims[1].rank == 1 && dims[1].d[0] == 5);
    CHECK(dims[2].rank == 2 && dims[2].d[0] == 4 && dims[2].d[1] == 15);
    sym[1] = -2;
    CHECK_FAILS(kiln_graph_eval_shapes(&g, sym, values, dims), KILN_ERROR_SHAPE, "tensor \"y\"");
    free(values);
    kiln_graph_free(&g);
}

static void test_constraints(void)
{
    kiln_graph g;
    build_small(&g);
    kiln_expr_pool *p = &g.exprs;
    kiln_expr s0 = kiln_expr_symbol(p, 0), s1 = kiln_expr_symbol(p, 1);
    add_constraint(&g, KILN_CONSTRAINT_BROADCAST, s0, s1, "axis 0 of A and B");
    int64_t *values = calloc((size_t)p->n, sizeof *values);
    int64_t sym[2] = {4, 1};
    CHECK_OK(kiln_expr_pool_eval(p, sym, 2, values));
    CHECK_OK(kiln_graph_check_constraints(&g, values));
    sym[0] = 1;
    sym[1] = 3;
    CHECK_OK(kiln_expr_pool_eval(p, sym, 2, values));
    CHECK_OK(kiln_graph_check_constraints(&g, values));
    sym[0] = 4;
    CHECK_OK(kiln_expr_pool_eval(p, sym, 2, values));
    CHECK_FAILS(kiln_graph_check_constraints(&g, values), KILN_ERROR_SHAPE,
                "layer \"add_3\": cannot broadcast dims 4 and 3 (a == b || a == 1 || b == 1)");
    g.constraints[0].kind = KILN_CONSTRAINT_EQUAL;
    CHECK_FAILS(kiln_graph_check_constraints(&g, values), KILN_ERROR_SHAPE, "dims 4 and 3 differ");
    sym[1] = 4;
    CHECK_OK(kiln_expr_pool_eval(p, sym, 2, values));
    CHECK_OK(kiln_graph_check_constraints(&g, values));
    g.constraints[0].kind = KILN_CONSTRAINT_POSITIVE;
    g.constraints[0].a = kiln_expr_op(p, KILN_EXPR_SUB, s0, kiln_expr_const(p, 4));
    free(values);
    values = calloc((size_t)p->n, sizeof *values);
    CHECK_OK(kiln_expr_pool_eval(p, sym, 2, values)); /* s0 - 4 = 0 */
    CHECK_FAILS(kiln_graph_check_constraints(&g, values), KILN_ERROR_SHAPE, "(a >= 1)");
    g.constraints[0].kind = KILN_CONSTRAINT_NONNEGATIVE;
    CHECK_OK(kiln_graph_check_constraints(&g, values));
    sym[0] = 3;
    CHECK_OK(kiln_expr_pool_eval(p, sym, 2, values));
    CHECK_FAILS(kiln_graph_check_constraints(&g, values), KILN_ERROR_SHAPE, "dim is -1 (a >= 0)");
    g.constraints[0].a = 9999;
    CHECK_FAILS(kiln_graph_check_constraints(&g, values), KILN_ERROR_SHAPE, "missing");
    free(values);
    kiln_graph_free(&g);
}

static void test_profile_symbols(void)
{
    kiln_graph g;
    build_small(&g);
    g.n_profiles = 2;
    g.profiles = calloc(4, sizeof *g.profiles);
    for (int pr = 0; pr < 2; pr++) {
        kiln_profile_dims *x = &g.profiles[pr * 2 + 0], *y = &g.profiles[pr * 2 + 1];
        x->min = (kiln_dims){.rank = 2, .d = {1 + pr * 10, 8}};
        x->opt = (kiln_dims){.rank = 2, .d = {2 + pr * 10, 8}};
        x->max = (kiln_dims){.rank = 2, .d = {3 + pr * 10, 8}};
        y->min = (kiln_dims){.rank = 1, .d = {100 + pr * 10}};
        y->opt = (kiln_dims){.rank = 1, .d = {200 + pr * 10}};
        y->max = (kiln_dims){.rank = 1, .d = {300 + pr * 10}};
    }
    int64_t sym[2];
    kiln_graph_profile_symbols(&g, 0, 0, sym);
    CHECK(sym[0] == 1 && sym[1] == 100);
    kiln_graph_profile_symbols(&g, 1, 1, sym);
    CHECK(sym[0] == 12 && sym[1] == 210);
    kiln_graph_profile_symbols(&g, 1, 2, sym);
    CHECK(sym[0] == 13 && sym[1] == 310);
    kiln_graph_free(&g);
}

static void test_copy(void)
{
    kiln_graph g, c;
    build_small(&g);
    add_constraint(&g, KILN_CONSTRAINT_EQUAL, 0, 1, "inner dims of A and B");
    float w[3] = {1, 2, 3};
    kiln_tensor_rec *t = &g.tensors[2];
    t->flags = KILN_TENSOR_CONSTANT;
    t->data = w; /* not owned, as if mapped from an engine */
    t->data_size = sizeof w;
    g.n_profiles = 1;
    g.profiles = calloc(2, sizeof *g.profiles);
    g.profiles[1].max.d[0] = 77;
    g.plugins = calloc(1, sizeof *g.plugins);
    g.n_plugins = 1;
    g.plugins[0].name = kiln_strdup("Fake");
    g.plugins[0].version = kiln_strdup("1");
    g.plugins[0].plugin_namespace = kiln_strdup("");
    g.plugins[0].library = kiln_strdup("builtin");
    g.plugins[0].instance = fake_new(42);
    g.plugins[0].blob_version = 3;
    g.plugins[0].blob = malloc(4);
    memcpy(g.plugins[0].blob, "abcd", 4);
    g.plugins[0].blob_size = 4;
    g.sections = calloc(1, sizeof *g.sections);
    g.n_sections = 1;
    g.sections[0].id = KILN_FOURCC('L', 'L', 'M', 'C');
    g.sections[0].data = "{\"x\":1}";
    g.sections[0].size = 7;
    g.arena_size = 12345;
    g.layers[0].p.binary.op = KILN_BINARY_MUL;
    CHECK(live_instances == 1);

    CHECK_OK(kiln_graph_copy(&c, &g));
    CHECK(live_instances == 2);
    CHECK(c.n_tensors == 3 && c.n_layers == 1 && c.n_inputs == 2 && c.n_symbols == 2);
    CHECK(c.arena_size == 12345 && c.exprs.n == g.exprs.n);
    CHECK(c.tensors[0].name != g.tensors[0].name && strcmp(c.tensors[0].name, "x") == 0);
    CHECK(c.tensors[2].data != w && c.tensors[2].data_owned == 1 && memcmp(c.tensors[2].data, w, sizeof w) == 0);
    CHECK(c.layers[0].inputs != g.layers[0].inputs && c.layers[0].inputs[1] == 1);
    CHECK(c.layers[0].p.binary.op == KILN_BINARY_MUL);
    CHECK(c.profiles[1].max.d[0] == 77);
    CHECK(strcmp(c.constraints[0].what, "inner dims of A and B") == 0 &&
          c.constraints[0].what != g.constraints[0].what);
    CHECK(c.plugins[0].instance != g.plugins[0].instance);
    CHECK(*((fake_plugin *)c.plugins[0].instance)->state == 42);
    CHECK(c.plugins[0].blob != g.plugins[0].blob && memcmp(c.plugins[0].blob, "abcd", 4) == 0);
    CHECK(c.plugins[0].blob_version == 3 && strcmp(c.plugins[0].library, "builtin") == 0);
    CHECK(c.sections[0].data_owned && memcmp(c.sections[0].data, "{\"x\":1}", 7) == 0);
    /* expressions keep hash-consing in the copy */
    CHECK(kiln_expr_symbol(&c.exprs, 1) == kiln_expr_symbol(&g.exprs, 1));
    kiln_graph_free(&c);
    CHECK(live_instances == 1);

    /* a failing clone fails the copy and leaves dst untouched */
    fail_clone = 1;
    kiln_graph d;
    memset(&d, 0xAB, sizeof d);
    CHECK_FAILS(kiln_graph_copy(&d, &g), KILN_ERROR_PLUGIN, "fake clone refused");
    CHECK(strstr(kiln_last_error(), "Fake") != NULL);
    CHECK(d.n_tensors == (int32_t)0xABABABAB);
    CHECK(live_instances == 1);
    fail_clone = 0;

    t->data = NULL; /* w is on the stack */
    g.sections[0].data = NULL;
    kiln_graph_free(&g);
    CHECK(live_instances == 0);
}

static const test_case_ tests[] = {
    TEST(test_add_and_find), TEST(test_op_names),        TEST(test_dims), TEST(test_eval_shapes),
    TEST(test_constraints),  TEST(test_profile_symbols), TEST(test_copy),
};
TEST_MAIN(tests)
