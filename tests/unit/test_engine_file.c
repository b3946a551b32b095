/* The engine file: write -> read round trips every field of a hand-made
 * graph; the layout is checked against docs/engine-format.md by decoding it
 * here independently; corrupted engines fail cleanly. */
#include "test.h"

#include <jansson.h>
#include <stdint.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "core/error.h"
#include "core/graph.h"
#include "engine/engine_file.h"

/* ---- a fake plugin instance, to exercise the serialize protocol ---------------- */

typedef struct fake_plugin {
    kiln_plugin base;
    char state[8];
} fake_plugin;

static kiln_status fake_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    const fake_plugin *f = (const fake_plugin *)self;
    size_t n = strlen(f->state);
    if (!buf) {
        *size = n;
        return KILN_OK;
    }
    if (*size < n)
        return KILN_ERROR_INVALID_ARGUMENT;
    memcpy(buf, f->state, n);
    *size = n;
    return KILN_OK;
}

static void fake_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops fake_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .serialize = fake_serialize,
    .destroy = fake_destroy,
};

static const kiln_plugin_creator fake_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = "Fake",
    .version = "1",
    .plugin_namespace = "",
    .blob_version = 7,
};

/* ---- the graph ------------------------------------------------------------------- */

static int32_t add_tensor(kiln_graph *g, const char *name, kiln_dtype dt, int32_t rank, const kiln_expr *dims,
                          int64_t arena_offset, size_t max_bytes)
{
    int32_t t = kiln_graph_add_tensor(g, name, dt, rank, dims);
    g->tensors[t].arena_offset = arena_offset;
    g->tensors[t].max_bytes = max_bytes;
    return t;
}

static int32_t add_const(kiln_graph *g, const char *name, kiln_dtype dt, int32_t rank, const int64_t *shape,
                         uint8_t seed)
{
    kiln_expr dims[KILN_MAX_RANK];
    size_t bytes = kiln_dtype_size(dt);
    for (int32_t i = 0; i < rank; i++) {
        dims[i] = kiln_expr_const(&g->exprs, shape[i]);
        bytes *= (size_t)shape[i];
    }
    int32_t t = kiln_graph_add_tensor(g, name, dt, rank, dims);
    kiln_tensor_rec *r = &g->tensors[t];
    r->flags = KILN_TENSOR_CONSTANT;
    r->data = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        ((uint8_t *)r->data)[i] = (uint8_t)(seed + i * 7);
    r->data_size = bytes;
    r->data_owned = 1;
    return t;
}

static int32_t add_layer(kiln_graph *g, const char *name, kiln_op op, const int32_t *in, int32_t n_in,
                         const int32_t *out, int32_t n_out)
{
    int32_t l = kiln_graph_add_layer(g, name, op, in, n_in, n_out);
    for (int32_t i = 0; i < n_out; i++) {
        g->layers[l].outputs[i] = out[i];
        g->tensors[out[i]].producer = l;
    }
    g->layers[l].workspace = 64u * (size_t)(l + 1);
    g->layers[l].tactic = 100 + l;
    return l;
}

/* Every op with every parameter, constants of five dtypes, two plugins
 * (one stored blob, one live instance), two profiles, constraints and
 * three extra sections. */
static void build_graph(kiln_graph *g)
{
    kiln_graph_init(g);
    kiln_expr_pool *p = &g->exprs;
    kiln_expr s0 = kiln_expr_symbol(p, 0), s1 = kiln_expr_symbol(p, 1);
    kiln_expr c16 = kiln_expr_const(p, 16), c8 = kiln_expr_const(p, 8), c1 = kiln_expr_const(p, 1);
    kiln_expr c2 = kiln_expr_const(p, 2), c4 = kiln_expr_const(p, 4);
    kiln_expr s0x16 = kiln_expr_op(p, KILN_EXPR_MUL, s0, c16);
    kiln_expr half = kiln_expr_op(p, KILN_EXPR_CEIL_DIV, s0x16, c2);
    kiln_expr mx = kiln_expr_op(p, KILN_EXPR_MAX, s0, s1);
    kiln_expr neg = kiln_expr_const(p, -5);
    CHECK(s0 >= 0 && s1 >= 0 && half >= 0 && mx >= 0 && neg >= 0);

    kiln_expr d_x[2] = {s0, c16}, d_ids[1] = {s1}, d_s8[2] = {s0, c8}, d_s1[2] = {s0, c1};
    kiln_expr d_cat[2] = {s0, kiln_expr_const(p, 24)}, d_slice[2] = {s0, c8};
    kiln_expr d_shuf[3] = {c4, c2, s0}, d_gat[2] = {s1, c4}, d_plug[1] = {half};
    int32_t x = add_tensor(g, "x", KILN_DTYPE_F32, 2, d_x, 0, 8192);
    int32_t ids = add_tensor(g, "ids", KILN_DTYPE_I32, 1, d_ids, 8192, 512);
    g->tensors[x].flags = KILN_TENSOR_INPUT;
    g->tensors[ids].flags = KILN_TENSOR_INPUT;
    int64_t sh_w[2] = {16, 8}, sh_b[1] = {8}, sh_t[2] = {10, 4}, sh_q[3] = {3, 1, 5}, sh_l[1] = {2};
    int32_t w = add_const(g, "w", KILN_DTYPE_F32, 2, sh_w, 1);
    int32_t bias = add_const(g, "bias", KILN_DTYPE_F32, 1, sh_b, 2);
    int32_t table = add_const(g, "table", KILN_DTYPE_BF16, 2, sh_t, 3);
    add_const(g, "q", KILN_DTYPE_I8, 3, sh_q, 4);
    add_const(g, "pos", KILN_DTYPE_I64, 1, sh_l, 5);
    add_const(g, "scalar", KILN_DTYPE_U8, 0, NULL, 6);

    int32_t mm = add_tensor(g, "mm", KILN_DTYPE_F32, 2, d_s8, 8704, 4096);
    int32_t bin = add_tensor(g, "bin", KILN_DTYPE_F32, 2, d_s8, 12800, 4096);
    int32_t un = add_tensor(g, "un", KILN_DTYPE_F32, 2, d_s8, 16896, 4096);
    int32_t red = add_tensor(g, "red", KILN_DTYPE_F32, 2, d_s1, 20992, 512);
    int32_t sm = add_tensor(g, "sm", KILN_DTYPE_F32, 2, d_s8, 21504, 4096);
    int32_t cat = add_tensor(g, "cat", KILN_DTYPE_F32, 2, d_cat, 25600, 12288);
    int32_t sl = add_tensor(g, "sl", KILN_DTYPE_F32, 2, d_slice, 37888, 4096);
    int32_t shuf = add_tensor(g, "shuf", KILN_DTYPE_F32, 3, d_shuf, 41984, 4096);
    int32_t gat = add_tensor(g, "gat", KILN_DTYPE_BF16, 2, d_gat, 46080, 1024);
    int32_t cst = add_tensor(g, "cst", KILN_DTYPE_BF16, 2, d_s8, 47104, 2048);
    int32_t pl0 = add_tensor(g, "plug:0", KILN_DTYPE_F16, 1, d_plug, 49152, 2048);
    int32_t pl1 = add_tensor(g, "plug:1", KILN_DTYPE_F16, 1, d_plug, 51200, 2048);
    int32_t fu = add_tensor(g, "fused", KILN_DTYPE_F32, 2, d_s8, 53248, 4096);
    g->arena_size = 57344;
    g->workspace_size = 12544;

    int32_t in2[3];
    int32_t l;
    in2[0] = x;
    in2[1] = w;
    l = add_layer(g, "fc", KILN_OP_MATMUL, in2, 2, &mm, 1);
    g->layers[l].p.matmul.transpose_a = 0;
    g->layers[l].p.matmul.transpose_b = 1;
    in2[0] = mm;
    in2[1] = bias;
    l = add_layer(g, "add", KILN_OP_BINARY, in2, 2, &bin, 1);
    g->layers[l].p.binary.op = KILN_BINARY_POW;
    l = add_layer(g, "act", KILN_OP_UNARY, &bin, 1, &un, 1);
    g->layers[l].p.unary.op = KILN_UNARY_GELU_TANH;
    l = add_layer(g, "mean", KILN_OP_REDUCE, &un, 1, &red, 1);
    g->layers[l].p.reduce.op = KILN_REDUCE_MEAN;
    g->layers[l].p.reduce.axes = 0x2;
    g->layers[l].p.reduce.keep_dims = 1;
    l = add_layer(g, "softmax", KILN_OP_SOFTMAX, &un, 1, &sm, 1);
    g->layers[l].p.softmax.axis = 1;
    in2[0] = sm;
    in2[1] = un;
    in2[2] = mm;
    l = add_layer(g, "concat", KILN_OP_CONCAT, in2, 3, &cat, 1);
    g->layers[l].p.concat.axis = 1;
    l = add_layer(g, "slice", KILN_OP_SLICE, &cat, 1, &sl, 1);
    g->layers[l].p.slice.start[0] = 0;
    g->layers[l].p.slice.start[1] = 2;
    g->layers[l].p.slice.stride[0] = 1;
    g->layers[l].p.slice.stride[1] = 3;
    l = add_layer(g, "shuffle", KILN_OP_SHUFFLE, &sl, 1, &shuf, 1);
    g->layers[l].p.shuffle.has_first = 1;
    g->layers[l].p.shuffle.first[0] = 1;
    g->layers[l].p.shuffle.first[1] = 0;
    g->layers[l].p.shuffle.mid_rank = 3;
    g->layers[l].p.shuffle.mid[0] = c2;
    g->layers[l].p.shuffle.mid[1] = c4;
    g->layers[l].p.shuffle.mid[2] = s0;
    g->layers[l].p.shuffle.has_second = 1;
    g->layers[l].p.shuffle.second[0] = 2;
    g->layers[l].p.shuffle.second[1] = 0;
    g->layers[l].p.shuffle.second[2] = 1;
    in2[0] = table;
    in2[1] = ids;
    l = add_layer(g, "embed", KILN_OP_GATHER, in2, 2, &gat, 1);
    g->layers[l].p.gather.axis = 0;
    l = add_layer(g, "cast", KILN_OP_CAST, &mm, 1, &cst, 1);
    g->layers[l].p.cast.to = KILN_DTYPE_BF16;
    int32_t pouts[2] = {pl0, pl1};
    in2[0] = x;
    in2[1] = ids;
    l = add_layer(g, "plug", KILN_OP_PLUGIN, in2, 2, pouts, 2);
    g->layers[l].p.plugin.index = 1;
    in2[0] = mm;
    in2[1] = un;
    l = add_layer(g, "fused", KILN_OP_FUSED, in2, 2, &fu, 1);
    kiln_layer_params *fp = &g->layers[l].p;
    fp->fused.n_steps = 3;
    fp->fused.steps[0] = (kiln_fused_step){0, KILN_UNARY_EXP, 0, -1, 2};
    fp->fused.steps[1] = (kiln_fused_step){1, KILN_BINARY_ADD, 2, 1, 1};
    fp->fused.steps[2] = (kiln_fused_step){0, KILN_UNARY_RELU, 3, -1, 5};

    g->n_inputs = 2;
    g->inputs = malloc(2 * sizeof *g->inputs);
    g->inputs[0] = x;
    g->inputs[1] = ids;
    g->n_outputs = 3;
    g->outputs = malloc(3 * sizeof *g->outputs);
    g->outputs[0] = fu;
    g->outputs[1] = pl1;
    g->outputs[2] = gat;
    g->tensors[fu].flags |= KILN_TENSOR_OUTPUT;
    g->tensors[pl1].flags |= KILN_TENSOR_OUTPUT;
    g->tensors[gat].flags |= KILN_TENSOR_OUTPUT;

    g->n_symbols = 2;
    g->symbols = malloc(2 * sizeof *g->symbols);
    g->symbols[0] = (kiln_symbol){x, 0};
    g->symbols[1] = (kiln_symbol){ids, 0};

    g->n_profiles = 2;
    g->profiles = calloc(4, sizeof *g->profiles);
    for (int32_t pi = 0; pi < 2; pi++) {
        kiln_profile_dims *px = &g->profiles[pi * 2], *pid = &g->profiles[pi * 2 + 1];
        px->min = (kiln_dims){2, 0, {1, 16}};
        px->opt = (kiln_dims){2, 0, {8 * (pi + 1), 16}};
        px->max = (kiln_dims){2, 0, {64 * (pi + 1), 16}};
        pid->min = (kiln_dims){1, 0, {1}};
        pid->opt = (kiln_dims){1, 0, {8 * (pi + 1)}};
        pid->max = (kiln_dims){1, 0, {64 * (pi + 1)}};
    }

    g->n_constraints = 2;
    g->constraints = calloc(2, sizeof *g->constraints);
    g->constraints[0] = (kiln_constraint){KILN_CONSTRAINT_BROADCAST, s0, s1, 1, kiln_strdup("rows of x and ids")};
    g->constraints[1] = (kiln_constraint){KILN_CONSTRAINT_POSITIVE, mx, -1, -1, kiln_strdup("a positive max")};

    g->n_plugins = 2;
    g->plugins = calloc(2, sizeof *g->plugins);
    kiln_plugin_rec *r0 = &g->plugins[0];
    r0->name = kiln_strdup("ScaleBias");
    r0->version = kiln_strdup("2");
    r0->plugin_namespace = kiln_strdup("kiln.test");
    r0->library = kiln_strdup("/opt/kiln/libscale_bias.so");
    r0->blob_version = 3;
    r0->blob_size = 13;
    r0->blob = malloc(13);
    memcpy(r0->blob, "scale=2;b=-1", 13);
    kiln_plugin_rec *r1 = &g->plugins[1];
    r1->name = kiln_strdup("Fake");
    r1->version = kiln_strdup("1");
    r1->plugin_namespace = kiln_strdup("");
    r1->library = kiln_strdup("builtin");
    r1->creator = &fake_creator;
    fake_plugin *inst = calloc(1, sizeof *inst);
    inst->base = (kiln_plugin){sizeof *inst, KILN_PLUGIN_ABI_VERSION, &fake_ops};
    memcpy(inst->state, "hello", 6);
    r1->instance = &inst->base;
    /* A stale stored blob: the live instance must win. */
    r1->blob_version = 1;
    r1->blob = malloc(3);
    memcpy(r1->blob, "old", 3);
    r1->blob_size = 3;

    g->backend = KILN_BACKEND_CUDA;
    g->n_gpu_archs = 2;
    g->gpu_archs[0] = 90;
    g->gpu_archs[1] = 100;

    g->n_sections = 3;
    g->sections = calloc(3, sizeof *g->sections);
    g->sections[0].id = KILN_FOURCC('L', 'L', 'M', 'C');
    g->sections[0].size = 27;
    g->sections[0].data = malloc(27);
    memcpy(g->sections[0].data, "{\"hidden\":4096,\"layers\":32}", 27);
    g->sections[0].data_owned = 1;
    g->sections[1].id = KILN_FOURCC('E', 'M', 'P', 'T');
    g->sections[2].id = KILN_FOURCC('T', 'O', 'K', 'N');
    g->sections[2].size = 5000;
    g->sections[2].data = malloc(5000);
    for (int i = 0; i < 5000; i++)
        ((uint8_t *)g->sections[2].data)[i] = (uint8_t)(i * 13 + 1);
    g->sections[2].data_owned = 1;
}

/* ---- comparison ------------------------------------------------------------------- */

static int str_eq(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

static int bytes_eq(const void *a, size_t na, const void *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na) == 0);
}

static void check_params(const kiln_graph *g, const kiln_layer *a, const kiln_layer *b)
{
    const kiln_layer_params *p = &a->p, *q = &b->p;
    int32_t rank = g->tensors[a->inputs[0]].rank;
    switch (a->op) {
    case KILN_OP_MATMUL:
        CHECK(p->matmul.transpose_a == q->matmul.transpose_a && p->matmul.transpose_b == q->matmul.transpose_b);
        break;
    case KILN_OP_BINARY: CHECK(p->binary.op == q->binary.op); break;
    case KILN_OP_UNARY: CHECK(p->unary.op == q->unary.op); break;
    case KILN_OP_REDUCE:
        CHECK(p->reduce.op == q->reduce.op && p->reduce.axes == q->reduce.axes &&
              p->reduce.keep_dims == q->reduce.keep_dims);
        break;
    case KILN_OP_SOFTMAX: CHECK(p->softmax.axis == q->softmax.axis); break;
    case KILN_OP_CONCAT: CHECK(p->concat.axis == q->concat.axis); break;
    case KILN_OP_GATHER: CHECK(p->gather.axis == q->gather.axis); break;
    case KILN_OP_CAST: CHECK(p->cast.to == q->cast.to); break;
    case KILN_OP_PLUGIN: CHECK(p->plugin.index == q->plugin.index); break;
    case KILN_OP_SLICE:
        for (int32_t i = 0; i < rank; i++)
            CHECK(p->slice.start[i] == q->slice.start[i] && p->slice.stride[i] == q->slice.stride[i]);
        break;
    case KILN_OP_SHUFFLE:
        CHECK(p->shuffle.has_first == q->shuffle.has_first && p->shuffle.has_second == q->shuffle.has_second);
        CHECK(p->shuffle.mid_rank == q->shuffle.mid_rank);
        for (int32_t i = 0; i < rank; i++)
            CHECK(p->shuffle.first[i] == q->shuffle.first[i]);
        for (int32_t i = 0; i < p->shuffle.mid_rank; i++)
            CHECK(p->shuffle.mid[i] == q->shuffle.mid[i] && p->shuffle.second[i] == q->shuffle.second[i]);
        break;
    case KILN_OP_FUSED:
        CHECK(p->fused.n_steps == q->fused.n_steps);
        for (int32_t i = 0; i < p->fused.n_steps; i++) {
            const kiln_fused_step *x = &p->fused.steps[i], *y = &q->fused.steps[i];
            CHECK(x->is_binary == y->is_binary && x->op == y->op && x->a == y->a && x->b == y->b &&
                  x->src_layer == y->src_layer);
        }
        break;
    default: break;
    }
}

/* b is a's read-back: every field equal, the live plugin replaced by its
 * serialized blob. */
static void check_same(const kiln_graph *a, const kiln_graph *b)
{
    CHECK(a->exprs.n == b->exprs.n);
    for (int32_t i = 0; i < a->exprs.n && i < b->exprs.n; i++) {
        const kiln_expr_node *x = &a->exprs.nodes[i], *y = &b->exprs.nodes[i];
        CHECK(x->kind == y->kind && x->a == y->a && x->b == y->b && x->value == y->value);
    }
    CHECK(a->n_tensors == b->n_tensors);
    for (int32_t i = 0; i < a->n_tensors && i < b->n_tensors; i++) {
        const kiln_tensor_rec *x = &a->tensors[i], *y = &b->tensors[i];
        CHECK(str_eq(x->name, y->name));
        CHECK(x->dtype == y->dtype && x->flags == y->flags && x->rank == y->rank);
        for (int32_t k = 0; k < KILN_MAX_RANK; k++)
            CHECK(x->dims[k] == y->dims[k]);
        CHECK(x->producer == y->producer && x->arena_offset == y->arena_offset && x->max_bytes == y->max_bytes);
        CHECK(bytes_eq(x->data, x->data_size, y->data, y->data_size));
    }
    CHECK(a->n_layers == b->n_layers);
    for (int32_t i = 0; i < a->n_layers && i < b->n_layers; i++) {
        const kiln_layer *x = &a->layers[i], *y = &b->layers[i];
        CHECK(str_eq(x->name, y->name) && x->op == y->op);
        CHECK(x->n_inputs == y->n_inputs && x->n_outputs == y->n_outputs);
        if (x->n_inputs == y->n_inputs)
            CHECK(bytes_eq(x->inputs, sizeof(int32_t) * (size_t)x->n_inputs, y->inputs,
                           sizeof(int32_t) * (size_t)y->n_inputs));
        if (x->n_outputs == y->n_outputs)
            CHECK(bytes_eq(x->outputs, sizeof(int32_t) * (size_t)x->n_outputs, y->outputs,
                           sizeof(int32_t) * (size_t)y->n_outputs));
        CHECK(x->workspace == y->workspace && x->tactic == y->tactic);
        if (x->op == y->op)
            check_params(a, x, y);
    }
    CHECK(bytes_eq(a->inputs, 4 * (size_t)a->n_inputs, b->inputs, 4 * (size_t)b->n_inputs));
    CHECK(bytes_eq(a->outputs, 4 * (size_t)a->n_outputs, b->outputs, 4 * (size_t)b->n_outputs));
    CHECK(a->n_symbols == b->n_symbols);
    for (int32_t i = 0; i < a->n_symbols && i < b->n_symbols; i++)
        CHECK(a->symbols[i].tensor == b->symbols[i].tensor && a->symbols[i].axis == b->symbols[i].axis);
    CHECK(a->n_profiles == b->n_profiles);
    for (int32_t i = 0; a->n_profiles == b->n_profiles && i < a->n_profiles * a->n_inputs; i++) {
        const kiln_profile_dims *x = &a->profiles[i], *y = &b->profiles[i];
        const kiln_dims *xs[3] = {&x->min, &x->opt, &x->max}, *ys[3] = {&y->min, &y->opt, &y->max};
        for (int k = 0; k < 3; k++) {
            CHECK(xs[k]->rank == ys[k]->rank);
            for (int32_t d = 0; d < xs[k]->rank; d++)
                CHECK(xs[k]->d[d] == ys[k]->d[d]);
        }
    }
    CHECK(a->n_constraints == b->n_constraints);
    for (int32_t i = 0; i < a->n_constraints && i < b->n_constraints; i++) {
        const kiln_constraint *x = &a->constraints[i], *y = &b->constraints[i];
        CHECK(x->kind == y->kind && x->a == y->a && x->b == y->b && x->layer == y->layer && str_eq(x->what, y->what));
    }
    CHECK(a->n_plugins == b->n_plugins);
    for (int32_t i = 0; i < a->n_plugins && i < b->n_plugins; i++) {
        const kiln_plugin_rec *x = &a->plugins[i], *y = &b->plugins[i];
        CHECK(str_eq(x->name, y->name) && str_eq(x->version, y->version) &&
              str_eq(x->plugin_namespace, y->plugin_namespace) && str_eq(x->library, y->library));
        CHECK(y->creator == NULL && y->instance == NULL);
        if (x->instance) {
            CHECK(y->blob_version == 7);
            CHECK(bytes_eq(y->blob, y->blob_size, "hello", 5));
        } else {
            CHECK(y->blob_version == x->blob_version);
            CHECK(bytes_eq(x->blob, x->blob_size, y->blob, y->blob_size));
        }
    }
    CHECK(a->backend == b->backend && a->n_gpu_archs == b->n_gpu_archs);
    for (int32_t i = 0; i < a->n_gpu_archs; i++)
        CHECK(a->gpu_archs[i] == b->gpu_archs[i]);
    CHECK(a->arena_size == b->arena_size && a->workspace_size == b->workspace_size);
    CHECK(a->n_sections == b->n_sections);
    for (int32_t i = 0; i < a->n_sections && i < b->n_sections; i++) {
        CHECK(a->sections[i].id == b->sections[i].id);
        CHECK(bytes_eq(a->sections[i].data, a->sections[i].size, b->sections[i].data, b->sections[i].size));
    }
}

/* ---- the layout, decoded from the spec --------------------------------------------- */

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* docs/engine-format.md: XXH64 (seed 0) of the header with bytes 88..95
 * zeroed, followed by the section table. */
static uint64_t spec_header_checksum(const uint8_t *img)
{
    uint32_t n = le32(img + 80);
    size_t len = 96 + 32 * (size_t)n;
    uint8_t *copy = malloc(len);
    memcpy(copy, img, len);
    memset(copy + 88, 0, 8);
    uint64_t h = XXH64(copy, len, 0);
    free(copy);
    return h;
}

static void reseal(uint8_t *img) { wr64(img + 88, spec_header_checksum(img)); }

/* Index of the table entry with this fourcc, or -1. */
static int find_entry(const uint8_t *img, const char *id)
{
    uint32_t n = le32(img + 80);
    for (uint32_t i = 0; i < n; i++)
        if (memcmp(img + 96 + 32 * i, id, 4) == 0)
            return (int)i;
    return -1;
}

static void write_engine(kiln_buffer *buf)
{
    kiln_graph g;
    build_graph(&g);
    buf->data = NULL;
    CHECK_OK(kiln_engine_write(&g, buf));
    kiln_graph_free(&g);
}

static void test_roundtrip(void)
{
    kiln_graph g, back;
    build_graph(&g);
    kiln_buffer buf = {0};
    CHECK_OK(kiln_engine_write(&g, &buf));
    kiln_engine_header_info info;
    memset(&info, 0, sizeof info);
    kiln_graph_init(&back);
    CHECK_OK(kiln_engine_read(buf.data, buf.size, 0, &back, &info));
    check_same(&g, &back);
    CHECK(info.format_version == KILN_ENGINE_FORMAT_VERSION);
    CHECK(strcmp(info.kiln_version, KILN_VERSION_STRING) == 0);
    CHECK(info.backend == KILN_BACKEND_CUDA && info.n_gpu_archs == 2 && info.gpu_archs[0] == 90 &&
          info.gpu_archs[1] == 100);
    CHECK(info.file_size == buf.size);
    /* PLAN, BLOB, WGHT and the three extra sections. */
    CHECK(info.n_sections == 6);
    /* Without borrow every constant is a copy of its own. */
    for (int32_t i = 0; i < back.n_tensors; i++) {
        const uint8_t *d = back.tensors[i].data, *lo = buf.data;
        if (back.tensors[i].data_size)
            CHECK(back.tensors[i].data_owned && (d < lo || d >= lo + buf.size));
    }

    /* A read engine (no instances, stored blobs) writes back byte for byte. */
    kiln_buffer again = {0};
    CHECK_OK(kiln_engine_write(&back, &again));
    CHECK(bytes_eq(buf.data, buf.size, again.data, again.size));
    kiln_buffer_free(&again);

    kiln_engine_header_info hi;
    CHECK_OK(kiln_engine_read_header(buf.data, buf.size, &hi));
    CHECK(hi.backend == KILN_BACKEND_CUDA && hi.file_size == buf.size && hi.n_sections == 6);
    kiln_graph_free(&back);
    kiln_graph_free(&g);
    kiln_buffer_free(&buf);
}

/* The bytes match the spec: decoded here without the reader. */
static void test_layout(void)
{
    kiln_buffer buf;
    write_engine(&buf);
    const uint8_t *img = buf.data;
    CHECK(memcmp(img, "KILNENG\0", 8) == 0);
    CHECK(le32(img + 8) == 1 && le32(img + 12) == 96);
    CHECK(strcmp((const char *)img + 16, "0.1.0") == 0);
    CHECK(le32(img + 32) == 1 && le32(img + 36) == 2 && le32(img + 40) == 90 && le32(img + 44) == 100);
    CHECK(le64(img + 72) == buf.size);
    uint32_t n = le32(img + 80);
    CHECK(n == 6);
    CHECK(le64(img + 88) == spec_header_checksum(img));
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = img + 96 + 32 * i;
        uint64_t off = le64(e + 8), size = le64(e + 16);
        CHECK(off + size <= buf.size);
        CHECK(XXH64(img + off, size, 0) == le64(e + 24));
    }
    int wi = find_entry(img, "WGHT"), pi = find_entry(img, "PLAN"), ti = find_entry(img, "TOKN");
    CHECK(wi >= 0 && pi >= 0 && ti >= 0);
    if (wi >= 0)
        CHECK(le64(img + 96 + 32 * wi + 8) % 4096 == 0);
    /* The extra section holds its bytes verbatim. */
    if (ti >= 0) {
        const uint8_t *tok = img + le64(img + 96 + 32 * ti + 8);
        CHECK(le64(img + 96 + 32 * ti + 16) == 5000 && tok[0] == 1 && tok[1] == 14 &&
              tok[4999] == (uint8_t)(4999 * 13 + 1));
    }
    /* The plan is one JSON object. */
    if (pi >= 0) {
        json_error_t err;
        json_t *plan =
            json_loadb((const char *)img + le64(img + 96 + 32 * pi + 8), le64(img + 96 + 32 * pi + 16), 0, &err);
        CHECK(json_is_object(plan) && json_array_size(json_object_get(plan, "layers")) == 12);
        json_decref(plan);
    }
    kiln_buffer_free(&buf);
}

static void test_borrow_alignment(void)
{
    kiln_buffer buf;
    write_engine(&buf);
    size_t cap = (buf.size + 4095) / 4096 * 4096;
    uint8_t *img = aligned_alloc(4096, cap);
    memcpy(img, buf.data, buf.size);
    kiln_graph g, orig;
    build_graph(&orig);
    /* Outputs stay untouched on failure: an empty graph keeps the checks safe. */
    kiln_graph_init(&g);
    CHECK_OK(kiln_engine_read(img, buf.size, 1, &g, NULL));
    int n_const = 0;
    for (int32_t i = 0; i < g.n_tensors; i++) {
        const kiln_tensor_rec *t = &g.tensors[i];
        if (!(t->flags & KILN_TENSOR_CONSTANT))
            continue;
        n_const++;
        CHECK(!t->data_owned);
        const uint8_t *d = t->data;
        CHECK(d >= img && d + t->data_size <= img + buf.size);
        CHECK((size_t)(d - img) % KILN_ENGINE_WEIGHT_ALIGN == 0);
        CHECK(bytes_eq(d, t->data_size, orig.tensors[i].data, orig.tensors[i].data_size));
    }
    CHECK(n_const == 6);
    CHECK(g.n_sections == 3 && !g.sections[0].data_owned && (const uint8_t *)g.sections[0].data > img &&
          (const uint8_t *)g.sections[0].data < img + buf.size);
    check_same(&orig, &g);
    kiln_graph_free(&g);
    kiln_graph_free(&orig);
    free(img);
    kiln_buffer_free(&buf);
}

static int is_format_error(kiln_status s)
{
    return s == KILN_ERROR_FORMAT || s == KILN_ERROR_CHECKSUM || s == KILN_ERROR_VERSION;
}

static void test_truncated(void)
{
    kiln_buffer buf;
    write_engine(&buf);
    for (int k = 0; k < 64; k++) {
        size_t n = buf.size * (size_t)k / 64;
        /* A copy of exactly n bytes, so ASan sees any read past the end. */
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, buf.data, n);
        kiln_graph g;
        char expect[96];
        snprintf(expect, sizeof expect, "engine truncated");
        CHECK_FAILS(kiln_engine_read(cut, n, k & 1, &g, NULL), KILN_ERROR_FORMAT, expect);
        free(cut);
    }
    /* The message names both sizes. */
    kiln_graph g;
    char expect[96];
    snprintf(expect, sizeof expect, "engine truncated: header says %zu bytes, file has %zu", buf.size, buf.size - 1);
    CHECK_FAILS(kiln_engine_read(buf.data, buf.size - 1, 0, &g, NULL), KILN_ERROR_FORMAT, expect);
    kiln_buffer_free(&buf);
}

static void test_bit_flips(void)
{
    kiln_buffer buf;
    write_engine(&buf);
    uint8_t *img = malloc(buf.size);
    int failures_ok = 0, tried = 0;
    /* Every byte of the header and table, then ~2000 spread over the rest. */
    size_t step = buf.size / 2000 + 1;
    for (size_t pos = 0; pos < buf.size; pos += pos < 96 + 32 * 6 ? 1 : step) {
        memcpy(img, buf.data, buf.size);
        img[pos] ^= (uint8_t)(1u << (pos % 8));
        kiln_graph g;
        kiln_status s = kiln_engine_read(img, buf.size, (int)(pos & 1), &g, NULL);
        tried++;
        if (is_format_error(s))
            failures_ok++;
        else {
            fprintf(stderr, "bit flip at %zu: %s (%s)\n", pos, kiln_status_name(s), kiln_last_error());
            if (s == KILN_OK)
                kiln_graph_free(&g);
        }
    }
    CHECK(tried > 2000 && failures_ok == tried);
    /* A flip inside the plan is caught by its checksum, named. */
    memcpy(img, buf.data, buf.size);
    int pi = find_entry(img, "PLAN");
    img[le64(img + 96 + 32 * pi + 8) + 10] ^= 0x20;
    kiln_graph g;
    CHECK_FAILS(kiln_engine_read(img, buf.size, 0, &g, NULL), KILN_ERROR_CHECKSUM,
                "engine section PLAN checksum mismatch: the file is corrupted");
    free(img);
    kiln_buffer_free(&buf);
}

/* Offsets that point outside the file, with the header checksum recomputed
 * so that only the bounds checks stand in the way. */
static void test_bad_offsets(void)
{
    kiln_buffer buf;
    write_engine(&buf);
    uint8_t *img = malloc(buf.size);
    kiln_graph g;
    int pi = find_entry(buf.data, "PLAN"), wi = find_entry(buf.data, "WGHT");
    const uint64_t bad_offsets[] = {buf.size - 10, buf.size, UINT64_MAX - 5, 0};
    for (size_t i = 0; i < sizeof bad_offsets / sizeof bad_offsets[0]; i++) {
        memcpy(img, buf.data, buf.size);
        wr64(img + 96 + 32 * pi + 8, bad_offsets[i]);
        reseal(img);
        CHECK_FAILS(kiln_engine_read(img, buf.size, 0, &g, NULL), KILN_ERROR_FORMAT, "lies outside");
    }
    /* A size that wraps around. */
    memcpy(img, buf.data, buf.size);
    wr64(img + 96 + 32 * wi + 16, UINT64_MAX);
    reseal(img);
    CHECK_FAILS(kiln_engine_read(img, buf.size, 1, &g, NULL), KILN_ERROR_FORMAT, "engine section WGHT");
    /* Two sections sharing bytes. */
    memcpy(img, buf.data, buf.size);
    int bi = find_entry(img, "BLOB");
    memcpy(img + 96 + 32 * bi + 8, img + 96 + 32 * pi + 8, 8);
    reseal(img);
    CHECK_FAILS(kiln_engine_read(img, buf.size, 0, &g, NULL), KILN_ERROR_FORMAT, "overlaps");
    /* A section count whose table runs past the file. */
    memcpy(img, buf.data, buf.size);
    img[80] = 0xff;
    img[81] = 0xff;
    img[82] = 0xff;
    CHECK_FAILS(kiln_engine_read(img, buf.size, 0, &g, NULL), KILN_ERROR_FORMAT, "section table");
    free(img);
    kiln_buffer_free(&buf);
}

static void test_version_and_magic(void)
{
    kiln_buffer buf;
    write_engine(&buf);
    uint8_t *img = malloc(buf.size);
    kiln_graph g;
    kiln_engine_header_info info;
    memcpy(img, buf.data, buf.size);
    img[8] = 7;
    reseal(img);
    CHECK_FAILS(kiln_engine_read(img, buf.size, 0, &g, NULL), KILN_ERROR_VERSION,
                "engine format version 7 is newer than this kiln reads (1)");
    CHECK_FAILS(kiln_engine_read_header(img, buf.size, &info), KILN_ERROR_VERSION, "version 7");
    memcpy(img, buf.data, buf.size);
    img[3] = 'X';
    CHECK_FAILS(kiln_engine_read(img, buf.size, 0, &g, NULL), KILN_ERROR_FORMAT, "not a kiln engine (bad magic)");
    CHECK_FAILS(kiln_engine_read("GGUF\3\0\0\0garbage", 15, 0, &g, NULL), KILN_ERROR_FORMAT, "bad magic");
    CHECK_FAILS(kiln_engine_read("", 0, 0, &g, NULL), KILN_ERROR_FORMAT, "truncated");
    /* The header alone is enough for read_header. */
    CHECK_OK(kiln_engine_read_header(buf.data, 96 + 32 * 6, &info));
    CHECK(info.backend == KILN_BACKEND_CUDA && info.file_size == buf.size);
    /* An unknown backend, resealed. */
    memcpy(img, buf.data, buf.size);
    img[32] = 9;
    reseal(img);
    CHECK_FAILS(kiln_engine_read(img, buf.size, 0, &g, NULL), KILN_ERROR_FORMAT, "backend 9");
    free(img);
    kiln_buffer_free(&buf);
}

/* ---- checksum-valid engines whose plan lies ------------------------------------------ */

/* Rebuilds an engine around a new plan text, keeping the other sections:
 * written from the spec, independently of the writer. */
static uint8_t *replace_plan(const kiln_buffer *buf, const char *plan, size_t *out_size)
{
    const uint8_t *src = buf->data;
    uint32_t n = le32(src + 80);
    size_t plan_len = strlen(plan);
    /* Old layout with the plan moved to the end, padded to keep WGHT's
     * page alignment: simplest is to append the plan after everything. */
    size_t end = buf->size;
    size_t total = (end + 7) / 8 * 8 + plan_len;
    uint8_t *img = calloc(1, total);
    memcpy(img, src, end);
    int pi = find_entry(src, "PLAN");
    uint64_t old_off = le64(src + 96 + 32 * pi + 8), old_size = le64(src + 96 + 32 * pi + 16);
    memset(img + old_off, 0, old_size);
    size_t off = (end + 7) / 8 * 8;
    memcpy(img + off, plan, plan_len);
    uint8_t *e = img + 96 + 32 * pi;
    wr64(e + 8, off);
    wr64(e + 16, plan_len);
    wr64(e + 24, XXH64(plan, plan_len, 0));
    wr64(img + 72, total);
    (void)n;
    reseal(img);
    *out_size = total;
    return img;
}

static json_t *load_plan(const kiln_buffer *buf)
{
    const uint8_t *img = buf->data;
    int pi = find_entry(img, "PLAN");
    json_error_t err;
    return json_loadb((const char *)img + le64(img + 96 + 32 * pi + 8), le64(img + 96 + 32 * pi + 16), 0, &err);
}

/* Sets plan[path...] = value (given as JSON text) and checks the read fails
 * naming `needle`. */
static void expect_plan_error(const kiln_buffer *buf, const char *section, int index, const char *key,
                              const char *value, const char *needle)
{
    json_t *plan = load_plan(buf);
    json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
    json_t *target = json_object_get(plan, section);
    if (index >= 0)
        target = json_array_get(target, (size_t)index);
    if (key)
        json_object_set_new(target, key, v);
    else if (index >= 0)
        json_array_set_new(json_object_get(plan, section), (size_t)index, v);
    else
        json_object_set_new(plan, section, v);
    char *text = json_dumps(plan, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t size;
    uint8_t *img = replace_plan(buf, text, &size);
    kiln_graph g;
    kiln_status s = kiln_engine_read(img, size, 0, &g, NULL);
    test_checks_++;
    if (s != KILN_ERROR_FORMAT || !strstr(kiln_last_error(), needle)) {
        test_failures_++;
        fprintf(stderr, "plan %s[%d].%s = %s: expected FORMAT \"%s\", got %s: %s\n", section, index, key ? key : "",
                value, needle, kiln_status_name(s), kiln_last_error());
        if (s == KILN_OK)
            kiln_graph_free(&g);
    }
    free(img);
    free(text);
    json_decref(plan);
}

static void test_bad_plans(void)
{
    kiln_buffer buf;
    write_engine(&buf);
    /* The rebuilt engine is valid when the plan is unchanged. */
    json_t *plan = load_plan(&buf);
    char *text = json_dumps(plan, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t size;
    uint8_t *img = replace_plan(&buf, text, &size);
    kiln_graph g;
    CHECK_OK(kiln_engine_read(img, size, 0, &g, NULL));
    CHECK(g.n_layers == 12);
    kiln_graph_free(&g);
    free(img);
    free(text);
    json_decref(plan);

    int32_t n_exprs = 0;
    {
        kiln_graph t;
        build_graph(&t);
        n_exprs = t.exprs.n;
        kiln_graph_free(&t);
    }
    expect_plan_error(&buf, "tensors", 0, "dims", "[0,1,2,3,4,5,6,7,0]", "at most 8");
    expect_plan_error(&buf, "tensors", 0, "dims", "[0,99]", "dims[1] = 99 is outside");
    expect_plan_error(&buf, "tensors", 0, "dtype", "10", "dtype = 10 is outside");
    expect_plan_error(&buf, "tensors", 0, "flags", "8", "flags = 8");
    expect_plan_error(&buf, "tensors", 0, "producer", "12", "producer = 12");
    expect_plan_error(&buf, "tensors", 0, "arena_offset", "9223372036854775807", "exceeds the");
    expect_plan_error(&buf, "tensors", 2, "data", "[128,512]", "not a multiple of 256");
    expect_plan_error(&buf, "tensors", 2, "data", "[0,4096000]", "lies outside");
    expect_plan_error(&buf, "tensors", 2, "data", "[0,511]", "its shape needs 512");
    expect_plan_error(&buf, "tensors", 0, "name", "7", "not a string");
    expect_plan_error(&buf, "layers", 0, "op", "13", "op = 13 is outside");
    expect_plan_error(&buf, "layers", 0, "inputs", "[0,99]", "inputs[1] = 99 is outside");
    expect_plan_error(&buf, "layers", 0, "inputs", "[0]", "matmul with 1 inputs");
    expect_plan_error(&buf, "layers", 0, "outputs", "[-1]", "outputs[0] = -1");
    expect_plan_error(&buf, "layers", 0, "params", "{\"transpose_a\":2,\"transpose_b\":0}", "transpose_a = 2");
    expect_plan_error(&buf, "layers", 1, "params", "{\"op\":7}", "op = 7 is outside");
    expect_plan_error(&buf, "layers", 3, "params", "{\"op\":1,\"axes\":4,\"keep_dims\":1}", "axes = 4");
    expect_plan_error(&buf, "layers", 4, "params", "{\"axis\":2}", "axis = 2");
    expect_plan_error(&buf, "layers", 6, "params", "{\"start\":[0,0],\"stride\":[1,0]}", "stride = 0");
    expect_plan_error(&buf, "layers", 7, "params", "{\"first\":[1,1],\"mid\":[0]}", "not a permutation");
    expect_plan_error(&buf, "layers", 7, "params", "{\"mid\":[0,1],\"second\":[0,1,2]}", "3 entries for rank 2");
    expect_plan_error(&buf, "layers", 9, "params", "{\"to\":10}", "to = 10");
    expect_plan_error(&buf, "layers", 10, "params", "{\"index\":2}", "index = 2 is outside");
    expect_plan_error(&buf, "layers", 11, "params", "{\"steps\":[[0,2,2,-1,0]]}", "fused operand a = 2");
    expect_plan_error(&buf, "layers", 11, "params", "{\"steps\":[[1,0,0,1,0],[1,0,2,3,0]]}", "fused operand b = 3");
    expect_plan_error(&buf, "layers", 11, "params", "{\"steps\":[]}", "no steps");
    expect_plan_error(&buf, "exprs", n_exprs - 1, NULL, "0", "not a [kind, a, b, value]");
    expect_plan_error(&buf, "symbols", -1, NULL, "[[0,0]]", "symbol 1 does not exist");
    expect_plan_error(&buf, "symbols", -1, NULL, "[[0,0],[2,0]]", "is not a network input");
    expect_plan_error(&buf, "symbols", -1, NULL, "[[0,2],[1,0]]", "axis = 2");
    expect_plan_error(&buf, "inputs", -1, NULL, "[0,1000]", "inputs[1] = 1000");
    expect_plan_error(&buf, "profiles", -1, NULL, "[[{\"min\":[1,16],\"opt\":[1,16],\"max\":[1,16]}]]",
                      "not an array of 2 inputs");
    expect_plan_error(&buf, "profiles", -1, NULL,
                      "[[{\"min\":[4,16],\"opt\":[2,16],\"max\":[8,16]},{\"min\":[1],\"opt\":[1],\"max\":[1]}]]",
                      "out of order");
    expect_plan_error(&buf, "constraints", 0, "kind", "4", "kind = 4");
    expect_plan_error(&buf, "constraints", 0, "b", "-1", "b = -1");
    expect_plan_error(&buf, "plugins", 0, "blob", "[0,100000]", "lies outside");
    expect_plan_error(&buf, "arena_size", -1, NULL, "-1", "arena_size = -1");
    expect_plan_error(&buf, "arena_size", -1, NULL, "1.5", "not an integer");
    expect_plan_error(&buf, "layers", -1, NULL, "{}", "not an array");

    /* An expression whose operand is not an earlier node. */
    json_t *p2 = load_plan(&buf);
    json_t *exprs = json_object_get(p2, "exprs");
    json_t *node = json_array_get(exprs, (size_t)n_exprs - 1);
    json_array_set_new(node, 0, json_integer(KILN_EXPR_ADD));
    json_array_set_new(node, 1, json_integer(n_exprs - 1));
    json_array_set_new(node, 2, json_integer(0));
    json_array_set_new(node, 3, json_integer(0));
    text = json_dumps(p2, JSON_COMPACT);
    img = replace_plan(&buf, text, &size);
    CHECK_FAILS(kiln_engine_read(img, size, 0, &g, NULL), KILN_ERROR_FORMAT, "is outside -1..");
    free(img);
    free(text);
    json_decref(p2);

    img = replace_plan(&buf, "{\"arena_size\":", &size);
    CHECK_FAILS(kiln_engine_read(img, size, 0, &g, NULL), KILN_ERROR_FORMAT, "engine plan: JSON error");
    free(img);
    kiln_buffer_free(&buf);
}

static void test_write_errors(void)
{
    kiln_graph g;
    kiln_buffer buf = {0};
    build_graph(&g);
    g.sections[0].id = KILN_FOURCC('P', 'L', 'A', 'N');
    CHECK_FAILS(kiln_engine_write(&g, &buf), KILN_ERROR_INVALID_ARGUMENT, "PLAN is reserved");
    kiln_graph_free(&g);
    build_graph(&g);
    g.n_gpu_archs = 9;
    CHECK_FAILS(kiln_engine_write(&g, &buf), KILN_ERROR_INVALID_ARGUMENT, "9 GPU architectures");
    kiln_graph_free(&g);
    /* The writer refuses what the reader would refuse, naming it. */
    build_graph(&g);
    g.layers[3].inputs[0] = g.n_tensors;
    CHECK_FAILS(kiln_engine_write(&g, &buf), KILN_ERROR_INVALID_ARGUMENT,
                "the graph cannot be written as an engine: engine plan: layer 3 \"mean\": inputs[0]");
    kiln_graph_free(&g);
    build_graph(&g);
    g.tensors[2].data_size = 100;
    CHECK_FAILS(kiln_engine_write(&g, &buf), KILN_ERROR_INVALID_ARGUMENT, "its shape needs 512");
    kiln_graph_free(&g);
    CHECK(buf.data == NULL);

    /* The smallest graph: nothing at all. */
    kiln_graph_init(&g);
    CHECK_OK(kiln_engine_write(&g, &buf));
    kiln_graph back;
    CHECK_OK(kiln_engine_read(buf.data, buf.size, 1, &back, NULL));
    CHECK(back.n_tensors == 0 && back.n_layers == 0 && back.n_sections == 0);
    kiln_graph_free(&back);
    kiln_buffer_free(&buf);
}

static const test_case_ tests[] = {
    TEST(test_roundtrip),         TEST(test_layout),    TEST(test_borrow_alignment),
    TEST(test_truncated),         TEST(test_bit_flips), TEST(test_bad_offsets),
    TEST(test_version_and_magic), TEST(test_bad_plans), TEST(test_write_errors),
};
TEST_MAIN(tests)
