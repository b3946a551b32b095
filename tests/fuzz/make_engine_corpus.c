/* Writes the seed corpus of fuzz_engine into tests/fuzz/corpus/fuzz_engine/:
 * two small valid engines, their plans alone (the fuzz target also reads
 * its input as a plan), and hand-made bad engines, each one defect. The
 * engines are named *.bin because the repository ignores *.engine.
 *
 * Build and run from the repository root, against a built libkiln_static:
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Isrc tests/fuzz/make_engine_corpus.c \
 *      build/lib/libkiln_static.a $(pkg-config --libs jansson libxxhash libpcre2-8 openblas) \
 *      -lpthread -ldl -lm -o /tmp/make_engine_corpus && /tmp/make_engine_corpus
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/graph.h"
#include "engine/engine_file.h"

#define DIR "tests/fuzz/corpus/fuzz_engine/"

static void save(const char *name, const void *data, size_t size)
{
    char path[256];
    snprintf(path, sizeof path, DIR "%s", name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t n_sections(const uint8_t *img) { return (uint32_t)img[80] | (uint32_t)img[81] << 8; }

static void reseal(uint8_t *img)
{
    size_t len = 96 + 32 * (size_t)n_sections(img);
    memset(img + 88, 0, 8);
    wr64(img + 88, XXH64(img, len, 0));
}

static int entry(const uint8_t *img, const char *id)
{
    for (uint32_t i = 0; i < n_sections(img); i++)
        if (memcmp(img + 96 + 32 * i, id, 4) == 0)
            return (int)i;
    return -1;
}

static uint8_t *copy(const kiln_buffer *b)
{
    uint8_t *c = malloc(b->size);
    memcpy(c, b->data, b->size);
    return c;
}

/* x [s0, 4] f32 · w [4, 4] -> y, one profile, one constraint. */
static void small_graph(kiln_graph *g)
{
    kiln_graph_init(g);
    kiln_expr s0 = kiln_expr_symbol(&g->exprs, 0), c4 = kiln_expr_const(&g->exprs, 4);
    kiln_expr dx[2] = {s0, c4}, dw[2] = {c4, c4};
    int32_t x = kiln_graph_add_tensor(g, "x", KILN_DTYPE_F32, 2, dx);
    int32_t w = kiln_graph_add_tensor(g, "w", KILN_DTYPE_F32, 2, dw);
    int32_t y = kiln_graph_add_tensor(g, "y", KILN_DTYPE_F32, 2, dx);
    g->tensors[x].flags = KILN_TENSOR_INPUT;
    g->tensors[w].flags = KILN_TENSOR_CONSTANT;
    g->tensors[w].data = calloc(16, sizeof(float));
    for (int i = 0; i < 16; i++)
        ((float *)g->tensors[w].data)[i] = (float)(i % 5);
    g->tensors[w].data_size = 64;
    g->tensors[w].data_owned = 1;
    g->tensors[y].flags = KILN_TENSOR_OUTPUT;
    g->tensors[y].arena_offset = 0;
    g->tensors[y].max_bytes = 1024;
    g->arena_size = 1024;
    int32_t in[2] = {x, w};
    int32_t l = kiln_graph_add_layer(g, "fc", KILN_OP_MATMUL, in, 2, 1);
    g->layers[l].outputs[0] = y;
    g->tensors[y].producer = l;
    g->n_inputs = g->n_outputs = 1;
    g->inputs = malloc(sizeof(int32_t));
    g->inputs[0] = x;
    g->outputs = malloc(sizeof(int32_t));
    g->outputs[0] = y;
    g->n_symbols = 1;
    g->symbols = malloc(sizeof *g->symbols);
    g->symbols[0] = (kiln_symbol){x, 0};
    g->n_profiles = 1;
    g->profiles = calloc(1, sizeof *g->profiles);
    g->profiles[0].min = (kiln_dims){2, 0, {1, 4}};
    g->profiles[0].opt = (kiln_dims){2, 0, {8, 4}};
    g->profiles[0].max = (kiln_dims){2, 0, {64, 4}};
    g->n_constraints = 1;
    g->constraints = calloc(1, sizeof *g->constraints);
    g->constraints[0] = (kiln_constraint){KILN_CONSTRAINT_POSITIVE, s0, -1, 0, kiln_strdup("rows")};
}

/* A plugin layer with a stored blob, a fused chain, a shuffle and an extra
 * section. */
static void plugin_graph(kiln_graph *g)
{
    kiln_graph_init(g);
    kiln_expr s0 = kiln_expr_symbol(&g->exprs, 0), c8 = kiln_expr_const(&g->exprs, 8);
    kiln_expr c2 = kiln_expr_const(&g->exprs, 2), c4 = kiln_expr_const(&g->exprs, 4);
    kiln_expr d[2] = {s0, c8}, d3[3] = {s0, c2, c4};
    int32_t x = kiln_graph_add_tensor(g, "x", KILN_DTYPE_F16, 2, d);
    int32_t p = kiln_graph_add_tensor(g, "p", KILN_DTYPE_F16, 2, d);
    int32_t f = kiln_graph_add_tensor(g, "f", KILN_DTYPE_F16, 2, d);
    int32_t s = kiln_graph_add_tensor(g, "s", KILN_DTYPE_F16, 3, d3);
    g->tensors[x].flags = KILN_TENSOR_INPUT;
    g->tensors[s].flags = KILN_TENSOR_OUTPUT;
    g->arena_size = 4096;
    for (int32_t t = p; t <= s; t++) {
        g->tensors[t].arena_offset = 1024 * (t - p);
        g->tensors[t].max_bytes = 1024;
    }
    int32_t l = kiln_graph_add_layer(g, "rms", KILN_OP_PLUGIN, &x, 1, 1);
    g->layers[l].outputs[0] = p;
    g->layers[l].p.plugin.index = 0;
    g->layers[l].workspace = 256;
    g->tensors[p].producer = l;
    int32_t in[2] = {x, p};
    l = kiln_graph_add_layer(g, "fused", KILN_OP_FUSED, in, 2, 1);
    g->layers[l].outputs[0] = f;
    g->tensors[f].producer = l;
    g->layers[l].p.fused.n_steps = 2;
    g->layers[l].p.fused.steps[0] = (kiln_fused_step){1, KILN_BINARY_MUL, 0, 1, -1};
    g->layers[l].p.fused.steps[1] = (kiln_fused_step){0, KILN_UNARY_SILU, 2, -1, -1};
    l = kiln_graph_add_layer(g, "view", KILN_OP_SHUFFLE, &f, 1, 1);
    g->layers[l].outputs[0] = s;
    g->tensors[s].producer = l;
    g->layers[l].p.shuffle.mid_rank = 3;
    g->layers[l].p.shuffle.mid[0] = s0;
    g->layers[l].p.shuffle.mid[1] = c2;
    g->layers[l].p.shuffle.mid[2] = c4;
    g->layers[l].p.shuffle.has_second = 1;
    g->layers[l].p.shuffle.second[0] = 0;
    g->layers[l].p.shuffle.second[1] = 2;
    g->layers[l].p.shuffle.second[2] = 1;
    g->n_inputs = g->n_outputs = 1;
    g->inputs = malloc(sizeof(int32_t));
    g->inputs[0] = x;
    g->outputs = malloc(sizeof(int32_t));
    g->outputs[0] = s;
    g->n_symbols = 1;
    g->symbols = malloc(sizeof *g->symbols);
    g->symbols[0] = (kiln_symbol){x, 0};
    g->n_profiles = 1;
    g->profiles = calloc(1, sizeof *g->profiles);
    g->profiles[0].min = (kiln_dims){2, 0, {1, 8}};
    g->profiles[0].opt = (kiln_dims){2, 0, {4, 8}};
    g->profiles[0].max = (kiln_dims){2, 0, {16, 8}};
    g->n_plugins = 1;
    g->plugins = calloc(1, sizeof *g->plugins);
    g->plugins[0].name = kiln_strdup("RMSNorm");
    g->plugins[0].version = kiln_strdup("1");
    g->plugins[0].plugin_namespace = kiln_strdup("kiln");
    g->plugins[0].library = kiln_strdup("builtin");
    g->plugins[0].blob_version = 1;
    g->plugins[0].blob_size = 8;
    g->plugins[0].blob = malloc(8);
    memcpy(g->plugins[0].blob, "\x00\x00\x80\x3f\x17\xb7\xd1\x38", 8);
    g->backend = KILN_BACKEND_CUDA;
    g->n_gpu_archs = 1;
    g->gpu_archs[0] = 90;
    g->n_sections = 1;
    g->sections = calloc(1, sizeof *g->sections);
    g->sections[0].id = KILN_FOURCC('L', 'L', 'M', 'C');
    g->sections[0].data = kiln_strdup("{\"n_layers\":1}");
    g->sections[0].size = strlen(g->sections[0].data);
    g->sections[0].data_owned = 1;
}

static void save_plan(const char *name, const kiln_buffer *b)
{
    int pi = entry(b->data, "PLAN");
    const uint8_t *e = (const uint8_t *)b->data + 96 + 32 * pi;
    save(name, (const uint8_t *)b->data + le64(e + 8), le64(e + 16));
}

int main(void)
{
    kiln_graph g;
    kiln_buffer small = {0}, plug = {0};
    small_graph(&g);
    if (kiln_engine_write(&g, &small) != KILN_OK)
        return 1;
    kiln_graph_free(&g);
    plugin_graph(&g);
    if (kiln_engine_write(&g, &plug) != KILN_OK)
        return 1;
    kiln_graph_free(&g);
    save("good_small.bin", small.data, small.size);
    save("good_plugin.bin", plug.data, plug.size);
    save_plan("plan_small.json", &small);
    save_plan("plan_plugin.json", &plug);

    uint8_t *b = copy(&small);
    size_t n = small.size;
    int pi = entry(b, "PLAN"), wi = entry(b, "WGHT");
    uint8_t *pe = b + 96 + 32 * pi, *we = b + 96 + 32 * wi;

    b[0] = 'X';
    save("bad_magic.bin", b, n);
    memcpy(b, small.data, n);
    b[8] = 7;
    reseal(b);
    save("future_version.bin", b, n);
    save("truncated_header.bin", small.data, 60);
    save("truncated_table.bin", small.data, 150);
    save("truncated_half.bin", small.data, n / 2);
    memcpy(b, small.data, n);
    b[le64(pe + 8) + 5] ^= 4;
    save("bitflip_plan.bin", b, n);
    memcpy(b, small.data, n);
    b[le64(pe + 8) + le64(pe + 16) + 1] = 1;
    save("nonzero_padding.bin", b, n);
    memcpy(b, small.data, n);
    wr64(pe + 8, n - 4);
    reseal(b);
    save("plan_offset_outside.bin", b, n);
    memcpy(b, small.data, n);
    wr64(we + 16, UINT64_MAX - 100);
    reseal(b);
    save("weights_size_wraps.bin", b, n);
    memcpy(b, small.data, n);
    memcpy(we + 8, pe + 8, 8);
    reseal(b);
    save("sections_overlap.bin", b, n);
    memcpy(b, small.data, n);
    b[80] = 0xff;
    b[81] = 0xff;
    b[82] = 0xff;
    b[83] = 0xff;
    save("huge_section_count.bin", b, n);
    memcpy(b, small.data, n);
    wr64(b + 72, n + 1);
    reseal(b);
    save("size_mismatch.bin", b, n);
    free(b);

    /* Plans that lie, as plan-only inputs. */
    const char *plans[][2] = {
        {"plan_layer_input_oob.json",
         "{\"arena_size\":0,\"workspace_size\":0,\"symbols\":[],\"exprs\":[[7,-1,-1,4]],\"plugins\":[],"
         "\"tensors\":[{\"name\":\"a\",\"dtype\":0,\"flags\":1,\"dims\":[0],\"producer\":-1,\"arena_offset\":-1,"
         "\"max_bytes\":16}],\"layers\":[{\"name\":\"u\",\"op\":3,\"inputs\":[5],\"outputs\":[0],"
         "\"params\":{\"op\":0},\"workspace\":0,\"tactic\":-1}],\"inputs\":[0],\"outputs\":[0],"
         "\"profiles\":[],\"constraints\":[]}"},
        {"plan_expr_forward_ref.json",
         "{\"arena_size\":0,\"workspace_size\":0,\"symbols\":[],\"exprs\":[[0,0,1,0],[7,-1,-1,4]],"
         "\"plugins\":[],\"tensors\":[],\"layers\":[],\"inputs\":[],\"outputs\":[],\"profiles\":[],"
         "\"constraints\":[]}"},
        {"plan_rank9.json",
         "{\"arena_size\":0,\"workspace_size\":0,\"symbols\":[],\"exprs\":[[7,-1,-1,1]],\"plugins\":[],"
         "\"tensors\":[{\"name\":\"a\",\"dtype\":0,\"flags\":1,\"dims\":[0,0,0,0,0,0,0,0,0],\"producer\":-1,"
         "\"arena_offset\":-1,\"max_bytes\":4}],\"layers\":[],\"inputs\":[0],\"outputs\":[],\"profiles\":[],"
         "\"constraints\":[]}"},
        {"plan_const_misaligned.json",
         "{\"arena_size\":0,\"workspace_size\":0,\"symbols\":[],\"exprs\":[[7,-1,-1,4]],\"plugins\":[],"
         "\"tensors\":[{\"name\":\"w\",\"dtype\":0,\"flags\":4,\"dims\":[0],\"producer\":-1,\"arena_offset\":-1,"
         "\"max_bytes\":16,\"data\":[8,16]}],\"layers\":[],\"inputs\":[],\"outputs\":[],\"profiles\":[],"
         "\"constraints\":[]}"},
        {"plan_fused_bad_operand.json",
         "{\"arena_size\":64,\"workspace_size\":0,\"symbols\":[],\"exprs\":[[7,-1,-1,4]],\"plugins\":[],"
         "\"tensors\":[{\"name\":\"a\",\"dtype\":0,\"flags\":1,\"dims\":[0],\"producer\":-1,\"arena_offset\":-1,"
         "\"max_bytes\":16},{\"name\":\"b\",\"dtype\":0,\"flags\":2,\"dims\":[0],\"producer\":0,"
         "\"arena_offset\":0,\"max_bytes\":16}],\"layers\":[{\"name\":\"f\",\"op\":12,\"inputs\":[0],"
         "\"outputs\":[1],\"params\":{\"steps\":[[1,0,0,1,-1]]},\"workspace\":0,\"tactic\":-1}],"
         "\"inputs\":[0],\"outputs\":[1],\"profiles\":[],\"constraints\":[]}"},
        {"plan_deep_nesting.json", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"},
        {"plan_not_json.json", "{\"arena_size\":"},
    };
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++)
        save(plans[i][0], plans[i][1], strlen(plans[i][1]));
    save("empty.bin", "", 0);

    kiln_buffer_free(&small);
    kiln_buffer_free(&plug);
    return 0;
}
