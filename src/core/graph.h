/* The graph: kiln's one internal representation of a network, from the
 * network API through the builder passes, the engine file and the runtime.
 *
 * The network API appends to it; builder passes rewrite it and fill in the
 * plan fields (memory offsets, workspace, tactics); the engine writer
 * serializes it whole and the reader rebuilds it; the runtime executes its
 * layers in order. Every array is owned by the graph (kiln_graph_free).
 */
#ifndef KILN_CORE_GRAPH_H
#define KILN_CORE_GRAPH_H

#include <kiln/kiln.h>
#include "core/expr.h"

/* ---- operations ------------------------------------------------------------ */

typedef enum kiln_op {
    KILN_OP_CONSTANT = 0, /* never executed: constants are tensors with data */
    KILN_OP_MATMUL,
    KILN_OP_BINARY,
    KILN_OP_UNARY,
    KILN_OP_REDUCE,
    KILN_OP_SOFTMAX,
    KILN_OP_CONCAT,
    KILN_OP_SLICE,
    KILN_OP_SHUFFLE,
    KILN_OP_GATHER,
    KILN_OP_CAST,
    KILN_OP_PLUGIN,
    KILN_OP_FUSED, /* a fused elementwise chain (builder) */
    KILN_OP_COUNT
} kiln_op;

/* "matmul", "fused_elementwise", ...; "?" for a value that is not an op
 * (core/op_table.c, from the op table). */
const char *kiln_op_name(kiln_op op);

/* A fused elementwise chain: a tiny register program evaluated per output
 * element in f32. Operand o < n_inputs of the layer reads input o
 * (broadcast to the output shape); o >= n_inputs reads the result of step
 * (o - n_inputs). The layer's output is the last step's result. */
#define KILN_FUSED_MAX_STEPS 16
#define KILN_FUSED_MAX_INPUTS 8

/* Host limits on a plugin layer's tensors, so that launching one needs no
 * allocation (enqueue allocates nothing). */
#define KILN_PLUGIN_MAX_INPUTS 64
#define KILN_PLUGIN_MAX_OUTPUTS 64

typedef struct kiln_fused_step {
    int32_t is_binary; /* 1: binary op, 0: unary op */
    int32_t op;        /* kiln_binary_op or kiln_unary_op */
    int32_t a, b;      /* operands; b unused for unary */
    int32_t src_layer; /* index of the original layer (names in inspect) */
} kiln_fused_step;

typedef struct kiln_layer_params {
    struct {
        int32_t transpose_a, transpose_b;
    } matmul;
    struct {
        kiln_binary_op op;
    } binary;
    struct {
        kiln_unary_op op;
    } unary;
    struct {
        kiln_reduce_op op;
        uint32_t axes;
        int32_t keep_dims;
    } reduce;
    struct {
        int32_t axis;
    } softmax; /* normalized, >= 0 */
    struct {
        int32_t axis;
    } concat; /* normalized, >= 0 */
    struct {
        int64_t start[KILN_MAX_RANK], stride[KILN_MAX_RANK];
    } slice;
    struct {
        int32_t has_first, first[KILN_MAX_RANK];
        int32_t has_second, second[KILN_MAX_RANK];
        int32_t mid_rank;             /* rank after the reshape */
        kiln_expr mid[KILN_MAX_RANK]; /* dims after reshape, before 2nd transpose */
    } shuffle;
    struct {
        int32_t axis;
    } gather; /* normalized, >= 0 */
    struct {
        kiln_dtype to;
    } cast;
    struct {
        int32_t index;
    } plugin; /* into kiln_graph.plugins */
    struct {
        int32_t n_steps;
        kiln_fused_step steps[KILN_FUSED_MAX_STEPS];
    } fused;
} kiln_layer_params;

typedef struct kiln_layer {
    char *name;
    kiln_op op;
    int32_t n_inputs, n_outputs;
    int32_t *inputs;  /* tensor indices, n_inputs */
    int32_t *outputs; /* tensor indices, n_outputs */
    kiln_layer_params p;
    /* plan (builder) */
    size_t workspace; /* bytes, at the largest shapes of every profile */
    int64_t tactic;   /* backend-specific kernel choice; -1 = default */
} kiln_layer;

/* ---- tensors ----------------------------------------------------------------- */

#define KILN_TENSOR_INPUT 0x1u
#define KILN_TENSOR_OUTPUT 0x2u
#define KILN_TENSOR_CONSTANT 0x4u

typedef struct kiln_tensor_rec {
    char *name;
    kiln_dtype dtype;
    uint32_t flags; /* KILN_TENSOR_* */
    int32_t rank;
    kiln_expr dims[KILN_MAX_RANK];
    int32_t producer; /* layer index, -1 for inputs and constants */
    /* constants: bytes in row-major order, size = elements × dtype size. */
    void *data;
    size_t data_size;
    int32_t data_owned; /* 0 when data points into a mapped engine */
    /* plan (builder) */
    int64_t arena_offset; /* bytes into the activation arena; -1 none */
    size_t max_bytes;     /* size at the largest shapes of all profiles */
} kiln_tensor_rec;

/* One input's bounds in one profile. */
typedef struct kiln_profile_dims {
    kiln_dims min, opt, max;
} kiln_profile_dims;

/* A symbol: dynamic dim `axis` of input tensor `tensor`. */
typedef struct kiln_symbol {
    int32_t tensor;
    int32_t axis;
} kiln_symbol;

/* A shape condition that inference could not prove; checked by the builder
 * at every profile's min/opt/max and by the runtime whenever shapes are set. */
typedef enum kiln_constraint_kind {
    KILN_CONSTRAINT_EQUAL = 0,   /* a == b                         */
    KILN_CONSTRAINT_BROADCAST,   /* a == b || a == 1 || b == 1     */
    KILN_CONSTRAINT_POSITIVE,    /* a >= 1                          */
    KILN_CONSTRAINT_NONNEGATIVE, /* a >= 0                          */
    KILN_CONSTRAINT_KIND_COUNT
} kiln_constraint_kind;

typedef struct kiln_constraint {
    kiln_constraint_kind kind;
    kiln_expr a, b;
    int32_t layer; /* layer that needs it (named in errors) */
    char *what;    /* e.g. "inner dims of A and B" */
} kiln_constraint;

/* A plugin layer's instance and where it came from. */
typedef struct kiln_plugin_rec {
    char *name, *version, *plugin_namespace;
    char *library;                      /* path recorded at build time, or "builtin" */
    const kiln_plugin_creator *creator; /* NULL when unresolved */
    kiln_plugin *instance;              /* owned; NULL until created/deserialized */
    uint32_t blob_version;
    void *blob; /* serialized state (owned copy) */
    size_t blob_size;
} kiln_plugin_rec;

/* Opaque bytes stored in the engine beside the graph. */
typedef struct kiln_section_rec {
    uint32_t id; /* KILN_FOURCC('L','L','M','C') etc. */
    void *data;
    size_t size;
    int32_t data_owned;
} kiln_section_rec;

/* ---- the graph ---------------------------------------------------------------- */

typedef struct kiln_graph {
    kiln_tensor_rec *tensors;
    int32_t n_tensors, cap_tensors;
    kiln_layer *layers; /* in execution (topological) order */
    int32_t n_layers, cap_layers;
    int32_t *inputs, n_inputs;   /* tensor indices, declaration order */
    int32_t *outputs, n_outputs; /* tensor indices, marking order */
    kiln_symbol *symbols;
    int32_t n_symbols;
    kiln_profile_dims *profiles; /* n_profiles × n_inputs, row per profile */
    int32_t n_profiles;
    kiln_constraint *constraints;
    int32_t n_constraints;
    kiln_plugin_rec *plugins;
    int32_t n_plugins;
    kiln_expr_pool exprs;
    /* plan (builder) */
    kiln_backend backend;
    int32_t n_gpu_archs;
    int32_t gpu_archs[8];
    size_t arena_size;     /* activation arena bytes, max profile */
    size_t workspace_size; /* shared plugin workspace, bytes */
    /* extra engine sections carried verbatim (e.g. an LLM's config and
     * tokenizer), keyed by a four-character id */
    kiln_section_rec *sections;
    int32_t n_sections;
} kiln_graph;

void kiln_graph_init(kiln_graph *g);
/* Frees everything, destroying plugin instances. */
void kiln_graph_free(kiln_graph *g);
/* Free what one record owns (not the record itself): a pass that drops
 * records uses the same cleanup as kiln_graph_free. The plugin record's
 * instance is destroyed. */
void kiln_tensor_rec_free(kiln_tensor_rec *t);
void kiln_layer_free(kiln_layer *l);
void kiln_plugin_rec_free(kiln_plugin_rec *r);
/* Deep copy (plugin instances cloned, constants copied). */
kiln_status kiln_graph_copy(kiln_graph *dst, const kiln_graph *src);
/* The same, but the copy's constants borrow src's data (data_owned 0):
 * src must outlive the copy and nobody may write the data (the builder,
 * whose passes replace constants but never write one in place). */
kiln_status kiln_graph_copy_borrowing(kiln_graph *dst, const kiln_graph *src);

/* Appends a tensor / layer; returns its index or -1 (out of memory, error
 * set). Strings are copied. */
int32_t kiln_graph_add_tensor(kiln_graph *g, const char *name, kiln_dtype dtype, int32_t rank, const kiln_expr *dims);
int32_t kiln_graph_add_layer(kiln_graph *g, const char *name, kiln_op op, const int32_t *inputs, int32_t n_inputs,
                             int32_t n_outputs);

int32_t kiln_graph_find_tensor(const kiln_graph *g, const char *name);
int32_t kiln_graph_find_layer(const kiln_graph *g, const char *name);

/* Concrete dims of every tensor of g for given symbol values: fills
 * `dims` (n_tensors entries). `values` is scratch of exprs.n entries. */
kiln_status kiln_graph_eval_shapes(const kiln_graph *g, const int64_t *symbols, int64_t *values, kiln_dims *dims);

/* Checks every constraint for the evaluated expression values; the error
 * names the layer and the values. */
kiln_status kiln_graph_check_constraints(const kiln_graph *g, const int64_t *values);

/* Every dynamic dim of every input has min/opt/max in every profile, and
 * there is a profile when any dim is dynamic. The builder checks this on
 * the network, the engine reader on the plan, with the same message. */
kiln_status kiln_graph_check_profiles(const kiln_graph *g);

/* Symbol values at a profile's min, opt or max (which: 0, 1, 2). */
void kiln_graph_profile_symbols(const kiln_graph *g, int32_t profile, int which, int64_t *symbols);

/* kiln_dims_count, kiln_dims_bytes and kiln_dims_format are public
 * (kiln/kiln.h). */

#endif
