/* Builder passes: validation, shape checks, dead-layer removal, constant
 * folding, fusion, workspace sizing, memory planning, and the public
 * kiln_build / kiln_build_to_file. Networks are built through the public
 * network API; the planned graph is inspected through the internal graph. */
#include "test.h"

#include <stdint.h>
#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "builder/builder_passes.h"
#include "core/dtype.h"
#include "engine/engine_file.h"
#include "network/network_internal.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static kiln_dims dims1(int64_t a)
{
    kiln_dims d = {0};
    d.rank = 1;
    d.d[0] = a;
    return d;
}

static kiln_dims dims2(int64_t a, int64_t b)
{
    kiln_dims d = {0};
    d.rank = 2;
    d.d[0] = a;
    d.d[1] = b;
    return d;
}

static kiln_build_config config_with(uint32_t flags)
{
    kiln_build_config c;
    kiln_build_config_init(&c);
    c.flags = flags;
    return c;
}

static kiln_tensor input(kiln_network *net, const char *name, kiln_dims d)
{
    kiln_tensor t = {-1};
    CHECK_OK(kiln_network_add_input(net, name, KILN_DTYPE_F32, &d, &t));
    return t;
}

static kiln_tensor binary(kiln_network *net, const char *name, kiln_binary_op op, kiln_tensor a, kiln_tensor b)
{
    kiln_tensor t = {-1};
    CHECK_OK(kiln_network_add_binary(net, name, op, a, b, &t));
    return t;
}

static kiln_tensor unary(kiln_network *net, const char *name, kiln_unary_op op, kiln_tensor x)
{
    kiln_tensor t = {-1};
    CHECK_OK(kiln_network_add_unary(net, name, op, x, &t));
    return t;
}

static kiln_tensor constant(kiln_network *net, const char *name, kiln_dims d, const float *v)
{
    kiln_tensor t = {-1};
    CHECK_OK(kiln_network_add_constant(net, name, KILN_DTYPE_F32, &d, v, &t));
    return t;
}

static int32_t count_op(const kiln_graph *g, kiln_op op)
{
    int32_t n = 0;
    for (int32_t i = 0; i < g->n_layers; i++)
        n += g->layers[i].op == op;
    return n;
}

/* Concrete dims of every tensor of g for one profile bound. */
static void shapes_at(const kiln_graph *g, int32_t profile, int which, kiln_dims *dims)
{
    int64_t sym[16] = {0};
    int64_t *values = calloc((size_t)g->exprs.n + 1, sizeof *values);
    if (g->n_profiles > 0)
        kiln_graph_profile_symbols(g, profile, which, sym);
    CHECK_OK(kiln_graph_eval_shapes(g, sym, values, dims));
    free(values);
}

/* Runs every layer of g on the CPU backend. planned: non-constant tensors
 * live in one arena at their planned offsets (filled with NaN bytes first so
 * a read of an unwritten slot shows); otherwise each has its own buffer.
 * `in` holds the inputs in declaration order (f32); returns output
 * `out_index` as f32 (malloc'd) with its element count in *n_out. */
static float *execute_output(const kiln_graph *g, int planned, int32_t profile, int which, const float *const *in,
                             int32_t out_index, int64_t *n_out)
{
    int32_t nt = g->n_tensors;
    kiln_dims *dims = calloc((size_t)nt, sizeof *dims);
    void **ptr = calloc((size_t)nt, sizeof *ptr);
    shapes_at(g, profile, which, dims);
    unsigned char *arena = NULL;
    if (planned) {
        arena = malloc(g->arena_size + 1);
        memset(arena, 0xff, g->arena_size + 1);
    }
    for (int32_t t = 0; t < nt; t++) {
        const kiln_tensor_rec *r = &g->tensors[t];
        size_t bytes = 0;
        CHECK_OK(kiln_dims_bytes(&dims[t], r->dtype, &bytes));
        if (r->flags & KILN_TENSOR_CONSTANT) {
            ptr[t] = r->data;
        } else if (planned) {
            CHECK(r->arena_offset >= 0 && (size_t)r->arena_offset + bytes <= g->arena_size);
            ptr[t] = arena + r->arena_offset;
        } else {
            ptr[t] = malloc(bytes + 1);
        }
    }
    for (int32_t i = 0; i < g->n_inputs; i++) {
        int32_t t = g->inputs[i];
        int64_t n = 0;
        CHECK_OK(kiln_dims_count(&dims[t], &n));
        kiln_convert(ptr[t], g->tensors[t].dtype, in[i], KILN_DTYPE_F32, n);
    }
    for (int32_t i = 0; i < g->n_layers; i++) {
        const kiln_layer *l = &g->layers[i];
        kiln_exec_tensor xi[16], xo[4];
        for (int32_t k = 0; k < l->n_inputs; k++)
            xi[k] = (kiln_exec_tensor){ptr[l->inputs[k]], g->tensors[l->inputs[k]].dtype, dims[l->inputs[k]]};
        for (int32_t k = 0; k < l->n_outputs; k++)
            xo[k] = (kiln_exec_tensor){ptr[l->outputs[k]], g->tensors[l->outputs[k]].dtype, dims[l->outputs[k]]};
        kiln_cpu_args a;
        memset(&a, 0, sizeof a);
        a.graph = g;
        a.layer = l;
        a.inputs = xi;
        a.outputs = xo;
        a.plugin = l->op == KILN_OP_PLUGIN ? g->plugins[l->p.plugin.index].instance : NULL;
        CHECK_OK(kiln_cpu_run_layer(&a));
    }
    int32_t o = g->outputs[out_index];
    CHECK_OK(kiln_dims_count(&dims[o], n_out));
    float *out = malloc((size_t)(*n_out > 0 ? *n_out : 1) * sizeof *out);
    kiln_convert(out, KILN_DTYPE_F32, ptr[o], g->tensors[o].dtype, *n_out);
    if (!planned)
        for (int32_t t = 0; t < nt; t++)
            if (!(g->tensors[t].flags & KILN_TENSOR_CONSTANT))
                free(ptr[t]);
    free(arena);
    free(ptr);
    free(dims);
    return out;
}

static float *execute(const kiln_graph *g, int planned, int32_t profile, int which, const float *const *in,
                      int64_t *n_out)
{
    return execute_output(g, planned, profile, which, in, 0, n_out);
}

/* Live interval of every tensor, computed here independently of the
 * builder: inputs and outputs live through the whole run, an activation
 * from its producer to its last consumer. */
static void lifetimes(const kiln_graph *g, int32_t *start, int32_t *end)
{
    for (int32_t t = 0; t < g->n_tensors; t++) {
        start[t] = g->tensors[t].producer;
        end[t] = g->tensors[t].producer;
        if (g->tensors[t].flags & (KILN_TENSOR_INPUT | KILN_TENSOR_OUTPUT)) {
            start[t] = -1;
            end[t] = g->n_layers;
        }
    }
    for (int32_t i = 0; i < g->n_layers; i++)
        for (int32_t k = 0; k < g->layers[i].n_inputs; k++) {
            int32_t t = g->layers[i].inputs[k];
            if (end[t] < i)
                end[t] = i;
        }
}

/* No two tensors whose lifetimes meet share arena bytes (all pairs), every
 * offset is 256-aligned, every slot fits the arena and holds the tensor at
 * every profile bound. Returns the naive sum of slot sizes. */
static size_t check_plan(const kiln_graph *g)
{
    int32_t nt = g->n_tensors;
    int32_t *start = calloc((size_t)nt, sizeof *start), *end = calloc((size_t)nt, sizeof *end);
    lifetimes(g, start, end);
    size_t naive = 0;
    kiln_dims *dims = calloc((size_t)nt, sizeof *dims);
    int32_t n_bounds = g->n_profiles > 0 ? g->n_profiles : 1;
    for (int32_t p = 0; p < n_bounds; p++)
        for (int w = 0; w < 3; w++) {
            shapes_at(g, p, w, dims);
            for (int32_t t = 0; t < nt; t++) {
                size_t bytes = 0;
                CHECK_OK(kiln_dims_bytes(&dims[t], g->tensors[t].dtype, &bytes));
                if (!(g->tensors[t].flags & KILN_TENSOR_CONSTANT))
                    CHECK(bytes <= g->tensors[t].max_bytes);
            }
        }
    for (int32_t a = 0; a < nt; a++) {
        const kiln_tensor_rec *ra = &g->tensors[a];
        if (ra->flags & KILN_TENSOR_CONSTANT) {
            CHECK(ra->arena_offset == -1);
            continue;
        }
        naive += ra->max_bytes;
        CHECK(ra->arena_offset >= 0);
        CHECK(ra->arena_offset % 256 == 0);
        CHECK(ra->max_bytes % 256 == 0);
        CHECK((size_t)ra->arena_offset + ra->max_bytes <= g->arena_size);
        for (int32_t b = a + 1; b < nt; b++) {
            const kiln_tensor_rec *rb = &g->tensors[b];
            if (rb->flags & KILN_TENSOR_CONSTANT)
                continue;
            int live_together = !(end[a] < start[b] || end[b] < start[a]);
            int64_t a0 = ra->arena_offset, a1 = a0 + (int64_t)ra->max_bytes;
            int64_t b0 = rb->arena_offset, b1 = b0 + (int64_t)rb->max_bytes;
            int overlap = a0 < b1 && b0 < a1 && ra->max_bytes > 0 && rb->max_bytes > 0;
            if (live_together && overlap)
                fprintf(stderr, "tensors \"%s\" and \"%s\" overlap\n", ra->name, rb->name);
            CHECK(!(live_together && overlap));
        }
    }
    free(start);
    free(end);
    free(dims);
    return naive;
}

/* ---- dead-layer removal ------------------------------------------------------------------- */

static void test_dce_removes_unused_branch(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims1(8));
    input(net, "unused_input", dims1(3));
    kiln_tensor a = unary(net, "a", KILN_UNARY_RELU, x);
    kiln_tensor b = unary(net, "b", KILN_UNARY_EXP, x);
    unary(net, "c", KILN_UNARY_NEG, b);
    CHECK_OK(kiln_network_mark_output(net, a, NULL));

    kiln_build_config cfg = config_with(KILN_BUILD_NO_FUSION);
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_layers == 1);
    CHECK(kiln_graph_find_layer(&g, "a") == 0);
    CHECK(kiln_graph_find_layer(&g, "b") == -1 && kiln_graph_find_layer(&g, "c") == -1);
    CHECK(kiln_graph_find_tensor(&g, "b") == -1 && kiln_graph_find_tensor(&g, "c") == -1);
    /* Inputs stay, even unused, and indices are remapped consistently. */
    CHECK(g.n_inputs == 2);
    CHECK(g.n_inputs == 2 && strcmp(g.tensors[g.inputs[1]].name, "unused_input") == 0);
    CHECK(g.n_tensors == 3);
    CHECK(g.layers[0].inputs[0] == kiln_graph_find_tensor(&g, "x"));
    CHECK(g.outputs[0] == g.layers[0].outputs[0] && g.tensors[g.outputs[0]].producer == 0);
    /* The network itself is untouched. */
    CHECK(net->graph.n_layers == 3);
    kiln_graph_free(&g);
    kiln_network_destroy(net);
}

/* ---- constant folding ---------------------------------------------------------------------- */

static void test_fold_constants(void)
{
    static const float c1v[3] = {1, 2, 3}, c2v[3] = {10, 20, 30};
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims1(3));
    kiln_tensor c1 = constant(net, "c1", dims1(3), c1v);
    kiln_tensor c2 = constant(net, "c2", dims1(3), c2v);
    kiln_tensor s = binary(net, "s", KILN_BINARY_ADD, c1, c2);
    kiln_tensor t = unary(net, "t", KILN_UNARY_NEG, s);
    kiln_tensor y = binary(net, "y", KILN_BINARY_MUL, x, t);
    kiln_tensor z = binary(net, "z", KILN_BINARY_ADD, y, s);
    CHECK_OK(kiln_network_mark_output(net, z, NULL));

    kiln_build_config cfg = config_with(KILN_BUILD_NO_FUSION);
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_layers == 2);
    int32_t ts = kiln_graph_find_tensor(&g, "s"), tt = kiln_graph_find_tensor(&g, "t");
    CHECK(ts >= 0 && tt >= 0);
    if (ts >= 0 && tt >= 0) {
        /* s = c1 + c2, t = -s: computed by hand. */
        const kiln_tensor_rec *rs = &g.tensors[ts], *rt = &g.tensors[tt];
        CHECK((rs->flags & KILN_TENSOR_CONSTANT) && (rt->flags & KILN_TENSOR_CONSTANT));
        CHECK(rs->producer == -1 && rs->data_size == 12 && rs->data_owned);
        const float want_s[3] = {11, 22, 33};
        for (int i = 0; i < 3 && rs->data && rt->data; i++) {
            CHECK_NEAR(((const float *)rs->data)[i], want_s[i], 0);
            CHECK_NEAR(((const float *)rt->data)[i], -want_s[i], 0);
        }
        CHECK(rs->arena_offset == -1);
    }
    /* The folded-away inputs are gone. */
    CHECK(kiln_graph_find_tensor(&g, "c1") == -1 && kiln_graph_find_tensor(&g, "c2") == -1);
    CHECK(kiln_graph_find_layer(&g, "s") == -1 && kiln_graph_find_layer(&g, "t") == -1);

    /* x = {1,2,3}: z = x * -(c1+c2) + (c1+c2) = {0, -22, -66}. */
    const float xv[3] = {1, 2, 3};
    const float *ins[1] = {xv};
    int64_t n = 0;
    float *out = execute(&g, 1, 0, 2, ins, &n);
    CHECK(n == 3);
    CHECK_NEAR(out[0], 0, 0);
    CHECK_NEAR(out[1], -22, 0);
    CHECK_NEAR(out[2], -66, 0);
    free(out);
    kiln_graph_free(&g);

    cfg = config_with(KILN_BUILD_NO_FUSION | KILN_BUILD_NO_CONSTANT_FOLDING);
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_layers == 4);
    kiln_graph_free(&g);
    kiln_network_destroy(net);
}

/* A layer whose output is a network output is not folded: outputs are
 * written into the caller's buffers, constants never are. */
static void test_fold_keeps_outputs(void)
{
    static const float v[2] = {1, 2};
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor c = constant(net, "c", dims1(2), v);
    kiln_tensor e = unary(net, "e", KILN_UNARY_NEG, c);
    CHECK_OK(kiln_network_mark_output(net, e, NULL));
    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_layers == 1);
    CHECK(g.n_layers == 1 && !(g.tensors[g.outputs[0]].flags & KILN_TENSOR_CONSTANT));
    kiln_graph_free(&g);
    kiln_network_destroy(net);
}

/* ---- fusion -------------------------------------------------------------------------------- */

static void test_fuse_chain(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims2(2, 3));
    kiln_tensor y = input(net, "y", dims2(2, 3));
    kiln_tensor z = input(net, "z", dims1(3));
    kiln_tensor a = binary(net, "add_1", KILN_BINARY_ADD, x, y);
    kiln_tensor r = unary(net, "relu_2", KILN_UNARY_RELU, a);
    kiln_tensor m = binary(net, "mul_3", KILN_BINARY_MUL, r, z);
    CHECK_OK(kiln_network_mark_output(net, m, NULL));

    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_layers == 1);
    if (g.n_layers == 1) {
        const kiln_layer *l = &g.layers[0];
        CHECK(l->op == KILN_OP_FUSED);
        CHECK(strcmp(l->name, "fused(add_1+relu_2+mul_3)") == 0);
        CHECK(l->p.fused.n_steps == 3);
        CHECK(l->n_inputs == 3);
        CHECK(l->n_inputs == 3 && l->inputs[0] == kiln_graph_find_tensor(&g, "x") &&
              l->inputs[1] == kiln_graph_find_tensor(&g, "y") && l->inputs[2] == kiln_graph_find_tensor(&g, "z"));
        /* Operands: 0..2 inputs, 3.. earlier steps. */
        const kiln_fused_step *s = l->p.fused.steps;
        CHECK(s[0].is_binary && s[0].op == KILN_BINARY_ADD && s[0].a == 0 && s[0].b == 1);
        CHECK(!s[1].is_binary && s[1].op == KILN_UNARY_RELU && s[1].a == 3);
        CHECK(s[2].is_binary && s[2].op == KILN_BINARY_MUL && s[2].a == 4 && s[2].b == 2);
        CHECK(s[0].src_layer == 0 && s[1].src_layer == 1 && s[2].src_layer == 2);
        CHECK(l->outputs[0] == g.outputs[0]);
    }
    /* The intermediates are gone. */
    CHECK(kiln_graph_find_tensor(&g, "add_1") == -1 && kiln_graph_find_tensor(&g, "relu_2") == -1);

    /* relu(x + y) * z, by hand. */
    const float xv[6] = {1, -2, 3, -4, 5, -6}, yv[6] = {0.5f, 1, -4, 1, 1, 1}, zv[3] = {2, 3, 4};
    const float want[6] = {3, 0, 0, 0, 18, 0};
    const float *ins[3] = {xv, yv, zv};
    int64_t n = 0;
    float *out = execute(&g, 1, 0, 2, ins, &n);
    CHECK(n == 6);
    for (int i = 0; i < 6 && n == 6; i++)
        CHECK_NEAR(out[i], want[i], 1e-6);
    free(out);
    kiln_graph_free(&g);
    kiln_network_destroy(net);
}

static void test_fuse_respects_consumers_outputs_and_shapes(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims2(2, 3));
    kiln_tensor y = input(net, "y", dims2(2, 3));
    kiln_tensor b = input(net, "b", dims1(3));
    /* a feeds two layers: it stays; r, e, o (one consumer each) fuse. */
    kiln_tensor a = binary(net, "a", KILN_BINARY_ADD, x, y);
    kiln_tensor r = unary(net, "r", KILN_UNARY_RELU, a);
    kiln_tensor e = unary(net, "e", KILN_UNARY_EXP, a);
    kiln_tensor o = binary(net, "o", KILN_BINARY_ADD, r, e);
    CHECK_OK(kiln_network_mark_output(net, o, NULL));
    /* u has another shape than the final output: no fusion of u into w. */
    kiln_tensor u = unary(net, "u", KILN_UNARY_SIGMOID, b);
    kiln_tensor w = binary(net, "w", KILN_BINARY_MUL, x, u);
    CHECK_OK(kiln_network_mark_output(net, w, NULL));
    /* q is a network output: q stays its own layer. */
    kiln_tensor q = unary(net, "q", KILN_UNARY_TANH, y);
    kiln_tensor q2 = unary(net, "q2", KILN_UNARY_NEG, q);
    CHECK_OK(kiln_network_mark_output(net, q, NULL));
    CHECK_OK(kiln_network_mark_output(net, q2, NULL));

    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    int32_t la = kiln_graph_find_layer(&g, "a");
    CHECK(la >= 0 && g.layers[la].op == KILN_OP_BINARY);
    int32_t lf = kiln_graph_find_layer(&g, "fused(r+e+o)");
    CHECK(lf >= 0);
    if (lf >= 0) {
        CHECK(g.layers[lf].p.fused.n_steps == 3);
        CHECK(g.layers[lf].n_inputs == 1 && g.layers[lf].inputs[0] == g.layers[la].outputs[0]);
    }
    CHECK(kiln_graph_find_layer(&g, "u") >= 0 && kiln_graph_find_layer(&g, "w") >= 0);
    CHECK(kiln_graph_find_layer(&g, "q") >= 0 && kiln_graph_find_layer(&g, "q2") >= 0);
    CHECK(g.n_layers == 6);
    CHECK(count_op(&g, KILN_OP_FUSED) == 1);

    /* Same results with and without fusion. */
    const float xv[6] = {1, -2, 3, -4, 5, -6}, yv[6] = {0.5f, 1, -4, 1, 1, 1}, bv[3] = {0, 1, -1};
    const float *ins[3] = {xv, yv, bv};
    kiln_graph plain;
    kiln_build_config off = config_with(KILN_BUILD_NO_FUSION);
    CHECK_OK(kiln_builder_run(&net->graph, &off, &plain));
    CHECK(count_op(&plain, KILN_OP_FUSED) == 0);
    int64_t n1 = 0, n2 = 0;
    float *o1 = execute(&g, 1, 0, 2, ins, &n1);
    float *o2 = execute(&plain, 1, 0, 2, ins, &n2);
    CHECK(n1 == 6 && n2 == 6);
    for (int i = 0; i < 6 && n1 == 6 && n2 == 6; i++) {
        float av = xv[i] + yv[i];
        CHECK_NEAR(o1[i], (av > 0 ? av : 0) + expf(av), 1e-5);
        CHECK_NEAR(o2[i], o1[i], 1e-5);
    }
    free(o1);
    free(o2);
    kiln_graph_free(&plain);
    kiln_graph_free(&g);
    kiln_network_destroy(net);
}

/* More steps than KILN_FUSED_MAX_STEPS split into several fused layers. */
static void test_fuse_step_limit(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor t = input(net, "x", dims1(4));
    char name[32];
    int n_layers = KILN_FUSED_MAX_STEPS + 4;
    for (int i = 0; i < n_layers; i++) {
        snprintf(name, sizeof name, "n%d", i);
        t = unary(net, name, KILN_UNARY_NEG, t);
    }
    CHECK_OK(kiln_network_mark_output(net, t, NULL));
    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_layers == 2);
    int32_t total = 0;
    for (int32_t i = 0; i < g.n_layers; i++) {
        CHECK(g.layers[i].op == KILN_OP_FUSED);
        CHECK(g.layers[i].p.fused.n_steps <= KILN_FUSED_MAX_STEPS);
        total += g.layers[i].p.fused.n_steps;
    }
    CHECK(total == n_layers);
    /* An even number of negations is the identity. */
    const float xv[4] = {1, -2, 3.5f, 0};
    const float *ins[1] = {xv};
    int64_t n = 0;
    float *out = execute(&g, 1, 0, 2, ins, &n);
    for (int i = 0; i < 4 && n == 4; i++)
        CHECK_NEAR(out[i], xv[i], 0);
    free(out);
    kiln_graph_free(&g);
    kiln_network_destroy(net);
}

/* More distinct external inputs than KILN_FUSED_MAX_INPUTS: every fused
 * layer stays within the limit and the sum is still right. */
static void test_fuse_input_limit(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    enum { N = KILN_FUSED_MAX_INPUTS + 4 };
    kiln_tensor xs[N];
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "x%d", i);
        xs[i] = input(net, name, dims1(2));
    }
    kiln_tensor acc = xs[0];
    for (int i = 1; i < N; i++) {
        snprintf(name, sizeof name, "s%d", i);
        acc = binary(net, name, KILN_BINARY_ADD, acc, xs[i]);
    }
    CHECK_OK(kiln_network_mark_output(net, acc, NULL));
    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_layers == 2);
    for (int32_t i = 0; i < g.n_layers; i++)
        CHECK(g.layers[i].op == KILN_OP_FUSED && g.layers[i].n_inputs <= KILN_FUSED_MAX_INPUTS);
    float v[N][2];
    const float *ins[N];
    for (int i = 0; i < N; i++) {
        v[i][0] = (float)i;
        v[i][1] = (float)(2 * i);
        ins[i] = v[i];
    }
    int64_t n = 0;
    float *out = execute(&g, 1, 0, 2, ins, &n);
    /* 0 + 1 + ... + (N-1), and twice that. */
    CHECK(n == 2);
    CHECK_NEAR(out[0], N * (N - 1) / 2, 0);
    CHECK_NEAR(out[1], N * (N - 1), 0);
    free(out);
    kiln_graph_free(&g);
    kiln_network_destroy(net);
}

/* The shape constraints of fused layers move to the fused layer, so the
 * runtime still checks them and names the layer that exists. */
static void test_fuse_moves_constraints(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims1(-1));
    kiln_tensor y = input(net, "y", dims1(-1));
    kiln_tensor a = binary(net, "a", KILN_BINARY_ADD, x, y);
    kiln_tensor r = unary(net, "r", KILN_UNARY_RELU, a);
    CHECK_OK(kiln_network_mark_output(net, r, NULL));
    int32_t p = -1;
    CHECK_OK(kiln_network_add_profile(net, &p));
    kiln_dims lo = dims1(1), hi = dims1(8);
    CHECK_OK(kiln_network_set_profile_shape(net, p, "x", &lo, &hi, &hi));
    CHECK_OK(kiln_network_set_profile_shape(net, p, "y", &lo, &lo, &lo));
    CHECK(net->graph.n_constraints >= 1);
    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_layers == 1 && g.n_constraints == net->graph.n_constraints);
    for (int32_t i = 0; i < g.n_constraints; i++)
        CHECK(g.constraints[i].layer == 0);
    /* x = 3, y = 2 cannot broadcast: the error names the fused layer. */
    int64_t sym[2] = {3, 2};
    int64_t *values = calloc((size_t)g.exprs.n, sizeof *values);
    kiln_dims *dims = calloc((size_t)g.n_tensors, sizeof *dims);
    CHECK_OK(kiln_graph_eval_shapes(&g, sym, values, dims));
    CHECK_FAILS(kiln_graph_check_constraints(&g, values), KILN_ERROR_SHAPE, "layer \"fused(a+r)\"");
    free(values);
    free(dims);
    kiln_graph_free(&g);
    kiln_network_destroy(net);
}

/* ---- memory plan ----------------------------------------------------------------------------- */

static void test_memory_plan_chain(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor t = input(net, "x", dims2(64, 64));
    char name[32];
    for (int i = 0; i < 12; i++) {
        snprintf(name, sizeof name, "l%d", i);
        t = unary(net, name, i % 2 ? KILN_UNARY_TANH : KILN_UNARY_NEG, t);
    }
    CHECK_OK(kiln_network_mark_output(net, t, NULL));
    kiln_build_config cfg = config_with(KILN_BUILD_NO_FUSION);
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_layers == 12);
    size_t naive = check_plan(&g);
    /* 13 slots of 16 KiB; a chain needs the input, the output and two
     * alternating intermediates at most. */
    CHECK(naive == 13u * 16384u);
    CHECK(g.arena_size < naive);
    CHECK(g.arena_size <= 4u * 16384u);
    kiln_graph_free(&g);
    kiln_network_destroy(net);
}

/* A DAG with long- and short-lived tensors, dynamic dims and two profiles
 * whose maxima differ per input; then the planned graph runs on the CPU
 * and matches the unplanned network graph. */
static void test_memory_plan_dag_matches_unplanned(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims2(-1, 16));
    kiln_tensor w = input(net, "w", dims2(16, -1));
    int32_t p0 = -1, p1 = -1;
    CHECK_OK(kiln_network_add_profile(net, &p0));
    CHECK_OK(kiln_network_add_profile(net, &p1));
    kiln_dims a = dims2(1, 16), b = dims2(4, 16), c = dims2(8, 16);
    CHECK_OK(kiln_network_set_profile_shape(net, p0, "x", &a, &b, &c));
    kiln_dims wa = dims2(16, 1), wb = dims2(16, 8), wc = dims2(16, 32);
    CHECK_OK(kiln_network_set_profile_shape(net, p0, "w", &wa, &wb, &wc));
    kiln_dims a1 = dims2(2, 16), b1 = dims2(16, 16), c1 = dims2(32, 16);
    CHECK_OK(kiln_network_set_profile_shape(net, p1, "x", &a1, &b1, &c1));
    kiln_dims wa1 = dims2(16, 2), wb1 = dims2(16, 2), wc1 = dims2(16, 4);
    CHECK_OK(kiln_network_set_profile_shape(net, p1, "w", &wa1, &wb1, &wc1));

    kiln_tensor h = binary(net, "h", KILN_BINARY_MUL, x, x);
    kiln_tensor mm = {-1};
    CHECK_OK(kiln_network_add_matmul(net, "mm", h, 0, w, 0, &mm));
    kiln_tensor s = unary(net, "s", KILN_UNARY_SILU, mm);
    kiln_tensor mm2 = {-1};
    CHECK_OK(kiln_network_add_matmul(net, "mm2", s, 0, w, 1, &mm2));
    kiln_tensor r = binary(net, "r", KILN_BINARY_ADD, mm2, h);
    kiln_tensor red = {-1};
    CHECK_OK(kiln_network_add_reduce(net, "red", KILN_REDUCE_SUM, r, 2u, 1, &red));
    kiln_tensor out = binary(net, "out", KILN_BINARY_SUB, r, red);
    CHECK_OK(kiln_network_mark_output(net, out, NULL));

    for (int fuse = 0; fuse < 2; fuse++) {
        kiln_build_config cfg = config_with(fuse ? 0 : KILN_BUILD_NO_FUSION);
        kiln_graph g;
        CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
        check_plan(&g);
        /* x at profile 1 max is 32x16 f32 = 2 KiB; mm at profile 0 max is
         * 8x32 (1 KiB) and at profile 1 max 32x4 (512 B). */
        int32_t tmm = kiln_graph_find_tensor(&g, "mm");
        CHECK(g.tensors[g.inputs[0]].max_bytes == 2048);
        CHECK(tmm >= 0 && g.tensors[tmm].max_bytes == 1024);

        /* Run at the opt shapes of each profile. */
        for (int p = 0; p < 2; p++) {
            float *xv = malloc(sizeof(float) * 32 * 16), *wv = malloc(sizeof(float) * 16 * 32);
            for (int i = 0; i < 32 * 16; i++) {
                xv[i] = (float)((i * 7) % 11) / 11.0f - 0.4f;
                wv[i] = (float)((i * 5) % 13) / 13.0f - 0.5f;
            }
            const float *ins[2] = {xv, wv};
            int64_t n1 = 0, n2 = 0;
            float *o1 = execute(&g, 1, p, 1, ins, &n1);
            float *o2 = execute(&net->graph, 0, p, 1, ins, &n2);
            CHECK(n1 == n2 && n1 > 0);
            for (int64_t i = 0; i < n1 && n1 == n2; i++)
                CHECK_NEAR(o1[i], o2[i], 1e-4 * (1 + fabs(o2[i])));
            free(o1);
            free(o2);
            free(xv);
            free(wv);
        }
        kiln_graph_free(&g);
    }
    kiln_network_destroy(net);
}

/* Random DAGs of elementwise, reduce, softmax and matmul layers over a
 * dynamic batch, with constant-only branches and dead branches: the built
 * graph (all passes) must keep the memory plan invariants and compute
 * exactly what the unbuilt network computes, at every profile bound. */
static uint32_t rng_next(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static void test_random_graphs_match_unplanned(void)
{
    static const kiln_binary_op bops[] = {KILN_BINARY_ADD, KILN_BINARY_SUB, KILN_BINARY_MUL, KILN_BINARY_MAX,
                                          KILN_BINARY_MIN};
    static const kiln_unary_op uops[] = {KILN_UNARY_NEG,     KILN_UNARY_ABS,  KILN_UNARY_TANH,
                                         KILN_UNARY_SIGMOID, KILN_UNARY_RELU, KILN_UNARY_SILU};
    float wv[64], cv[8], dv[8];
    for (int i = 0; i < 64; i++)
        wv[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    for (int i = 0; i < 8; i++) {
        cv[i] = 0.25f * (float)i - 1.0f;
        dv[i] = 0.5f - 0.125f * (float)i;
    }
    float xv[32 * 8];
    for (int i = 0; i < 32 * 8; i++)
        xv[i] = (float)((i * 29) % 23) / 23.0f * 2.0f - 1.0f;
    const float *ins[1] = {xv};
    uint32_t seed = 12345;
    int32_t n_fused = 0, n_folded = 0, n_removed = 0;
    for (int round = 0; round < 40; round++) {
        kiln_network *net = NULL;
        CHECK_OK(kiln_network_create(NULL, &net));
        kiln_tensor pool[64];
        int np = 0;
        pool[np++] = input(net, "x", dims2(-1, 8));
        pool[np++] = constant(net, "c", dims1(8), cv);
        pool[np++] = constant(net, "d", dims2(1, 8), dv);
        kiln_tensor w = constant(net, "w", dims2(8, 8), wv);
        int32_t p = -1;
        kiln_dims a0 = dims2(1, 8), a1 = dims2(5, 8), a2 = dims2(32, 8);
        CHECK_OK(kiln_network_add_profile(net, &p));
        CHECK_OK(kiln_network_set_profile_shape(net, p, "x", &a0, &a1, &a2));
        CHECK_OK(kiln_network_add_profile(net, &p));
        CHECK_OK(kiln_network_set_profile_shape(net, p, "x", &a1, &a1, &a1));
        int n_layers = 4 + (int)(rng_next(&seed) % 20);
        char name[32];
        for (int i = 0; i < n_layers && np < 64; i++) {
            snprintf(name, sizeof name, "L%d", i);
            /* Mostly recent tensors, so chains form; sometimes old ones. */
            int ia = np - 1 - (int)(rng_next(&seed) % (np < 4 ? np : 4));
            int ib = (int)(rng_next(&seed) % np);
            kiln_tensor t = {-1};
            switch (rng_next(&seed) % 8) {
            case 0:
            case 1:
            case 2: t = binary(net, name, bops[rng_next(&seed) % 5], pool[ia], pool[ib]); break;
            case 3:
            case 4:
            case 5: t = unary(net, name, uops[rng_next(&seed) % 6], pool[ia]); break;
            case 6: {
                int32_t rank = 0;
                CHECK_OK(kiln_network_tensor_info(net, pool[ia], NULL, &rank));
                if (rank == 2)
                    CHECK_OK(kiln_network_add_softmax(net, name, pool[ia], 1, &t));
                else
                    t = unary(net, name, KILN_UNARY_TANH, pool[ia]);
                break;
            }
            default: CHECK_OK(kiln_network_add_matmul(net, name, pool[ia], 0, w, 0, &t)); break;
            }
            pool[np++] = t;
        }
        /* The last tensor and sometimes an earlier one are outputs. */
        CHECK_OK(kiln_network_mark_output(net, pool[np - 1], NULL));
        int extra = 3 + (int)(rng_next(&seed) % (uint32_t)(np - 3));
        if (extra != np - 1 && rng_next(&seed) % 2) {
            kiln_tensor_rec *r = &net->graph.tensors[pool[extra].id];
            if (!(r->flags & KILN_TENSOR_CONSTANT))
                CHECK_OK(kiln_network_mark_output(net, pool[extra], NULL));
        }
        kiln_build_config cfg = config_with(0);
        kiln_graph g;
        CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
        check_plan(&g);
        n_fused += count_op(&g, KILN_OP_FUSED);
        n_removed += net->graph.n_layers - g.n_layers;
        for (int32_t t = 0; t < g.n_tensors; t++)
            n_folded += (g.tensors[t].flags & KILN_TENSOR_CONSTANT) && g.tensors[t].name[0] == 'L';
        for (int32_t o = 0; o < g.n_outputs; o++)
            for (int32_t prof = 0; prof < 2; prof++)
                for (int which = 0; which < 3; which++) {
                    int64_t n1 = 0, n2 = 0;
                    float *o1 = execute_output(&g, 1, prof, which, ins, o, &n1);
                    float *o2 = execute_output(&net->graph, 0, prof, which, ins, o, &n2);
                    CHECK(n1 == n2);
                    int bad = 0;
                    for (int64_t i = 0; i < n1 && n1 == n2; i++)
                        bad += !(fabsf(o1[i] - o2[i]) <= 1e-5f * (1.0f + fabsf(o2[i])));
                    if (bad)
                        fprintf(stderr, "round %d output %d profile %d %s: %d mismatches\n", round, o, prof,
                                which == 0   ? "min"
                                : which == 1 ? "opt"
                                             : "max",
                                bad);
                    CHECK(bad == 0);
                    free(o1);
                    free(o2);
                }
        kiln_graph_free(&g);
        kiln_network_destroy(net);
    }
    /* The generator exercises every rewriting pass. */
    printf("random graphs: %d fused layers, %d folded tensors, %d layers removed\n", n_fused, n_folded, n_removed);
    CHECK(n_fused >= 20 && n_folded >= 5 && n_removed >= 40);
}

/* ---- validation and shape checks ---------------------------------------------------------- */

static void test_profile_without_bounds(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims2(4, -1));
    kiln_tensor r = unary(net, "r", KILN_UNARY_RELU, x);
    CHECK_OK(kiln_network_mark_output(net, r, NULL));
    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_FAILS(kiln_builder_run(&net->graph, &cfg, &g), KILN_ERROR_SHAPE,
                "input \"x\" dim 1 is dynamic but there is no optimization profile");
    int32_t p = -1;
    CHECK_OK(kiln_network_add_profile(net, &p));
    CHECK_FAILS(kiln_builder_run(&net->graph, &cfg, &g), KILN_ERROR_SHAPE,
                "profile 0: input \"x\" dim 1 is dynamic but has no bounds");
    kiln_dims mn = dims2(4, 1), mx = dims2(4, 9);
    CHECK_OK(kiln_network_set_profile_shape(net, p, "x", &mn, &mn, &mx));
    CHECK_OK(kiln_network_add_profile(net, &p));
    CHECK_FAILS(kiln_builder_run(&net->graph, &cfg, &g), KILN_ERROR_SHAPE,
                "profile 1: input \"x\" dim 1 is dynamic but has no bounds");
    CHECK_OK(kiln_network_set_profile_shape(net, p, "x", &mn, &mx, &mx));
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    kiln_graph_free(&g);
    kiln_network_destroy(net);
}

static void test_profile_breaks_broadcast(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims1(-1));
    kiln_tensor y = input(net, "y", dims1(-1));
    kiln_tensor s = binary(net, "sum", KILN_BINARY_ADD, x, y);
    CHECK_OK(kiln_network_mark_output(net, s, NULL));
    int32_t p = -1;
    CHECK_OK(kiln_network_add_profile(net, &p));
    /* min: 1 vs 1, opt: 4 vs 1 broadcast fine; max: 8 vs 4 cannot. */
    kiln_dims x0 = dims1(1), x1 = dims1(4), x2 = dims1(8);
    kiln_dims y0 = dims1(1), y1 = dims1(1), y2 = dims1(4);
    CHECK_OK(kiln_network_set_profile_shape(net, p, "x", &x0, &x1, &x2));
    CHECK_OK(kiln_network_set_profile_shape(net, p, "y", &y0, &y1, &y2));
    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_FAILS(kiln_builder_run(&net->graph, &cfg, &g), KILN_ERROR_SHAPE, "profile 0 (max)");
    CHECK(strstr(kiln_last_error(), "layer \"sum\"") != NULL);
    kiln_network_destroy(net);
}

/* A slice whose start passes the end at a profile's min: the error names
 * the profile, the bound and the layer. */
static void test_negative_dim_names_layer(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims1(-1));
    int64_t start = 5, size = -1, stride = 1;
    kiln_tensor sl = {-1};
    CHECK_OK(kiln_network_add_slice(net, "sl", x, &start, &size, &stride, &sl));
    CHECK_OK(kiln_network_mark_output(net, sl, NULL));
    int32_t p = -1;
    CHECK_OK(kiln_network_add_profile(net, &p));
    kiln_dims lo = dims1(2), hi = dims1(10);
    CHECK_OK(kiln_network_set_profile_shape(net, p, "x", &lo, &hi, &hi));
    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_FAILS(kiln_builder_run(&net->graph, &cfg, &g), KILN_ERROR_SHAPE,
                "profile 0 (min): layer \"sl\": output \"sl\" dim 0 is -3");
    kiln_network_destroy(net);
}

static void test_no_outputs(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims1(2));
    unary(net, "r", KILN_UNARY_RELU, x);
    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_FAILS(kiln_builder_run(&net->graph, &cfg, &g), KILN_ERROR_INVALID_ARGUMENT, "no outputs");
    kiln_buffer buf = {NULL, 0};
    CHECK_FAILS(kiln_build(net, &cfg, &buf), KILN_ERROR_INVALID_ARGUMENT, "no outputs");
    CHECK(buf.data == NULL);
    cfg.backend = (kiln_backend)7;
    kiln_network_mark_output(net, x, NULL);
    CHECK_FAILS(kiln_builder_run(&net->graph, &cfg, &g), KILN_ERROR_INVALID_ARGUMENT, "backend 7");
    kiln_network_destroy(net);
}

/* ---- a test plugin: y = 2x, workspace 4 bytes per input element + 100 ------------------------- */

typedef struct ws_plugin {
    kiln_plugin base;
} ws_plugin;

static int32_t ws_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status ws_output_shapes(const kiln_plugin *self, const kiln_shape_expr *in, int32_t n_in,
                                    kiln_shape_expr *out, int32_t n_out, kiln_expr_builder *eb)
{
    out[0] = in[0];
    return KILN_OK;
}

static kiln_status ws_output_dtypes(const kiln_plugin *self, const kiln_dtype *in, int32_t n_in, kiln_dtype *out,
                                    int32_t n_out)
{
    out[0] = in[0];
    return KILN_OK;
}

static int32_t ws_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *descs, int32_t n_in,
                           int32_t n_out)
{
    return descs[0].dtype == KILN_DTYPE_F32 && descs[1].dtype == KILN_DTYPE_F32;
}

static size_t ws_workspace(const kiln_plugin *self, const kiln_tensor_desc *in, int32_t n_in,
                           const kiln_tensor_desc *out, int32_t n_out)
{
    size_t n = 1;
    for (int32_t i = 0; i < in[0].dims.rank; i++)
        n *= (size_t)in[0].dims.d[i];
    return n * 4 + 100;
}

static kiln_status ws_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *in_descs,
                              const void *const *in, int32_t n_in, const kiln_tensor_desc *out_descs, void *const *out,
                              int32_t n_out, void *workspace, void *stream)
{
    size_t n = 1;
    for (int32_t i = 0; i < in_descs[0].dims.rank; i++)
        n *= (size_t)in_descs[0].dims.d[i];
    for (size_t i = 0; i < n; i++)
        ((float *)out[0])[i] = 2.0f * ((const float *)in[0])[i];
    return KILN_OK;
}

static kiln_status ws_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    *size = 0;
    return KILN_OK;
}

static kiln_status ws_clone(const kiln_plugin *self, kiln_plugin **out);

static void ws_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops ws_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = KILN_BACKEND_BIT(KILN_BACKEND_CPU),
    .num_outputs = ws_num_outputs,
    .output_shapes = ws_output_shapes,
    .output_dtypes = ws_output_dtypes,
    .supports = ws_supports,
    .workspace_size = ws_workspace,
    .enqueue = ws_enqueue,
    .serialize = ws_serialize,
    .clone = ws_clone,
    .destroy = ws_destroy,
};

static kiln_status ws_new(kiln_plugin **out)
{
    ws_plugin *p = calloc(1, sizeof *p);
    if (!p)
        return KILN_ERROR_OUT_OF_MEMORY;
    p->base.struct_size = sizeof p->base;
    p->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    p->base.ops = &ws_ops;
    *out = &p->base;
    return KILN_OK;
}

static kiln_status ws_clone(const kiln_plugin *self, kiln_plugin **out) { return ws_new(out); }

static kiln_status ws_create(const kiln_plugin_creator *c, const kiln_field *f, int32_t n, kiln_plugin **out)
{
    return ws_new(out);
}

static kiln_status ws_deserialize(const kiln_plugin_creator *c, uint32_t v, const void *blob, size_t size,
                                  kiln_plugin **out)
{
    return ws_new(out);
}

static const kiln_plugin_creator ws_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = "BuilderWs",
    .version = "1",
    .plugin_namespace = "test",
    .blob_version = 1,
    .create = ws_create,
    .deserialize = ws_deserialize,
};

static kiln_tensor plugin(kiln_network *net, const char *name, kiln_tensor x)
{
    kiln_tensor out = {-1};
    int32_t n_out = 0;
    CHECK_OK(kiln_network_add_plugin(net, name, "BuilderWs", "1", "test", NULL, 0, &x, 1, &out, 1, &n_out));
    return out;
}

static void test_plugin_workspace_and_backends(void)
{
    kiln_registry *reg = NULL;
    CHECK_OK(kiln_registry_create(&reg));
    CHECK_OK(kiln_host()->register_creator(reg, &ws_creator));
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(reg, &net));
    kiln_tensor x = input(net, "x", dims2(-1, 8));
    int32_t p = -1;
    kiln_dims a = dims2(1, 8), b = dims2(2, 8), c = dims2(16, 8), c1 = dims2(4, 8);
    CHECK_OK(kiln_network_add_profile(net, &p));
    CHECK_OK(kiln_network_set_profile_shape(net, p, "x", &a, &b, &c));
    CHECK_OK(kiln_network_add_profile(net, &p));
    CHECK_OK(kiln_network_set_profile_shape(net, p, "x", &a, &a, &c1));
    /* An unused plugin layer first, so the used one's record moves. */
    plugin(net, "unused_ws", x);
    kiln_tensor y = plugin(net, "ws", x);
    CHECK_OK(kiln_network_mark_output(net, y, NULL));
    CHECK(net->graph.n_plugins == 2);

    kiln_build_config cfg = config_with(0);
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_layers == 1 && g.n_plugins == 1);
    if (g.n_layers == 1 && g.n_plugins == 1) {
        CHECK(g.layers[0].op == KILN_OP_PLUGIN && g.layers[0].p.plugin.index == 0);
        CHECK(strcmp(g.plugins[0].name, "BuilderWs") == 0 && g.plugins[0].instance);
        /* Largest max shape is 16x8: 128 elements * 4 + 100 = 612 bytes,
         * shared workspace rounded up to 768. */
        CHECK(g.layers[0].workspace == 612);
        CHECK(g.workspace_size == 768);
        const float xv[16] = {1, 2, 3, 4, 5, 6, 7, 8, -1, -2, -3, -4, -5, -6, -7, -8};
        const float *ins[1] = {xv};
        int64_t n = 0;
        float *out = execute(&g, 1, 1, 1, ins, &n); /* profile 1 opt: 1x8 */
        CHECK(n == 8);
        for (int i = 0; i < 8 && n == 8; i++)
            CHECK_NEAR(out[i], 2 * xv[i], 0);
        free(out);
    }
    kiln_graph_free(&g);

    /* The plugin has no CUDA implementation: building for CUDA names it. */
    cfg.backend = KILN_BACKEND_CUDA;
    CHECK_FAILS(kiln_builder_run(&net->graph, &cfg, &g), KILN_ERROR_UNSUPPORTED,
                "plugin BuilderWs 1 (namespace \"test\") has no cuda implementation");
    CHECK(strstr(kiln_last_error(), "layer \"unused_ws\"") != NULL);
    kiln_network_destroy(net);

    /* An f16 input is refused by supports(). */
    CHECK_OK(kiln_network_create(reg, &net));
    kiln_dims d = dims1(4);
    kiln_tensor h = {-1};
    CHECK_OK(kiln_network_add_input(net, "h", KILN_DTYPE_F16, &d, &h));
    y = plugin(net, "ws16", h);
    CHECK_OK(kiln_network_mark_output(net, y, NULL));
    cfg.backend = KILN_BACKEND_CPU;
    CHECK_FAILS(kiln_builder_run(&net->graph, &cfg, &g), KILN_ERROR_UNSUPPORTED,
                "layer \"ws16\": plugin BuilderWs 1 does not support dtypes (f16 -> f16) on cpu");
    kiln_network_destroy(net);
    kiln_registry_destroy(reg);
}

/* ---- target, progress, logging, the public build --------------------------------------------- */

static void test_cuda_target(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims1(4));
    kiln_tensor r = unary(net, "r", KILN_UNARY_RELU, x);
    CHECK_OK(kiln_network_mark_output(net, r, NULL));
    kiln_build_config cfg = config_with(0);
    cfg.backend = KILN_BACKEND_CUDA;
    kiln_graph g;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.backend == KILN_BACKEND_CUDA && g.n_gpu_archs == 1 && g.gpu_archs[0] == 90);
    CHECK(g.layers[0].tactic == -1);
    kiln_graph_free(&g);
    cfg.n_gpu_archs = 2;
    cfg.gpu_archs[0] = 80;
    cfg.gpu_archs[1] = 90;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.n_gpu_archs == 2 && g.gpu_archs[0] == 80 && g.gpu_archs[1] == 90);
    kiln_graph_free(&g);
    cfg = config_with(0);
    cfg.n_gpu_archs = 3; /* ignored on the CPU */
    cfg.gpu_archs[0] = cfg.gpu_archs[1] = cfg.gpu_archs[2] = 90;
    CHECK_OK(kiln_builder_run(&net->graph, &cfg, &g));
    CHECK(g.backend == KILN_BACKEND_CPU && g.n_gpu_archs == 0);
    kiln_graph_free(&g);
    kiln_network_destroy(net);

    /* An i32 cast output is not a CUDA native dtype yet. */
    CHECK_OK(kiln_network_create(NULL, &net));
    x = input(net, "x", dims1(4));
    kiln_tensor ci = {-1};
    CHECK_OK(kiln_network_add_cast(net, "to_int", x, KILN_DTYPE_I32, &ci));
    CHECK_OK(kiln_network_mark_output(net, ci, NULL));
    cfg = config_with(0);
    cfg.backend = KILN_BACKEND_CUDA;
    CHECK_FAILS(kiln_builder_run(&net->graph, &cfg, &g), KILN_ERROR_UNSUPPORTED,
                "layer \"to_int\" (cast): output \"to_int\" has dtype i32");
    kiln_network_destroy(net);
}

typedef struct progress_log {
    int n;
    double last;
    int monotone;
    int saw_fusion, saw_memory;
} progress_log;

static void on_progress(void *user, double fraction, const char *what)
{
    progress_log *p = user;
    if (fraction < p->last || fraction < 0 || fraction > 1)
        p->monotone = 0;
    p->last = fraction;
    p->n++;
    p->saw_fusion |= strcmp(what, "fusion") == 0;
    p->saw_memory |= strcmp(what, "memory plan") == 0;
}

typedef struct log_capture {
    char text[8192];
} log_capture;

static void on_log(void *user, kiln_log_level level, const char *msg)
{
    log_capture *c = user;
    if (level != KILN_LOG_INFO)
        return;
    size_t n = strlen(c->text);
    snprintf(c->text + n, sizeof c->text - n, "%s\n", msg);
}

static void test_build_public_api(void)
{
    kiln_network *net = NULL;
    CHECK_OK(kiln_network_create(NULL, &net));
    kiln_tensor x = input(net, "x", dims1(4));
    static const float cv[4] = {1, 2, 3, 4};
    kiln_tensor c = constant(net, "c", dims1(4), cv);
    kiln_tensor e = unary(net, "e", KILN_UNARY_EXP, c);
    kiln_tensor a = binary(net, "a", KILN_BINARY_ADD, x, e);
    kiln_tensor r = unary(net, "r", KILN_UNARY_RELU, a);
    unary(net, "dead", KILN_UNARY_NEG, x);
    CHECK_OK(kiln_network_mark_output(net, r, NULL));

    progress_log p = {0, 0, 1, 0, 0};
    log_capture logs;
    logs.text[0] = '\0';
    kiln_build_config cfg = config_with(0);
    cfg.progress = on_progress;
    cfg.progress_user = &p;
    kiln_set_log(on_log, &logs, KILN_LOG_INFO);
    kiln_buffer buf = {NULL, 0};
    CHECK_OK(kiln_build(net, &cfg, &buf));
    kiln_set_log(NULL, NULL, KILN_LOG_WARNING);
    CHECK(buf.data && buf.size > 8 && memcmp(buf.data, KILN_ENGINE_MAGIC, 8) == 0);
    CHECK(p.n >= 8 && p.monotone && p.last == 1.0 && p.saw_fusion && p.saw_memory);
    CHECK(strstr(logs.text, "dead-layer removal: removed 1 layers (\"dead\")") != NULL);
    CHECK(strstr(logs.text, "constant folding: folded 1 layers (\"e\")") != NULL);
    CHECK(strstr(logs.text, "fusion: \"fused(a+r)\": 2 steps, 2 inputs") != NULL);
    /* x and r, both I/O: none of the context's own bytes */
    CHECK(strstr(logs.text, "memory plan: 2 tensors; a context takes 0 bytes (0.00 MiB) besides the I/O tensors, "
                            "512 bytes (0.00 MiB) with them") != NULL);

    /* The engine reads back with the plan intact. */
    kiln_graph g;
    kiln_engine_header_info info;
    CHECK_OK(kiln_engine_read(buf.data, buf.size, 0, &g, &info));
    CHECK(g.n_layers == 1 && g.layers[0].op == KILN_OP_FUSED && g.arena_size == 512);
    kiln_graph_free(&g);

    /* To a file: written whole (the weights streamed from the network,
     * the same bytes as the engine built in memory), no temp file left
     * behind. */
    char dir[] = "/tmp/kiln_builder_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/model.engine", dir);
    CHECK_OK(kiln_build_to_file(net, NULL, path));
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (f) {
        fseek(f, 0, SEEK_END);
        CHECK((size_t)ftell(f) == buf.size);
        fseek(f, 0, SEEK_SET);
        unsigned char *back = malloc(buf.size);
        CHECK(back && fread(back, 1, buf.size, f) == buf.size && memcmp(back, buf.data, buf.size) == 0);
        free(back);
        fclose(f);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test $(ls -A %s | wc -l) -eq 1", dir);
    CHECK(system(cmd) == 0);
    char bad[300];
    snprintf(bad, sizeof bad, "%s/missing/model.engine", dir);
    CHECK_FAILS(kiln_build_to_file(net, NULL, bad), KILN_ERROR_IO, "missing/model.engine");
    unlink(path);
    rmdir(dir);
    kiln_buffer_free(&buf);
    CHECK(buf.data == NULL && buf.size == 0);
    kiln_buffer_free(NULL);

    /* A config from an older caller (short struct_size) still works. */
    kiln_build_config old = config_with(0);
    old.struct_size = offsetof(kiln_build_config, n_gpu_archs);
    CHECK_OK(kiln_build(net, &old, &buf));
    kiln_buffer_free(&buf);
    old.struct_size = 4;
    CHECK_FAILS(kiln_build(net, &old, &buf), KILN_ERROR_INVALID_ARGUMENT, "struct_size 4");
    kiln_network_destroy(net);
}

static const test_case_ tests[] = {
    TEST(test_dce_removes_unused_branch),
    TEST(test_fold_constants),
    TEST(test_fold_keeps_outputs),
    TEST(test_fuse_chain),
    TEST(test_fuse_respects_consumers_outputs_and_shapes),
    TEST(test_fuse_step_limit),
    TEST(test_fuse_input_limit),
    TEST(test_fuse_moves_constraints),
    TEST(test_memory_plan_chain),
    TEST(test_memory_plan_dag_matches_unplanned),
    TEST(test_random_graphs_match_unplanned),
    TEST(test_profile_without_bounds),
    TEST(test_profile_breaks_broadcast),
    TEST(test_negative_dim_names_layer),
    TEST(test_no_outputs),
    TEST(test_plugin_workspace_and_backends),
    TEST(test_cuda_target),
    TEST(test_build_public_api),
};

TEST_MAIN(tests)
