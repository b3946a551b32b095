/* The network API: argument checks, symbolic shape inference, constraints,
 * profiles, plugin layers and outputs. Expected shapes are worked by hand. */
#include "test.h"

#include "core/error.h"
#include "network/network_internal.h"

static kiln_dims dims_of(int32_t rank, const int64_t *d)
{
    kiln_dims r;
    memset(&r, 0, sizeof r);
    r.rank = rank;
    for (int32_t i = 0; i < rank; i++)
        r.d[i] = d[i];
    return r;
}

#define DIMS(...) dims_of((int32_t)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

static kiln_network *new_net(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    return net;
}

/* Concrete dims of tensor t for symbol values; rank -1 when evaluation or a
 * constraint fails. */
static kiln_dims eval_at(kiln_network *net, kiln_tensor t, const int64_t *symbols)
{
    kiln_graph *g = &net->graph;
    kiln_dims *all = calloc((size_t)g->n_tensors, sizeof *all);
    int64_t *values = calloc((size_t)g->exprs.n + 1, sizeof *values);
    kiln_dims out = {.rank = -1};
    if (kiln_graph_eval_shapes(g, symbols, values, all) == KILN_OK &&
        kiln_graph_check_constraints(g, values) == KILN_OK)
        out = all[t.id];
    free(all);
    free(values);
    return out;
}

static int dims_eq(kiln_dims d, kiln_dims e)
{
    if (d.rank != e.rank)
        return 0;
    for (int32_t i = 0; i < d.rank; i++)
        if (d.d[i] != e.d[i])
            return 0;
    return 1;
}

/* Nonzero when dim i of t is the constant v. */
static int dim_const(kiln_network *net, kiln_tensor t, int32_t i, int64_t v)
{
    int64_t x;
    return kiln_expr_is_const(&net->graph.exprs, net->graph.tensors[t.id].dims[i], &x) && x == v;
}

/* ---- inputs, constants, profiles ---- */

static void test_inputs(void)
{
    kiln_network *net = new_net();
    kiln_tensor x, y, bad = {-1};
    kiln_dims d = DIMS(-1, 128, -1);
    CHECK_OK(kiln_network_add_input(net, "tokens", KILN_DTYPE_F32, &d, &x));
    kiln_graph *g = &net->graph;
    CHECK(g->n_symbols == 2 && g->n_inputs == 1 && g->inputs[0] == x.id);
    CHECK(g->symbols[0].tensor == x.id && g->symbols[0].axis == 0);
    CHECK(g->symbols[1].tensor == x.id && g->symbols[1].axis == 2);
    CHECK(g->tensors[x.id].flags == KILN_TENSOR_INPUT && g->tensors[x.id].producer == -1);
    CHECK(g->tensors[x.id].dims[0] == kiln_expr_symbol(&g->exprs, 0));
    CHECK(g->tensors[x.id].dims[2] == kiln_expr_symbol(&g->exprs, 1));
    CHECK(dim_const(net, x, 1, 128));
    CHECK_FAILS(kiln_network_add_input(net, "tokens", KILN_DTYPE_F32, &d, &bad), KILN_ERROR_INVALID_ARGUMENT,
                "\"tokens\"");
    CHECK(bad.id == -1);
    kiln_dims neg = DIMS(4, -2);
    CHECK_FAILS(kiln_network_add_input(net, "n", KILN_DTYPE_F32, &neg, &y), KILN_ERROR_INVALID_ARGUMENT, "dim 1 is -2");
    CHECK_FAILS(kiln_network_add_input(net, "f8", KILN_DTYPE_FP8_E4M3, &d, &y), KILN_ERROR_UNSUPPORTED, "fp8_e4m3");
    CHECK_FAILS(kiln_network_add_input(net, "", KILN_DTYPE_F32, &d, &y), KILN_ERROR_INVALID_ARGUMENT, "empty");
    kiln_dims r9 = {.rank = 9};
    CHECK_FAILS(kiln_network_add_input(net, "r9", KILN_DTYPE_F32, &r9, &y), KILN_ERROR_INVALID_ARGUMENT, "rank 9");
    CHECK(g->n_tensors == 1 && g->n_symbols == 2 && g->n_inputs == 1);
    kiln_dims st = DIMS(2, 3);
    CHECK_OK(kiln_network_add_input(net, "ids", KILN_DTYPE_I32, &st, &y));
    CHECK(g->n_symbols == 2);
    kiln_tensor f;
    CHECK_OK(kiln_network_find_tensor(net, "ids", &f));
    CHECK(f.id == y.id);
    CHECK_FAILS(kiln_network_find_tensor(net, "nope", &f), KILN_ERROR_NOT_FOUND, "nope");
    kiln_dtype dt;
    int32_t rank;
    CHECK_OK(kiln_network_tensor_info(net, y, &dt, &rank));
    CHECK(dt == KILN_DTYPE_I32 && rank == 2);
    CHECK_FAILS(kiln_network_tensor_info(net, bad, &dt, &rank), KILN_ERROR_INVALID_ARGUMENT, "-1");
    kiln_network_destroy(net);
    kiln_network_destroy(NULL);
}

static void test_constants(void)
{
    kiln_network *net = new_net();
    float w[6] = {1, 2, 3, 4, 5, 6};
    kiln_dims d = DIMS(2, 3);
    kiln_tensor c, c2;
    CHECK_OK(kiln_network_add_constant(net, "w", KILN_DTYPE_F32, &d, w, &c));
    kiln_tensor_rec *r = &net->graph.tensors[c.id];
    CHECK(r->flags == KILN_TENSOR_CONSTANT && r->producer == -1 && r->data_owned == 1);
    CHECK(r->data != (void *)w && r->data_size == 24 && memcmp(r->data, w, 24) == 0);
    CHECK(net->graph.n_layers == 0);
    CHECK_OK(kiln_network_add_constant(net, NULL, KILN_DTYPE_F32, &d, w, &c2));
    CHECK(strncmp(net->graph.tensors[c2.id].name, "constant_", 9) == 0);
    kiln_dims dyn = DIMS(-1, 3);
    CHECK_FAILS(kiln_network_add_constant(net, "d", KILN_DTYPE_F32, &dyn, w, &c2), KILN_ERROR_SHAPE, "static");
    CHECK_FAILS(kiln_network_add_constant(net, "n", KILN_DTYPE_F32, &d, NULL, &c2), KILN_ERROR_INVALID_ARGUMENT,
                "NULL");
    CHECK_FAILS(kiln_network_add_constant(net, "w", KILN_DTYPE_F32, &d, w, &c2), KILN_ERROR_INVALID_ARGUMENT,
                "already used");
    kiln_dims huge = DIMS((int64_t)1 << 40, (int64_t)1 << 40);
    CHECK_FAILS(kiln_network_add_constant(net, "h", KILN_DTYPE_F32, &huge, w, &c2), KILN_ERROR_SHAPE, "overflow");
    kiln_dims empty = DIMS(0, 3);
    CHECK_OK(kiln_network_add_constant(net, "e", KILN_DTYPE_F32, &empty, NULL, &c2));
    CHECK(net->graph.tensors[c2.id].data != NULL && net->graph.tensors[c2.id].data_size == 0);
    kiln_graph copy;
    CHECK_OK(kiln_graph_copy(&copy, &net->graph));
    CHECK(copy.tensors[c2.id].data != NULL && copy.tensors[c2.id].data_owned);
    CHECK(memcmp(copy.tensors[c.id].data, w, 24) == 0);
    kiln_graph_free(&copy);
    kiln_network_destroy(net);
}

static void test_profiles(void)
{
    kiln_network *net = new_net();
    kiln_tensor x, y;
    kiln_dims dx = DIMS(-1, 16), dy = DIMS(4, -1, -1);
    int32_t p0, p1;
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F32, &dx, &x));
    CHECK_OK(kiln_network_add_profile(net, &p0));
    CHECK(p0 == 0);
    kiln_graph *g = &net->graph;
    CHECK(g->n_profiles == 1 && g->profiles[0].min.rank == 2);
    CHECK(g->profiles[0].min.d[0] == -1 && g->profiles[0].max.d[1] == 16);
    kiln_dims mn = DIMS(1, 16), op = DIMS(8, 16), mx = DIMS(64, 16);
    CHECK_OK(kiln_network_set_profile_shape(net, 0, "x", &mn, &op, &mx));
    /* an input added after a profile extends every row */
    CHECK_OK(kiln_network_add_input(net, "y", KILN_DTYPE_F32, &dy, &y));
    CHECK(g->profiles[0].max.d[0] == 64 && g->profiles[1].min.rank == 3);
    CHECK(g->profiles[1].min.d[0] == 4 && g->profiles[1].min.d[1] == -1);
    CHECK_OK(kiln_network_add_profile(net, &p1));
    CHECK(p1 == 1 && g->n_profiles == 2);
    CHECK(g->profiles[2].min.d[0] == -1 && g->profiles[3].opt.d[0] == 4);
    kiln_dims ymn = DIMS(4, 1, 2), yop = DIMS(4, 2, 2), ymx = DIMS(4, 3, 2);
    CHECK_OK(kiln_network_set_profile_shape(net, 1, "y", &ymn, &yop, &ymx));
    CHECK(g->profiles[3].max.d[1] == 3);
    int64_t sym[3];
    kiln_graph_profile_symbols(g, 1, 2, sym);
    CHECK(sym[0] == -1 && sym[1] == 3 && sym[2] == 2);
    kiln_graph_profile_symbols(g, 0, 1, sym);
    CHECK(sym[0] == 8);
    /* validation */
    CHECK_FAILS(kiln_network_set_profile_shape(net, 2, "x", &mn, &op, &mx), KILN_ERROR_INVALID_ARGUMENT, "profile 2");
    CHECK_FAILS(kiln_network_set_profile_shape(net, 0, "z", &mn, &op, &mx), KILN_ERROR_NOT_FOUND, "\"z\"");
    CHECK_FAILS(kiln_network_set_profile_shape(net, 0, "x", &ymn, &op, &mx), KILN_ERROR_SHAPE, "rank 3");
    kiln_dims wrong = DIMS(8, 17);
    CHECK_FAILS(kiln_network_set_profile_shape(net, 0, "x", &mn, &wrong, &mx), KILN_ERROR_SHAPE,
                "dim 1 is static (16)");
    CHECK_FAILS(kiln_network_set_profile_shape(net, 0, "x", &op, &mn, &mx), KILN_ERROR_SHAPE,
                "profile 0, input \"x\": dim 0: expected min <= opt <= max, got 8, 1, 64");
    kiln_dims negm = DIMS(-1, 16);
    CHECK_FAILS(kiln_network_set_profile_shape(net, 0, "x", &negm, &op, &mx), KILN_ERROR_SHAPE, "negative");
    CHECK(g->profiles[0].max.d[0] == 64);
    kiln_network_destroy(net);
}

/* ---- layers ---- */

static void test_matmul(void)
{
    kiln_network *net = new_net();
    kiln_tensor a, w, w2, k, c, v, out;
    kiln_dims da = DIMS(-1, 128, 512), dw = DIMS(512, 256), dw2 = DIMS(256, 256), dk = DIMS(-1, 64);
    CHECK_OK(kiln_network_add_input(net, "a", KILN_DTYPE_F32, &da, &a));
    CHECK_OK(kiln_network_add_input(net, "w", KILN_DTYPE_F32, &dw, &w));
    CHECK_OK(kiln_network_add_input(net, "w2", KILN_DTYPE_F32, &dw2, &w2));
    CHECK_OK(kiln_network_add_input(net, "k", KILN_DTYPE_F32, &dk, &k));
    CHECK_OK(kiln_network_add_matmul(net, "fc1", a, 0, w, 0, &c));
    int64_t sym[2] = {3, 9};
    CHECK(dims_eq(eval_at(net, c, sym), DIMS(3, 128, 256)));
    CHECK(net->graph.n_constraints == 0);
    kiln_layer *l = &net->graph.layers[0];
    CHECK(l->op == KILN_OP_MATMUL && l->n_inputs == 2 && l->inputs[0] == a.id && l->outputs[0] == c.id);
    CHECK(net->graph.tensors[c.id].producer == 0 && strcmp(net->graph.tensors[c.id].name, "fc1") == 0);

    int32_t nl = net->graph.n_layers, nt = net->graph.n_tensors;
    CHECK_FAILS(kiln_network_add_matmul(net, "fc2", c, 0, w, 0, &out), KILN_ERROR_SHAPE,
                "layer \"fc2\": inner dims differ: A has 256, B has 512");
    CHECK(net->graph.n_layers == nl && net->graph.n_tensors == nt);
    /* transpose_b: [B,128,512] x [256,512]^T is wrong (K 512 vs 256)... but
     * w2^T is [256,256]: [B,128,256] x w2^T -> [B,128,256] */
    CHECK_OK(kiln_network_add_matmul(net, "fc2", c, 0, w2, 1, &out));
    CHECK(net->graph.layers[net->graph.n_layers - 1].p.matmul.transpose_b == 1);
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(3, 128, 256)));
    /* transpose_a: a^T is [B, 512, 128]; times [128, ...]: use k^T? k is [s1, 64]:
     * a^T x k needs 128 == s1: an EQUAL constraint */
    CHECK_OK(kiln_network_add_matmul(net, "ta", a, 1, k, 0, &out));
    CHECK(net->graph.n_constraints == 1 && net->graph.constraints[0].kind == KILN_CONSTRAINT_EQUAL);
    CHECK(net->graph.constraints[0].layer == net->graph.n_layers - 1);
    int64_t good[2] = {2, 128}, bad[2] = {2, 100};
    CHECK(dims_eq(eval_at(net, out, good), DIMS(2, 512, 64)));
    CHECK(eval_at(net, out, bad).rank == -1);
    CHECK(strstr(kiln_last_error(), "layer \"ta\"") && strstr(kiln_last_error(), "128 and 100"));
    /* rank-1 operands: [512] x [512,256] -> [256]; [256,256] x [256] -> [256]; [256]x[256] -> scalar */
    kiln_dims dv = DIMS(512), dv2 = DIMS(256);
    kiln_tensor v2;
    CHECK_OK(kiln_network_add_input(net, "v", KILN_DTYPE_F32, &dv, &v));
    CHECK_OK(kiln_network_add_input(net, "v2", KILN_DTYPE_F32, &dv2, &v2));
    CHECK_OK(kiln_network_add_matmul(net, "vm", v, 0, w, 0, &out));
    CHECK(dims_eq(eval_at(net, out, good), DIMS(256)));
    CHECK_OK(kiln_network_add_matmul(net, "mv", w2, 0, v2, 0, &out));
    CHECK(dims_eq(eval_at(net, out, good), DIMS(256)));
    CHECK_OK(kiln_network_add_matmul(net, "vv", v2, 0, v2, 0, &out));
    CHECK(eval_at(net, out, good).rank == 0);
    CHECK_FAILS(kiln_network_add_matmul(net, "vt", v, 1, w, 0, &out), KILN_ERROR_INVALID_ARGUMENT, "transpose_a");
    /* batch broadcast: [2,1,4,5] x [3,5,6] -> [2,3,4,6] */
    kiln_dims b1 = DIMS(2, 1, 4, 5), b2 = DIMS(3, 5, 6), b3 = DIMS(4, 5, 6);
    kiln_tensor t1, t2, t3;
    CHECK_OK(kiln_network_add_input(net, "b1", KILN_DTYPE_F32, &b1, &t1));
    CHECK_OK(kiln_network_add_input(net, "b2", KILN_DTYPE_F32, &b2, &t2));
    CHECK_OK(kiln_network_add_input(net, "b3", KILN_DTYPE_F32, &b3, &t3));
    CHECK_OK(kiln_network_add_matmul(net, "bb", t1, 0, t2, 0, &out));
    CHECK(dims_eq(eval_at(net, out, good), DIMS(2, 3, 4, 6)));
    CHECK_FAILS(kiln_network_add_matmul(net, "bad_batch", t2, 0, t3, 1, &out), KILN_ERROR_SHAPE,
                "cannot broadcast dims 3 and 4");
    /* dtypes */
    kiln_dims di = DIMS(4, 4);
    kiln_tensor ii;
    CHECK_OK(kiln_network_add_input(net, "ii", KILN_DTYPE_I32, &di, &ii));
    CHECK_FAILS(kiln_network_add_matmul(net, "imm", ii, 0, ii, 0, &out), KILN_ERROR_INVALID_ARGUMENT, "float");
    kiln_tensor none = {999};
    CHECK_FAILS(kiln_network_add_matmul(net, "nn", none, 0, w, 0, &out), KILN_ERROR_INVALID_ARGUMENT,
                "layer \"nn\": A is not a tensor");
    CHECK_FAILS(kiln_network_add_matmul(net, "fc1", a, 0, w, 0, &out), KILN_ERROR_INVALID_ARGUMENT, "already used");
    kiln_network_destroy(net);
}

static void test_binary(void)
{
    kiln_network *net = new_net();
    kiln_tensor x, y, b, s, out;
    kiln_dims dx = DIMS(-1, 1, 8), dy = DIMS(-1, 8), db = DIMS(8), ds = DIMS(3);
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F32, &dx, &x));
    CHECK_OK(kiln_network_add_input(net, "y", KILN_DTYPE_F32, &dy, &y));
    CHECK_OK(kiln_network_add_input(net, "b", KILN_DTYPE_F32, &db, &b));
    CHECK_OK(kiln_network_add_input(net, "s", KILN_DTYPE_F32, &ds, &s));
    /* identical and constant-1 dims need no constraint */
    CHECK_OK(kiln_network_add_binary(net, NULL, KILN_BINARY_ADD, x, b, &out));
    CHECK(net->graph.n_constraints == 0);
    CHECK(strncmp(net->graph.tensors[out.id].name, "add_", 4) == 0);
    CHECK(net->graph.tensors[out.id].dims[0] == net->graph.tensors[x.id].dims[0]);
    CHECK(dim_const(net, out, 1, 1) && dim_const(net, out, 2, 8));
    /* [s0,1,8] * [s1,8] -> [s0, bcast(1,s1)=s1, 8], no constraint for axis 1 */
    CHECK_OK(kiln_network_add_binary(net, "m", KILN_BINARY_MUL, x, y, &out));
    CHECK(net->graph.n_constraints == 0);
    int64_t sym[2] = {2, 5};
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(2, 5, 8)));
    /* [s0,1,8] + [s1,8] viewed as [s1] vs [s0] on the leading axis of two [-1] inputs */
    kiln_dims d1 = DIMS(-1), d2 = DIMS(-1);
    kiln_tensor p, q;
    CHECK_OK(kiln_network_add_input(net, "p", KILN_DTYPE_F32, &d1, &p));
    CHECK_OK(kiln_network_add_input(net, "q", KILN_DTYPE_F32, &d2, &q));
    CHECK_OK(kiln_network_add_binary(net, "add_3", KILN_BINARY_ADD, p, q, &out));
    CHECK(net->graph.n_constraints == 1 && net->graph.constraints[0].kind == KILN_CONSTRAINT_BROADCAST);
    int64_t s4[4] = {1, 1, 1, 5}, s5[4] = {1, 1, 0, 1}, s6[4] = {1, 1, 7, 7}, s7[4] = {1, 1, 4, 3};
    CHECK(dims_eq(eval_at(net, out, s4), DIMS(5)));
    CHECK(dims_eq(eval_at(net, out, s5), DIMS(0))); /* numpy: (0) with (1) is (0) */
    CHECK(dims_eq(eval_at(net, out, s6), DIMS(7)));
    CHECK(eval_at(net, out, s7).rank == -1);
    CHECK(strstr(kiln_last_error(), "layer \"add_3\": cannot broadcast dims 4 and 3 (a == b || a == 1 || b == 1)"));
    /* static mismatch fails at once */
    CHECK_FAILS(kiln_network_add_binary(net, "bad", KILN_BINARY_SUB, b, s, &out), KILN_ERROR_SHAPE,
                "layer \"bad\": cannot broadcast dims 8 and 3");
    CHECK(net->graph.n_constraints == 1);
    kiln_dims di = DIMS(8);
    kiln_tensor ii;
    CHECK_OK(kiln_network_add_input(net, "ii", KILN_DTYPE_I32, &di, &ii));
    CHECK_FAILS(kiln_network_add_binary(net, "mix", KILN_BINARY_ADD, b, ii, &out), KILN_ERROR_INVALID_ARGUMENT,
                "dtypes differ: A is f32, B is i32");
    CHECK_OK(kiln_network_add_binary(net, "iadd", KILN_BINARY_ADD, ii, ii, &out));
    CHECK_FAILS(kiln_network_add_binary(net, "badop", KILN_BINARY_OP_COUNT, b, b, &out), KILN_ERROR_INVALID_ARGUMENT,
                "op");
    kiln_network_destroy(net);
}

static void test_unary_reduce_softmax_cast(void)
{
    kiln_network *net = new_net();
    kiln_tensor x, ii, out;
    kiln_dims dx = DIMS(2, -1, 4), di = DIMS(5);
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F16, &dx, &x));
    CHECK_OK(kiln_network_add_input(net, "ii", KILN_DTYPE_I64, &di, &ii));
    CHECK_OK(kiln_network_add_unary(net, "act", KILN_UNARY_SILU, x, &out));
    CHECK(net->graph.layers[0].p.unary.op == KILN_UNARY_SILU && net->graph.tensors[out.id].dtype == KILN_DTYPE_F16);
    CHECK_FAILS(kiln_network_add_unary(net, "iact", KILN_UNARY_EXP, ii, &out), KILN_ERROR_INVALID_ARGUMENT,
                "layer \"iact\": exp needs a float input, got i64");
    int64_t sym[1] = {3};
    /* mask 0b101 over [2, s0, 4] */
    CHECK_OK(kiln_network_add_reduce(net, "r0", KILN_REDUCE_SUM, x, 0x5, 0, &out));
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(3)));
    CHECK_OK(kiln_network_add_reduce(net, "r1", KILN_REDUCE_SUM, x, 0x5, 1, &out));
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(1, 3, 1)));
    CHECK(net->graph.layers[net->graph.n_layers - 1].p.reduce.axes == 0x5);
    CHECK(net->graph.n_constraints == 0);
    /* mean over the dynamic axis needs it non-empty */
    CHECK_OK(kiln_network_add_reduce(net, "r2", KILN_REDUCE_MEAN, x, 0x2, 0, &out));
    CHECK(net->graph.n_constraints == 1 && net->graph.constraints[0].kind == KILN_CONSTRAINT_POSITIVE);
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(2, 4)));
    int64_t zero[1] = {0};
    CHECK(eval_at(net, out, zero).rank == -1);
    CHECK_FAILS(kiln_network_add_reduce(net, "r3", KILN_REDUCE_MAX, x, 0x8, 0, &out), KILN_ERROR_INVALID_ARGUMENT,
                "names an axis >= rank 3");
    CHECK_FAILS(kiln_network_add_reduce(net, "r4", KILN_REDUCE_MAX, x, 0, 0, &out), KILN_ERROR_INVALID_ARGUMENT,
                "no axis");
    CHECK_OK(kiln_network_add_softmax(net, "sm", x, -1, &out));
    CHECK(net->graph.layers[net->graph.n_layers - 1].p.softmax.axis == 2);
    CHECK_FAILS(kiln_network_add_softmax(net, "sm2", x, 3, &out), KILN_ERROR_INVALID_ARGUMENT, "axis 3");
    CHECK_FAILS(kiln_network_add_softmax(net, "sm3", x, -4, &out), KILN_ERROR_INVALID_ARGUMENT, "axis -4");
    CHECK_OK(kiln_network_add_cast(net, "c", x, KILN_DTYPE_F32, &out));
    CHECK(net->graph.tensors[out.id].dtype == KILN_DTYPE_F32);
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(2, 3, 4)));
    CHECK_FAILS(kiln_network_add_cast(net, "c8", x, KILN_DTYPE_FP8_E5M2, &out), KILN_ERROR_UNSUPPORTED, "fp8_e5m2");
    kiln_network_destroy(net);
}

static void test_concat_slice_gather(void)
{
    kiln_network *net = new_net();
    kiln_tensor a, b, c, e, ids, out;
    kiln_dims da = DIMS(-1, 3), db = DIMS(-1, 5), dc = DIMS(4, 3), de = DIMS(10, -1);
    CHECK_OK(kiln_network_add_input(net, "a", KILN_DTYPE_F32, &da, &a));
    CHECK_OK(kiln_network_add_input(net, "b", KILN_DTYPE_F32, &db, &b));
    CHECK_OK(kiln_network_add_input(net, "c", KILN_DTYPE_F32, &dc, &c));
    CHECK_OK(kiln_network_add_input(net, "e", KILN_DTYPE_F32, &de, &e));
    /* symbols: a0=s0, b0=s1, e1=s2 */
    kiln_tensor ab[2] = {a, b};
    CHECK_OK(kiln_network_add_concat(net, "cat", ab, 2, -1, &out));
    CHECK(net->graph.n_constraints == 1 && net->graph.constraints[0].kind == KILN_CONSTRAINT_EQUAL);
    int64_t sym[3] = {6, 6, 7};
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(6, 8)));
    int64_t bad[3] = {6, 5, 7};
    CHECK(eval_at(net, out, bad).rank == -1);
    CHECK(strstr(kiln_last_error(), "layer \"cat\""));
    kiln_tensor ac[3] = {a, c, a};
    CHECK_OK(kiln_network_add_concat(net, "cat0", ac, 3, 0, &out));
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(16, 3)));
    kiln_tensor cb[2] = {c, b};
    CHECK_FAILS(kiln_network_add_concat(net, "cat1", cb, 2, 0, &out), KILN_ERROR_SHAPE,
                "sizes of axis 1 differ: input 0 has 3, input 1 has 5");
    CHECK_FAILS(kiln_network_add_concat(net, "cat2", cb, 0, 0, &out), KILN_ERROR_INVALID_ARGUMENT, "at least one");

    /* slice of [10, s2]: axis 0 start 2 size -1 stride 3 -> ceil(8/3) = 3;
     * axis 1 start 1 size 2 stride 2 reads index 3, so s2 >= 4 */
    int32_t nc = net->graph.n_constraints;
    int64_t st[2] = {2, 1}, sz[2] = {-1, 2}, sd[2] = {3, 2};
    CHECK_OK(kiln_network_add_slice(net, "sl", e, st, sz, sd, &out));
    CHECK(net->graph.n_constraints == nc + 1);
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(3, 2)));
    CHECK(net->graph.layers[net->graph.n_layers - 1].p.slice.stride[0] == 3);
    int64_t s3[3] = {6, 6, 3};
    CHECK(eval_at(net, out, s3).rank == -1);
    /* start 3 size 4 stride 3 reads index 12 of 10 */
    int64_t st2[2] = {3, 0}, sz2[2] = {4, -1}, sd2[2] = {3, 1};
    CHECK_FAILS(kiln_network_add_slice(net, "sl2", e, st2, sz2, sd2, &out), KILN_ERROR_SHAPE,
                "axis 0: reads index 12 but the dim has size 10");
    /* size -1 on the dynamic axis: ceil((s2 - 0) / 1) = s2, with start <= s2 */
    int64_t st3[2] = {9, 5}, sz3[2] = {1, -1}, sd3[2] = {1, 2};
    CHECK_OK(kiln_network_add_slice(net, "sl3", e, st3, sz3, sd3, &out));
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(1, 1))); /* ceil((7-5)/2) = 1 */
    int64_t s8[3] = {6, 6, 8};
    CHECK(dims_eq(eval_at(net, out, s8), DIMS(1, 2))); /* ceil(3/2) = 2 */
    int64_t s4[3] = {6, 6, 4};
    /* ceil((4-5)/2) = 0 would hide the error: the constraint catches it */
    CHECK(eval_at(net, out, s4).rank == -1);
    CHECK(strstr(kiln_last_error(), "layer \"sl3\": axis 1: start 5 <= dim"));
    /* with stride 1 the dim itself goes negative (4-5 = -1); evaluation then
     * reports the violated constraint, which names a layer, rather than a
     * bare negative dim */
    int64_t st6[2] = {0, 5}, sz6[2] = {-1, -1}, sd6[2] = {1, 1};
    CHECK_OK(kiln_network_add_slice(net, "sl6", e, st6, sz6, sd6, &out));
    kiln_graph *g = &net->graph;
    int64_t *values = calloc((size_t)g->exprs.n, sizeof *values);
    kiln_dims *shapes = calloc((size_t)g->n_tensors, sizeof *shapes);
    CHECK_FAILS(kiln_graph_eval_shapes(g, s4, values, shapes), KILN_ERROR_SHAPE, "axis 1: start 5 <= dim");
    free(values);
    free(shapes);
    int64_t negst[2] = {-1, 0};
    CHECK_FAILS(kiln_network_add_slice(net, "sl4", e, negst, sz3, sd3, &out), KILN_ERROR_INVALID_ARGUMENT, "start -1");
    int64_t past[2] = {11, 0}, all[2] = {-1, -1};
    CHECK_FAILS(kiln_network_add_slice(net, "sl5", e, past, all, sd3, &out), KILN_ERROR_SHAPE, "past the end");

    /* gather: data [10, s2] by indices [2, 3] along axis 0 -> [2, 3, s2] */
    kiln_dims di = DIMS(2, 3);
    CHECK_OK(kiln_network_add_input(net, "ids", KILN_DTYPE_I64, &di, &ids));
    CHECK_OK(kiln_network_add_gather(net, "emb", e, ids, 0, &out));
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(2, 3, 7)));
    CHECK(net->graph.tensors[out.id].dtype == KILN_DTYPE_F32);
    CHECK_OK(kiln_network_add_gather(net, "g1", e, ids, -1, &out));
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(10, 2, 3)));
    CHECK_FAILS(kiln_network_add_gather(net, "g2", e, a, 0, &out), KILN_ERROR_INVALID_ARGUMENT, "i32 or i64");
    kiln_network_destroy(net);
}

static kiln_shuffle_desc reshape_desc(kiln_dims r)
{
    kiln_shuffle_desc d;
    kiln_shuffle_desc_init(&d);
    d.has_reshape = 1;
    d.reshape = r;
    return d;
}

static void test_shuffle(void)
{
    kiln_network *net = new_net();
    kiln_tensor x, y, out;
    kiln_dims dx = DIMS(-1, -1, 4096), dy = DIMS(-1);
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F32, &dx, &x));
    CHECK_OK(kiln_network_add_input(net, "y", KILN_DTYPE_F32, &dy, &y));
    int64_t sym[4] = {2, 3, 12, 5}; /* B, S, y0, zt0 */
    /* [B,S,4096] -> [B,S,32,-1]: -1 is exactly 128, nothing to check later */
    kiln_shuffle_desc d = reshape_desc(DIMS(0, 0, 32, -1));
    d.has_second_transpose = 1;
    int32_t perm[4] = {0, 2, 1, 3};
    memcpy(d.second_transpose, perm, sizeof perm);
    CHECK_OK(kiln_network_add_shuffle(net, "heads", x, &d, &out));
    CHECK(net->graph.n_constraints == 0);
    CHECK(dim_const(net, out, 3, 128) && dim_const(net, out, 1, 32));
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(2, 32, 3, 128)));
    kiln_layer *l = &net->graph.layers[0];
    CHECK(l->p.shuffle.mid_rank == 4 && l->p.shuffle.has_second && !l->p.shuffle.has_first);
    CHECK(l->p.shuffle.mid[1] == net->graph.tensors[x.id].dims[1] && l->p.shuffle.mid[4] == -1);
    /* and back: [B,32,S,128] -> transpose -> [B,S,32,128] -> reshape [0,0,4096]: provable */
    kiln_shuffle_desc back = reshape_desc(DIMS(0, 0, 4096));
    back.has_first_transpose = 1;
    memcpy(back.first_transpose, perm, sizeof perm);
    kiln_tensor merged;
    CHECK_OK(kiln_network_add_shuffle(net, "merge", out, &back, &merged));
    CHECK(net->graph.n_constraints == 0);
    CHECK(net->graph.tensors[merged.id].dims[1] == net->graph.tensors[x.id].dims[1]);
    /* [B,S,4096] -> [-1, 4096] = [B*S, 4096]; then [B*S,4096] -> [2, -1, 64]:
     * 2 * X * 64 = 4096*B*S gives X = 32*B*S exactly, for any B and S */
    kiln_shuffle_desc flat = reshape_desc(DIMS(-1, 4096));
    CHECK_OK(kiln_network_add_shuffle(net, "flat", x, &flat, &out));
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(6, 4096)));
    kiln_shuffle_desc unflat = reshape_desc(DIMS(2, -1, 64));
    CHECK_OK(kiln_network_add_shuffle(net, "unflat", out, &unflat, &out));
    CHECK(net->graph.n_constraints == 0);
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(2, 192, 64)));
    CHECK(dims_eq(eval_at(net, out, (int64_t[]){3, 1, 1}), DIMS(2, 96, 64)));
    /* [B*S, 4096] -> [B, -1]: B divides B*S*4096 exactly: X = 4096*S */
    kiln_shuffle_desc perb = reshape_desc(DIMS(0, -1));
    kiln_tensor pb;
    kiln_shuffle_desc fl2 = reshape_desc(DIMS(-1, 4096));
    CHECK_OK(kiln_network_add_shuffle(net, "flat2", x, &fl2, &pb));
    CHECK_OK(kiln_network_add_shuffle(net, "perb", pb, &perb, &pb));
    CHECK(net->graph.n_constraints == 0);
    CHECK(dims_eq(eval_at(net, pb, sym), DIMS(6, 4096)));
    /* [B, S, 4096] -> [3, -1]: 3 does not divide 4096*B*S symbolically, so
     * X = floor(4096*B*S / 3) with an EQUAL constraint */
    kiln_shuffle_desc sfirst = reshape_desc(DIMS(3, -1));
    CHECK_OK(kiln_network_add_shuffle(net, "sfirst", x, &sfirst, &pb));
    CHECK(net->graph.n_constraints == 1); /* 3 is static, B*S is not: checked later */
    CHECK(dims_eq(eval_at(net, pb, sym), DIMS(3, 8192)));
    CHECK(eval_at(net, pb, (int64_t[]){2, 5, 1}).rank == -1);
    CHECK(strstr(kiln_last_error(), "layer \"sfirst\""));
    /* [s] -> [-1, 3]: floor(s/3) with an EQUAL constraint */
    kiln_shuffle_desc by3 = reshape_desc(DIMS(-1, 3));
    CHECK_OK(kiln_network_add_shuffle(net, "by3", y, &by3, &out));
    CHECK(net->graph.n_constraints == 2);
    CHECK(dims_eq(eval_at(net, out, (int64_t[]){2, 3, 12}), DIMS(4, 3)));
    kiln_dims fail = eval_at(net, out, (int64_t[]){2, 3, 7});
    CHECK(fail.rank == -1);
    CHECK(strstr(kiln_last_error(), "layer \"by3\""));
    /* static mismatches and bad descs */
    kiln_dims dc = DIMS(2, 3);
    kiln_tensor c;
    CHECK_OK(kiln_network_add_input(net, "c", KILN_DTYPE_F32, &dc, &c));
    kiln_shuffle_desc r42 = reshape_desc(DIMS(4, 2));
    CHECK_FAILS(kiln_network_add_shuffle(net, "r42", c, &r42, &out), KILN_ERROR_SHAPE,
                "cannot reshape 6 elements into 8");
    kiln_shuffle_desc r4m = reshape_desc(DIMS(4, -1));
    CHECK_FAILS(kiln_network_add_shuffle(net, "r4m", c, &r4m, &out), KILN_ERROR_SHAPE, "cannot reshape 6 elements");
    kiln_shuffle_desc two = reshape_desc(DIMS(-1, -1));
    CHECK_FAILS(kiln_network_add_shuffle(net, "two", c, &two, &out), KILN_ERROR_INVALID_ARGUMENT, "more than one -1");
    kiln_shuffle_desc copy3 = reshape_desc(DIMS(6, 1, 0));
    CHECK_FAILS(kiln_network_add_shuffle(net, "copy3", c, &copy3, &out), KILN_ERROR_INVALID_ARGUMENT, "dim 2 is 0");
    /* [s3, 0] -> [0, 0, -1]: the known dims multiply to 0, so -1 is unknowable */
    kiln_dims dz = DIMS(-1, 0);
    kiln_tensor zt;
    CHECK_OK(kiln_network_add_input(net, "zt", KILN_DTYPE_F32, &dz, &zt));
    kiln_shuffle_desc zr = reshape_desc(DIMS(0, 0, -1));
    int32_t ncs = net->graph.n_constraints;
    CHECK_FAILS(kiln_network_add_shuffle(net, "zr", zt, &zr, &out), KILN_ERROR_SHAPE, "multiply to 0");
    CHECK(net->graph.n_constraints == ncs);
    CHECK(dims_eq(eval_at(net, c, (int64_t[]){2, 3, 12, 5}), DIMS(2, 3)));
    kiln_shuffle_desc t;
    kiln_shuffle_desc_init(&t);
    t.has_first_transpose = 1;
    t.first_transpose[0] = 0;
    t.first_transpose[1] = 0;
    CHECK_FAILS(kiln_network_add_shuffle(net, "perm", c, &t, &out), KILN_ERROR_INVALID_ARGUMENT, "not a permutation");
    t.first_transpose[0] = 1;
    /* A desc never set up with kiln_shuffle_desc_init is refused. */
    t.struct_size = 0;
    CHECK_FAILS(kiln_network_add_shuffle(net, "perm", c, &t, &out), KILN_ERROR_INVALID_ARGUMENT,
                "struct_size 0 is too small");
    t.struct_size = sizeof t;
    CHECK_OK(kiln_network_add_shuffle(net, "perm", c, &t, &out));
    CHECK(dims_eq(eval_at(net, out, sym), DIMS(3, 2)));
    kiln_network_destroy(net);
}

static void test_outputs_and_names(void)
{
    kiln_network *net = new_net();
    kiln_tensor x, y, z, out;
    kiln_dims d = DIMS(4);
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_F32, &d, &x));
    CHECK_OK(kiln_network_add_unary(net, "relu1", KILN_UNARY_RELU, x, &y));
    CHECK_OK(kiln_network_add_unary(net, NULL, KILN_UNARY_RELU, y, &z));
    CHECK(strncmp(net->graph.layers[1].name, "relu_", 5) == 0);
    CHECK(kiln_network_num_layers(net) == 2);
    CHECK_FAILS(kiln_network_add_unary(net, "x", KILN_UNARY_RELU, y, &out), KILN_ERROR_INVALID_ARGUMENT,
                "already used");
    CHECK_OK(kiln_network_mark_output(net, y, "logits"));
    CHECK(strcmp(net->graph.tensors[y.id].name, "logits") == 0);
    CHECK(net->graph.n_outputs == 1 && net->graph.outputs[0] == y.id);
    CHECK(net->graph.tensors[y.id].flags & KILN_TENSOR_OUTPUT);
    CHECK_FAILS(kiln_network_mark_output(net, y, NULL), KILN_ERROR_INVALID_ARGUMENT, "already an output");
    CHECK_FAILS(kiln_network_mark_output(net, z, "logits"), KILN_ERROR_INVALID_ARGUMENT, "\"logits\"");
    CHECK_FAILS(kiln_network_mark_output(net, z, "relu1"), KILN_ERROR_INVALID_ARGUMENT, "a layer");
    CHECK_OK(kiln_network_mark_output(net, z, NULL));
    CHECK(net->graph.n_outputs == 2);
    kiln_tensor f;
    CHECK_OK(kiln_network_find_tensor(net, "logits", &f));
    CHECK(f.id == y.id);
    /* the layer name stays taken even after its tensor was renamed */
    CHECK_FAILS(kiln_network_add_unary(net, "relu1", KILN_UNARY_RELU, y, &out), KILN_ERROR_INVALID_ARGUMENT,
                "already used");
    CHECK_FAILS(kiln_network_mark_output(net, (kiln_tensor){77}, NULL), KILN_ERROR_INVALID_ARGUMENT, "77");
    kiln_network_destroy(net);
}

static void test_op_names(void)
{
    static const char *const b[] = {"add", "sub", "mul", "div", "pow", "max", "min"};
    static const char *const u[] = {"neg",  "abs",     "exp",  "log",      "sqrt",      "rsqrt",
                                    "tanh", "sigmoid", "relu", "gelu_erf", "gelu_tanh", "silu"};
    static const char *const r[] = {"sum", "mean", "max", "min"};
    CHECK(sizeof b / sizeof *b == KILN_BINARY_OP_COUNT);
    CHECK(sizeof u / sizeof *u == KILN_UNARY_OP_COUNT);
    CHECK(sizeof r / sizeof *r == KILN_REDUCE_OP_COUNT);
    for (int i = 0; i < KILN_BINARY_OP_COUNT; i++) {
        kiln_binary_op op;
        CHECK(strcmp(kiln_binary_op_name((kiln_binary_op)i), b[i]) == 0);
        CHECK_OK(kiln_binary_op_parse(b[i], &op));
        CHECK(op == (kiln_binary_op)i);
    }
    for (int i = 0; i < KILN_UNARY_OP_COUNT; i++) {
        kiln_unary_op op;
        CHECK(strcmp(kiln_unary_op_name((kiln_unary_op)i), u[i]) == 0);
        CHECK_OK(kiln_unary_op_parse(u[i], &op));
        CHECK(op == (kiln_unary_op)i);
    }
    for (int i = 0; i < KILN_REDUCE_OP_COUNT; i++) {
        kiln_reduce_op op;
        CHECK(strcmp(kiln_reduce_op_name((kiln_reduce_op)i), r[i]) == 0);
        CHECK_OK(kiln_reduce_op_parse(r[i], &op));
        CHECK(op == (kiln_reduce_op)i);
    }
    kiln_unary_op uo = KILN_UNARY_ABS;
    CHECK_FAILS(kiln_unary_op_parse("gelu", &uo), KILN_ERROR_INVALID_ARGUMENT, "unknown unary op \"gelu\"");
    CHECK(uo == KILN_UNARY_ABS);
    CHECK(strcmp(kiln_binary_op_name(KILN_BINARY_OP_COUNT), "?") == 0);
}

/* ---- plugin layers, through a real registry and a tiny creator ---- */

/* "Split" 1 "test": splits the last axis into `parts` equal outputs. */
typedef struct split_plugin {
    kiln_plugin base;
    int32_t parts;
} split_plugin;

static int32_t split_num_outputs(const kiln_plugin *self) { return ((const split_plugin *)self)->parts; }

static kiln_status split_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in, kiln_shape_expr *out,
                                int32_t n_out, kiln_expr_builder *eb)
{
    const kiln_host_api *h = kiln_host();
    if (n_in != 1 || in[0].rank < 1)
        return h->fail(KILN_ERROR_SHAPE, "Split needs one input of rank >= 1");
    for (int32_t o = 0; o < n_out; o++) {
        out[o] = in[0];
        out[o].d[in[0].rank - 1] =
            h->expr_operation(eb, KILN_EXPR_FLOOR_DIV, in[0].d[in[0].rank - 1], h->expr_constant(eb, n_out));
    }
    return KILN_OK;
}

static kiln_status split_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                int32_t n_out)
{
    for (int32_t o = 0; o < n_out; o++)
        out[o] = in[0];
    return KILN_OK;
}

static int32_t split_supports(const kiln_plugin *self, kiln_backend b, const kiln_tensor_desc *d, int32_t ni,
                              int32_t no)
{
    return 1;
}

static kiln_status split_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *id,
                                 const void *const *in, int32_t ni, const kiln_tensor_desc *od, void *const *out,
                                 int32_t no, void *ws, void *stream)
{
    return KILN_OK;
}

static kiln_status split_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    if (buf && *size >= 4)
        memcpy(buf, &((const split_plugin *)self)->parts, 4);
    *size = 4;
    return KILN_OK;
}

static kiln_status split_new(int32_t parts, kiln_plugin **out);
static kiln_status split_clone(const kiln_plugin *self, kiln_plugin **out)
{
    return split_new(((const split_plugin *)self)->parts, out);
}

static int split_live;
static void split_destroy(kiln_plugin *self)
{
    split_live--;
    free(self);
}

static const kiln_plugin_ops split_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
    .num_outputs = split_num_outputs,
    .output_shapes = split_shapes,
    .output_dtypes = split_dtypes,
    .supports = split_supports,
    .enqueue = split_enqueue,
    .serialize = split_serialize,
    .clone = split_clone,
    .destroy = split_destroy,
};

static kiln_status split_new(int32_t parts, kiln_plugin **out)
{
    split_plugin *p = calloc(1, sizeof *p);
    if (!p)
        return KILN_ERROR_OUT_OF_MEMORY;
    p->base.struct_size = sizeof p->base;
    p->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    p->base.ops = &split_ops;
    p->parts = parts;
    split_live++;
    *out = &p->base;
    return KILN_OK;
}

static kiln_status split_create(const kiln_plugin_creator *cr, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    int32_t parts = 2;
    for (int32_t i = 0; i < n; i++)
        if (strcmp(f[i].name, "parts") == 0)
            parts = *(const int32_t *)f[i].data;
    if (parts < 1)
        return kiln_host()->fail(KILN_ERROR_INVALID_ARGUMENT, "Split: field \"parts\" must be >= 1, got %d", parts);
    return split_new(parts, out);
}

static kiln_status split_deserialize(const kiln_plugin_creator *cr, uint32_t v, const void *blob, size_t size,
                                     kiln_plugin **out)
{
    int32_t parts;
    if (size != 4)
        return KILN_ERROR_FORMAT;
    memcpy(&parts, blob, 4);
    return split_new(parts, out);
}

static const int32_t two = 2;
static const kiln_field_spec split_fields[] = {{
    .struct_size = sizeof(kiln_field_spec),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = "parts",
    .type = KILN_FIELD_I32,
    .count = 1,
    .required = 0,
    .default_data = &two,
    .default_count = 1,
    .doc = "number of outputs",
}};

static const kiln_plugin_creator split_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = "Split",
    .version = "1",
    .plugin_namespace = "test",
    .fields = split_fields,
    .n_fields = 1,
    .blob_version = 7,
    .create = split_create,
    .deserialize = split_deserialize,
};

static kiln_field i32_field(const char *name, const int32_t *v)
{
    kiln_field f = {sizeof(kiln_field), KILN_PLUGIN_ABI_VERSION, name, KILN_FIELD_I32, 1, v};
    return f;
}

static void test_plugin(void)
{
    kiln_registry *reg = NULL;
    CHECK_OK(kiln_registry_create(&reg));
    if (!reg)
        return;
    CHECK_OK(kiln_host()->register_creator(reg, &split_creator));
    kiln_network *plain = new_net();
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(reg, &net));
    kiln_tensor x, outs[4] = {{-1}, {-1}, {-1}, {-1}};
    int32_t n_out = 0;
    kiln_dims d = DIMS(-1, 12);
    CHECK_OK(kiln_network_add_input(net, "x", KILN_DTYPE_BF16, &d, &x));
    CHECK_OK(kiln_network_add_input(plain, "x", KILN_DTYPE_BF16, &d, &x));
    CHECK_FAILS(kiln_network_add_plugin(plain, "sp", "Split", "1", "test", NULL, 0, &x, 1, outs, 4, &n_out),
                KILN_ERROR_PLUGIN, "no registry");
    CHECK_FAILS(kiln_network_add_plugin(net, "sp", "Split", "2", "test", NULL, 0, &x, 1, outs, 4, &n_out),
                KILN_ERROR_PLUGIN, "layer \"sp\": plugin Split 2 (namespace \"test\") is not registered");
    CHECK(strstr(kiln_last_error(), "Split 1 (namespace \"test\")"));

    int32_t three = 3;
    kiln_field f = i32_field("parts", &three);
    CHECK_OK(kiln_network_add_plugin(net, "sp", "Split", "1", "test", &f, 1, &x, 1, outs, 4, &n_out));
    CHECK(n_out == 3 && outs[3].id == -1);
    kiln_graph *g = &net->graph;
    CHECK(strcmp(g->tensors[outs[0].id].name, "sp:0") == 0 && strcmp(g->tensors[outs[2].id].name, "sp:2") == 0);
    CHECK(g->tensors[outs[1].id].dtype == KILN_DTYPE_BF16);
    CHECK(dims_eq(eval_at(net, outs[2], (int64_t[]){5}), DIMS(5, 4)));
    CHECK(g->n_plugins == 1 && g->plugins[0].creator == &split_creator && g->plugins[0].instance);
    CHECK(g->plugins[0].blob_version == 7 && strcmp(g->plugins[0].name, "Split") == 0);
    CHECK(strcmp(g->plugins[0].version, "1") == 0 && strcmp(g->plugins[0].plugin_namespace, "test") == 0);
    CHECK(g->plugins[0].library != NULL);
    kiln_layer *l = &g->layers[g->n_layers - 1];
    CHECK(l->op == KILN_OP_PLUGIN && l->p.plugin.index == 0 && l->n_outputs == 3 && l->outputs[1] == outs[1].id);
    CHECK(g->tensors[outs[2].id].producer == g->n_layers - 1);
    CHECK(split_live == 1);

    /* defaults, and fewer handles than outputs */
    kiln_tensor one = {-1};
    CHECK_OK(kiln_network_add_plugin(net, NULL, "Split", "1", "test", NULL, 0, &x, 1, &one, 1, &n_out));
    CHECK(n_out == 2 && one.id >= 0 && g->plugins[1].instance != NULL);
    CHECK(strncmp(g->tensors[one.id].name, "Split_", 6) == 0);

    /* failures leave the network as it was and destroy the instance */
    int32_t nl = g->n_layers, nt = g->n_tensors, np = g->n_plugins;
    int32_t zero = 0;
    kiln_field fz = i32_field("parts", &zero);
    CHECK_FAILS(kiln_network_add_plugin(net, "bad", "Split", "1", "test", &fz, 1, &x, 1, outs, 4, &n_out),
                KILN_ERROR_INVALID_ARGUMENT, "layer \"bad\"");
    CHECK(strstr(kiln_last_error(), "must be >= 1, got 0"));
    kiln_field fu = i32_field("pieces", &three);
    CHECK_FAILS(kiln_network_add_plugin(net, "bad", "Split", "1", "test", &fu, 1, &x, 1, outs, 4, &n_out),
                KILN_ERROR_INVALID_ARGUMENT, "pieces");
    CHECK_FAILS(kiln_network_add_plugin(net, "bad", "Split", "1", "test", NULL, 0, NULL, 0, outs, 4, &n_out),
                KILN_ERROR_SHAPE, "layer \"bad\"");
    CHECK(strstr(kiln_last_error(), "Split needs one input"));
    CHECK(g->n_layers == nl && g->n_tensors == nt && g->n_plugins == np);
    CHECK(split_live == 2);

    /* a graph copy clones the instances */
    kiln_graph copy;
    CHECK_OK(kiln_graph_copy(&copy, g));
    CHECK(split_live == 4 && copy.plugins[0].instance != g->plugins[0].instance);
    kiln_graph_free(&copy);
    kiln_network_destroy(net);
    kiln_network_destroy(plain);
    CHECK(split_live == 0);
    kiln_registry_destroy(reg);
}

static const test_case_ tests[] = {
    TEST(test_inputs),
    TEST(test_constants),
    TEST(test_profiles),
    TEST(test_matmul),
    TEST(test_binary),
    TEST(test_unary_reduce_softmax_cast),
    TEST(test_concat_slice_gather),
    TEST(test_shuffle),
    TEST(test_outputs_and_names),
    TEST(test_op_names),
    TEST(test_plugin),
};
TEST_MAIN(tests)
